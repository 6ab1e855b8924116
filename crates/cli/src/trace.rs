//! `tessera trace`: switch tracing on a running mount, and read traces (docs/TRACING.md).

use crate::up::human;
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tessera_trace::{Header, Item, Op, Reader, Record};

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    cmd: TraceCmd,
}

#[derive(clap::Subcommand, Debug)]
enum TraceCmd {
    /// Start tracing on a running mount, into a new file (in --dir, else the mount's --trace
    /// directory).
    Start {
        /// The mount point.
        mount: PathBuf,
        /// Directory for the trace file (absolute, outside the mount).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Stop tracing on a running mount (the file is finished and closed).
    Stop {
        /// The mount point.
        mount: PathBuf,
    },
    /// Per process and per file: operations, bytes, time in I/O, request sizes, gaps.
    Summary {
        /// A trace file.
        trace: PathBuf,
    },
    /// Write a trace in another tool's format.
    Export(ExportArgs),
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    /// A trace file.
    trace: PathBuf,
    /// chrome: Chrome trace JSON (Perfetto UI, chrome://tracing); fio: fio iolog v3 of the
    /// reads, writes and fsyncs, for `fio --read_iolog`; parquet: a table of the records
    /// (pandas, pyarrow, polars; needs -o).
    #[arg(long, value_enum)]
    format: Format,
    /// Only operations that end at or after this many seconds into the trace.
    #[arg(long)]
    from: Option<f64>,
    /// Only operations that start at or before this many seconds into the trace.
    #[arg(long)]
    to: Option<f64>,
    /// Write here instead of standard output.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// fio: the directory the trace's paths are taken under (default: the traced mount).
    #[arg(long)]
    root: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq)]
enum Format {
    Chrome,
    Fio,
    Parquet,
}

pub fn run(args: &TraceArgs) -> Result<()> {
    match &args.cmd {
        TraceCmd::Start { mount, dir } => {
            let command = match dir {
                Some(d) => {
                    let d = std::path::absolute(d).context("the trace directory")?;
                    std::fs::create_dir_all(&d)
                        .with_context(|| format!("trace directory {}", d.display()))?;
                    format!("start {}", d.display())
                }
                None => "start".to_string(),
            };
            control(mount, &command)
        }
        TraceCmd::Stop { mount } => control(mount, "stop"),
        TraceCmd::Summary { trace } => {
            quiet_when_output_closes(summary(trace, &mut std::io::stdout().lock()))
        }
        TraceCmd::Export(a) if a.format == Format::Parquet => parquet(a),
        TraceCmd::Export(a) => {
            let mut out: Box<dyn Write> = match &a.output {
                Some(p) => Box::new(
                    std::fs::File::create(p)
                        .with_context(|| format!("creating {}", p.display()))?,
                ),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut out = std::io::BufWriter::new(&mut out);
            quiet_when_output_closes(export(a, &mut out).and_then(|()| Ok(out.flush()?)))
        }
    }
}

/// `tessera trace export ... | head`: ends as other Unix tools do when the reader is gone.
fn quiet_when_output_closes(r: Result<()>) -> Result<()> {
    match r {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::exit(128 + libc::SIGPIPE)
        }
        r => r,
    }
}

pub(crate) fn control(mount: &Path, command: &str) -> Result<()> {
    tessera_fuse::control_trace(mount, command).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => {
                "not the root of a Tessera mount with tracing (or an older mount)".into()
            }
            Some(libc::EPERM) => "only the mount's owner or root may switch tracing".into(),
            Some(libc::EBUSY) => "a trace is already being written".into(),
            Some(libc::EINVAL) => {
                "no trace directory (mount --trace DIR, or --dir), or it is inside the mount".into()
            }
            _ => e.to_string(),
        };
        anyhow::anyhow!("{}: {why}", mount.display())
    })
}

/// A trace's records in order, with its gaps and how it ended.
struct Trace {
    header: Header,
    records: Vec<Record>,
    gaps: Vec<tessera_trace::Gap>,
    /// The writer's end marker: (records, dropped), if it stopped cleanly.
    end: Option<(u64, u64)>,
    torn: bool,
}

/// The records of the trace at `path` that overlap `[from, to]` (ns), by start.
fn load(path: &Path, (from, to): (u64, u64)) -> Result<Trace> {
    let mut r = Reader::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut t = Trace {
        header: r.header().clone(),
        records: Vec::new(),
        gaps: Vec::new(),
        end: None,
        torn: false,
    };
    while let Some(item) = r
        .next_item()
        .with_context(|| format!("reading {}", path.display()))?
    {
        match item {
            Item::Record(rec) if rec.end_ns >= from && rec.start_ns <= to => t.records.push(rec),
            Item::Record(_) => {}
            Item::Gap(g) => t.gaps.push(g),
            Item::End { records, dropped } => t.end = Some((records, dropped)),
        }
    }
    t.torn = r.torn();
    t.records.sort_by_key(|r| r.start_ns);
    Ok(t)
}

