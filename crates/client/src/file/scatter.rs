//! Scatter writes: many pieces of a file, each at its own offset, sent as one request per
//! stripe (`Op::WriteScatter`) rather than one per piece, and never covering the bytes between
//! pieces (another writer's, in an output whose records interleave).

use super::write::At;
use super::File;
use crate::{Error, Result};
use bytes::BytesMut;
use tessera_placement::segments;
use tessera_proto::{Piece, Timespec, SCATTER_PIECES_MAX};
use tessera_trace::Op as TraceOp;

/// The pieces of one stripe gathered for one request, their bytes one after another.
struct Gathered {
    stripe: u64,
    pieces: Vec<Piece>,
    data: BytesMut,
}

impl Gathered {
    /// Adds a piece of `len` bytes at `offset` (past the last), as part of the last if they
    /// touch; false if the request is full.
    fn add(&mut self, offset: u32, len: u32) -> bool {
        let full = self.pieces.len() >= SCATTER_PIECES_MAX;
        match self.pieces.last_mut() {
            Some(last) if last.end() == u64::from(offset) => last.len += len,
            _ if full => return false,
            _ => self.pieces.push(Piece { offset, len }),
        }
        true
    }
}

/// Where `pieces` end, if they hold any byte: refused unless in increasing offset order and
/// not overlapping (empty pieces aside).
fn check_order(pieces: &[(u64, &[u8])]) -> Result<Option<u64>> {
    let mut end: Option<u64> = None;
    for (i, &(offset, data)) in pieces.iter().enumerate() {
        if data.is_empty() {
            continue;
        }
        if end.is_some_and(|e| offset < e) {
            return Err(Error::Invalid(format!(
                "scatter write: piece {i} at {offset} starts before the end of the one before \
                 it: pieces must be in increasing offset order and must not overlap"
            )));
        }
        end = Some(
            offset
                .checked_add(data.len() as u64)
                .ok_or_else(|| Error::Invalid("write past the largest file offset".into()))?,
        );
    }
    Ok(end)
}

impl File {
    /// Writes each of `pieces`, `(offset, bytes)`, at its offset; the pieces are in increasing
    /// offset order and do not overlap (`Invalid` otherwise, and nothing is written). The
    /// pieces of one stripe go in one request (touching pieces as one; a stripe with more than
    /// [`SCATTER_PIECES_MAX`] pieces in several), each to every replica, up to the write
    /// window in flight as `write_at`'s; the bytes between pieces are left as they are. As
    /// with `write_at`, the bytes may still be in flight when this returns, and the size grows
    /// to the end of the last piece. Traced as one write of all the bytes at the first offset.
    pub async fn write_scatter(&mut self, pieces: &[(u64, &[u8])]) -> Result<usize> {
        let begun = self.begin();
        let out = self.write_scatter_untraced(pieces).await;
        let first = pieces.first().map_or(0, |p| p.0);
        let total = pieces.iter().map(|p| p.1.len() as u64).sum();
        self.end(begun, TraceOp::Write, (first, total), &out);
        out
    }

    async fn write_scatter_untraced(&mut self, pieces: &[(u64, &[u8])]) -> Result<usize> {
        self.check(true)?;
        if self.append {
            return Err(Error::Invalid(
                "a scatter write to a file opened for append: its pieces have offsets".into(),
            ));
        }
        let Some(end) = check_order(pieces)? else {
            return Ok(0);
        };
        self.drop_read_ahead();
        // What the handle buffered goes first, so writes stay in program order.
        self.send().await?;
        let mut at: Option<Gathered> = None;
        let mut total = 0;
        for &(offset, data) in pieces {
            total += data.len();
            for seg in segments(offset, data.len(), self.stripe as u32) {
                let bytes = &data[seg.buf_offset..seg.buf_offset + seg.len as usize];
                let joins = match &mut at {
                    Some(g) if g.stripe == seg.stripe => g.add(seg.offset, seg.len),
                    _ => false,
                };
                if !joins {
                    self.send_gathered(at.take()).await?;
                    let mut data = self.client.router.pool().get(self.stripe as usize);
                    data.reserve(bytes.len());
                    at = Some(Gathered {
                        stripe: seg.stripe,
                        pieces: vec![Piece {
                            offset: seg.offset,
                            len: seg.len,
                        }],
                        data,
                    });
                }
                at.as_mut()
                    .expect("set above")
                    .data
                    .extend_from_slice(bytes);
            }
        }
        self.send_gathered(at).await?;
        self.size = self.size.max(end);
        self.extent = Some(self.extent.map_or(end, |e| e.max(end)));
        self.mtime = Some(Timespec::now());
        if self.lost.first().is_some() {
            // As `write_at`: once a write was lost, each waits and reports its own failure.
            self.drain().await?;
        }
        Ok(total)
    }

    /// Queues one stripe's gathered pieces: a plain stripe write if they are one piece.
    async fn send_gathered(&mut self, g: Option<Gathered>) -> Result<()> {
        let Some(Gathered {
            stripe,
            pieces,
            data,
        }) = g
        else {
            return Ok(());
        };
        let at = match pieces[..] {
            [one] => At::Offset(one.offset),
            _ => At::Pieces(pieces),
        };
        self.queue(stripe, at, data.freeze(), true).await?;
        self.unreported()
    }
}

#[cfg(test)]
mod tests {
    use super::check_order;

    #[test]
    fn pieces_must_be_ordered_and_disjoint() {
        assert_eq!(check_order(&[]).unwrap(), None);
        assert_eq!(check_order(&[(5, b"")]).unwrap(), None);
        let ok: [(u64, &[u8]); 4] = [(0, b"ab"), (2, b"c"), (9, b""), (7, b"xyz")];
        assert_eq!(
            check_order(&ok).unwrap(),
            Some(10),
            "an empty piece is skipped"
        );
        for bad in [
            [(4, &b"ab"[..]), (5, &b"c"[..])],
            [(4, &b"ab"[..]), (1, &b"c"[..])],
            [(u64::MAX, &b"ab"[..]), (1, &b""[..])],
        ] {
            assert!(check_order(&bad).is_err(), "{bad:?}");
        }
    }
}
