//! What a replay will do, worked out before anything runs (pure): the order phases wait in,
//! each process's part of each phase, the requests of a data phase, the names a metadata phase
//! works on, and what must be prepared first.

use crate::Error;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Component, Path, PathBuf};
use tessera_model::{AccessMode, DataOp, MetaKind, Model, Phase};

/// A phase of either kind, in the order phases start.
#[derive(Debug)]
pub(crate) enum Task {
    Data(usize),
    /// A metadata phase and its operations, all processes' in turn.
    Meta(usize, Vec<MetaOp>),
}

/// A name a metadata operation works on, in its phase's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Name {
    /// A file of the model.
    File(u32),
    /// Made by metadata phase `.0`, its `.1`th name.
    New(u32, u64),
    /// Made before timing starts, for operations on names the replay has not made.
    Spare(u64),
    SpareDir(u64),
    /// A directory that listings list: a profiler files a listing under the listed
    /// directory's parent, so the model's directories in the phase's directory in turn (as a
    /// tree walk lists them), else an empty one made there (an index in
    /// [`Plan::list_dirs`]).
    ListDir(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetaOp {
    pub name: Name,
    /// A rename's new name.
    pub to: Option<Name>,
}

/// One process's part of a task: the task, and the process's index among the phase's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Part {
    pub task: usize,
    pub slot: usize,
}

#[derive(Debug)]
pub(crate) struct Proc {
    pub pid: u32,
    pub parts: Vec<Part>,
    /// The model files this process reads or writes: opened once, when first needed (for
    /// writing too if it writes them), and closed after its last part on them, as a program
    /// keeps a file open across its phases rather than opening it for each.
    pub files: HashMap<u32, FileUse>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileUse {
    pub read: bool,
    pub write: bool,
    /// The index in `parts` of the last part on the file.
    pub last: usize,
}

/// What is made before timing starts (paths relative to the replay directory).
#[derive(Debug, Default)]
pub(crate) struct Prepare {
    pub dirs: BTreeSet<PathBuf>,
    /// Files that existed before the trace, and their size.
    pub files: Vec<(PathBuf, u64)>,
    /// What an earlier replay may have left where this one makes names.
    pub remove: Vec<PathBuf>,
    pub spare_files: Vec<PathBuf>,
    pub spare_dirs: Vec<PathBuf>,
}

#[derive(Debug)]
pub(crate) struct Plan {
    pub tasks: Vec<Task>,
    /// The tasks in the order they ended in the trace.
    pub by_end: Vec<usize>,
    /// For each task: how many of `by_end` must be done before it starts (those that ended
    /// before it started in the trace).
    pub after: Vec<usize>,
    /// Processes taking part in each task.
    pub np: Vec<usize>,
    /// For a metadata task: the one before it of its kind in its directory, if the trace
    /// paused between them long enough for a profiler to see two bursts (the replay, without
    /// the application's compute, pauses as long).
    pub pause_after: Vec<Option<usize>>,
    /// The pause that ends a profiler's metadata burst.
    pub pause_ns: u64,
    pub procs: Vec<Proc>,
    pub prepare: Prepare,
    /// Relative paths: each model file's, each metadata phase's directory.
    pub file_paths: Vec<PathBuf>,
    pub meta_dirs: Vec<PathBuf>,
    /// The data phases' opens (process, file) taken off an opens phase: the replay's trace
    /// shows them as opens.
    pub carried_opens: BTreeSet<(u32, u32)>,
    /// The directories listings list ([`Name::ListDir`]).
    pub list_dirs: Vec<PathBuf>,
}

/// A path of the model as a path under the replay directory: only plain components.
pub(crate) fn relative(path: &str) -> Result<PathBuf, Error> {
    let rel = Path::new(path.trim_start_matches('/'));
    if rel
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        Ok(rel.to_path_buf())
    } else {
        Err(Error::Path(path.into()))
    }
}

