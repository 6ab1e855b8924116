//! Callback promises, as AFS makes them: which subscribed connections were answered what, so
//! that a change tells them at once and their caches (the FUSE mount's kernel cache) may keep
//! answers far longer than a fixed attribute timeout would allow.
//!
//! Four kinds, all kept in the partition that holds the thing promised (so a promise and the
//! changes that break it meet under one lock, [`Watches::lock`]):
//! - on an inode's attributes, used up by the first change (the holder asks again, and is
//!   promised again, when it needs the attributes);
//! - on a directory's names, kept while the connection lives: removing or replacing any name
//!   in it sends that name;
//! - on a name's absence (a lookup that found nothing), used up when the name appears. Kept
//!   per name rather than on the directory, so that a directory many nodes fill does not send
//!   every new name to every node that once looked something up in it;
//! - on a directory's completeness, to the connection that made it (`InodeCreate`): the first
//!   name anyone else adds, or the directory's removal, uses it up (`Notice::Listing`). Its
//!   holder knows every name it added itself, so it may answer that any other name is absent
//!   without asking: a create in a directory the node made costs no look-up round trip.
//!
//! A node that stops being a partition's primary tells the holders of its promises there to
//! forget everything from it (`Notice::Reset`, [`Watches::abandon`]): the next primary was
//! never asked to keep them.
//!
//! What an answer promises and what a change breaks are pure functions of the request and its
//! answer ([`promised`], [`broken`]). Promises are bounded ([`MAX_PROMISES`] per node): at the
//! bound a partition first drops the promises of ended connections, and past it a promise is
//! not kept but broken at once, which is always correct.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tessera_placement::PartitionId;
use tessera_proto::{ErrorCode, FileKind, Ino, Name, Notice, Op, Response, Watcher};
use tokio::time::Instant;

/// Promises one node keeps at most (a few tens of bytes each).
pub const MAX_PROMISES: usize = 1 << 20;
/// At the bound, a partition is swept of ended connections' promises at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Part {
    attrs: HashMap<Ino, Vec<Watcher>>,
    dirs: HashMap<Ino, Vec<Watcher>>,
    absent: HashMap<(Ino, Name), Vec<Watcher>>,
    complete: HashMap<Ino, Vec<Watcher>>,
    swept: Option<Instant>,
}

impl Part {
    /// Drops the promises of connections that ended. A key's holders are otherwise pruned
    /// only when it is promised again, and names once found absent may never be.
    fn sweep(&mut self, kept: &AtomicUsize) {
        fn sweep_map<K>(map: &mut HashMap<K, Vec<Watcher>>, kept: &AtomicUsize) {
            map.retain(|_, holders| {
                prune(holders, kept);
                !holders.is_empty()
            });
        }
        sweep_map(&mut self.attrs, kept);
        sweep_map(&mut self.dirs, kept);
        sweep_map(&mut self.absent, kept);
        sweep_map(&mut self.complete, kept);
        self.swept = Some(Instant::now());
    }
}

pub struct Watches {
    parts: Vec<Mutex<Part>>,
    kept: AtomicUsize,
    limit: usize,
}

/// What an answer lets its receiver cache.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Promised {
    pub attrs: Vec<Ino>,
    /// A directory and the names of it the answer showed.
    pub names: Option<(Ino, Vec<Name>)>,
    /// A name the answer showed does not exist.
    pub absent: Option<(Ino, Name)>,
    /// A directory the request made: it has no names.
    pub complete: Option<Ino>,
}

/// What a change makes untrue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    Attr(Ino),
    /// A name was removed or now means another file: for holders of the directory's names.
    Name(Ino, Name),
    /// A name now exists: for holders of its absence and of the directory's completeness.
    Added(Ino, Name),
    /// A directory is gone: for holders of its completeness, the changer too (an inode
    /// number may come back).
    Destroyed(Ino),
}

