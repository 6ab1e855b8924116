//! The mount's state (`Fs`): open files and directories, what this mount changed, the
//! kernel's page counters, the servers' promises; and the helpers the handlers share to answer
//! with it (attributes with unpublished sizes, leased answers, page bookkeeping).

use crate::cache::{Pages, Policy};
use crate::complete::Complete;
use crate::convert::{absent, attr, errno, ino_errno};
use crate::handles::Handles;
use crate::leases::{Key, Leases};
use crate::trace::{Opener, ReplyAttr, ReplyEmpty, ReplyEntry, Tracing};
use fuser::{Errno, FileHandle, FileType, Generation, INodeNo, Request};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};
use tessera_client::{Client, Error, ErrorCode, File, Inode, Lane, Name};
use tokio::runtime::Handle;

/// Bound on `Fs::changed_dirs` (stale entries are dropped when it is reached).
const CHANGED_DIRS_MAX: usize = 4096;

pub(crate) struct Fs {
    /// On `lane`: its requests go out on the worker's own connections when served here.
    pub(crate) client: Client,
    /// The FUSE workers' own connections to the servers.
    pub(crate) lane: Lane,
    pub(crate) rt: Handle,
    /// FUSE worker threads.
    pub(crate) threads: usize,
    /// What the kernel may cache (`cache.rs`).
    pub(crate) policy: Policy,
    pub(crate) files: Mutex<Handles<OpenFile>>,
    /// Open directories: a snapshot of the entries (with `.` and `..`) taken at opendir.
    pub(crate) dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    /// Directories as the server returned them after a create in them through this mount,
    /// and when. A create makes the kernel drop the directory's cached attributes and ask
    /// again (it needs the mode to check the next create); within `attr_ttl`, those answer.
    pub(crate) changed_dirs: Mutex<HashMap<u64, (Inode, Instant)>>,
    /// The inode `change` the kernel's pages of each file are current with ([`Pages`]).
    pub(crate) pages: Mutex<Pages>,
    pub(crate) next_fh: AtomicU64,
    /// Handles the kernel released whose close (`File::finish`: the open count, the last
    /// publish) is not done yet: closes are sent together, up to `CLOSE_DELAY` later, for
    /// one wake-up and one round trip per batch instead of per file (`Fs::close_released`).
    pub(crate) closing: Mutex<Closing>,
    /// Held while a batch of closes is out.
    pub(crate) close_gate: tokio::sync::Mutex<()>,
    /// Namespace changes made through this mount (`dir_changed`).
    pub(crate) dir_changes: AtomicU64,
    /// Sizes and data this mount published or cut (`Fs::changed`).
    pub(crate) file_changes: AtomicU64,
    /// Requests being served on a FUSE worker rather than handed to the runtime.
    pub(crate) inline: AtomicUsize,
    /// Set once the session runs; drops the kernel's cached attributes at open.
    pub(crate) notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Kernel cache times on the servers' promises, unless disabled.
    pub(crate) leases: Option<Arc<Leases>>,
    /// I/O tracing, off unless switched on (`trace.rs`).
    pub(crate) tracing: Tracing,
}

/// A directory's entries as readdir hands them out (name, inode, type), snapshotted at opendir
/// with the attributes that came with them (placed files), and when.
pub(crate) struct Listing {
    pub(crate) dir: u64,
    pub(crate) entries: Vec<(Name, u64, FileType, Option<Inode>)>,
    pub(crate) at: Instant,
    /// Notices heard before it was asked for (its names and attributes are promised).
    pub(crate) since: Option<u64>,
    /// `Fs::dir_changes` before it was asked for: the servers do not tell this mount of its
    /// own changes.
    pub(crate) changes: u64,
    /// `Fs::file_changes` before it was asked for: the attributes that came with it may
    /// predate a size this mount published since.
    pub(crate) file_changes: u64,
}

impl Listing {
    /// Does entry `i` have its attributes at hand (or need none: `.` and `..`)?
    pub(crate) fn ready(&self, i: usize, fresh: bool) -> bool {
        self.entries
            .get(i)
            .is_some_and(|(name, _, _, listed)| is_dot(name) || (fresh && listed.is_some()))
    }
}

pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Released handles whose close is to be sent.
#[derive(Default)]
pub(crate) struct Closing {
    pub(crate) queued: Vec<Arc<OpenFile>>,
}