#[derive(Default)]
struct Tally {
    ops: u64,
    errors: u64,
    read: u64,
    written: u64,
    reads: u64,
    writes: u64,
    ns: u64,
}

impl Tally {
    fn add(&mut self, r: &Record) {
        self.ops += 1;
        self.ns += r.duration_ns();
        if r.result < 0 {
            self.errors += 1;
            return;
        }
        match r.op {
            Op::Read => {
                self.reads += 1;
                self.read += r.result as u64;
            }
            Op::Write => {
                self.writes += 1;
                self.written += r.result as u64;
            }
            _ => {}
        }
    }
}

/// The request-size class of `size`: powers of two from 4 KiB (below it: 0).
fn size_class(size: u64) -> u32 {
    (size.max(1).ilog2()).saturating_sub(11)
}

fn class_label(c: u32) -> String {
    match c {
        0 => "< 4 KiB".into(),
        c => format!("{} - {}", human(1 << (c + 11)), human((1 << (c + 12)) - 1)),
    }
}

fn summary(path: &Path, out: &mut impl Write) -> Result<()> {
    let t = load(path, (0, u64::MAX))?;
    let h = &t.header;
    let span = t
        .records
        .iter()
        .map(|r| r.end_ns)
        .max()
        .unwrap_or(0)
        .saturating_sub(t.records.first().map_or(0, |r| r.start_ns));
    writeln!(out, "{}", path.display())?;
    writeln!(
        out,
        "  {} on {}, traced by pid {}, mode {}, from {} UTC, {:.3} s of operations",
        h.source,
        h.host,
        h.pid,
        h.mode.name(),
        utc(h.unix_ns),
        span as f64 / 1e9
    )?;
    let lost: u64 = t.gaps.iter().map(|g| g.dropped).sum();
    let ending = match (t.end, t.torn) {
        (Some(_), _) => "the writer stopped cleanly",
        (None, true) => "cut short (last chunk torn: its writer was killed or is still writing)",
        (None, false) => "no end marker (its writer was killed or is still writing)",
    };
    writeln!(
        out,
        "  {} records, {} lost in {} gaps; {ending}",
        t.records.len(),
        lost,
        t.gaps.len()
    )?;

    let mut procs: BTreeMap<u32, Tally> = BTreeMap::new();
    let mut files: HashMap<String, Tally> = HashMap::new();
    let mut ops: BTreeMap<Op, Tally> = BTreeMap::new();
    let mut sizes: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let (mut all, mut fetched, mut sent) = (Tally::default(), 0, 0);
    for r in &t.records {
        all.add(r);
        match r.op {
            Op::Read => fetched += r.server_size.unwrap_or(0),
            _ => sent += r.server_size.unwrap_or(0),
        }
        procs.entry(r.pid).or_default().add(r);
        files.entry(file_key(r)).or_default().add(r);
        ops.entry(r.op).or_default().add(r);
        if r.op.is_data() {
            let s = sizes.entry(size_class(r.size)).or_default();
            match r.op {
                Op::Read => s.0 += 1,
                _ => s.1 += 1,
            }
        }
    }
    writeln!(
        out,
        "  data: {} read, {} written; the servers were asked for {} and sent {}",
        human(all.read),
        human(all.written),
        human(fetched),
        human(sent)
    )?;
    let secs = |ns: u64| format!("{:.3} s", ns as f64 / 1e9);
    writeln!(out, "\nper process")?;
    writeln!(
        out,
        "  {:>8} {:<16} {:>9} {:>7} {:>11} {:>11} {:>11}",
        "pid", "name", "ops", "errors", "read", "written", "in I/O"
    )?;
    let names = names(&t.records);
    for (pid, s) in &procs {
        let exe = names.get(pid).map_or("?", |n| &**n);
        writeln!(
            out,
            "  {:>8} {:<16} {:>9} {:>7} {:>11} {:>11} {:>11}",
            pid,
            exe,
            s.ops,
            s.errors,
            human(s.read),
            human(s.written),
            secs(s.ns)
        )?;
    }
    writeln!(out, "\nper file (by time in I/O)")?;
    writeln!(
        out,
        "  {:>9} {:>7} {:>7} {:>11} {:>11} {:>11}  path",
        "ops", "reads", "writes", "read", "written", "in I/O"
    )?;
    let mut files: Vec<_> = files.into_iter().collect();
    files.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then_with(|| a.0.cmp(&b.0)));
    for (path, s) in &files {
        writeln!(
            out,
            "  {:>9} {:>7} {:>7} {:>11} {:>11} {:>11}  {path}",
            s.ops,
            s.reads,
            s.writes,
            human(s.read),
            human(s.written),
            secs(s.ns)
        )?;
    }
    writeln!(out, "\noperations")?;
    for (op, s) in &ops {
        writeln!(
            out,
            "  {:<12} {:>9} {:>7} errors {:>11}",
            op.name(),
            s.ops,
            s.errors,
            secs(s.ns)
        )?;
    }
    writeln!(
        out,
        "\nrequest sizes (as the kernel, or the program through the library, asked)"
    )?;
    writeln!(out, "  {:<22} {:>9} {:>9}", "size", "reads", "writes")?;
    for (c, (reads, writes)) in &sizes {
        writeln!(out, "  {:<22} {reads:>9} {writes:>9}", class_label(*c))?;
    }
    if !t.gaps.is_empty() {
        writeln!(out, "\ngaps (records the writer had no room for)")?;
        for g in &t.gaps {
            writeln!(
                out,
                "  {:>9} lost between {:.3} s and {:.3} s",
                g.dropped,
                g.from_ns as f64 / 1e9,
                g.to_ns as f64 / 1e9
            )?;
        }
    }
    Ok(())
}

