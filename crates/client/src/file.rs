//! An open file.
//!
//! Writes: small sequential writes collect in one stripe-sized buffer and leave as one request
//! when the stripe is full or the pattern breaks; up to `write_window` stripe writes are in
//! flight at once, spread over all servers. Requests are queued in program order, and a handle's
//! writes to one stripe go over one connection, so they apply in program order. A failed write
//! is reported by the next write, flush or close (as with NFS). If a write has to be re-sent
//! (stale table, reconnect), it and every write queued after it are re-sent in order.
//!
//! Reads: a read fetches all its stripe pieces at once; on a sequential pattern the next
//! `readahead` stripes are fetched ahead.
//!
//! Consistency: the size and mtime of what this handle wrote are published on flush/close,
//! and attributes are fetched at open: close-to-open consistency, as NFS gives.

use crate::route::{retryable, unexpected, Key};
use crate::{Client, Error, OpenOptions, Result};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, VecDeque};
use std::io::SeekFrom;
use tessera_placement::{segments, Ino, Segment};
use tessera_proto::{Inode, Op, Response, RpcError, SetAttr, Timespec, Waiter};
use tracing::warn;

struct Inflight {
    stripe: u64,
    offset: u32,
    data: Bytes,
    /// `None` when the request could not even be queued: it is re-sent with the others.
    waiter: Option<Waiter>,
}

#[derive(Default)]
struct ReadAhead {
    /// Where the next read starts if the pattern is sequential.
    next: u64,
    /// Whole stripes being fetched ahead of the reader.
    stripes: BTreeMap<u64, Waiter>,
}

/// An open file of a Tessera cluster. Close it with [`File::close`] to learn about errors;
/// a dropped handle is closed in the background.
pub struct File {
    client: Client,
    ino: Ino,
    /// Attributes fetched at open (close-to-open), for callers that need them at once.
    opened: Inode,
    stripe: u64,
    readable: bool,
    writable: bool,
    append: bool,
    /// The size as this handle knows it: at open, grown by its writes, set by its truncates.
    size: u64,
    /// End of what this handle wrote since it last published the size.
    extent: Option<u64>,
    mtime: Option<Timespec>,
    pending: Option<(u64, BytesMut)>,
    inflight: VecDeque<Inflight>,
    failed: Option<Error>,
    ahead: ReadAhead,
    pos: u64,
    closed: bool,
    /// Finishing a dropped handle in the background: if that task is dropped in turn (the
    /// runtime is shutting down), it must not hand itself on again, without end.
    detached: bool,
}

impl File {
    pub(crate) fn new(client: Client, inode: Inode, opts: &OpenOptions) -> Self {
        Self {
            stripe: u64::from(client.stripe_size()),
            client,
            ino: inode.ino,
            opened: inode.clone(),
            readable: opts.read,
            writable: opts.write || opts.append,
            append: opts.append,
            size: inode.size,
            extent: None,
            mtime: None,
            pending: None,
            inflight: VecDeque::new(),
            failed: None,
            ahead: ReadAhead::default(),
            pos: 0,
            closed: false,
            detached: false,
        }
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
        self.failed.take().map_or(Ok(()), Err)
    }

