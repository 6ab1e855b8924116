//! The run file: one writer's records sorted by key, as its coordinators read them.
//!
//! ```text
//! entries   (varint key length, varint record length, key, record) ...  sorted, stable
//! index     (varint key length, key, varint position, varint offset, varint bytes before) ...
//! footer    u64 index offset, u64 records, u64 record bytes, u64 samples, b"TSCRUN01" (LE)
//! ```
//!
//! The index samples the first entry and then one entry every [`SAMPLE_EVERY`] bytes: with
//! it a reader finds where any key falls by reading one stretch of at most about that many
//! bytes, and knows how many records and record bytes come before each sample without
//! reading them.

use crate::Error;

const MAGIC: &[u8; 8] = b"TSCRUN01";
/// Bytes of the footer.
pub const FOOTER_LEN: usize = 40;
/// An index sample at least every this many bytes of entries.
pub const SAMPLE_EVERY: u64 = 64 << 10;
/// The largest key or record a run holds: a larger length is a damaged file.
pub const MAX_LEN: u64 = 1 << 32;

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at `buf[*at..]`, moving `at` past it; `Ok(None)` if `buf` ends inside it.
pub fn get_varint(buf: &[u8], at: &mut usize) -> Result<Option<u64>, Error> {
    let mut v = 0u64;
    for (i, &b) in buf.get(*at..).unwrap_or_default().iter().enumerate() {
        if i == 10 {
            break;
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *at += i + 1;
            return Ok(Some(v));
        }
    }
    if buf.len().saturating_sub(*at) >= 10 {
        return Err(Error::Corrupt("a length longer than 64 bits".into()));
    }
    Ok(None)
}

/// Where an entry's key and record lie in a buffer, and its length there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub key: (usize, usize),
    pub record: (usize, usize),
    /// The byte after the entry.
    pub end: usize,
}

impl Span {
    #[must_use]
    pub fn key<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.key.0..self.key.0 + self.key.1]
    }
    #[must_use]
    pub fn record<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.record.0..self.record.0 + self.record.1]
    }
}

/// The entry at `buf[at..]`; `Ok(None)` if `buf` ends inside it.
pub fn decode_entry(buf: &[u8], at: usize) -> Result<Option<Span>, Error> {
    let mut p = at;
    let Some(klen) = get_varint(buf, &mut p)? else {
        return Ok(None);
    };
    let Some(rlen) = get_varint(buf, &mut p)? else {
        return Ok(None);
    };
    if klen > MAX_LEN || rlen > MAX_LEN {
        return Err(Error::Corrupt(format!(
            "an entry of {klen} key bytes and {rlen} record bytes"
        )));
    }
    let (klen, rlen) = (klen as usize, rlen as usize);
    let end = p + klen + rlen;
    if end > buf.len() {
        return Ok(None);
    }
    Ok(Some(Span {
        key: (p, klen),
        record: (p + klen, rlen),
        end,
    }))
}

pub fn encode_entry(out: &mut Vec<u8>, key: &[u8], record: &[u8]) {
    put_varint(out, key.len() as u64);
    put_varint(out, record.len() as u64);
    out.extend_from_slice(key);
    out.extend_from_slice(record);
}

/// A point in a run, just before one of its entries (or at its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    /// Byte offset of the entry in the run file.
    pub offset: u64,
    /// Records before it.
    pub records: u64,
    /// Record bytes (output bytes) before it.
    pub bytes: u64,
}

/// A sampled entry: its key and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub key: Vec<u8>,
    pub at: Pos,
}

/// A run's index, from its trailer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunIndex {
    pub samples: Vec<Sample>,
    /// The end of the entries: offset, records and record bytes of the whole run.
    pub end: Pos,
}

/// Encodes a run entry by entry into chunks of bytes, sampling its index on the way.
#[derive(Debug, Default)]
pub struct RunEncoder {
    at: Pos,
    next_sample: u64,
    index: RunIndex,
}

impl RunEncoder {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an entry to `out` (the bytes of the run that follow what was appended so far).
    pub fn push(&mut self, out: &mut Vec<u8>, key: &[u8], record: &[u8]) {
        if self.at.offset >= self.next_sample {
            self.index.samples.push(Sample {
                key: key.to_vec(),
                at: self.at,
            });
            self.next_sample = self.at.offset + SAMPLE_EVERY;
        }
        let before = out.len();
        encode_entry(out, key, record);
        self.at.offset += (out.len() - before) as u64;
        self.at.records += 1;
        self.at.bytes += record.len() as u64;
    }

    /// Bytes of entries so far.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.at.offset
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.at.records == 0
    }

    /// Appends the index and footer to `out`; returns the index.
    #[must_use]
    pub fn finish(mut self, out: &mut Vec<u8>) -> RunIndex {
        self.index.end = self.at;
        for s in &self.index.samples {
            put_varint(out, s.key.len() as u64);
            out.extend_from_slice(&s.key);
            put_varint(out, s.at.records);
            put_varint(out, s.at.offset);
            put_varint(out, s.at.bytes);
        }
        for v in [
            self.at.offset,
            self.at.records,
            self.at.bytes,
            self.index.samples.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(MAGIC);
        self.index
    }
}

