//! Runs a plan: prepares the directory untimed, then a thread per process goes through its
//! parts of the phases, each part once the phases it waits for are done.

use crate::plan::{MetaOp, Part, Plan, Proc, Requests, Task};
use crate::think::{Gaps, Pace};
use crate::{Error, Measure, Options, PhaseKind, PhaseResult, Report, Think};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tessera_model::{AccessMode, DataOp, MetaKind, Model};
use tessera_trace::{Event, Mode, Op, Writer};

/// Replays `model` in `dir` (which must exist and be writable): [`prepare`], then
/// [`Prepared::run`].
pub fn replay(model: &Model, dir: &Path, opts: &Options) -> Result<Report, Error> {
    prepare(model, dir)?.run(opts)
}

/// A replay whose directory is prepared: what happens between this and the timed phases
/// (dropping caches, starting a mount's trace) is the caller's.
pub struct Prepared<'a> {
    model: &'a Model,
    plan: Plan,
    dir: PathBuf,
    prepared_bytes: u64,
}

/// Checks `dir` and makes what the replay of `model` needs there, untimed: files that existed
/// before the trace, with their size.
pub fn prepare<'a>(model: &'a Model, dir: &Path) -> Result<Prepared<'a>, Error> {
    let meta = std::fs::metadata(dir).map_err(|source| Error::Dir {
        path: dir.into(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(Error::NotDir(dir.into()));
    }
    let probe = dir.join(format!(".tessera-replay-{}", std::process::id()));
    File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|source| Error::NotWritable {
            path: dir.into(),
            source,
        })?;
    let plan = Plan::new(model)?;
    let prepared_bytes = prepare_dir(dir, &plan)?;
    Ok(Prepared {
        model,
        plan,
        dir: dir.to_path_buf(),
        prepared_bytes,
    })
}

impl Prepared<'_> {
    /// Runs the phases and measures them.
    pub fn run(&self, opts: &Options) -> Result<Report, Error> {
        let (model, plan, dir) = (self.model, &self.plan, self.dir.as_path());
        if opts.think.is_some() {
            // A wait comes from the model file: one longer than the whole traced run is not a
            // program's, and waiting it would hang the replay.
            let wall = model.application.wall_ns;
            if let Some(p) = model.phases.iter().find(|p| Gaps::longest_ns(p) > wall) {
                return Err(Error::Model(format!(
                    "phase {}: {} ns between requests, longer than the application's {wall} ns",
                    p.id,
                    Gaps::longest_ns(p)
                )));
            }
        }
        let (trace_path, writer) = match &opts.trace {
            Some(d) => {
                let io = |source| Error::Trace {
                    path: d.clone(),
                    source,
                };
                std::fs::create_dir_all(d).map_err(io)?;
                let source = format!("replay {}", dir.display());
                let opts = tessera_trace::Options::default();
                let (path, w) = Writer::create_in(d, source, Mode::Library, &opts).map_err(io)?;
                (Some(path), Some(w))
            }
            None => (None, None),
        };
        let mut sched = Sched {
            left: plan.np.clone(),
            started: vec![0; plan.tasks.len()],
            done: vec![false; plan.tasks.len()],
            prefix: 0,
            measures: vec![Span::default(); plan.tasks.len()],
            error: None,
        };
        // A phase without processes (a hand-made model) is done before it starts.
        for task in (0..plan.tasks.len()).filter(|&t| plan.np[t] == 0) {
            sched.complete(task, &plan.by_end);
        }
        let run = Run {
            model,
            plan,
            dir,
            think: opts.think,
            seed: opts.seed,
            // SAFETY: getuid cannot fail.
            uid: unsafe { libc::getuid() },
            base: Instant::now(),
            writer: writer.as_ref(),
            sched: Mutex::new(sched),
            changed: Condvar::new(),
            failed: AtomicBool::new(false),
        };
        std::thread::scope(|s| {
            let mut started = Vec::new();
            for p in &plan.procs {
                let spawned = std::thread::Builder::new()
                    .name(format!("replay-{}", p.pid))
                    .spawn_scoped(s, || run.process(p));
                match spawned {
                    Ok(h) => started.push(h),
                    Err(e) => {
                        run.fail(Error::Thread(e));
                        break;
                    }
                }
            }
            for h in started {
                if h.join().is_err() {
                    run.fail(Error::Model("a replay thread failed".into()));
                }
            }
        });
        let sched = run
            .sched
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = writer {
            w.finish();
        }
        if let Some(e) = sched.error {
            return Err(e);
        }
        Ok(report(
            model,
            plan,
            dir,
            opts,
            self.prepared_bytes,
            &sched.measures,
            trace_path,
        ))
    }
}

