//! The model as other tools' inputs (docs/MODEL.md, Exports): a fio job file and an IOR script
//! for the data phases, mdtest command lines for the metadata phases. Each lists at its top
//! what the tool cannot express and had to be approximated.

use crate::{AccessMode, DataOp, MetaKind, MetaPhase, Model, Phase};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Whether each phase (by start) must wait for those before it: true where a phase before it
/// ended before it started in the trace (the others ran at once with it).
pub fn ordered(phases: &[Phase]) -> Vec<bool> {
    let mut group_start = 0;
    let mut marks = Vec::with_capacity(phases.len());
    for (i, p) in phases.iter().enumerate() {
        let wait = phases[group_start..i].iter().any(|q| q.end_ns < p.start_ns);
        if wait {
            group_start = i;
        }
        marks.push(wait);
    }
    marks
}

/// A file's path relative to the directory a replay runs in.
pub fn relative(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// What one process does in a phase, as the tools that give every process the same part see
/// it: requests per repetition (the mean), and whether the processes' parts differ.
fn per_process_ops(p: &Phase) -> (u64, bool) {
    let n = p.processes.len().max(1) as u64;
    let total: u64 = p.processes.iter().map(|q| q.ops).sum();
    let uneven = p.processes.iter().any(|q| q.ops != p.processes[0].ops);
    (total.div_ceil(n).max(1), uneven)
}

/// The constant step between consecutive processes' initial offsets, if there is one.
fn process_step(p: &Phase) -> Option<u64> {
    let mut offs: Vec<u64> = p.processes.iter().map(|q| q.initial_offset).collect();
    offs.sort_unstable();
    let step = match offs.as_slice() {
        [a, b, ..] => b - a,
        _ => return Some(0),
    };
    offs.windows(2).all(|w| w[1] - w[0] == step).then_some(step)
}

fn describe(m: &Model, p: &Phase) -> String {
    let path = m.file(p.file).map_or("?", |f| f.path.as_str());
    let op = match p.op {
        DataOp::Read => "read",
        DataOp::Write => "write",
    };
    let access = match p.access {
        AccessMode::Sequential => "sequential",
        AccessMode::Strided => "strided",
        AccessMode::Random => "random",
    };
    format!(
        "phase {}: {op} {path}, {access}, {} processes, {} requests of {} bytes, {} repetitions",
        p.id,
        p.processes.len(),
        p.ops,
        p.request_size,
        p.repetitions
    )
}

/// fio's file names end at a `:` (a list of files): it is escaped.
fn fio_name(path: &str) -> String {
    relative(path).replace(':', "\\:")
}

/// A fio job file: one job per data phase, `numjobs` its processes, `stonewall` where the
/// phase waited for earlier ones. Run it in the directory to replay in (`fio --directory=DIR`).
pub fn fio(m: &Model) -> String {
    let mut notes = Vec::new();
    let mut jobs = String::new();
    for (p, wait) in m.phases.iter().zip(ordered(&m.phases)) {
        fio_job(m, p, wait, &mut jobs, &mut notes);
    }
    if !m.meta_phases.is_empty() {
        notes.push(format!(
            "{} metadata phases are left out (see --export mdtest)",
            m.meta_phases.len()
        ));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "; fio job file of the I/O model of {} (tessera replay --export fio)",
        m.source.trace
    );
    let _ = writeln!(
        out,
        "; run in the directory to replay in: fio --directory=DIR FILE"
    );
    let _ = writeln!(
        out,
        "; one job per data phase; stonewall where a phase waited for the ones before it"
    );
    push_notes(&mut out, ";", &notes);
    let _ = writeln!(out, "\n[global]\nioengine=psync\nrandrepeat=1\n");
    out.push_str(&jobs);
    out
}

fn fio_job(m: &Model, p: &Phase, wait: bool, out: &mut String, notes: &mut Vec<String>) {
    let Some(file) = m.file(p.file) else {
        notes.push(format!(
            "phase {}: its file {} is not in the model",
            p.id, p.file
        ));
        return;
    };
    let bs = p.request_size.max(1);
    let (ops, uneven) = per_process_ops(p);
    if uneven {
        notes.push(format!(
            "phase {}: processes made different numbers of requests; each job makes {ops}",
            p.id
        ));
    }
    let np = p.processes.len().max(1);
    let first = p
        .processes
        .iter()
        .map(|q| q.initial_offset)
        .min()
        .unwrap_or(0);
    let io_size = ops * bs;
    let (rw, offset, size) = match (p.access, p.displacement) {
        (AccessMode::Random, _) => {
            let rw = if p.op == DataOp::Read {
                "randread"
            } else {
                "randwrite"
            };
            let span = p.offset_max.saturating_sub(p.offset_min).max(bs);
            (rw.to_string(), p.offset_min, span)
        }
        (_, Some(d)) if d != bs as i64 => {
            let rw = if p.op == DataOp::Read {
                "read"
            } else {
                "write"
            };
            let step = d.unsigned_abs().max(bs);
            if d < bs as i64 {
                notes.push(format!(
                    "phase {}: displacement {d} replayed as {step} (fio skips only forward)",
                    p.id
                ));
            }
            (format!("{rw}:{}", step - bs), first, ops * step)
        }
        _ => {
            let rw = if p.op == DataOp::Read {
                "read"
            } else {
                "write"
            };
            (rw.to_string(), first, io_size)
        }
    };
    let _ = writeln!(out, "; {}", describe(m, p));
    let _ = writeln!(out, "[phase{}]", p.id);
    let _ = writeln!(out, "filename={}", fio_name(&file.path));
    let _ = writeln!(out, "rw={rw}");
    match bssplit(p) {
        Some((split, dropped)) => {
            let _ = writeln!(out, "bssplit={split}");
            notes.push(format!(
                "phase {}: {} request sizes, as shares of bssplit{}",
                p.id,
                p.sizes.len(),
                if dropped {
                    " (sizes under 1 % left out)"
                } else {
                    ""
                }
            ));
        }
        None => {
            let _ = writeln!(out, "bs={bs}");
        }
    }
    let _ = writeln!(out, "offset={offset}\nsize={size}\nio_size={io_size}");
    if np > 1 && p.access != AccessMode::Random {
        match process_step(p) {
            Some(step) => {
                let _ = writeln!(out, "offset_increment={step}");
            }
            None => notes.push(format!(
                "phase {}: processes' initial offsets are not evenly spaced",
                p.id
            )),
        }
    }
    let _ = writeln!(out, "numjobs={np}");
    if p.repetitions > 1 {
        let _ = writeln!(out, "loops={}", p.repetitions);
    }
    if wait {
        let _ = writeln!(out, "stonewall");
    }
    out.push('\n');
}

/// fio's `bssplit` for a phase of several sizes (percentages of requests, summing to 100);
/// whether sizes too rare for a whole percent were left out. None for one size.
fn bssplit(p: &Phase) -> Option<(String, bool)> {
    if p.sizes.len() < 2 {
        return None;
    }
    let total: u64 = p.sizes.iter().map(|s| s.count).sum::<u64>().max(1);
    let mut parts: Vec<(u64, u64)> = p
        .sizes
        .iter()
        .map(|s| (s.size.max(1), s.count * 100 / total))
        .filter(|&(_, pct)| pct > 0)
        .collect();
    let dropped = parts.len() < p.sizes.len();
    let sum: u64 = parts.iter().map(|&(_, pct)| pct).sum();
    // The largest share takes what rounding down left.
    if let Some(first) = parts.first_mut() {
        first.1 += 100 - sum.min(100);
    }
    let text = parts
        .iter()
        .map(|(size, pct)| format!("{size}/{pct}"))
        .collect::<Vec<_>>()
        .join(":");
    Some((text, dropped))
}

/// An IOR script (`ior -f FILE`): one `RUN` per data phase, its parameters restated in full.
/// IOR's layout is blocks of `blockSize` per task, `segmentCount` times, in transfers of
/// `transferSize`, which must be a multiple of 8 and divide the block: what does not fit is
/// rounded and listed at the top.
pub fn ior(m: &Model) -> String {
    let mut notes = Vec::new();
    let mut runs = String::new();
    let waves = ordered(&m.phases).iter().filter(|&&w| w).count() + 1;
    for p in &m.phases {
        ior_run(m, p, &mut runs, &mut notes);
    }
    if m.phases.len() > waves {
        notes.push(format!(
            "RUNs run one after the other: the {} phases ran in {waves} groups at once",
            m.phases.len()
        ));
    }
    if !m.meta_phases.is_empty() {
        notes.push(format!(
            "{} metadata phases are left out (see --export mdtest)",
            m.meta_phases.len()
        ));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# IOR script of the I/O model of {} (tessera replay --export ior)",
        m.source.trace
    );
    let _ = writeln!(
        out,
        "# run in the directory to replay in: mpirun -np N ior -f FILE (N: the largest numTasks)"
    );
    push_notes(&mut out, "#", &notes);
    out.push_str("IOR START\n");
    out.push_str(&runs);
    out.push_str("IOR STOP\n");
    out
}

fn ior_run(m: &Model, p: &Phase, out: &mut String, notes: &mut Vec<String>) {
    let Some(file) = m.file(p.file) else {
        notes.push(format!(
            "phase {}: its file {} is not in the model",
            p.id, p.file
        ));
        return;
    };
    let id = p.id;
    let np = p.processes.len().max(1) as u64;
    let (ops, uneven) = per_process_ops(p);
    if uneven {
        notes.push(format!(
            "phase {id}: processes made different numbers of requests; each task makes {ops}"
        ));
    }
    let mut t = p.request_size.max(8);
    if !t.is_multiple_of(8) {
        t = t.next_multiple_of(8);
        notes.push(format!(
            "phase {id}: request size {} rounded up to {t} (a multiple of 8)",
            p.request_size
        ));
    }
    if p.sizes.len() > 1 {
        notes.push(format!(
            "phase {id}: {} request sizes, all made of the most common, {}",
            p.sizes.len(),
            p.request_size
        ));
    }
    let first = p
        .processes
        .iter()
        .map(|q| q.initial_offset)
        .min()
        .unwrap_or(0);
    if first != 0 && p.access != AccessMode::Random {
        notes.push(format!(
            "phase {id}: starts at offset {first}; IOR starts at 0"
        ));
    }
    let step = process_step(p);
    // Interleaved: each process one transfer per round, the rounds np transfers apart (IOR's
    // segments of one-transfer blocks).
    let interleaved = np > 1
        && step == Some(p.request_size)
        && p.displacement == Some((np * p.request_size) as i64);
    let (block, segments) = if interleaved {
        (t, ops)
    } else {
        match (p.access, p.displacement) {
            (AccessMode::Strided, d) => {
                notes.push(format!(
                    "phase {id}: displacement {d:?} has no IOR layout; each task writes one block"
                ));
            }
            (AccessMode::Random, _) => notes.push(format!(
                "phase {id}: random offsets fall within each task's block, not over {}..{}",
                p.offset_min, p.offset_max
            )),
            (AccessMode::Sequential, _) => {}
        }
        if np > 1 && step != Some(ops * p.request_size) && step.is_some() {
            notes.push(format!(
                "phase {id}: processes' parts are {} apart, not one after the other",
                step.unwrap_or(0)
            ));
        } else if np > 1 && step.is_none() {
            notes.push(format!(
                "phase {id}: processes' initial offsets are not evenly spaced"
            ));
        }
        (ops * t, 1)
    };
    if p.op == DataOp::Read && !file.created {
        notes.push(format!(
            "phase {id}: reads a file that existed before; IOR reads what it wrote (run a write of the same layout first)"
        ));
    }
    let (w, r) = match p.op {
        DataOp::Write => (1, 0),
        DataOp::Read => (0, 1),
    };
    let z = u8::from(p.access == AccessMode::Random);
    let _ = writeln!(out, "# {}", describe(m, p));
    let _ = writeln!(
        out,
        "#   as options: -a POSIX -o {} -N {np} -t {t} -b {block} -s {segments}{}{}{} -i {} -k -E",
        relative(&file.path),
        if w == 1 { " -w" } else { "" },
        if r == 1 { " -r" } else { "" },
        if z == 1 { " -z" } else { "" },
        p.repetitions.max(1)
    );
    let _ = write!(
        out,
        "    api=POSIX\n    testFile={}\n    numTasks={np}\n    filePerProc=0\n    \
         transferSize={t}\n    blockSize={block}\n    segmentCount={segments}\n    \
         writeFile={w}\n    readFile={r}\n    randomOffset={z}\n    repetitions={}\n    \
         keepFile=1\n    useExistingTestFile=1\nRUN\n",
        relative(&file.path),
        p.repetitions.max(1)
    );
}

/// mdtest command lines for the metadata phases: per directory, one run of its file creates,
/// stats and removals (`-F -C -T -r`), one of its directories' (`-D`). mdtest makes, stats and
/// removes each item once, the same count per process.
pub fn mdtest(m: &Model) -> String {
    #[derive(Default)]
    struct Dir {
        counts: BTreeMap<MetaKind, u64>,
        np: usize,
    }
    let mut dirs: BTreeMap<&str, Dir> = BTreeMap::new();
    for mp in &m.meta_phases {
        let d = dirs.entry(mp.dir.as_str()).or_default();
        *d.counts.entry(mp.kind).or_default() += mp.ops;
        d.np = d.np.max(mp.processes.len().max(1));
    }
    let mut notes = Vec::new();
    let mut lines = String::new();
    for (dir, d) in &dirs {
        let count = |k| d.counts.get(&k).copied().unwrap_or(0);
        let np = d.np as u64;
        let files = (count(MetaKind::Create), count(MetaKind::Unlink));
        let dirs_made = (count(MetaKind::Mkdir), count(MetaKind::Rmdir));
        let stats = count(MetaKind::Stat);
        let target = format!("DIR/{}", relative(dir));
        let target = target.trim_end_matches('/');
        for (what, (made, removed)) in [("-F", files), ("-D", dirs_made)] {
            let items = made.max(removed);
            if items == 0 {
                continue;
            }
            let n = items.div_ceil(np);
            let mut flags = vec![what, "-C"];
            if stats > 0 {
                flags.push("-T");
            }
            if removed > 0 {
                flags.push("-r");
            }
            if made != removed && removed > 0 {
                notes.push(format!(
                    "{dir}: {made} made and {removed} removed; mdtest makes and removes {}",
                    n * np
                ));
            }
            if stats > 0 && stats != items {
                notes.push(format!(
                    "{dir}: {stats} stats; mdtest stats each of its {} items once",
                    n * np
                ));
            }
            if n * np != items {
                notes.push(format!(
                    "{dir}: {items} items over {np} processes rounded up to {n} each"
                ));
            }
            let _ = writeln!(
                lines,
                "mpirun -np {np} mdtest {} -n {n} -d {target}",
                flags.join(" ")
            );
        }
        for kind in [MetaKind::Open, MetaKind::Rename, MetaKind::List] {
            if count(kind) > 0 {
                notes.push(format!(
                    "{dir}: {} {} have no mdtest phase",
                    count(kind),
                    meta_name(kind)
                ));
            }
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# mdtest commands for the metadata phases of the I/O model of {} (tessera replay --export mdtest)",
        m.source.trace
    );
    let _ = writeln!(out, "# DIR: the directory to replay in");
    push_notes(&mut out, "#", &notes);
    if lines.is_empty() {
        out.push_str("# no metadata phase mdtest can make\n");
    }
    out.push_str(&lines);
    out
}

/// A metadata kind's operations, in plain words (plural).
pub fn meta_name(kind: MetaKind) -> &'static str {
    match kind {
        MetaKind::Create => "creates",
        MetaKind::Mkdir => "mkdirs",
        MetaKind::Stat => "stats",
        MetaKind::Open => "opens",
        MetaKind::Unlink => "unlinks",
        MetaKind::Rmdir => "rmdirs",
        MetaKind::Rename => "renames",
        MetaKind::List => "listings",
    }
}

/// Metadata phases' operations by kind.
pub fn meta_counts(phases: &[MetaPhase]) -> BTreeMap<MetaKind, u64> {
    let mut counts = BTreeMap::new();
    for mp in phases {
        *counts.entry(mp.kind).or_default() += mp.ops;
    }
    counts
}

fn push_notes(out: &mut String, comment: &str, notes: &[String]) {
    if notes.is_empty() {
        let _ = writeln!(out, "{comment} approximations: none");
        return;
    }
    let _ = writeln!(out, "{comment} approximations:");
    for n in notes {
        let _ = writeln!(out, "{comment}   {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{synthetic, SizeCount};

    #[test]
    fn phases_wait_only_for_those_that_ended_before() {
        assert_eq!(
            ordered(&synthetic::read_then_write(2, 8).phases),
            [false, true]
        );
        assert_eq!(
            ordered(&synthetic::file_per_process(3, 2, 8).phases),
            [false, false, false]
        );
    }

    #[test]
    fn fio_strides_processes_over_a_shared_file() {
        let job = fio(&synthetic::shared_strided(4, 16, 4096));
        for line in [
            "filename=shared",
            "rw=write:12288",
            "bs=4096",
            "offset_increment=4096",
            "io_size=65536",
            "numjobs=4",
        ] {
            assert!(job.lines().any(|l| l == line), "{line} in\n{job}");
        }
        assert!(job.contains("approximations: none"), "{job}");
    }

    #[test]
    fn fio_splits_sizes_and_escapes_names() {
        let mut m = synthetic::random_reads(10, 4096, 1 << 20);
        m.files[0].path = "/a:b".into();
        m.phases[0].sizes = vec![
            SizeCount {
                size: 4096,
                count: 7,
            },
            SizeCount {
                size: 512,
                count: 3,
            },
        ];
        let job = fio(&m);
        assert!(job.lines().any(|l| l == "filename=a\\:b"), "{job}");
        assert!(job.lines().any(|l| l == "bssplit=4096/70:512/30"), "{job}");
        assert!(job.lines().any(|l| l == "rw=randread"), "{job}");
        assert!(
            job.contains("2 request sizes, as shares of bssplit"),
            "{job}"
        );
    }

    #[test]
    fn ior_lays_out_strided_processes_as_segments_and_lists_what_it_rounded() {
        let script = ior(&synthetic::shared_strided(4, 16, 4096));
        for line in [
            "transferSize=4096",
            "blockSize=4096",
            "segmentCount=16",
            "numTasks=4",
        ] {
            assert!(
                script.lines().any(|l| l.trim() == line),
                "{line} in\n{script}"
            );
        }
        let script = ior(&synthetic::file_per_process(1, 3, 1001));
        assert!(
            script.contains("request size 1001 rounded up to 1008"),
            "{script}"
        );
        assert!(
            script.lines().any(|l| l.trim() == "blockSize=3024"),
            "{script}"
        );
        let reads = ior(&synthetic::read_then_write(2, 8));
        assert!(
            reads.contains("reads a file that existed before"),
            "{reads}"
        );
        assert_eq!(reads.lines().filter(|l| *l == "RUN").count(), 2);
    }

    #[test]
    fn mdtest_makes_stats_and_removes_per_directory() {
        let md = mdtest(&synthetic::create_stat_unlink(4, 64));
        assert!(
            md.lines()
                .any(|l| l == "mpirun -np 4 mdtest -F -C -T -r -n 16 -d DIR/burst"),
            "{md}"
        );
        assert!(md.contains("approximations: none"), "{md}");
        let mut m = synthetic::create_stat_unlink(1, 10);
        m.meta_phases[1].ops = 25;
        m.meta_phases.push(synthetic::meta_phase(
            MetaKind::List,
            "/burst",
            &[100],
            9,
            4,
        ));
        let md = mdtest(&m);
        assert!(
            md.contains("25 stats; mdtest stats each of its 10 items once"),
            "{md}"
        );
        assert!(md.contains("9 listings have no mdtest phase"), "{md}");
        assert!(mdtest(&synthetic::read_then_write(1, 1)).contains("no metadata phase"));
    }
}
