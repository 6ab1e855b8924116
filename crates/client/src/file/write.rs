//! Writing an open file: small sequential writes gathered in one stripe-sized buffer, stripe
//! writes kept in flight up to the window and sent to every replica, acknowledgements waited
//! for (the primary's, or every replica's), and re-sends in order when one must go again.

use super::File;
use crate::route::{Ack, Key, Outcome};
use crate::{Error, Result, WriteAck};
use bytes::Bytes;
use tessera_placement::{segments, Ino};
use tessera_proto::{ErrorCode, Op, Piece, Timespec};
use tessera_trace::Op as TraceOp;

/// Where a stripe write's bytes go in its stripe.
pub(super) enum At {
    /// All at one offset (`Op::WriteStripe`).
    Offset(u32),
    /// Cut into pieces, each at its own offset (`Op::WriteScatter`).
    Pieces(Vec<Piece>),
}

/// A stripe write not yet acknowledged by every replica.
pub(super) struct Inflight {
    stripe: u64,
    at: At,
    data: Bytes,
    /// The bytes are a buffer of the client's pool, to go back there once stored; not so for
    /// a caller's own ([`File::write_bytes`]).
    pooled: bool,
    /// Replicas still to acknowledge, primary first.
    acks: Vec<Ack>,
}

impl Inflight {
    /// The request that writes it to file `file`.
    fn op(&self, file: Ino) -> Op {
        let stripe = self.stripe;
        match &self.at {
            At::Offset(offset) => Op::WriteStripe {
                file,
                stripe,
                offset: *offset,
            },
            At::Pieces(pieces) => Op::WriteScatter {
                file,
                stripe,
                pieces: pieces.clone(),
            },
        }
    }

    /// The bytes of the file it writes, with stripes of `stripe` bytes.
    fn ranges(&self, stripe: u64) -> Vec<(u64, u64)> {
        let base = self.stripe * stripe;
        match &self.at {
            At::Offset(offset) => {
                let start = base + u64::from(*offset);
                vec![(start, start + self.data.len() as u64)]
            }
            At::Pieces(pieces) => pieces
                .iter()
                .map(|p| (base + u64::from(p.offset), base + p.end()))
                .collect(),
        }
    }
}

/// The bytes of a handle's writes since its last publish that are not stored, and why.
#[derive(Default)]
pub(super) struct Lost {
    ranges: Vec<(u64, u64)>,
    pub(super) why: Option<Error>,
}

impl Lost {
    fn add(&mut self, (start, end): (u64, u64), why: &Error) {
        self.ranges.push((start, end));
        self.why.get_or_insert_with(|| why.clone());
    }

    /// A later write stored `start..end` (writes complete in the order they were queued, so
    /// what it covers holds its bytes, the last written there).
    fn stored(&mut self, (start, end): (u64, u64)) {
        if self.ranges.is_empty() {
            return;
        }
        let mut left = Vec::with_capacity(self.ranges.len() + 1);
        for (a, b) in self.ranges.drain(..) {
            if b <= start || a >= end {
                left.push((a, b));
                continue;
            }
            if a < start {
                left.push((a, start));
            }
            if b > end {
                left.push((end, b));
            }
        }
        self.ranges = left;
        if self.ranges.is_empty() {
            self.why = None;
        }
    }

    /// The first byte not stored.
    pub(super) fn first(&self) -> Option<u64> {
        self.ranges.iter().map(|&(a, _)| a).min()
    }
}

impl File {
    /// These bytes of writes were not stored (`e`): the size ends before them, and the next
    /// write, flush or close reports `e`.
    fn lose(&mut self, ranges: impl IntoIterator<Item = (u64, u64)>, e: Error) {
        for r in ranges {
            self.lost.add(r, &e);
        }
        if let Some(first) = self.lost.first() {
            self.size = self.size.min(first).max(self.base);
        }
        self.failed.get_or_insert(e);
    }

    /// A write is stored on every replica.
    fn stored(&mut self, w: Inflight) {
        if self.lost.first().is_some() {
            for range in w.ranges(self.stripe) {
                self.lost.stored(range);
            }
        }
        if w.pooled {
            self.client.router.pool().recycle(w.data);
        }
    }

    /// Writes `data` at `offset` (at the end of the file if opened for append). The bytes may
    /// still be in flight when this returns; `flush` or `close` waits for them.
    pub async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<usize> {
        let begun = self.begin();
        let at = if self.append { self.size } else { offset };
        let out = self.write_at_untraced(offset, data).await;
        self.end(begun, TraceOp::Write, (at, data.len() as u64), &out);
        out
    }

