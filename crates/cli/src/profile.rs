//! `tessera profile`: a trace in, its I/O model out (docs/MODEL.md), with a short summary.

use crate::up::human;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use tessera_model::{Limits, Model, Profiler, Source};
use tessera_trace::{Item, Reader};

#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    /// A trace file (`tessera mount --trace`, `tessera trace start`, a traced client), or a
    /// Parquet table of records (`tessera trace export --format parquet`, `python -m
    /// tessera.darshan`).
    trace: PathBuf,
    /// Write the model (JSON) here; `-` for standard output (default: TRACE.model.json).
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// The model of the trace at `path`, read in one pass, or of the Parquet table of records
/// there.
pub fn profile_trace(path: &Path) -> Result<Model> {
    let mut magic = [0u8; 4];
    let parquet = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"PAR1";
    if parquet {
        return profile_table(path);
    }
    let mut r = Reader::open(path).with_context(|| format!("reading {}", path.display()))?;
    let h = r.header().clone();
    let mut p = Profiler::new(Limits::default());
    while let Some(item) = r
        .next_item()
        .with_context(|| format!("reading {}", path.display()))?
    {
        match item {
            Item::Record(rec) => p.push(&rec),
            Item::Gap(g) => p.gap(&g),
            Item::End { .. } => {}
        }
    }
    Ok(p.finish(Source {
        trace: file_name(path),
        traced_by: h.source,
        mode: h.mode.name().into(),
        start_unix_ns: h.unix_ns,
        records: 0,
        dropped: 0,
    }))
}

fn file_name(path: &Path) -> String {
    let name = path.file_name().unwrap_or(path.as_os_str());
    name.to_string_lossy().into_owned()
}

#[cfg(feature = "parquet")]
fn profile_table(path: &Path) -> Result<Model> {
    let t = crate::trace_parquet::read(path)?;
    let mut p = Profiler::new(Limits::default());
    for r in &t.records {
        p.push(r);
    }
    let mode = t.records.first().map(|r| r.mode.name().to_string());
    Ok(p.finish(Source {
        trace: file_name(path),
        traced_by: t.source.unwrap_or_else(|| "a table".into()),
        mode: t.mode.or(mode).unwrap_or_default(),
        start_unix_ns: t.clock_unix_ns,
        records: 0,
        dropped: 0,
    }))
}

#[cfg(not(feature = "parquet"))]
fn profile_table(path: &Path) -> Result<Model> {
    anyhow::bail!(
        "{} is a Parquet table, and this tessera was built without Parquet (feature `parquet`)",
        path.display()
    )
}

pub fn run(args: &ProfileArgs) -> Result<()> {
    let model = profile_trace(&args.trace)?;
    let json = model.to_json();
    let to_stdout = args.output.as_deref() == Some(Path::new("-"));
    if to_stdout {
        println!("{json}");
        return Ok(());
    }
    let out = args.output.clone().unwrap_or_else(|| {
        let mut p = args.trace.clone().into_os_string();
        p.push(".model.json");
        p.into()
    });
    std::fs::write(&out, json).with_context(|| format!("writing {}", out.display()))?;
    summary(&model, &mut std::io::stdout().lock())?;
    println!("model: {}", out.display());
    Ok(())
}

/// The model in a few lines: the application, the busiest files and phases, the findings.
fn summary(m: &Model, out: &mut impl Write) -> Result<()> {
    let a = &m.application;
    let secs = |ns: u64| ns as f64 / 1e9;
    writeln!(
        out,
        "{} records ({} lost), {} processes, {} files, {:.3} s: {} read in {} requests, {} \
         written in {} requests, {:.3} s in I/O ({:.3} s busy)",
        m.source.records,
        m.source.dropped,
        a.processes,
        a.files,
        secs(a.wall_ns),
        human(a.bytes_read),
        a.reads,
        human(a.bytes_written),
        a.writes,
        secs(a.io_time_ns),
        secs(a.busy_ns)
    )?;
    let md = &a.metadata;
    writeln!(
        out,
        "metadata: {} creates, {} mkdirs, {} stats, {} opens, {} unlinks, {} renames, {} \
         listings; {:.0}/s on average, {}/s at peak",
        md.creates,
        md.mkdirs,
        md.stats,
        md.opens,
        md.unlinks,
        md.renames,
        md.listings,
        md.per_second,
        md.peak_per_second
    )?;
    writeln!(
        out,
        "{} data phases, {} metadata phases",
        m.phases.len(),
        m.meta_phases.len()
    )?;
    let mut phases: Vec<_> = m.phases.iter().collect();
    phases.sort_by_key(|p| std::cmp::Reverse(p.weight));
    if !phases.is_empty() {
        writeln!(
            out,
            "  {:>5} {:<5} {:<10} {:>3} {:>10} {:>4} {:>9} {:>10}  file",
            "phase", "op", "access", "np", "weight", "rep", "requests", "size"
        )?;
    }
    for p in phases.iter().take(10) {
        let file = m.file(p.file).map_or("?", |f| f.path.as_str());
        writeln!(
            out,
            "  {:>5} {:<5} {:<10} {:>3} {:>10} {:>4} {:>9} {:>10}  {file}",
            p.id,
            format!("{:?}", p.op).to_lowercase(),
            format!("{:?}", p.access).to_lowercase(),
            p.processes.len(),
            human(p.weight),
            p.repetitions,
            p.ops,
            human(p.request_size)
        )?;
    }
    if phases.len() > 10 {
        writeln!(out, "  ... and {} more", phases.len() - 10)?;
    }
    for f in &m.findings {
        writeln!(out, "finding: {}", f.text)?;
    }
    Ok(())
}