/// Each process's name: the one most of its records have (a shell's child that execs a
/// program made a few requests as the shell first).
fn names(records: &[Record]) -> HashMap<u32, Arc<str>> {
    let mut seen: HashMap<u32, HashMap<&Arc<str>, u64>> = HashMap::new();
    for r in records {
        if let Some(exe) = &r.exe {
            *seen.entry(r.pid).or_default().entry(exe).or_default() += 1;
        }
    }
    seen.into_iter()
        .filter_map(|(pid, counts)| {
            let (exe, _) = counts
                .into_iter()
                .max_by_key(|&(exe, n)| (n, exe.clone()))?;
            Some((pid, Arc::clone(exe)))
        })
        .collect()
}

/// A record's file: its path, else its inode.
fn file_key(r: &Record) -> String {
    match &r.path {
        Some(p) => p.to_string(),
        None => format!("inode {}", r.ino),
    }
}

/// `unix_ns` as `YYYY-MM-DD HH:MM:SS`.
fn utc(unix_ns: u64) -> String {
    crate::files::utc_secs(i64::try_from(unix_ns / 1_000_000_000).unwrap_or(i64::MAX))
}

/// `--from`/`--to` in nanoseconds.
fn window(a: &ExportArgs) -> Result<(u64, u64)> {
    if let (Some(from), Some(to)) = (a.from, a.to) {
        if from > to {
            bail!("--from {from} is after --to {to}");
        }
    }
    let ns = |s: f64| (s * 1e9) as u64;
    Ok((a.from.map_or(0, ns), a.to.map_or(u64::MAX, ns)))
}

fn export(a: &ExportArgs, out: &mut impl Write) -> Result<()> {
    let t = load(&a.trace, window(a)?)?;
    match a.format {
        Format::Chrome => chrome(&t, a.from, out),
        Format::Fio => fio(&t, a.root.as_deref(), out),
        Format::Parquet => bail!("Parquet goes to a file (-o)"),
    }
}

#[cfg(feature = "parquet")]
fn parquet(a: &ExportArgs) -> Result<()> {
    let Some(out) = &a.output else {
        bail!("Parquet goes to a file: give -o FILE");
    };
    crate::trace_parquet::export(&a.trace, window(a)?, out)
}

#[cfg(not(feature = "parquet"))]
fn parquet(_: &ExportArgs) -> Result<()> {
    bail!("this tessera was built without Parquet (cargo feature `parquet`)")
}

