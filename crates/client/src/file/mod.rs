//! An open file.
//!
//! Writes: small sequential writes collect in one stripe-sized buffer and leave as one request
//! when the stripe is full or the pattern breaks; each goes to every complete replica of its
//! partition at once. Up to `write_window` stripe writes are in flight at once, spread over all
//! servers. Requests are queued in program order, and a handle's writes to one stripe go over
//! one connection per replica, so they apply in program order on every replica. With
//! `WriteAck::All` a write is done when every replica acknowledged it; with `WriteAck::Primary`
//! when the primary did, the mirrors' acknowledgements being collected later (at most
//! `mirror_lag` writes behind; flush and close wait for them). A failed write is reported by the
//! next write, flush or close (as with NFS). If a write has to be re-sent (stale table, a
//! replica unreachable, no room yet), it and every write not fully acknowledged after it are
//! re-sent in order, to the replicas of the refreshed table (writes are idempotent).
//!
//! A write that fails for good leaves the size short of it: the size published stops at the
//! first byte of this handle's writes that is not stored on every replica, so a file never
//! reads zeros where its size says data is. Writes run in parallel, so a later one may be
//! stored past that point; those bytes stay beyond the size.
//!
//! Reads: a read fetches all its stripe pieces at once, each from the least loaded replica (a
//! large piece split over two); on a sequential pattern the next `readahead` stripes are
//! fetched ahead, a sequential read also fetches the rest of its stripe, and what a read took
//! only part of is kept for the next read (reads smaller than a stripe, or not aligned to one,
//! fetch each stripe once).
//!
//! Consistency: the size and mtime of what this handle wrote are published on flush/close,
//! once the bytes under it are stored, and attributes are fetched at open: close-to-open
//! consistency, as NFS gives.

mod read;
mod scatter;
mod write;

use crate::options::{OpenOptions, WriteAck};
use crate::route::{unexpected, Key, ReadSinks};
use crate::trace::{self, Answer, Call, Span, Tracer};
use crate::{Client, Error, Result};
use bytes::BytesMut;
use read::ReadAhead;
use std::collections::VecDeque;
use std::io::SeekFrom;
use std::sync::Arc;
use tessera_placement::Ino;
use tessera_proto::{ErrorCode, Inode, Op, Response, SetAttr, Timespec};
use tessera_trace::Op as TraceOp;
use tracing::warn;
use write::{Inflight, Lost};

/// An open file of a Tessera cluster. Close it with [`File::close`] to learn about errors;
/// a dropped handle is closed in the background.
pub struct File {
    client: Client,
    ino: Ino,
    /// Attributes fetched at open (close-to-open), for callers that need them at once.
    opened: Inode,
    /// The inode as this handle's last change (publish, truncate) left it, until taken.
    changed: Option<Inode>,
    stripe: u64,
    readable: bool,
    writable: bool,
    append: bool,
    /// The size as this handle knows it: at open, grown by its writes, set by its truncates,
    /// cut back to `base` or the first byte lost.
    size: u64,
    /// The size as the servers had it at this handle's open, last publish or truncate.
    base: u64,
    /// End of what this handle wrote since it last published the size.
    extent: Option<u64>,
    /// What of this handle's writes since its last publish is not stored: the size it
    /// publishes ends at the first such byte, and that publish reports why (again).
    lost: Lost,
    mtime: Option<Timespec>,
    pending: Option<(u64, BytesMut)>,
    ack: WriteAck,
    /// Writes the primary has not acknowledged yet (with `All`: not every replica), oldest first.
    inflight: VecDeque<Inflight>,
    /// With `Primary`: writes the primary acknowledged and some mirror has not, oldest first;
    /// all older than those in `inflight`.
    lagging: VecDeque<Inflight>,
    failed: Option<Error>,
    ahead: ReadAhead,
    /// Where read answers are received into, if the caller supplies memory of its own.
    sinks: Option<Arc<dyn ReadSinks>>,
    pos: u64,
    closed: bool,
    /// Finishing a dropped handle in the background: if that task is dropped in turn (the
    /// runtime is shutting down), it must not hand itself on again, without end.
    detached: bool,
    /// Bytes of file data asked of the servers so far (see [`File::asked`]).
    asked: u64,
    /// The trace this handle's calls are recorded in, with the path it was opened by.
    trace: Option<(Arc<Tracer>, Arc<[u8]>)>,
    /// The client lease the handle was opened under ([`crate::lease`]); `None` for an open
    /// made by a mirror, which no server counts.
    holder: Option<u64>,
}