    /// Writes `data` at `offset` (at the end of the file if opened for append). The bytes may
    /// still be in flight when this returns; `flush` or `close` waits for them.
    pub async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<usize> {
        self.check(true)?;
        let offset = if self.append { self.size } else { offset };
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| Error::Invalid("write past the largest file offset".into()))?;
        if data.is_empty() {
            return Ok(0);
        }
        self.ahead.stripes.clear();
        for seg in segments(offset, data.len(), self.stripe as u32) {
            let piece = &data[seg.buf_offset..seg.buf_offset + seg.len as usize];
            let at = offset + seg.buf_offset as u64;
            let joins = matches!(&self.pending, Some((start, buf)) if start + buf.len() as u64 == at && seg.offset != 0);
            if !joins {
                self.send_pending().await;
                let mut buf = self.client.router.pool().get(self.stripe as usize);
                buf.reserve(piece.len());
                self.pending = Some((at, buf));
            }
            let full = {
                let (_, buf) = self.pending.as_mut().expect("set above");
                buf.extend_from_slice(piece);
                u64::from(seg.offset) + u64::from(seg.len) == self.stripe
            };
            if full {
                self.send_pending().await;
            }
        }
        self.size = self.size.max(end);
        self.extent = Some(self.extent.map_or(end, |e| e.max(end)));
        self.mtime = Some(Timespec::now());
        Ok(data.len())
    }

    /// Queues the aggregation buffer as one stripe write.
    async fn send_pending(&mut self) {
        let Some((start, buf)) = self.pending.take() else {
            return;
        };
        while self.inflight.len() >= self.client.opts.write_window.max(1) {
            self.complete_oldest().await;
        }
        let stripe = start / self.stripe;
        let offset = (start % self.stripe) as u32;
        let data = buf.freeze();
        let op = Op::WriteStripe {
            file: self.ino,
            stripe,
            offset,
        };
        let waiter = self
            .client
            .router
            .send(Key::Stripe(self.ino, stripe), op, data.clone())
            .await
            .ok();
        self.inflight.push_back(Inflight {
            stripe,
            offset,
            data,
            waiter,
        });
    }

    /// Waits for the oldest write in flight; on a failure that a retry can fix, re-sends it and
    /// everything after it, in order.
    async fn complete_oldest(&mut self) {
        let Some(mut w) = self.inflight.pop_front() else {
            return;
        };
        match wait_write(w.waiter.take()).await {
            WriteOutcome::Done => self.client.router.pool().recycle(w.data),
            WriteOutcome::Failed(e) => {
                self.failed.get_or_insert(e);
            }
            WriteOutcome::Retry => {
                let mut redo = vec![w];
                while let Some(mut later) = self.inflight.pop_front() {
                    if let Some(waiter) = later.waiter.take() {
                        let _ = waiter.wait().await;
                    }
                    redo.push(later);
                }
                for w in redo {
                    let op = Op::WriteStripe {
                        file: self.ino,
                        stripe: w.stripe,
                        offset: w.offset,
                    };
                    if let Err(e) = self
                        .client
                        .router
                        .call(Key::Stripe(self.ino, w.stripe), op, w.data)
                        .await
                    {
                        self.failed.get_or_insert(e);
                        return;
                    }
                }
            }
        }
    }

    /// Sends buffered writes and waits until every write of this handle is stored.
    async fn drain(&mut self) -> Result<()> {
        self.send_pending().await;
        while !self.inflight.is_empty() {
            self.complete_oldest().await;
        }
        self.failed.take().map_or(Ok(()), Err)
    }

    /// Stores everything written so far and publishes the size and modification time, so a
    /// process that opens the file afterwards sees it (what `fsync` and `close` do).
    pub async fn flush(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::BadHandle("anything: it is closed"));
        }
        let drained = self.drain().await;
        // Publish the extent even after a failed write: some of its stripes may be stored, and
        // the servers take a file of size 0 to have none (its data would never be dropped).
        if let Some(size) = self.extent.take() {
            let mtime = self.mtime.take().unwrap_or_else(Timespec::now);
            match self
                .client
                .meta(
                    self.ino,
                    Op::InodeExtend {
                        ino: self.ino,
                        size,
                        mtime,
                    },
                )
                .await
            {
                Ok(Response::Inode(i)) => self.size = i.size,
                Ok(other) => return drained.and(Err(unexpected(&other))),
                Err(e) => return drained.and(Err(e)),
            }
        }
        drained
    }

    /// Reads up to `len` bytes at `offset`; shorter only at the end of the file.
    pub async fn read_at(&mut self, offset: u64, len: usize) -> Result<Bytes> {
        self.check(false)?;
        self.drain().await?;
        if offset >= self.size || len == 0 {
            return Ok(Bytes::new());
        }
        let len = (self.size - offset).min(len as u64) as usize;
        let sequential = offset == self.ahead.next;
        self.ahead.next = offset + len as u64;
        let segs: Vec<Segment> = segments(offset, len, self.stripe as u32).collect();
        let last = segs[segs.len() - 1].stripe;
        // Ask for every piece before waiting for any. A piece remembers at which stripe offset
        // its bytes start: 0 for a stripe read ahead, the piece's own offset otherwise.
        let mut pieces = Vec::with_capacity(segs.len());
        for seg in &segs {
            let piece = match self.ahead.stripes.remove(&seg.stripe) {
                Some(a) => (Some(a), 0),
                None => (
                    self.fetch(seg.stripe, seg.offset, seg.len).await,
                    seg.offset,
                ),
            };
            pieces.push(piece);
        }
        self.ahead.stripes.retain(|&s, _| s > last);
        if sequential && self.client.opts.readahead > 0 {
            let end_stripe = self.size.div_ceil(self.stripe);
            for s in last + 1..(last + 1 + self.client.opts.readahead as u64).min(end_stripe) {
                if !self.ahead.stripes.contains_key(&s) {
                    if let Some(w) = self.fetch(s, 0, self.stripe as u32).await {
                        self.ahead.stripes.insert(s, w);
                    }
                }
            }
        }
        let mut out: Option<BytesMut> = None;
        for (seg, (source, base)) in segs.iter().zip(pieces) {
            let data = self.finish_fetch(seg, source, base).await?;
            if segs.len() == 1 && data.len() == seg.len as usize {
                return Ok(data); // the common aligned case: no copy
            }
            let buf = out.get_or_insert_with(|| BytesMut::with_capacity(len));
            buf.extend_from_slice(&data);
            buf.resize(seg.buf_offset + seg.len as usize, 0); // a hole reads as zeros
        }
        Ok(out.map(BytesMut::freeze).unwrap_or_default())
    }

    async fn fetch(&self, stripe: u64, offset: u32, len: u32) -> Option<Waiter> {
        let op = Op::ReadStripe {
            file: self.ino,
            stripe,
            offset,
            len,
        };
        self.client
            .router
            .send(Key::Stripe(self.ino, stripe), op, Bytes::new())
            .await
            .ok()
    }

    /// The bytes of `seg` from a fetch whose data starts at stripe offset `base`; re-fetched
    /// through the retrying path if the first attempt failed in a way a retry can fix.
    async fn finish_fetch(
        &self,
        seg: &Segment,
        source: Option<Waiter>,
        base: u32,
    ) -> Result<Bytes> {
        let got = match source {
            Some(w) => match w.wait().await {
                Ok((Response::Ok, b)) => Some(b),
                Ok((Response::Error(e), _)) if !retryable(&e) => return Err(e.into()),
                Ok((Response::Error(_), _)) | Err(_) => None,
                Ok((other, _)) => return Err(unexpected(&other)),
            },
            None => None,
        };
        let (data, base) = match got {
            Some(b) => (b, base),
            None => {
                let op = Op::ReadStripe {
                    file: self.ino,
                    stripe: seg.stripe,
                    offset: seg.offset,
                    len: seg.len,
                };
                (
                    self.client
                        .router
                        .call(Key::Stripe(self.ino, seg.stripe), op, Bytes::new())
                        .await?
                        .1,
                    seg.offset,
                )
            }
        };
        let start = (seg.offset - base) as usize;
        if start >= data.len() {
            return Ok(Bytes::new());
        }
        Ok(data.slice(start..data.len().min(start + seg.len as usize)))
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

    /// Cuts or extends the file to `size`.
    pub async fn set_len(&mut self, size: u64) -> Result<()> {
        self.check(true)?;
        self.drain().await?;
        self.ahead.stripes.clear();
        // What was written past the new size must not be published again.
        self.extent = None;
        let attr = SetAttr {
            size: Some(size),
            mtime: Some(Timespec::now()),
            ctime: Timespec::now(),
            ..SetAttr::default()
        };
        self.size = self.client.setattr(self.ino, attr).await?.size;
        Ok(())
    }

    /// Fresh attributes from the cluster, with this handle's unpublished size.
    pub async fn metadata(&self) -> Result<Inode> {
        let mut inode = self.client.getattr(self.ino).await?;
        inode.size = inode.size.max(self.extent.unwrap_or(0));
        Ok(inode)
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
        let flushed = self.flush().await;
        self.closed = true;
        let released = match self
            .client
            .meta(self.ino, Op::InodeClose { ino: self.ino })
            .await
        {
            Ok(Response::Links {
                drop_data: true, ..
            }) => self.client.drop_data(self.ino).await,
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        };
        flushed.and(released)
    }
}