impl Plan {
    pub(crate) fn new(m: &Model) -> Result<Plan, Error> {
        let file_paths = m
            .files
            .iter()
            .map(|f| relative(&f.path))
            .collect::<Result<Vec<_>, _>>()?;
        let meta_dirs = m
            .meta_phases
            .iter()
            .map(|p| relative(&p.dir))
            .collect::<Result<Vec<_>, _>>()?;
        for p in &m.phases {
            if m.file(p.file).is_none() {
                return Err(Error::Model(format!(
                    "phase {} is of file {}, which the model does not have",
                    p.id, p.file
                )));
            }
        }
        // Tasks by start; data before metadata at the same instant, then by id.
        let mut order: Vec<(u64, u64, u8, usize)> = m
            .phases
            .iter()
            .enumerate()
            .map(|(i, p)| (p.start_ns, p.end_ns.max(p.start_ns), 0, i))
            .chain(
                m.meta_phases
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (p.start_ns, p.end_ns.max(p.start_ns), 1, i)),
            )
            .collect();
        order.sort_unstable();
        let mut by_end: Vec<usize> = (0..order.len()).collect();
        by_end.sort_by_key(|&t| (order[t].1, t));
        let ends: Vec<u64> = by_end.iter().map(|&t| order[t].1).collect();
        // Strictly before: a task that ended as another started need not hold it, and no task
        // waits for one that starts with or after it.
        let after = order
            .iter()
            .map(|o| ends.partition_point(|&e| e < o.0))
            .collect();

        let mut names = Names::new(m, &file_paths, &meta_dirs);
        let mut tasks = Vec::with_capacity(order.len());
        let mut np = Vec::with_capacity(order.len());
        let mut procs: Vec<Proc> = Vec::new();
        let mut index: HashMap<u32, usize> = HashMap::new();
        let mut join = |pid: u32, part: Part, file: Option<(u32, bool)>| {
            let i = *index.entry(pid).or_insert_with(|| {
                procs.push(Proc {
                    pid,
                    parts: Vec::new(),
                    files: HashMap::new(),
                });
                procs.len() - 1
            });
            let p = &mut procs[i];
            p.parts.push(part);
            if let Some((f, write)) = file {
                let last = p.parts.len() - 1;
                let u = p.files.entry(f).or_insert(FileUse {
                    read: !write,
                    write,
                    last,
                });
                u.read |= !write;
                u.write |= write;
                u.last = last;
            }
        };
        for (task, &(_, _, kind, i)) in order.iter().enumerate() {
            if kind == 0 {
                let p = &m.phases[i];
                for slot in 0..p.processes.len() {
                    let file = Some((p.file, p.op == DataOp::Write));
                    join(p.processes[slot].pid, Part { task, slot }, file);
                }
                np.push(p.processes.len());
                tasks.push(Task::Data(i));
            } else {
                let p = &m.meta_phases[i];
                let mut pids = p.processes.clone();
                if pids.is_empty() {
                    pids.push(0);
                }
                for (slot, &pid) in pids.iter().enumerate() {
                    join(pid, Part { task, slot }, None);
                }
                np.push(pids.len());
                tasks.push(Task::Meta(i, names.ops(m, i)));
            }
        }
        let pause = tessera_model::Limits::default().meta_pause_ns;
        let mut pause_after = vec![None; order.len()];
        let mut last: HashMap<(&Path, MetaKind), usize> = HashMap::new();
        for (task, &(start, _, kind, i)) in order.iter().enumerate() {
            if kind == 1 {
                let key = (meta_dirs[i].as_path(), m.meta_phases[i].kind);
                if let Some(prev) = last.insert(key, task) {
                    if order[prev].1.saturating_add(pause) < start {
                        pause_after[task] = Some(prev);
                    }
                }
            }
        }
        let (mut prepare, carried_opens, list_dirs) = names.finish();
        for (f, path) in m.files.iter().zip(&file_paths) {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                prepare.dirs.insert(parent.to_path_buf());
            }
            if f.created {
                prepare.remove.push(path.clone());
            } else if m.phases.iter().any(|p| p.file == f.id) {
                prepare.files.push((path.clone(), f.size));
            }
        }
        for d in &meta_dirs {
            if !d.as_os_str().is_empty() {
                prepare.dirs.insert(d.clone());
            }
        }
        Ok(Plan {
            tasks,
            by_end,
            after,
            np,
            pause_after,
            pause_ns: pause,
            procs,
            prepare,
            file_paths,
            meta_dirs,
            carried_opens,
            list_dirs,
        })
    }

    /// The path (relative) of `name` in metadata phase `meta`'s directory.
    pub(crate) fn name_path(&self, meta: usize, name: Name) -> PathBuf {
        let dir = &self.meta_dirs[meta];
        match name {
            Name::File(id) => self.file_paths[id as usize].clone(),
            Name::New(m, k) => dir.join(format!("replay-{m}-{k}")),
            Name::Spare(n) => dir.join(format!("replay-spare-{n}")),
            Name::SpareDir(n) => dir.join(format!("replay-spare-dir-{n}")),
            Name::ListDir(i) => {
                (self.list_dirs.get(i as usize).cloned()).unwrap_or_else(|| dir.join(LIST_DIR))
            }
        }
    }

    /// The operations of a metadata task that process `slot` of `np` makes: an even share,
    /// in turn.
    pub(crate) fn share(ops: &[MetaOp], slot: usize, np: usize) -> &[MetaOp] {
        let n = ops.len();
        let np = np.max(1);
        &ops[slot * n / np..(slot + 1) * n / np]
    }
}

