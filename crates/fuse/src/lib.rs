//! Tessera as a FUSE file system. Every operation maps onto the inode-level API of the client
//! library (`tessera_client::Client`); nothing here talks to servers itself.
//!
//! Concurrency: the session runs `threads` FUSE worker threads, each on its own cloned
//! `/dev/fuse` descriptor. A worker serves a request itself (`Fs::here`), its metadata requests
//! going out on the worker's own connections (the mount's client is a handle on a
//! `tessera_client::Lane`: the worker reads the answer off the socket, one wake-up fewer per
//! request), on at most half the workers at once
//! (`Fs::inline`): requests waiting on a slow server never take every worker. Past that it
//! hands the request, with its reply, to a task on the shared tokio runtime and goes back to the
//! kernel for the next one, so any number of requests are in flight. `write` always runs on the
//! worker: its bytes are borrowed from the kernel's buffer and copied once, into the stripe
//! buffer, and the client returns as soon as they are there (the stripe goes out in the
//! background). `opendir` and `readdirplus` always go to the runtime: a listing comes in large
//! answers, which the runtime's connections read into warm buffers (a worker's first listing on
//! its lane ran 2-4x slower, in first-touch page faults), and `readdirplus` may ask many
//! attributes at once, which a lane would send one at a time.
//!
//! Consistency: close-to-open, as NFS gives it. The kernel may cache names and attributes the
//! servers promised to report changes to for `lease` (60 s; `leases.rs` drops them when told), that
//! a name is absent only on such a promise, the rest for `attr_ttl` (1 s by default, as NFS and
//! libfuse do), which is what makes `stat` fast, but every open fetches fresh attributes from the
//! cluster and tells the kernel to drop the ones it cached; the file's page cache is kept
//! (`KEEP_CACHE`) only while the inode's change counter shows no change but this mount's own
//! (`Fs::pages`), so an open after another node's close sees its data and size. A cached name whose
//! file was deleted elsewhere answers ESTALE, on which the kernel looks the name up again (as for
//! NFS). In a directory this mount made, it answers that a name is absent itself, on the
//! servers' promise to tell it of any name another node adds (`complete.rs`).

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime};
use tessera_client::{
    Client, Error, ErrorCode, File, FileKind, Inode, Lane, Name, OpenOptions, SetAttr, Timespec,
    NAME_MAX,
};
use tokio::runtime::Handle;

mod complete;
mod handles;
mod leases;
pub mod mountinfo;
use handles::Handles;
use leases::{Key, Leases};

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// FUSE worker threads (requests served at once).
    pub threads: usize,
    /// How long the kernel may reuse attributes and directory entries (1 s by default). Opens
    /// revalidate whatever the value; `stat` may show another node's changes this late.
    pub attr_ttl: Duration,
    /// How long the kernel may reuse a name or attributes that a server promised to tell of
    /// changes to (`leases.rs`; 60 s by default): a change elsewhere drops them at once.
    /// Zero: no promises, everything cached for `attr_ttl` only.
    pub lease: Duration,
    /// Let other users in (`allow_other`); permissions are still enforced by the kernel.
    pub allow_other: bool,
    /// Bypass the page cache (every read and write goes to the cluster).
    pub direct_io: bool,
    /// Let the kernel gather small writes in its page cache (faster small writes; the file
    /// system then sees page-sized, reordered writes).
    pub writeback_cache: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            threads: 8,
            attr_ttl: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            allow_other: false,
            direct_io: false,
            writeback_cache: false,
        }
    }
}

/// Mounts `client`'s cluster at `dir` until the returned session is dropped or the file system is
/// unmounted from outside.
pub fn mount(
    client: Client,
    rt: Handle,
    dir: &Path,
    opts: &MountOptions,
) -> std::io::Result<fuser::BackgroundSession> {
    // Resolved before the mount is there: once it is, resolving the path would stat it.
    let dir = &dir.canonicalize()?;
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        MountOption::FSName("tessera".into()),
        MountOption::Subtype("tessera".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if opts.allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    let notifier = Arc::new(OnceLock::new());
    let leases = if opts.lease.is_zero() || opts.attr_ttl.is_zero() {
        None
    } else {
        let (leases, sink) = Leases::start(notifier.clone(), opts.lease)?;
        client.subscribe(sink).map_err(std::io::Error::other)?;
        let (held, client, rt) = (Arc::downgrade(&leases), client.clone(), rt.clone());
        leases.on_recall(move |dir| {
            let (held, client) = (held.clone(), client.clone());
            rt.spawn(async move {
                let Some(l) = held.upgrade() else { return };
                if l.complete.unsettled(dir) {
                    let _ = tokio::task::spawn_blocking(move || l.complete.settle(dir)).await;
                }
                if let Err(e) = client.relinquish(dir).await {
                    tracing::warn!(dir, "giving back a directory's completeness: {e}");
                }
            });
        });
        Some(leases)
    };
    let lane = Lane::new();
    let fs = TesseraFs(Arc::new(Fs {
        client: client.on_lane(&lane),
        lane,
        rt,
        opts: opts.clone(),
        files: Mutex::default(),
        dirs: Mutex::default(),
        changed_dirs: Mutex::default(),
        pages: Mutex::default(),
        next_fh: AtomicU64::new(1),
        closing: Mutex::default(),
        close_gate: tokio::sync::Mutex::new(()),
        dir_changes: AtomicU64::new(0),
        inline: AtomicUsize::new(0),
        notifier,
        leases,
    }));
    let shared = Arc::clone(&fs.0);
    let session = fuser::spawn_mount(fs, dir, &cfg)?;
    let _ = shared.notifier.set(session.notifier());
    raise_readahead(dir);
    Ok(session)
}

/// Unmounts `dir` (also a mount whose process died: "transport endpoint is not connected").
pub fn unmount(dir: &Path) -> std::io::Result<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid NUL-terminated path; MNT_DETACH also frees a mount whose server is gone.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel reads ahead 128 KiB on a FUSE mount by default; stripes are 1 MiB. Best effort.
/// The device comes from the mount table: a stat of `dir` (canonical) would ask this very mount.
fn raise_readahead(dir: &Path) {
    let Some((major, minor)) = mountinfo::devices_on(dir).pop() else {
        return;
    };
    let path = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&path, "1024") {
        tracing::debug!("could not raise read-ahead through {path}: {e}");
    }
}

