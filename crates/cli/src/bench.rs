//! `tessera bench`: sequential throughput and metadata rates through the client library, with
//! the loopback-TCP ceiling measured in the same run so results read as ratios.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use tessera_client::{Client, OpenOptions};

/// Arguments of `tessera bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Size of the file for the sequential test.
    #[arg(long, default_value = "4GiB")]
    pub size: String,
    /// Size of each write and read request.
    #[arg(long, default_value = "1MiB")]
    pub block: String,
    /// Files created, stat'ed and unlinked in the metadata test.
    #[arg(long, default_value_t = 20_000)]
    pub files: usize,
    /// Concurrent tasks in the metadata test.
    #[arg(long, default_value_t = 8)]
    pub tasks: usize,
    /// Compare every byte read with what was written (costs a little throughput).
    #[arg(long)]
    pub verify: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Instead: stream 1 MiB reads and writes of --size files for this long, timing every
    /// request (the per-second timeline goes to --json).
    #[arg(long, value_parser = crate::parse_duration)]
    pub stream: Option<Duration>,
}

#[derive(Debug, Serialize)]
struct Report {
    loopback_tcp_gbps: f64,
    file_bytes: u64,
    block_bytes: u64,
    write_gbps: f64,
    read_gbps: f64,
    /// Reads of one block at random offsets, one at a time (latency-bound: no read-ahead,
    /// nothing else in flight), and their mean latency.
    lone_read_gbps: f64,
    lone_read_ms: f64,
    files: usize,
    tasks: usize,
    creates_per_s: f64,
    stats_per_s: f64,
    unlinks_per_s: f64,
}

const GB: f64 = 1e9;

fn parse(size: &str) -> Result<u64> {
    parse_size::parse_size(size).with_context(|| format!("bad size {size:?}"))
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// One TCP stream over loopback, 1 MiB writes: the network ceiling of a one-machine cluster.
fn loopback_tcp(bytes: u64) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let sink = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(got),
                n => got += n as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr)?;
    let buf = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    for _ in 0..bytes / buf.len() as u64 {
        s.write_all(&buf)?;
    }
    drop(s);
    let got = sink
        .join()
        .map_err(|_| anyhow::anyhow!("loopback reader panicked"))??;
    Ok(got as f64 / start.elapsed().as_secs_f64() / GB)
}

