//! Models of small applications whose shape is known in advance (those of issue 32's tests):
//! for tests of the replay and the exports, and to try `tessera replay` without a trace.

use crate::{
    AccessMode, Application, DataOp, Direction, FileModel, MetaKind, MetaPhase, Model,
    PhaseProcess, Process, Sharing, SizeCount, Source, Timeline, SCHEMA,
};
use crate::{MetadataLoad, Phase};

/// A phase's time span in these models: phase `slot` runs in `[slot, slot + 1)` seconds, so
/// phases of one slot ran at once and a later slot waited for the earlier ones.
const SLOT_NS: u64 = 1_000_000_000;

/// A data phase of `ops_each` requests of `rs` bytes per process (`(pid, initial offset)`),
/// in time slot `slot`.
#[allow(clippy::too_many_arguments)]
pub fn phase(
    file: u32,
    op: DataOp,
    access: AccessMode,
    procs: &[(u32, u64)],
    ops_each: u64,
    rs: u64,
    displacement: Option<i64>,
    (offset_min, offset_max): (u64, u64),
    slot: u64,
) -> Phase {
    let ops = ops_each * procs.len() as u64;
    Phase {
        id: 0,
        file,
        op,
        access,
        processes: procs
            .iter()
            .map(|&(pid, initial_offset)| PhaseProcess {
                pid,
                initial_offset,
                ops: ops_each,
                start_ns: slot * SLOT_NS,
            })
            .collect(),
        weight: ops * rs,
        repetitions: 1,
        ops,
        request_size: rs,
        sizes: vec![SizeCount {
            size: rs,
            count: ops,
        }],
        displacement,
        distance_ns: 0,
        think: Vec::new(),
        lead_ns: 0,
        offset_min,
        offset_max,
        start_ns: slot * SLOT_NS,
        end_ns: slot * SLOT_NS + SLOT_NS / 2,
        io_time_ns: 0,
    }
}

/// A metadata phase of `ops` operations of `kind` in `dir` by `pids`, in time slot `slot`.
pub fn meta_phase(kind: MetaKind, dir: &str, pids: &[u32], ops: u64, slot: u64) -> MetaPhase {
    MetaPhase {
        id: 0,
        kind,
        dir: dir.into(),
        processes: pids.to_vec(),
        ops,
        start_ns: slot * SLOT_NS,
        end_ns: slot * SLOT_NS + SLOT_NS / 2,
        io_time_ns: 0,
    }
}

/// A file: `created` in the trace, or there before with `size` bytes.
pub fn file(path: &str, created: bool, size: u64) -> FileModel {
    FileModel {
        id: 0,
        path: path.into(),
        size,
        created,
        processes: 0,
        sharing: Sharing::PerProcess,
        direction: Direction::None,
        access: AccessMode::Sequential,
        phases: 0,
        bytes_read: 0,
        bytes_written: 0,
        reads: 0,
        writes: 0,
        io_time_ns: 0,
        first_ns: 0,
        last_ns: 0,
    }
}

