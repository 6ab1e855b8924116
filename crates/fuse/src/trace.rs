//! Tracing at the mount (docs/TRACING.md): every request the kernel makes, one record each,
//! into a trace file (`tessera_trace`). Off, a request pays one predictable branch
//! ([`Fs::traced`]: a flag read). On, the request is described when it comes in ([`What`]),
//! and the record is finished by the answer: each reply type the handlers use is wrapped
//! ([`Traced`]), so the result, the end time and the inode a name turned out to be are taken
//! where the answer goes out, whichever thread sends it.
//!
//! Who: the process (not the thread) that made the request, with its name, read from /proc
//! once per thread id and kept (a bounded table). A request the kernel makes on its own
//! (pid 0 or a kernel thread: write-back, read-ahead) is attributed through its open handle
//! to the process that opened it ([`Opener`], kept in the handle). What: the inode and the
//! path, relative to the mount, as this mount learnt it from the lookups and creates it
//! answered (a bounded table; a rename does not move what was learnt).
//!
//! Started with the mount (`MountOptions::trace`), or on a running mount through an extended
//! attribute of its root ([`control`]): `start [DIR]` or `stop`, from the mount's owner or root.

use crate::fs::{Fs, OpenFile};
use fuser::{Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, Request};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;
use tessera_trace::{Event, Mode, Op, Writer};

/// The extended attribute of the mount's root that starts and stops tracing.
pub const CONTROL_XATTR: &str = "user.tessera.trace";
/// How long a thread's process (not its name) is taken as known: a thread id is reused only
/// once its thread is gone, and the pids wrap slowly.
const PROC_KNOWN_NS: u64 = 10_000_000_000;
/// Threads whose process is remembered (each with a file open); past it the table starts over.
const PROCS_MAX: usize = 1024;
/// How long a thread's process name is taken as known: a process that execs keeps its pid
/// and changes its name (a shell's child becoming `dd`). Opens, creates and the first read or
/// write through a handle read it afresh.
const PROC_FRESH_NS: u64 = 100_000_000;
/// Inodes whose path is remembered; past it the table starts over.
const PATHS_MAX: usize = 1 << 16;
/// `PF_KTHREAD` in /proc/<pid>/stat's flags.
const PF_KTHREAD: u64 = 0x0020_0000;

/// How the mount traces.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    /// Trace from the mount on, into a new file in this directory; also where `start` with
    /// no directory writes.
    pub dir: Option<PathBuf>,
    /// Memory and flush interval of the writer.
    pub writer: tessera_trace::Options,
}