/// Makes what the replay needs before timing starts; the bytes written.
fn prepare_dir(dir: &Path, plan: &Plan) -> Result<u64, Error> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { what, path, source }
    };
    let pre = &plan.prepare;
    for d in &pre.dirs {
        let d = dir.join(d);
        std::fs::create_dir_all(&d).map_err(io("creating directory", &d))?;
    }
    for p in &pre.remove {
        let p = dir.join(p);
        if std::fs::remove_file(&p).is_err() {
            let _ = std::fs::remove_dir(&p);
        }
    }
    let mut written = 0;
    let chunk = vec![0x5au8; 1 << 20];
    for (p, size) in &pre.files {
        let p = dir.join(p);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(io("preparing", &p))?;
        let len = f.metadata().map_err(io("preparing", &p))?.len();
        if len > *size {
            f.set_len(*size).map_err(io("preparing", &p))?;
        }
        let mut at = len;
        while at < *size {
            let n = (*size - at).min(chunk.len() as u64) as usize;
            f.write_all_at(&chunk[..n], at)
                .map_err(io("preparing", &p))?;
            at += n as u64;
            written += n as u64;
        }
    }
    for p in &pre.spare_files {
        let p = dir.join(p);
        File::create(&p).map_err(io("preparing", &p))?;
    }
    for p in &pre.spare_dirs {
        let p = dir.join(p);
        match std::fs::create_dir(&p) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                return Err(io("preparing", &p)(e));
            }
            _ => {}
        }
    }
    Ok(written)
}

/// A task's measure as its parts end.
#[derive(Debug, Clone, Default)]
struct Span {
    bytes: u64,
    ops: u64,
    errors: u64,
    io_ns: u64,
    first: Option<u64>,
    last: u64,
}

impl Span {
    fn add(&mut self, o: &Span) {
        self.bytes += o.bytes;
        self.ops += o.ops;
        self.errors += o.errors;
        self.io_ns += o.io_ns;
        self.first = match (self.first, o.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last = self.last.max(o.last);
    }

    fn op(&mut self, start: u64, end: u64, bytes: u64) {
        self.ops += 1;
        self.bytes += bytes;
        self.io_ns += end.saturating_sub(start);
        self.first.get_or_insert(start);
        self.last = self.last.max(end);
    }

    fn measure(&self) -> Measure {
        Measure {
            bytes: self.bytes,
            ops: self.ops,
            errors: self.errors,
            io_time_ns: self.io_ns,
            wall_ns: self.last.saturating_sub(self.first.unwrap_or(self.last)),
            bytes_per_s: 0.0,
            ops_per_s: 0.0,
        }
        .rates()
    }
}

impl Sched {
    fn complete(&mut self, task: usize, by_end: &[usize]) {
        self.done[task] = true;
        while self.prefix < by_end.len() && self.done[by_end[self.prefix]] {
            self.prefix += 1;
        }
    }
}

struct Sched {
    /// Processes yet to finish each task, and that have started it.
    left: Vec<usize>,
    started: Vec<usize>,
    done: Vec<bool>,
    /// Tasks done at the head of the plan's end order.
    prefix: usize,
    measures: Vec<Span>,
    error: Option<Error>,
}

/// Spends the time until `until` as `think` says.
fn spend(think: Think, until: Instant) {
    match think {
        Think::Sleep => std::thread::sleep(until.saturating_duration_since(Instant::now())),
        Think::Burn => {
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        }
    }
}

struct Run<'a> {
    model: &'a Model,
    plan: &'a Plan,
    dir: &'a Path,
    think: Option<Think>,
    seed: u64,
    uid: u32,
    base: Instant,
    writer: Option<&'a Writer>,
    sched: Mutex<Sched>,
    changed: Condvar,
    failed: AtomicBool,
}

/// A process's part stopped: by its own error, or because another's stopped the replay.
struct Stopped;