/// Bound on `Fs::changed_dirs` (stale entries are dropped when it is reached).
const CHANGED_DIRS_MAX: usize = 4096;
/// `st_blksize` of files: Python sizes its buffers by it, so with the stripe size (1 MiB) every
/// small read at a random offset copied 1 MiB (2 K/s, against 65-80 K/s at 128 KiB), and
/// reading back 8 KiB at a time ran at 2 GB/s against 4.7-6 (BENCHMARKS.md). coreutils use
/// 128 KiB buffers for the same trade; the kernel still reads ahead in 1 MiB requests.
const PREFERRED_IO: u32 = 128 << 10;
/// `st_blksize` of directories: glibc sizes `opendir`'s buffer by it (up to 1 MiB), and larger
/// buffers list faster: `scandir` with attributes, 20 000 entries, 165-173 K/s at 1 MiB
/// against 112-123 K/s at 128 KiB.
const PREFERRED_LISTING: u32 = 1 << 20;
/// Bound on `Fs::pages`; past it the map starts over (opens then drop pages once more).
const PAGES_MAX: usize = 1 << 16;
/// How long a released handle's close may wait to be sent with others.
const CLOSE_DELAY: Duration = Duration::from_millis(1);
/// The most entries one readdirplus answer can carry: 1 MiB (the kernel's largest request)
/// of entries of at least 152 bytes.
const LISTED_MAX: usize = (1 << 20) / 152;
/// How long an unmount waits for the closes still queued.
const UNMOUNT_CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Drop-behind of a sequential writer through the page cache: the kernel keeps this much of
/// what it wrote last (for reading back), and the pages before it are dropped this much at a
/// time.
const DROP_BEHIND_KEEP: u64 = 64 << 20;
const DROP_BEHIND_STEP: u64 = 16 << 20;

/// A directory's entries as readdir hands them out (name, inode, type), snapshotted at opendir
/// with the attributes that came with them (placed files), and when.
struct Listing {
    dir: u64,
    entries: Vec<(Name, u64, FileType, Option<Inode>)>,
    at: Instant,
    /// Notices heard before it was asked for (its names and attributes are promised).
    since: Option<u64>,
    /// `Fs::dir_changes` before it was asked for: the servers do not tell this mount of its
    /// own changes.
    changes: u64,
}

impl Listing {
    /// Does entry `i` have its attributes at hand (or need none: `.` and `..`)?
    fn ready(&self, i: usize, fresh: bool) -> bool {
        self.entries
            .get(i)
            .is_some_and(|(name, _, _, listed)| is_dot(name) || (fresh && listed.is_some()))
    }
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// Released handles whose close is to be sent.
#[derive(Default)]
struct Closing {
    queued: Vec<Arc<OpenFile>>,
}

/// An open file. `sync` is O_SYNC/O_DSYNC: every write is stored before it returns.
struct OpenFile {
    ino: u64,
    file: tokio::sync::Mutex<File>,
    sync: bool,
    /// Opened with `FOPEN_DIRECT_IO`: its writes bypass the kernel's pages of the file.
    direct: bool,
    /// Opened with `O_APPEND` (without the writeback cache): each write goes to the end this
    /// mount knows (`Handles::append`), not where the kernel put it.
    append: bool,
    /// The size this handle's writes made, until they are published (0 when there are none):
    /// `stat` by path on this mount must see it, as POSIX wants, before the close.
    unpublished: AtomicU64,
    /// Another handle of this mount changed the file: what this one read ahead may be old.
    stale: AtomicBool,
    /// The errno of its create, answered ahead, that then failed (0: none): the file is not
    /// on the servers, and every further request through the handle fails with it.
    unmade: AtomicI32,
    /// Where its last write ended, and up to where the kernel's pages of what it wrote were
    /// dropped behind it ([`Fs::drop_behind`]).
    written_to: AtomicU64,
    dropped_to: AtomicU64,
}

impl OpenFile {
    /// Why its file is not on the servers, if its create answered ahead failed.
    fn unmade(&self) -> Option<Errno> {
        let e = self.unmade.load(Ordering::Acquire);
        (e != 0).then(|| Errno::from_i32(e))
    }
}

struct TesseraFs(Arc<Fs>);

struct Fs {
    /// On `lane`: its requests go out on the worker's own connections when served here.
    client: Client,
    /// The FUSE workers' own connections to the servers.
    lane: Lane,
    rt: Handle,
    opts: MountOptions,
    files: Mutex<Handles<OpenFile>>,
    /// Open directories: a snapshot of the entries (with `.` and `..`) taken at opendir.
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    /// Directories as the server returned them after a create in them through this mount,
    /// and when. A create makes the kernel drop the directory's cached attributes and ask
    /// again (it needs the mode to check the next create); within `attr_ttl`, those answer.
    changed_dirs: Mutex<HashMap<u64, (Inode, Instant)>>,
    /// For each file whose pages the kernel may hold, the inode `change` they are current
    /// with: set at an open that dropped them, moved on by this mount's own changes (its
    /// writes went through the page cache). An open finding the counter there keeps them.
    pages: Mutex<HashMap<u64, u64>>,
    next_fh: AtomicU64,
    /// Handles the kernel released whose close (`File::finish`: the open count, the last
    /// publish) is not done yet: closes are sent together, up to [`CLOSE_DELAY`] later, for
    /// one wake-up and one round trip per batch instead of per file (`Fs::close_released`).
    closing: Mutex<Closing>,
    /// Held while a batch of closes is out.
    close_gate: tokio::sync::Mutex<()>,
    /// Namespace changes made through this mount (`dir_changed`).
    dir_changes: AtomicU64,
    /// Requests being served on a FUSE worker rather than handed to the runtime.
    inline: AtomicUsize,
    /// Set once the session runs; drops the kernel's cached attributes at open.
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Kernel cache times on the servers' promises, unless disabled.
    leases: Option<Arc<Leases>>,
}

/// Ends an open announced with `Handles::opening` when dropped, once its handle is kept (or
/// it failed).
struct OpenDone<'a>(&'a Fs, u64);

impl Drop for OpenDone<'_> {
    fn drop(&mut self) {
        self.0.files().open_done(self.1);
    }
}

/// What a negative entry carries: only its inode number (0) means anything.
fn absent() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

/// For requests naming an inode the kernel knows: if it is gone, the kernel's name for it is
/// stale (the file was deleted or replaced on another node); ESTALE makes the kernel look the
/// name up again instead of failing.
fn ino_errno(e: &Error) -> Errno {
    if e.is(&tessera_client::ErrorCode::NotFound) {
        Errno::ESTALE
    } else {
        errno(e)
    }
}

fn time(t: Timespec) -> SystemTime {
    t.into()
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice(_) => FileType::CharDevice,
        FileKind::BlockDevice(_) => FileType::BlockDevice,
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<Timespec> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(t) => requested_time(t),
        TimeOrNow::Now => Timespec::now(),
    })
}

/// The kernel's timestamp in a setattr request. The kernel sends a POSIX timespec (a time
/// before 1970 as negative seconds plus positive nanoseconds: -1 s and 0.25 s is -0.75 s), but
/// fuser 0.18 makes it `UNIX_EPOCH - (1 s + 0.25 s)`: the pair is read back out of that. Checked
/// against the kernel by tests/posix/test_mount.py (`test_utime_before_1970`), which fails when
/// a fuser that converts right comes in and this must go.
fn requested_time(t: SystemTime) -> Timespec {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(_) => Timespec::from(t),
        Err(before) => Timespec {
            secs: 0i64
                .checked_sub_unsigned(before.duration().as_secs())
                .unwrap_or(i64::MIN),
            nanos: before.duration().subsec_nanos(),
        },
    }
}

fn name(n: &OsStr) -> Name {
    n.as_bytes().to_vec()
}