/// What each directory holds as the metadata phases run, in the order they start: the names
/// each operation works on, and the spares needed where the replay has made too few.
struct Names {
    dirs: BTreeMap<PathBuf, DirState>,
    meta_dirs: Vec<PathBuf>,
    prepare: Prepare,
    carried: BTreeSet<(u32, u32)>,
    /// Each directory's subdirectories that the model's paths name, in order.
    subdirs: BTreeMap<PathBuf, Vec<PathBuf>>,
    list_dirs: Vec<PathBuf>,
    /// Each listed directory's index in `list_dirs`.
    listed: HashMap<PathBuf, u32>,
}

#[derive(Default)]
struct DirState {
    /// Model files there now (not removed by a replay).
    files: Vec<Name>,
    /// Model files made in the trace and not made yet, by first use.
    to_make: VecDeque<Name>,
    /// Names the replay made or prepared, which it may remove or rename.
    made: VecDeque<Name>,
    subdirs: VecDeque<Name>,
    spares: u64,
    spare_dirs: u64,
    /// Stats and opens go round what is there.
    next_look: usize,
    /// Opens of the trace that the data phases make (a process opens each of its files
    /// once: process, file, by first use), still to be taken off the opens phases here.
    carried_opens: VecDeque<(u32, u32)>,
    /// Its empty listing directory is prepared.
    listed: bool,
    /// Listings made here so far.
    next_list: usize,
}

const LIST_DIR: &str = "replay-list";