impl Run<'_> {
    fn lock(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        match self.writer {
            Some(w) => w.now(),
            None => u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Stops the replay with `e` (the first error is the one reported).
    fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        let mut s = self.lock();
        s.error.get_or_insert(e);
        drop(s);
        self.changed.notify_all();
    }

    fn process(&self, proc: &Proc) {
        let pid = proc.pid;
        let exe = self
            .model
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.exe.clone());
        let mut me = Me {
            pid,
            exe: exe.as_deref().map(str::as_bytes),
            buf: Vec::new(),
            open: HashMap::new(),
            stated: HashSet::new(),
        };
        for (k, part) in proc.parts.iter().enumerate() {
            if self.wait(part.task).is_err() {
                return;
            }
            if let Some(prev) = self.plan.pause_after[part.task] {
                // A little past the pause, so that no clock's rounding joins the bursts.
                let until = self.lock().measures[prev].last + self.plan.pause_ns + 10_000_000;
                let now = self.now();
                std::thread::sleep(Duration::from_nanos(until.saturating_sub(now)));
            }
            let mut span = Span::default();
            let done = match &self.plan.tasks[part.task] {
                Task::Data(i) => {
                    let file = self.model.phases[*i].file;
                    let done = self.data(&mut me, proc, *i, *part, &mut span);
                    if proc.files.get(&file).is_some_and(|u| u.last == k) {
                        me.open.remove(&file);
                    }
                    done
                }
                Task::Meta(i, ops) => {
                    let ops = Plan::share(ops, part.slot, self.plan.np[part.task]);
                    self.meta(&mut me, *i, ops, &mut span)
                }
            };
            match done {
                Ok(()) => self.finish(part.task, &span),
                Err(Stopped) => return,
            }
        }
    }

    /// Waits until the tasks `task` waits for are done.
    fn wait(&self, task: usize) -> Result<(), Stopped> {
        let need = self.plan.after[task];
        let mut s = self.lock();
        while s.prefix < need && s.error.is_none() {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.error.is_some() {
            return Err(Stopped);
        }
        Ok(())
    }

    fn started(&self, task: usize) {
        let mut s = self.lock();
        s.started[task] += 1;
        if s.started[task] == self.plan.np[task] {
            drop(s);
            self.changed.notify_all();
        }
    }

    fn all_started(&self, task: usize) -> Result<(), Stopped> {
        let mut s = self.lock();
        while s.started[task] < self.plan.np[task] && s.error.is_none() {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if s.error.is_some() {
            return Err(Stopped);
        }
        Ok(())
    }

    fn finish(&self, task: usize, span: &Span) {
        let mut s = self.lock();
        s.measures[task].add(span);
        s.left[task] = s.left[task].saturating_sub(1);
        if s.left[task] == 0 {
            s.complete(task, &self.plan.by_end);
            drop(s);
            self.changed.notify_all();
        }
    }

    fn record(&self, me: &Me, e: Event<'_>) {
        if let Some(w) = self.writer {
            w.push(&Event {
                pid: me.pid,
                uid: self.uid,
                exe: me.exe,
                mode: Mode::Library,
                ..e
            });
        }
    }

    /// A process's part of data phase `i`. Its processes ran it at once in the trace: none
    /// makes its last request before every other has made its first.
    fn data(
        &self,
        me: &mut Me,
        proc: &Proc,
        i: usize,
        part: Part,
        span: &mut Span,
    ) -> Result<(), Stopped> {
        let phase = &self.model.phases[i];
        let rel = &self.plan.file_paths[phase.file as usize];
        let path = self.dir.join(rel);
        let stop = |what, e| {
            self.fail(Error::Io {
                what,
                path: path.clone(),
                source: e,
            });
            Stopped
        };
        let traced = format!("/{}", rel.display());
        if let Entry::Vacant(v) = me.open.entry(phase.file) {
            let (read, write) = proc
                .files
                .get(&phase.file)
                .map_or((true, false), |u| (u.read, u.write));
            let start = self.now();
            let file = OpenOptions::new()
                .read(read)
                .write(write)
                .create(write)
                .truncate(false)
                .open(&path)
                .map_err(|e| stop("opening", e))?;
            let end = self.now();
            let ino = file.metadata().map_or(0, |m| m.ino());
            v.insert((file, ino));
            // One of the trace's opens, which the plan took off its opens phases.
            if self.plan.carried_opens.contains(&(me.pid, phase.file)) {
                self.record(
                    me,
                    Event {
                        ino,
                        path: Some(traced.as_bytes()),
                        start_ns: start,
                        end_ns: end,
                        ..Event::new(Op::Open)
                    },
                );
            }
        }
        let Some((file, ino)) = me.open.get(&phase.file) else {
            return Err(Stopped);
        };
        let (file, ino) = (file, *ino);
        let (what, op) = match phase.op {
            DataOp::Read => ("reading", Op::Read),
            DataOp::Write => ("writing", Op::Write),
        };
        let mut gaps = Gaps::new(phase, part.slot);
        let mut pace = Pace::new(phase);
        let mut returned: Option<Instant> = None;
        let requests = Requests::new(phase, part.slot, self.seed);
        let count = requests.len();
        for (k, (offset, size)) in requests.enumerate() {
            if self.failed.load(Ordering::Relaxed) {
                return Err(Stopped);
            }
            if let Some(think) = self.think {
                // Counted from the last request's return: the replay's own work between
                // requests is part of the wait.
                let want = gaps.next_ns();
                let from = returned.unwrap_or_else(Instant::now);
                spend(think, from + Duration::from_nanos(pace.wait_ns(want)));
                pace.waited(
                    want,
                    u64::try_from(from.elapsed().as_nanos()).unwrap_or(u64::MAX),
                );
            }
            let n = usize::try_from(size).map_err(|_| {
                self.fail(Error::Model(format!(
                    "phase {}: a request of {size} bytes",
                    phase.id
                )));
                Stopped
            })?;
            if me.buf.len() < n {
                // A model's size is not to be trusted with the whole memory.
                if me.buf.try_reserve_exact(n - me.buf.len()).is_err() {
                    self.fail(Error::Model(format!(
                        "phase {}: no memory for a request of {size} bytes",
                        phase.id
                    )));
                    return Err(Stopped);
                }
                me.buf.resize(n, 0xa5);
            }
            // A part's last request waits until every process of the phase has made its first,
            // so that their runs overlap in time as in the original, however late a thread
            // starts (the profiler joins runs of one shape that overlap into one phase). A part
            // of one request counts itself first: it waits for the others' starts too.
            if k == 0 && count == 1 {
                self.started(part.task);
            }
            if k + 1 == count {
                self.all_started(part.task)?;
            }
            let start = self.now();
            let done = match phase.op {
                DataOp::Read => file.read_at(&mut me.buf[..n], offset),
                DataOp::Write => file.write_at(&me.buf[..n], offset),
            };
            let end = self.now();
            if self.think.is_some() {
                returned = Some(Instant::now());
                pace.request(end.saturating_sub(start));
            }
            if k == 0 && count > 1 {
                self.started(part.task);
            }
            let got = done.map_err(|e| stop(what, e))? as u64;
            span.op(start, end, got);
            self.record(
                me,
                Event {
                    ino,
                    path: Some(traced.as_bytes()),
                    offset,
                    size,
                    start_ns: start,
                    end_ns: end,
                    result: i64::try_from(got).unwrap_or(i64::MAX),
                    ..Event::new(op)
                },
            );
        }
        Ok(())
    }

    /// Operations of metadata phase `i`.
    fn meta(&self, me: &mut Me, i: usize, ops: &[MetaOp], span: &mut Span) -> Result<(), Stopped> {
        let kind = self.model.meta_phases[i].kind;
        for o in ops {
            if self.failed.load(Ordering::Relaxed) {
                return Err(Stopped);
            }
            let rel = self.plan.name_path(i, o.name);
            let to = o.to.map(|t| self.plan.name_path(i, t));
            let path = self.dir.join(&rel);
            let start = self.now();
            // A name stated again is asked of the file system, not of the kernel's caches, as
            // a program's fstat after an open or a stat after a change reaches it.
            let again = kind == MetaKind::Stat && !me.stated.insert(path.clone());
            let (op, done) = if again {
                (Op::Getattr, stat_synced(&path).map(|()| (0, 0)))
            } else {
                meta_op(kind, &path, to.as_ref().map(|t| self.dir.join(t)))
            };
            let end = self.now();
            let mut ino = 0;
            let result = match done {
                Ok((n, made)) => {
                    span.op(start, end, 0);
                    ino = made;
                    i64::try_from(n).unwrap_or(i64::MAX)
                }
                // What concurrent phases or an odd model can cause: counted, not fatal.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::NotFound
                            | ErrorKind::AlreadyExists
                            | ErrorKind::DirectoryNotEmpty
                    ) =>
                {
                    span.op(start, end, 0);
                    span.errors += 1;
                    -i64::from(e.raw_os_error().unwrap_or(libc::EIO))
                }
                Err(e) => {
                    self.fail(Error::Io {
                        what: op.name(),
                        path,
                        source: e,
                    });
                    return Err(Stopped);
                }
            };
            let traced = format!("/{}", rel.display());
            let target = to.map(|t| format!("/{}", t.display()));
            self.record(
                me,
                Event {
                    ino,
                    path: Some(traced.as_bytes()),
                    target: target.as_deref().map(str::as_bytes),
                    start_ns: start,
                    end_ns: end,
                    result,
                    ..Event::new(op)
                },
            );
        }
        Ok(())
    }
}