/// Starts (`start`, `start DIR`) or stops (`stop`) tracing on the running mount at `mount`.
pub fn control(mount: &Path, command: &str) -> std::io::Result<()> {
    let path = std::ffi::CString::new(mount.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let name = std::ffi::CString::new(CONTROL_XATTR).map_err(std::io::Error::other)?;
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            command.as_ptr().cast(),
            command.len(),
            0,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The mount's tracing switch and, while on, the trace being written.
pub(crate) struct Tracing {
    on: AtomicBool,
    active: RwLock<Option<Arc<Active>>>,
    /// Learnt whether or not a trace is being written: a trace started later names the files
    /// the kernel looked up before (it does not look them up again).
    paths: Arc<Paths>,
    opts: TraceOptions,
    mount: PathBuf,
    mode: Mode,
    /// The user the mount runs as: it (or root) may switch tracing.
    owner: u32,
}

/// A trace being written, and what records need that requests do not carry.
struct Active {
    writer: Writer,
    procs: Mutex<HashMap<u32, Proc>>,
    paths: Arc<Paths>,
}

/// Each inode's path, as learnt from the names the mount answered (at most `PATHS_MAX`).
#[derive(Default)]
pub(crate) struct Paths(Mutex<HashMap<u64, Arc<[u8]>>>);

/// The process a thread id belongs to, as read at `read_ns`.
#[derive(Clone)]
struct Proc {
    read_ns: u64,
    pid: u32,
    exe: Option<Arc<[u8]>>,
    /// `/proc/<pid>/comm`, kept open: the name is read again with one `pread` (a process that
    /// execs keeps its pid, and the file shows its new name).
    comm: Option<Arc<std::fs::File>>,
    /// The kernel's own (pid 0, or a kernel thread).
    kernel: bool,
}

/// Who opened a handle, with the path it opened: requests the kernel makes through the handle
/// on its own are attributed to it.
pub(crate) struct Opener {
    pid: u32,
    uid: u32,
    exe: Option<Arc<[u8]>>,
    path: Option<Arc<[u8]>>,
    /// Opened with O_DIRECT: the kernel bypasses its pages for this handle.
    direct: bool,
    /// No read or write came through the handle yet. A shell opens a redirection's file and
    /// then execs the program that writes it: the first read or write reads the name afresh.
    unused: AtomicBool,
}

/// A request as it comes in, described for its record (built only when tracing is on).
pub(crate) struct What<'a> {
    op: Op,
    ino: u64,
    /// A name in a directory: the path is the directory's and the name.
    child: Option<(u64, &'a [u8])>,
    target: Option<Target<'a>>,
    offset: u64,
    size: u64,
    flags: u32,
    handle: Option<Arc<OpenFile>>,
}

/// The second name of a rename or link, or what a symlink points to.
pub(crate) enum Target<'a> {
    Child(u64, &'a OsStr),
    Bytes(&'a [u8]),
}

impl<'a> What<'a> {
    /// A name whose answer tells the inode it names.
    fn learns(&self) -> bool {
        self.child.is_some()
            && matches!(
                self.op,
                Op::Lookup | Op::Mknod | Op::Mkdir | Op::Symlink | Op::Create
            )
    }

    pub(crate) fn new(op: Op, ino: INodeNo) -> Self {
        What {
            op,
            ino: ino.0,
            child: None,
            target: None,
            offset: 0,
            size: 0,
            flags: 0,
            handle: None,
        }
    }

    /// A request about `name` in `parent`.
    pub(crate) fn child(op: Op, parent: INodeNo, name: &'a OsStr) -> Self {
        What {
            child: Some((parent.0, name.as_bytes())),
            ..What::new(op, parent)
        }
    }

    pub(crate) fn at(mut self, offset: u64, size: u64) -> Self {
        (self.offset, self.size) = (offset, size);
        self
    }

    pub(crate) fn flags(mut self, flags: u32) -> Self {
        self.flags = flags;
        self
    }

    pub(crate) fn target(mut self, t: Target<'a>) -> Self {
        self.target = Some(t);
        self
    }

    pub(crate) fn handle(mut self, h: Option<Arc<OpenFile>>) -> Self {
        self.handle = h;
        self
    }
}

impl Tracing {
    /// Off; `opts.trace` says where `start` writes.
    pub(crate) fn new(opts: &crate::MountOptions, mount: PathBuf) -> Self {
        let mode = if opts.writeback_cache {
            Mode::WritebackCache
        } else if opts.direct_io {
            Mode::DirectIo
        } else {
            Mode::PageCache
        };
        Tracing {
            on: AtomicBool::new(false),
            active: RwLock::new(None),
            paths: Arc::default(),
            opts: opts.trace.clone(),
            mount,
            mode,
            // SAFETY: no preconditions.
            owner: unsafe { libc::geteuid() },
        }
    }

    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Starts a trace into a new file in `dir` (else the configured directory); its path.
    pub(crate) fn start(&self, dir: Option<&Path>) -> std::io::Result<PathBuf> {
        let dir = dir.or(self.opts.dir.as_deref()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no trace directory given (mount --trace DIR, or start DIR)",
            )
        })?;
        // A trace written into the mount would trace its own writes.
        if !dir.is_absolute() || dir.starts_with(&self.mount) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the trace directory must be an absolute path outside the mount",
            ));
        }
        let mut active = self.active.write().unwrap_or_else(PoisonError::into_inner);
        if active.is_some() {
            return Err(std::io::Error::from_raw_os_error(libc::EBUSY));
        }
        let source = format!("fuse {}", self.mount.display());
        let (path, writer) = Writer::create_in(dir, source, self.mode, &self.opts.writer)?;
        *active = Some(Arc::new(Active {
            writer,
            procs: Mutex::default(),
            paths: Arc::clone(&self.paths),
        }));
        self.on.store(true, Ordering::Relaxed);
        tracing::info!("tracing to {}", path.display());
        Ok(path)
    }

    /// Stops tracing; the file is finished once the requests in flight are answered.
    pub(crate) fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
        let active = self
            .active
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if active.is_some() {
            tracing::info!("tracing stopped");
        }
    }

    /// A `start`/`stop` from `uid` through the control attribute.
    pub(crate) fn command(&self, uid: u32, value: &[u8]) -> Result<(), Errno> {
        if uid != 0 && uid != self.owner {
            return Err(Errno::EPERM);
        }
        let text = std::str::from_utf8(value)
            .map_err(|_| Errno::EINVAL)?
            .trim();
        let (verb, arg) = text.split_once(' ').unwrap_or((text, ""));
        match (verb, arg.trim()) {
            ("stop", "") => {
                self.stop();
                Ok(())
            }
            ("start", dir) => {
                let dir = (!dir.is_empty()).then(|| Path::new(dir));
                self.start(dir).map(drop).map_err(|e| {
                    tracing::warn!("starting a trace: {e}");
                    e.raw_os_error().map_or(Errno::EINVAL, Errno::from_i32)
                })
            }
            _ => Err(Errno::EINVAL),
        }
    }

    /// The record's beginning, if a trace is being written.
    fn begin(&self, req: &Request, what: What<'_>) -> Option<Span> {
        let active = self
            .active
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()?;
        let start = active.writer.now();
        let learns = what.learns();
        let opener = what.handle.as_ref().and_then(|h| h.opener.as_ref());
        let first_use =
            what.op.is_data() && opener.is_some_and(|o| o.unused.swap(false, Ordering::Relaxed));
        let cached = !first_use && !matches!(what.op, Op::Open | Op::Create | Op::Opendir);
        let proc = active.process(req.pid(), start, cached);
        let (pid, uid, exe, via) = match opener {
            Some(o) if proc.kernel => (o.pid, o.uid, o.exe.clone(), true),
            _ => (proc.pid, req.uid(), proc.exe, false),
        };
        let path = match what.child {
            Some((parent, name)) => Some(active.paths.child_path(parent, name)),
            None => opener
                .and_then(|o| o.path.clone())
                .or_else(|| active.paths.path(what.ino)),
        };
        let target = what.target.map(|t| match t {
            Target::Child(parent, name) => active.paths.child_path(parent, name.as_bytes()),
            Target::Bytes(b) => b.into(),
        });
        let direct = what.handle.as_ref().is_some_and(|h| h.direct);
        let mode = if direct || opener.is_some_and(|o| o.direct) {
            Mode::DirectIo
        } else {
            self.mode
        };
        Some(Span {
            active,
            op: what.op,
            mode,
            via,
            pid,
            uid,
            exe,
            ino: what.ino,
            path,
            target,
            offset: what.offset,
            size: what.size,
            flags: what.flags,
            start,
            learns,
            entries: 0,
            server_size: None,
        })
    }
}

