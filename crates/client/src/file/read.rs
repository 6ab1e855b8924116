//! Reading an open file: every stripe piece of a read is asked for before any is waited for,
//! sequential reads fetch whole stripes ahead, and what a fetch brought beyond a read is kept
//! for the next.

use super::File;
use crate::route::{ReadPart, ReadSinks};
use crate::Result;
use bytes::{Bytes, BytesMut};
use std::collections::BTreeMap;
use std::sync::Arc;
use tessera_placement::{segments, Segment};
use tessera_trace::Op;

#[derive(Default)]
pub(super) struct ReadAhead {
    /// Where the next read starts if the pattern is sequential.
    next: u64,
    /// Whole stripes fetched ahead of the reader, and the rest of a stripe a read took only
    /// part of (reads smaller than a stripe, or not aligned to one, take it piece by piece).
    stripes: BTreeMap<u64, Vec<Fetched>>,
}

/// One part of a stripe read: its answer still to come, or come.
enum Fetched {
    Pending(Box<ReadPart>),
    Done { offset: u32, len: u32, data: Bytes },
}

/// Do the ranges `parts` asked for cover all of `seg`? What they do not cover would read as a
/// hole.
fn covers(parts: &[Fetched], seg: &Segment) -> bool {
    let mut spans: Vec<(u32, u32)> = parts.iter().map(Fetched::span).collect();
    spans.sort_unstable();
    let mut to = seg.offset;
    for (offset, len) in spans {
        if offset > to {
            break;
        }
        to = to.max(offset + len);
    }
    to >= seg.offset + seg.len
}

impl Fetched {
    /// The bytes of the stripe asked for: `offset..offset + len`.
    fn span(&self) -> (u32, u32) {
        match self {
            Fetched::Pending(p) => (p.offset, p.len),
            Fetched::Done { offset, len, .. } => (*offset, *len),
        }
    }
}

impl File {
    /// Forgets what was read ahead: another handle changed the file.
    pub fn drop_read_ahead(&mut self) {
        self.ahead.stripes.clear();
    }

    /// Reads up to `len` bytes at `offset`; shorter only at the end of the file.
    pub async fn read_at(&mut self, offset: u64, len: usize) -> Result<Bytes> {
        let begun = self.begin();
        let out = self.read_at_untraced(offset, len).await;
        self.end(begun, Op::Read, (offset, len as u64), &out);
        out
    }

    async fn read_at_untraced(&mut self, offset: u64, len: usize) -> Result<Bytes> {
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
        // Ask for every piece before waiting for any: a stripe read ahead, or a fetch of just
        // the piece.
        let mut fetches = Vec::with_capacity(segs.len());
        for seg in &segs {
            let parts = match self.ahead.stripes.remove(&seg.stripe) {
                Some(parts) if covers(&parts, seg) => parts,
                // A sequential reader's next read starts where this one ends: it gets the
                // rest of the stripe too.
                _ if sequential && self.client.opts.readahead > 0 => {
                    let len = self.stripe_len(seg.stripe) - seg.offset;
                    self.fetch(seg.stripe, seg.offset, len).await?
                }
                _ if segs.len() == 1 => self.fetch_alone(seg).await?,
                _ => self.fetch(seg.stripe, seg.offset, seg.len).await?,
            };
            fetches.push(parts);
        }
        self.ahead.stripes.retain(|&s, _| s > last);
        if sequential && self.client.opts.readahead > 0 {
            let end_stripe = self.size.div_ceil(self.stripe);
            for s in last + 1..(last + 1 + self.client.opts.readahead as u64).min(end_stripe) {
                if self.ahead.stripes.contains_key(&s) {
                    continue;
                }
                // A lost partition ahead is the reader's error only if it gets there.
                if let Ok(mut parts) = self.fetch(s, 0, self.stripe_len(s)).await {
                    for part in &mut parts {
                        if let Fetched::Pending(p) = part {
                            p.detach();
                        }
                    }
                    self.ahead.stripes.insert(s, parts);
                }
            }
        }
        let mut out: Option<BytesMut> = None;
        for (seg, mut parts) in segs.iter().zip(fetches) {
            let mut got = self.finish_fetch(seg, &mut parts).await?;
            // What the stripe holds past this read stays for the next one.
            let end = seg.offset + seg.len;
            if parts.iter().any(|p| p.span().0 + p.span().1 > end) {
                self.ahead.stripes.insert(seg.stripe, parts);
            }
            if segs.len() == 1 && got.len() == 1 && got[0].0 == 0 && got[0].1.len() == len {
                return Ok(got.swap_remove(0).1); // the common aligned case: no copy
            }
            let buf = out.get_or_insert_with(|| BytesMut::with_capacity(len));
            for (at, data) in got {
                buf.resize(seg.buf_offset + at, 0); // a hole reads as zeros
                buf.extend_from_slice(&data);
            }
            buf.resize(seg.buf_offset + seg.len as usize, 0);
        }
        Ok(out.map(BytesMut::freeze).unwrap_or_default())
    }

