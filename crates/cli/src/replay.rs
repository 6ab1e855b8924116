//! `tessera replay`: an I/O model run against a directory and measured, checked against the
//! original trace, or exported for IOR, fio or mdtest (docs/MODEL.md).

use crate::profile::profile_trace;
use crate::up::human;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_model::{export, Model};
use tessera_replay::{Options, PhaseKind, Report, Think};

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// An I/O model (JSON, from `tessera profile`).
    model: PathBuf,
    /// The directory to replay in (a Tessera mount, tmpfs, a local disk, NFS...).
    #[arg(long, required_unless_present = "export")]
    dir: Option<PathBuf>,
    /// Keep the model's distance between one request and the next, the application's own time:
    /// spent on a core (`burn`, the default: its compute) or asleep (`sleep`).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "burn")]
    think_time: Option<ThinkArg>,
    /// Also write the results as JSON here (`-`: standard output, instead of the table).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Trace the replay into a new file in this directory.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Seeds the offsets of random phases.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Trace the replay, profile it and compare it with the model of this original trace:
    /// bytes, operation counts, request sizes and phases must match (the exit status says
    /// whether they do), I/O times are reported.
    #[arg(long, conflicts_with = "export")]
    check: Option<PathBuf>,
    /// DIR is in a Tessera mount: have the mount trace the timed phases (not the preparation)
    /// into a new file in this directory; `--check` then compares that trace, timed as a mount
    /// timed the original.
    #[arg(long, conflicts_with = "export")]
    mount_trace: Option<PathBuf>,
    /// Drop the kernel's page, name and inode caches (sync first) between the preparation and
    /// the timed phases, so that they start cold as the original did (needs root).
    #[arg(long, conflicts_with = "export")]
    drop_caches: bool,
    /// Write the model for another tool instead of running it: an IOR script, a fio job file,
    /// mdtest commands for the metadata phases.
    #[arg(long, value_enum, conflicts_with_all = ["dir", "think_time", "json", "trace"])]
    export: Option<Export>,
    /// Where the export goes (default: standard output).
    #[arg(short, long, requires = "export")]
    output: Option<PathBuf>,
}

/// `--think-time`'s values.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum ThinkArg {
    Burn,
    Sleep,
}