/// What answering `op` with `resp` lets the receiver cache.
#[must_use]
pub fn promised(op: &Op, resp: &Response) -> Promised {
    match (op, resp) {
        (Op::DirLookup { dir, name }, Response::Found { inode, .. }) => Promised {
            attrs: inode.iter().map(|i| i.ino).collect(),
            names: Some((*dir, vec![name.clone()])),
            ..Promised::default()
        },
        (Op::DirLookup { dir, name }, Response::Error(ErrorCode::NotFound)) => Promised {
            absent: Some((*dir, name.clone())),
            ..Promised::default()
        },
        // Answered with the directory; the new file's attributes are the request's.
        (
            Op::DirCreate {
                dir, name, inode, ..
            },
            Response::Inode(_),
        ) => Promised {
            attrs: vec![inode.ino],
            names: Some((*dir, vec![name.clone()])),
            ..Promised::default()
        },
        (Op::DirList { dir, .. }, Response::Entries { entries, .. }) => Promised {
            attrs: entries
                .iter()
                .filter_map(|(_, _, i)| i.as_ref())
                .map(|i| i.ino)
                .collect(),
            names: Some((*dir, entries.iter().map(|(n, _, _)| n.clone()).collect())),
            ..Promised::default()
        },
        (Op::InodeCreate { inode }, Response::Ok) if inode.kind == FileKind::Dir => Promised {
            complete: Some(inode.ino),
            ..Promised::default()
        },
        (_, Response::Inode(i)) => Promised {
            attrs: vec![i.ino],
            ..Promised::default()
        },
        _ => Promised::default(),
    }
}

/// What a change, `op` answered with `resp`, makes untrue.
#[must_use]
pub fn broken(op: &Op, resp: &Response) -> Vec<Broken> {
    let attr = Broken::Attr;
    let entry = |dir: Ino, name: &Name| Broken::Name(dir, name.clone());
    let added = |dir: Ino, name: &Name| Broken::Added(dir, name.clone());
    match (op, resp) {
        (_, Response::Error(_)) => vec![],
        (
            Op::InodeSetAttr { ino, .. }
            | Op::InodeExtend { ino, .. }
            | Op::InodeReserve { ino, .. }
            | Op::InodeRetract { ino, .. }
            | Op::InodeLink { ino, .. }
            | Op::InodeReclaim { ino, .. },
            _,
        ) => vec![attr(*ino)],
        (Op::DirInsert { dir, name, .. }, Response::Replaced(old)) => match old {
            Some(_) => vec![attr(*dir), entry(*dir, name)],
            None => vec![attr(*dir), added(*dir, name)],
        },
        (Op::DirRemove { dir, name, .. }, _) => vec![attr(*dir), entry(*dir, name)],
        (
            Op::DirUnlink { dir, name, .. },
            Response::Unlinked {
                entry: e, nlink, ..
            },
        ) => {
            let mut out = vec![attr(*dir), entry(*dir, name)];
            if nlink.is_some() {
                out.push(attr(e.ino));
            }
            out
        }
        (
            Op::DirRename { dir, from, to, .. },
            Response::Renamed {
                moved,
                ctime_set,
                replaced,
                nlink,
                ..
            },
        ) => {
            let mut out = vec![
                attr(*dir),
                entry(*dir, from),
                entry(*dir, to),
                added(*dir, to),
            ];
            out.extend(moved.filter(|_| *ctime_set).map(|m| attr(m.ino)));
            out.extend(replaced.filter(|_| nlink.is_some()).map(|r| attr(r.ino)));
            out
        }
        (Op::DirCreate { dir, name, .. }, _) => vec![attr(*dir), added(*dir, name)],
        (Op::DirDestroy { dir }, _) => vec![attr(*dir), Broken::Destroyed(*dir)],
        _ => vec![],
    }
}

/// The directory a change adds a name to or removes, whose completeness promise it breaks:
/// the change waits for its holders ([`Locked::recall`]).
#[must_use]
pub fn recalls(op: &Op) -> Option<Ino> {
    match op {
        Op::DirInsert { dir, .. }
        | Op::DirCreate { dir, .. }
        | Op::DirRename { dir, .. }
        | Op::DirDestroy { dir } => Some(*dir),
        _ => None,
    }
}