impl File {
    pub(crate) fn new(
        client: Client,
        inode: Inode,
        opts: &OpenOptions,
        holder: Option<u64>,
    ) -> Self {
        let ack = opts.write_ack.unwrap_or(client.opts.write_ack);
        client.lease.opened(inode.ino);
        Self {
            stripe: u64::from(client.stripe_size()),
            client,
            ino: inode.ino,
            opened: inode.clone(),
            changed: None,
            readable: opts.read,
            writable: opts.write || opts.append,
            append: opts.append,
            size: inode.size,
            base: inode.size,
            extent: None,
            lost: Lost::default(),
            mtime: None,
            pending: None,
            ack,
            inflight: VecDeque::new(),
            lagging: VecDeque::new(),
            failed: None,
            ahead: ReadAhead::default(),
            sinks: None,
            pos: 0,
            closed: false,
            detached: false,
            asked: 0,
            trace: None,
            holder,
        }
    }

    /// Records this handle's calls into `tracer`, under `path`.
    pub(crate) fn trace(&mut self, tracer: Arc<Tracer>, path: &[u8]) {
        self.trace = Some((tracer, path.into()));
    }

    /// Bytes of file data this handle has asked the servers for: reads (read ahead included)
    /// and stripe writes (once each, whatever the number of replicas; a re-sent write again).
    /// A read served from what an earlier one fetched, or a write left in the handle's buffer,
    /// asks nothing.
    #[must_use]
    pub fn asked(&self) -> u64 {
        self.asked
    }

    /// Begins the record of a call if this handle is traced.
    fn begin(&self) -> Option<(Span, u64)> {
        trace::begin(self.trace.as_ref().map(|(t, _)| t)).map(|s| (s, self.asked))
    }

    /// Records a call begun by `begin`: `op` of `size` bytes at `offset`.
    fn end<T: Answer>(
        &self,
        begun: Option<(Span, u64)>,
        op: TraceOp,
        at: (u64, u64),
        out: &Result<T>,
    ) {
        let (Some((span, asked)), Some((_, path))) = (begun, &self.trace) else {
            return;
        };
        let call = Call {
            offset: at.0,
            size: at.1,
            server_size: Some(self.asked - asked),
            ino: self.ino,
            ..Call::new(op, path, self.client.opts.uid)
        };
        span.end(&call, out);
    }

    #[must_use]
    pub fn ino(&self) -> Ino {
        self.ino
    }

    /// Attributes as of the open, with the size as this handle sees it now.
    #[must_use]
    pub fn attr(&self) -> Inode {
        Inode {
            size: self.size,
            ..self.opened.clone()
        }
    }

    /// The size as this handle sees it.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.size
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    fn check(&mut self, write: bool) -> Result<()> {
        if self.closed {
            return Err(Error::BadHandle("anything: it is closed"));
        }
        if write && !self.writable {
            return Err(Error::BadHandle("writing"));
        }
        if !write && !self.readable {
            return Err(Error::BadHandle("reading"));
        }
        self.leased()?;
        self.unreported()
    }

    /// The servers may have let this handle go (its file deleted since, if unlinked).
    fn leased(&self) -> Result<()> {
        if self.holder.is_none_or(|h| self.client.lease.covers(h)) {
            Ok(())
        } else {
            Err(ErrorCode::LeaseExpired.into())
        }
    }

    /// A failure not yet reported to the caller.
    fn unreported(&mut self) -> Result<()> {
        self.failed.take().map_or(Ok(()), Err)
    }

    /// Where this handle's unpublished writes end, short of the first byte not stored.
    fn reach(&self) -> Option<u64> {
        let extent = self.extent?;
        Some(self.lost.first().map_or(extent, |first| extent.min(first)))
    }

    /// Stores everything written so far and publishes the size and modification time, so a
    /// process that opens the file afterwards sees it (what `fsync` and `close` do). The size
    /// goes out once the bytes under it are stored, so it leaves out a write that failed; but
    /// see `flush_beside`.
    pub async fn flush(&mut self) -> Result<()> {
        let begun = self.begin();
        let out = self.flush_untraced().await;
        self.end(begun, TraceOp::Flush, (0, 0), &out);
        out
    }