impl Names {
    fn new(m: &Model, file_paths: &[PathBuf], meta_dirs: &[PathBuf]) -> Names {
        let mut dirs: BTreeMap<PathBuf, DirState> = BTreeMap::new();
        let mut made: Vec<&tessera_model::FileModel> =
            m.files.iter().filter(|f| f.created).collect();
        made.sort_by_key(|f| (f.first_ns, f.id));
        for d in meta_dirs {
            dirs.entry(d.clone()).or_default();
        }
        for f in m.files.iter().filter(|f| !f.created).chain(made) {
            let parent = file_paths[f.id as usize]
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            if let Some(d) = dirs.get_mut(&parent) {
                if f.created {
                    d.to_make.push_back(Name::File(f.id));
                } else {
                    d.files.push(Name::File(f.id));
                }
            }
        }
        let mut phases: Vec<&Phase> = m.phases.iter().collect();
        phases.sort_by_key(|p| (p.start_ns, p.id));
        let mut opened = BTreeSet::new();
        for p in phases {
            for q in &p.processes {
                let parent = file_paths.get(p.file as usize).and_then(|p| p.parent());
                let dir = parent.and_then(|p| dirs.get_mut(p));
                if let Some(d) = dir.filter(|_| opened.insert((q.pid, p.file))) {
                    d.carried_opens.push_back((q.pid, p.file));
                }
            }
        }
        let mut known: BTreeSet<&Path> = meta_dirs.iter().map(PathBuf::as_path).collect();
        for path in file_paths {
            known.extend(path.ancestors().skip(1));
        }
        let mut subdirs: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
        for d in known.into_iter().filter(|d| !d.as_os_str().is_empty()) {
            let parent = d.parent().unwrap_or(Path::new(""));
            subdirs
                .entry(parent.to_path_buf())
                .or_default()
                .push(d.to_path_buf());
        }
        Names {
            dirs,
            meta_dirs: meta_dirs.to_vec(),
            prepare: Prepare::default(),
            carried: BTreeSet::new(),
            subdirs,
            list_dirs: Vec::new(),
            listed: HashMap::new(),
        }
    }

    fn ops(&mut self, m: &Model, meta: usize) -> Vec<MetaOp> {
        let mp = &m.meta_phases[meta];
        let dir = &self.meta_dirs[meta];
        let id = meta as u32;
        let st = self.dirs.entry(dir.clone()).or_default();
        let spare = |st: &mut DirState, prepare: &mut Prepare| {
            let n = st.spares;
            st.spares += 1;
            prepare
                .spare_files
                .push(dir.join(format!("replay-spare-{n}")));
            Name::Spare(n)
        };
        let fresh = |k: u64, prepare: &mut Prepare| {
            prepare.remove.push(dir.join(format!("replay-{id}-{k}")));
            Name::New(id, k)
        };
        let mut n = mp.ops;
        while mp.kind == MetaKind::Open && n > 0 {
            let Some(open) = st.carried_opens.pop_front() else {
                break;
            };
            self.carried.insert(open);
            n -= 1;
        }
        let mut ops = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        let op = |name| MetaOp { name, to: None };
        for k in 0..n {
            let prepare = &mut self.prepare;
            ops.push(match mp.kind {
                MetaKind::Create => {
                    let name = match st.to_make.pop_front() {
                        Some(f) => {
                            st.files.push(f);
                            f
                        }
                        None => {
                            let n = fresh(k, prepare);
                            st.made.push_back(n);
                            n
                        }
                    };
                    op(name)
                }
                MetaKind::Stat | MetaKind::Open => {
                    let there = st.files.len() + st.made.len();
                    if there == 0 {
                        let n = spare(st, prepare);
                        st.made.push_back(n);
                    }
                    let there = st.files.len() + st.made.len();
                    let i = st.next_look % there;
                    st.next_look = st.next_look.wrapping_add(1);
                    op(if i < st.files.len() {
                        st.files[i]
                    } else {
                        st.made[i - st.files.len()]
                    })
                }
                MetaKind::Unlink => {
                    let name = match st.made.pop_front() {
                        Some(n) => n,
                        None => spare(st, prepare),
                    };
                    op(name)
                }
                MetaKind::Rename => {
                    let name = match st.made.pop_front() {
                        Some(n) => n,
                        None => spare(st, prepare),
                    };
                    let to = fresh(k, prepare);
                    st.made.push_back(to);
                    MetaOp { name, to: Some(to) }
                }
                MetaKind::Mkdir => {
                    let n = fresh(k, prepare);
                    st.subdirs.push_back(n);
                    op(n)
                }
                MetaKind::Rmdir => {
                    let name = match st.subdirs.pop_front() {
                        Some(n) => n,
                        None => {
                            let n = st.spare_dirs;
                            st.spare_dirs += 1;
                            prepare
                                .spare_dirs
                                .push(dir.join(format!("replay-spare-dir-{n}")));
                            Name::SpareDir(n)
                        }
                    };
                    op(name)
                }
                MetaKind::List => {
                    let target = match self.subdirs.get(dir).filter(|s| !s.is_empty()) {
                        Some(subdirs) => {
                            st.next_list += 1;
                            subdirs[(st.next_list - 1) % subdirs.len()].clone()
                        }
                        None => {
                            let empty = dir.join(LIST_DIR);
                            if !std::mem::replace(&mut st.listed, true) {
                                prepare.spare_dirs.push(empty.clone());
                            }
                            empty
                        }
                    };
                    let next = u32::try_from(self.list_dirs.len()).unwrap_or(u32::MAX);
                    let i = *self.listed.entry(target.clone()).or_insert(next);
                    if i == next {
                        self.list_dirs.push(target);
                    }
                    op(Name::ListDir(i))
                }
            });
        }
        ops
    }