/// Must the connection that made this change be told of it too? An extent published at a
/// close may leave a size other than the writer's (N-to-1: the largest extent wins) and sets
/// the time, a reservation's size counts others' too, and one taken back leaves a size shorter
/// than its kernel was told; every other change is one its kernel applied itself.
#[must_use]
pub fn origin_told(op: &Op) -> bool {
    matches!(
        op,
        Op::InodeExtend { .. } | Op::InodeReserve { .. } | Op::InodeRetract { .. }
    )
}

/// One partition's promises, locked: hold it across applying a request and keeping or
/// breaking its promises, so no change slips between an answer and its promise.
pub struct Locked<'a> {
    part: MutexGuard<'a, Part>,
    kept: &'a AtomicUsize,
    limit: usize,
}

impl Watches {
    #[must_use]
    pub fn new(partitions: u32, limit: usize) -> Self {
        Self {
            parts: (0..partitions).map(|_| Mutex::default()).collect(),
            kept: AtomicUsize::new(0),
            limit,
        }
    }

    pub fn lock(&self, p: PartitionId) -> Option<Locked<'_>> {
        let part = self.parts.get(p as usize)?;
        Some(Locked {
            part: part.lock().unwrap_or_else(PoisonError::into_inner),
            kept: &self.kept,
            limit: self.limit,
        })
    }

    /// Promises kept now.
    #[must_use]
    pub fn kept(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }
}

fn prune(holders: &mut Vec<Watcher>, kept: &AtomicUsize) {
    let before = holders.len();
    holders.retain(|h| !h.is_gone());
    kept.fetch_sub(before - holders.len(), Ordering::Relaxed);
}

/// Adds `w` to `key`'s holders in `map`; false if that would pass the bound.
fn keep<K: Hash + Eq>(
    kept: &AtomicUsize,
    limit: usize,
    map: &mut HashMap<K, Vec<Watcher>>,
    key: K,
    w: &Watcher,
) -> bool {
    if let Some(holders) = map.get_mut(&key) {
        prune(holders, kept);
        if holders.iter().any(|h| h.id() == w.id()) {
            return true;
        }
        if holders.is_empty() {
            map.remove(&key);
        }
    }
    if kept.load(Ordering::Relaxed) >= limit {
        return false;
    }
    map.entry(key).or_default().push(w.clone());
    kept.fetch_add(1, Ordering::Relaxed);
    true
}