/// Chrome trace JSON: a process per traced process, named as [`names`] says; in it, as
/// many tracks as it had operations at once (each track's slices must not overlap); gaps as
/// global instant events.
fn chrome(t: &Trace, from: Option<f64>, out: &mut impl Write) -> Result<()> {
    let us = |ns: u64| ns as f64 / 1e3;
    let base = from.map_or(0, |s| (s * 1e9) as u64);
    let json = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into());
    writeln!(out, "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{")?;
    let h = &t.header;
    writeln!(
        out,
        "\"host\":{},\"source\":{},\"mode\":{},\"clock_unix_ns\":{}}},\"traceEvents\":[",
        json(&h.host),
        json(&h.source),
        json(h.mode.name()),
        h.unix_ns
    )?;
    let mut first = true;
    let mut sep = |out: &mut dyn Write| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            out.write_all(b",\n")?;
        }
        Ok(())
    };
    let mut lanes: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut pids = std::collections::BTreeSet::new();
    for r in &t.records {
        pids.insert(r.pid);
        let ends = lanes.entry(r.pid).or_default();
        let lane = match ends.iter().position(|&end| end <= r.start_ns) {
            Some(i) => i,
            None => {
                ends.push(0);
                ends.len() - 1
            }
        };
        ends[lane] = r.end_ns.max(r.start_ns + 1);
        sep(out)?;
        write!(
            out,
            "{{\"ph\":\"X\",\"name\":\"{}\",\"cat\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"ino\":{},\"offset\":{},\"size\":{},\"result\":{},\"uid\":{},\"mode\":\"{}\"",
            r.op.name(),
            if r.op.is_data() { "data" } else { "metadata" },
            r.pid,
            lane,
            us(r.start_ns.saturating_sub(base)),
            us(r.duration_ns()),
            r.ino,
            r.offset,
            r.size,
            r.result,
            r.uid,
            r.mode.name()
        )?;
        if let Some(p) = &r.path {
            write!(out, ",\"path\":{}", json(p))?;
        }
        if let Some(p) = &r.target {
            write!(out, ",\"target\":{}", json(p))?;
        }
        if let Some(e) = &r.exe {
            write!(out, ",\"exe\":{}", json(e))?;
        }
        if let Some(n) = r.server_size {
            write!(out, ",\"server_size\":{n}")?;
        }
        if r.via_handle {
            write!(out, ",\"via_handle\":true")?;
        }
        write!(out, "}}}}")?;
    }
    let names = names(&t.records);
    for pid in pids {
        sep(out)?;
        let name = format!("{} ({pid})", names.get(&pid).map_or("?", |n| &**n));
        write!(
            out,
            "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"args\":{{\"name\":{}}}}}",
            json(&name)
        )?;
    }
    for g in &t.gaps {
        sep(out)?;
        write!(
            out,
            "{{\"ph\":\"i\",\"s\":\"g\",\"name\":\"{} records lost\",\"pid\":0,\"tid\":0,\"ts\":{:.3},\"args\":{{\"dropped\":{},\"to_us\":{:.3}}}}}",
            g.dropped,
            g.dropped,
            us(g.from_ns.saturating_sub(base)),
            us(g.to_ns.saturating_sub(base))
        )?;
    }
    writeln!(out, "\n]}}")?;
    Ok(())
}

