//! `tessera scale`: grow or shrink a running cluster by hand.

use crate::status::{ask, connect};
use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tessera_proto::{NodeId, Request, Response};

#[derive(clap::Args, Debug)]
pub struct ScaleArgs {
    /// Servers to add, started by the manager's provisioner (`--provision`).
    #[arg(long, default_value_t = 0)]
    pub add: u32,
    /// Servers to remove, by node id (`tessera status`): their partitions move to the others
    /// first, then they are retired. Nothing is lost.
    #[arg(long, num_args = 1..)]
    pub remove: Vec<NodeId>,
    /// Return at once instead of waiting (with a progress bar) until the moves are done.
    #[arg(long)]
    pub no_wait: bool,
}

pub async fn run(manager: SocketAddr, secret: &str, args: &ScaleArgs) -> Result<()> {
    if args.add == 0 && args.remove.is_empty() {
        bail!("nothing to do: say --add N and/or --remove NODE...");
    }
    let c = connect(manager, secret).await?;
    let before = match ask(&c, &Request::GetStatus).await? {
        Response::Status(s) => s,
        other => bail!("unexpected answer from the manager: {other:?}"),
    };
    let req = Request::Scale {
        add: args.add,
        remove: args.remove.clone(),
    };
    match ask(&c, &req).await? {
        Response::Ok => {}
        Response::Error(e) => bail!("the manager refused: {e}"),
        other => bail!("unexpected answer from the manager: {other:?}"),
    }
    if args.no_wait {
        return Ok(());
    }
    // Done when the added servers joined, the removed ones are gone, and no copy is moving.
    let live = |s: &tessera_proto::ClusterStatus| s.nodes.iter().filter(|n| n.alive).count();
    let want = live(&before) + args.add as usize - args.remove.len();
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let started = Instant::now();
    loop {
        let s = match ask(&c, &Request::GetStatus).await? {
            Response::Status(s) => s,
            other => bail!("unexpected answer from the manager: {other:?}"),
        };
        let moving = s.incoming;
        let synced: u64 = s.nodes.iter().map(|n| n.stats.synced_bytes).sum::<u64>()
            - before
                .nodes
                .iter()
                .map(|n| n.stats.synced_bytes)
                .sum::<u64>();
        pb.set_message(format!(
            "{} of {want} servers, {moving} partition copies moving, {} MiB copied",
            live(&s),
            synced >> 20
        ));
        pb.tick();
        let draining = s.nodes.iter().any(|n| n.draining && n.alive);
        if live(&s) == want && moving == 0 && !draining {
            pb.finish_with_message(format!(
                "{want} servers, epoch {}, balanced in {:.1} s",
                s.epoch.unwrap_or(0),
                started.elapsed().as_secs_f64()
            ));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
