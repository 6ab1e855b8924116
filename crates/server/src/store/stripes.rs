//! Stripes: writes and reads within one stripe, and truncating or dropping a file's stripes
//! wherever they are held here.

use super::{lock, Store, R};
use bytes::Bytes;
use std::sync::atomic::Ordering;
use tessera_placement::{Ino, PartitionId};
use tessera_proto::{check_pieces, ErrorCode, Piece};

impl Store {
    /// Writes `data` at `offset` of a stripe. Checked against capacity before anything changes.
    pub fn write(&self, p: PartitionId, file: Ino, stripe: u64, offset: u32, data: Bytes) -> R<()> {
        let end = offset as usize + data.len();
        if end > self.stripe_size as usize {
            return Err(ErrorCode::Invalid(format!(
                "write to {offset}+{} crosses the stripe end",
                data.len()
            )));
        }
        let len = data.len() as u32;
        self.put(p, file, stripe, &[Piece { offset, len }], data)
    }

    /// Writes `data`, cut into `pieces`, each at its offset of a stripe, atomically, as
    /// [`Self::write`]; the pieces are checked first ([`check_pieces`]).
    pub fn write_scatter(
        &self,
        p: PartitionId,
        file: Ino,
        stripe: u64,
        pieces: &[Piece],
        data: Bytes,
    ) -> R<()> {
        check_pieces(pieces, self.stripe_size, data.len())?;
        self.put(p, file, stripe, pieces, data)
    }