/// fio iolog v3: `timestamp file action [offset length]`, timestamps in microseconds from the
/// first operation. Each file is added and opened at its first operation and closed after
/// its last (a program with many files keeps few open at once), and closed and opened again
/// where the trace opened it again in between (an open is where a mount's kernel drops the
/// file's cached pages, so the requests after it reach the file system as they did). Only
/// reads, writes and fsyncs that succeeded are kept, each read or write with the bytes it
/// really moved (a read that met the end of its file moved fewer than it asked for, and fio
/// replaying the request as asked would stop there).
fn fio(t: &Trace, root: Option<&Path>, out: &mut impl Write) -> Result<()> {
    let root = match root {
        Some(r) => r.to_path_buf(),
        None => PathBuf::from(t.header.source.strip_prefix("fuse ").unwrap_or("/")),
    };
    // Each kept operation, its path, and whether the file was opened again before it.
    let mut kept: Vec<(&Record, &str, bool)> = Vec::new();
    let mut used: HashSet<&str> = HashSet::new();
    let mut reopened: HashSet<&str> = HashSet::new();
    let mut skipped = 0usize;
    for r in &t.records {
        let op_kept = match r.op {
            Op::Read | Op::Write => r.result > 0,
            Op::Fsync => r.result >= 0,
            Op::Open | Op::Create => {
                if let Some(p) = r.path.as_deref().filter(|p| used.contains(p)) {
                    if r.result >= 0 {
                        reopened.insert(p);
                    }
                }
                continue;
            }
            _ => continue,
        };
        // fio reads names up to the first blank.
        match r
            .path
            .as_deref()
            .filter(|p| !p.contains(char::is_whitespace))
        {
            Some(p) if op_kept => {
                let again = reopened.remove(p);
                used.insert(p);
                kept.push((r, p, again));
            }
            None if r.result >= 0 => skipped += 1,
            _ => {}
        }
    }
    let base = kept.first().map_or(0, |(r, _, _)| r.start_ns);
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, (_, path, _)) in kept.iter().enumerate() {
        last.insert(path, i);
    }
    let mut opened: HashSet<&str> = HashSet::new();
    writeln!(out, "fio version 3 iolog")?;
    for (i, (r, path, again)) in kept.iter().enumerate() {
        let file = root.join(path.trim_start_matches('/'));
        let file = file.display();
        let ts = (r.start_ns - base) / 1000;
        if opened.insert(path) {
            writeln!(out, "{ts} {file} add\n{ts} {file} open")?;
        } else if *again {
            writeln!(out, "{ts} {file} close\n{ts} {file} open")?;
        }
        match r.op {
            Op::Read => writeln!(out, "{ts} {file} read {} {}", r.offset, r.result)?,
            Op::Write => writeln!(out, "{ts} {file} write {} {}", r.offset, r.result)?,
            // fio takes a line of four fields for an operation, of two for a file's.
            _ => writeln!(out, "{ts} {file} sync 0 0")?,
        }
        if last.get(path) == Some(&i) {
            writeln!(out, "{} {file} close", r.end_ns.saturating_sub(base) / 1000)?;
        }
    }
    if skipped > 0 {
        eprintln!("{skipped} operations left out: no path known, or a path with blanks");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_700_000_000_000_000_000), "2023-11-14 22:13:20");
        assert_eq!(utc(951_782_400_000_000_000), "2000-02-29 00:00:00");
    }

    /// A read that met the end of its file is exported with the bytes it moved, and one that
    /// moved none is left out: fio replays the whole log (as asked, it stops at the first). A
    /// file the trace opened again between its requests is closed and opened again.
    #[test]
    fn the_fio_export_replays_whole_through_short_reads() {
        let d = tempfile::tempdir().expect("a directory");
        std::fs::write(d.path().join("a"), vec![7u8; 8192]).expect("a file");
        let rec = |op, offset, size, result, at| Record {
            op,
            mode: tessera_trace::Mode::PageCache,
            via_handle: false,
            pid: 1,
            uid: 0,
            exe: None,
            ino: 2,
            path: Some("/a".into()),
            target: None,
            offset,
            size,
            server_size: None,
            flags: 0,
            start_ns: at,
            end_ns: at + 10,
            result,
        };
        let t = Trace {
            header: Header::new("h".into(), 1, "fuse /nowhere".into(), Default::default()),
            records: vec![
                rec(Op::Read, 0, 65536, 8192, 1000),
                rec(Op::Read, 8192, 65536, 0, 2000),
                rec(Op::Open, 0, 0, 0, 2500),
                rec(Op::Read, 4096, 4096, 4096, 3000),
                rec(Op::Read, 0, 4096, -5, 4000),
                rec(Op::Fsync, 0, 0, 0, 5000),
            ],
            gaps: Vec::new(),
            end: None,
            torn: false,
        };
        let mut out = Vec::new();
        fio(&t, Some(d.path()), &mut out).expect("the export");
        let log = String::from_utf8(out).expect("text");
        let file = d.path().join("a");
        let reads: Vec<String> = log
            .lines()
            .filter(|l| l.contains(" read "))
            .map(String::from)
            .collect();
        assert_eq!(
            reads,
            [
                format!("0 {} read 0 8192", file.display()),
                format!("2 {} read 4096 4096", file.display())
            ],
            "{log}"
        );
        // Opened again in the trace between its reads: so in the log.
        let file = file.display();
        assert!(
            log.contains(&format!("2 {file} read 4096 4096"))
                && log.contains(&format!("2 {file} close\n2 {file} open\n2 {file} read")),
            "{log}"
        );
        let path = d.path().join("log");
        std::fs::write(&path, &log).expect("the log");
        let run = std::process::Command::new("fio")
            .args(["--name=replay", "--ioengine=psync", "--replay_no_stall=1"])
            .arg(format!("--read_iolog={}", path.display()))
            .args(["--output-format=json"])
            .output()
            .expect("fio is installed (scripts/deps.sh)");
        let text = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let json: serde_json::Value = serde_json::from_str(&text).expect("fio's JSON");
        assert_eq!(json["jobs"][0]["read"]["io_bytes"], 8192 + 4096, "{text}");
        assert_eq!(json["jobs"][0]["sync"]["total_ios"], 1, "{text}");
    }

    #[test]
    fn size_classes() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(4095), 0);
        assert_eq!(size_class(4096), 1);
        assert_eq!(size_class(65536), 5);
        assert_eq!(class_label(5), "64.0 KiB - 128.0 KiB");
    }
}