impl TesseraFs {
    /// Serves a request on this FUSE worker, its metadata requests on the worker's lane,
    /// while at most half the workers do so (requests waiting on a slow server never take
    /// every worker); past that, on the runtime, the worker returning to the kernel at once.
    fn serve<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Fs>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let fut = f(Arc::clone(&self.0));
        let inline = &self.0.inline;
        if inline.fetch_add(1, Ordering::AcqRel) < self.0.opts.threads / 2 {
            self.0.here(fut);
        } else {
            self.0.rt.spawn(fut);
        }
        inline.fetch_sub(1, Ordering::AcqRel);
    }

    /// FLUSH of handle `fh`, its file on the servers (or its create failed).
    fn flush_made(&self, fh: FileHandle, reply: ReplyEmpty) {
        let Some(h) = self.0.file(fh) else {
            return reply.error(Errno::EBADF);
        };
        if let Some(e) = h.unmade() {
            return reply.error(e);
        }
        // Every close(2) sends one. With nothing written since the last publish it has nothing
        // to wait for: answered here, without the hop to the runtime.
        if h.unpublished.load(Ordering::Relaxed) == 0 {
            if let Ok(mut f) = h.file.try_lock() {
                let r = self.0.here(f.flush());
                return self.0.flushed(&h, f, r, reply);
            }
        }
        self.serve(move |fs| async move { fs.flush_handle(fh, reply).await });
    }

    /// Serves a request on the runtime: for listings (see the module doc).
    fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Fs>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.0.rt.spawn(f(Arc::clone(&self.0)));
    }
}

impl Fs {
    /// Runs `f` on this FUSE worker, on its lane.
    fn here<R>(&self, f: impl Future<Output = R>) -> R {
        self.lane.block_on(&self.rt, f)
    }

    fn attr(&self, i: &Inode) -> FileAttr {
        FileAttr {
            ino: INodeNo(i.ino),
            size: i.size,
            blocks: i.size.div_ceil(512),
            atime: time(i.atime),
            mtime: time(i.mtime),
            ctime: time(i.ctime),
            crtime: time(i.ctime),
            kind: file_type(i.kind),
            perm: (i.mode & 0o7777) as u16,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: match i.kind {
                FileKind::CharDevice(rdev) | FileKind::BlockDevice(rdev) => rdev,
                _ => 0,
            },
            blksize: if i.kind == FileKind::Dir {
                PREFERRED_LISTING
            } else {
                PREFERRED_IO
            },
            flags: 0,
        }
    }

    /// Attributes with the size that unpublished writes through this mount's handles made.
    fn local(&self, mut i: Inode) -> Inode {
        for f in self.files().of(i.ino) {
            i.size = i.size.max(f.unpublished.load(Ordering::Relaxed));
        }
        i
    }

    /// The directory `ino` as this mount last changed it, if that was within `attr_ttl`.
    fn changed_dir(&self, ino: u64) -> Option<Inode> {
        let dirs = self
            .changed_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (dir, at) = dirs.get(&ino)?;
        (at.elapsed() < self.opts.attr_ttl).then(|| dir.clone())
    }

    fn dir_changed(&self, ino: u64, now: Option<Inode>) {
        self.dir_changes.fetch_add(1, Ordering::SeqCst);
        let mut dirs = self
            .changed_dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match now {
            Some(dir) => {
                if dirs.len() >= CHANGED_DIRS_MAX {
                    let ttl = self.opts.attr_ttl;
                    dirs.retain(|_, (_, at)| at.elapsed() < ttl);
                }
                dirs.insert(ino, (dir, Instant::now()));
            }
            // Changed in a way whose outcome we were not told: ask the server next time.
            None => {
                dirs.remove(&ino);
            }
        }
    }

    fn closing(&self) -> std::sync::MutexGuard<'_, Closing> {
        self.closing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues the close of a released handle; true if the queue was empty (the caller sends
    /// it). A handle whose create answered ahead failed has nothing on the servers to close.
    fn queue_close(&self, h: Arc<OpenFile>) -> bool {
        if h.unmade().is_some() {
            if let Ok(mut f) = h.file.try_lock() {
                f.abandon();
            }
            return false;
        }
        let queued = &mut self.closing().queued;
        queued.push(h);
        queued.len() == 1
    }

    /// Sends the closes of released handles, after those already on their way.
    async fn close_released(self: &Arc<Self>) {
        let _gate = self.close_gate.lock().await;
        let batch = std::mem::take(&mut self.closing().queued);
        if batch.is_empty() {
            return;
        }
        let fs = Arc::clone(self);
        // On the runtime's shared connections, all at once (a worker's lane takes them in turn).
        let sent = self.rt.spawn(async move {
            let fs = &fs;
            futures::future::join_all(batch.into_iter().map(|h| async move {
                // In place: a request that finished with the handle may still hold a reference.
                let mut f = h.file.lock().await;
                if let Err(e) = f.finish().await {
                    tracing::warn!(ino = h.ino, "closing a released file: {e}");
                }
                fs.settle(&mut f);
            }))
            .await;
        });
        if let Err(e) = sent.await {
            tracing::warn!("closing released files: {e}");
        }
    }

    /// Does a handle of this mount hold `ino` open?
    fn is_open_here(&self, ino: u64) -> bool {
        self.files().of(ino).next().is_some()
    }

    /// Handle `by` changed the bytes of `ino` (it dropped its own read-ahead): the other handles
    /// of this mount drop theirs before their next read. The kernel writes a mapping's pages
    /// back through any handle of the file, even one whose descriptor was closed.
    fn bytes_changed(&self, ino: u64, by: FileHandle) {
        for f in self.files().others(ino, by.0) {
            f.stale.store(true, Ordering::Release);
        }
    }

    /// A truncate sets the size, whatever open handles wrote before it.
    fn truncated(&self, ino: u64, size: u64) {
        let mut files = self.files();
        for f in files.of(ino) {
            f.unpublished.store(0, Ordering::Relaxed);
        }
        files.truncated(ino, size);
    }

    /// Directories whose every name this mount knows, unless leases are off.
    fn complete(&self) -> Option<&complete::Complete> {
        self.leases.as_ref().map(|l| &l.complete)
    }

    /// Waits for the creates answered ahead in, or of, these inodes (`Complete::settle`):
    /// until they are in, the servers know nothing of them.
    fn await_ahead(&self, inos: &[u64]) {
        if let Some(c) = self.complete() {
            for &ino in inos {
                c.settle(ino);
            }
        }
    }

    /// Waits for the create answered ahead of `ino`, if one is on its way; why handle `fh`
    /// cannot be used, if that create failed.
    fn await_made(&self, ino: u64, fh: FileHandle) -> Option<Errno> {
        self.await_ahead(&[ino]);
        self.file(fh)?.unmade()
    }

    /// Answers a create ahead (`Complete::ahead`), then sends its request on this worker's
    /// lane: the kernel's next request for the file, the close's FLUSH, which waits for it,
    /// meanwhile comes in. One round trip to a server per create is off the application's path.
    fn create_ahead(
        &self,
        parent: u64,
        name: Name,
        (f, request): (
            File,
            impl Future<Output = tessera_client::Result<Option<Inode>>>,
        ),
        flags: i32,
        reply: ReplyCreate,
    ) {
        let since = self.since();
        self.keep_pages(&f.attr());
        let attr = self.attr(&f.attr());
        let ino = f.ino();
        let fh = self.keep(f, flags);
        let open = self.open_flags(flags);
        let keys = || vec![Key::Entry(parent, name.clone()), Key::Attr(ino)];
        self.with_ttl(since, keys, |ttl| {
            reply.created(ttl, &attr, Generation(0), fh, open);
        });
        match self.here(request) {
            Ok(dir) => self.dir_changed(parent, dir),
            Err(e) => {
                tracing::warn!(parent, ino, "a create answered ahead failed: {e}");
                // What close(2) and fsync(2) say: the file was not kept (EIO), unless for
                // want of room.
                let why = match errno(&e) {
                    Errno::ENOSPC => Errno::ENOSPC,
                    _ => Errno::EIO,
                };
                if let Some(h) = self.file(fh) {
                    h.unmade.store(why.code(), Ordering::Release);
                }
                if let Some(l) = &self.leases {
                    l.unmade(parent, name, ino);
                }
            }
        }
        if let Some(c) = self.complete() {
            c.landed(parent, ino);
        }
    }

    /// This mount is about to add `name` to `dir`: called before the request goes out, so
    /// that no look-up meanwhile is answered "absent" without asking.
    fn adding(&self, dir: INodeNo, name: &[u8]) {
        if let Some(c) = self.complete() {
            c.adding(dir.0, name);
        }
    }

    /// Notices heard so far, if answers may be leased: note it before asking.
    fn since(&self) -> Option<u64> {
        self.leases.as_ref().map(|l| l.heard())
    }

    /// May an answer about `keys`, asked for at `since`, be kept for the lease time? If so,
    /// hand it to the kernel before dropping the guard (`Leases::grant`).
    fn grant(
        &self,
        since: Option<u64>,
        keys: impl FnOnce() -> Vec<Key>,
    ) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        match (&self.leases, since) {
            (Some(leases), Some(since)) => leases.grant(since, keys()),
            _ => None,
        }
    }

