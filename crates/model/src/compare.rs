//! How well a replay reproduced the application (docs/MODEL.md, Replay): the shape, which
//! must match exactly (bytes, operation counts, request sizes, phases), and the time, which is
//! reported (on the same configuration, the target is within 10 %).

use crate::export::{meta_counts, meta_name, relative};
use crate::{AccessMode, DataOp, MetaKind, Model, Phase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One quantity of both models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub what: String,
    pub original: String,
    pub replay: String,
    pub matches: bool,
}

/// The comparison of an original model with the model of its replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// Every quantity compared exactly, in order: totals, request sizes, phases.
    pub checks: Vec<Check>,
    /// Original and replay: the durations of the phases' operations summed (what a replay
    /// reproduces).
    pub io_time_ns: (u64, u64),
    /// The durations of the other operations (opens, closes, lookups outside bursts...).
    pub other_io_time_ns: (u64, u64),
    pub wall_ns: (u64, u64),
    /// Replay over original, of the phases' I/O time (None if the original's is 0).
    pub io_time_ratio: Option<f64>,
    /// What timed the original's operations: `mount` (a Tessera mount's trace, the kernel's
    /// requests), `replay` (a replay's own calls), or the tracer's name.
    pub time_by: String,
    /// The replay was timed the same way: only then are the I/O times comparable.
    pub time_alike: bool,
}

/// What timed a model's operations (the first word of its tracer, a mount's as `mount`).
fn timed_by(m: &Model) -> &str {
    match m.source.traced_by.split_whitespace().next() {
        Some("fuse") => "mount",
        Some(w) => w,
        None => "?",
    }
}

/// The durations of the operations of a model's phases, summed.
fn phases_io_time(m: &Model) -> u64 {
    let data: u64 = m.phases.iter().map(|p| p.io_time_ns).sum();
    data + m.meta_phases.iter().map(|p| p.io_time_ns).sum::<u64>()
}

/// What makes a data phase the same phase: where, what and how.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PhaseShape {
    op: DataOp,
    access: AccessMode,
    request_size: u64,
    processes: usize,
    repetitions: u32,
    ops: u64,
    weight: u64,
}

impl PhaseShape {
    fn of(p: &Phase) -> Self {
        PhaseShape {
            op: p.op,
            access: p.access,
            request_size: p.request_size,
            processes: p.processes.len(),
            repetitions: p.repetitions,
            ops: p.ops,
            weight: p.weight,
        }
    }

    fn text(&self) -> String {
        let op = match self.op {
            DataOp::Read => "read",
            DataOp::Write => "write",
        };
        let access = match self.access {
            AccessMode::Sequential => "sequential",
            AccessMode::Strided => "strided",
            AccessMode::Random => "random",
        };
        format!(
            "{op} {access} rs {} np {} x{} ops {} bytes {}",
            self.request_size, self.processes, self.repetitions, self.ops, self.weight
        )
    }
}

/// Each file's data phases in order, by path (relative: a replay runs elsewhere).
fn phases_by_file(m: &Model) -> BTreeMap<String, Vec<PhaseShape>> {
    let mut by: BTreeMap<String, Vec<PhaseShape>> = BTreeMap::new();
    for p in &m.phases {
        let path = m.file(p.file).map_or("?", |f| relative(&f.path));
        by.entry(path.to_string())
            .or_default()
            .push(PhaseShape::of(p));
    }
    by
}

/// Each directory's metadata phases of each kind in order: processes, operations. By kind:
/// bursts of two kinds that interleave (a stat, then an open, of every file) start in an
/// order that means nothing.
fn meta_by_dir(m: &Model) -> BTreeMap<(String, MetaKind), Vec<(usize, u64)>> {
    let mut by: BTreeMap<(String, MetaKind), Vec<_>> = BTreeMap::new();
    for mp in &m.meta_phases {
        by.entry((relative(&mp.dir).to_string(), mp.kind))
            .or_default()
            .push((mp.processes.len(), mp.ops));
    }
    by
}