    /// Stores `data`'s `pieces` (checked: in order, disjoint, inside the stripe, as long as
    /// `data` in all) in a stripe, under its partition's lock, charged before anything changes.
    fn put(&self, p: PartitionId, file: Ino, stripe: u64, pieces: &[Piece], data: Bytes) -> R<()> {
        let end = pieces.last().map_or(0, |l| l.end() as usize);
        let mut guard = self.part_mut(p)?;
        let part = &mut *guard;
        let file_stripes = part.stripes.entry(file).or_default();
        let old = file_stripes.remove(&stripe);
        let old_len = old.as_ref().map_or(0, Bytes::len);
        let new_len = old_len.max(end);
        if let Err(e) = self.charge(&mut part.used, (new_len - old_len) as u64) {
            if let Some(old) = old {
                file_stripes.insert(stripe, old);
            } else if file_stripes.is_empty() {
                part.stripes.remove(&file);
            }
            return Err(e);
        }
        let existed = old.is_some();
        let whole = [Piece {
            offset: 0,
            len: self.stripe_size,
        }];
        let stored = match old {
            // A whole stripe: keep the buffer it arrived in, no copy.
            _ if pieces == whole => {
                if let Some(old) = old {
                    self.pool.recycle(old);
                }
                data
            }
            None => {
                let mut buf = self.pool.get(end);
                let mut at = 0;
                for piece in pieces {
                    buf.resize(piece.offset as usize, 0);
                    buf.extend_from_slice(&data[at..at + piece.len as usize]);
                    at += piece.len as usize;
                }
                self.pool.recycle(data);
                buf.freeze()
            }
            Some(old) => {
                // In place when nobody reads the old bytes; otherwise copy on write.
                let mut buf = old.try_into_mut().unwrap_or_else(|shared| {
                    let mut b = self.pool.get(new_len);
                    b.extend_from_slice(&shared);
                    b
                });
                if buf.len() < end {
                    buf.resize(end, 0);
                }
                let mut at = 0;
                for piece in pieces {
                    let (from, len) = (piece.offset as usize, piece.len as usize);
                    buf[from..from + len].copy_from_slice(&data[at..at + len]);
                    at += len;
                }
                self.pool.recycle(data);
                buf.freeze()
            }
        };
        debug_assert_eq!(stored.len(), new_len, "what was charged is what is stored");
        self.check_stripe(stored.len());
        let file_stripes = part.stripes.entry(file).or_default();
        file_stripes.insert(stripe, stored);
        if !existed {
            self.stripes.fetch_add(1, Ordering::Relaxed);
            if file_stripes.len() == 1 {
                self.place(p, file);
            }
        }
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_written.fetch_add(
            pieces.iter().map(|p| u64::from(p.len)).sum(),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Up to `len` bytes at `offset` of a stripe (fewer where it holds less), without copying.
    pub fn read(&self, p: PartitionId, file: Ino, stripe: u64, offset: u32, len: u32) -> R<Bytes> {
        let part = self.part(p)?;
        let data = part
            .stripes
            .get(&file)
            .and_then(|s| s.get(&stripe))
            .map_or_else(Bytes::new, |b| {
                self.check_stripe(b.len());
                let start = (offset as usize).min(b.len());
                b.slice(start..b.len().min(start + len as usize))
            });
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_read
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(data)
    }

    /// Notes that partition `p` here holds stripes of `file` (under `p`'s lock).
    pub(super) fn place(&self, p: PartitionId, file: Ino) {
        lock(&self.placed).insert((file, p));
    }

    /// Notes that partition `p` here holds no more stripes of `files` (under `p`'s lock).
    pub(super) fn unplace(&self, p: PartitionId, files: impl IntoIterator<Item = Ino>) {
        let mut placed = lock(&self.placed);
        for file in files {
            placed.remove(&(file, p));
        }
    }

    /// The partitions of `held` (sorted) that hold stripes of `file` here.
    fn placed_in(&self, held: &[PartitionId], file: Ino) -> Vec<PartitionId> {
        lock(&self.placed)
            .range((file, 0)..=(file, PartitionId::MAX))
            .map(|&(_, p)| p)
            .filter(|p| held.binary_search(p).is_ok())
            .collect()
    }

    /// Cuts `file`'s stripes in partition `p` to end at byte `size` of the file.
    fn cut(&self, p: PartitionId, file: Ino, size: u64) -> R<()> {
        let ss = u64::from(self.stripe_size);
        let mut guard = self.part_mut(p)?;
        let part = &mut *guard;
        let Some(stripes) = part.stripes.get_mut(&file) else {
            return Ok(());
        };
        let first_gone = size.div_ceil(ss);
        for (_, b) in stripes.split_off(&first_gone) {
            self.refund(&mut part.used, b.len() as u64);
            self.stripes.fetch_sub(1, Ordering::Relaxed);
            self.pool.recycle(b);
        }
        if !size.is_multiple_of(ss) {
            if let Some(b) = stripes.get_mut(&(size / ss)) {
                let keep = (size % ss) as usize;
                if b.len() > keep {
                    self.refund(&mut part.used, (b.len() - keep) as u64);
                    b.truncate(keep);
                }
            }
        }
        if stripes.is_empty() {
            part.stripes.remove(&file);
            self.unplace(p, [file]);
        }
        Ok(())
    }

    /// Cuts every stripe of `file` held here, in the partitions of `held` (sorted), to end at
    /// byte `size` of the file: also those past the size it had.
    pub fn truncate(&self, held: &[PartitionId], file: Ino, size: u64) -> R<()> {
        for p in self.placed_in(held, file) {
            self.cut(p, file, size)?;
        }
        Ok(())
    }

    /// Deletes every stripe of the deleted `files` held here, in the partitions of `held`
    /// (sorted), whatever the files' sizes were. A partition that refuses (fenced) does not
    /// stop the others; the first refusal is returned, for the caller to try again (drops are
    /// idempotent).
    pub fn drop_files(&self, held: &[PartitionId], files: &[Ino]) -> R<()> {
        let mut refused = Ok(());
        for &file in files {
            for p in self.placed_in(held, file) {
                if let Err(e) = self.cut(p, file, 0) {
                    refused = refused.and(Err(e));
                }
            }
        }
        refused
    }
}