    /// Attributes of a listing's entry `ino` that needs no request: `.` and `..` (the kernel
    /// takes none from them), or one that came with the listing.
    fn listed_attr(&self, ino: u64, listed: Option<&Inode>) -> FileAttr {
        match listed {
            Some(i) => self.attr(&self.local(i.clone())),
            None => self.attr(&Inode::new(ino, FileKind::Dir, 0o755, 0, 0, 1, Vec::new())),
        }
    }

    /// readdirplus from `start` over the entries whose attributes came with the listing, up to
    /// the first without: names and attributes leased if the promise holds.
    fn reply_listed(&self, list: &Listing, start: usize, mut reply: ReplyDirectoryPlus) {
        let run = &list.entries[start..];
        let run = &run[..(0..run.len())
            .find(|&k| !list.ready(start + k, true))
            .unwrap_or(run.len())
            .min(LISTED_MAX)];
        let keys = || {
            run.iter()
                .filter(|e| !is_dot(&e.0))
                .flat_map(|(name, ino, _, _)| [Key::Entry(list.dir, name.clone()), Key::Attr(*ino)])
                .collect()
        };
        let gate = self.grant(list.since, keys);
        let ttl = if gate.is_some() {
            &self.opts.lease
        } else {
            &self.opts.attr_ttl
        };
        for (k, (name, ino, _, listed)) in run.iter().enumerate() {
            let attr = self.listed_attr(*ino, listed.as_ref());
            let (off, name) = ((start + k + 1) as u64, OsStr::from_bytes(name));
            if reply.add(INodeNo(*ino), off, name, ttl, &attr, Generation(0)) {
                break;
            }
        }
        reply.ok();
        drop(gate);
    }

    /// readdirplus from `start`, fetching the attributes that are not at hand in parallel, a
    /// batch at a time, until the kernel's buffer is full (or, `leasable`, until a run of
    /// entries `reply_listed` can answer).
    async fn reply_fetched(
        &self,
        list: &Listing,
        start: usize,
        fresh: bool,
        leasable: bool,
        mut reply: ReplyDirectoryPlus,
    ) {
        const BATCH: usize = 32;
        let entries = &list.entries;
        let mut next = start;
        while next < entries.len() {
            let batch = &entries[next..entries.len().min(next + BATCH)];
            let attrs = futures::future::join_all(batch.iter().enumerate().map(
                |(k, (_, ino, _, listed))| async move {
                    if list.ready(next + k, fresh) {
                        return Some(self.listed_attr(*ino, listed.as_ref()));
                    }
                    // An entry deleted since opendir is left out.
                    let i = self.client.getattr(*ino).await.ok()?;
                    Some(self.attr(&self.local(i)))
                },
            ))
            .await;
            for (k, ((name, ino, _, _), attr)) in batch.iter().zip(attrs).enumerate() {
                let Some(attr) = attr else { continue };
                let (off, name) = ((next + k + 1) as u64, OsStr::from_bytes(name));
                if reply.add(
                    INodeNo(*ino),
                    off,
                    name,
                    &self.opts.attr_ttl,
                    &attr,
                    Generation(0),
                ) {
                    return reply.ok();
                }
            }
            next += batch.len();
            if leasable && list.ready(next, fresh) {
                break;
            }
        }
        reply.ok();
    }

    /// Hands the kernel an answer about `keys`, asked for at `since`, with the time it may
    /// keep it: the lease time if the servers' promises cover it, else `attr_ttl`.
    fn with_ttl<R>(
        &self,
        since: Option<u64>,
        keys: impl FnOnce() -> Vec<Key>,
        send: impl FnOnce(&Duration) -> R,
    ) -> R {
        match self.grant(since, keys) {
            Some(_gate) => send(&self.opts.lease),
            None => send(&self.opts.attr_ttl),
        }
    }