    /// The bytes of stripe `s` below the end of the file: a read of the last stripe asks
    /// only for those, so an answer of the asked length fills its sink exactly.
    fn stripe_len(&self, s: u64) -> u32 {
        (self.size.saturating_sub(s * self.stripe)).min(self.stripe) as u32
    }

    /// Sends the read of bytes `offset..offset + len` of a stripe (in one or two parts).
    async fn fetch(&mut self, stripe: u64, offset: u32, len: u32) -> Result<Vec<Fetched>> {
        self.asked += u64::from(len);
        let parts = self
            .client
            .router
            .send_read(self.ino, stripe, offset, len, self.sinks.as_deref())
            .await?;
        Ok(parts
            .into_iter()
            .map(|p| Fetched::Pending(Box::new(p)))
            .collect())
    }

    /// The only piece a read needs: on the lane of the client it was opened through, if it
    /// has one and the caller supplies no memory (`Router::read_on_lane`), else as `fetch`.
    async fn fetch_alone(&mut self, seg: &Segment) -> Result<Vec<Fetched>> {
        let on_lane = match (&self.sinks, &self.client.lane) {
            (None, Some(lane)) => {
                let router = &self.client.router;
                router
                    .read_on_lane(lane, self.ino, seg.stripe, seg.offset, seg.len)
                    .await
            }
            _ => None,
        };
        match on_lane {
            Some(data) => {
                self.asked += u64::from(seg.len);
                Ok(vec![Fetched::Done {
                    offset: seg.offset,
                    len: seg.len,
                    data: data?,
                }])
            }
            None => self.fetch(seg.stripe, seg.offset, seg.len).await,
        }
    }

    /// Receive read answers into memory from `sinks` from now on.
    pub fn set_read_sinks(&mut self, sinks: Arc<dyn ReadSinks>) {
        self.sinks = Some(sinks);
    }

    /// The bytes of `seg` from `parts`, fetched reads covering it (a read ahead covers the
    /// whole stripe, up to the end of the file): slices of the answers, each with where it
    /// starts in `seg`, in order. The parts overlapping `seg` are waited for (a failed one is
    /// read again from another replica) and kept as answered; the others are not waited for.
    async fn finish_fetch(
        &self,
        seg: &Segment,
        parts: &mut [Fetched],
    ) -> Result<Vec<(usize, Bytes)>> {
        let (start, end) = (seg.offset, seg.offset + seg.len);
        let mut got = Vec::with_capacity(parts.len());
        for part in parts.iter_mut() {
            let (base, len) = part.span();
            if base >= end || base + len <= start {
                continue;
            }
            let placeholder = Fetched::Done {
                offset: base,
                len,
                data: Bytes::new(),
            };
            let data = match std::mem::replace(part, placeholder) {
                Fetched::Pending(p) => self.client.router.finish_read(*p).await?,
                Fetched::Done { data, .. } => data,
            };
            *part = Fetched::Done {
                offset: base,
                len,
                data: data.clone(),
            };
            // The answer may be short (a hole at the stripe's end): keep what lies in `seg`.
            let from = start.max(base);
            let to = end.min(base + data.len() as u32);
            if from < to {
                got.push((
                    (from - start) as usize,
                    data.slice((from - base) as usize..(to - base) as usize),
                ));
            }
        }
        Ok(got)
    }
}