impl Active {
    /// The process of thread `tid` at `now`; `cached`: as read within `PROC_FRESH_NS`.
    fn process(&self, tid: u32, now: u64, cached: bool) -> Proc {
        let known = self.procs().get(&tid).cloned();
        let p = match known {
            Some(p) if cached && now.saturating_sub(p.read_ns) < PROC_FRESH_NS => return p,
            // A thread's process and kind stay; only its name changes (an exec).
            Some(p) if !p.kernel && now.saturating_sub(p.read_ns) < PROC_KNOWN_NS => Proc {
                read_ns: now,
                exe: p.comm.as_deref().and_then(name).or(p.exe),
                ..p
            },
            _ => read_proc(tid, now),
        };
        let mut procs = self.procs();
        if procs.len() >= PROCS_MAX {
            procs.clear();
        }
        procs.insert(tid, p.clone());
        p
    }

    fn procs(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Proc>> {
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Paths {
    fn paths(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<[u8]>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn path(&self, ino: u64) -> Option<Arc<[u8]>> {
        if ino == INodeNo::ROOT.0 {
            return Some(Arc::from(&b"/"[..]));
        }
        self.paths().get(&ino).cloned()
    }

    /// `parent`'s path and `name`; a directory not learnt shows as `?<inode>`.
    fn child_path(&self, parent: u64, name: &[u8]) -> Arc<[u8]> {
        let mut p = match self.path(parent) {
            Some(dir) if &*dir == b"/" => Vec::with_capacity(name.len() + 1),
            Some(dir) => dir.to_vec(),
            None => format!("?{parent}").into_bytes(),
        };
        p.push(b'/');
        p.extend_from_slice(name);
        p.into()
    }

    fn learn(&self, ino: u64, path: Arc<[u8]>) {
        let mut paths = self.paths();
        if paths.len() >= PATHS_MAX {
            paths.clear();
        }
        paths.insert(ino, path);
    }
}

/// The thread's process, its name, and whether it is the kernel's, from /proc.
fn read_proc(tid: u32, now: u64) -> Proc {
    if tid == 0 {
        return Proc {
            read_ns: now,
            pid: 0,
            exe: None,
            comm: None,
            kernel: true,
        };
    }
    let stat = std::fs::read(format!("/proc/{tid}/stat")).unwrap_or_default();
    // "tid (comm) state ppid pgrp session tty tpgid flags ...": comm may hold spaces.
    let after = stat
        .iter()
        .rposition(|&b| b == b')')
        .map_or(&[][..], |i| &stat[i + 1..]);
    let flags: u64 = String::from_utf8_lossy(after)
        .split_whitespace()
        .nth(6)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).unwrap_or_default();
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(tid);
    let kernel = flags & PF_KTHREAD != 0;
    let comm = (!kernel)
        .then(|| std::fs::File::open(format!("/proc/{tgid}/comm")).ok())
        .flatten()
        .map(Arc::new);
    Proc {
        read_ns: now,
        pid: tgid,
        exe: comm.as_deref().and_then(name),
        comm,
        kernel,
    }
}

/// The process name `comm` (its `/proc/<pid>/comm`) shows now.
fn name(comm: &std::fs::File) -> Option<Arc<[u8]>> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 64];
    let n = comm.read_at(&mut buf, 0).ok()?;
    let name = buf[..n].strip_suffix(b"\n").unwrap_or(&buf[..n]);
    (!name.is_empty()).then(|| Arc::from(name))
}

/// A record begun: finished by the answer.
pub(crate) struct Span {
    active: Arc<Active>,
    op: Op,
    mode: Mode,
    via: bool,
    pid: u32,
    uid: u32,
    exe: Option<Arc<[u8]>>,
    ino: u64,
    path: Option<Arc<[u8]>>,
    target: Option<Arc<[u8]>>,
    offset: u64,
    size: u64,
    flags: u32,
    start: u64,
    /// A name's inode, once answered, is to be known by the name's path.
    learns: bool,
    /// Entries a listing answered with.
    entries: u64,
    /// Bytes of file data the servers were asked for (reads, writes, flushes).
    server_size: Option<u64>,
}

impl Span {
    fn end(self, result: i64, ino: Option<u64>) {
        let end_ns = self.active.writer.now();
        if let (Some(ino), Some(path), true) = (ino, &self.path, self.learns && result >= 0) {
            self.active.paths.learn(ino, Arc::clone(path));
        }
        self.active.writer.push(&Event {
            op: self.op,
            mode: self.mode,
            via_handle: self.via,
            pid: self.pid,
            uid: self.uid,
            exe: self.exe.as_deref(),
            ino: ino.unwrap_or(self.ino),
            path: self.path.as_deref(),
            target: self.target.as_deref(),
            offset: self.offset,
            size: self.size,
            server_size: self.server_size,
            flags: self.flags,
            start_ns: self.start,
            end_ns,
            result,
        });
    }
}

/// A reply, and the record it finishes if the request is traced.
pub(crate) struct Traced<R> {
    reply: R,
    span: Option<Span>,
    /// Untraced, a name's path to learn for its inode once answered.
    learn: Option<(Arc<Paths>, Arc<[u8]>)>,
}

impl<R> Traced<R> {
    /// Finishes the record (`result` as a record holds it, `ino` the inode a name turned
    /// out to be), then sends the answer (`send`). In that order: the program's next request
    /// comes after this one's record, so one thread's records are in the order of its calls
    /// (a trace cut short keeps a prefix of each).
    fn answer(self, result: i64, ino: Option<u64>, send: impl FnOnce(R)) {
        let Traced { reply, span, learn } = self;
        if let Some(span) = span {
            span.end(result, ino);
        }
        if let (Some((paths, path)), Some(ino), true) = (learn, ino, result >= 0) {
            paths.learn(ino, path);
        }
        send(reply);
    }