impl From<ThinkArg> for Think {
    fn from(a: ThinkArg) -> Think {
        match a {
            ThinkArg::Burn => Think::Burn,
            ThinkArg::Sleep => Think::Sleep,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum Export {
    Ior,
    Fio,
    Mdtest,
}

fn load(path: &Path) -> Result<Model> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Model::from_json(&text).with_context(|| format!("{}", path.display()))
}

pub fn run(args: &ReplayArgs) -> Result<()> {
    let model = load(&args.model)?;
    if let Some(kind) = args.export {
        let text = match kind {
            Export::Ior => export::ior(&model),
            Export::Fio => export::fio(&model),
            Export::Mdtest => export::mdtest(&model),
        };
        return match &args.output {
            Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display())),
            None => Ok(std::io::stdout().lock().write_all(text.as_bytes())?),
        };
    }
    let Some(dir) = &args.dir else {
        bail!("--dir DIR: where to replay");
    };
    // A check needs a trace of the replay: the mount's, else its own, kept where asked or
    // in a directory of its own that goes when the check is done.
    let scratch = (args.check.is_some() && args.trace.is_none() && args.mount_trace.is_none())
        .then(|| std::env::temp_dir().join(format!("tessera-replay-check-{}", std::process::id())));
    let opts = Options {
        think: args.think_time.map(Think::from),
        trace: args.trace.clone().or_else(|| scratch.clone()),
        seed: args.seed,
    };
    let context = || format!("replaying {} in {}", args.model.display(), dir.display());
    let prepared = tessera_replay::prepare(&model, dir).with_context(context)?;
    if args.drop_caches {
        drop_caches()?;
    }
    let mount = match &args.mount_trace {
        Some(t) => Some(MountTrace::start(dir, t)?),
        None => None,
    };
    let replayed = prepared.run(&opts).with_context(context);
    // Stopped whatever the replay's outcome, so the mount is left as it was found.
    let mount_trace = mount.map(MountTrace::stop).transpose();
    let checked = replayed.and_then(|report| {
        let mount_trace = mount_trace?;
        let comparison = match (&args.check, &mount_trace, &report.trace) {
            (Some(original), Some((trace, under)), _) => Some(check(original, trace, under)?),
            (Some(original), None, Some(trace)) => Some(check(original, trace, "")?),
            _ => None,
        };
        let mount_trace = mount_trace.map(|(t, _)| t);
        Ok((report, comparison, mount_trace))
    });
    if let Some(s) = &scratch {
        let _ = std::fs::remove_dir_all(s);
    }
    let (mut report, comparison, mount_trace) = checked?;
    if scratch.is_some() {
        report.trace = None;
    }
    let mut out = std::io::stdout().lock();
    // The report, and the comparison under `check` when there is one.
    let json = || -> Result<String> {
        let mut v = serde_json::to_value(&report)?;
        if let Some(map) = v.as_object_mut() {
            if let Some(c) = &comparison {
                map.insert("check".into(), serde_json::to_value(c)?);
            }
            map.insert("mount_trace".into(), serde_json::to_value(&mount_trace)?);
        }
        Ok(serde_json::to_string_pretty(&v)?)
    };
    match args.json.as_deref() {
        Some(p) if p == Path::new("-") => writeln!(out, "{}", json()?)?,
        Some(p) => {
            std::fs::write(p, json()?).with_context(|| format!("writing {}", p.display()))?;
            table(&report, &mut out)?;
        }
        None => table(&report, &mut out)?,
    }
    // Standard output holds only the JSON when it goes there (the comparison goes to stderr).
    match (&mount_trace, args.json.as_deref()) {
        (_, Some(p)) if p == Path::new("-") => {}
        (Some(t), _) => writeln!(out, "the mount's trace of the phases: {}", t.display())?,
        (None, _) => {}
    }
    if let Some(c) = comparison {
        let text = format!("\ncompared with the original's model:\n{}", c.text(false));
        if args.json.as_deref() == Some(Path::new("-")) {
            eprint!("{text}");
        } else {
            write!(out, "{text}")?;
        }
        if !c.shape_matches() {
            bail!("the replay did not do what the original did (see above)");
        }
    }
    Ok(())
}

fn drop_caches() -> Result<()> {
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n")
        .context("dropping the kernel's caches (/proc/sys/vm/drop_caches, needs root)")
}

/// A trace of the mount that holds the replay directory, switched on for the timed phases.
struct MountTrace {
    root: PathBuf,
    /// The replay directory in the mount's paths (`/run` for ROOT/run).
    under: String,
    dir: PathBuf,
    before: Vec<PathBuf>,
}

impl MountTrace {
    fn start(replay_dir: &Path, trace_dir: &Path) -> Result<Self> {
        let root = mount_root(replay_dir)?;
        let inside = std::fs::canonicalize(replay_dir)
            .with_context(|| format!("{}", replay_dir.display()))?;
        let under = inside
            .strip_prefix(&root)
            .map(|p| format!("/{}", p.display()))
            .unwrap_or_default();
        let dir = std::path::absolute(trace_dir).context("the mount's trace directory")?;
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("trace directory {}", dir.display()))?;
        let before = traces_in(&dir)?;
        crate::trace::control(&root, &format!("start {}", dir.display()))?;
        Ok(MountTrace {
            root,
            under,
            dir,
            before,
        })
    }

    /// Stops the trace and waits (up to a minute) for the mount to finish its file; the file,
    /// and the replay directory in its paths.
    fn stop(self) -> Result<(PathBuf, String)> {
        crate::trace::control(&self.root, "stop")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let new: Vec<PathBuf> = traces_in(&self.dir)?
                .into_iter()
                .filter(|p| !self.before.contains(p))
                .collect();
            if let [t] = &new[..] {
                if finished(t) {
                    return Ok((t.clone(), self.under));
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the mount's trace in {} was not finished within a minute of its stop",
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The root of the file system `dir` is in: its highest ancestor on the same device.
fn mount_root(dir: &Path) -> Result<PathBuf> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev());
    let here = dev(&dir).with_context(|| format!("{}", dir.display()))?;
    let mut root = dir.as_path();
    while let Some(up) = root.parent() {
        if dev(up).ok() != Some(here) {
            break;
        }
        root = up;
    }
    Ok(root.to_path_buf())
}

fn traces_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))?;
    Ok(entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "ttrace"))
        .collect())
}

