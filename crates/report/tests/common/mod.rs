//! Models made by hand for the report's tests: shaped like what the profiler writes (a write
//! phase and a read phase per file, metadata bursts, a sampled timeline, findings), of any size.

#![allow(dead_code)] // each test file uses part of it

use std::collections::BTreeMap;
use tessera_model::*;

/// What to make.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub processes: u32,
    pub files: u32,
    /// Data phases per file (alternately written and read).
    pub phases_per_file: u32,
    pub meta_phases: u32,
    /// Sampled requests per data phase in the timeline.
    pub points_per_phase: u32,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            processes: 8,
            files: 6,
            phases_per_file: 2,
            meta_phases: 3,
            points_per_phase: 120,
        }
    }
}

const MS: u64 = 1_000_000;
const KIB: u64 = 1024;

pub fn empty() -> Model {
    Model {
        schema: SCHEMA.into(),
        source: Source {
            trace: "empty.ttrace".into(),
            traced_by: "mount".into(),
            mode: "ops".into(),
            start_unix_ns: 0,
            records: 0,
            dropped: 0,
        },
        application: Application::default(),
        processes: vec![],
        files: vec![],
        phases: vec![],
        meta_phases: vec![],
        timeline: Timeline::default(),
        findings: vec![],
    }
}

/// A small deterministic generator, so sizes and offsets vary without a dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