/// An open file. `sync` is O_SYNC/O_DSYNC: every write is stored before it returns.
pub(crate) struct OpenFile {
    pub(crate) ino: u64,
    pub(crate) file: tokio::sync::Mutex<File>,
    pub(crate) sync: bool,
    /// Opened with `FOPEN_DIRECT_IO`: its writes bypass the kernel's pages of the file.
    pub(crate) direct: bool,
    /// Opened with `O_APPEND` (without the writeback cache): each write goes to the end this
    /// mount knows (`Handles::append`), not where the kernel put it.
    pub(crate) append: bool,
    /// The size this handle's writes made, until they are published (0 when there are none):
    /// `stat` by path on this mount must see it, as POSIX wants, before the close.
    pub(crate) unpublished: AtomicU64,
    /// Another handle of this mount changed the file: what this one read ahead may be old.
    pub(crate) stale: AtomicBool,
    /// The errno of its create, answered ahead, that then failed (0: none): the file is not
    /// on the servers, and every further request through the handle fails with it.
    pub(crate) unmade: AtomicI32,
    /// Where its last write ended, and up to where the kernel's pages of what it wrote were
    /// dropped behind it (`Fs::drop_behind`).
    pub(crate) written_to: AtomicU64,
    pub(crate) dropped_to: AtomicU64,
    /// Who opened it, if tracing was on then: the kernel's own requests through it are theirs.
    pub(crate) opener: Option<Opener>,
}

impl OpenFile {
    /// Why its file is not on the servers, if its create answered ahead failed.
    pub(crate) fn unmade(&self) -> Option<Errno> {
        let e = self.unmade.load(Ordering::Acquire);
        (e != 0).then(|| Errno::from_i32(e))
    }
}

impl Fs {
    /// Runs `f` on this FUSE worker, on its lane.
    pub(crate) fn here<R>(&self, f: impl Future<Output = R>) -> R {
        self.lane.block_on(&self.rt, f)
    }

    /// Attributes with the size that unpublished writes through this mount's handles made.
    pub(crate) fn local(&self, mut i: Inode) -> Inode {
        for f in self.files().of(i.ino) {
            // Acquire: one that reads a flush's 0 also sees its `file_changes`.
            i.size = i.size.max(f.unpublished.load(Ordering::Acquire));
        }
        i
    }

    /// The directory `ino` as this mount last changed it, if that was within `attr_ttl`.
    pub(crate) fn changed_dir(&self, ino: u64) -> Option<Inode> {
        let dirs = self
            .changed_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (dir, at) = dirs.get(&ino)?;
        self.policy.young(at.elapsed()).then(|| dir.clone())
    }

    pub(crate) fn dir_changed(&self, ino: u64, now: Option<Inode>) {
        self.dir_changes.fetch_add(1, Ordering::SeqCst);
        let mut dirs = self
            .changed_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match now {
            Some(dir) => {
                if dirs.len() >= CHANGED_DIRS_MAX {
                    dirs.retain(|_, (_, at)| self.policy.young(at.elapsed()));
                }
                dirs.insert(ino, (dir, Instant::now()));
            }
            // Changed in a way whose outcome we were not told: ask the server next time.
            None => {
                dirs.remove(&ino);
            }
        }
    }

    /// Does a handle of this mount hold `ino` open?
    pub(crate) fn is_open_here(&self, ino: u64) -> bool {
        self.files().of(ino).next().is_some()
    }

    /// Handle `by` changed the bytes of `ino` (it dropped its own read-ahead): the other handles
    /// of this mount drop theirs before their next read. The kernel writes a mapping's pages
    /// back through any handle of the file, even one whose descriptor was closed.
    pub(crate) fn bytes_changed(&self, ino: u64, by: FileHandle) {
        for f in self.files().others(ino, by.0) {
            f.stale.store(true, Ordering::Release);
        }
    }

    /// A truncate sets the size, whatever open handles wrote before it.
    pub(crate) fn truncated(&self, ino: u64, size: u64) {
        let mut files = self.files();
        for f in files.of(ino) {
            f.unpublished.store(0, Ordering::Relaxed);
        }
        files.truncated(ino, size);
    }

    /// Directories whose every name this mount knows, unless leases are off.
    pub(crate) fn complete(&self) -> Option<&Complete> {
        self.leases.as_ref().map(|l| &l.complete)
    }

    /// This mount is about to add `name` to `dir`: called before the request goes out, so
    /// that no look-up meanwhile is answered "absent" without asking.
    pub(crate) fn adding(&self, dir: INodeNo, name: &[u8]) {
        if let Some(c) = self.complete() {
            c.adding(dir.0, name);
        }
    }

    /// Notices heard so far, if answers may be leased: note it before asking.
    pub(crate) fn since(&self) -> Option<u64> {
        self.leases.as_ref().map(|l| l.heard())
    }