/// The footer of a run of `size` bytes: where its index starts, and the index less its
/// samples.
pub fn decode_footer(footer: &[u8], size: u64) -> Result<(u64, u64, RunIndex), Error> {
    let bad = |why: &str| Error::Corrupt(format!("run footer: {why}"));
    if footer.len() != FOOTER_LEN || &footer[32..] != MAGIC {
        return Err(bad("not a run file"));
    }
    let word = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&footer[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    let (offset, records, bytes, samples) = (word(0), word(1), word(2), word(3));
    if offset > size.saturating_sub(FOOTER_LEN as u64) || bytes > offset {
        return Err(bad("offsets out of the file"));
    }
    let end = Pos {
        offset,
        records,
        bytes,
    };
    Ok((
        offset,
        samples,
        RunIndex {
            samples: Vec::new(),
            end,
        },
    ))
}

/// Decodes `count` index samples from `buf` into `index`.
pub fn decode_index(buf: &[u8], count: u64, index: &mut RunIndex) -> Result<(), Error> {
    let short = || Error::Corrupt("run index cut short".into());
    let mut at = 0;
    let next = |at: &mut usize| get_varint(buf, at)?.ok_or_else(short);
    for _ in 0..count {
        let klen = next(&mut at)? as usize;
        let key = buf.get(at..at + klen).ok_or_else(short)?.to_vec();
        at += klen;
        let records = next(&mut at)?;
        let offset = next(&mut at)?;
        let bytes = next(&mut at)?;
        let pos = Pos {
            offset,
            records,
            bytes,
        };
        let ordered = index
            .samples
            .last()
            .is_none_or(|s| s.at.offset < offset && s.at.records < records && s.at.bytes <= bytes);
        if !ordered || offset >= index.end.offset || records >= index.end.records {
            return Err(Error::Corrupt("run index out of order".into()));
        }
        index.samples.push(Sample { key, at: pos });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(entries: &[(Vec<u8>, Vec<u8>)]) -> (Vec<u8>, RunIndex) {
        let mut enc = RunEncoder::new();
        let mut out = Vec::new();
        for (k, r) in entries {
            enc.push(&mut out, k, r);
        }
        let index = enc.finish(&mut out);
        (out, index)
    }

    fn decode(file: &[u8]) -> RunIndex {
        let size = file.len() as u64;
        let (offset, count, mut index) =
            decode_footer(&file[file.len() - FOOTER_LEN..], size).unwrap();
        decode_index(
            &file[offset as usize..file.len() - FOOTER_LEN],
            count,
            &mut index,
        )
        .unwrap();
        index
    }

    #[test]
    fn varints_round_trip_and_report_short_input() {
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            let mut at = 0;
            assert_eq!(get_varint(&b, &mut at).unwrap(), Some(v));
            assert_eq!(at, b.len());
            let mut at = 0;
            assert_eq!(get_varint(&b[..b.len() - 1], &mut at).unwrap(), None);
        }
        let mut at = 0;
        assert!(get_varint(&[0xff; 11], &mut at).is_err());
    }

    #[test]
    fn an_empty_run_has_an_empty_index() {
        let (file, index) = encode(&[]);
        assert_eq!(file.len(), FOOTER_LEN);
        assert_eq!(decode(&file), index);
        assert!(index.samples.is_empty());
    }

    #[test]
    fn garbage_is_not_a_run() {
        assert!(decode_footer(&[0; FOOTER_LEN], 100).is_err());
        let (mut file, _) = encode(&[(b"k".to_vec(), b"r".to_vec())]);
        let n = file.len();
        file[n - FOOTER_LEN] = 200; // index offset past the file
        assert!(decode_footer(&file[n - FOOTER_LEN..], n as u64).is_err());
    }

    proptest! {
        #[test]
        fn runs_decode_to_what_was_encoded(
            entries in prop::collection::vec(
                (prop::collection::vec(any::<u8>(), 0..20), prop::collection::vec(any::<u8>(), 0..3000)),
                0..200,
            )
        ) {
            let (file, index) = encode(&entries);
            prop_assert_eq!(decode(&file), index.clone());
            // Every entry decodes back, and every sample says where its entry is.
            let mut at = 0;
            let mut pos = Pos::default();
            let mut samples = index.samples.iter().peekable();
            for (k, r) in &entries {
                if let Some(s) = samples.peek() {
                    if s.at == pos {
                        prop_assert_eq!(&s.key, k);
                        samples.next();
                    }
                }
                let span = decode_entry(&file, at).unwrap().unwrap();
                prop_assert_eq!(span.key(&file), &k[..]);
                prop_assert_eq!(span.record(&file), &r[..]);
                // Cut anywhere inside, it is incomplete, never wrong.
                prop_assert_eq!(decode_entry(&file[..span.end - 1], at).unwrap(), None);
                at = span.end;
                pos = Pos { offset: at as u64, records: pos.records + 1, bytes: pos.bytes + r.len() as u64 };
            }
            prop_assert!(samples.next().is_none());
            prop_assert_eq!(index.end, pos);
            let gaps = index.samples.windows(2).all(|w| w[1].at.offset - w[0].at.offset <= SAMPLE_EVERY + 3100);
            prop_assert!(gaps);
        }
    }
}
