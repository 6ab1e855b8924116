//! Open files: open and create (creates answered ahead included), flush and fsync, release,
//! and the closes of released handles, sent in batches.

use crate::convert::{attr, errno, ino_errno, open_options};
use crate::fs::{Fs, OpenFile};
use crate::guard::{Entered, Settled};
use crate::leases::Key;
use crate::trace::{Opener, ReplyCreate, ReplyEmpty, ReplyOpen};
use fuser::{Errno, FileHandle, FopenFlags, Generation, INodeNo, OpenFlags, Request};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;
use tessera_client::{Error, File, Inode, Name};

/// How long a released handle's close may wait to be sent with others.
const CLOSE_DELAY: Duration = Duration::from_millis(1);
/// How long an unmount waits for the closes still queued.
const UNMOUNT_CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Ends an open announced with `Handles::opening` when dropped, once its handle is kept (or
/// it failed).
struct OpenDone<'a>(&'a Fs, u64);

impl Drop for OpenDone<'_> {
    fn drop(&mut self) {
        self.0.files().open_done(self.1);
    }
}

impl Fs {
    pub(crate) fn open(
        self: &Arc<Self>,
        s: Settled,
        ino: INodeNo,
        flags: OpenFlags,
        reply: ReplyOpen,
    ) {
        self.files().opening(ino.0);
        self.serve(s, move |fs| async move {
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
                    if fs.policy.caches_attrs() {
                        // Close-to-open: the size and times the kernel cached may predate
                        // another node's close. Offset -1: attributes only.
                        if let Some(n) = fs.notifier.get() {
                            if let Err(e) = n.inval_inode(ino, -1, 0) {
                                tracing::debug!(ino = ino.0, "attribute invalidation: {e}");
                            }
                        }
                    }
                    let mut flags_out = fs.policy.open_flags(flags.0);
                    if fs.keep_pages(&f.attr()) {
                        flags_out |= FopenFlags::FOPEN_KEEP_CACHE;
                    }
                    let fh = fs.keep(f, flags.0, reply.opener());
                    reply.opened(fh, flags_out);
                }
                Err(e) => reply.error(ino_errno(&e)),
            }
        });
    }

    /// Answered ahead, before the server has the file, where this mount knows every name of
    /// the directory (`complete.rs`) and a worker may send the request itself; else asked.
    #[allow(clippy::too_many_arguments)] // the kernel's request, as fuser hands it
    pub(crate) fn create(
        self: &Arc<Self>,
        entered: Entered,
        req: &Request,
        parent: INodeNo,
        name: Name,
        mode: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let client = self.caller(req);
        let exclusive = flags & libc::O_EXCL != 0;
        // Its request is then made on this worker, so only while it may serve one there.
        let worker = self.on_worker();
        let opts = open_options(flags, mode);
        let ahead = (self.complete())
            .filter(|c| worker.free && c.absent(parent.0, &name))
            .map(|c| (c, client.create_ahead(parent.0, &name, mode, &opts)));
        match ahead {
            Some((_, Err(e))) => return reply.error(errno(&e)),
            Some((c, Ok(made))) if c.ahead(parent.0, &name, made.0.ino()) => {
                return self.create_ahead(parent.0, name, made, flags, reply);
            }
            // The directory's promise was recalled meanwhile: ask the server.
            Some((_, Ok((mut f, _)))) => f.abandon(),
            None => {}
        }
        drop(worker);
        let s = entered.settle(self, &[parent.0]);
        self.adding(parent, &name);
        self.serve(s, move |fs| async move {
            let since = fs.since();
            match client
                .create_in(parent.0, &name, mode, exclusive, &opts)
                .await
            {
                Ok((f, dir)) => {
                    fs.dir_changed(parent.0, dir);
                    fs.keep_pages(&f.attr());
                    let attr = attr(&f.attr());
                    let fh = fs.keep(f, flags, reply.opener());
                    let keys = || vec![Key::Entry(parent.0, name.clone()), Key::Attr(attr.ino.0)];
                    let open = fs.policy.open_flags(flags);
                    fs.with_ttl(since, keys, |ttl| {
                        reply.created(ttl, &attr, Generation(0), fh, open);
                    });
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
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
        let attr = attr(&f.attr());
        let ino = f.ino();
        let fh = self.keep(f, flags, reply.opener());
        let open = self.policy.open_flags(flags);
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

    fn keep(&self, f: File, flags: i32, opener: Option<Opener>) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let (ino, end) = (f.ino(), f.len());
        let handle = OpenFile {
            ino,
            file: tokio::sync::Mutex::new(f),
            sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
            direct: (self.policy.open_flags(flags)).contains(FopenFlags::FOPEN_DIRECT_IO),
            append: self.policy.places_appends(flags),
            unpublished: AtomicU64::new(0),
            stale: AtomicBool::new(false),
            unmade: AtomicI32::new(0),
            written_to: AtomicU64::new(0),
            dropped_to: AtomicU64::new(0),
            opener,
        };
        let truncated = flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.files().insert(fh, ino, handle, end, truncated);
        FileHandle(fh)
    }

    /// Called at every close(2) of a descriptor: publish what was written (close-to-open).
    /// `h`: the handle, its file on the servers, or why not (`Fs::enter_after`).
    pub(crate) fn flush(
        self: &Arc<Self>,
        h: Result<(Settled, Arc<OpenFile>), Errno>,
        reply: ReplyEmpty,
    ) {
        let (s, h) = match h {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        // Every close(2) sends one. With nothing written since the last publish it has nothing
        // to wait for: answered here, without the hop to the runtime.
        if h.unpublished.load(Ordering::Relaxed) == 0 {
            if let Ok(mut f) = h.file.try_lock() {
                let asked = f.asked();
                let r = self.here(f.flush());
                return self.flushed(&h, f, (r, asked), reply);
            }
        }
        self.serve(s, move |fs| async move { fs.flush_handle(&h, reply).await });
    }

    /// fsync and fdatasync alike: the servers keep data in memory, so "stored" means stored
    /// there, with the size published.
    pub(crate) fn fsync(self: &Arc<Self>, s: Settled, h: Arc<OpenFile>, reply: ReplyEmpty) {
        self.serve(s, move |fs| async move { fs.flush_handle(&h, reply).await });
    }

    /// Stores everything written through `h` and publishes its size (close, fsync).
    async fn flush_handle(&self, h: &OpenFile, reply: ReplyEmpty) {
        let mut f = h.file.lock().await;
        let asked = f.asked();
        let r = f.flush().await;
        self.flushed(h, f, (r, asked), reply);
    }

    /// Answers a flush of `h` that ended with `r`, `asked` being what the handle had asked of
    /// the servers before it (for the trace). A flush that failed may have left the size
    /// short of what the kernel was told by the writes' answers (a write lost): it asks for
    /// the attributes again (told before close(2) returns), and the pages it holds from the
    /// size on are dropped once the answer is out (a write may hold them locked until then).
    fn flushed(
        &self,
        h: &OpenFile,
        mut f: tokio::sync::MutexGuard<'_, File>,
        (r, asked): (Result<(), Error>, u64),
        mut reply: ReplyEmpty,
    ) {
        reply.servers(f.asked() - asked);
        // In this order, Release: a listing's attributes are not taken without this size
        // once the unpublished size is gone (`Fs::files_unchanged`).
        self.settle(&mut f);
        h.unpublished.store(0, Ordering::Release);
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

    pub(crate) fn release(self: &Arc<Self>, _: Settled, fh: FileHandle, reply: ReplyEmpty) {
        let Some(h) = self.files().remove(fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // close(2) returned at the FLUSH, and the kernel does not wait for this answer.
        reply.ok();
        if self.queue_close(h) {
            let fs = Arc::clone(self);
            self.rt.spawn(async move {
                tokio::time::sleep(CLOSE_DELAY).await;
                fs.close_released().await;
            });
        }
    }

    /// The session ends: closes every handle still open. The kernel may end it before it
    /// released every handle: a detached mount's last RELEASE is cut off when its last file
    /// closes. Those closes go out too, or the servers would count the files open for good.
    pub(crate) fn destroy(self: &Arc<Self>) {
        let unreleased = self.files().take_all();
        for h in unreleased {
            self.queue_close(h);
        }
        // Bounded: with servers gone, an unmount must not wait out their failover. Closes not
        // sent by then leave open counts behind, as a mount that died does.
        let sent = self.rt.block_on(async {
            tokio::time::timeout(UNMOUNT_CLOSE_WAIT, self.close_released()).await
        });
        if sent.is_err() {
            tracing::warn!("unmounting before the last closes were answered");
        }
    }

    fn closing(&self) -> MutexGuard<'_, crate::fs::Closing> {
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
}
