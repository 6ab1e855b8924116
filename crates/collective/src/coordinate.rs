//! A coordinator's work: find its range in every run, merge it (in passes through
//! intermediate runs when the runs are too many for its memory at once), and write it into
//! the output at its offset.

use crate::dir::{run_name, Dir};
use crate::marker::{CoordinatorDone, Marker};
use crate::merge::{Merge, Step};
use crate::order::{locate, scan, Bound, Located, RunId};
use crate::run::{decode_footer, decode_index, Pos, RunEncoder, RunIndex, FOOTER_LEN};
use crate::{Error, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use std::time::Instant;
use tessera_client::{Client, File, OpenOptions};
use tokio::sync::mpsc;

/// The least block a source is read in.
const MIN_BLOCK: usize = 64 << 10;
/// The largest block a source is read in, and the largest output write.
const MAX_BLOCK: usize = 4 << 20;
/// The least memory a coordinator can work with: two sources and the output buffer.
pub const MIN_MEMORY: usize = 8 * MIN_BLOCK;
/// Runs opened at once while reading their indexes.
const OPENING: usize = 16;
/// How the output is opened: by many writers at once, each at its own offsets.
pub(crate) fn write_output() -> OpenOptions {
    OpenOptions {
        read: false,
        write: true,
        create: true,
        ..OpenOptions::default()
    }
}

/// A source of a merge: entries `from..to` (byte offsets) of a run file, `count` of them.
pub(crate) struct Source {
    pub file: File,
    pub from: u64,
    pub to: u64,
    pub count: u64,
}

/// How a coordinator spends its memory on `k` sources: the block each is read in (a source
/// holds about three: one read, one queued, one in the merge) and the output buffer.
pub(crate) fn budget(memory: usize, k: usize) -> (usize, usize) {
    let out = (memory / 4).clamp(MIN_BLOCK, MAX_BLOCK);
    let block = ((memory - out) / (3 * k.max(1))).clamp(MIN_BLOCK, MAX_BLOCK);
    (block, out)
}

/// Sources one pass can merge within `memory`.
fn fan_in(memory: usize) -> usize {
    let (_, out) = budget(memory, 1);
    ((memory - out) / (3 * MIN_BLOCK)).max(2)
}

/// A run file open for reading, with its index.
pub(crate) async fn open_run(reader: &Client, path: Vec<u8>) -> Result<(File, RunIndex)> {
    let mut f = reader.open(&path, &OpenOptions::read()).await?;
    let size = f.len();
    let name = String::from_utf8_lossy(&path).into_owned();
    if size < FOOTER_LEN as u64 {
        return Err(Error::Corrupt(format!("{name}: shorter than a run footer")));
    }
    let footer = f.read_at(size - FOOTER_LEN as u64, FOOTER_LEN).await?;
    let (offset, count, mut index) =
        decode_footer(&footer, size).map_err(|e| Error::Corrupt(format!("{name}: {e}")))?;
    let len = (size - FOOTER_LEN as u64 - offset) as usize;
    let buf = f.read_at(offset, len).await?;
    decode_index(&buf, count, &mut index).map_err(|e| Error::Corrupt(format!("{name}: {e}")))?;
    Ok((f, index))
}

/// Where `bound` falls in a run, reading the stretch it is in if the index does not say.
async fn find(f: &mut File, index: &RunIndex, run: RunId, bound: &Bound) -> Result<Pos> {
    match (locate(index, run, bound), bound) {
        (Located::Exact(p), _) => Ok(p),
        (Located::Within { from, to }, Bound::At(cut)) => {
            let block = f.read_at(from.offset, (to - from.offset) as usize).await?;
            scan(&block, from, run, cut)
        }
        (Located::Within { .. }, _) => Err(Error::Corrupt("a bound outside the order".into())),
    }
}

/// Run `id` open, and where `lo` and `hi` fall in it.
async fn span(
    reader: &Client,
    path: Vec<u8>,
    id: RunId,
    lo: &Bound,
    hi: &Bound,
) -> Result<(File, Pos, Pos)> {
    let (mut f, index) = open_run(reader, path).await?;
    let start = find(&mut f, &index, id, lo).await?;
    let end = find(&mut f, &index, id, hi).await?;
    Ok((f, start, end))
}

/// Where records go as they come out of a merge: bytes gathered into writes of `cap`.
pub(crate) trait Sink {
    fn push(&mut self, key: &[u8], record: &[u8]);
    fn writes(&mut self) -> &mut Writes;
}

/// A file written from an offset on, in writes of `cap` bytes.
pub(crate) struct Writes {
    pub file: File,
    pub at: u64,
    buf: Vec<u8>,
    cap: usize,
}

impl Writes {
    pub fn new(file: File, at: u64, cap: usize) -> Self {
        Self {
            file,
            at,
            buf: Vec::with_capacity(cap),
            cap,
        }
    }

    fn full(&self) -> bool {
        self.buf.len() >= self.cap
    }

    async fn write(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.file.write_at(self.at, &self.buf).await?;
            self.at += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }
}

/// The output file from an offset on: records only.
pub(crate) struct Output {
    pub out: Writes,
    pub records: u64,
    pub bytes: u64,
}

impl Sink for Output {
    fn push(&mut self, _key: &[u8], record: &[u8]) {
        self.out.buf.extend_from_slice(record);
        self.records += 1;
        self.bytes += record.len() as u64;
    }
    fn writes(&mut self) -> &mut Writes {
        &mut self.out
    }
}

/// An intermediate run: keys and records, as the writers' runs.
struct Intermediate {
    out: Writes,
    enc: RunEncoder,
}

impl Sink for Intermediate {
    fn push(&mut self, key: &[u8], record: &[u8]) {
        self.enc.push(&mut self.out.buf, key, record);
    }
    fn writes(&mut self) -> &mut Writes {
        &mut self.out
    }
}

/// Reads `s` block by block into a queue of one, in its own task.
fn read_ahead(mut s: Source, block: usize) -> mpsc::Receiver<Result<bytes::Bytes>> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut at = s.from;
        while at < s.to {
            let n = (s.to - at).min(block as u64) as usize;
            let got = match s.file.read_at(at, n).await {
                Ok(b) if b.is_empty() => Err(Error::Corrupt("a run shorter than its index".into())),
                Ok(b) => Ok(b),
                Err(e) => Err(e.into()),
            };
            let failed = got.is_err();
            at += got.as_ref().map_or(0, |b| b.len() as u64);
            if tx.send(got).await.is_err() || failed {
                break;
            }
        }
        let _ = s.file.close().await;
    });
    rx
}

