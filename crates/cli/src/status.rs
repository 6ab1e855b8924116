//! `tessera status`: the cluster at a glance, asked of the manager directly (so it also works
//! while the cluster is starting or has lost data).

use crate::up::human;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::Arc;
use tessera_proto::{
    BufferPool, ClusterStatus, NodeId, Request, Response, RpcClient, RpcConfig, Secret, TableInfo,
};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print the full status as JSON (with --partitions, the partition table too).
    #[arg(long)]
    json: bool,
    /// List every partition: its replicas (primary first), copies being received, and state.
    #[arg(long)]
    partitions: bool,
}

fn bar(frac: f64, width: usize) -> String {
    let full = ((frac.clamp(0.0, 1.0) * width as f64).round()) as usize;
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

/// A partition's state for people: lost (no copy), degraded (fewer than `r` complete copies,
/// rebuilding if copies are incoming), syncing (complete, copies moving in), ok.
fn partition_state(replicas: &[NodeId], incoming: &[NodeId], r: u8) -> &'static str {
    if replicas.is_empty() {
        "lost"
    } else if replicas.len() < usize::from(r) {
        "degraded"
    } else if !incoming.is_empty() {
        "syncing"
    } else {
        "ok"
    }
}

fn ids(list: &[NodeId]) -> String {
    if list.is_empty() {
        return "-".into();
    }
    list.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A connection straight to the manager (works while the cluster is not usable yet).
pub async fn connect(manager: SocketAddr, secret: &str) -> Result<RpcClient> {
    let rpc = RpcConfig::new(Secret::new(secret), Arc::new(BufferPool::new(64 << 10, 2)));
    RpcClient::connect(manager, &rpc)
        .await
        .with_context(|| format!("connecting to the manager at {manager}"))
}

pub async fn ask(c: &RpcClient, req: &Request) -> Result<Response> {
    Ok(c.call(req, Bytes::new())
        .await
        .context("asking the manager")?
        .0)
}

pub async fn run(
    manager: SocketAddr,
    secret: &str,
    args: &StatusArgs,
    cfg: &crate::config::FileConfig,
) -> Result<()> {
    let c = connect(manager, secret).await?;
    let s = match ask(&c, &Request::GetStatus).await? {
        Response::Status(s) => s,
        Response::Error(e) => bail!("the manager refused the status request: {e}"),
        other => bail!("unexpected answer from the manager: {other:?}"),
    };
    let table = if args.partitions {
        match ask(&c, &Request::GetTable).await? {
            Response::Table(t) => Some(t),
            // No table yet: the status says why.
            Response::Error(_) => None,
            other => bail!("unexpected answer from the manager: {other:?}"),
        }
    } else {
        None
    };
    if args.json {
        let out = if args.partitions {
            serde_json::json!({"status": s, "table": table})
        } else {
            serde_json::to_value(&s)?
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print_summary(&s);
    print_nodes(&s);
    // The history comes from the HTTP API: shown when it answers, skipped otherwise.
    if let Some(line) = crate::report::recent(cfg, secret)
        .await
        .and_then(|h| crate::report::sparkline(&h, 60))
    {
        println!("{line}");
    }
    if args.partitions {
        match &table {
            Some(t) => print_partitions(t),
            None => println!("no partition table yet"),
        }
    }
    Ok(())
}

fn print_summary(s: &ClusterStatus) {
    let c = s.config;
    let up = s.nodes.iter().filter(|n| n.alive).count();
    let down = s.nodes.len() - up;
    let down = if down == 0 {
        String::new()
    } else {
        format!(", {down} down")
    };
    let Some(epoch) = s.epoch else {
        println!(
            "no table yet | {} partitions | stripe {} | replication {} | {up} of {} servers joined{down}",
            c.partitions,
            human(u64::from(c.stripe_size)),
            c.replication,
            s.expected_servers
        );
        return;
    };
    println!(
        "epoch {epoch} | {} partitions | stripe {} | replication {} | {up} servers up{down}",
        c.partitions,
        human(u64::from(c.stripe_size)),
        c.replication,
    );
    let healthy = if s.degraded == 0 && s.lost == 0 && s.incoming == 0 {
        " (healthy)"
    } else {
        ""
    };
    println!(
        "partitions: {} degraded, {} lost{healthy} | {} copies being rebuilt or moved",
        s.degraded, s.lost, s.incoming
    );
}

fn print_nodes(s: &ClusterStatus) {
    println!(
        "{:>4}  {:<21} {:<5} {:>5}  {:<24} {:>21}  {:>5}  syncing",
        "node", "address", "state", "parts", "memory", "used / capacity", "load"
    );
    let (mut used, mut cap) = (0u64, 0u64);
    for n in &s.nodes {
        let frac = if n.stats.capacity == 0 {
            0.0
        } else {
            n.stats.used as f64 / n.stats.capacity as f64
        };
        if n.alive {
            used += n.stats.used;
            cap += n.stats.capacity;
        }
        let sync = if n.stats.syncing == 0 && n.stats.synced_bytes == 0 {
            "-".to_string()
        } else {
            format!("{} ({} in)", n.stats.syncing, human(n.stats.synced_bytes))
        };
        println!(
            "{:>4}  {:<21} {:<5} {:>5}  {} {:>3.0}% {:>10} / {:<10} {:>5}  {}",
            n.id,
            n.addr.to_string(),
            if n.alive { "up" } else { "DOWN" },
            n.partitions,
            bar(frac, 16),
            100.0 * frac,
            human(n.stats.used),
            human(n.stats.capacity),
            n.stats.load,
            sync
        );
    }
    let frac = if cap == 0 {
        0.0
    } else {
        used as f64 / cap as f64
    };
    println!(
        "total: {} of {} used ({:.1} %) on live servers",
        human(used),
        human(cap),
        100.0 * frac
    );
}

fn print_partitions(info: &TableInfo) {
    let t = &info.table;
    let r = info.config.replication;
    let rows: Vec<(u32, &str, String, String)> = (0..t.partitions())
        .map(|p| {
            let (rep, inc) = (t.replicas(p), t.incoming(p));
            (p, partition_state(rep, inc, r), ids(rep), ids(inc))
        })
        .collect();
    let width = rows
        .iter()
        .map(|r| r.2.len())
        .max()
        .unwrap_or(0)
        .max("replicas".len());
    println!();
    println!(
        "{:>9}  {:<8}  {:<width$}  incoming",
        "partition", "state", "replicas"
    );
    for (p, state, rep, inc) in rows {
        println!("{p:>9}  {state:<8}  {rep:<width$}  {inc}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_states() {
        assert_eq!(partition_state(&[], &[], 2), "lost");
        assert_eq!(partition_state(&[1], &[3], 2), "degraded");
        assert_eq!(partition_state(&[1, 2], &[3], 2), "syncing");
        assert_eq!(partition_state(&[1, 2], &[], 2), "ok");
        assert_eq!(partition_state(&[1], &[], 1), "ok");
        assert_eq!(ids(&[3, 1]), "3 1");
        assert_eq!(ids(&[]), "-");
    }
}