/// Runs the benchmark against a connected client.
pub async fn run(client: Client, args: BenchArgs) -> Result<()> {
    let size = parse(&args.size)?;
    let block = parse(&args.block)?.max(1);
    let dir = format!("/.bench-{:08x}", rand::random::<u32>());
    client
        .create_dir(&dir)
        .await
        .with_context(|| format!("creating {dir}"))?;
    if let Some(length) = args.stream {
        let result = crate::stream::run(&client, &dir, size, length, args.json.as_deref()).await;
        let cleaned = client.remove_all(&dir).await;
        result?;
        return cleaned.with_context(|| format!("removing {dir}"));
    }
    let result = measure(&client, &args, &dir, size, block).await;
    // Leave nothing behind, whatever happened.
    let cleaned = client.remove_all(&dir).await;
    let report = result?;
    cleaned.with_context(|| format!("removing {dir}"))?;

    let tcp = report.loopback_tcp_gbps;
    println!("loopback TCP (1 stream)   {tcp:6.2} GB/s");
    println!(
        "sequential write          {:6.2} GB/s  ({:.0} % of loopback TCP)",
        report.write_gbps,
        100.0 * report.write_gbps / tcp
    );
    println!(
        "sequential read           {:6.2} GB/s  ({:.0} % of loopback TCP)",
        report.read_gbps,
        100.0 * report.read_gbps / tcp
    );
    println!(
        "lone random reads         {:6.2} GB/s  ({:.2} ms each, one at a time)",
        report.lone_read_gbps, report.lone_read_ms
    );
    println!(
        "creates ({} tasks)         {:8.0} /s",
        report.tasks, report.creates_per_s
    );
    println!(
        "stats   ({} tasks)         {:8.0} /s",
        report.tasks, report.stats_per_s
    );
    println!(
        "unlinks ({} tasks)         {:8.0} /s",
        report.tasks, report.unlinks_per_s
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn measure(
    client: &Client,
    args: &BenchArgs,
    dir: &str,
    size: u64,
    block: u64,
) -> Result<Report> {
    let tcp_bytes = size.clamp(256 << 20, 4 << 30);
    let loopback_tcp_gbps = tokio::task::spawn_blocking(move || loopback_tcp(tcp_bytes)).await??;

    let data: Vec<u8> = (0..block)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let path = format!("{dir}/seq");
    let pb = bar(size, "write");
    let start = Instant::now();
    let mut f = client.open(&path, &OpenOptions::create()).await?;
    let mut off = 0;
    while off < size {
        let n = block.min(size - off) as usize;
        f.write_at(off, &data[..n]).await?;
        off += n as u64;
        pb.set_position(off);
    }
    f.close().await?;
    let write_gbps = size as f64 / start.elapsed().as_secs_f64() / GB;
    pb.finish_and_clear();

    let pb = bar(size, "read");
    let start = Instant::now();
    let mut f = client.open(&path, &OpenOptions::read()).await?;
    let mut off = 0;
    while off < size {
        let got = f.read_at(off, block as usize).await?;
        anyhow::ensure!(!got.is_empty(), "file ended early at {off} of {size}");
        if args.verify {
            anyhow::ensure!(
                got[..] == data[..got.len()],
                "data read back differs at offset {off}"
            );
        }
        off += got.len() as u64;
        pb.set_position(off);
    }
    f.close().await?;
    let read_gbps = size as f64 / start.elapsed().as_secs_f64() / GB;
    pb.finish_and_clear();

    let blocks = (size / block).max(1);
    let lone = blocks.min(256);
    let mut f = client.open(&path, &OpenOptions::read()).await?;
    let start = Instant::now();
    for _ in 0..lone {
        let off = rand::random::<u64>() % blocks * block;
        f.read_at(off, block as usize).await?;
    }
    f.close().await?;
    let lone_secs = start.elapsed().as_secs_f64();
    client.remove_file(&path).await?;

    let meta_dir = client.create_dir(&format!("{dir}/meta")).await?.ino;
    let (files, tasks) = (args.files.max(1), args.tasks.max(1));
    let creates = per_second(files, tasks, |i| async move {
        client
            .create(
                meta_dir,
                format!("f{i}").as_bytes(),
                0o644,
                true,
                &OpenOptions::create(),
            )
            .await?
            .close()
            .await
    })
    .await?;
    let stats = per_second(files, tasks, |i| {
        let path = format!("{dir}/meta/f{i}");
        async move { client.stat(&path).await.map(drop) }
    })
    .await?;
    let unlinks = per_second(files, tasks, |i| async move {
        client.unlink(meta_dir, format!("f{i}").as_bytes()).await
    })
    .await?;

    Ok(Report {
        loopback_tcp_gbps,
        file_bytes: size,
        block_bytes: block,
        write_gbps,
        read_gbps,
        lone_read_gbps: (lone * block.min(size)) as f64 / lone_secs / GB,
        lone_read_ms: lone_secs * 1e3 / lone as f64,
        files,
        tasks,
        creates_per_s: files as f64 / creates.as_secs_f64(),
        stats_per_s: files as f64 / stats.as_secs_f64(),
        unlinks_per_s: files as f64 / unlinks.as_secs_f64(),
    })
}

/// Runs `op(0..n)` on `tasks` concurrent tasks and returns the elapsed time.
async fn per_second<F, Fut>(n: usize, tasks: usize, op: F) -> Result<Duration>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = tessera_client::Result<()>>,
{
    use futures::stream::{self, StreamExt, TryStreamExt};
    let start = Instant::now();
    stream::iter(0..n)
        .map(&op)
        .buffer_unordered(tasks)
        .try_collect::<()>()
        .await?;
    Ok(start.elapsed())
}
