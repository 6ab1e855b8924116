//! The keys a writer of fixed-size records gave: a bitmap over the key range, kept in chunks of
//! [`CHUNK`] keys so that only the chunks a writer touched take memory. A writer finds a key it
//! gives twice at once; at finalisation each publishes its set (`w<rank>.keys`) and every
//! writer checks a share of the chunks of all sets for a key two writers gave.
//!
//! ```text
//! published set   u64 chunks, then each chunk's number (u64, ascending), then each chunk's
//!                 bits (CHUNK / 64 u64 words; bit i of word j is key chunk * CHUNK + 64 j + i),
//!                 all little-endian
//! ```

use crate::Error;
use std::collections::BTreeMap;

/// Keys per chunk of a set.
pub const CHUNK: u64 = 1 << 16;
const WORDS: usize = (CHUNK / 64) as usize;
/// Bytes of a chunk's bits in a published set.
pub const CHUNK_BYTES: u64 = (WORDS * 8) as u64;

/// A set of keys, counted from the start of the key range.
#[derive(Debug, Default, Clone)]
pub struct KeySet {
    chunks: BTreeMap<u64, Box<[u64]>>,
}

impl KeySet {
    /// Adds `k`; false if it was there already.
    pub fn insert(&mut self, k: u64) -> bool {
        let words = self
            .chunks
            .entry(k / CHUNK)
            .or_insert_with(|| vec![0; WORDS].into_boxed_slice());
        let (w, bit) = ((k % CHUNK / 64) as usize, 1u64 << (k % 64));
        let fresh = words[w] & bit == 0;
        words[w] |= bit;
        fresh
    }

    /// The published form.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let n = self.chunks.len();
        let mut out = Vec::with_capacity(8 + n * (8 + WORDS * 8));
        out.extend_from_slice(&(n as u64).to_le_bytes());
        for c in self.chunks.keys() {
            out.extend_from_slice(&c.to_le_bytes());
        }
        for words in self.chunks.values() {
            for w in words.iter() {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        out
    }
}

/// Little-endian u64 words of `buf` (whose length is a multiple of 8).
fn words(buf: &[u8]) -> impl Iterator<Item = u64> + '_ {
    buf.chunks_exact(8).map(|b| {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_le_bytes(a)
    })
}

/// The chunk numbers of a published set from its first 8 bytes (the count) and the `count`
/// numbers after them; `Err` if they are not ascending.
pub fn decode_chunks(buf: &[u8]) -> Result<Vec<u64>, Error> {
    let chunks: Vec<u64> = words(buf).collect();
    if !buf.len().is_multiple_of(8) || chunks.windows(2).any(|w| w[0] >= w[1]) {
        return Err(Error::Corrupt("a key set's chunks out of order".into()));
    }
    Ok(chunks)
}

/// Where the bits of chunks `from..to` lie in a published set whose chunks are `chunks`: the
/// byte offset and length of one read, and the chunks it holds.
#[must_use]
pub fn span(chunks: &[u64], from: u64, to: u64) -> (u64, u64, &[u64]) {
    let a = chunks.partition_point(|&c| c < from);
    let b = chunks.partition_point(|&c| c < to);
    let header = 8 + 8 * chunks.len() as u64;
    (
        header + a as u64 * CHUNK_BYTES,
        (b - a) as u64 * CHUNK_BYTES,
        &chunks[a..b],
    )
}

/// A key two writers gave: the key (from the start of the range) and the two writers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duplicate {
    pub key: u64,
    pub first: u32,
    pub second: u32,
}

/// The least key set in two of `sets`, each a writer's rank, its chunk numbers and their bits
/// (as [`span`] reads them); the two writers are the lowest ranks that gave it.
#[must_use]
pub fn duplicate(sets: &[(u32, &[u64], &[u8])]) -> Option<Duplicate> {
    let mut by_chunk: BTreeMap<u64, Vec<(u32, &[u8])>> = BTreeMap::new();
    for &(rank, chunks, bits) in sets {
        for (i, &c) in chunks.iter().enumerate() {
            let at = i * WORDS * 8;
            let words = bits.get(at..at + WORDS * 8).unwrap_or_default();
            by_chunk.entry(c).or_default().push((rank, words));
        }
    }
    for (c, holders) in by_chunk {
        let (mut seen, mut twice) = (vec![0u64; WORDS], vec![0u64; WORDS]);
        for (_, bits) in &holders {
            for (i, w) in words(bits).enumerate() {
                twice[i] |= seen[i] & w;
                seen[i] |= w;
            }
        }
        let Some(i) = twice.iter().position(|&w| w != 0) else {
            continue;
        };
        let bit = twice[i].trailing_zeros();
        let has = |bits: &[u8]| words(bits).nth(i).is_some_and(|w| w >> bit & 1 == 1);
        let mut ranks = holders.iter().filter(|(_, b)| has(b)).map(|&(r, _)| r);
        let (first, second) = (ranks.next()?, ranks.next()?);
        return Some(Duplicate {
            key: c * CHUNK + i as u64 * 64 + u64::from(bit),
            first,
            second,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bits of chunks `from..to` of `set`, read from its published form as a checker does.
    fn read(set: &KeySet, from: u64, to: u64) -> (Vec<u64>, Vec<u8>) {
        let enc = set.encode();
        let n = u64::from_le_bytes(enc[..8].try_into().unwrap()) as usize;
        let chunks = decode_chunks(&enc[8..8 + 8 * n]).unwrap();
        let (at, len, held) = span(&chunks, from, to);
        (
            held.to_vec(),
            enc[at as usize..(at + len) as usize].to_vec(),
        )
    }

    #[test]
    fn a_key_given_twice_is_found_by_one_writer() {
        let mut s = KeySet::default();
        assert!(s.insert(5) && s.insert(CHUNK * 3 + 70) && s.insert(0));
        assert!(!s.insert(5));
        assert!(!s.insert(CHUNK * 3 + 70));
    }

    proptest! {
        /// Checked a share of the chunks at a time, the sets of several writers give exactly
        /// the least key two of them hold, and the two lowest ranks holding it.
        #[test]
        fn duplicates_across_writers_are_found_in_any_share(
            keys in prop::collection::vec(prop::collection::btree_set(0u64..4 * CHUNK, 0..200), 1..5),
            shares in 1u64..6,
        ) {
            let sets: Vec<KeySet> = keys.iter().map(|ks| {
                let mut s = KeySet::default();
                for &k in ks {
                    prop_assert!(s.insert(k));
                }
                Ok(s)
            }).collect::<Result<_, TestCaseError>>()?;
            let mut expect = None;
            for k in 0..4 * CHUNK {
                let holders: Vec<u32> = (0..keys.len() as u32).filter(|&r| keys[r as usize].contains(&k)).collect();
                if holders.len() > 1 {
                    expect = Some(Duplicate { key: k, first: holders[0], second: holders[1] });
                    break;
                }
            }
            let mut found = None;
            for s in 0..shares {
                let (from, to) = (4 * s / shares, 4 * (s + 1) / shares);
                let read: Vec<_> = sets.iter().map(|set| read(set, from, to)).collect();
                let args: Vec<(u32, &[u64], &[u8])> = read
                    .iter()
                    .enumerate()
                    .map(|(r, (c, b))| (r as u32, &c[..], &b[..]))
                    .collect();
                if let Some(d) = duplicate(&args) {
                    found = Some(d);
                    break;
                }
            }
            prop_assert_eq!(found, expect);
        }
    }
}