/// Requests of each (operation, size) over all data phases.
fn sizes(m: &Model) -> BTreeMap<(DataOp, u64), u64> {
    let mut h = BTreeMap::new();
    for p in &m.phases {
        for s in &p.sizes {
            *h.entry((p.op, s.size)).or_default() += s.count;
        }
    }
    h
}

/// Compares the model of a replay with the original's.
pub fn compare(original: &Model, replay: &Model) -> Comparison {
    let mut checks = Vec::new();
    let mut check = |what: String, a: String, b: String| {
        let matches = a == b;
        checks.push(Check {
            what,
            original: a,
            replay: b,
            matches,
        });
    };
    let (a, b) = (&original.application, &replay.application);
    for (what, x, y) in [
        ("bytes read", a.bytes_read, b.bytes_read),
        ("bytes written", a.bytes_written, b.bytes_written),
        ("reads", a.reads, b.reads),
        ("writes", a.writes, b.writes),
    ] {
        check(what.into(), x.to_string(), y.to_string());
    }
    let (ma, mb) = (
        meta_counts(&original.meta_phases),
        meta_counts(&replay.meta_phases),
    );
    for kind in ma
        .keys()
        .chain(mb.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let n = |m: &BTreeMap<MetaKind, u64>| m.get(kind).copied().unwrap_or(0).to_string();
        check(meta_name(*kind).into(), n(&ma), n(&mb));
    }
    let (sa, sb) = (sizes(original), sizes(replay));
    for key in sa
        .keys()
        .chain(sb.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let n = |m: &BTreeMap<(DataOp, u64), u64>| m.get(key).copied().unwrap_or(0).to_string();
        let op = if key.0 == DataOp::Read {
            "reads"
        } else {
            "writes"
        };
        check(format!("{op} of {} bytes", key.1), n(&sa), n(&sb));
    }
    check(
        "data phases".into(),
        original.phases.len().to_string(),
        replay.phases.len().to_string(),
    );
    let (pa, pb) = (phases_by_file(original), phases_by_file(replay));
    for path in pa
        .keys()
        .chain(pb.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (xs, ys) = (pa.get(path), pb.get(path));
        let n = xs.map_or(0, Vec::len).max(ys.map_or(0, Vec::len));
        for i in 0..n {
            let text = |s: Option<&Vec<PhaseShape>>| {
                s.and_then(|v| v.get(i))
                    .map_or_else(|| "none".to_string(), PhaseShape::text)
            };
            check(format!("/{path} phase {i}"), text(xs), text(ys));
        }
    }
    check(
        "metadata phases".into(),
        original.meta_phases.len().to_string(),
        replay.meta_phases.len().to_string(),
    );
    let (da, db) = (meta_by_dir(original), meta_by_dir(replay));
    for key in da
        .keys()
        .chain(db.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (xs, ys) = (da.get(key), db.get(key));
        let n = xs.map_or(0, Vec::len).max(ys.map_or(0, Vec::len));
        let (dir, kind) = (&key.0, meta_name(key.1));
        for i in 0..n {
            let text = |s: Option<&Vec<(usize, u64)>>| {
                s.and_then(|v| v.get(i)).map_or_else(
                    || "none".to_string(),
                    |(np, ops)| format!("{ops} {kind} np {np}"),
                )
            };
            check(format!("/{dir} {kind} phase {i}"), text(xs), text(ys));
        }
    }
    let io = (phases_io_time(original), phases_io_time(replay));
    Comparison {
        checks,
        io_time_ns: io,
        other_io_time_ns: (
            a.io_time_ns.saturating_sub(io.0),
            b.io_time_ns.saturating_sub(io.1),
        ),
        wall_ns: (a.wall_ns, b.wall_ns),
        io_time_ratio: (io.0 > 0).then(|| io.1 as f64 / io.0 as f64),
        time_by: timed_by(original).into(),
        time_alike: timed_by(original) == timed_by(replay),
    }
}

impl Comparison {
    /// Whether the replay did what the original did (times aside).
    pub fn shape_matches(&self) -> bool {
        self.checks.iter().all(|c| c.matches)
    }