    /// Checks a write of `len` bytes at `offset`; where it ends, `None` if it is empty.
    fn start_write(&mut self, offset: u64, len: usize) -> Result<Option<u64>> {
        self.check(true)?;
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| Error::Invalid("write past the largest file offset".into()))?;
        if len == 0 {
            return Ok(None);
        }
        self.drop_read_ahead();
        Ok(Some(end))
    }

    /// A write up to `end` queued: the size and the extent to publish grow.
    async fn end_write(&mut self, end: u64) -> Result<()> {
        self.size = self.size.max(end);
        self.extent = Some(self.extent.map_or(end, |e| e.max(end)));
        self.mtime = Some(Timespec::now());
        if self.lost.first().is_some() {
            // Once a write was lost, each waits until it is stored and reports its own
            // failure, as NFS does: a failure reported once can be swallowed on the way (the
            // kernel answers a write(2) whose second request failed with a short count), and
            // the caller then writes the rest.
            self.drain().await?;
        }
        Ok(())
    }

    async fn write_at_untraced(&mut self, offset: u64, data: &[u8]) -> Result<usize> {
        let offset = if self.append { self.size } else { offset };
        let Some(end) = self.start_write(offset, data.len())? else {
            return Ok(0);
        };
        for seg in segments(offset, data.len(), self.stripe as u32) {
            let piece = &data[seg.buf_offset..seg.buf_offset + seg.len as usize];
            let at = offset + seg.buf_offset as u64;
            let joins = matches!(&self.pending, Some((start, buf)) if start + buf.len() as u64 == at && seg.offset != 0);
            if !joins {
                self.send().await?;
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
                self.send().await?;
            }
        }
        self.end_write(end).await?;
        Ok(data.len())
    }

    /// `write_at` of bytes the caller gives up: each stripe's part goes out as a slice of
    /// `data`, not copied into a buffer of the pool (a large buffer written once). Whatever
    /// this handle gathered before goes out first.
    pub async fn write_bytes(&mut self, offset: u64, data: Bytes) -> Result<usize> {
        let begun = self.begin();
        let len = data.len() as u64;
        let at = if self.append { self.size } else { offset };
        let out = self.write_bytes_untraced(at, data).await;
        self.end(begun, TraceOp::Write, (at, len), &out);
        out
    }

    async fn write_bytes_untraced(&mut self, offset: u64, data: Bytes) -> Result<usize> {
        let Some(end) = self.start_write(offset, data.len())? else {
            return Ok(0);
        };
        self.send().await?;
        for seg in segments(offset, data.len(), self.stripe as u32) {
            let piece = data.slice(seg.buf_offset..seg.buf_offset + seg.len as usize);
            self.queue(seg.stripe, At::Offset(seg.offset), piece, false)
                .await?;
            self.unreported()?;
        }
        self.end_write(end).await?;
        Ok(data.len())
    }

    /// Would `write_at(offset, ..)` of `len` bytes stay in this handle's buffer, sending
    /// nothing? Such a write needs nothing of the servers: not even the file's inode there.
    #[must_use]
    pub fn buffers(&self, offset: u64, len: usize) -> bool {
        let at = if self.append { self.size } else { offset };
        let within = at % self.stripe;
        self.lost.first().is_none()
            && within.saturating_add(len as u64) < self.stripe
            && match &self.pending {
                None => true,
                Some((start, buf)) => start + buf.len() as u64 == at && within != 0,
            }
    }

    /// Forgets this file without a word to the servers: it never reached them (a create
    /// answered ahead that failed, or was not sent). Its writes are dropped.
    pub fn abandon(&mut self) {
        self.closed = true;
    }

    /// `send_pending` for a write: a failure found meanwhile (waiting for room in the window)
    /// is reported by it, which then grows the size no further.
    pub(super) async fn send(&mut self) -> Result<()> {
        self.send_pending().await?;
        self.unreported()
    }

    /// Queues the aggregation buffer as one stripe write to every replica; fails at once only
    /// if the stripe's partition is lost.
    pub(super) async fn send_pending(&mut self) -> Result<()> {
        let Some((start, buf)) = self.pending.take() else {
            return Ok(());
        };
        let at = At::Offset((start % self.stripe) as u32);
        self.queue(start / self.stripe, at, buf.freeze(), true)
            .await
    }

    /// Queues a write of `data` to stripe `stripe` to every replica, once the window has
    /// room; fails at once only if the stripe's partition is lost. `pooled`: `data` is a
    /// buffer of the pool.
    pub(super) async fn queue(
        &mut self,
        stripe: u64,
        at: At,
        data: Bytes,
        pooled: bool,
    ) -> Result<()> {
        while self.inflight.len() >= self.client.opts.write_window.max(1) {
            self.complete_oldest().await;
        }
        self.asked += data.len() as u64;
        let mut w = Inflight {
            stripe,
            at,
            data,
            pooled,
            acks: Vec::new(),
        };
        let router = &self.client.router;
        let key = Key::Stripe(self.ino, stripe);
        match router
            .send_write(&router.route(), key, &w.op(self.ino), &w.data)
            .await
        {
            Ok(acks) => w.acks = acks,
            Err(e) => {
                self.lose(w.ranges(self.stripe), e);
                return self.unreported();
            }
        }
        self.inflight.push_back(w);
        Ok(())
    }

    /// Waits for the oldest write in flight: for every replica's acknowledgement (`All`), or for
    /// the primary's, the write then waiting in `lagging` for its mirrors (`Primary`).
    async fn complete_oldest(&mut self) {
        let Some(mut w) = self.inflight.pop_front() else {
            return;
        };
        let router = &self.client.router;
        let outcome = match self.ack {
            WriteAck::All => router.wait_acks(std::mem::take(&mut w.acks)).await,
            WriteAck::Primary if w.acks.is_empty() => Outcome::Done,
            WriteAck::Primary => router.wait_ack(w.acks.remove(0)).await,
        };
        match outcome {
            Outcome::Done if w.acks.is_empty() => self.stored(w),
            Outcome::Done => {
                self.lagging.push_back(w);
                while self.lagging.len() > self.client.opts.mirror_lag {
                    self.complete_lagging().await;
                }
            }
            // The space may be on its way back: `Router::write`, used by the re-send, waits
            // for it a moment.
            Outcome::Failed(e) if !e.is(&ErrorCode::NoSpace) => {
                self.lose(w.ranges(self.stripe), e);
            }
            Outcome::Failed(_) | Outcome::Retry(_) => {
                self.inflight.push_front(w);
                self.redo().await;
            }
        }
    }

    /// Waits for the mirrors of the oldest write the primary acknowledged.
    async fn complete_lagging(&mut self) {
        let Some(mut w) = self.lagging.pop_front() else {
            return;
        };
        let router = &self.client.router;
        match router.wait_acks(std::mem::take(&mut w.acks)).await {
            Outcome::Done => self.stored(w),
            Outcome::Failed(e) if !e.is(&ErrorCode::NoSpace) => {
                self.lose(w.ranges(self.stripe), e);
            }
            Outcome::Failed(_) | Outcome::Retry(_) => {
                self.lagging.push_front(w);
                self.redo().await;
            }
        }
    }

    /// A write must be re-sent: re-sends every write not yet acknowledged by all its replicas,
    /// oldest first (the one that failed is the oldest of its queue, and lagging writes are
    /// older than those in flight), so the last write to each byte is still applied last on
    /// every replica. Each goes to the replicas of the current table, waiting out a failover
    /// (and, refused for want of room, a moment for room). The first that fails for good
    /// stops the re-sends: it and those after it count as lost.
    async fn redo(&mut self) {
        let mut redo: Vec<Inflight> = self.lagging.drain(..).collect();
        redo.extend(self.inflight.drain(..));
        // Let the first attempts settle, so none lands after its own re-send.
        futures::future::join_all(
            redo.iter_mut()
                .map(|w| self.client.router.wait_acks(std::mem::take(&mut w.acks))),
        )
        .await;
        let client = self.client.clone();
        let mut redo = redo.into_iter();
        while let Some(w) = redo.next() {
            let key = Key::Stripe(self.ino, w.stripe);
            self.asked += w.data.len() as u64;
            if let Err(e) = client.router.write(key, &w.op(self.ino), &w.data).await {
                let ss = self.stripe;
                self.lose(std::iter::once(w).chain(redo).flat_map(|w| w.ranges(ss)), e);
                return;
            }
            self.stored(w);
        }
    }

    /// Sends buffered writes and waits until every write of this handle is stored on every
    /// replica.
    pub(super) async fn drain(&mut self) -> Result<()> {
        let sent = self.send_pending().await;
        while !self.inflight.is_empty() {
            self.complete_oldest().await;
        }
        while !self.lagging.is_empty() {
            self.complete_lagging().await;
        }
        sent?;
        self.unreported()
    }
}