/// A replay thread's own: the process it stands for, its buffer and the files it has open
/// (by model file id, with their inode).
struct Me<'a> {
    pid: u32,
    exe: Option<&'a [u8]>,
    buf: Vec<u8>,
    open: HashMap<u32, (File, u64)>,
    /// Names this process has stated.
    stated: HashSet<PathBuf>,
}

/// `lstat` that the kernel passes on to the file system whatever it has cached.
fn stat_synced(path: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(ErrorKind::InvalidInput))?;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a NUL-terminated path and a buffer the size statx fills.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS,
            buf.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One metadata operation on `path`: the trace's operation for it, and its result (entries
/// for a listing) and the inode a create made.
fn meta_op(kind: MetaKind, path: &Path, to: Option<PathBuf>) -> (Op, std::io::Result<(u64, u64)>) {
    let (op, done) = match kind {
        MetaKind::Create => {
            let made = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
                .and_then(|f| f.metadata());
            return (Op::Create, made.map(|m| (0, m.ino())));
        }
        MetaKind::Mkdir => (Op::Mkdir, std::fs::create_dir(path).map(|()| 0)),
        MetaKind::Stat => (Op::Getattr, std::fs::symlink_metadata(path).map(|_| 0)),
        MetaKind::Open => (Op::Open, File::open(path).map(|_| 0)),
        MetaKind::Unlink => (Op::Unlink, std::fs::remove_file(path).map(|()| 0)),
        MetaKind::Rmdir => (Op::Rmdir, std::fs::remove_dir(path).map(|()| 0)),
        MetaKind::Rename => (
            Op::Rename,
            match to {
                Some(to) => std::fs::rename(path, to).map(|()| 0),
                None => Err(ErrorKind::InvalidInput.into()),
            },
        ),
        MetaKind::List => (
            Op::Readdir,
            std::fs::read_dir(path).and_then(|d| {
                d.map(|e| e.map(|_| ()))
                    .collect::<std::io::Result<Vec<()>>>()
                    .map(|v| v.len() as u64)
            }),
        ),
    };
    (op, done.map(|n| (n, 0)))
}

