//! `tessera bench --stream T`: one reader and one writer running 1 MiB requests without pause
//! for T, each request timed; prints throughput per second and the slowest request, and writes
//! the timeline as JSON. Run it while the cluster is reconfigured (`tessera scale`) to see what
//! a migration costs the I/O that goes on meanwhile.

use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_client::{Client, OpenOptions};

const BLOCK: usize = 1 << 20;

#[derive(Debug, Clone, Copy, Serialize)]
struct Op {
    /// Milliseconds since the start, when the request was issued.
    t_ms: f64,
    write: bool,
    latency_ms: f64,
    ok: bool,
}

#[derive(Debug, Serialize)]
struct Second {
    t: u64,
    read_mbps: f64,
    write_mbps: f64,
    max_latency_ms: f64,
}

#[derive(Debug, Serialize)]
struct Timeline {
    seconds: Vec<Second>,
    failed: usize,
    max_latency_ms: f64,
    ops: Vec<Op>,
}

/// Streams for `length`, reading and writing files of `size` bytes in `dir` (wrapping around).
pub async fn run(
    client: &Client,
    dir: &str,
    size: u64,
    length: Duration,
    out: Option<&Path>,
) -> Result<()> {
    let size = size.max(BLOCK as u64) / BLOCK as u64 * BLOCK as u64;
    let data = vec![0x5au8; BLOCK];
    let read_path = format!("{dir}/stream-read");
    let mut f = client.open(&read_path, &OpenOptions::create()).await?;
    for off in (0..size).step_by(BLOCK) {
        f.write_at(off, &data).await?;
    }
    f.close().await?;

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (client, stop, path) = (client.clone(), stop.clone(), read_path.clone());
        tokio::spawn(async move {
            let mut ops = Vec::new();
            let mut f = client.open(&path, &OpenOptions::read()).await?;
            let mut off = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = f.read_at(off, BLOCK).await.is_ok_and(|b| b.len() == BLOCK);
                ops.push(timed(start, t, false, ok));
                off = (off + BLOCK as u64) % size;
            }
            anyhow::Ok(ops)
        })
    };
    let writer = {
        let (client, stop, path) = (client.clone(), stop.clone(), format!("{dir}/stream-write"));
        tokio::spawn(async move {
            let mut ops = Vec::new();
            let mut f = client.open(&path, &OpenOptions::create()).await?;
            let mut off = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                // A write is done when stored: flush each one, so its latency is the cluster's.
                let ok = f.write_at(off, &data).await.is_ok() && f.flush().await.is_ok();
                ops.push(timed(start, t, true, ok));
                off = (off + BLOCK as u64) % size;
            }
            f.close().await?;
            anyhow::Ok(ops)
        })
    };
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut ops = reader.await.context("reader task")??;
    ops.extend(writer.await.context("writer task")??);
    ops.sort_by(|a, b| a.t_ms.total_cmp(&b.t_ms));

    let seconds: Vec<Second> = (0..length.as_secs())
        .map(|t| {
            let of = |w: bool| {
                ops.iter()
                    .filter(move |o| o.ok && o.write == w && (o.t_ms / 1e3) as u64 == t)
            };
            Second {
                t,
                read_mbps: of(false).count() as f64 * BLOCK as f64 / 1e6,
                write_mbps: of(true).count() as f64 * BLOCK as f64 / 1e6,
                max_latency_ms: ops
                    .iter()
                    .filter(|o| (o.t_ms / 1e3) as u64 == t)
                    .map(|o| o.latency_ms)
                    .fold(0.0, f64::max),
            }
        })
        .collect();
    let tl = Timeline {
        failed: ops.iter().filter(|o| !o.ok).count(),
        max_latency_ms: ops.iter().map(|o| o.latency_ms).fold(0.0, f64::max),
        seconds,
        ops,
    };
    println!("  t   read MB/s  write MB/s  slowest ms");
    for s in &tl.seconds {
        println!(
            "{:3}  {:10.0}  {:10.0}  {:10.1}",
            s.t, s.read_mbps, s.write_mbps, s.max_latency_ms
        );
    }
    println!(
        "failed requests: {}, slowest request: {:.1} ms",
        tl.failed, tl.max_latency_ms
    );
    if let Some(path) = out {
        std::fs::write(path, serde_json::to_string(&tl)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn timed(start: Instant, t: Instant, write: bool, ok: bool) -> Op {
    Op {
        t_ms: t.duration_since(start).as_secs_f64() * 1e3,
        write,
        latency_ms: t.elapsed().as_secs_f64() * 1e3,
        ok,
    }
}
