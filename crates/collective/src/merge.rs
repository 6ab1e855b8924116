//! The k-way merge of sorted sources, as a state machine that asks for data: pure, so the
//! caller decides where blocks come from (a run file in Tessera, a test's memory) and how
//! much of each it holds.
//!
//! Sources are given in the output's run order; records with equal keys come out by source,
//! then in their order within it (see [`crate::order`]).

use crate::run::{decode_entry, Span};
use crate::Error;

/// What the merge needs or gives next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// Feed source `j` its next block.
    Need(usize),
    /// The next record of the output.
    Record {
        source: usize,
        key: &'a [u8],
        record: &'a [u8],
    },
    Done,
}

struct Source {
    buf: Vec<u8>,
    /// Where its next entry begins in `buf`.
    at: usize,
    /// Its current entry, decoded.
    cur: Option<Span>,
    /// Entries still to come, the current one included.
    left: u64,
}

impl Source {
    fn key(&self) -> &[u8] {
        self.cur.as_ref().map_or(&[], |s| s.key(&self.buf))
    }
}

/// Merges sources of known entry counts, up to `limit` records.
pub struct Merge {
    sources: Vec<Source>,
    /// Sources with a current entry, as a binary min-heap by (key, source).
    heap: Vec<usize>,
    /// Sources with entries left but none decoded.
    pending: Vec<usize>,
    /// The source whose entry went out last, to move past on the next step.
    last: Option<usize>,
    limit: Option<u64>,
    emitted: u64,
}

impl Merge {
    /// A merge of sources holding `counts[j]` entries each.
    #[must_use]
    pub fn new(counts: Vec<u64>, limit: Option<u64>) -> Self {
        let pending = (0..counts.len()).rev().filter(|&j| counts[j] > 0).collect();
        Self {
            sources: counts
                .into_iter()
                .map(|left| Source {
                    buf: Vec::new(),
                    at: 0,
                    cur: None,
                    left,
                })
                .collect(),
            heap: Vec::new(),
            pending,
            last: None,
            limit,
            emitted: 0,
        }
    }

    /// Records given out so far.
    #[must_use]
    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    /// Appends `data`, the next bytes of source `j`.
    pub fn feed(&mut self, j: usize, data: &[u8]) {
        let s = &mut self.sources[j];
        // Drop what was consumed; the rest (part of an entry) moves to the front.
        if s.at > 0 {
            s.buf.drain(..s.at);
            s.at = 0;
        }
        s.buf.extend_from_slice(data);
    }

    pub fn step(&mut self) -> Result<Step<'_>, Error> {
        if let Some(j) = self.last.take() {
            let s = &mut self.sources[j];
            s.at = s.cur.take().map_or(s.at, |c| c.end);
            s.left -= 1;
            if s.left > 0 {
                self.pending.push(j);
            }
        }
        if self.limit.is_some_and(|k| self.emitted >= k) {
            return Ok(Step::Done);
        }
        while let Some(&j) = self.pending.last() {
            let s = &mut self.sources[j];
            match decode_entry(&s.buf, s.at)? {
                Some(span) => {
                    s.cur = Some(span);
                    self.pending.pop();
                    self.push(j);
                }
                None => return Ok(Step::Need(j)),
            }
        }
        let Some(j) = self.pop() else {
            return Ok(Step::Done);
        };
        self.last = Some(j);
        self.emitted += 1;
        let s = &self.sources[j];
        let span = s
            .cur
            .as_ref()
            .ok_or_else(|| Error::Corrupt("merge lost an entry".into()))?;
        Ok(Step::Record {
            source: j,
            key: span.key(&s.buf),
            record: span.record(&s.buf),
        })
    }

    fn less(&self, a: usize, b: usize) -> bool {
        (self.sources[a].key(), a) < (self.sources[b].key(), b)
    }

    fn push(&mut self, j: usize) {
        self.heap.push(j);
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let parent = (i - 1) / 2;
            if !self.less(self.heap[i], self.heap[parent]) {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    fn pop(&mut self) -> Option<usize> {
        let n = self.heap.len();
        if n == 0 {
            return None;
        }
        self.heap.swap(0, n - 1);
        let top = self.heap.pop();
        let n = n - 1;
        let mut i = 0;
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut min = i;
            if l < n && self.less(self.heap[l], self.heap[min]) {
                min = l;
            }
            if r < n && self.less(self.heap[r], self.heap[min]) {
                min = r;
            }
            if min == i {
                break;
            }
            self.heap.swap(i, min);
            i = min;
        }
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::encode_entry;
    use proptest::prelude::*;

    /// Merges `sources` (each sorted by key), feeding blocks of `block` bytes.
    fn merge(
        sources: &[Vec<(Vec<u8>, Vec<u8>)>],
        block: usize,
        limit: Option<u64>,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let data: Vec<Vec<u8>> = sources
            .iter()
            .map(|s| {
                let mut b = Vec::new();
                for (k, r) in s {
                    encode_entry(&mut b, k, r);
                }
                b
            })
            .collect();
        let mut fed = vec![0; data.len()];
        let mut m = Merge::new(sources.iter().map(|s| s.len() as u64).collect(), limit);
        let mut out = Vec::new();
        loop {
            match m.step().unwrap() {
                Step::Need(j) => {
                    let to = (fed[j] + block).min(data[j].len());
                    assert!(to > fed[j], "source {j} asked past its end");
                    m.feed(j, &data[j][fed[j]..to]);
                    fed[j] = to;
                }
                Step::Record { key, record, .. } => out.push((key.to_vec(), record.to_vec())),
                Step::Done => return out,
            }
        }
    }

    proptest! {
        #[test]
        fn the_merge_of_sorted_sources_is_their_stable_sort(
            mut sources in prop::collection::vec(
                prop::collection::vec(
                    (prop::collection::vec(0u8..4, 0..3), prop::collection::vec(any::<u8>(), 0..40)),
                    0..60,
                ),
                0..9,
            ),
            block in 1usize..100,
            limit in prop::option::of(0u64..300),
        ) {
            for s in &mut sources {
                s.sort_by(|a, b| a.0.cmp(&b.0));
            }
            let mut expect: Vec<_> = sources.iter().flatten().cloned().collect();
            expect.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(k) = limit {
                expect.truncate(k as usize);
            }
            prop_assert_eq!(merge(&sources, block, limit), expect);
        }
    }

    #[test]
    fn a_source_cut_short_is_an_error_not_a_hang() {
        let mut m = Merge::new(vec![1], None);
        assert_eq!(m.step().unwrap(), Step::Need(0));
        m.feed(0, &[0xff; 12]);
        assert!(m.step().is_err());
    }
}
