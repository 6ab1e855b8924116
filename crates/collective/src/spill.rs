//! A writer's records of any size: buffered, and spilled as runs (sorted by key when the
//! output is sorted) in the background each time the buffer holds `threshold` bytes. Without
//! keys the writer writes its own part of the output at finalisation: its runs copied and its
//! buffer written straight at its offset, no merge. In arrival order there are no runs: each
//! buffer goes into the output at once, at a reservation of its bytes at the output's end.

use crate::coordinate::{budget, merge_into, open_run, write_output, Output, Source, Writes};
use crate::dir::{run_name, Dir};
use crate::inflight::InFlight;
use crate::marker::{Part, RunSummary};
use crate::run::RunEncoder;
use crate::{Error, Options, Order, Result};
use bytes::BytesMut;
use tessera_client::{Client, OpenOptions};

/// Bytes of a run encoded at a time and written.
const WRITE_CHUNK: usize = 4 << 20;
/// The most a writer reserves for its buffer ahead of need.
pub(crate) const MAX_RESERVE: usize = 1 << 30;
/// Room for records pushed together beyond `threshold`, in arrival order.
const ARRIVAL_SLACK: usize = 2 << 20;
/// What an entry of the buffer costs beside its bytes.
const ENTRY_COST: usize = std::mem::size_of::<Entry>();

/// A buffered record: where its key and record lie in the buffer's bytes.
#[derive(Clone, Copy)]
struct Entry {
    at: usize,
    key: u32,
    record: u32,
}

#[derive(Default)]
struct Buffer {
    /// Keys and records; in arrival order handed to the client as they are (and taken back,
    /// the same memory, once written).
    data: BytesMut,
    /// One per record, except in arrival order, where nothing needs a record found again.
    entries: Vec<Entry>,
    /// Records buffered.
    records: u64,
}

impl Buffer {
    fn cost(&self) -> usize {
        self.data.len() + self.entries.len() * ENTRY_COST
    }
    fn key(&self, e: &Entry) -> &[u8] {
        &self.data[e.at..e.at + e.key as usize]
    }
    fn record(&self, e: &Entry) -> &[u8] {
        let at = e.at + e.key as usize;
        &self.data[at..at + e.record as usize]
    }
    /// The key's first 8 bytes as a number (zeros past its end): most comparisons of a sort
    /// end there.
    fn prefix(&self, e: &Entry) -> u64 {
        let k = self.key(e);
        let mut b = [0u8; 8];
        let n = k.len().min(8);
        b[..n].copy_from_slice(&k[..n]);
        u64::from_be_bytes(b)
    }
    /// Empty, its memory kept for the next run (already faulted in).
    fn clear(&mut self) {
        self.data.clear();
        self.entries.clear();
        self.records = 0;
    }
}

/// Where a buffer went.
enum Spilled {
    Run(RunSummary),
    Part(Part),
}

/// Writes `buf`'s records (without keys, its bytes are its records) into the output at a
/// reservation of as many bytes at its end, without copying them; gives the buffer back (its
/// memory the next fill reuses, once the writes let go of it).
async fn write_arrived(
    client: Client,
    output: Vec<u8>,
    mut buf: Buffer,
) -> Result<(Spilled, Buffer)> {
    let bytes = buf.data.len() as u64;
    let data = buf.data.split().freeze();
    let mut f = client.open(&output, &write_output()).await?;
    let written: Result<u64> = async {
        let offset = f.reserve(bytes).await?;
        f.write_bytes(offset, data).await?;
        Ok(offset)
    }
    .await;
    let closed = f.close().await;
    let offset = written?;
    closed?;
    let records = buf.records;
    let part = Part {
        offset,
        bytes,
        records,
    };
    Ok((Spilled::Part(part), buf))
}