impl Locked<'_> {
    /// `w` was answered what `p` describes: promise to tell it of changes.
    pub fn promise(&mut self, w: &Watcher, p: Promised) {
        let part = &mut *self.part;
        if self.kept.load(Ordering::Relaxed) >= self.limit
            && part.swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY)
        {
            part.sweep(self.kept);
        }
        for ino in p.attrs {
            if !keep(self.kept, self.limit, &mut part.attrs, ino, w) {
                w.notify(Notice::Attr { ino });
            }
        }
        if let Some((dir, names)) = p.names {
            if !keep(self.kept, self.limit, &mut part.dirs, dir, w) {
                for name in names {
                    w.notify(Notice::Entry { dir, name });
                }
            }
        }
        if let Some((dir, name)) = p.absent {
            if !keep(
                self.kept,
                self.limit,
                &mut part.absent,
                (dir, name.clone()),
                w,
            ) {
                w.notify(Notice::Entry { dir, name });
            }
        }
        if let Some(dir) = p.complete {
            if !keep(self.kept, self.limit, &mut part.complete, dir, w) {
                w.notify(Notice::Listing { dir });
            }
        }
    }

    /// A change made `broken` untrue: tell the holders. The connection that made it
    /// (`origin`) is not told, its own cache saw the change (and keeps its promises, but for
    /// the absence of a name it added), unless `origin_too`: the server changed more than it
    /// asked ([`origin_told`]).
    pub fn r#break(&mut self, origin: Option<&Watcher>, origin_too: bool, broken: Vec<Broken>) {
        let part = &mut *self.part;
        let kept = self.kept;
        let told = |h: &Watcher| origin_too || origin.is_none_or(|o| o.id() != h.id());
        // Takes a used-up promise's holders, telling each but the origin.
        let use_up = |holders: Vec<Watcher>, n: &Notice, keep_origin: bool| {
            let mut left = Vec::new();
            for h in holders {
                if told(&h) {
                    h.notify(n.clone());
                } else if keep_origin {
                    left.push(h);
                    continue;
                }
                kept.fetch_sub(1, Ordering::Relaxed);
            }
            left
        };
        for b in broken {
            match b {
                Broken::Attr(ino) => {
                    let Some(holders) = part.attrs.remove(&ino) else {
                        continue;
                    };
                    let left = use_up(holders, &Notice::Attr { ino }, true);
                    if !left.is_empty() {
                        part.attrs.insert(ino, left);
                    }
                }
                Broken::Name(dir, name) => {
                    let Some(holders) = part.dirs.get(&dir) else {
                        continue;
                    };
                    let n = Notice::Entry { dir, name };
                    for h in holders.iter().filter(|h| told(h)) {
                        h.notify(n.clone());
                    }
                }
                Broken::Added(dir, name) => {
                    if let Some(holders) = part.complete.remove(&dir) {
                        let left = use_up(holders, &Notice::Listing { dir }, true);
                        if !left.is_empty() {
                            part.complete.insert(dir, left);
                        }
                    }
                    if let Some(holders) = part.absent.remove(&(dir, name.clone())) {
                        use_up(holders, &Notice::Entry { dir, name }, false);
                    }
                }
                Broken::Destroyed(dir) => {
                    for h in part.complete.remove(&dir).unwrap_or_default() {
                        h.notify(Notice::Listing { dir });
                        kept.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// A change is about to add a name to, or remove, directory `dir` ([`recalls`]), whose
    /// completeness others than `origin` may hold: recalls it from them (`Listing`) and returns
    /// them, for the change to wait until they give it back ([`Self::relinquish`]) or are gone.
    /// A holder may have answered creates there that are still on their way here; one of them
    /// may carry the same name.
    pub fn recall(&mut self, dir: Ino, origin: Option<&Watcher>) -> Vec<Watcher> {
        let Some(holders) = self.part.complete.get_mut(&dir) else {
            return Vec::new();
        };
        prune(holders, self.kept);
        let out: Vec<Watcher> = holders
            .iter()
            .filter(|h| origin.is_none_or(|o| o.id() != h.id()))
            .cloned()
            .collect();
        for h in &out {
            h.notify(Notice::Listing { dir });
        }
        out
    }

    /// `w` gave back `dir`'s completeness (or is taken to have: `RECALL_PATIENCE` passed).
    pub fn relinquish(&mut self, dir: Ino, w: &Watcher) {
        if let Some(holders) = self.part.complete.get_mut(&dir) {
            let before = holders.len();
            holders.retain(|h| h.id() != w.id());
            self.kept
                .fetch_sub(before - holders.len(), Ordering::Relaxed);
            if holders.is_empty() {
                self.part.complete.remove(&dir);
            }
        }
    }

    /// Does any of `recalled` still hold `dir`'s completeness?
    #[must_use]
    pub fn still_held(&self, dir: Ino, recalled: &[Watcher]) -> bool {
        self.part.complete.get(&dir).is_some_and(|holders| {
            holders
                .iter()
                .any(|h| !h.is_gone() && recalled.iter().any(|r| r.id() == h.id()))
        })
    }

    /// This node is no longer the partition's primary: tells every holder of a promise here
    /// to forget what it has from this node (`Reset`), and keeps none.
    pub fn abandon(&mut self) {
        let part = std::mem::take(&mut *self.part);
        let mut told = std::collections::HashSet::new();
        let holders = (part.attrs.into_values())
            .chain(part.dirs.into_values())
            .chain(part.absent.into_values())
            .chain(part.complete.into_values())
            .flatten();
        for h in holders {
            self.kept.fetch_sub(1, Ordering::Relaxed);
            if told.insert(h.id()) {
                h.notify(Notice::Reset);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_proto::{DirEntry, FileKind, Inode, Timespec};

    fn file(ino: Ino) -> Inode {
        Inode::new(ino, FileKind::File, 0o644, 0, 0, 1, Vec::new())
    }

    fn lookup(dir: Ino, name: &str, ino: Ino) -> (Op, Response) {
        let op = Op::DirLookup {
            dir,
            name: name.into(),
        };
        let entry = DirEntry {
            ino,
            kind: FileKind::File,
        };
        let resp = Response::Found {
            entry,
            inode: Some(file(ino)),
        };
        (op, resp)
    }

    fn unlink(dir: Ino, name: &str, ino: Ino) -> (Op, Response) {
        let op = Op::DirUnlink {
            dir,
            name: name.into(),
            mtime: Timespec::now(),
        };
        let resp = Response::Unlinked {
            entry: DirEntry {
                ino,
                kind: FileKind::File,
            },
            nlink: Some(0),
            dir: file(dir),
        };
        (op, resp)
    }

    fn entry(dir: Ino, name: &str) -> Notice {
        Notice::Entry {
            dir,
            name: name.into(),
        }
    }

    /// What a lookup of `name` in directory 7 that found nothing promises.
    fn missing(name: &str) -> Promised {
        let op = Op::DirLookup {
            dir: 7,
            name: name.into(),
        };
        promised(&op, &Response::Error(ErrorCode::NotFound))
    }

    fn drain(rx: &mut tokio::sync::mpsc::Receiver<Notice>) -> Vec<Notice> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn a_change_tells_those_answered_and_names_skip_the_changer() {
        let w = Watches::new(4, 100);
        let (a, mut ra) = Watcher::new(64);
        let (b, mut rb) = Watcher::new(64);
        let (op, resp) = lookup(7, "f", 9);
        w.lock(0).unwrap().promise(&a, promised(&op, &resp));
        w.lock(0).unwrap().promise(&b, promised(&op, &resp));
        assert_eq!(w.kept(), 4);
        // b unlinks f: a hears of the name and the inode, b of nothing (its kernel knows).
        let (op, resp) = unlink(7, "f", 9);
        assert!(!origin_told(&op));
        w.lock(0)
            .unwrap()
            .r#break(Some(&b), false, broken(&op, &resp));
        assert_eq!(drain(&mut ra), vec![entry(7, "f"), Notice::Attr { ino: 9 }]);
        assert!(drain(&mut rb).is_empty());
        // a's attribute promise is used up, b's kept; the directory's names stay watched.
        assert_eq!(w.kept(), 3);
        let extend = Op::InodeExtend {
            ino: 9,
            size: 1,
            mtime: Timespec::now(),
        };
        assert!(origin_told(&extend));
        let answer = Response::Inode(file(9));
        w.lock(0)
            .unwrap()
            .r#break(Some(&b), true, broken(&extend, &answer));
        assert_eq!(drain(&mut rb), vec![Notice::Attr { ino: 9 }]);
        assert!(drain(&mut ra).is_empty());
        assert_eq!(w.kept(), 2);
        w.lock(0).unwrap().r#break(None, false, broken(&op, &resp));
        assert_eq!(drain(&mut ra).len(), 1);
        // Another partition's lock holds other promises.
        w.lock(1).unwrap().r#break(None, false, broken(&op, &resp));
        assert!(drain(&mut ra).is_empty());
    }

    #[test]
    fn past_the_bound_a_promise_is_broken_at_once_and_gone_watchers_are_dropped() {
        let w = Watches::new(1, 2);
        let (a, mut ra) = Watcher::new(64);
        let (op, resp) = lookup(7, "f", 9);
        w.lock(0).unwrap().promise(&a, promised(&op, &resp));
        let (op, resp) = lookup(8, "g", 10);
        w.lock(0).unwrap().promise(&a, promised(&op, &resp));
        let expected = vec![Notice::Attr { ino: 10 }, entry(8, "g")];
        assert_eq!(drain(&mut ra), expected);
        assert_eq!(w.kept(), 2);
        drop(ra);
        let (b, _rb) = Watcher::new(64);
        let (op, resp) = lookup(7, "f", 9);
        w.lock(0).unwrap().promise(&b, promised(&op, &resp));
        assert_eq!(
            w.kept(),
            2,
            "a's promises on 7 and 9 went with its connection"
        );
    }

    #[test]
    fn at_the_bound_ended_connections_make_room() {
        let w = Watches::new(1, 2);
        let (a, ra) = Watcher::new(64);
        w.lock(0).unwrap().promise(&a, missing("x"));
        w.lock(0).unwrap().promise(&a, missing("y"));
        assert_eq!(w.kept(), 2);
        drop(ra);
        // Names nobody asks about again: only a sweep finds them held by nobody.
        let (b, mut rb) = Watcher::new(64);
        w.lock(0).unwrap().promise(&b, missing("z"));
        assert_eq!(w.kept(), 1);
        assert!(drain(&mut rb).is_empty(), "kept, not broken at once");
    }

    fn create(dir: Ino, name: &str, ino: Ino) -> (Op, Response) {
        let op = Op::DirCreate {
            dir,
            name: name.into(),
            inode: file(ino),
            mtime: Timespec::now(),
            holder: 1,
        };
        let answer = Response::Inode(Inode::new(dir, FileKind::Dir, 0o755, 0, 0, 2, Vec::new()));
        (op, answer)
    }

    #[test]
    fn creates_break_the_directory_and_reads_break_nothing() {
        let (op, answer) = create(7, "n", 11);
        let added = Broken::Added(7, b"n".to_vec());
        assert_eq!(broken(&op, &answer), vec![Broken::Attr(7), added]);
        // The file is promised, not the directory it is answered with.
        assert_eq!(promised(&op, &answer).attrs, vec![11]);
        let (op, resp) = lookup(7, "f", 9);
        assert!(broken(&op, &resp).is_empty());
        let failed = Response::Error(ErrorCode::NotFound);
        assert!(broken(&unlink(7, "f", 9).0, &failed).is_empty());
        let absent = Promised {
            absent: Some((7, b"f".to_vec())),
            ..Promised::default()
        };
        assert_eq!(promised(&op, &failed), absent);
        assert_eq!(
            promised(&op, &Response::Error(ErrorCode::NotDir)),
            Promised::default()
        );
    }

    #[test]
    fn an_absence_is_broken_once_by_the_name_appearing_and_only_for_its_askers() {
        let w = Watches::new(1, 100);
        let (a, mut ra) = Watcher::new(64);
        let (b, mut rb) = Watcher::new(64);
        let (c, mut rc) = Watcher::new(64);
        w.lock(0).unwrap().promise(&a, missing("n"));
        w.lock(0).unwrap().promise(&b, missing("n"));
        w.lock(0).unwrap().promise(&b, missing("m"));
        // c holds the directory's names, which a new name does not concern.
        let (op, resp) = lookup(7, "f", 9);
        w.lock(0).unwrap().promise(&c, promised(&op, &resp));
        assert_eq!(w.kept(), 5);
        // b creates n: a hears of it, b's kernel knows, c is not told; both absences are gone.
        let (op, answer) = create(7, "n", 11);
        w.lock(0)
            .unwrap()
            .r#break(Some(&b), false, broken(&op, &answer));
        let n = entry(7, "n");
        assert_eq!(drain(&mut ra), vec![n]);
        assert!(drain(&mut rb).is_empty() && drain(&mut rc).is_empty());
        assert_eq!(w.kept(), 3);
        // Used up: n appearing again (rename over it) tells nobody who asked before.
        let rename = Op::DirRename {
            dir: 7,
            from: b"m".to_vec(),
            to: b"n".to_vec(),
            replace: true,
            replace_dir: false,
            mtime: Timespec::now(),
        };
        let renamed = Response::Renamed {
            moved: None,
            ctime_set: false,
            replaced: None,
            nlink: None,
            dir: Inode::new(7, FileKind::Dir, 0o755, 0, 0, 1, Vec::new()),
        };
        w.lock(0)
            .unwrap()
            .r#break(None, false, broken(&rename, &renamed));
        assert!(drain(&mut ra).is_empty());
        // ... but the directory's holder hears of both names.
        assert_eq!(drain(&mut rc).len(), 2);
    }

    /// What `InodeCreate` of directory `dir` promises its maker.
    fn made(dir: Ino) -> Promised {
        let inode = Inode::new(dir, FileKind::Dir, 0o755, 0, 0, 1, Vec::new());
        promised(&Op::InodeCreate { inode }, &Response::Ok)
    }

    #[test]
    fn a_made_directory_is_complete_until_another_adds_a_name_or_it_goes() {
        assert_eq!(made(7).complete, Some(7));
        let file = Op::InodeCreate { inode: file(9) };
        assert_eq!(promised(&file, &Response::Ok), Promised::default());
        let w = Watches::new(1, 100);
        let (a, mut ra) = Watcher::new(64);
        let (b, mut rb) = Watcher::new(64);
        w.lock(0).unwrap().promise(&a, made(7));
        // a's own names keep it complete: a knows them.
        let (op, answer) = create(7, "mine", 11);
        w.lock(0)
            .unwrap()
            .r#break(Some(&a), false, broken(&op, &answer));
        assert!(drain(&mut ra).is_empty());
        assert_eq!(w.kept(), 1);
        // b's name uses it up: a hears once, then never again.
        let (op, answer) = create(7, "theirs", 12);
        for _ in 0..2 {
            w.lock(0)
                .unwrap()
                .r#break(Some(&b), false, broken(&op, &answer));
        }
        assert_eq!(drain(&mut ra), vec![Notice::Listing { dir: 7 }]);
        assert!(drain(&mut rb).is_empty());
        assert_eq!(w.kept(), 0);
        // Removed, by its maker too: the number may name another directory later.
        w.lock(0).unwrap().promise(&a, made(8));
        let destroy = Op::DirDestroy { dir: 8 };
        w.lock(0)
            .unwrap()
            .r#break(Some(&a), false, broken(&destroy, &Response::Ok));
        assert_eq!(drain(&mut ra), vec![Notice::Listing { dir: 8 }]);
        assert_eq!(w.kept(), 0);
        // Past the bound it is broken at once.
        let full = Watches::new(1, 0);
        full.lock(0).unwrap().promise(&a, made(9));
        assert_eq!(drain(&mut ra), vec![Notice::Listing { dir: 9 }]);
    }

    #[test]
    fn an_abandoned_partition_tells_each_holder_once_to_forget_everything() {
        let w = Watches::new(2, 100);
        let (a, mut ra) = Watcher::new(64);
        let (b, mut rb) = Watcher::new(64);
        let (op, resp) = lookup(7, "f", 9);
        w.lock(0).unwrap().promise(&a, promised(&op, &resp));
        w.lock(0).unwrap().promise(&a, made(8));
        w.lock(1).unwrap().promise(&b, missing("x"));
        w.lock(0).unwrap().abandon();
        assert_eq!(drain(&mut ra), vec![Notice::Reset]);
        assert!(
            drain(&mut rb).is_empty(),
            "partition 1 is still this node's"
        );
        assert_eq!(w.kept(), 1);
        // Nothing is left to break.
        let (op, answer) = create(8, "n", 11);
        w.lock(0)
            .unwrap()
            .r#break(Some(&b), false, broken(&op, &answer));
        assert!(drain(&mut ra).is_empty());
    }
}