    /// May an answer about `keys`, asked for at `since`, be kept for the lease time? If so,
    /// hand it to the kernel before dropping the guard (`Leases::grant`).
    pub(crate) fn grant(
        &self,
        since: Option<u64>,
        keys: impl FnOnce() -> Vec<Key>,
    ) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        match (&self.leases, since) {
            (Some(leases), Some(since)) => leases.grant(since, keys()),
            _ => None,
        }
    }

    /// Hands the kernel an answer about `keys`, asked for at `since`, with the time it may
    /// keep it: the lease time if the servers' promises cover it, else `attr_ttl`.
    pub(crate) fn with_ttl<R>(
        &self,
        since: Option<u64>,
        keys: impl FnOnce() -> Vec<Key>,
        send: impl FnOnce(&Duration) -> R,
    ) -> R {
        let gate = self.grant(since, keys);
        send(self.policy.ttl(gate.is_some()))
    }

    /// Answers a request for a name; `lease`: (`since`, parent, name) to lease it as
    /// `with_ttl` says.
    pub(crate) fn entry(
        &self,
        reply: ReplyEntry,
        r: Result<Inode, Error>,
        lease: Option<(u64, u64, &[u8])>,
    ) {
        match r {
            Ok(i) => {
                let attr = attr(&self.local(i));
                let (since, keys) = match lease {
                    Some((since, dir, name)) => (
                        Some(since),
                        vec![Key::Entry(dir, name.to_vec()), Key::Attr(attr.ino.0)],
                    ),
                    None => (None, Vec::new()),
                };
                self.with_ttl(since, || keys, |ttl| reply.entry(ttl, &attr, Generation(0)));
            }
            Err(e) if e.is(&ErrorCode::NotFound) => {
                let granted = lease.and_then(|(since, dir, name)| {
                    self.grant(Some(since), || vec![Key::Entry(dir, name.to_vec())])
                });
                match self.policy.absent_ttl(granted.is_some()) {
                    // Inode 0: "no such name", for as long as the entry is valid.
                    Some(ttl) => reply.entry(ttl, &absent(), Generation(0)),
                    None => reply.error(Errno::ENOENT),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn attr_reply(&self, reply: ReplyAttr, r: Result<Inode, Error>, since: Option<u64>) {
        match r {
            Ok(i) => {
                let attr = attr(&self.local(i));
                let keys = || vec![Key::Attr(attr.ino.0)];
                self.with_ttl(since, keys, |ttl| reply.attr(ttl, &attr));
            }
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    pub(crate) fn empty(reply: ReplyEmpty, r: Result<(), Error>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn listing(&self, fh: FileHandle) -> Option<Arc<Listing>> {
        let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.get(&fh.0).cloned()
    }

    /// Files and directories are created for the calling process, not for the mount.
    pub(crate) fn caller(&self, req: &Request) -> Client {
        self.client.as_user(req.uid(), req.gid())
    }

    pub(crate) fn files(&self) -> MutexGuard<'_, Handles<OpenFile>> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn file(&self, fh: FileHandle) -> Option<Arc<OpenFile>> {
        self.files().get(fh.0)
    }

    /// The size of `ino` may have fallen below what the kernel holds: it asks for the
    /// attributes again, and drops its pages from `pages_from` on, if given.
    pub(crate) fn size_fell(&self, ino: u64, pages_from: Option<i64>) {
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(INodeNo(ino), pages_from.unwrap_or(-1), 0) {
                tracing::debug!(ino, "dropping what the kernel holds past a lost write: {e}");
            }
        }
    }

    fn pages(&self) -> MutexGuard<'_, Pages> {
        self.pages.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Close-to-open for data: may the kernel keep the pages it cached of `i`, just fetched by
    /// an open? (`Pages::opened`, `Policy::keep_cache`.)
    pub(crate) fn keep_pages(&self, i: &Inode) -> bool {
        let current = self.pages().opened(i.ino, i.change);
        self.policy.keep_cache(current)
    }

    /// This mount changed `i` (its writes also went to the kernel's pages).
    pub(crate) fn changed(&self, i: &Inode) {
        self.file_changes.fetch_add(1, Ordering::SeqCst);
        self.pages().changed(i.ino, i.change);
    }

    /// Did this mount publish or cut no file since `list` was asked for? Else the attributes
    /// that came with it may hold a size older than a request asked after that publish, which
    /// the kernel would take over the size its writes gave the file.
    pub(crate) fn files_unchanged(&self, list: &Listing) -> bool {
        list.file_changes == self.file_changes.load(Ordering::SeqCst)
    }

    /// What a handle's last publish or truncate did to its file.
    pub(crate) fn settle(&self, f: &mut File) {
        if let Some(i) = f.take_changed() {
            self.changed(&i);
        }
    }
}
