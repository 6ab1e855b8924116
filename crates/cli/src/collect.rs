//! `tessera collect`: one writer of a collective output, fed newline-terminated records on
//! standard input; N of them (any processes, on any nodes) make one file, sorted by the key
//! fields if `--key` is given. `--wait`: wait for an output others make.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::time::Duration;
use tessera_client::Client;
use tessera_collective::fields::KeySpec;
use tessera_collective::{wait_output, Collective, Options, Outcome, Strategy};
use tokio::io::AsyncReadExt;

#[derive(clap::Args, Debug)]
pub struct CollectArgs {
    /// The output (a cluster path); its directory must exist.
    output: OsString,
    /// Writers of this output.
    #[arg(long, required_unless_present = "wait")]
    writers: Option<u32>,
    /// This writer's rank, from 0.
    #[arg(long, required_unless_present = "wait")]
    rank: Option<u32>,
    /// Sort by these fields, counted from 1, `n` after one for a number (e.g. 3,4n).
    #[arg(long)]
    key: Option<KeySpec>,
    /// Field separator of --key (default: runs of spaces and tabs).
    #[arg(long, value_parser = separator)]
    sep: Option<u8>,
    /// Keep only the first K records of the output.
    #[arg(long)]
    top: Option<u64>,
    /// How coordinators are chosen: least-loaded, least, most, least-rr, most-rr.
    #[arg(long, default_value = "least-loaded")]
    strategy: Strategy,
    /// Bytes buffered before they are written out as a sorted run.
    #[arg(long, default_value = "16MiB", value_parser = size)]
    threshold: u64,
    /// A coordinator's merge memory.
    #[arg(long, default_value = "64MiB", value_parser = size)]
    memory: u64,
    #[arg(long, default_value_t = 1)]
    coordinators_per_node: usize,
    /// A writer silent this long is taken for dead.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    timeout: Duration,
    /// Print what was made (size, records, coordinators, times) as JSON.
    #[arg(long)]
    json: bool,
    /// Write nothing: wait until OUTPUT is made by its writers (or fails) and print its size.
    #[arg(long, conflicts_with_all = ["writers", "rank", "key", "top"])]
    wait: bool,
}

fn separator(s: &str) -> Result<u8, String> {
    match s.as_bytes() {
        [c] => Ok(*c),
        b"\\t" => Ok(b'\t'),
        _ => Err(format!("a separator is one byte, not {s:?}")),
    }
}

fn size(s: &str) -> Result<u64, String> {
    parse_size::parse_size(s).map_err(|e| format!("bad size {s:?}: {e}"))
}

/// Bytes read from standard input at a time.
const READ: usize = 1 << 20;

pub async fn run(client: &Client, args: &CollectArgs) -> Result<()> {
    let output = crate::files::remote(&args.output);
    if args.wait {
        let size = wait_output(client, &output, None).await?;
        println!("{size}");
        return Ok(());
    }
    let (Some(writers), Some(rank)) = (args.writers, args.rank) else {
        bail!("--writers and --rank are needed");
    };
    let opts = Options {
        sorted: args.key.is_some(),
        threshold: usize::try_from(args.threshold).context("--threshold")?,
        top: args.top,
        strategy: args.strategy,
        coordinators_per_node: args.coordinators_per_node,
        memory: usize::try_from(args.memory).context("--memory")?,
        timeout: args.timeout,
        ..Options::new(writers, rank)
    };
    let key = args.key.clone().map(|k| k.with_separator(args.sep));
    let mut w = Collective::join(client, &output, opts).await?;
    let mut stop = crate::StopSignals::new()?;
    let fed = tokio::select! {
        fed = feed(&mut w, key.as_ref()) => fed,
        () = stop.recv() => Err(anyhow::anyhow!("interrupted")),
    };
    if let Err(e) = fed {
        w.abort(&format!("{e:#}")).await?;
        return Err(e);
    }
    let out = tokio::select! {
        out = w.finalise() => out?,
        () = stop.recv() => {
            w.abort("interrupted").await?;
            bail!("interrupted");
        }
    };
    if args.json {
        println!("{}", outcome_json(&out));
    }
    Ok(())
}

/// Appends every line of standard input (with its newline; one is added to a last line
/// without) to `w`.
async fn feed(w: &mut Collective, key: Option<&KeySpec>) -> Result<()> {
    let mut stdin = tokio::io::stdin();
    let mut buf: Vec<u8> = Vec::with_capacity(2 * READ);
    let mut k = Vec::new();
    loop {
        let start = buf.len();
        buf.resize(start + READ, 0);
        let n = stdin
            .read(&mut buf[start..])
            .await
            .context("reading standard input")?;
        buf.truncate(start + n);
        if n == 0 && !buf.is_empty() && buf.last() != Some(&b'\n') {
            buf.push(b'\n');
        }
        let mut at = 0;
        while let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') {
            let line = &buf[at..at + nl + 1];
            let full = match key {
                Some(spec) => {
                    k.clear();
                    spec.key(&line[..nl], &mut k);
                    w.push(line, Some(&k))?
                }
                None => w.push(line, None)?,
            };
            if full {
                w.flush().await?;
            }
            at += nl + 1;
        }
        buf.drain(..at);
        if n == 0 {
            return Ok(());
        }
    }
}

fn outcome_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "size": o.size,
        "records": o.records,
        "coordinators": o.coordinators,
        "coordinator": o.coordinator,
        "runs": o.runs,
        "waited_secs": o.waited.as_secs_f64(),
        "aggregation_secs": o.aggregation.as_secs_f64(),
        "merge_secs": o.merge.map(|d| d.as_secs_f64()),
        "passes": o.passes,
    })
}
