//! Tessera as a FUSE file system. Every operation maps onto the inode-level API of the client
//! library (`tessera_client::Client`); nothing here talks to servers itself.
//!
//! Concurrency: the session runs `threads` FUSE worker threads, each on its own cloned
//! `/dev/fuse` descriptor; a worker runs its request to completion on the shared tokio runtime
//! (`Handle::block_on`), so up to `threads` requests are served at once, and a write's bytes are
//! copied once, from the kernel's buffer into the stripe buffer, with no copy in between.
//!
//! Consistency: close-to-open, as the client gives it: the page cache of a file is dropped at
//! every open (no `KEEP_CACHE`) and attributes are not cached by default (`attr_ttl` 0), so an
//! open after another node's close sees its data and its size.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tessera_client::{
    Client, DirEntry, Error, File, FileKind, Inode, Name, OpenOptions, SetAttr, Timespec,
};
use tokio::runtime::Handle;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// FUSE worker threads (requests served at once).
    pub threads: usize,
    /// How long the kernel may reuse attributes and directory entries. Zero (the default) is
    /// what close-to-open needs here: the kernel keeps cached attributes across an open and
    /// stops reads at the cached size, so a larger value lets a reader miss, for that long,
    /// what another node wrote and closed.
    pub attr_ttl: Duration,
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
            attr_ttl: Duration::ZERO,
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
    let fs = TesseraFs {
        client,
        rt,
        opts: opts.clone(),
        files: Mutex::default(),
        dirs: Mutex::default(),
        next_fh: AtomicU64::new(1),
    };
    let session = fuser::spawn_mount(fs, dir, &cfg)?;
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
fn raise_readahead(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return;
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if let Err(e) = std::fs::write(&path, "1024") {
        tracing::debug!("could not raise read-ahead through {path}: {e}");
    }
}

/// A directory's entries as readdir hands them out: name, inode, type.
type Listing = Vec<(Name, u64, FileType)>;

struct TesseraFs {
    client: Client,
    rt: Handle,
    opts: MountOptions,
    files: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<File>>>>,
    /// Open directories: a snapshot of the entries (with `.` and `..`) taken at opendir.
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn time(t: Timespec) -> SystemTime {
    t.into()
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<Timespec> {
    t.map(|t| match t {
        TimeOrNow::SpecificTime(t) => Timespec::from(t),
        TimeOrNow::Now => Timespec::now(),
    })
}

impl TesseraFs {
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
            rdev: 0,
            blksize: self.client.stripe_size(),
            flags: 0,
        }
    }

    fn entry(&self, reply: ReplyEntry, r: Result<Inode, Error>) {
        match r {
            Ok(i) => reply.entry(&self.opts.attr_ttl, &self.attr(&i), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), Error>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn file(&self, fh: FileHandle) -> Option<Arc<tokio::sync::Mutex<File>>> {
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh.0)
            .cloned()
    }

    fn keep(&self, f: File) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, Arc::new(tokio::sync::Mutex::new(f)));
        fh
    }

    /// Stores everything written through `fh` and publishes its size (close, fsync).
    fn flush_handle(&self, fh: FileHandle, reply: ReplyEmpty) {
        let Some(f) = self.file(fh) else {
            return reply.error(Errno::EBADF);
        };
        Self::empty(
            reply,
            self.rt.block_on(async { f.lock().await.flush().await }),
        );
    }

    fn open_flags(&self) -> FopenFlags {
        if self.opts.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
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
        append: flags & libc::O_APPEND != 0,
        truncate: flags & libc::O_TRUNC != 0,
        create: false,
        create_new: false,
        mode,
    }
}