    fn finish(self) -> (Prepare, BTreeSet<(u32, u32)>, Vec<PathBuf>) {
        (self.prepare, self.carried, self.list_dirs)
    }
}

/// The requests one process makes in a data phase: `(offset, size)`, every repetition.
pub(crate) struct Requests<'a> {
    phase: &'a Phase,
    /// Requests per repetition, and left in all.
    per_rep: u64,
    left: u64,
    /// Index in the repetition.
    k: u64,
    initial: u64,
    next: u64,
    sizes: Sizes<'a>,
    random: Option<Random>,
}

/// Where random requests go: aligned slots, drawn so that no three consecutive requests look
/// sequential or strided (a profiler would see a shape where there is none).
struct Random {
    rng: StdRng,
    lo: u64,
    slots: u64,
    /// The first random write goes to the highest slot, so the file reaches its size.
    top_first: bool,
    /// The current run of requests as a profiler cuts them: its last two (offset, end).
    run: Vec<(u64, u64)>,
}

impl Random {
    fn offset(&mut self, rs: u64, size: u64) -> u64 {
        let extends = |run: &[(u64, u64)], at: u64| match run {
            [(o1, e1), (o2, e2)] => {
                (*e1 == *o2 && at == *e2)
                    || (*o2 as i128 - *o1 as i128) == (at as i128 - *o2 as i128)
            }
            _ => false,
        };
        let pick = |me: &mut Self| {
            if std::mem::take(&mut me.top_first) {
                me.slots - 1
            } else {
                me.rng.gen_range(0..me.slots)
            }
        };
        let mut at = self.lo + pick(self) * rs;
        // A few slots cannot avoid it; past a bound of tries, take what came.
        for _ in 0..64 {
            if !extends(&self.run, at) {
                break;
            }
            at = self.lo + pick(self) * rs;
        }
        if self.run.len() == 2 && !extends(&self.run, at) {
            self.run.clear();
        }
        if self.run.len() == 2 {
            self.run.remove(0);
        }
        self.run.push((at, at.saturating_add(size)));
        at
    }
}

/// Walks a phase's size counts: every `stride`th request from a given one.
struct Sizes<'a> {
    counts: &'a [tessera_model::SizeCount],
    bucket: usize,
    used: u64,
    stride: u64,
    fallback: u64,
}

impl Sizes<'_> {
    fn next(&mut self) -> u64 {
        let size = self.take();
        self.skip(self.stride - 1);
        size
    }

    fn take(&mut self) -> u64 {
        while let Some(s) = self.counts.get(self.bucket) {
            if self.used < s.count {
                self.used += 1;
                return s.size;
            }
            self.bucket += 1;
            self.used = 0;
        }
        self.fallback
    }

    fn skip(&mut self, mut n: u64) {
        while let Some(s) = self.counts.get(self.bucket) {
            let here = s.count - self.used.min(s.count);
            if n < here {
                self.used += n;
                return;
            }
            n -= here;
            self.bucket += 1;
            self.used = 0;
        }
    }
}

