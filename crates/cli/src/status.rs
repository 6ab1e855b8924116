//! `tessera status`: the cluster at a glance.

use crate::up::human;
use anyhow::Result;
use tessera_client::Client;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print the full status as JSON.
    #[arg(long)]
    json: bool,
}

fn bar(frac: f64, width: usize) -> String {
    let full = ((frac.clamp(0.0, 1.0) * width as f64).round()) as usize;
    format!("[{}{}]", "#".repeat(full), ".".repeat(width - full))
}

pub async fn run(client: &Client, args: &StatusArgs) -> Result<()> {
    let s = client.status().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let c = s.config;
    let epoch = s
        .epoch
        .map_or_else(|| "none yet".to_string(), |e| e.to_string());
    println!(
        "epoch {epoch} | {} partitions | stripe {} | replication {} | {} of {} servers joined",
        c.partitions,
        human(u64::from(c.stripe_size)),
        c.replication,
        s.nodes.len(),
        s.expected_servers
    );
    println!(
        "{:>4}  {:<21} {:<5} {:>5}  {:<24} {:>21}  {:>5}",
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
        println!(
            "{:>4}  {:<21} {:<5} {:>5}  {} {:>3.0}% {:>10} / {:<10} {:>5}",
            n.id,
            n.addr.to_string(),
            if n.alive { "up" } else { "DOWN" },
            n.partitions,
            bar(frac, 16),
            100.0 * frac,
            human(n.stats.used),
            human(n.stats.capacity),
            n.stats.load
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
    Ok(())
}