    /// Who opened the file, for its handle (see the module doc).
    pub(crate) fn opener(&self) -> Option<Opener> {
        self.span.as_ref().map(|s| Opener {
            pid: s.pid,
            uid: s.uid,
            exe: s.exe.clone(),
            path: s.path.clone(),
            direct: s.flags as i32 & libc::O_DIRECT != 0,
            unused: AtomicBool::new(true),
        })
    }

    /// The request had the servers asked for `bytes` of file data (see `File::asked`).
    pub(crate) fn servers(&mut self, bytes: u64) {
        if let Some(s) = &mut self.span {
            s.server_size = Some(bytes);
        }
    }

    fn counted(&mut self, added: bool) -> bool {
        if let (false, Some(s)) = (added, &mut self.span) {
            s.entries += 1;
        }
        added
    }
}

fn failed(e: Errno) -> i64 {
    -i64::from(e.code())
}

/// The fuser reply types the handlers answer with, each wrapped.
macro_rules! replies {
    ($($name:ident),*) => {$(
        pub(crate) type $name = Traced<fuser::$name>;
    )*};
}

replies!(
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyEmpty,
    ReplyOpen,
    ReplyWrite,
    ReplyCreate,
    ReplyStatfs,
    ReplyDirectory,
    ReplyDirectoryPlus
);

/// Every reply can be an error.
macro_rules! errors {
    ($($name:ident),*) => {$(
        impl Traced<fuser::$name> {
            pub(crate) fn error(self, e: Errno) {
                self.answer(failed(e), None, |r| r.error(e));
            }
        }
    )*};
}

errors!(
    ReplyEntry,
    ReplyAttr,
    ReplyData,
    ReplyEmpty,
    ReplyOpen,
    ReplyWrite,
    ReplyCreate,
    ReplyStatfs,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyIoctl,
    ReplyXattr
);

impl ReplyEntry {
    pub(crate) fn entry(self, ttl: &Duration, attr: &FileAttr, generation: Generation) {
        // Inode 0: the name is absent (a negative entry the kernel may keep).
        let (result, ino) = match attr.ino.0 {
            0 => (failed(Errno::ENOENT), None),
            ino => (0, Some(ino)),
        };
        self.answer(result, ino, |r| r.entry(ttl, attr, generation));
    }
}

impl ReplyAttr {
    pub(crate) fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.answer(0, None, |r| r.attr(ttl, attr));
    }
}