impl<'a> Requests<'a> {
    /// Process `slot`'s requests in `phase`, from its initial offset. Processes with equal
    /// parts (as a profiler joins them) take the phase's sizes in turn, so each gets its
    /// share of every size; unequal parts take them one after the other (the last what the
    /// others leave).
    pub(crate) fn new(phase: &'a Phase, slot: usize, seed: u64) -> Self {
        let reps = u64::from(phase.repetitions.max(1));
        let quota = |q: &tessera_model::PhaseProcess| q.ops * reps;
        let me = &phase.processes[slot];
        let np = phase.processes.len() as u64;
        let counted: u64 = phase.sizes.iter().map(|s| s.count).sum();
        let even = phase.processes.iter().all(|q| q.ops == me.ops) && quota(me) * np == counted;
        let mut sizes = Sizes {
            counts: &phase.sizes,
            bucket: 0,
            used: 0,
            stride: 1,
            fallback: phase.request_size,
        };
        let mut left = quota(me);
        if even {
            sizes.stride = np;
            sizes.skip(slot as u64);
        } else {
            let before: u64 = phase.processes[..slot].iter().map(quota).sum();
            if slot + 1 == phase.processes.len() {
                left = left.max(counted.saturating_sub(before));
            }
            sizes.skip(before);
        }
        let random = (phase.access == AccessMode::Random).then(|| {
            let rs = phase.request_size.max(1);
            let top = phase.offset_max.saturating_sub(rs).max(phase.offset_min);
            let lo = phase.offset_min.next_multiple_of(rs);
            let lo = if lo > top { phase.offset_min } else { lo };
            let seed = seed ^ (u64::from(phase.id) << 32) ^ u64::from(me.pid);
            Random {
                rng: StdRng::seed_from_u64(seed),
                lo,
                slots: (top - lo) / rs + 1,
                top_first: slot == 0 && phase.op == tessera_model::DataOp::Write,
                run: Vec::with_capacity(2),
            }
        });
        Requests {
            phase,
            per_rep: me.ops.max(1),
            left,
            k: 0,
            initial: me.initial_offset,
            next: me.initial_offset,
            sizes,
            random,
        }
    }
}

impl ExactSizeIterator for Requests<'_> {}