fn report(
    model: &Model,
    plan: &Plan,
    dir: &Path,
    opts: &Options,
    prepared_bytes: u64,
    spans: &[Span],
    trace: Option<PathBuf>,
) -> Report {
    let mut total = Span::default();
    let mut phases = Vec::with_capacity(spans.len());
    for ((task, span), np) in plan.tasks.iter().zip(spans).zip(&plan.np) {
        total.add(span);
        let (kind, id, what, start_ns) = match task {
            Task::Data(i) => {
                let p = &model.phases[*i];
                let access = match p.access {
                    AccessMode::Sequential => "sequential",
                    AccessMode::Strided => "strided",
                    AccessMode::Random => "random",
                };
                let op = match p.op {
                    DataOp::Read => "read",
                    DataOp::Write => "write",
                };
                let what = format!(
                    "{op} /{} {access}",
                    plan.file_paths[p.file as usize].display()
                );
                (PhaseKind::Data, p.id, what, p.start_ns)
            }
            Task::Meta(i, _) => {
                let p = &model.meta_phases[*i];
                let what = format!(
                    "{} in /{}",
                    tessera_model::export::meta_name(p.kind),
                    plan.meta_dirs[*i].display()
                );
                (PhaseKind::Meta, p.id, what, p.start_ns)
            }
        };
        phases.push(PhaseResult {
            kind,
            id,
            what,
            processes: *np as u32,
            start_ns,
            measure: span.measure(),
        });
    }
    Report {
        model: model.source.trace.clone(),
        dir: dir.to_path_buf(),
        think: opts.think,
        processes: plan.procs.len() as u32,
        prepared_bytes,
        phases,
        total: total.measure(),
        trace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_counts_entries() {
        let d = tempfile::tempdir().expect("a directory");
        std::fs::write(d.path().join("a"), b"").expect("a file");
        std::fs::create_dir(d.path().join("b")).expect("a directory");
        let (op, n) = meta_op(MetaKind::List, d.path(), None);
        assert_eq!((op, n.ok()), (Op::Readdir, Some((2, 0))));
    }
}
