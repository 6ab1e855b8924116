//! The profiler: a trace's records in, the [`Model`] out, in one pass.
//!
//! Records arrive about in order of their end (a trace is written as operations finish); a
//! bounded heap puts them back in order of start. Each (file, process, read or write) stream
//! of requests is cut into runs of one shape ([`Run`]): each request starting where the last
//! ended (sequential), or a constant displacement away (strided). Runs too short to have a
//! shape are gathered into one random run. A run that repeats the one before it adds a
//! repetition. At the end, runs of several processes on one file with the same shape at the
//! same time become one phase with several processes (PIOM's Ph_np). Metadata operations form
//! bursts per directory and kind, ended by a pause.
//!
//! Memory is bounded by the files, processes, directories and phases found, each capped where it
//! could grow with the trace's length ([`Limits`]), never by the number of records.

mod phases;
mod run;
mod timeline;

use crate::model::*;
use phases::phases_and_files;
use run::{by_count, Run};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;
use tessera_trace::{Gap, Op, Record};
use timeline::Sampler;

/// Where the profiler stops keeping more, so that memory does not grow with the trace.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Records held back to be put in order of start.
    pub reorder: usize,
    /// Timeline points kept (one of every 2^k requests).
    pub points: usize,
    /// Heat-map columns (their width doubles as the trace goes on).
    pub heat_bins: usize,
    /// Runs kept per file; further ones are folded into the file's last run of their kind.
    pub runs_per_file: usize,
    /// Distinct request sizes counted per phase; further sizes are counted under the last.
    pub sizes: usize,
    /// A metadata burst ends after this long without an operation of its kind in its directory.
    pub meta_pause_ns: u64,
    /// Operations below which a burst is not a phase (it still counts in the totals).
    pub meta_min_ops: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            reorder: 8192,
            points: 20_000,
            heat_bins: 240,
            runs_per_file: 256,
            sizes: 16,
            meta_pause_ns: 1_000_000_000,
            meta_min_ops: 8,
        }
    }
}

/// Runs of at most this many requests have no shape of their own: gathered as random.
const SHAPELESS: u64 = 2;
/// Start-to-start distances kept per run for its median.
const DISTANCES: usize = 63;
/// Metadata bursts are looked at for their end every this many records.
const SWEEP_EVERY: u64 = 1 << 16;
/// Width of the first heat-map column.
const FIRST_BIN_NS: u64 = 10_000_000;

/// Builds a [`Model`] from records handed to it one at a time.
pub struct Profiler {
    limits: Limits,
    held: BinaryHeap<Reverse<Held>>,
    seq: u64,
    records: u64,
    dropped: u64,
    app: Application,
    first_ns: Option<u64>,
    last_ns: u64,
    busy: Option<(u64, u64)>,
    per_second: Vec<u32>,
    procs: BTreeMap<u32, Process>,
    files: Vec<FileState>,
    by_ino: HashMap<u64, u32>,
    streams: HashMap<(u32, u32, DataOp), Stream>,
    dirs: HashMap<Box<str>, u32>,
    dir_names: Vec<Arc<str>>,
    bursts: HashMap<(u32, MetaKind), Burst>,
    meta_phases: Vec<MetaPhase>,
    timeline: Sampler,
}

/// A record waiting its turn, ordered by start (then arrival).
struct Held(u64, u64, Record);

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.0, self.1) == (o.0, o.1)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0, self.1).cmp(&(o.0, o.1))
    }
}

struct FileState {
    ino: u64,
    path: Option<Arc<str>>,
    size: u64,
    created: bool,
    /// A data request was seen: a later create no longer makes it the replay's to create.
    touched: bool,
    readers: Vec<u32>,
    writers: Vec<u32>,
    bytes_read: u64,
    bytes_written: u64,
    reads: u64,
    writes: u64,
    io_time_ns: u64,
    first_ns: u64,
    last_ns: u64,
    runs: Vec<Run>,
}

