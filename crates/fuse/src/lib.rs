//! Tessera as a FUSE file system. Every operation maps onto the inode-level API of the client
//! library (`tessera_client::Client`); nothing here talks to servers itself.
//!
//! Concurrency: the session runs `threads` FUSE worker threads, each on its own cloned
//! `/dev/fuse` descriptor. A worker serves a request itself (`Fs::here`, `guard.rs`), its
//! metadata requests going out on the worker's own connections (the mount's client is a handle
//! on a `tessera_client::Lane`: the worker reads the answer off the socket, one wake-up fewer
//! per request), on at most half the workers at once
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
//! (`cache::Pages`), so an open after another node's close sees its data and size. A cached name whose
//! file was deleted elsewhere answers ESTALE, on which the kernel looks the name up again (as for
//! NFS). In a directory this mount made, it answers that a name is absent itself, on the
//! servers' promise to tell it of any name another node adds (`complete.rs`).
//!
//! Tracing (`trace.rs`, docs/TRACING.md): off, a request pays one flag read; on, every request
//! becomes a record in a trace file, finished where its answer goes out.

use fuser::{
    FileHandle, Filesystem, INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;
use tessera_client::{Client, Lane};
use tokio::runtime::Handle;

mod attrs;
mod cache;
mod complete;
mod convert;
mod data;
mod dirs;
mod fs;
mod guard;
mod handles;
mod leases;
pub mod mountinfo;
mod names;
mod open;
mod options;
mod trace;

use convert::name;
use fs::Fs;
use leases::Leases;
pub use options::MountOptions;
use tessera_trace::Op;
pub use trace::{control as control_trace, TraceOptions, CONTROL_XATTR};
use trace::{Target, What};

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
    let policy = cache::Policy::new(opts);
    let leases = if policy.leases() {
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
    } else {
        None
    };
    let tracing = trace::Tracing::new(opts, dir.clone());
    if opts.trace.dir.is_some() {
        tracing.start(None)?;
    }
    let lane = Lane::new();
    let fs = TesseraFs(Arc::new(Fs {
        client: client.on_lane(&lane),
        lane,
        rt,
        threads: opts.threads,
        policy,
        files: Mutex::default(),
        dirs: Mutex::default(),
        changed_dirs: Mutex::default(),
        pages: Mutex::default(),
        next_fh: AtomicU64::new(1),
        closing: Mutex::default(),
        close_gate: tokio::sync::Mutex::new(()),
        dir_changes: AtomicU64::new(0),
        file_changes: AtomicU64::new(0),
        inline: AtomicUsize::new(0),
        notifier,
        leases,
        tracing,
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

/// The kernel's requests, each described for its trace record if tracing is on (`trace.rs`),
/// passed through the entry guard (`guard.rs`) and handed, with what the guard returned, to its
/// family: `attrs.rs`, `names.rs`, `dirs.rs`, `data.rs`, `open.rs`. Nothing else happens here.
struct TesseraFs(Arc<Fs>);

impl Filesystem for TesseraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let policy = &self.0.policy;
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_ATOMIC_O_TRUNC;
        if policy.writeback_cache() {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Programs still map files (databases do), also through handles that bypass the page
        // cache; the kernel keeps mapped pages coherent.
        want |= InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        if policy.caches_attrs() {
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

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let reply = self
            .0
            .traced(req, reply, || What::child(Op::Lookup, parent, name));
        self.0
            .lookup(self.0.enter_ahead(), parent, self::name(name), reply);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Getattr, ino).handle(fh.and_then(|fh| self.0.file(fh)))
        });
        self.0.getattr(self.0.enter(&[ino.0]), ino, fh, reply);
    }

    fn setattr(
        &self,
        req: &Request,
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
        let reply = self.0.traced(req, reply, || {
            let w = match size {
                Some(size) => What::new(Op::Truncate, ino).at(size, 0),
                None => What::new(Op::Setattr, ino),
            };
            w.handle(fh.and_then(|fh| self.0.file(fh)))
        });
        let s = self.0.enter(&[ino.0]);
        let attr = convert::set_attr(mode, uid, gid, size, atime, mtime);
        self.0.setattr(s, ino, fh, attr, reply);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let reply = self.0.traced(req, reply, || What::new(Op::Readlink, ino));
        self.0.readlink(self.0.enter(&[ino.0]), ino, reply);
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
        let reply = self.0.traced(req, reply, || {
            What::child(Op::Mknod, parent, name).flags(mode)
        });
        let s = self.0.enter(&[parent.0]);
        let name = self::name(name);
        self.0.mknod(s, req, parent, name, mode, umask, rdev, reply);
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
        let reply = self.0.traced(req, reply, || {
            What::child(Op::Mkdir, parent, name).flags(mode & !umask)
        });
        let s = self.0.enter(&[parent.0]);
        let name = self::name(name);
        self.0.mkdir(s, req, parent, name, mode & !umask, reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let reply = self
            .0
            .traced(req, reply, || What::child(Op::Unlink, parent, name));
        let s = self.0.enter(&[parent.0]);
        self.0.unlink(s, parent, self::name(name), reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let reply = self
            .0
            .traced(req, reply, || What::child(Op::Rmdir, parent, name));
        let s = self.0.enter(&[parent.0]);
        self.0.rmdir(s, parent, self::name(name), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let reply = self.0.traced(req, reply, || {
            What::child(Op::Symlink, parent, name)
                .target(Target::Bytes(target.as_os_str().as_bytes()))
        });
        let s = self.0.enter(&[parent.0]);
        let target = target.as_os_str().as_bytes().to_vec();
        self.0
            .symlink(s, req, parent, self::name(name), target, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let reply = self.0.traced(req, reply, || {
            What::child(Op::Rename, parent, name)
                .target(Target::Child(newparent.0, newname))
                .flags(flags.bits())
        });
        let s = self.0.enter(&[parent.0, newparent.0]);
        let (from, to) = ((parent, self::name(name)), (newparent, self::name(newname)));
        self.0.rename(s, from, to, flags, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Link, ino).target(Target::Child(newparent.0, newname))
        });
        let s = self.0.enter(&[ino.0, newparent.0]);
        self.0.link(s, ino, newparent, self::name(newname), reply);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Open, ino).flags(flags.0 as u32)
        });
        self.0.open(self.0.enter(&[ino.0]), ino, flags, reply);
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
        let reply = self.0.traced(req, reply, || {
            What::child(Op::Create, parent, name).flags(flags as u32)
        });
        let entered = self.0.enter_ahead();
        let name = self::name(name);
        self.0
            .create(entered, req, parent, name, mode & !umask, flags, reply);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.0.enter_open(ino.0, fh) {
            Ok((s, h)) => {
                let reply = self.0.traced(req, reply, || {
                    let h = Some(Arc::clone(&h));
                    What::new(Op::Read, ino).at(offset, size.into()).handle(h)
                });
                self.0.read(s, (fh, h), offset, size, reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.0.enter_write(fh) {
            Ok((e, h)) => {
                let reply = self.0.traced(req, reply, || {
                    let h = Some(Arc::clone(&h));
                    let size = data.len() as u64;
                    What::new(Op::Write, ino)
                        .at(offset, size)
                        .flags(write_flags.bits())
                        .handle(h)
                });
                self.0.write(e, (fh, h), offset, data, write_flags, reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Flush, ino).handle(self.0.file(fh))
        });
        self.0
            .enter_after(ino.0, fh, move |fs, h| fs.flush(h, reply));
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let reply = self.0.traced(req, reply, || {
            let h = self.0.file(fh);
            What::new(Op::Fsync, ino).flags(datasync.into()).handle(h)
        });
        match self.0.enter_open(ino.0, fh) {
            Ok((s, h)) => self.0.fsync(s, h, reply),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Release, ino).handle(self.0.file(fh))
        });
        self.0.release(self.0.enter(&[ino.0]), fh, reply);
    }

    fn destroy(&mut self) {
        self.0.destroy();
        self.0.tracing.stop();
    }

    /// No file here is a terminal or takes device requests: ENOTTY, as a local file answers.
    /// Python asks at every buffered open (is it a terminal?), and the kernel does not remember
    /// a refusal of ioctls as it does of other requests: fuser's default answer also logged a
    /// three-line warning each time, 25 µs per open and a log growing with every file opened.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let reply = self
            .0
            .traced(req, reply, || What::new(Op::Ioctl, ino).flags(cmd));
        reply.error(fuser::Errno::ENOTTY);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.0.enter_open(ino.0, fh) {
            Ok((s, h)) => {
                let reply = self.0.traced(req, reply, || {
                    let h = Some(Arc::clone(&h));
                    What::new(Op::Fallocate, ino)
                        .at(offset, length)
                        .flags(mode as u32)
                        .handle(h)
                });
                self.0.fallocate(s, (fh, h), offset, length, mode, reply)
            }
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let reply = self.0.traced(req, reply, || What::new(Op::Opendir, ino));
        self.0.opendir(self.0.enter(&[ino.0]), ino, reply);
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let reply = self
            .0
            .traced(req, reply, || What::new(Op::Readdir, ino).at(offset, 0));
        match self.0.enter_listing(fh) {
            Ok((_, list)) => Fs::readdir(&list, offset, reply),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        reply: ReplyDirectoryPlus,
    ) {
        let reply = self
            .0
            .traced(req, reply, || What::new(Op::Readdirplus, ino).at(offset, 0));
        match self.0.enter_listing(fh) {
            Ok((s, list)) => self.0.readdirplus(s, list, offset, reply),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let reply = self.0.traced(req, reply, || What::new(Op::Releasedir, ino));
        self.0.releasedir(fh);
        reply.ok();
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let reply = self.0.traced(req, reply, || What::new(Op::Statfs, ino));
        self.0.statfs(self.0.enter(&[]), reply);
    }

    /// Only the root's tracing switch (`trace.rs`); anything else is not supported, but the
    /// answer (unlike ENOSYS) does not make the kernel stop asking, so the switch keeps working.
    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Setxattr, ino).target(Target::Bytes(name.as_bytes()))
        });
        if ino != INodeNo::ROOT || name != CONTROL_XATTR {
            return reply.error(fuser::Errno::EOPNOTSUPP);
        }
        match self.0.tracing.command(req.uid(), value) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Extended attributes are not kept: ENOSYS, after which the kernel asks no more.
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, _size: u32, reply: ReplyXattr) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Getxattr, ino).target(Target::Bytes(name.as_bytes()))
        });
        reply.error(fuser::Errno::ENOSYS);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, _size: u32, reply: ReplyXattr) {
        let reply = self.0.traced(req, reply, || What::new(Op::Listxattr, ino));
        reply.error(fuser::Errno::ENOSYS);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let reply = self.0.traced(req, reply, || {
            What::new(Op::Removexattr, ino).target(Target::Bytes(name.as_bytes()))
        });
        reply.error(fuser::Errno::ENOSYS);
    }
}