impl ReplyData {
    pub(crate) fn data(self, data: &[u8]) {
        self.answer(data.len() as i64, None, |r| r.data(data));
    }
}

impl ReplyEmpty {
    pub(crate) fn ok(self) {
        self.answer(0, None, fuser::ReplyEmpty::ok);
    }
}

impl ReplyOpen {
    pub(crate) fn opened(self, fh: FileHandle, flags: FopenFlags) {
        self.answer(0, None, |r| r.opened(fh, flags));
    }
}

impl ReplyWrite {
    pub(crate) fn written(self, size: u32) {
        self.answer(size.into(), None, |r| r.written(size));
    }
}

impl ReplyCreate {
    pub(crate) fn created(
        self,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
        fh: FileHandle,
        flags: FopenFlags,
    ) {
        let ino = attr.ino.0;
        self.answer(0, Some(ino), |r| {
            r.created(ttl, attr, generation, fh, flags);
        });
    }
}

impl ReplyStatfs {
    #[allow(clippy::too_many_arguments)] // the kernel's answer, as fuser takes it
    pub(crate) fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        self.answer(0, None, |r| {
            r.statfs(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize);
        });
    }
}

impl ReplyDirectory {
    /// As fuser's: true when the answer is full (the entry was not added).
    pub(crate) fn add(&mut self, ino: INodeNo, offset: u64, kind: FileType, name: &OsStr) -> bool {
        let full = self.reply.add(ino, offset, kind, name);
        self.counted(full)
    }

    pub(crate) fn ok(self) {
        let n = self.span.as_ref().map_or(0, |s| s.entries as i64);
        self.answer(n, None, fuser::ReplyDirectory::ok);
    }
}

impl ReplyDirectoryPlus {
    /// As fuser's: true when the answer is full (the entry was not added).
    pub(crate) fn add(
        &mut self,
        ino: INodeNo,
        offset: u64,
        name: &OsStr,
        ttl: &Duration,
        attr: &FileAttr,
        generation: Generation,
    ) -> bool {
        let full = self.reply.add(ino, offset, name, ttl, attr, generation);
        self.counted(full)
    }

    pub(crate) fn ok(self) {
        let n = self.span.as_ref().map_or(0, |s| s.entries as i64);
        self.answer(n, None, fuser::ReplyDirectoryPlus::ok);
    }
}

impl Fs {
    /// `reply`, with the record of the request `what` describes begun if tracing is on: off,
    /// this is one flag read and `what` is not called.
    #[inline]
    pub(crate) fn traced<'a, R>(
        &self,
        req: &Request,
        reply: R,
        what: impl FnOnce() -> What<'a>,
    ) -> Traced<R> {
        if self.tracing.on() {
            let span = self.tracing.begin(req, what());
            return Traced {
                reply,
                span,
                learn: None,
            };
        }
        let what = what();
        let paths = &self.tracing.paths;
        let learn = match what.child {
            Some((parent, name)) if what.learns() => {
                Some((Arc::clone(paths), paths.child_path(parent, name)))
            }
            _ => None,
        };
        Traced {
            reply,
            span: None,
            learn,
        }
    }
}