/// One process's requests of one kind on one file: its open run, and short runs gathered.
#[derive(Default)]
struct Stream {
    open: Option<Run>,
    shapeless: Option<Run>,
    /// The last run closed, which a repeat of it adds a repetition to (an index in the file's
    /// runs).
    last: Option<usize>,
}

struct Burst {
    processes: Vec<u32>,
    ops: u64,
    start_ns: u64,
    end_ns: u64,
    io_time_ns: u64,
}

impl Profiler {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits: Limits {
                reorder: limits.reorder.max(1),
                points: limits.points.max(2),
                heat_bins: limits.heat_bins.max(2),
                runs_per_file: limits.runs_per_file.max(1),
                sizes: limits.sizes.max(1),
                ..limits
            },
            held: BinaryHeap::new(),
            seq: 0,
            records: 0,
            dropped: 0,
            app: Application::default(),
            first_ns: None,
            last_ns: 0,
            busy: None,
            per_second: Vec::new(),
            procs: BTreeMap::new(),
            files: Vec::new(),
            by_ino: HashMap::new(),
            streams: HashMap::new(),
            dirs: HashMap::new(),
            dir_names: Vec::new(),
            bursts: HashMap::new(),
            meta_phases: Vec::new(),
            timeline: Sampler {
                every: 1,
                seen: 0,
                points: Vec::new(),
                bin_ns: FIRST_BIN_NS,
                heat: BTreeMap::new(),
            },
        }
    }

    /// Takes one record (in the order the trace holds them).
    pub fn push(&mut self, r: &Record) {
        self.records += 1;
        self.seq += 1;
        self.held
            .push(Reverse(Held(r.start_ns, self.seq, r.clone())));
        if self.held.len() > self.limits.reorder {
            if let Some(Reverse(Held(_, _, next))) = self.held.pop() {
                self.take(&next);
            }
        }
        if self.records.is_multiple_of(SWEEP_EVERY) {
            self.sweep_bursts(false);
        }
    }

    /// Records the tracer lost: the model says how many it misses.
    pub fn gap(&mut self, g: &Gap) {
        self.dropped += g.dropped;
    }

    /// The model of everything pushed.
    pub fn finish(mut self, source: Source) -> Model {
        while let Some(Reverse(Held(_, _, r))) = self.held.pop() {
            self.take(&r);
        }
        self.sweep_bursts(true);
        let keys: Vec<_> = self.streams.keys().copied().collect();
        for key in keys {
            self.close_stream(key);
        }
        if let Some((s, e)) = self.busy.take() {
            self.app.busy_ns += e - s;
        }
        let first = self.first_ns.unwrap_or(0);
        self.app.wall_ns = self.last_ns.saturating_sub(first);
        let meta = &mut self.app.metadata;
        let total = meta.creates
            + meta.mkdirs
            + meta.stats
            + meta.opens
            + meta.unlinks
            + meta.renames
            + meta.listings;
        meta.per_second = if self.app.wall_ns == 0 {
            0.0
        } else {
            total as f64 / (self.app.wall_ns as f64 / 1e9)
        };
        meta.peak_per_second = self.per_second.iter().copied().max().unwrap_or(0).into();

        let (phases, files) = phases_and_files(std::mem::take(&mut self.files));
        self.app.files = files.len() as u32;
        let processes: Vec<Process> = self.procs.into_values().collect();
        self.app.processes = processes.len() as u32;
        let mut meta_phases = self.meta_phases;
        meta_phases.sort_by_key(|m| (m.start_ns, m.end_ns));
        for (i, m) in meta_phases.iter_mut().enumerate() {
            m.id = i as u32;
        }
        let timeline = Timeline {
            sampled_every: self.timeline.every,
            points: self.timeline.points,
            bin_ns: self.timeline.bin_ns,
            heat: (self.timeline.heat.into_iter())
                .map(|(pid, bytes)| HeatRow { pid, bytes })
                .collect(),
        };
        let mut model = Model {
            schema: SCHEMA.into(),
            source: Source {
                records: self.records,
                dropped: self.dropped + source.dropped,
                ..source
            },
            application: self.app,
            processes,
            files,
            phases,
            meta_phases,
            timeline,
            findings: Vec::new(),
        };
        model.findings = crate::findings::findings(&model);
        model
    }

    /// One record, in order of start.
    fn take(&mut self, r: &Record) {
        let first = *self.first_ns.get_or_insert(r.start_ns);
        self.last_ns = self.last_ns.max(r.end_ns);
        let dur = r.duration_ns();
        self.busy = match self.busy {
            Some((s, e)) if r.start_ns <= e => Some((s, e.max(r.end_ns))),
            Some((s, e)) => {
                self.app.busy_ns += e - s;
                Some((r.start_ns, r.end_ns))
            }
            None => Some((r.start_ns, r.end_ns)),
        };
        *self.app.ops.entry(r.op.name().to_string()).or_default() += 1;
        self.app.io_time_ns += dur;
        let proc = self.procs.entry(r.pid).or_insert_with(|| Process {
            pid: r.pid,
            exe: None,
            ops: 0,
            bytes_read: 0,
            bytes_written: 0,
            io_time_ns: 0,
            first_ns: r.start_ns,
            last_ns: r.end_ns,
        });
        if proc.exe.is_none() {
            proc.exe = r.exe.as_deref().map(str::to_string);
        }
        proc.ops += 1;
        proc.io_time_ns += dur;
        // The process's time outside I/O before this request: records come by start, so none
        // of its earlier requests ends later unseen.
        let idle = r.start_ns.saturating_sub(proc.last_ns);
        proc.last_ns = proc.last_ns.max(r.end_ns);
        if r.result < 0 {
            self.app.errors += 1;
            return;
        }
        let data = match r.op {
            Op::Read => Some(DataOp::Read),
            Op::Write => Some(DataOp::Write),
            _ => None,
        };
        let Some(op) = data else {
            self.metadata(r, first);
            return;
        };
        let bytes = r.result.unsigned_abs();
        match op {
            DataOp::Read => {
                self.app.reads += 1;
                self.app.bytes_read += bytes;
                proc.bytes_read += bytes;
            }
            DataOp::Write => {
                self.app.writes += 1;
                self.app.bytes_written += bytes;
                proc.bytes_written += bytes;
            }
        }
        let file = self.file(r.ino, r.path.as_ref());
        let f = &mut self.files[file as usize];
        f.touched = true;
        f.io_time_ns += dur;
        f.first_ns = f.first_ns.min(r.start_ns);
        f.last_ns = f.last_ns.max(r.end_ns);
        let who = match op {
            DataOp::Read => {
                f.reads += 1;
                f.bytes_read += bytes;
                &mut f.readers
            }
            DataOp::Write => {
                f.writes += 1;
                f.bytes_written += bytes;
                f.size = f.size.max(r.offset.saturating_add(bytes));
                &mut f.writers
            }
        };
        if !who.contains(&r.pid) {
            who.push(r.pid);
        }
        if op == DataOp::Read {
            f.size = f.size.max(r.offset.saturating_add(bytes));
        }
        self.timeline.take(r, file, op, bytes, &self.limits);
        self.request(file, op, r, bytes, idle);
    }

    fn file(&mut self, ino: u64, path: Option<&Arc<str>>) -> u32 {
        let next = self.files.len() as u32;
        let id = *self.by_ino.entry(ino).or_insert(next);
        if id == next {
            self.files.push(FileState {
                ino,
                path: None,
                size: 0,
                created: false,
                touched: false,
                readers: Vec::new(),
                writers: Vec::new(),
                bytes_read: 0,
                bytes_written: 0,
                reads: 0,
                writes: 0,
                io_time_ns: 0,
                first_ns: u64::MAX,
                last_ns: 0,
                runs: Vec::new(),
            });
        }
        if let Some(p) = path {
            let f = &mut self.files[id as usize];
            if f.path.as_ref() != Some(p) {
                f.path = Some(p.clone());
            }
        }
        id
    }

    /// A read or write of `bytes` at the record's offset: extends its stream's run or ends it.
    fn request(&mut self, file: u32, op: DataOp, r: &Record, bytes: u64, idle: u64) {
        let key = (file, r.pid, op);
        let stream = self.streams.entry(key).or_default();
        if let Some(run) = stream.open.as_mut() {
            if run.extends(r) {
                run.add(r, bytes, self.limits.sizes, idle);
                return;
            }
        }
        if let Some(done) = stream.open.take() {
            self.close_run(key, done);
        }
        let run = Run::new(r, op, bytes, idle);
        if let Some(s) = self.streams.get_mut(&key) {
            s.open = Some(run);
        }
    }

    /// Files a finished run: a short one joins its stream's shapeless run; a shaped one ends
    /// that first, then repeats the run before it or is kept as a new one.
    fn close_run(&mut self, key: (u32, u32, DataOp), run: Run) {
        let sizes = self.limits.sizes;
        let Some(stream) = self.streams.get_mut(&key) else {
            return;
        };
        if run.ops <= SHAPELESS {
            match stream.shapeless.as_mut() {
                Some(s) => s.absorb(&run, sizes),
                None => stream.shapeless = Some(run),
            }
            return;
        }
        if let Some(s) = stream.shapeless.take() {
            self.keep(key, s);
        }
        self.keep(key, run);
    }

    /// Keeps a run in its file: a repetition of the stream's last run, else a new run (folded
    /// into the file's last one of its kind past the limit).
    fn keep(&mut self, key: (u32, u32, DataOp), mut run: Run) {
        let (limit, sizes) = (self.limits.runs_per_file, self.limits.sizes);
        let f = &mut self.files[key.0 as usize];
        let Some(stream) = self.streams.get_mut(&key) else {
            return;
        };
        by_count(&mut run.sizes);
        if run.access != AccessMode::Random {
            run.access = if run.contiguous {
                AccessMode::Sequential
            } else {
                AccessMode::Strided
            };
        }
        if let Some(last) = stream.last.and_then(|i| f.runs.get_mut(i)) {
            if last.repeated_by(&run) {
                last.repeat(&run);
                return;
            }
        }
        if f.runs.len() >= limit {
            let same = f
                .runs
                .iter()
                .rposition(|o| o.op == run.op && o.pid == run.pid);
            if let Some(o) = same.or(f.runs.len().checked_sub(1)) {
                f.runs[o].absorb(&run, sizes);
                stream.last = None;
                return;
            }
        }
        f.runs.push(run);
        stream.last = Some(f.runs.len() - 1);
    }

    /// Keeps what a stream holds at the end: its open run joins the shapeless ones if short.
    fn close_stream(&mut self, key: (u32, u32, DataOp)) {
        if let Some(run) = self.streams.get_mut(&key).and_then(|s| s.open.take()) {
            self.close_run(key, run);
        }
        if let Some(s) = self.streams.get_mut(&key).and_then(|s| s.shapeless.take()) {
            self.keep(key, s);
        }
    }

    fn metadata(&mut self, r: &Record, first: u64) {
        let kind = match r.op {
            Op::Create | Op::Mknod => MetaKind::Create,
            Op::Mkdir => MetaKind::Mkdir,
            Op::Lookup | Op::Getattr => MetaKind::Stat,
            Op::Open => MetaKind::Open,
            Op::Unlink => MetaKind::Unlink,
            Op::Rmdir => MetaKind::Rmdir,
            Op::Rename => MetaKind::Rename,
            Op::Readdir | Op::Readdirplus => MetaKind::List,
            Op::Truncate => {
                if r.ino != 0 {
                    let f = self.file(r.ino, r.path.as_ref());
                    let f = &mut self.files[f as usize];
                    f.size = r.offset;
                    f.created |= r.offset == 0 && !f.touched;
                }
                return;
            }
            _ => return,
        };
        // A listing is one operation however many requests it takes: a readdir past offset 0
        // goes on with the one before it (its time counts, not as another listing).
        if kind == MetaKind::List && r.offset != 0 {
            self.app.metadata.time_ns += r.duration_ns();
            let key = (self.dir(r), kind);
            if let Some(b) = self.bursts.get_mut(&key) {
                b.end_ns = b.end_ns.max(r.end_ns);
                b.io_time_ns += r.duration_ns();
            }
            return;
        }
        let m = &mut self.app.metadata;
        match kind {
            MetaKind::Create => m.creates += 1,
            MetaKind::Mkdir => m.mkdirs += 1,
            MetaKind::Stat => m.stats += 1,
            MetaKind::Open => m.opens += 1,
            MetaKind::Unlink | MetaKind::Rmdir => m.unlinks += 1,
            MetaKind::Rename => m.renames += 1,
            MetaKind::List => m.listings += 1,
        }
        m.time_ns += r.duration_ns();
        let second = ((r.start_ns - first) / 1_000_000_000) as usize;
        if self.per_second.len() <= second {
            self.per_second.resize(second + 1, 0);
        }
        self.per_second[second] += 1;
        let truncating = kind == MetaKind::Open && r.flags & libc_o_trunc() != 0;
        if (kind == MetaKind::Create || truncating) && r.ino != 0 {
            let f = self.file(r.ino, r.path.as_ref());
            let f = &mut self.files[f as usize];
            f.created |= !f.touched;
            if truncating {
                f.size = 0;
            }
        }
        let dir = self.dir(r);
        let pause = self.limits.meta_pause_ns;
        let key = (dir, kind);
        if let Some(b) = self.bursts.get_mut(&key) {
            if r.start_ns <= b.end_ns.saturating_add(pause) {
                b.ops += 1;
                b.end_ns = b.end_ns.max(r.end_ns);
                b.io_time_ns += r.duration_ns();
                if !b.processes.contains(&r.pid) {
                    b.processes.push(r.pid);
                }
                return;
            }
            if let Some(done) = self.bursts.remove(&key) {
                self.end_burst(key, done);
            }
        }
        self.bursts.insert(
            key,
            Burst {
                processes: vec![r.pid],
                ops: 1,
                start_ns: r.start_ns,
                end_ns: r.end_ns,
                io_time_ns: r.duration_ns(),
            },
        );
    }

    /// The directory a metadata operation is in (its path's parent), by number.
    fn dir(&mut self, r: &Record) -> u32 {
        let dir = match r.path.as_deref() {
            Some(p) => p.rfind('/').map_or("", |i| &p[..i]),
            None => "?",
        };
        if let Some(&d) = self.dirs.get(dir) {
            return d;
        }
        let d = self.dir_names.len() as u32;
        self.dirs.insert(dir.into(), d);
        self.dir_names.push(dir.into());
        d
    }

    /// Ends the bursts that have paused (all of them at the `end`).
    fn sweep_bursts(&mut self, end: bool) {
        let now = self.last_ns;
        let pause = self.limits.meta_pause_ns;
        let done: Vec<_> = (self.bursts.iter())
            .filter(|(_, b)| end || b.end_ns.saturating_add(pause) < now)
            .map(|(k, _)| *k)
            .collect();
        for key in done {
            if let Some(b) = self.bursts.remove(&key) {
                self.end_burst(key, b);
            }
        }
    }

    fn end_burst(&mut self, (dir, kind): (u32, MetaKind), b: Burst) {
        if b.ops < self.limits.meta_min_ops {
            return;
        }
        let mut processes = b.processes;
        processes.sort_unstable();
        self.meta_phases.push(MetaPhase {
            id: 0,
            kind,
            dir: self.dir_names[dir as usize].to_string(),
            processes,
            ops: b.ops,
            start_ns: b.start_ns,
            end_ns: b.end_ns,
            io_time_ns: b.io_time_ns,
        });
    }
}

/// O_TRUNC on Linux (every architecture Tessera runs on).
const fn libc_o_trunc() -> u32 {
    0o1000
}
