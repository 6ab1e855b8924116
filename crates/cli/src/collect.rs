//! `tessera collect`: one writer of a collective output, fed newline-terminated records on
//! standard input; N of them (any processes, on any nodes) make one file, sorted by the key
//! fields if `--key` is given; or fixed-size records placed by key (`--record-size`,
//! `--key-range`). `--wait`: wait for an output others make.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::io::Read;
use std::ops::Range;
use std::time::Duration;
use tessera_client::Client;
use tessera_collective::fields::KeySpec;
use tessera_collective::{
    wait_output, Collective, Fixed, Options, Order, Outcome, Strategy, MAX_RECORD_SIZE,
};

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
    /// Without --key: `rank` (rank after rank, the same output every time) or `arrival`
    /// (each buffer written once, at once, at the output's end when it arrives: faster,
    /// writers' buffers interleaved; not with --top).
    #[arg(long, default_value = "rank", conflicts_with_all = ["key", "top", "record_size"])]
    order: Order,
    /// Keep only the first K records of the output.
    #[arg(long)]
    top: Option<u64>,
    /// Fixed-size records of this many bytes (up to 4 GiB), placed by key: standard input is
    /// read in records of exactly this size, each keyed by the whole number in its --key
    /// field (default 1). Needs --key-range.
    #[arg(long, value_parser = record_size, requires = "key_range", conflicts_with = "top")]
    record_size: Option<u64>,
    /// The keys of fixed-size records, LO:HI (HI excluded): the record of key K goes to
    /// offset (K - LO) x --record-size; a key nobody gave reads as zeros.
    #[arg(long, value_parser = key_range, requires = "record_size")]
    key_range: Option<Range<u64>>,
    /// How coordinators are chosen: least-loaded, least, most, least-rr, most-rr.
    #[arg(long, default_value = "least-loaded")]
    strategy: Strategy,
    /// Bytes buffered before they are written out as a (sorted) run, or in arrival order
    /// into the output.
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
    #[arg(long, conflicts_with_all = ["writers", "rank", "key", "top", "record_size"])]
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

fn record_size(s: &str) -> Result<u64, String> {
    match size(s)? {
        0 => Err("a record of 0 bytes: records hold at least one byte".into()),
        n if n > MAX_RECORD_SIZE => Err(format!(
            "{s} is more than a record can hold: fixed-size records are at most 4 GiB"
        )),
        n => Ok(n),
    }
}

fn key_range(s: &str) -> Result<Range<u64>, String> {
    let bad =
        || format!("bad key range {s:?}: LO:HI, two whole numbers, HI excluded (e.g. 0:1000)");
    let (lo, hi) = s.split_once(':').ok_or_else(bad)?;
    let (lo, hi): (u64, u64) = (
        lo.parse().map_err(|_| bad())?,
        hi.parse().map_err(|_| bad())?,
    );
    if lo >= hi {
        return Err(format!("the key range {s} is empty: HI must be above LO"));
    }
    Ok(lo..hi)
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
    let fixed = match (args.record_size, &args.key_range) {
        (Some(record_size), Some(keys)) => Some(Fixed {
            record_size,
            keys: keys.clone(),
        }),
        _ => None,
    };
    let opts = Options {
        sorted: args.key.is_some() && fixed.is_none(),
        order: args.order,
        fixed: fixed.clone(),
        threshold: usize::try_from(args.threshold).context("--threshold")?,
        top: args.top,
        strategy: args.strategy,
        coordinators_per_node: args.coordinators_per_node,
        memory: usize::try_from(args.memory).context("--memory")?,
        timeout: args.timeout,
        ..Options::new(writers, rank)
    };
    let key = args.key.clone().map(|k| k.with_separator(args.sep));
    if fixed.is_some() && key.as_ref().is_some_and(|k| k.len() != 1) {
        bail!("with --record-size, --key is the one field holding each record's key");
    }
    let mut w = Collective::join(client, &output, opts).await?;
    let mut stop = crate::StopSignals::new()?;
    let fed = async {
        match (&fixed, &key) {
            (Some(f), k) => {
                let first = KeySpec::default_field().with_separator(args.sep);
                let size = usize::try_from(f.record_size).context("--record-size")?;
                feed_fixed(&mut w, k.as_ref().unwrap_or(&first), size).await
            }
            (None, k) => feed(&mut w, k.as_ref()).await,
        }
    };
    let fed = tokio::select! {
        fed = fed => fed,
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

/// Standard input in chunks of up to `READ` bytes, read by a thread of its own: the next
/// chunk is read while this one is taken apart, straight into a buffer given back for reuse
/// (no copy through the runtime's own buffer).
struct Input {
    chunks: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    spent: std::sync::mpsc::Sender<Vec<u8>>,
}

impl Input {
    fn stdin() -> Self {
        let (tx, chunks) = tokio::sync::mpsc::channel(2);
        let (spent, back) = std::sync::mpsc::channel::<Vec<u8>>();
        // A thread, not the runtime's blocking pool: a read that never returns (a terminal)
        // must not keep the runtime from shutting down.
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            loop {
                // A buffer given back is zeroed no more: only a new one is, once.
                let mut buf = back.try_recv().unwrap_or_default();
                buf.resize(READ, 0);
                let read = fill(&mut stdin, &mut buf);
                let last = !matches!(read, Ok(n) if n > 0);
                if tx
                    .blocking_send(read.map(|n| {
                        buf.truncate(n);
                        buf
                    }))
                    .is_err()
                    || last
                {
                    return;
                }
            }
        });
        Self { chunks, spent }
    }

    /// The next chunk; empty at the end of the input.
    async fn next(&mut self) -> Result<Vec<u8>> {
        match self.chunks.recv().await {
            Some(read) => read.context("reading standard input"),
            None => Ok(Vec::new()),
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        // The reader may have ended: then the buffer is just dropped.
        let _ = self.spent.send(buf);
    }
}

/// One read into `buf` (a pipe gives what it holds: lines are not kept waiting for more);
/// bytes read, none at the end of the input.
fn fill(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match input.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            read => return read,
        }
    }
}