impl Iterator for Requests<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        if self.k == self.per_rep {
            self.k = 0;
            self.next = self.initial;
        }
        let size = self.sizes.next();
        let rs = self.phase.request_size.max(1);
        let offset = match (&mut self.random, self.phase.access, self.phase.displacement) {
            (Some(r), _, _) => r.offset(rs, size),
            (None, AccessMode::Strided, Some(d)) => {
                let at = i128::from(self.initial) + i128::from(self.k) * i128::from(d);
                u64::try_from(at.max(0)).unwrap_or(u64::MAX)
            }
            _ => {
                let at = self.next;
                self.next = at.saturating_add(size);
                at
            }
        };
        self.k += 1;
        Some((offset, size))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::{synthetic, SizeCount};

    fn all(p: &Phase, slot: usize) -> Vec<(u64, u64)> {
        Requests::new(p, slot, 7).collect()
    }

    #[test]
    fn sequential_requests_follow_each_other() {
        let m = synthetic::file_per_process(2, 4, 100);
        let r = all(&m.phases[1], 0);
        assert_eq!(r, vec![(0, 100), (100, 100), (200, 100), (300, 100)]);
    }

    #[test]
    fn strided_processes_interleave() {
        let m = synthetic::shared_strided(3, 2, 10);
        let p = &m.phases[0];
        assert_eq!(all(p, 0), vec![(0, 10), (30, 10)]);
        assert_eq!(all(p, 1), vec![(10, 10), (40, 10)]);
        assert_eq!(all(p, 2), vec![(20, 10), (50, 10)]);
    }

    #[test]
    fn random_offsets_are_aligned_in_range_and_seeded() {
        let m = synthetic::random_reads(200, 4096, 1 << 20);
        let p = &m.phases[0];
        let r = all(p, 0);
        assert_eq!(r.len(), 200);
        assert!(r
            .iter()
            .all(|&(o, s)| o % 4096 == 0 && o + s <= 1 << 20 && s == 4096));
        assert_eq!(r, all(p, 0), "the same seed, the same offsets");
        let distinct: BTreeSet<u64> = r.iter().map(|x| x.0).collect();
        assert!(distinct.len() > 100, "spread: {}", distinct.len());
        // Cut as a profiler cuts runs, no run is longer than two requests.
        let mut run: Vec<u64> = Vec::new();
        for &(o, _) in &r {
            let extends = matches!(run[..], [a, b] if b as i64 - a as i64 == o as i64 - b as i64);
            assert!(!extends, "three requests in a row {run:?} {o}");
            if run.len() == 2 {
                run.clear();
            }
            run.push(o);
        }
    }

    #[test]
    fn sizes_are_shared_exactly_and_repetitions_restart() {
        let mut p = synthetic::shared_strided(2, 3, 10).phases.remove(0);
        p.access = AccessMode::Sequential;
        p.repetitions = 2;
        p.processes[1].initial_offset = 1000;
        p.sizes = vec![
            SizeCount { size: 10, count: 8 },
            SizeCount { size: 4, count: 4 },
        ];
        let (a, b) = (all(&p, 0), all(&p, 1));
        let histogram = |r: &[(u64, u64)]| {
            let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
            for (_, s) in r {
                *counts.entry(*s).or_default() += 1;
            }
            counts
        };
        // Each process its share of each size, as the processes of a phase had.
        assert_eq!(histogram(&a), BTreeMap::from([(4, 2), (10, 4)]));
        assert_eq!(histogram(&b), histogram(&a));
        // Process 1's second repetition starts again at its initial offset.
        assert_eq!(b[0].0, 1000);
        assert_eq!(b[3].0, 1000);
        assert_eq!(b[4], (1010, 4));
        // Unequal parts: one after the other, every size counted once.
        p.processes[0].ops = 4;
        p.processes[1].ops = 2;
        let (a, b) = (all(&p, 0), all(&p, 1));
        assert_eq!(a.len() + b.len(), 12);
        let mut both = a.clone();
        both.extend(&b);
        assert_eq!(histogram(&both), BTreeMap::from([(4, 4), (10, 8)]));
        assert_eq!(p.op, DataOp::Write);
    }

    #[test]
    fn a_phase_waits_for_those_that_ended_before_it_started() {
        let m = synthetic::read_then_write(2, 10);
        let plan = Plan::new(&m).expect("a plan");
        assert_eq!(plan.after, vec![0, 1]);
        let m = synthetic::file_per_process(3, 2, 10);
        let plan = Plan::new(&m).expect("a plan");
        assert_eq!(plan.after, vec![0, 0, 0], "phases at once wait for nothing");
        assert_eq!(plan.procs.len(), 3);
    }

    #[test]
    fn a_process_opens_a_file_once_for_all_its_phases_on_it() {
        let mut m = synthetic::read_then_write(2, 10);
        // The write goes to the file read: one file, two phases, one process.
        m.phases[1].file = 0;
        let plan = Plan::new(&m).expect("a plan");
        let p = &plan.procs[0];
        assert_eq!(p.parts.len(), 2);
        assert_eq!(
            p.files.get(&0),
            Some(&FileUse {
                read: true,
                write: true,
                last: 1
            })
        );
        assert_eq!(p.files.len(), 1);
    }

    #[test]
    fn metadata_names_follow_the_directory() {
        let m = synthetic::create_stat_unlink(2, 4);
        let plan = Plan::new(&m).expect("a plan");
        let ops: Vec<&Vec<MetaOp>> = plan
            .tasks
            .iter()
            .filter_map(|t| match t {
                Task::Meta(_, ops) => Some(ops),
                Task::Data(_) => None,
            })
            .collect();
        let made: Vec<Name> = ops[0].iter().map(|o| o.name).collect();
        assert_eq!(made, (0..4).map(|k| Name::New(0, k)).collect::<Vec<_>>());
        let stated: Vec<Name> = ops[1].iter().map(|o| o.name).collect();
        assert_eq!(stated, made, "stats go over what was made");
        let removed: Vec<Name> = ops[2].iter().map(|o| o.name).collect();
        assert_eq!(removed, made);
        assert!(plan.prepare.spare_files.is_empty());
        assert_eq!(Plan::share(ops[0], 0, 2).len(), 2);
        assert_eq!(
            plan.name_path(0, Name::New(0, 3)),
            Path::new("burst/replay-0-3")
        );
    }

    #[test]
    fn the_data_phases_make_their_files_opens() {
        let read = |file, pids: &[(u32, u64)], slot| {
            let seq = AccessMode::Sequential;
            synthetic::phase(file, DataOp::Read, seq, pids, 1, 100, None, (0, 100), slot)
        };
        let m = synthetic::model(
            ["/src/a", "/src/b", "/src/c"]
                .map(|p| synthetic::file(p, false, 100))
                .into(),
            // Process 1 reads a and b, process 2 reads a: three opens.
            vec![read(0, &[(1, 0), (2, 0)], 1), read(1, &[(1, 0)], 1)],
            vec![
                synthetic::meta_phase(MetaKind::Open, "/src", &[1, 2], 2, 0),
                synthetic::meta_phase(MetaKind::Stat, "/src", &[1], 4, 0),
                synthetic::meta_phase(MetaKind::Open, "/src", &[1], 5, 2),
            ],
        );
        let plan = Plan::new(&m).expect("a plan");
        let opens: Vec<(MetaKind, usize)> = (plan.tasks.iter())
            .filter_map(|t| match t {
                Task::Meta(i, ops) => Some((m.meta_phases[*i].kind, ops.len())),
                Task::Data(_) => None,
            })
            .collect();
        assert_eq!(
            opens,
            [
                (MetaKind::Open, 0),
                (MetaKind::Stat, 4),
                (MetaKind::Open, 4)
            ]
        );
    }

    #[test]
    fn listings_list_the_directories_in_the_phases_directory_in_turn() {
        let m = synthetic::model(
            ["/t/a/x", "/t/b/y", "/u/z"]
                .map(|p| synthetic::file(p, false, 100))
                .into(),
            Vec::new(),
            vec![
                synthetic::meta_phase(MetaKind::List, "/t", &[1], 3, 0),
                synthetic::meta_phase(MetaKind::List, "/u", &[1], 2, 1),
            ],
        );
        let plan = Plan::new(&m).expect("a plan");
        let listed: Vec<Vec<PathBuf>> = (plan.tasks.iter())
            .filter_map(|t| match t {
                Task::Meta(i, ops) => {
                    Some(ops.iter().map(|o| plan.name_path(*i, o.name)).collect())
                }
                Task::Data(_) => None,
            })
            .collect();
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            listed,
            [
                vec![p("t/a"), p("t/b"), p("t/a")],
                vec![p("u/replay-list"), p("u/replay-list")]
            ]
        );
        // The one with no directory in it lists an empty one, made before timing.
        assert_eq!(plan.prepare.spare_dirs, [p("u/replay-list")]);
    }

    #[test]
    fn removals_of_names_never_made_get_spares() {
        let m = synthetic::model(
            Vec::new(),
            Vec::new(),
            vec![synthetic::meta_phase(MetaKind::Unlink, "/d", &[1], 3, 0)],
        );
        let plan = Plan::new(&m).expect("a plan");
        assert_eq!(plan.prepare.spare_files.len(), 3);
    }

    #[test]
    fn paths_stay_inside() {
        assert_eq!(relative("/a/b").ok(), Some(PathBuf::from("a/b")));
        assert!(relative("/a/../../etc").is_err());
        let mut m = synthetic::read_then_write(1, 1);
        m.files[0].path = "/../x".into();
        assert!(matches!(Plan::new(&m), Err(Error::Path(_))));
    }
}