impl Filesystem for TesseraFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_ATOMIC_O_TRUNC;
        if self.opts.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Ask for each on its own: a kernel that lacks one still gets the others.
        for flag in want.iter() {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self
            .rt
            .block_on(self.client.lookup(parent.0, name.as_bytes()));
        self.entry(reply, r);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self.rt.block_on(async {
            match fh.and_then(|fh| self.file(fh)) {
                // An open handle knows of writes not yet published.
                Some(f) => f.lock().await.metadata().await,
                None => self.client.getattr(ino.0).await,
            }
        });
        match r {
            Ok(i) => reply.attr(&self.opts.attr_ttl, &self.attr(&i)),
            Err(e) => reply.error(errno(&e)),
        }
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
        let r = self.rt.block_on(async {
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
            if let (Some(size), Some(f)) = (size, fh.and_then(|fh| self.file(fh))) {
                // Through the handle, so its buffered writes land before the cut.
                f.lock().await.set_len(size).await?;
                attr.size = None;
            }
            self.client.setattr(ino.0, attr).await
        });
        match r {
            Ok(i) => reply.attr(&self.opts.attr_ttl, &self.attr(&i)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.rt.block_on(self.client.readlink(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Devices, FIFOs and sockets have no place in a workflow's data store.
            return reply.error(Errno::EPERM);
        }
        let r = self.rt.block_on(async {
            let f = self
                .client
                .create(
                    parent.0,
                    name.as_bytes(),
                    mode & !umask,
                    true,
                    &OpenOptions::create(),
                )
                .await?;
            let attr = f.attr();
            f.close().await?;
            Ok(attr)
        });
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self
            .rt
            .block_on(self.client.mkdir(parent.0, name.as_bytes(), mode & !umask));
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            reply,
            self.rt
                .block_on(self.client.unlink(parent.0, name.as_bytes())),
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            reply,
            self.rt
                .block_on(self.client.rmdir(parent.0, name.as_bytes())),
        );
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.rt.block_on(self.client.symlink(
            parent.0,
            name.as_bytes(),
            target.as_os_str().as_bytes(),
        ));
        self.entry(reply, r);
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
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL); // not supported (docs/SEMANTICS.md)
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let r = self.rt.block_on(self.client.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            noreplace,
        ));
        Self::empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self
            .rt
            .block_on(self.client.link(ino.0, newparent.0, newname.as_bytes()));
        self.entry(reply, r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self
            .rt
            .block_on(self.client.open_ino(ino.0, &open_options(flags.0, 0)))
        {
            Ok(f) => reply.opened(FileHandle(self.keep(f)), self.open_flags()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let exclusive = flags & libc::O_EXCL != 0;
        let opts = open_options(flags, mode & !umask);
        match self.rt.block_on(self.client.create(
            parent.0,
            name.as_bytes(),
            mode & !umask,
            exclusive,
            &opts,
        )) {
            Ok(f) => {
                let attr = self.attr(&f.attr());
                let fh = self.keep(f);
                reply.created(
                    &self.opts.attr_ttl,
                    &attr,
                    Generation(0),
                    FileHandle(fh),
                    self.open_flags(),
                );
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(f) = self.file(fh) else {
            return reply.error(Errno::EBADF);
        };
        match self
            .rt
            .block_on(async { f.lock().await.read_at(offset, size as usize).await })
        {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(f) = self.file(fh) else {
            return reply.error(Errno::EBADF);
        };
        match self
            .rt
            .block_on(async { f.lock().await.write_at(offset, data).await })
        {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Called at every close(2) of a descriptor: publish what was written (close-to-open).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.flush_handle(fh, reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.flush_handle(fh, reply);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some(f) = self
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh.0)
        else {
            return reply.error(Errno::EBADF);
        };
        let r = self.rt.block_on(async move {
            match Arc::try_unwrap(f) {
                Ok(m) => m.into_inner().close().await,
                // A request still holds it (cannot happen after release): it closes on drop.
                Err(_) => Ok(()),
            }
        });
        Self::empty(reply, r);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let r = self.rt.block_on(async {
            let dir = self.client.getattr(ino.0).await?;
            let entries = self.client.readdir_all(ino.0).await?;
            let mut list: Listing = Vec::with_capacity(entries.len() + 2);
            list.push((b".".to_vec(), dir.ino, FileType::Directory));
            list.push((b"..".to_vec(), dir.parent.max(1), FileType::Directory));
            list.extend(
                entries
                    .into_iter()
                    .map(|(n, e): (Name, DirEntry)| (n, e.ino, file_type(e.kind))),
            );
            Ok::<_, Error>(list)
        });
        match r {
            Ok(list) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(fh, Arc::new(list));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(list) = self
            .dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&fh.0)
            .cloned()
        else {
            return reply.error(Errno::EBADF);
        };
        for (i, (name, ino, kind)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.rt.block_on(self.client.usage()) {
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
                    self.client.stripe_size(),
                    255,
                    FRSIZE as u32,
                );
            }
            Err(e) => reply.error(errno(&e)),
        }
    }
}