    /// A table of the checks (only those that differ, and a count of the rest, unless `all`)
    /// and the times.
    pub fn text(&self, all: bool) -> String {
        let mut out = String::new();
        let width = self.checks.iter().map(|c| c.what.len()).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "{:width$}  {:>40}  {:>40}",
            "",
            "original",
            "replay",
            width = width
        );
        for c in self.checks.iter().filter(|c| all || !c.matches) {
            let _ = writeln!(
                out,
                "{:width$}  {:>40}  {:>40}  {}",
                c.what,
                c.original,
                c.replay,
                if c.matches { "ok" } else { "DIFFERS" },
                width = width
            );
        }
        let differ = self.checks.iter().filter(|c| !c.matches).count();
        let _ = writeln!(
            out,
            "shape: {} of {} checks match{}",
            self.checks.len() - differ,
            self.checks.len(),
            if differ == 0 { "" } else { " (DIFFERS)" }
        );
        let secs = |ns: u64| ns as f64 / 1e9;
        let _ = writeln!(
            out,
            "timed by: {} for the original, {}",
            self.time_by,
            if self.time_alike {
                "the same for the replay"
            } else {
                "not the same for the replay (times not comparable)"
            }
        );
        let _ = write!(
            out,
            "I/O time in phases: original {:.3} s, replay {:.3} s",
            secs(self.io_time_ns.0),
            secs(self.io_time_ns.1)
        );
        match self.io_time_ratio {
            Some(r) => {
                let _ = writeln!(
                    out,
                    ", ratio {r:.3} ({}within 10 %)",
                    if (r - 1.0).abs() <= 0.10 { "" } else { "not " }
                );
            }
            None => out.push('\n'),
        }
        let _ = writeln!(
            out,
            "I/O time outside phases (not replayed): original {:.3} s, replay {:.3} s",
            secs(self.other_io_time_ns.0),
            secs(self.other_io_time_ns.1)
        );
        let _ = writeln!(
            out,
            "wall time: original {:.3} s, replay {:.3} s",
            secs(self.wall_ns.0),
            secs(self.wall_ns.1)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic;

    fn timed(mut m: Model, ns: u64) -> Model {
        for p in &mut m.phases {
            p.io_time_ns = ns;
        }
        m.application.io_time_ns = ns * m.phases.len() as u64 + 5;
        m
    }

    #[test]
    fn the_same_shape_matches_and_times_are_compared() {
        let a = timed(synthetic::read_then_write(4, 100), 1000);
        let b = timed(synthetic::read_then_write(4, 100), 1050);
        let c = compare(&a, &b);
        assert!(c.shape_matches(), "{}", c.text(true));
        assert_eq!(c.io_time_ns, (2000, 2100));
        assert_eq!(c.other_io_time_ns, (5, 5));
        assert!(c.io_time_ratio.is_some_and(|r| (r - 1.05).abs() < 1e-9));
        assert!(c.text(false).contains("within 10 %"), "{}", c.text(false));
        assert_eq!((c.time_by.as_str(), c.time_alike), ("synthetic", true));
        let mut d = b.clone();
        d.source.traced_by = "fuse /mnt/t".into();
        let c = compare(&d, &b);
        assert_eq!((c.time_by.as_str(), c.time_alike), ("mount", false));
        assert!(
            c.text(false).contains("not comparable"),
            "{}",
            c.text(false)
        );
    }

    #[test]
    fn another_request_size_or_a_missing_burst_differs() {
        let a = synthetic::read_then_write(4, 100);
        let mut b = a.clone();
        b.phases[1].request_size = 50;
        let c = compare(&a, &b);
        assert!(!c.shape_matches());
        let differ: Vec<&str> = (c.checks.iter())
            .filter(|k| !k.matches)
            .map(|k| k.what.as_str())
            .collect();
        assert_eq!(differ, ["/data/out phase 0"]);
        assert!(c.text(false).contains("DIFFERS"));

        let a = synthetic::create_stat_unlink(2, 10);
        let mut b = a.clone();
        b.meta_phases.pop();
        let c = compare(&a, &b);
        let differ: Vec<&str> = (c.checks.iter())
            .filter(|k| !k.matches)
            .map(|k| k.what.as_str())
            .collect();
        assert_eq!(
            differ,
            ["unlinks", "metadata phases", "/burst unlinks phase 0"]
        );
    }
}
