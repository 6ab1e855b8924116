//! A writer of fixed-size records placed by key: each buffer, once it holds `threshold` bytes,
//! is written in place in the output in the background (record `k` at `(k - start) *
//! record_size`) by one scatter write: the records of a stripe in one request. A key the writer gives twice
//! fails it at once; at finalisation it publishes the keys it gave ([`crate::keys`]) and
//! checks its share of everybody's for a key two writers gave.

use crate::coordinate::write_output;
use crate::dir::Dir;
use crate::inflight::InFlight;
use crate::keys::{decode_chunks, duplicate, span, KeySet, CHUNK, CHUNK_BYTES};
use crate::spill::MAX_RESERVE;
use crate::{Error, Fixed, Result};
use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use tessera_client::{Client, File, OpenOptions};

/// Key sets read at once while checking.
const READING: usize = 16;

/// Buffered records: their keys (from the range's start) and their bytes, one after another.
#[derive(Default)]
struct Placed {
    keys: Vec<u64>,
    data: Vec<u8>,
}

/// Writes `buf`'s records in place in `file`, in key order, and stores them; gives both back.
/// One scatter write: a request per stripe, whatever other writers own between the records.
async fn place(mut file: File, buf: Placed, size: u64) -> Result<(File, Placed)> {
    let (buf, runs) = tokio::task::spawn_blocking(move || {
        let mut order: Vec<usize> = (0..buf.keys.len()).collect();
        order.sort_unstable_by_key(|&i| buf.keys[i]);
        // Runs of consecutive keys whose records follow one another in the buffer: (first
        // record, records).
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        while i < order.len() {
            let mut j = i + 1;
            while j < order.len()
                && buf.keys[order[j]] == buf.keys[order[j - 1]] + 1
                && order[j] == order[j - 1] + 1
            {
                j += 1;
            }
            runs.push((order[i], j - i));
            i = j;
        }
        (buf, runs)
    })
    .await
    .map_err(|e| Error::Failed(format!("ordering records: {e}")))?;
    let s = size as usize;
    let pieces: Vec<(u64, &[u8])> = runs
        .iter()
        .map(|&(first, n)| {
            (
                buf.keys[first] * size,
                &buf.data[first * s..(first + n) * s],
            )
        })
        .collect();
    file.write_scatter(&pieces).await?;
    drop(pieces);
    file.flush().await?;
    Ok((file, buf))
}

pub(crate) struct Placer {
    client: Client,
    output: Vec<u8>,
    rank: u32,
    pub fixed: Fixed,
    threshold: usize,
    keys: KeySet,
    buf: Placed,
    spare: Option<Placed>,
    /// The output, open for writing once the first buffer goes out.
    file: Option<File>,
    inflight: InFlight<(File, Placed)>,
    /// Records given.
    pub records: u64,
    /// A key this writer gave twice: the whole output fails.
    pub failed: Option<String>,
}

impl Placer {
    pub fn new(client: &Client, dir: &Dir, rank: u32, fixed: Fixed, threshold: usize) -> Self {
        Self {
            client: client.clone(),
            output: dir.child("output"),
            rank,
            fixed,
            threshold,
            keys: KeySet::default(),
            buf: Placed::default(),
            spare: None,
            file: None,
            inflight: InFlight::new("writing records in place"),
            records: 0,
            failed: None,
        }
    }

    /// Buffers the record of `key`; true when the buffer holds `threshold` bytes.
    pub fn place(&mut self, key: u64, record: &[u8]) -> Result<bool> {
        if let Some(why) = &self.failed {
            return Err(Error::Failed(why.clone()));
        }
        let f = &self.fixed;
        if record.len() as u64 != f.record_size {
            return Err(Error::Invalid(format!(
                "a record of {} bytes: the records of this output are {} bytes each",
                record.len(),
                f.record_size
            )));
        }
        if !f.keys.contains(&key) {
            return Err(Error::Invalid(format!(
                "key {key} is outside the key range {}:{} (the end excluded)",
                f.keys.start, f.keys.end
            )));
        }
        let k = key - f.keys.start;
        if !self.keys.insert(k) {
            let why = format!("key {key} given twice (both times by writer {})", self.rank);
            self.failed = Some(why.clone());
            return Err(Error::Failed(why));
        }
        if self.buf.data.capacity() == 0 {
            let bytes = self.threshold.min(MAX_RESERVE);
            self.buf.data.reserve(bytes);
            self.buf.keys.reserve(bytes / record.len().max(64));
        }
        self.buf.keys.push(k);
        self.buf.data.extend_from_slice(record);
        self.records += 1;
        Ok(self.buf.data.len() + 8 * self.buf.keys.len() >= self.threshold)
    }