/// The trace's writer has written its end.
fn finished(trace: &Path) -> bool {
    let Ok(mut r) = tessera_trace::Reader::open(trace) else {
        return false;
    };
    loop {
        match r.next_item() {
            Ok(Some(tessera_trace::Item::End { .. })) => return true,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return false,
        }
    }
}

/// The model of the replay's trace, its paths taken as under `under` (the replay directory
/// in a mount's paths; empty for the replay's own trace), compared with the model of the
/// original trace.
fn check(original: &Path, trace: &Path, under: &str) -> Result<tessera_model::Comparison> {
    let before = profile_trace(original)?;
    let mut after = profile_trace(trace)?;
    let rebase = |p: &mut String| {
        if let Some(rest) = p
            .strip_prefix(under)
            .filter(|r| r.is_empty() || r.starts_with('/'))
        {
            *p = if rest.is_empty() {
                "/".into()
            } else {
                rest.into()
            };
        }
    };
    if !under.is_empty() {
        after.files.iter_mut().for_each(|f| rebase(&mut f.path));
        after
            .meta_phases
            .iter_mut()
            .for_each(|p| rebase(&mut p.dir));
    }
    Ok(tessera_model::compare(&before, &after))
}

/// The replay's measures, a line per phase and the total.
fn table(r: &Report, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "replay of the model of {} in {}: {} processes, {} phases{}; {} prepared untimed",
        r.model,
        r.dir.display(),
        r.processes,
        r.phases.len(),
        match r.think {
            Some(Think::Burn) => ", with think time on a core",
            Some(Think::Sleep) => ", with think time asleep",
            None => "",
        },
        human(r.prepared_bytes)
    )?;
    let width = r
        .phases
        .iter()
        .map(|p| p.what.len())
        .max()
        .unwrap_or(0)
        .max(5);
    writeln!(
        out,
        "{:>6}  {:width$}  {:>3}  {:>10}  {:>8}  {:>6}  {:>9}  {:>9}  {:>12}  {:>9}",
        "phase", "what", "np", "bytes", "ops", "errors", "I/O time", "wall", "rate", "ops/s"
    )?;
    let line = |out: &mut dyn Write,
                id: &str,
                what: &str,
                np: String,
                m: &tessera_replay::Measure| {
        writeln!(
            out,
            "{id:>6}  {what:width$}  {np:>3}  {:>10}  {:>8}  {:>6}  {:>7.3} s  {:>7.3} s  {:>10}/s  {:>9.0}",
            human(m.bytes),
            m.ops,
            m.errors,
            m.io_time_ns as f64 / 1e9,
            m.wall_ns as f64 / 1e9,
            human(m.bytes_per_s as u64),
            m.ops_per_s
        )
    };
    for p in &r.phases {
        let id = match p.kind {
            PhaseKind::Data => format!("d{}", p.id),
            PhaseKind::Meta => format!("m{}", p.id),
        };
        line(out, &id, &p.what, p.processes.to_string(), &p.measure)?;
    }
    line(out, "total", "", r.processes.to_string(), &r.total)?;
    if let Some(t) = &r.trace {
        writeln!(out, "trace: {}", t.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_line_per_phase_and_the_total() {
        let d = std::env::temp_dir().join(format!("tessera-replay-table-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a directory");
        let m = tessera_model::synthetic::read_then_write(4, 1024);
        let r = tessera_replay::replay(&m, &d, &Options::default());
        let _ = std::fs::remove_dir_all(&d);
        let r = r.expect("the replay");
        let mut out = Vec::new();
        table(&r, &mut out).expect("the table");
        let text = String::from_utf8(out).expect("text");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(
            lines[2].contains("d0") && lines[2].contains("read /data/in"),
            "{text}"
        );
        assert!(
            lines[4].trim_start().starts_with("total") && lines[4].contains("8.0 KiB"),
            "{text}"
        );
    }
}