/// Appends every line of standard input (with its newline; one is added to a last line
/// without) to `w`. In arrival order the whole lines of a chunk go in together.
async fn feed(w: &mut Collective, key: Option<&KeySpec>) -> Result<()> {
    let together = key.is_none() && w.options().order == Order::Arrival;
    let mut input = Input::stdin();
    // A line begun in a chunk before.
    let mut carry: Vec<u8> = Vec::new();
    let mut k = Vec::new();
    loop {
        let chunk = input.next().await?;
        if chunk.is_empty() {
            if !carry.is_empty() {
                // A carried line has no newline yet.
                carry.push(b'\n');
                push_line(w, key, &carry, &mut k).await?;
            }
            return Ok(());
        }
        let mut rest = &chunk[..];
        if !carry.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                if carry.len() + rest.len() > u32::MAX as usize {
                    bail!("a line of 4 GiB or more on standard input");
                }
                carry.extend_from_slice(rest);
                input.give_back(chunk);
                continue;
            };
            carry.extend_from_slice(&rest[..=nl]);
            push_line(w, key, &carry, &mut k).await?;
            carry.clear();
            rest = &rest[nl + 1..];
        }
        let whole = memchr::memrchr(b'\n', rest).map_or(0, |nl| nl + 1);
        let (lines, tail) = rest.split_at(whole);
        if together {
            let count = memchr::memchr_iter(b'\n', lines).count() as u64;
            if count > 0 && w.push_records(lines, count)? {
                w.flush().await?;
            }
        } else {
            for line in lines.split_inclusive(|&b| b == b'\n') {
                push_line(w, key, line, &mut k).await?;
            }
        }
        carry.extend_from_slice(tail);
        input.give_back(chunk);
    }
}

/// Appends one line (with its newline), keyed by `key` if given; flushes a full buffer.
async fn push_line(
    w: &mut Collective,
    key: Option<&KeySpec>,
    line: &[u8],
    k: &mut Vec<u8>,
) -> Result<()> {
    let full = match key {
        Some(spec) => {
            k.clear();
            spec.key(&line[..line.len() - 1], k);
            w.push(line, Some(k))?
        }
        None => w.push(line, None)?,
    };
    if full {
        w.flush().await?;
    }
    Ok(())
}

/// Places every record of `size` bytes of standard input in `w`, keyed by `key`.
async fn feed_fixed(w: &mut Collective, key: &KeySpec, size: usize) -> Result<()> {
    let mut input = Input::stdin();
    // Bytes of a record begun in a chunk before, then the chunk's.
    let mut buf: Vec<u8> = Vec::with_capacity(READ + size);
    let mut records = 0u64;
    loop {
        let chunk = input.next().await?;
        let n = chunk.len();
        buf.extend_from_slice(&chunk);
        input.give_back(chunk);
        let mut at = 0;
        while buf.len() - at >= size {
            let record = &buf[at..at + size];
            let Some(k) = key.integer(record) else {
                bail!(
                    "record {records} (input bytes {} to {}): its key field is not a whole number",
                    records * size as u64,
                    (records + 1) * size as u64
                );
            };
            w.put(k, record).await?;
            at += size;
            records += 1;
        }
        buf.drain(..at);
        if n == 0 {
            if !buf.is_empty() {
                bail!(
                    "standard input ends with {} bytes: not a whole record of {size} bytes",
                    buf.len()
                );
            }
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