/// Writes `buf` as run `k` of `rank`: sorted (stably, by key) unless unsorted, then encoded
/// and written a chunk at a time; gives the buffer back.
async fn write_run(
    client: Client,
    path: Vec<u8>,
    buf: Buffer,
    sorted: bool,
    run: u32,
) -> Result<(Spilled, Buffer)> {
    let (buf, order) = tokio::task::spawn_blocking(move || {
        let mut order: Vec<(u64, usize)> = buf
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (if sorted { buf.prefix(e) } else { 0 }, i))
            .collect();
        if sorted {
            let key = |i: usize| buf.key(&buf.entries[i]);
            order.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| key(a.1).cmp(key(b.1))));
        }
        (buf, order)
    })
    .await
    .map_err(|e| Error::Failed(format!("sorting a run: {e}")))?;
    let mut f = client.open(&path, &OpenOptions::create()).await?;
    let written: Result<_> = async {
        let mut enc = RunEncoder::new();
        let mut chunk = Vec::with_capacity(WRITE_CHUNK + (64 << 10));
        let mut at = 0u64;
        for (_, i) in order {
            let e = &buf.entries[i];
            enc.push(&mut chunk, buf.key(e), buf.record(e));
            if chunk.len() >= WRITE_CHUNK {
                f.write_at(at, &chunk).await?;
                at += chunk.len() as u64;
                chunk.clear();
            }
        }
        let index = enc.finish(&mut chunk);
        f.write_at(at, &chunk).await?;
        Ok(index)
    }
    .await;
    let closed = f.close().await;
    let index = written?;
    closed?;
    Ok((Spilled::Run(RunSummary::of(run, &index)), buf))
}

/// The records of one writer: its buffer and its runs.
pub(crate) struct Spiller {
    client: Client,
    dir: Dir,
    rank: u32,
    sorted: bool,
    arrival: bool,
    threshold: usize,
    buf: Buffer,
    pub runs: Vec<RunSummary>,
    /// In arrival order: the buffers written into the output.
    pub parts: Vec<Part>,
    /// The run (or part) being written in the background; it gives its buffer back.
    inflight: InFlight<(Spilled, Buffer)>,
    /// The buffer of the last run written, for the next.
    spare: Option<Buffer>,
    /// Runs issued (written or in flight).
    pub issued: u32,
}

impl Spiller {
    pub fn new(client: &Client, dir: &Dir, opts: &Options) -> Self {
        Self {
            client: client.clone(),
            dir: dir.clone(),
            rank: opts.rank,
            sorted: opts.sorted,
            arrival: opts.order == Order::Arrival,
            threshold: opts.threshold,
            buf: Buffer::default(),
            runs: Vec::new(),
            parts: Vec::new(),
            inflight: InFlight::new("writing a run"),
            spare: None,
            issued: 0,
        }
    }

    /// Buffers a record and its key; true when the buffer holds `threshold` bytes.
    pub fn push(&mut self, record: &[u8], key: Option<&[u8]>) -> Result<bool> {
        let key = match (key, self.sorted) {
            (Some(_), false) => {
                return Err(Error::Invalid(
                    "a key for an unsorted collective output".into(),
                ))
            }
            (k, _) => k.unwrap_or_default(),
        };
        let (Ok(klen), Ok(rlen)) = (u32::try_from(key.len()), u32::try_from(record.len())) else {
            return Err(Error::Invalid("a record or key of 4 GiB or more".into()));
        };
        self.make_room();
        let at = self.buf.data.len();
        self.buf.data.extend_from_slice(key);
        self.buf.data.extend_from_slice(record);
        if !self.arrival {
            self.buf.entries.push(Entry {
                at,
                key: klen,
                record: rlen,
            });
        }
        self.buf.records += 1;
        Ok(self.buf.cost() >= self.threshold)
    }

    /// In arrival order: buffers `count` whole records given as their bytes one after
    /// another (they go into the output together); true when the buffer holds `threshold`
    /// bytes.
    pub fn push_records(&mut self, records: &[u8], count: u64) -> Result<bool> {
        if !self.arrival {
            return Err(Error::Invalid(
                "records are pushed together only in arrival order: push each one".into(),
            ));
        }
        self.make_room();
        self.buf.data.extend_from_slice(records);
        self.buf.records += count;
        Ok(self.buf.cost() >= self.threshold)
    }

    /// Room for a whole run at once (reserved, not yet touched): no copies as it grows. In
    /// arrival order also for the records pushed together past `threshold`: a buffer that
    /// outgrew its memory would go out in a new allocation, to be faulted in afresh each time.
    fn make_room(&mut self) {
        if self.buf.data.capacity() == 0 {
            let bytes = self.threshold.min(MAX_RESERVE);
            let slack = if self.arrival { ARRIVAL_SLACK } else { 0 };
            self.buf.data.reserve(bytes + slack);
            if !self.arrival {
                self.buf.entries.reserve(bytes / 64);
            }
        }
    }