/// A whole model of these files and phases: ids numbered, and the application, process and
/// file levels summed from the phases.
pub fn model(mut files: Vec<FileModel>, mut phases: Vec<Phase>, mut meta: Vec<MetaPhase>) -> Model {
    phases.sort_by_key(|p| p.start_ns);
    meta.sort_by_key(|p| p.start_ns);
    let mut app = Application::default();
    let mut procs: Vec<Process> = Vec::new();
    fn proc_of(procs: &mut Vec<Process>, pid: u32, at: u64) -> usize {
        match procs.iter().position(|p| p.pid == pid) {
            Some(i) => i,
            None => {
                procs.push(Process {
                    pid,
                    exe: Some("synthetic".into()),
                    ops: 0,
                    bytes_read: 0,
                    bytes_written: 0,
                    io_time_ns: 0,
                    first_ns: at,
                    last_ns: at,
                });
                procs.len() - 1
            }
        }
    }
    let mut users: Vec<Vec<u32>> = vec![Vec::new(); files.len()];
    for (id, p) in phases.iter_mut().enumerate() {
        p.id = id as u32;
        let bytes_each = p.weight / p.processes.len().max(1) as u64;
        for q in &p.processes {
            let i = proc_of(&mut procs, q.pid, p.start_ns);
            procs[i].ops += q.ops * u64::from(p.repetitions);
            procs[i].last_ns = p.end_ns;
            match p.op {
                DataOp::Read => procs[i].bytes_read += bytes_each,
                DataOp::Write => procs[i].bytes_written += bytes_each,
            }
            if let Some(u) = users.get_mut(p.file as usize) {
                if !u.contains(&q.pid) {
                    u.push(q.pid);
                }
            }
        }
        let name = match p.op {
            DataOp::Read => {
                app.bytes_read += p.weight;
                app.reads += p.ops;
                "read"
            }
            DataOp::Write => {
                app.bytes_written += p.weight;
                app.writes += p.ops;
                "write"
            }
        };
        *app.ops.entry(name.into()).or_default() += p.ops;
        if let Some(f) = files.get_mut(p.file as usize) {
            f.phases += 1;
            let dir = match p.op {
                DataOp::Read => {
                    f.bytes_read += p.weight;
                    f.reads += p.ops;
                    Direction::Read
                }
                DataOp::Write => {
                    f.bytes_written += p.weight;
                    f.writes += p.ops;
                    Direction::Write
                }
            };
            f.direction = match f.direction {
                Direction::None => dir,
                d if d == dir => d,
                _ => Direction::ReadWrite,
            };
            f.access = p.access;
            if f.phases == 1 {
                f.first_ns = p.start_ns;
            }
            f.last_ns = p.end_ns;
        }
    }
    for (id, mp) in meta.iter_mut().enumerate() {
        mp.id = id as u32;
        for &pid in &mp.processes {
            let i = proc_of(&mut procs, pid, mp.start_ns);
            procs[i].ops += mp.ops / mp.processes.len().max(1) as u64;
        }
        let md: &mut MetadataLoad = &mut app.metadata;
        let slot = match mp.kind {
            MetaKind::Create => &mut md.creates,
            MetaKind::Mkdir => &mut md.mkdirs,
            MetaKind::Stat => &mut md.stats,
            MetaKind::Open => &mut md.opens,
            MetaKind::Unlink | MetaKind::Rmdir => &mut md.unlinks,
            MetaKind::Rename => &mut md.renames,
            MetaKind::List => &mut md.listings,
        };
        *slot += mp.ops;
    }
    for (id, f) in files.iter_mut().enumerate() {
        f.id = id as u32;
        let u = users.get(id).map_or(0, Vec::len);
        f.processes = u as u32;
        f.sharing = if u > 1 {
            Sharing::Shared
        } else {
            Sharing::PerProcess
        };
    }
    app.processes = procs.len() as u32;
    app.files = files.iter().filter(|f| f.phases > 0).count() as u32;
    let end = phases
        .iter()
        .map(|p| p.end_ns)
        .chain(meta.iter().map(|p| p.end_ns))
        .max()
        .unwrap_or(0);
    app.wall_ns = end;
    Model {
        schema: SCHEMA.into(),
        source: Source {
            trace: "synthetic".into(),
            traced_by: "synthetic".into(),
            mode: "library".into(),
            start_unix_ns: 0,
            records: 0,
            dropped: 0,
        },
        application: app,
        processes: procs,
        files,
        phases,
        meta_phases: meta,
        timeline: Timeline::default(),
        findings: Vec::new(),
    }
}

/// `np` processes, each writing its own new file `/out.<i>` sequentially, all at once.
pub fn file_per_process(np: u32, ops: u64, rs: u64) -> Model {
    let files = (0..np)
        .map(|i| file(&format!("/out.{i}"), true, ops * rs))
        .collect();
    let phases = (0..np)
        .map(|i| {
            let span = (0, ops * rs);
            let d = Some(rs as i64);
            phase(
                i,
                DataOp::Write,
                AccessMode::Sequential,
                &[(100 + i, 0)],
                ops,
                rs,
                d,
                span,
                0,
            )
        })
        .collect();
    model(files, phases, Vec::new())
}

/// `np` processes writing one new file `/shared` at once, strided: process `i` writes request
/// `k` at `(k * np + i) * rs`.
pub fn shared_strided(np: u32, ops: u64, rs: u64) -> Model {
    let size = ops * u64::from(np) * rs;
    let procs: Vec<(u32, u64)> = (0..np).map(|i| (100 + i, u64::from(i) * rs)).collect();
    let d = Some(i64::from(np) * rs as i64);
    let p = phase(
        0,
        DataOp::Write,
        AccessMode::Strided,
        &procs,
        ops,
        rs,
        d,
        (0, size),
        0,
    );
    model(vec![file("/shared", true, size)], vec![p], Vec::new())
}

/// One process reading `ops` requests of `rs` bytes at random from `/input`, a file of `size`
/// bytes that was there before.
pub fn random_reads(ops: u64, rs: u64, size: u64) -> Model {
    let p = phase(
        0,
        DataOp::Read,
        AccessMode::Random,
        &[(100, 0)],
        ops,
        rs,
        None,
        (0, size),
        0,
    );
    model(vec![file("/input", false, size)], vec![p], Vec::new())
}

/// One process reading `/data/in` (there before) sequentially, then writing `/data/out`.
pub fn read_then_write(ops: u64, rs: u64) -> Model {
    let size = ops * rs;
    let d = Some(rs as i64);
    let (seq, span) = (AccessMode::Sequential, (0, size));
    let r = phase(0, DataOp::Read, seq, &[(100, 0)], ops, rs, d, span, 0);
    let w = phase(1, DataOp::Write, seq, &[(100, 0)], ops, rs, d, span, 1);
    let files = vec![file("/data/in", false, size), file("/data/out", true, size)];
    model(files, vec![r, w], Vec::new())
}

/// `np` processes creating `n` files in `/burst` between them, then stating them, then
/// removing them.
pub fn create_stat_unlink(np: u32, n: u64) -> Model {
    let pids: Vec<u32> = (0..np).map(|i| 100 + i).collect();
    let meta = [MetaKind::Create, MetaKind::Stat, MetaKind::Unlink]
        .into_iter()
        .enumerate()
        .map(|(slot, kind)| meta_phase(kind, "/burst", &pids, n, slot as u64))
        .collect();
    model(Vec::new(), Vec::new(), meta)
}