    /// Answers a request for a name; `lease`: (`since`, parent, name) to lease it as
    /// `with_ttl` says.
    fn entry(&self, reply: ReplyEntry, r: Result<Inode, Error>, lease: Option<(u64, u64, &[u8])>) {
        match r {
            Ok(i) => {
                let attr = self.attr(&self.local(i));
                let (since, keys) = match lease {
                    Some((since, dir, name)) => (
                        Some(since),
                        vec![Key::Entry(dir, name.to_vec()), Key::Attr(attr.ino.0)],
                    ),
                    None => (None, Vec::new()),
                };
                self.with_ttl(since, || keys, |ttl| reply.entry(ttl, &attr, Generation(0)));
            }
            // The kernel may remember that a name does not exist only on the server's promise
            // to tell when it appears: an open after another node's create must find the file.
            Err(e) if e.is(&ErrorCode::NotFound) => {
                let granted = lease.and_then(|(since, dir, name)| {
                    self.grant(Some(since), || vec![Key::Entry(dir, name.to_vec())])
                });
                match granted {
                    // Inode 0: "no such name", for as long as the entry is valid.
                    Some(_gate) => reply.entry(&self.opts.lease, &absent(), Generation(0)),
                    None => reply.error(Errno::ENOENT),
                }
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn attr_reply(&self, reply: ReplyAttr, r: Result<Inode, Error>, since: Option<u64>) {
        match r {
            Ok(i) => {
                let attr = self.attr(&self.local(i));
                let keys = || vec![Key::Attr(attr.ino.0)];
                self.with_ttl(since, keys, |ttl| reply.attr(ttl, &attr));
            }
            Err(e) => reply.error(ino_errno(&e)),
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), Error>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listing(&self, fh: FileHandle) -> Option<Arc<Listing>> {
        let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.get(&fh.0).cloned()
    }

    /// Files and directories are created for the calling process, not for the mount.
    fn caller(&self, req: &Request) -> Client {
        self.client.as_user(req.uid(), req.gid())
    }

    fn files(&self) -> std::sync::MutexGuard<'_, Handles<OpenFile>> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn file(&self, fh: FileHandle) -> Option<Arc<OpenFile>> {
        self.files().get(fh.0)
    }

    fn keep(&self, f: File, flags: i32) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let (ino, end) = (f.ino(), f.len());
        let handle = OpenFile {
            ino,
            file: tokio::sync::Mutex::new(f),
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
            direct: self.open_flags(flags).contains(FopenFlags::FOPEN_DIRECT_IO),
            append: flags & libc::O_APPEND != 0 && !self.opts.writeback_cache,
            unpublished: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            unmade: AtomicI32::new(0),
            written_to: AtomicU64::new(0),
            dropped_to: AtomicU64::new(0),
        };
        let truncated = flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.files().insert(fh, ino, handle, end, truncated);
        FileHandle(fh)
    }

    /// Stores everything written through `fh` and publishes its size (close, fsync).
    async fn flush_handle(&self, fh: FileHandle, reply: ReplyEmpty) {
        let Some(h) = self.file(fh) else {
            return reply.error(Errno::EBADF);
        };
        let mut f = h.file.lock().await;
        let r = f.flush().await;
        self.flushed(&h, f, r, reply);
    }

    /// Answers a flush of `h` that ended with `r`. A flush that failed may have left the size
    /// short of what the kernel was told by the writes' answers (a write lost): it asks for
    /// the attributes again (told before close(2) returns), and the pages it holds from the
    /// size on are dropped once the answer is out (a write may hold them locked until then).
    fn flushed(
        &self,
        h: &OpenFile,
        mut f: tokio::sync::MutexGuard<'_, File>,
        r: Result<(), Error>,
        reply: ReplyEmpty,
    ) {
        self.settle(&mut f);
        h.unpublished.store(0, Ordering::Relaxed);
        let size = f.len();
        drop(f);
        let failed = r.is_err();
        if failed {
            self.size_fell(h.ino, None);
        }
        Self::empty(reply, r);
        if failed {
            self.size_fell(h.ino, i64::try_from(size).ok());
        }
    }

    /// The size of `ino` may have fallen below what the kernel holds: it asks for the
    /// attributes again, and drops its pages from `pages_from` on, if given.
    fn size_fell(&self, ino: u64, pages_from: Option<i64>) {
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(INodeNo(ino), pages_from.unwrap_or(-1), 0) {
                tracing::debug!(ino, "dropping what the kernel holds past a lost write: {e}");
            }
        }
    }

    /// A read through one handle sees what the others on this mount wrote: their writes may
    /// still be buffered in the client, where a read from the cluster would miss them (and
    /// cache the old bytes in the kernel's pages).
    async fn publish_others(&self, fh: FileHandle, ino: u64) {
        let writers: Vec<Arc<OpenFile>> = self
            .files()
            .others(ino, fh.0)
            .filter(|h| h.unpublished.load(Ordering::Relaxed) > 0)
            .cloned()
            .collect();
        for h in writers {
            let mut f = h.file.lock().await;
            // A failure is the writer's to report, at its next write, flush or close.
            if f.flush_for_reader().await {
                h.unpublished.store(0, Ordering::Relaxed);
            }
            self.settle(&mut f);
        }
    }

    /// Write-only handles bypass the page cache too: each write(2) is one request either way
    /// (without the writeback cache), and nothing can read pages through them, so filling
    /// pages would only cost a copy on the writer's path. Read-write handles keep it: direct,
    /// fio's 1 MiB writes ran up to 2x faster, but reading back through the handle (temporary
    /// files, HDF5, SQLite) 8-30x slower (BENCHMARKS.md).
    ///
    /// An appending handle bypasses it as well: its writes land where the mount places them
    /// (`OpenFile::append`), which may not be where the kernel would have put their pages.
    ///
    /// A read-only handle has nothing to publish at close: the kernel need not send FLUSH.
    fn open_flags(&self, flags: i32) -> FopenFlags {
        let access = flags & libc::O_ACCMODE;
        let write_only = access == libc::O_WRONLY && !self.opts.writeback_cache;
        let append = flags & libc::O_APPEND != 0 && !self.opts.writeback_cache;
        let mut out = FopenFlags::empty();
        if self.opts.direct_io || write_only || append {
            out |= FopenFlags::FOPEN_DIRECT_IO;
        }
        if access == libc::O_RDONLY {
            out |= FopenFlags::FOPEN_NOFLUSH;
        }
        out
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u64>> {
        self.pages.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Close-to-open for data: may the kernel keep the pages it cached of `i`, just fetched by
    /// an open? Only if nobody changed the file since they were current; otherwise they are
    /// dropped and current again from here on.
    fn keep_pages(&self, i: &Inode) -> bool {
        let mut pages = self.pages();
        if pages.get(&i.ino) == Some(&i.change) {
            return !self.opts.direct_io;
        }
        if pages.len() >= PAGES_MAX {
            pages.clear();
        }
        pages.insert(i.ino, i.change);
        false
    }

    /// This mount changed `i` (its writes also went to the kernel's pages): the pages stay
    /// current if that change was the only one since they were.
    fn changed(&self, i: &Inode) {
        let mut pages = self.pages();
        if let Some(c) = pages.get_mut(&i.ino) {
            if *c + 1 == i.change {
                *c = i.change;
            } else {
                pages.remove(&i.ino);
            }
        }
    }

    /// What a handle's last publish or truncate did to its file.
    fn settle(&self, f: &mut File) {
        if let Some(i) = f.take_changed() {
            self.changed(&i);
        }
    }

    /// Drop-behind: a handle writing a file from start to end through the page cache leaves
    /// the kernel a copy of everything it wrote, which the servers hold too. Those pages are
    /// fresh memory for every write (faulted in and filled; 0.4-0.6 GB/s for a 4 GiB fio write
    /// against 2.0-2.2 with O_DIRECT, BENCHMARKS.md) and double the node's memory for the
    /// file. Past the last [`DROP_BEHIND_KEEP`] bytes they are dropped, so new writes reuse
    /// them; reading back the start of a long file then asks the servers. Only for the file's
    /// one handle on this mount: another might map the pages or read them.
    ///
    /// Called after the write `[offset, offset + n)` was answered: the kernel locks the pages
    /// of a write until its answer, and the pages dropped are all below it anyway.
    fn drop_behind(&self, h: &OpenFile, fh: FileHandle, offset: u64, n: u64) {
        let sequential = h.written_to.swap(offset + n, Ordering::Relaxed) == offset;
        let dropped = h.dropped_to.load(Ordering::Relaxed);
        let to =
            (offset + n).saturating_sub(DROP_BEHIND_KEEP) / DROP_BEHIND_STEP * DROP_BEHIND_STEP;
        if !sequential || to <= dropped || self.files().others(h.ino, fh.0).next().is_some() {
            return;
        }
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        h.dropped_to.store(to, Ordering::Relaxed);
        let (at, len) = (i64::try_from(dropped), i64::try_from(to - dropped));
        if let (Ok(at), Ok(len)) = (at, len) {
            if let Err(e) = notifier.inval_inode(INodeNo(h.ino), at, len) {
                tracing::debug!(ino = h.ino, "dropping pages behind a writer: {e}");
            }
        }
    }
}

/// Open options from open(2) flags. Reading is always allowed: the kernel may read pages of a
/// write-only file to fill its cache, and permissions were checked by the kernel already.
fn open_options(flags: i32, mode: u32) -> OpenOptions {
    let acc = flags & libc::O_ACCMODE;
    OpenOptions {
        read: true,
        write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
        // The mount places appends itself (`OpenFile::append`); the kernel's writeback of
        // cached pages gives their real offsets.
        append: false,
        truncate: flags & libc::O_TRUNC != 0,
        create: false,
        create_new: false,
        mode,
        ..OpenOptions::default()
    }
}

impl Filesystem for TesseraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_ATOMIC_O_TRUNC;
        if self.0.opts.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Programs still map files (databases do), also through handles that bypass the page
        // cache; the kernel keeps mapped pages coherent.
        want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        if !self.0.opts.attr_ttl.is_zero() {
            // Attributes handed out with a listing are only worth it if the kernel keeps them;
            // AUTO lets it use readdirplus where lookups follow a listing (ls -l, find).
            want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        // Ask for each on its own: a kernel that lacks one still gets the others.
        for flag in want.iter() {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = self::name(name);
        if name.len() <= NAME_MAX && self.0.complete().is_some_and(|c| c.absent(parent.0, &name)) {
            return reply.error(Errno::ENOENT);
        }
        self.0.await_ahead(&[parent.0]);
        self.serve(move |fs| async move {
            let since = fs.since();
            let r = fs.client.lookup(parent.0, &name).await;
            let lease = since.map(|s| (s, parent.0, &name[..]));
            fs.entry(reply, r, lease);
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        self.0.await_ahead(&[ino.0]);
        if let Some(dir) = self.0.changed_dir(ino.0) {
            return self.0.attr_reply(reply, Ok(dir), None);
        }
        self.serve(move |fs| async move {
            let since = fs.since();
            let r = match fh.and_then(|fh| fs.file(fh)) {
                // An open handle knows of writes not yet published.
                Some(h) => h.file.lock().await.metadata().await,
                None => fs.client.getattr(ino.0).await,
            };
            fs.attr_reply(reply, r, since);
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.0.await_ahead(&[ino.0]);
        let mut attr = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
            ctime: Timespec::now(),
            parent: None,
        };
        self.serve(move |fs| async move {
            let r = async {
                if let (Some(size), Some(h)) = (size, fh.and_then(|fh| fs.file(fh))) {
                    // Through the handle, so its buffered writes land before the cut.
                    let mut f = h.file.lock().await;
                    let r = f.set_len(size).await;
                    fs.settle(&mut f);
                    r?;
                    attr.size = None;
                }
                if let Some(size) = size {
                    fs.truncated(ino.0, size);
                    fs.bytes_changed(ino.0, fh.unwrap_or(FileHandle(0)));
                }
                fs.client.setattr(ino.0, attr).await
            }
            .await;
            if let Ok(i) = &r {
                fs.changed(i);
            }
            fs.dir_changed(ino.0, None);
            fs.attr_reply(reply, r, None);
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.serve(move |fs| async move {
            match fs.client.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(ino_errno(&e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.0.await_ahead(&[parent.0]);
        let special = match mode & libc::S_IFMT {
            libc::S_IFREG => None,
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            // Stored so that tools copying a tree keep them; the mount is nodev, so they
            // cannot be opened through it.
            libc::S_IFCHR => Some(FileKind::CharDevice(rdev)),
            libc::S_IFBLK => Some(FileKind::BlockDevice(rdev)),
            _ => return reply.error(Errno::EINVAL),
        };
        let (name, client) = (self::name(name), self.0.caller(req));
        let perm = mode & !umask & 0o7777;
        self.0.adding(parent, &name);
        self.serve(move |fs| async move {
            let r = match special {
                Some(kind) => client.mknod(parent.0, &name, kind, perm).await,
                None => {
                    async {
                        let f = client
                            .create(parent.0, &name, perm, true, &OpenOptions::create())
                            .await?;
                        let attr = f.attr();
                        f.close().await?;
                        Ok(attr)
                    }
                    .await
                }
            };
            fs.dir_changed(parent.0, None);
            fs.entry(reply, r, None);
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.0.await_ahead(&[parent.0]);
        let (name, client) = (self::name(name), self.0.caller(req));
        self.0.adding(parent, &name);
        self.serve(move |fs| async move {
            let cuts = fs.complete().map(complete::Complete::cuts);
            let r = client.mkdir(parent.0, &name, mode & !umask).await;
            if let (Ok(dir), Some(cuts), Some(c)) = (&r, cuts, fs.complete()) {
                c.made(cuts, dir.ino);
            }
            fs.dir_changed(parent.0, None);
            fs.entry(reply, r, None);
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.await_ahead(&[parent.0]);
        let name = self::name(name);
        self.serve(move |fs| async move {
            match fs.client.unlink_in(parent.0, &name).await {
                Ok(gone) => {
                    fs.dir_changed(parent.0, gone.dir);
                    reply.ok();
                }
                Err(e) => {
                    fs.dir_changed(parent.0, None);
                    reply.error(errno(&e));
                }
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.await_ahead(&[parent.0]);
        let name = self::name(name);
        self.serve(move |fs| async move {
            let r = fs.client.rmdir(parent.0, &name).await;
            fs.dir_changed(parent.0, None);
            Fs::empty(reply, r);
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.0.await_ahead(&[parent.0]);
        let (name, client) = (self::name(name), self.0.caller(req));
        let target = target.as_os_str().as_bytes().to_vec();
        self.0.adding(parent, &name);
        self.serve(move |fs| async move {
            let r = client.symlink(parent.0, &name, &target).await;
            fs.dir_changed(parent.0, None);
            fs.entry(reply, r, None);
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.0.await_ahead(&[parent.0, newparent.0]);
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL); // not supported (docs/SEMANTICS.md)
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let (name, newname) = (self::name(name), self::name(newname));
        self.0.adding(newparent, &newname);
        self.serve(move |fs| async move {
            let r = fs
                .client
                .rename(parent.0, &name, newparent.0, &newname, noreplace)
                .await;
            match &r {
                Ok(moved) => {
                    fs.dir_changed(parent.0, moved.dir.clone());
                }
                Err(_) => fs.dir_changed(parent.0, None),
            }
            if newparent != parent {
                fs.dir_changed(newparent.0, None);
            }
            Fs::empty(reply, r.map(drop));
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.0.await_ahead(&[ino.0, newparent.0]);
        let newname = self::name(newname);
        self.0.adding(newparent, &newname);
        self.serve(move |fs| async move {
            let r = fs.client.link(ino.0, newparent.0, &newname).await;
            fs.dir_changed(newparent.0, None);
            fs.entry(reply, r, None);
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.0.await_ahead(&[ino.0]);
        self.0.files().opening(ino.0);
        self.serve(move |fs| async move {
            let opened = fs.client.open_ino(ino.0, &open_options(flags.0, 0)).await;
            let _done = OpenDone(&fs, ino.0);
            match opened {
                // No name leads to it any more, and no descriptor here holds it: the kernel's
                // name for it is stale (the file was removed or replaced elsewhere while a
                // handle, or a close still on its way, kept it). ESTALE makes the kernel look
                // the name up again, as when the file is gone. (A descriptor of this mount
                // reopening it through /proc still can.)
                Ok(f) if f.attr().nlink == 0 && !fs.is_open_here(ino.0) => {
                    if let Err(e) = f.close().await {
                        tracing::debug!(ino = ino.0, "closing a stale open: {e}");
                    }
                    reply.error(Errno::ESTALE);
                }
                Ok(f) => {
                    if !fs.opts.attr_ttl.is_zero() {
                        // Close-to-open: the size and times the kernel cached may predate
                        // another node's close. Offset -1: attributes only.
                        if let Some(n) = fs.notifier.get() {
                            if let Err(e) = n.inval_inode(ino, -1, 0) {
                                tracing::debug!(ino = ino.0, "attribute invalidation: {e}");
                            }
                        }
                    }
                    let mut flags_out = fs.open_flags(flags.0);
                    if fs.keep_pages(&f.attr()) {
                        flags_out |= FopenFlags::FOPEN_KEEP_CACHE;
                    }
                    reply.opened(fs.keep(f, flags.0), flags_out);
                }
                Err(e) => reply.error(ino_errno(&e)),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (name, client) = (self::name(name), self.0.caller(req));
        let exclusive = flags & libc::O_EXCL != 0;
        let mode = mode & !umask;
        // Its request is then made on this worker, so only while half the workers are free,
        // as `serve` does (see there).
        let inline = &self.0.inline;
        let worker_free = inline.fetch_add(1, Ordering::AcqRel) < self.0.opts.threads / 2;
        let opts = open_options(flags, mode);
        let ahead = (self.0.complete())
            .filter(|c| worker_free && c.absent(parent.0, &name))
            .map(|c| (c, client.create_ahead(parent.0, &name, mode, &opts)));
        match ahead {
            Some((_, Err(e))) => {
                inline.fetch_sub(1, Ordering::AcqRel);
                return reply.error(errno(&e));
            }
            Some((c, Ok(made))) if c.ahead(parent.0, &name, made.0.ino()) => {
                self.0.create_ahead(parent.0, name, made, flags, reply);
                inline.fetch_sub(1, Ordering::AcqRel);
                return;
            }
            // The directory's promise was recalled meanwhile: ask the server.
            Some((_, Ok((mut f, _)))) => f.abandon(),
            None => {}
        }
        inline.fetch_sub(1, Ordering::AcqRel);
        self.0.await_ahead(&[parent.0]);
        self.0.adding(parent, &name);
        self.serve(move |fs| async move {
            let since = fs.since();
            match client
                .create_in(parent.0, &name, mode, exclusive, &opts)
                .await
            {
                Ok((f, dir)) => {
                    fs.dir_changed(parent.0, dir);
                    fs.keep_pages(&f.attr());
                    let attr = fs.attr(&f.attr());
                    let fh = fs.keep(f, flags);
                    let keys = || vec![Key::Entry(parent.0, name.clone()), Key::Attr(attr.ino.0)];
                    let open = fs.open_flags(flags);
                    fs.with_ttl(since, keys, |ttl| {
                        reply.created(ttl, &attr, Generation(0), fh, open);
                    });
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if let Some(e) = self.0.await_made(ino.0, fh) {
            return reply.error(e);
        }
        self.serve(move |fs| async move {
            let Some(h) = fs.file(fh) else {
                return reply.error(Errno::EBADF);
            };
            fs.publish_others(fh, h.ino).await;
            let r = {
                let mut f = h.file.lock().await;
                if h.stale.swap(false, Ordering::AcqRel) {
                    f.drop_read_ahead();
                }
                f.read_at(offset, size as usize).await
            };
            match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(h) = self.0.file(fh) else {
            return reply.error(Errno::EBADF);
        };
        if let Some(e) = h.unmade() {
            return reply.error(e);
        }
        // Not a page of a mapping written back: those go where they belong.
        let appended = (h.append && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE))
            .then(|| self.0.files().append(h.ino, data.len() as u64))
            .flatten();
        let offset = appended.unwrap_or(offset);
        let r = self.0.here(async {
            let mut f = h.file.lock().await;
            // A small output's bytes wait in the handle until its close, and need not wait
            // for its create answered ahead; what goes to the servers follows the inode there.
            if h.sync || !f.buffers(offset, data.len()) {
                self.0.await_ahead(&[ino.0]);
                if let Some(e) = h.unmade() {
                    return Err(e);
                }
            }
            let written = f.write_at(offset, data).await;
            if !h.sync {
                // Also after a failure: a write lost cuts the size back.
                h.unpublished.store(f.len(), Ordering::Relaxed);
            }
            let n = written.map_err(|e| errno(&e))?;
            self.0.files().wrote(h.ino, offset + n as u64);
            self.0.bytes_changed(h.ino, fh);
            if h.sync {
                let r = f.flush().await;
                self.0.settle(&mut f);
                r.map_err(|e| errno(&e))?;
            }
            Ok::<_, Errno>(n)
        });
        // Not every kernel drops the pages it holds of what a direct write replaced; without
        // this, other handles (and opens keeping the cache) would read old bytes. Not for the
        // writeback of pages (of a mapping): those are the pages, and one of them is waiting
        // for this very reply.
        let direct = h.direct && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        if let (Ok(n), true, Some(notifier)) = (&r, direct, self.0.notifier.get()) {
            let len = i64::try_from(*n).unwrap_or(i64::MAX);
            let at = i64::try_from(offset).unwrap_or(i64::MAX);
            if let Err(e) = notifier.inval_inode(INodeNo(h.ino), at, len) {
                tracing::debug!(ino = h.ino, "page invalidation after a direct write: {e}");
            }
        }
        if let (Err(_), Some(at)) = (&r, appended) {
            self.0.files().unappend(h.ino, at, data.len() as u64);
        }
        match r {
            Ok(n) => {
                reply.written(n as u32);
                let cached = !h.direct && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
                if cached && !self.0.opts.writeback_cache {
                    self.0.drop_behind(&h, fh, offset, n as u64);
                }
            }
            Err(e) => {
                // The size the kernel took from earlier answers may include a write lost
                // since. Attributes only: the kernel holds this write's pages locked.
                self.0.size_fell(h.ino, None);
                reply.error(e);
            }
        }
    }

    /// Called at every close(2) of a descriptor: publish what was written (close-to-open).
    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close right after a create answered ahead (most creates) is answered by the worker
        // that lands the create; this one goes back to the kernel meanwhile.
        let me = TesseraFs(Arc::clone(&self.0));
        let then = move || me.flush_made(fh, reply);
        match self.0.complete() {
            Some(c) => c.after(ino.0, then),
            None => then(),
        }
    }

    /// fsync and fdatasync alike: the servers keep data in memory, so "stored" means stored
    /// there, with the size published.
    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(e) = self.0.await_made(ino.0, fh) {
            return reply.error(e);
        }
        self.serve(move |fs| async move { fs.flush_handle(fh, reply).await });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.await_ahead(&[ino.0]);
        let Some(h) = self.0.files().remove(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // close(2) returned at the FLUSH, and the kernel does not wait for this answer.
        reply.ok();
        if self.0.queue_close(h) {
            let fs = Arc::clone(&self.0);
            self.0.rt.spawn(async move {
                tokio::time::sleep(CLOSE_DELAY).await;
                fs.close_released().await;
            });
        }
    }

    fn destroy(&mut self) {
        let fs = &self.0;
        // The kernel may end the session before it released every handle: a detached mount's
        // last RELEASE is cut off when its last file closes. Those closes go out too, or the
        // servers would count the files open for good.
        let unreleased = fs.files().take_all();
        for h in unreleased {
            fs.queue_close(h);
        }
        // Bounded: with servers gone, an unmount must not wait out their failover. Closes not
        // sent by then leave open counts behind, as a mount that died does.
        let sent = fs.rt.block_on(async {
            tokio::time::timeout(UNMOUNT_CLOSE_WAIT, fs.close_released()).await
        });
        if sent.is_err() {
            tracing::warn!("unmounting before the last closes were answered");
        }
    }

    /// No file here is a terminal or takes device requests: ENOTTY, as a local file answers.
    /// Python asks at every buffered open (is it a terminal?), and the kernel does not remember
    /// a refusal of ioctls as it does of other requests: fuser's default answer also logged a
    /// three-line warning each time, 25 µs per open and a log growing with every file opened.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    /// Extends the size (mode 0) or does nothing (`KEEP_SIZE`); memory is not reserved ahead,
    /// so a later write can still fail with ENOSPC (docs/SEMANTICS.md). Punching holes and
    /// the other modes are refused with EOPNOTSUPP.
    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if let Some(e) = self.0.await_made(ino.0, fh) {
            return reply.error(e);
        }
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let Some(end) = offset.checked_add(length) else {
            return reply.error(Errno::EFBIG);
        };
        self.serve(move |fs| async move {
            let Some(h) = fs.file(fh) else {
                return reply.error(Errno::EBADF);
            };
            let r = async {
                let mut f = h.file.lock().await;
                if mode == 0 && end > f.len() {
                    let r = f.set_len(end).await;
                    fs.settle(&mut f);
                    r?;
                    fs.bytes_changed(h.ino, fh);
                }
                Ok(())
            }
            .await;
            Fs::empty(reply, r);
        });
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.0.await_ahead(&[ino.0]);
        self.spawn(move |fs| async move {
            let r = async {
                let dir = fs.client.getattr(ino.0).await?;
                let (since, changes) = (fs.since(), fs.dir_changes.load(Ordering::SeqCst));
                let entries = fs.client.readdir_all(ino.0).await?;
                let mut list = Vec::with_capacity(entries.len() + 2);
                list.push((b".".to_vec(), dir.ino, FileType::Directory, None));
                list.push((b"..".to_vec(), dir.parent.max(1), FileType::Directory, None));
                list.extend(
                    entries
                        .into_iter()
                        .map(|(n, e, inode)| (n, e.ino, file_type(e.kind), inode)),
                );
                let list = Listing {
                    dir: ino.0,
                    entries: list,
                    at: Instant::now(),
                    since,
                    changes,
                };
                Ok::<_, Error>(list)
            }
            .await;
            match r {
                Ok(list) => {
                    let fh = fs.next_fh.fetch_add(1, Ordering::Relaxed);
                    fs.dirs
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(fh, Arc::new(list));
                    reply.opened(FileHandle(fh), FopenFlags::empty());
                }
                Err(e) => reply.error(ino_errno(&e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(list) = self.0.listing(fh) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (name, ino, kind, _)) in list.entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    /// readdir with each entry's attributes (asked for when attributes are cached): `ls -l`
    /// and `find` then need no lookup per entry. Attributes that came with the listing
    /// (placed files) serve while they are as young as the kernel may keep them, or while the
    /// servers' promise on them holds (no notice, and no change made here, since the
    /// listing): a run of such entries is then answered leased (`Fs::reply_listed`). Others
    /// are fetched in parallel, a batch at a time (`Fs::reply_fetched`).
    fn readdirplus(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let Some(list) = self.0.listing(fh) else {
            return reply.error(Errno::EBADF);
        };
        let fs = &self.0;
        let unchanged = list.changes == fs.dir_changes.load(Ordering::SeqCst);
        let leasable = unchanged && list.since.is_some() && list.since == fs.since();
        let fresh = leasable || list.at.elapsed() < fs.opts.attr_ttl;
        let start = (offset as usize).min(list.entries.len());
        self.spawn(move |fs| async move {
            if leasable && list.ready(start, fresh) {
                fs.reply_listed(&list, start, reply);
            } else {
                fs.reply_fetched(&list, start, fresh, leasable, reply).await;
            }
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0
            .dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.serve(move |fs| async move {
            match fs.client.usage().await {
                Ok(u) => {
                    const FRSIZE: u64 = 4096;
                    let free = u.capacity.saturating_sub(u.used) / FRSIZE;
                    // Inodes are not preallocated: report what the free memory could hold.
                    let ffree = u.capacity.saturating_sub(u.used) / 512;
                    reply.statfs(
                        u.capacity / FRSIZE,
                        free,
                        free,
                        u.inodes + ffree,
                        ffree,
                        fs.client.stripe_size(),
                        255,
                        FRSIZE as u32,
                    );
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What fuser 0.18 hands `setattr` for the kernel's (secs, nanos).
    fn as_fuser_gives(secs: i64, nanos: u32) -> SystemTime {
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(secs.unsigned_abs(), nanos)
        } else {
            SystemTime::UNIX_EPOCH - Duration::new(secs.unsigned_abs(), nanos)
        }
    }

    #[test]
    fn a_quarter_second_before_1970() {
        // touch -d "1969-12-31 23:59:59.25"
        let t = requested_time(as_fuser_gives(-1, 250_000_000));
        assert_eq!((t.secs, t.nanos), (-1, 250_000_000));
    }

    proptest! {
        /// Times set through the mount are stored as the kernel sent them and given back to
        /// it unchanged, before and after 1970.
        #[test]
        fn set_times_round_trip(
            secs in -(1i64 << 40)..(1i64 << 40),
            nanos in 0u32..1_000_000_000,
        ) {
            let stored = requested_time(as_fuser_gives(secs, nanos));
            prop_assert_eq!((stored.secs, stored.nanos), (secs, nanos));
            prop_assert_eq!(Timespec::from(time(stored)), stored);
        }
    }
}
