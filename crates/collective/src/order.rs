//! The output's total order and where its range boundaries fall in each run.
//!
//! Records are ordered by key, then by writer rank, then by the order the writer appended
//! them: a run of a writer holds its records sorted stably by key, and its runs follow one
//! another, so (key, run, position in the run) is that order, with runs ordered by (rank,
//! run number). Without keys every key is empty and the order is the runs' concatenation.

use crate::run::{decode_entry, Pos, RunIndex};
use crate::Error;
use std::cmp::Ordering;

/// A run: its writer's rank and its number among that writer's runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId {
    pub rank: u32,
    pub run: u32,
}

/// One record of the output order: a sampled entry, where a range begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub key: Vec<u8>,
    pub run: RunId,
    /// Its position in its run (records before it there).
    pub pos: u64,
}

/// A range boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    Start,
    At(Cut),
    End,
}

/// Is the entry (`key`, `run`, `pos`) before `cut` in the output order?
#[must_use]
pub fn before(key: &[u8], run: RunId, pos: u64, cut: &Cut) -> bool {
    (key, run, pos).cmp(&(&cut.key[..], cut.run, cut.pos)) == Ordering::Less
}

/// Where `bound` falls in the run `run`: exactly, or somewhere in the stretch of entries from
/// `from` to the byte offset `to`, which [`scan`] finds by reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    Exact(Pos),
    Within { from: Pos, to: u64 },
}

#[must_use]
pub fn locate(index: &RunIndex, run: RunId, bound: &Bound) -> Located {
    let cut = match bound {
        Bound::Start => return Located::Exact(Pos::default()),
        Bound::End => return Located::Exact(index.end),
        Bound::At(cut) => cut,
    };
    // Samples before the cut form a prefix of the index (it is sorted in the output order).
    let n = index
        .samples
        .partition_point(|s| before(&s.key, run, s.at.records, cut));
    let Some(last) = n.checked_sub(1) else {
        return Located::Exact(Pos::default());
    };
    let from = index.samples[last].at;
    let to = index
        .samples
        .get(n)
        .map_or(index.end.offset, |s| s.at.offset);
    match index.samples.get(n) {
        // The cut is this very entry, or the next sample follows the last entry before it.
        Some(s)
            if (run == cut.run && s.at.records == cut.pos) || s.at.records == from.records + 1 =>
        {
            Located::Exact(s.at)
        }
        None if index.end.records == from.records + 1 => Located::Exact(index.end),
        _ => Located::Within { from, to },
    }
}

/// The position of the first entry at or after `cut` in `block`, the run's bytes from `from`
/// (an entry before the cut) on, up to a point at or after the cut.
pub fn scan(block: &[u8], from: Pos, run: RunId, cut: &Cut) -> Result<Pos, Error> {
    let mut at = 0;
    let mut pos = from;
    while at < block.len() {
        let span = decode_entry(block, at)?
            .ok_or_else(|| Error::Corrupt("a run entry cut short".into()))?;
        if !before(span.key(block), run, pos.records, cut) {
            return Ok(pos);
        }
        at = span.end;
        pos = Pos {
            offset: from.offset + at as u64,
            records: pos.records + 1,
            bytes: pos.bytes + span.record.1 as u64,
        };
    }
    Ok(pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::RunEncoder;
    use proptest::prelude::*;

    /// A run of `keys` (sorted here) with records of `len` bytes.
    fn run(keys: &mut [u8], len: usize) -> (Vec<u8>, RunIndex) {
        keys.sort_unstable();
        let mut enc = RunEncoder::new();
        let mut out = Vec::new();
        for &k in keys.iter() {
            enc.push(&mut out, &[k], &vec![k; len]);
        }
        let mut file = out.clone();
        let index = enc.finish(&mut file);
        (out, index)
    }

    fn find(data: &[u8], index: &RunIndex, id: RunId, bound: &Bound) -> Pos {
        match locate(index, id, bound) {
            Located::Exact(p) => p,
            Located::Within { from, to } => {
                let Bound::At(cut) = bound else {
                    unreachable!()
                };
                scan(&data[from.offset as usize..to as usize], from, id, cut).unwrap()
            }
        }
    }

    proptest! {
        /// Any cut, in any run, is found where counting the entries before it puts it.
        #[test]
        fn cuts_are_found_exactly(
            mut keys in prop::collection::vec(0u8..8, 0..3000),
            len in 1usize..200,
            cut_key in 0u8..9,
            cut_rank in 0u32..3,
            cut_pos in 0u64..3000,
        ) {
            let id = RunId { rank: 1, run: 0 };
            let (data, index) = run(&mut keys, len);
            let cut = Cut { key: vec![cut_key], run: RunId { rank: cut_rank, run: 0 }, pos: cut_pos };
            let n = keys.iter().enumerate().filter(|&(i, &k)| before(&[k], id, i as u64, &cut)).count();
            let got = find(&data, &index, id, &Bound::At(cut));
            prop_assert_eq!(got.records, n as u64);
            prop_assert_eq!(got.bytes, (n * len) as u64);
            let offset = (0..n).map(|i| {
                let mut b = Vec::new();
                crate::run::encode_entry(&mut b, &[keys[i]], &vec![0; len]);
                b.len() as u64
            }).sum::<u64>();
            prop_assert_eq!(got.offset, offset);
            prop_assert_eq!(find(&data, &index, id, &Bound::Start), Pos::default());
            prop_assert_eq!(find(&data, &index, id, &Bound::End), index.end);
        }
    }

    #[test]
    fn ties_go_by_rank_then_position() {
        let cut = Cut {
            key: b"k".to_vec(),
            run: RunId { rank: 2, run: 1 },
            pos: 5,
        };
        let id = |rank, run| RunId { rank, run };
        assert!(before(b"k", id(1, 9), 100, &cut));
        assert!(before(b"k", id(2, 0), 100, &cut));
        assert!(before(b"k", id(2, 1), 4, &cut));
        assert!(!before(b"k", id(2, 1), 5, &cut));
        assert!(!before(b"k", id(3, 0), 0, &cut));
        assert!(before(b"j", id(9, 9), 9, &cut));
        assert!(!before(b"ka", id(0, 0), 0, &cut));
    }
}