    /// Starts writing the buffer as a run (or into the output, in arrival order) in the
    /// background, once the one before is written.
    pub async fn flush(&mut self) -> Result<()> {
        if self.buf.records == 0 {
            return Ok(());
        }
        self.wait().await?;
        let next = self.spare.take().unwrap_or_default();
        let buf = std::mem::replace(&mut self.buf, next);
        if self.arrival {
            let output = self.dir.child("output");
            let client = self.client.clone();
            self.inflight.start(write_arrived(client, output, buf));
            return Ok(());
        }
        let run = self.issued;
        self.issued += 1;
        let path = self.dir.child(&run_name(self.rank, run));
        self.inflight
            .start(write_run(self.client.clone(), path, buf, self.sorted, run));
        Ok(())
    }

    /// Waits until every run issued is written.
    pub async fn wait(&mut self) -> Result<()> {
        if let Some((spilled, mut buf)) = self.inflight.wait().await? {
            match spilled {
                Spilled::Run(r) => self.runs.push(r),
                Spilled::Part(p) => self.parts.push(p),
            }
            buf.clear();
            self.spare = Some(buf);
        }
        Ok(())
    }

    pub fn test(&self) -> bool {
        self.inflight.test()
    }

    /// Stops the run in flight, if any.
    pub fn stop(&mut self) {
        self.inflight.stop();
    }

    /// Records and record bytes, in runs, in the output and buffered.
    pub fn totals(&self) -> (u64, u64) {
        let stored = self.runs.iter().map(|r| (r.records, r.bytes));
        let stored = stored.chain(self.parts.iter().map(|p| (p.records, p.bytes)));
        let (records, bytes) = stored.fold((0, 0), |(n, b), (rn, rb)| (n + rn, b + rb));
        (
            records + self.buf.records,
            bytes + self.record_bytes(self.buf.entries.len()),
        )
    }

    /// Record bytes of the first `n` buffered records (without keys: the buffer's bytes up to
    /// the next).
    fn record_bytes(&self, n: usize) -> u64 {
        let e = &self.buf.entries;
        if self.sorted {
            e[..n].iter().map(|e| u64::from(e.record)).sum()
        } else {
            e.get(n).map_or(self.buf.data.len(), |e| e.at) as u64
        }
    }

    /// Without keys: this writer's records, up to `limit` of them, written into the output at
    /// `offset`: its runs copied in order, then its buffer in one write. Records and bytes
    /// written.
    pub async fn write_part(
        &mut self,
        offset: u64,
        limit: Option<u64>,
        memory: usize,
    ) -> Result<(u64, u64)> {
        let (records, _) = self.totals();
        if records == 0 || limit == Some(0) {
            return Ok((0, 0));
        }
        let reader = self.client.with_readahead(0);
        let mut sources = Vec::with_capacity(self.runs.len());
        for r in &self.runs {
            let (file, index) =
                open_run(&reader, self.dir.child(&run_name(self.rank, r.run))).await?;
            sources.push(Source {
                file,
                from: 0,
                to: index.end.offset,
                count: index.end.records,
            });
        }
        let file = self
            .client
            .open(self.dir.child("output"), &write_output())
            .await?;
        let (block, cap) = budget(memory, sources.len());
        let mut out = Output {
            out: Writes::new(file, offset, cap),
            records: 0,
            bytes: 0,
        };
        // With every key empty, the merge gives the runs one after another.
        merge_into(sources, limit, block, &mut out).await?;
        let left = limit.map_or(u64::MAX, |k| k - out.records);
        let n = self
            .buf
            .entries
            .len()
            .min(usize::try_from(left).unwrap_or(usize::MAX));
        let end = self.record_bytes(n) as usize;
        let w = &mut out.out;
        w.file.write_at(w.at, &self.buf.data[..end]).await?;
        out.out.file.close().await?;
        Ok((out.records + n as u64, out.bytes + end as u64))
    }
}