    /// Starts writing the buffer in place in the background, once the one before is stored.
    pub async fn flush(&mut self) -> Result<()> {
        if self.buf.keys.is_empty() {
            return Ok(());
        }
        self.wait().await?;
        let file = match self.file.take() {
            Some(f) => f,
            None => self.client.open(&self.output, &write_output()).await?,
        };
        let next = self.spare.take().unwrap_or_default();
        let buf = std::mem::replace(&mut self.buf, next);
        let size = self.fixed.record_size;
        self.inflight.start(place(file, buf, size));
        Ok(())
    }

    pub async fn wait(&mut self) -> Result<()> {
        if let Some((file, mut buf)) = self.inflight.wait().await? {
            self.file = Some(file);
            buf.keys.clear();
            buf.data.clear();
            self.spare = Some(buf);
        }
        Ok(())
    }

    pub fn test(&self) -> bool {
        self.inflight.test()
    }

    pub fn stop(&mut self) {
        self.inflight.stop();
    }

    /// Writes what is buffered, waits until all is stored, and closes the output.
    pub async fn close(&mut self) -> Result<()> {
        self.flush().await?;
        self.wait().await?;
        if let Some(f) = self.file.take() {
            f.close().await?;
        }
        Ok(())
    }

    /// The published form of the keys given.
    pub fn key_set(&self) -> Vec<u8> {
        self.keys.encode()
    }
}

/// Checks writer `rank`'s share of the key range: the first key two of `writers` writers gave
/// there, as an error naming it. Reads at most about `memory` bytes of key sets at a time.
pub(crate) async fn check_share(
    client: &Client,
    dir: &Dir,
    fixed: &Fixed,
    rank: u32,
    writers: u32,
    memory: usize,
) -> Result<()> {
    let total = (fixed.keys.end - fixed.keys.start).div_ceil(CHUNK);
    let share = |r: u32| total * u64::from(r) / u64::from(writers);
    let (from, to) = (share(rank), share(rank + 1));
    if from == to {
        return Ok(());
    }
    let reader = client.with_readahead(0);
    let opening: Vec<_> = (0..writers)
        .map(|r| {
            let (reader, path) = (reader.clone(), dir.child(&format!("w{r}.keys")));
            async move {
                let mut f = reader.open(&path, &OpenOptions::read()).await?;
                let head = f.read_at(0, 8).await?;
                let n = <[u8; 8]>::try_from(&head[..])
                    .map(u64::from_le_bytes)
                    .map_err(|_| Error::Corrupt(format!("w{r}.keys: shorter than its header")))?;
                let chunks = match usize::try_from(n) {
                    Ok(n) if 8 + 8 * (n as u64) <= f.len() => {
                        decode_chunks(&f.read_at(8, 8 * n).await?)?
                    }
                    _ => return Err(Error::Corrupt(format!("w{r}.keys: {n} chunks"))),
                };
                Ok::<_, Error>((r, f, chunks))
            }
        })
        .collect();
    let mut sets: Vec<(u32, File, Vec<u64>)> = stream::iter(opening)
        .buffered(READING)
        .try_collect()
        .await?;
    let window = (memory as u64 / (u64::from(writers) * CHUNK_BYTES)).max(1);
    let mut at = from;
    while at < to {
        let end = (at + window).min(to);
        let reads: Vec<_> = sets
            .iter_mut()
            .map(|(r, f, chunks)| {
                let (offset, len, held) = span(chunks, at, end);
                let (r, held) = (*r, held.to_vec());
                async move {
                    let bits = if len == 0 {
                        Bytes::new()
                    } else {
                        f.read_at(offset, len as usize).await?
                    };
                    if bits.len() as u64 != len {
                        return Err(Error::Corrupt(format!("w{r}.keys: cut short")));
                    }
                    Ok::<_, Error>((r, held, bits))
                }
            })
            .collect();
        let read: Vec<(u32, Vec<u64>, Bytes)> =
            stream::iter(reads).buffered(READING).try_collect().await?;
        let args: Vec<(u32, &[u64], &[u8])> = read
            .iter()
            .map(|(r, held, bits)| (*r, &held[..], &bits[..]))
            .collect();
        if let Some(d) = duplicate(&args) {
            return Err(Error::Failed(format!(
                "key {} given twice (by writers {} and {})",
                fixed.keys.start + d.key,
                d.first,
                d.second
            )));
        }
        at = end;
    }
    for (_, f, _) in sets {
        let _ = f.close().await;
    }
    Ok(())
}