    async fn flush_untraced(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::BadHandle("anything: it is closed"));
        }
        // What an expired handle holds back is dropped: its file may be gone.
        self.leased()?;
        if let Some(done) = self.flush_beside().await {
            return done;
        }
        let drained = self.drain().await;
        let published = self.publish().await;
        drained.and(published)
    }

    /// `flush` of a file whose only write not yet stored is the one in its buffer (a small
    /// file's close): the size goes out beside that write instead of after it, so the close
    /// waits one round trip, not two. A process that opens the file after the close sees size
    /// and bytes either way (close-to-open); one that opens it during the close may find the
    /// new size before the bytes. If the write fails for good, the size is taken back before
    /// the flush answers (`InodeRetract`), unless another writer moved it since.
    ///
    /// Run on a lane (a FUSE worker's, see [`crate::Lane`]), when the write has one replica
    /// and it is not on the inode's node, the write and the size go out on the worker's lane, and the worker reads both answers
    /// itself, with no hand-off to the runtime's tasks. `None`: not such a flush, nothing done.
    async fn flush_beside(&mut self) -> Option<Result<()>> {
        if !self.inflight.is_empty()
            || !self.lagging.is_empty()
            || self.extent.is_none()
            || self.lost.first().is_some()
        {
            return None;
        }
        let (start, buf) = self.pending.take()?;
        let stripe = start / self.stripe;
        let op = Op::WriteStripe {
            file: self.ino,
            stripe,
            offset: (start % self.stripe) as u32,
        };
        let key = Key::Stripe(self.ino, stripe);
        let data = buf.freeze();
        let client = self.client.clone();
        let router = &client.router;
        let before = self.base;
        let size = self.reach();
        let on_lane = match &client.lane {
            Some(lane) => {
                router
                    .send_write_on_lane(lane, key, &op, &data, Key::Meta(self.ino))
                    .await
            }
            None => None,
        };
        let (published, stored) = match on_lane {
            Some(sent) => {
                self.asked += data.len() as u64;
                let published = self.publish().await;
                let stored = router.finish_lane_write(sent, key, &op, &data).await;
                if stored.is_ok() {
                    router.pool().recycle(data);
                }
                (published, stored)
            }
            None => {
                // Not sent: the buffer is back as it was (unshared, so not copied), and goes
                // out on the runtime's connections.
                let buf = data
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                self.pending = Some((start, buf));
                if self.send_pending().await.is_err() {
                    // Not even queued: lost, and left to `flush`.
                    return None;
                }
                let published = self.publish().await;
                (published, self.drain().await)
            }
        };
        if stored.is_err() {
            // What this handle wrote before the write is stored.
            let to = start.max(before);
            if published.is_ok() && size == Some(self.size) && to < self.size {
                if let Err(e) = self.retract(self.size, to).await {
                    warn!(
                        ino = self.ino,
                        "taking back the size of a failed write: {e}"
                    );
                }
            }
            // Reported by this flush.
            self.lost = Lost::default();
        }
        Some(self.unreported().and(stored).and(published))
    }

    /// Publishes the extent written since the last publish, up to the first byte not stored,
    /// and the modification time. A write lost since is reported here (again): what was
    /// written from its first byte on is not in the size. Kept for the next flush if the
    /// publish itself fails.
    async fn publish(&mut self) -> Result<()> {
        let Some(size) = self.reach() else {
            return Ok(());
        };
        let mtime = self.mtime.unwrap_or_else(Timespec::now);
        let op = Op::InodeExtend {
            ino: self.ino,
            size,
            mtime,
        };
        self.apply_size(op).await?;
        self.extent = None;
        self.mtime = None;
        std::mem::take(&mut self.lost).why.map_or(Ok(()), Err)
    }

    /// Sets the size back from `from`, which this handle's publish set, to `to`, unless
    /// another writer moved it meanwhile.
    async fn retract(&mut self, from: u64, to: u64) -> Result<()> {
        let op = Op::InodeRetract {
            ino: self.ino,
            from,
            to,
        };
        self.apply_size(op).await
    }

    /// Sends a change of the file's size and takes the size from the answer.
    async fn apply_size(&mut self, op: Op) -> Result<()> {
        match self.client.meta(self.ino, op).await? {
            Response::Inode(i) => {
                self.size = i.size;
                self.base = i.size;
                self.changed = Some(i);
                Ok(())
            }
            other => Err(unexpected(&other)),
        }
    }

    /// `flush` for another reader's sake: a failure stays with this handle, for its own next
    /// write, flush or close to report. True if everything is stored and published.
    pub async fn flush_for_reader(&mut self) -> bool {
        match self.flush().await {
            Ok(()) => true,
            Err(e) => {
                self.failed.get_or_insert(e);
                false
            }
        }
    }

    /// Reads from the cursor into `buf`; returns 0 at the end of the file.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let data = self.read_at(self.pos, buf.len()).await?;
        buf[..data.len()].copy_from_slice(&data);
        self.pos += data.len() as u64;
        Ok(data.len())
    }

    /// Writes at the cursor (at the end with append) and moves it.
    pub async fn write(&mut self, data: &[u8]) -> Result<usize> {
        let n = self.write_at(self.pos, data).await?;
        self.pos = if self.append {
            self.size
        } else {
            self.pos + n as u64
        };
        Ok(n)
    }

    pub fn seek(&mut self, to: SeekFrom) -> Result<u64> {
        let pos = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(d) => self.size.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| Error::Invalid("seek before the start of the file".into()))?;
        Ok(self.pos)
    }

    /// The rest of the file from the cursor.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.size.saturating_sub(self.pos) as usize);
        loop {
            let chunk = self.read_at(self.pos, self.stripe as usize).await?;
            if chunk.is_empty() {
                return Ok(out);
            }
            self.pos += chunk.len() as u64;
            out.extend_from_slice(&chunk);
        }
    }

    /// Takes the `len` bytes after the file's end as the servers know it, atomically: no
    /// other reservation, from this client or any other, gets any of them. Returns where they
    /// begin; write them with [`File::write_at`] or [`File::write_bytes`]. Until they are
    /// written they read as zeros.
    /// This handle's own writes are published first, so that its size is the servers'.
    pub async fn reserve(&mut self, len: u64) -> Result<u64> {
        self.check(true)?;
        self.flush_untraced().await?;
        let op = Op::InodeReserve {
            ino: self.ino,
            len,
            mtime: Timespec::now(),
        };
        self.apply_size(op).await?;
        self.size.checked_sub(len).ok_or_else(|| {
            Error::Unavailable(format!(
                "a reservation of {len} bytes answered with a size of {}",
                self.size
            ))
        })
    }

    /// Cuts or extends the file to `size`.
    pub async fn set_len(&mut self, size: u64) -> Result<()> {
        let begun = self.begin();
        let out = self.set_len_untraced(size).await;
        self.end(begun, TraceOp::Truncate, (size, 0), &out);
        out
    }

    async fn set_len_untraced(&mut self, size: u64) -> Result<()> {
        self.check(true)?;
        self.drain().await?;
        self.drop_read_ahead();
        // What was written past the new size must not be published again.
        self.extent = None;
        self.lost = Lost::default();
        let attr = SetAttr {
            size: Some(size),
            mtime: Some(Timespec::now()),
            ctime: Timespec::now(),
            ..SetAttr::default()
        };
        let i = self.client.setattr(self.ino, attr).await?;
        self.size = i.size;
        self.base = i.size;
        self.changed = Some(i);
        Ok(())
    }

    /// The inode as this handle's last publish or truncate left it, once: a cache of the
    /// file's pages can tell from its `change` whether anybody else changed it meanwhile.
    pub fn take_changed(&mut self) -> Option<Inode> {
        self.changed.take()
    }

    /// Fresh attributes from the cluster, with this handle's unpublished size.
    pub async fn metadata(&self) -> Result<Inode> {
        let begun = self.begin();
        let out = match self.client.getattr(self.ino).await {
            Ok(mut inode) => {
                inode.size = inode.size.max(self.reach().unwrap_or(0));
                Ok(inode)
            }
            Err(e) => Err(e),
        };
        self.end(begun, TraceOp::Getattr, (0, 0), &out);
        out
    }

    /// Flushes and releases the handle; the data of an unlinked file is deleted at its last close.
    pub async fn close(mut self) -> Result<()> {
        self.finish().await
    }

    /// `close` for a handle that is shared (behind a lock): later calls fail with `EBADF`.
    pub async fn finish(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let begun = self.begin();
        let out = self.release().await;
        self.end(begun, TraceOp::Release, (0, 0), &out);
        out
    }

    async fn release(&mut self) -> Result<()> {
        let flushed = self.flush_untraced().await;
        self.closed = true;
        self.client.lease.closed(self.ino);
        let Some(holder) = self.holder else {
            return flushed;
        };
        let ino = self.ino;
        let released = match self.client.meta(ino, Op::InodeClose { ino, holder }).await {
            Ok(Response::Links { .. }) => Ok(()),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => Err(e),
        };
        flushed.and(released)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.closed || self.detached {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            warn!(
                ino = self.ino,
                "file dropped outside a runtime without close: unflushed writes are lost"
            );
            return;
        };
        // Finish what the handle owes in the background: its writes, its size, its open count.
        let mut rest = File {
            client: self.client.clone(),
            ino: self.ino,
            opened: self.opened.clone(),
            changed: None,
            stripe: self.stripe,
            readable: false,
            writable: true,
            append: false,
            size: self.size,
            base: self.base,
            extent: self.extent.take(),
            lost: std::mem::take(&mut self.lost),
            mtime: self.mtime.take(),
            pending: self.pending.take(),
            ack: self.ack,
            inflight: std::mem::take(&mut self.inflight),
            lagging: std::mem::take(&mut self.lagging),
            failed: self.failed.take(),
            ahead: ReadAhead::default(),
            sinks: None,
            pos: 0,
            closed: false,
            detached: true,
            asked: self.asked,
            trace: self.trace.take(),
            holder: self.holder,
        };
        self.closed = true;
        rt.spawn(async move {
            if let Err(e) = rest.finish().await {
                warn!(ino = rest.ino, "closing a dropped file failed: {e}");
            }
        });
    }
}
