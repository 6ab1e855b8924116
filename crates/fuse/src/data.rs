//! File data: read, write and fallocate through an open handle, and what they do to the
//! kernel's pages of the file (`cache.rs` decides).

use crate::cache::{self, AfterWrite};
use crate::convert::errno;
use crate::fs::{Fs, OpenFile};
use crate::guard::{Entered, Settled};
use crate::trace::{ReplyData, ReplyEmpty, ReplyWrite};
use fuser::{Errno, FileHandle, INodeNo, WriteFlags};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Fs {
    pub(crate) fn read(
        self: &Arc<Self>,
        s: Settled,
        (fh, h): (FileHandle, Arc<OpenFile>),
        offset: u64,
        size: u32,
        mut reply: ReplyData,
    ) {
        self.serve(s, move |fs| async move {
            fs.publish_others(fh, h.ino).await;
            let r = {
                let mut f = h.file.lock().await;
                if h.stale.swap(false, Ordering::AcqRel) {
                    f.drop_read_ahead();
                }
                let asked = f.asked();
                let r = f.read_at(offset, size as usize).await;
                reply.servers(f.asked() - asked);
                r
            };
            match r {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    /// Always on this worker: the bytes are borrowed from the kernel's buffer and copied once,
    /// into the stripe buffer (see the crate doc).
    pub(crate) fn write(
        &self,
        entered: Entered,
        (fh, h): (FileHandle, Arc<OpenFile>),
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        mut reply: ReplyWrite,
    ) {
        // Pages of a mapping (or of the writeback cache) written back: those go where they
        // belong, and are the pages themselves.
        let page_writeback = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let appended = (h.append && !page_writeback)
            .then(|| self.files().append(h.ino, data.len() as u64))
            .flatten();
        let offset = appended.unwrap_or(offset);
        let mut asked = 0;
        let r = self.here(async {
            let mut f = h.file.lock().await;
            let before = f.asked();
            let r = async {
                // A small output's bytes wait in the handle until its close, and need not wait
                // for its create answered ahead; what goes to the servers follows the inode there.
                if h.sync || !f.buffers(offset, data.len()) {
                    entered.settle(self, &[h.ino]);
                    if let Some(e) = h.unmade() {
                        return Err(e);
                    }
                }
                let written = f.write_at(offset, data).await;
                if !h.sync {
                    // Also after a failure: a write lost cuts the size back.
                    h.unpublished.store(f.len(), Ordering::Release);
                }
                let n = written.map_err(|e| errno(&e))?;
                self.files().wrote(h.ino, offset + n as u64);
                self.bytes_changed(h.ino, fh);
                if h.sync {
                    let r = f.flush().await;
                    self.settle(&mut f);
                    r.map_err(|e| errno(&e))?;
                }
                Ok::<_, Errno>(n)
            }
            .await;
            asked = f.asked() - before;
            r
        });
        reply.servers(asked);
        let after = self.policy.after_write(h.direct, page_writeback);
        // Not every kernel drops the pages it holds of what a direct write replaced; without
        // this, other handles (and opens keeping the cache) would read old bytes.
        if let (Ok(n), AfterWrite::DropWritten, Some(notifier)) = (&r, after, self.notifier.get()) {
            let len = i64::try_from(*n).unwrap_or(i64::MAX);
            let at = i64::try_from(offset).unwrap_or(i64::MAX);
            if let Err(e) = notifier.inval_inode(INodeNo(h.ino), at, len) {
                tracing::debug!(ino = h.ino, "page invalidation after a direct write: {e}");
            }
        }
        if let (Err(_), Some(at)) = (&r, appended) {
            self.files().unappend(h.ino, at, data.len() as u64);
        }
        match r {
            Ok(n) => {
                reply.written(n as u32);
                if after == AfterWrite::DropBehind {
                    self.drop_behind(&h, fh, offset, n as u64);
                }
            }
            Err(e) => {
                // The size the kernel took from earlier answers may include a write lost
                // since. Attributes only: the kernel holds this write's pages locked.
                self.size_fell(h.ino, None);
                reply.error(e);
            }
        }
    }

    /// Extends the size (mode 0) or does nothing (`KEEP_SIZE`); memory is not reserved ahead,
    /// so a later write can still fail with ENOSPC (docs/SEMANTICS.md). Punching holes and
    /// the other modes are refused with EOPNOTSUPP.
    pub(crate) fn fallocate(
        self: &Arc<Self>,
        s: Settled,
        (fh, h): (FileHandle, Arc<OpenFile>),
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let Some(end) = offset.checked_add(length) else {
            return reply.error(Errno::EFBIG);
        };
        self.serve(s, move |fs| async move {
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
            let flushed = f.flush_for_reader().await;
            // As in `Fs::flushed`: the change counted before the unpublished size goes.
            self.settle(&mut f);
            if flushed {
                h.unpublished.store(0, Ordering::Release);
            }
        }
    }

    /// Drops the kernel's pages behind a sequential writer (`cache::drop_behind`). Only for
    /// the file's one handle on this mount: another might map the pages or read them.
    ///
    /// Called after the write `[offset, offset + n)` was answered: the kernel locks the pages
    /// of a write until its answer, and the pages dropped are all below it anyway.
    fn drop_behind(&self, h: &OpenFile, fh: FileHandle, offset: u64, n: u64) {
        let prev_end = h.written_to.swap(offset + n, Ordering::Relaxed);
        let dropped = h.dropped_to.load(Ordering::Relaxed);
        let Some(range) = cache::drop_behind(prev_end, offset, n, dropped) else {
            return;
        };
        if self.files().others(h.ino, fh.0).next().is_some() {
            return;
        }
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        h.dropped_to.store(range.end, Ordering::Relaxed);
        let (at, len) = (
            i64::try_from(range.start),
            i64::try_from(range.end - range.start),
        );
        if let (Ok(at), Ok(len)) = (at, len) {
            if let Err(e) = notifier.inval_inode(INodeNo(h.ino), at, len) {
                tracing::debug!(ino = h.ino, "dropping pages behind a writer: {e}");
            }
        }
    }
}