enum WriteOutcome {
    Done,
    Retry,
    Failed(Error),
}

async fn wait_write(waiter: Option<Waiter>) -> WriteOutcome {
    let Some(waiter) = waiter else {
        return WriteOutcome::Retry;
    };
    match waiter.wait().await {
        Ok((Response::Ok, _)) => WriteOutcome::Done,
        Ok((Response::Error(e), _)) if retryable(&e) => WriteOutcome::Retry,
        Ok((Response::Error(e), _)) => WriteOutcome::Failed(e.into()),
        Ok((other, _)) => WriteOutcome::Failed(unexpected(&other)),
        Err(RpcError::Encode(m)) => WriteOutcome::Failed(Error::Invalid(m)),
        Err(_) => WriteOutcome::Retry,
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
            stripe: self.stripe,
            readable: false,
            writable: true,
            append: false,
            size: self.size,
            extent: self.extent.take(),
            mtime: self.mtime.take(),
            pending: self.pending.take(),
            inflight: std::mem::take(&mut self.inflight),
            failed: self.failed.take(),
            ahead: ReadAhead::default(),
            pos: 0,
            closed: false,
            detached: true,
        };
        self.closed = true;
        rt.spawn(async move {
            if let Err(e) = rest.finish().await {
                warn!(ino = rest.ino, "closing a dropped file failed: {e}");
            }
        });
    }
}