/// Merges `sources` into `sink`, up to `limit` records; returns the records merged.
pub(crate) async fn merge_into(
    sources: Vec<Source>,
    limit: Option<u64>,
    block: usize,
    sink: &mut impl Sink,
) -> Result<u64> {
    let mut merge = Merge::new(sources.iter().map(|s| s.count).collect(), limit);
    let mut queues: Vec<_> = sources.into_iter().map(|s| read_ahead(s, block)).collect();
    loop {
        match merge.step()? {
            Step::Need(j) => match queues[j].recv().await {
                Some(Ok(b)) => merge.feed(j, &b),
                Some(Err(e)) => return Err(e),
                None => return Err(Error::Corrupt("a run ended before its entries".into())),
            },
            Step::Record { key, record, .. } => sink.push(key, record),
            Step::Done => break,
        }
        if sink.writes().full() {
            sink.writes().write().await?;
        }
    }
    sink.writes().write().await?;
    Ok(merge.emitted())
}

/// Coordinator `i`'s range of the output: merged from every run and written at its offset.
pub async fn coordinate(
    client: &Client,
    dir: &Dir,
    markers: &[Marker],
    bounds: &[Bound],
    i: usize,
    rank: u32,
    memory: usize,
) -> Result<CoordinatorDone> {
    let started = Instant::now();
    let reader = client.with_readahead(0);
    let (lo, hi) = (&bounds[i], &bounds[i + 1]);
    let runs: Vec<RunId> = markers
        .iter()
        .flat_map(|m| {
            m.runs.iter().map(|r| RunId {
                rank: m.rank,
                run: r.run,
            })
        })
        .collect();
    // Every run's span of the range, in the output's run order.
    let opening: Vec<_> = runs
        .iter()
        .map(|&id| span(&reader, dir.child(&run_name(id.rank, id.run)), id, lo, hi))
        .collect();
    let spans: Vec<(File, Pos, Pos)> = stream::iter(opening)
        .buffered(OPENING)
        .try_collect()
        .await?;
    let offset: u64 = spans.iter().map(|(_, a, _)| a.bytes).sum();
    let before: u64 = spans.iter().map(|(_, a, _)| a.records).sum();
    let mut limit = markers[0].agreed.top.map(|k| k.saturating_sub(before));
    let mut sources: Vec<Source> = Vec::new();
    for (file, a, b) in spans {
        if b.records > a.records {
            sources.push(Source {
                file,
                from: a.offset,
                to: b.offset,
                count: b.records - a.records,
            });
        } else {
            let _ = file.close().await;
        }
    }
    if limit == Some(0) {
        sources.clear();
    }
    // Too many sources for one pass: merge groups of them into intermediate runs first (in
    // order, so ties keep their order), as often as needed.
    let mut passes = 1;
    let mut made: Vec<Vec<u8>> = Vec::new();
    while sources.len() > fan_in(memory) {
        let k = fan_in(memory);
        let (block, cap) = budget(memory, k);
        let mut next = Vec::new();
        let mut groups = Vec::new();
        while !sources.is_empty() {
            let rest = sources.split_off(k.min(sources.len()));
            groups.push(std::mem::replace(&mut sources, rest));
        }
        for (g, group) in groups.into_iter().enumerate() {
            let path = dir.child(&format!("c{i}.p{passes}.{g}"));
            let file = client.open(&path, &OpenOptions::create()).await?;
            let mut sink = Intermediate {
                out: Writes::new(file, 0, cap),
                enc: RunEncoder::new(),
            };
            let count = merge_into(group, limit, block, &mut sink).await?;
            let end = sink.enc.len();
            sink.out.file.close().await?;
            next.push(Source {
                file: reader.open(&path, &OpenOptions::read()).await?,
                from: 0,
                to: end,
                count,
            });
            made.push(path);
        }
        sources = next;
        passes += 1;
    }
    let (block, cap) = budget(memory, sources.len());
    let (records, bytes) = if sources.is_empty() {
        (0, 0)
    } else {
        let file = client.open(dir.child("output"), &write_output()).await?;
        let mut out = Output {
            out: Writes::new(file, offset, cap),
            records: 0,
            bytes: 0,
        };
        merge_into(sources, limit.take(), block, &mut out).await?;
        out.out.file.close().await?;
        (out.records, out.bytes)
    };
    for path in made {
        if let Err(e) = client.remove_file(&path).await {
            tracing::debug!("removing an intermediate run: {e}");
        }
    }
    Ok(CoordinatorDone {
        index: i,
        rank,
        offset,
        records,
        bytes,
        passes,
        merge_secs: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_shared_within_its_bound() {
        for memory in [MIN_MEMORY, 1 << 20, 64 << 20, 1 << 30] {
            let k = fan_in(memory);
            assert!(k >= 2);
            let (block, out) = budget(memory, k);
            assert!(
                3 * k * block + out <= memory,
                "{memory}: {k} x {block} + {out}"
            );
        }
        assert_eq!(budget(64 << 20, 1), (MAX_BLOCK, MAX_BLOCK));
    }
}