pub fn make(shape: Shape) -> Model {
    let mut m = empty();
    m.source.trace = "run-42.ttrace".into();
    let mut rng = Lcg(42);
    let pids: Vec<u32> = (0..shape.processes).map(|i| 1000 + i).collect();
    let exes = ["/usr/bin/sort", "/opt/app/bin/simulate", "/usr/bin/tar"];
    let mut procs: BTreeMap<u32, Process> = pids
        .iter()
        .enumerate()
        .map(|(i, &pid)| {
            (
                pid,
                Process {
                    pid,
                    exe: Some(exes[i % exes.len()].into()),
                    ops: 0,
                    bytes_read: 0,
                    bytes_written: 0,
                    io_time_ns: 0,
                    first_ns: u64::MAX,
                    last_ns: 0,
                },
            )
        })
        .collect();
    // Request sizes: most files one size, the last ones small, and one file random sizes.
    let sizes = [4 * KIB, 64 * KIB, 1 << 20, 512];
    let mut t = 0u64;
    let bin_ns = 10 * MS;
    let mut heat: BTreeMap<u32, BTreeMap<u64, u64>> = BTreeMap::new();
    for fid in 0..shape.files {
        let shared = fid % 3 == 0;
        let users: Vec<u32> = if shared || pids.is_empty() {
            pids.clone()
        } else {
            vec![pids[fid as usize % pids.len()]]
        };
        let rs = sizes[(fid as usize) % sizes.len()];
        // Heavier files first, so the lightest is last (a finding names it).
        let per_proc_ops = 4 + 400 * u64::from(shape.files - fid) / u64::from(shape.files);
        let mut file = FileModel {
            id: fid,
            path: format!("results/step-{fid:04}/rank-{}.dat", fid % 7),
            size: 0,
            created: true,
            processes: users.len() as u32,
            sharing: if shared {
                Sharing::Shared
            } else {
                Sharing::PerProcess
            },
            direction: Direction::None,
            access: if shared {
                AccessMode::Strided
            } else {
                AccessMode::Sequential
            },
            phases: 0,
            bytes_read: 0,
            bytes_written: 0,
            reads: 0,
            writes: 0,
            io_time_ns: 0,
            first_ns: t,
            last_ns: t,
        };
        for k in 0..shape.phases_per_file {
            if users.is_empty() {
                break;
            }
            let op = if k % 2 == 0 {
                DataOp::Write
            } else {
                DataOp::Read
            };
            let random = fid == 1 && op == DataOp::Read;
            let np = users.len() as u64;
            let ops = per_proc_ops * np;
            let weight = ops * rs;
            let start = t;
            let span = 20 * MS + ops * 2_000;
            let id = m.phases.len() as u32;
            let mut ph = Phase {
                id,
                file: fid,
                op,
                access: if random {
                    AccessMode::Random
                } else {
                    file.access
                },
                processes: users
                    .iter()
                    .enumerate()
                    .map(|(i, &pid)| PhaseProcess {
                        pid,
                        initial_offset: if shared { i as u64 * rs } else { 0 },
                        ops: per_proc_ops,
                        start_ns: start + i as u64 * 1000,
                    })
                    .collect(),
                weight,
                repetitions: 1,
                ops,
                request_size: rs,
                sizes: vec![SizeCount {
                    size: rs,
                    count: ops,
                }],
                displacement: if random {
                    None
                } else if shared {
                    Some((np * rs) as i64)
                } else {
                    Some(rs as i64)
                },
                distance_ns: span / per_proc_ops,
                think: Vec::new(),
                lead_ns: 0,
                offset_min: 0,
                offset_max: ops * rs,
                start_ns: start,
                end_ns: start + span,
                io_time_ns: span / 2 * np,
            };
            if random {
                // A few odd sizes, as random readers have.
                ph.sizes.push(SizeCount {
                    size: 3000,
                    count: 5,
                });
                ph.sizes.push(SizeCount {
                    size: 100_000,
                    count: 2,
                });
            }
            for j in 0..shape.points_per_phase {
                let pid = users[j as usize % users.len()];
                let n = u64::from(j) * ops / u64::from(shape.points_per_phase.max(1));
                let offset = if random {
                    rng.next() % (ops * rs)
                } else {
                    n * rs
                };
                let at = start + span * u64::from(j) / u64::from(shape.points_per_phase.max(1));
                m.timeline.points.push(Point {
                    start_ns: at,
                    pid,
                    file: fid,
                    op,
                    offset,
                    size: if random && j % 9 == 0 { 3000 } else { rs },
                });
            }
            for (i, &pid) in users.iter().enumerate() {
                let p = procs.get_mut(&pid).expect("a user is a process");
                p.ops += per_proc_ops;
                let b = per_proc_ops * rs;
                match op {
                    DataOp::Read => p.bytes_read += b,
                    DataOp::Write => p.bytes_written += b,
                }
                p.io_time_ns += span / 2;
                p.first_ns = p.first_ns.min(start);
                p.last_ns = p.last_ns.max(start + span);
                // Bytes spread over the phase's bins, a little uneven per process.
                let (b0, b1) = (start / bin_ns, (start + span) / bin_ns);
                let per_bin = b / (b1 - b0 + 1);
                for bin in b0..=b1 {
                    *heat.entry(pid).or_default().entry(bin).or_default() +=
                        per_bin * (1 + (i as u64 + bin) % 3);
                }
            }
            match op {
                DataOp::Read => {
                    file.bytes_read += weight;
                    file.reads += ops;
                    m.application.reads += ops;
                    m.application.bytes_read += weight;
                }
                DataOp::Write => {
                    file.bytes_written += weight;
                    file.writes += ops;
                    m.application.writes += ops;
                    m.application.bytes_written += weight;
                }
            }
            file.direction = match (file.direction, op) {
                (Direction::None, DataOp::Read) => Direction::Read,
                (Direction::None, DataOp::Write) => Direction::Write,
                (Direction::Write, DataOp::Read) | (Direction::Read, DataOp::Write) => {
                    Direction::ReadWrite
                }
                (d, _) => d,
            };
            file.size = file.size.max(ops * rs);
            file.phases += 1;
            file.io_time_ns += ph.io_time_ns;
            file.last_ns = start + span;
            m.application.io_time_ns += ph.io_time_ns;
            m.phases.push(ph);
            t += span + 5 * MS;
        }
        m.files.push(file);
    }
    for k in 0..shape.meta_phases {
        let kind = [MetaKind::Create, MetaKind::Stat, MetaKind::Unlink][k as usize % 3];
        let ops = 200 + u64::from(k) * 37;
        let span = 20 * MS;
        m.meta_phases.push(MetaPhase {
            id: k,
            kind,
            dir: format!("results/step-{:04}", k),
            processes: pids.iter().take(4).copied().collect(),
            ops,
            start_ns: t,
            end_ns: t + span,
            io_time_ns: span,
        });
        match kind {
            MetaKind::Create => m.application.metadata.creates += ops,
            MetaKind::Stat => m.application.metadata.stats += ops,
            _ => m.application.metadata.unlinks += ops,
        }
        m.application.metadata.time_ns += span;
        t += span + MS;
    }
    let cols = t / bin_ns + 1;
    m.timeline.bin_ns = bin_ns;
    m.timeline.sampled_every = 16;
    m.timeline.heat = heat
        .into_iter()
        .map(|(pid, bins)| HeatRow {
            pid,
            bytes: (0..cols)
                .map(|c| bins.get(&c).copied().unwrap_or(0))
                .collect(),
        })
        .collect();
    m.timeline.points.sort_by_key(|p| p.start_ns);
    m.processes = procs
        .into_values()
        .filter(|p| p.ops > 0)
        .map(|mut p| {
            p.first_ns = p.first_ns.min(p.last_ns);
            p
        })
        .collect();
    let a = &mut m.application;
    a.processes = m.processes.len() as u32;
    a.files = m.files.len() as u32;
    a.ops = [
        ("read".to_string(), a.reads),
        ("write".to_string(), a.writes),
        ("create".to_string(), a.metadata.creates),
    ]
    .into();
    a.wall_ns = t;
    a.busy_ns = t * 9 / 10;
    a.metadata.per_second = (a.metadata.creates + a.metadata.stats + a.metadata.unlinks) as f64
        / (t.max(1) as f64 / 1e9);
    a.metadata.peak_per_second = 12_000;
    m.source.records = a.reads + a.writes + a.metadata.creates;
    m.findings = findings(&m);
    m
}

/// Findings as the profiler words them, naming the lightest file (last in any table) so the
/// report must show its row anyway.
fn findings(m: &Model) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(last) = m.files.last() {
        let phases: Vec<u32> = m
            .phases
            .iter()
            .filter(|p| p.file == last.id)
            .map(|p| p.id)
            .collect();
        out.push(Finding {
            kind: FindingKind::SmallRequests,
            text: format!(
                "{} is read and written in requests of {} bytes: small requests cost a round trip each",
                last.path,
                m.phases.last().map_or(0, |p| p.request_size)
            ),
            files: vec![last.id],
            phases,
            meta_phases: vec![],
        });
    }
    if let Some(random) = m.phases.iter().find(|p| p.access == AccessMode::Random) {
        out.push(Finding {
            kind: FindingKind::RandomOnSharedFile,
            text: "Random reads on a file several processes share".into(),
            files: vec![random.file],
            phases: vec![random.id],
            meta_phases: vec![],
        });
    }
    if !m.meta_phases.is_empty() {
        out.push(Finding {
            kind: FindingKind::MetadataBound,
            text: "Metadata operations <creates & stats> dominate the end of the run".into(),
            files: vec![],
            phases: vec![],
            meta_phases: m.meta_phases.iter().map(|p| p.id).collect(),
        });
    }
    out
}

/// Every `href="#x"` in `html` and whether an element has `id="x"`.
pub fn dangling_links(html: &str) -> Vec<String> {
    html.match_indices("href=\"#")
        .map(|(i, m)| {
            let rest = &html[i + m.len()..];
            rest[..rest.find('"').unwrap_or(0)].to_string()
        })
        .filter(|id| !html.contains(&format!("id=\"{id}\"")))
        .collect()
}

/// An evaluation of five configurations (1 and 10 Gbit/s links, 2 to 8 hosts), three runs
/// each, times shaped like a shuffle, with one configuration to predict.
pub fn verdict() -> tessera_evaluate::Verdict {
    let mut text = String::from(
        "baseline = \"h4-10g\"\n[prices.node]\npurchase = 3000\nhourly = 0.2\n\
         [[predict]]\nhosts = 16\nbandwidth = \"10Gbit\"\n",
    );
    let shapes = [(2, 1), (4, 1), (8, 1), (4, 10), (8, 10)];
    for (hosts, gbit) in shapes {
        text.push_str(&format!(
            "[[config]]\nname = \"h{hosts}-{gbit}g\"\nhosts = {hosts}\nhost = \"node\"\n\
             memory = \"1GiB\"\nbandwidth = \"{gbit}Gbit\"\n"
        ));
    }
    let plan = tessera_evaluate::Plan::parse(&text).expect("a good plan");
    let runs: Vec<Vec<tessera_evaluate::Run>> = shapes
        .iter()
        .map(|&(hosts, gbit)| {
            let t = 1.0 + 12.0 / f64::from(hosts) + 16.0 / f64::from(hosts * gbit);
            (0..3)
                .map(|i| tessera_evaluate::Run {
                    seconds: t * (1.0 + 0.03 * f64::from(i)),
                    bytes: 2 << 30,
                    ops: 5000,
                    memory_peak: 600 << 20,
                    cpu_seconds: t * 0.4 * f64::from(hosts),
                    iowait_seconds: 0.1,
                    link_bytes: (2u64 << 30) * 3,
                    busiest_cpu_seconds: t * 0.4,
                    busiest_link_bytes: 2 << 30,
                    host_seconds: Vec::new(),
                })
                .collect()
        })
        .collect();
    // A machine with a core for every host, so the split work divides by the hosts.
    tessera_evaluate::rank(&plan, &runs, 64.0)
}
