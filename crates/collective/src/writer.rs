//! A writer of a collective output: join, append, flush / wait / test, finalise or abort.

use crate::choose::{choose, Candidate};
use crate::coordinate::coordinate;
use crate::dir::{run_name, Dir, Listing};
use crate::marker::{Abort, Agreed, Finished, Marker, RunSummary};
use crate::plan::cuts;
use crate::run::RunEncoder;
use crate::watch::{Watch, HEARTBEAT};
use crate::{Error, Options, Outcome, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use std::time::{Duration, Instant};
use tessera_client::{Client, ErrorCode, FileKind, OpenOptions, SetAttr, Timespec};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

/// Bytes of a run encoded at a time and written.
const WRITE_CHUNK: usize = 4 << 20;
/// The most a writer reserves for its buffer ahead of need.
const MAX_RESERVE: usize = 1 << 30;
/// What an entry of the buffer costs beside its bytes.
const ENTRY_COST: usize = std::mem::size_of::<Entry>();
/// The longest pause between two looks at the working directory (a reader waiting for the
/// output); writers pause at most 10 ms per writer, within [`POLL_MIN_MAX`] and this, so that
/// the listings of many writers stay few per second.
const POLL_MAX: Duration = Duration::from_secs(1);
const POLL_MIN_MAX: Duration = Duration::from_millis(50);

/// The longest pause of a writer of `writers` between two looks at the working directory.
fn poll_max(writers: u32) -> Duration {
    (Duration::from_millis(10) * writers).clamp(POLL_MIN_MAX, POLL_MAX)
}

/// A buffered record: where its key and record lie in the buffer's bytes.
#[derive(Clone, Copy)]
struct Entry {
    at: usize,
    key: u32,
    record: u32,
}

#[derive(Default)]
struct Buffer {
    data: Vec<u8>,
    entries: Vec<Entry>,
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
    }
}

/// One writer of a collective output. Drop it without [`Collective::finalise`] and it leaves
/// (as [`Collective::abort`]): the other writers fail with an error naming it.
pub struct Collective {
    client: Client,
    dir: Dir,
    opts: Options,
    buf: Buffer,
    runs: Vec<RunSummary>,
    /// The run being written in the background; it gives its buffer back.
    inflight: Option<JoinHandle<Result<(RunSummary, Buffer)>>>,
    /// The buffer of the last run written, for the next.
    spare: Option<Buffer>,
    next_run: u32,
    heartbeat: JoinHandle<()>,
    /// Finalised or aborted: nothing is left to do on drop.
    closed: bool,
    runtime: tokio::runtime::Handle,
}

/// The node's name.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the name is NUL-terminated within it (or
    // truncated, and then cut at the buffer's end below).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The node's load average over a minute (0 where unknown).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Writes `buf` as run `k` of `rank`: sorted (stably, by key) unless unsorted, then encoded
/// and written a chunk at a time; gives the buffer back.
async fn write_run(
    client: Client,
    path: Vec<u8>,
    buf: Buffer,
    sorted: bool,
    run: u32,
) -> Result<(RunSummary, Buffer)> {
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
    Ok((RunSummary::of(run, &index), buf))
}

/// Touches `ino` (the writer's `.alive`) every [`HEARTBEAT`] until aborted.
async fn beat(client: Client, ino: u64) {
    loop {
        tokio::time::sleep(HEARTBEAT).await;
        let now = Timespec::now();
        let attr = SetAttr {
            mtime: Some(now),
            ctime: now,
            ..SetAttr::default()
        };
        if let Err(e) = client.setattr(ino, attr).await {
            debug!("heartbeat: {e}");
        }
    }
}

impl Collective {
    /// Joins the collective output `path` as `opts.rank` of `opts.writers`. The output's
    /// directory must exist.
    pub async fn join(client: &Client, path: impl AsRef<[u8]>, opts: Options) -> Result<Self> {
        opts.check()?;
        let dir = Dir::of(path.as_ref())?;
        let rank = opts.rank;
        match client.create_dir(&dir.path).await {
            Ok(_) => {}
            Err(e) if e.is(&ErrorCode::Exists) => {
                if client.stat(&dir.path).await?.kind != FileKind::Dir {
                    return Err(Error::Invalid(format!(
                        "{} is not a directory",
                        dir.show_dir()
                    )));
                }
            }
            Err(e) => return Err(e.into()),
        }
        let listing = dir.list(client).await?.unwrap_or_default();
        if listing.error {
            return Err(Error::Failed(failure(client, &dir).await));
        }
        if listing.has(rank) {
            let why = format!(
                "writer {rank} joined twice, or a collective output to {} before this one left {}: remove it",
                dir.show(),
                dir.show_dir()
            );
            let _ = dir.put(client, rank, "error", why.as_bytes()).await;
            return Err(Error::Failed(why));
        }
        let alive = format!("host {} pid {}\n", host_name(), std::process::id());
        let alive_path = dir.child(&format!("w{rank}.alive"));
        client.write(&alive_path, alive.as_bytes()).await?;
        let ino = client.stat(&alive_path).await?.ino;
        Ok(Self {
            heartbeat: tokio::spawn(beat(client.clone(), ino)),
            client: client.clone(),
            dir,
            opts,
            buf: Buffer::default(),
            runs: Vec::new(),
            inflight: None,
            spare: None,
            next_run: 0,
            closed: false,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    #[must_use]
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Adds a record (with its key if the output is sorted; none is an empty key, first) to
    /// the buffer, without I/O. True when the buffer holds `threshold` bytes: call
    /// [`Self::flush`] then.
    pub fn push(&mut self, record: &[u8], key: Option<&[u8]>) -> Result<bool> {
        self.open()?;
        let key = match (key, self.opts.sorted) {
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
        if self.buf.data.capacity() == 0 {
            // Room for a whole run at once (reserved, not yet touched): no copies as it grows.
            let bytes = self.opts.threshold.min(MAX_RESERVE);
            self.buf.data.reserve(bytes);
            self.buf.entries.reserve(bytes / 64);
        }
        let at = self.buf.data.len();
        self.buf.data.extend_from_slice(key);
        self.buf.data.extend_from_slice(record);
        self.buf.entries.push(Entry {
            at,
            key: klen,
            record: rlen,
        });
        Ok(self.buf.cost() >= self.opts.threshold)
    }

    /// Appends a record; at `threshold` the buffer goes out as a run (ARC's
    /// `ARCWriteAfterSort`).
    pub async fn append(&mut self, record: &[u8], key: Option<&[u8]>) -> Result<()> {
        if self.push(record, key)? {
            self.flush().await?;
        }
        Ok(())
    }

    /// Starts writing the buffer as a run in the background (ARCFlush). Waits first for the
    /// run before, if it is still being written: a writer holds at most its buffer and one
    /// run in flight.
    pub async fn flush(&mut self) -> Result<()> {
        self.open()?;
        if self.buf.entries.is_empty() {
            return Ok(());
        }
        self.wait().await?;
        let next = self.spare.take().unwrap_or_default();
        let buf = std::mem::replace(&mut self.buf, next);
        let run = self.next_run;
        self.next_run += 1;
        let path = self.dir.child(&run_name(self.opts.rank, run));
        self.inflight = Some(tokio::spawn(write_run(
            self.client.clone(),
            path,
            buf,
            self.opts.sorted,
            run,
        )));
        Ok(())
    }

    /// Waits until every run issued is written (ARCWait).
    pub async fn wait(&mut self) -> Result<()> {
        if let Some(task) = self.inflight.take() {
            let (run, mut buf) = task
                .await
                .map_err(|e| Error::Failed(format!("writing a run: {e}")))??;
            self.runs.push(run);
            buf.clear();
            self.spare = Some(buf);
        }
        Ok(())
    }

    /// Whether every run issued is written, without waiting (ARCTest).
    #[must_use]
    pub fn test(&self) -> bool {
        self.inflight.as_ref().is_none_or(JoinHandle::is_finished)
    }

    fn open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::Invalid(
                "this writer has finalised or left its collective output".into(),
            ));
        }
        Ok(())
    }

    /// Writes what is left, then waits for the other writers and takes part in aggregation;
    /// returns once the output is in place (to every writer), or fails if any writer died,
    /// left or failed (ARCFinalize). Cancelled (the future dropped), the writer is still
    /// open: abort it, or drop it.
    pub async fn finalise(&mut self) -> Result<Outcome> {
        self.open()?;
        let out = self.finalise_inner().await;
        // Whatever went wrong is the output's `error` (unless one is there already: then
        // that is the reason), so the other writers and the readers hear of it at once.
        let out = match out {
            Ok(o) => Ok(o),
            Err(e) => {
                let why = match e {
                    Error::Failed(why) => why,
                    e => format!("writer {}: {e}", self.opts.rank),
                };
                Err(Error::Failed(self.fail(&why).await))
            }
        };
        self.closed = true;
        self.heartbeat.abort();
        if out.is_err() {
            self.remove_runs().await;
        }
        out
    }

    async fn finalise_inner(&mut self) -> Result<Outcome> {
        let started = Instant::now();
        self.flush().await?;
        self.wait().await?;
        let rank = self.opts.rank;
        let marker = Marker {
            rank,
            agreed: self.agreed(),
            host: host_name(),
            pid: std::process::id(),
            load: load_average(),
            records: self.runs.iter().map(|r| r.records).sum(),
            bytes: self.runs.iter().map(|r| r.bytes).sum(),
            runs: self.runs.clone(),
        };
        let json = serde_json::to_vec(&marker).map_err(|e| Error::Invalid(e.to_string()))?;
        self.dir
            .put(&self.client, rank, &format!("w{rank}.done"), &json)
            .await?;
        let writers = self.opts.writers;
        let mut watch = Watch::new(self.opts.timeout, self.opts.join_timeout, Instant::now());
        self.wait_until(&mut watch, |l| {
            let missing: Vec<u32> = (0..writers).filter(|r| !l.done.contains(r)).collect();
            (missing.is_empty(), missing)
        })
        .await?
        .ok_or_else(|| Error::Failed(format!("{} was removed", self.dir.show_dir())))?;
        let all_in = Instant::now();
        let names: Vec<String> = (0..writers).map(|r| format!("w{r}.done")).collect();
        let reads: Vec<_> = names
            .iter()
            .map(|n| self.dir.get::<Marker>(&self.client, n))
            .collect();
        let markers: Vec<Marker> = stream::iter(reads).buffered(32).try_collect().await?;
        if let Some(m) = markers.iter().find(|m| m.agreed != marker.agreed) {
            return Err(Error::Failed(
                self.fail(&format!(
                    "writers {} and {} disagree on the options: {:?} and {:?}",
                    m.rank, rank, m.agreed, marker.agreed
                ))
                .await,
            ));
        }
        let candidates: Vec<Candidate> = markers
            .iter()
            .map(|m| Candidate {
                rank: m.rank,
                host: m.host.clone(),
                bytes: m.bytes,
                load: m.load,
            })
            .collect();
        let coordinators = choose(
            &candidates,
            self.opts.strategy,
            self.opts.coordinators_per_node,
        );
        let bounds = cuts(&markers, coordinators.len(), self.opts.top);
        let total: u64 = markers.iter().map(|m| m.records).sum();
        let records = self.opts.top.map_or(total, |k| k.min(total));
        let me = coordinators.iter().position(|&r| r == rank);
        let (mut merge, mut passes) = (None, None);
        if let Some(i) = me {
            let done = coordinate(
                &self.client,
                &self.dir,
                &markers,
                &bounds,
                i,
                rank,
                self.opts.memory,
            )
            .await?;
            merge = Some(Duration::from_secs_f64(done.merge_secs));
            passes = Some(done.passes);
            let json = serde_json::to_vec(&done).map_err(|e| Error::Invalid(e.to_string()))?;
            self.dir
                .put(&self.client, rank, &format!("c{i}.done"), &json)
                .await?;
        }
        let n = coordinators.len();
        let gone = || Error::Failed(format!("{} was removed", self.dir.show_dir()));
        let size = if me == Some(0) {
            // All ranges in: the output goes in place.
            self.wait_until(&mut watch, |l| {
                let missing: Vec<u32> = (0..n)
                    .filter(|i| !l.coordinators_done.contains(i))
                    .map(|i| coordinators[i])
                    .collect();
                (missing.is_empty(), missing)
            })
            .await?
            .ok_or_else(gone)?;
            self.install(&coordinators, records, all_in).await?
        } else {
            let finisher = coordinators.first().copied();
            self.wait_until(&mut watch, |l| {
                let mut missing: Vec<u32> = (0..n)
                    .filter(|i| !l.coordinators_done.contains(i))
                    .map(|i| coordinators[i])
                    .collect();
                missing.extend(finisher);
                (l.finished, missing)
            })
            .await?
            .ok_or_else(gone)?;
            self.dir
                .get::<Finished>(&self.client, "finished")
                .await?
                .size
        };
        self.leave_finished().await;
        Ok(Outcome {
            size,
            records,
            coordinators,
            coordinator: me,
            runs: self.runs.len() as u32,
            waited: all_in - started,
            aggregation: all_in.elapsed(),
            merge,
            passes,
        })
    }

    /// Coordinator 0, once every range is written: the output renamed into place and
    /// `finished` written. Returns the output's size.
    async fn install(&self, coordinators: &[u32], records: u64, all_in: Instant) -> Result<u64> {
        let (client, dir) = (&self.client, &self.dir);
        let opts = OpenOptions {
            read: false,
            write: true,
            create: true,
            ..OpenOptions::default()
        };
        // Every range may have been empty.
        let f = client.open(dir.child("output"), &opts).await?;
        let size = f.len();
        f.close().await?;
        client.rename_path(dir.child("output"), &dir.output).await?;
        let finished = Finished {
            size,
            records,
            coordinators: coordinators.to_vec(),
            aggregation_secs: all_in.elapsed().as_secs_f64(),
        };
        let json = serde_json::to_vec(&finished).map_err(|e| Error::Invalid(e.to_string()))?;
        dir.put(client, self.opts.rank, "finished", &json).await?;
        Ok(size)
    }

    /// This writer saw the output in place: it says so, and the last to say so removes the
    /// working directory (so that none finds it gone before it has seen `finished`).
    async fn leave_finished(&self) {
        let (client, dir, rank) = (&self.client, &self.dir, self.opts.rank);
        let seen = dir.put(client, rank, &format!("w{rank}.seen"), b"").await;
        let last = match (seen, dir.list(client).await) {
            (Ok(()), Ok(Some(l))) => (0..self.opts.writers).all(|r| l.seen.contains(&r)),
            _ => false,
        };
        if last {
            if let Err(e) = dir.remove(client).await {
                warn!(
                    "{} is in place, but removing {}: {e}",
                    dir.show(),
                    dir.show_dir()
                );
            }
        }
    }

    /// Looks at the working directory, less and less often, until `ready` says so (it also
    /// names the writers still to be heard from). `None`: the directory is gone (the output
    /// is in place). Fails on an `error`, an abort, or a writer waited for that is dead.
    async fn wait_until(
        &self,
        watch: &mut Watch,
        ready: impl Fn(&Listing) -> (bool, Vec<u32>),
    ) -> Result<Option<Listing>> {
        let mut pause = Duration::from_millis(5);
        loop {
            let Some(listing) = self.dir.list(&self.client).await? else {
                return Ok(None);
            };
            if listing.error {
                return Err(Error::Failed(failure(&self.client, &self.dir).await));
            }
            if let Some(&r) = listing.aborted.iter().next() {
                let name = format!("w{r}.abort");
                let why = match self.dir.get::<Abort>(&self.client, &name).await {
                    Ok(a) => format!("writer {r} left without finishing: {}", a.reason),
                    Err(_) => format!("writer {r} left without finishing"),
                };
                return Err(Error::Failed(self.fail(&why).await));
            }
            let (done, missing) = ready(&listing);
            if done {
                return Ok(Some(listing));
            }
            if let Some(why) = watch.check(&listing, missing, Instant::now()) {
                return Err(Error::Failed(self.fail(&why).await));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(poll_max(self.opts.writers));
        }
    }

    fn agreed(&self) -> Agreed {
        Agreed {
            writers: self.opts.writers,
            sorted: self.opts.sorted,
            top: self.opts.top,
            strategy: self.opts.strategy,
            coordinators_per_node: self.opts.coordinators_per_node,
        }
    }

    /// Records `why` as the output's `error` (unless one is there: then that is the reason)
    /// and removes the partial output; returns the reason.
    async fn fail(&self, why: &str) -> String {
        fail(&self.client, &self.dir, self.opts.rank, why).await
    }

    async fn remove_runs(&self) {
        for k in 0..self.next_run {
            let _ = self
                .client
                .remove_file(self.dir.child(&run_name(self.opts.rank, k)))
                .await;
        }
    }

    /// Leaves without finishing: the other writers' finalisation fails naming this writer,
    /// and readers find why in the output's `error`.
    pub async fn abort(&mut self, reason: &str) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.heartbeat.abort();
        if let Some(t) = self.inflight.take() {
            t.abort();
        }
        leave(
            &self.client,
            &self.dir,
            self.opts.rank,
            reason,
            self.next_run,
        )
        .await
    }
}

/// What a leaving writer writes: its `abort` and the output's `error`; then its runs go.
async fn leave(client: &Client, dir: &Dir, rank: u32, reason: &str, runs: u32) -> Result<()> {
    let abort = Abort {
        rank,
        reason: reason.to_string(),
    };
    let json = serde_json::to_vec(&abort).map_err(|e| Error::Invalid(e.to_string()))?;
    // The error first: whoever sees the abort marker finds the reason in place already.
    fail(
        client,
        dir,
        rank,
        &format!("writer {rank} left without finishing: {reason}"),
    )
    .await;
    dir.put(client, rank, &format!("w{rank}.abort"), &json)
        .await?;
    for k in 0..runs {
        let _ = client.remove_file(dir.child(&run_name(rank, k))).await;
    }
    Ok(())
}

/// The reason in the output's `error` file. A listing showed it: a read that finds it absent
/// met another writer's `error` replacing it (each writer records what it saw), and looks
/// again.
async fn failure(client: &Client, dir: &Dir) -> String {
    let mut tries = 0;
    loop {
        match client.read(dir.child("error")).await {
            Ok(b) => return String::from_utf8_lossy(&b).trim_end().to_string(),
            Err(e) if e.is(&ErrorCode::NotFound) && tries < ERROR_READS => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => return format!("{} holds an error that cannot be read: {e}", dir.show_dir()),
        }
    }
}

/// Reads of an `error` file found absent before giving up on it.
const ERROR_READS: u32 = 40;

async fn fail(client: &Client, dir: &Dir, rank: u32, why: &str) -> String {
    if let Ok(Some(l)) = dir.list(client).await {
        if l.error {
            return failure(client, dir).await;
        }
    }
    if let Err(e) = dir.put(client, rank, "error", why.as_bytes()).await {
        warn!("{}: recording the error: {e}", dir.show_dir());
    }
    let _ = client.remove_file(dir.child("output")).await;
    why.to_string()
}

impl Drop for Collective {
    fn drop(&mut self) {
        self.heartbeat.abort();
        if self.closed {
            return;
        }
        if let Some(t) = self.inflight.take() {
            t.abort();
        }
        let (client, dir, rank, runs) = (
            self.client.clone(),
            self.dir.clone(),
            self.opts.rank,
            self.next_run,
        );
        self.runtime.spawn(async move {
            if let Err(e) = leave(&client, &dir, rank, "dropped without finalising", runs).await {
                warn!("{}: leaving: {e}", dir.show_dir());
            }
        });
    }
}

/// Waits until the collective output `path` is in place (its size), or fails with the reason
/// its writers left in its working directory; gives up after `timeout` if one is given.
pub async fn wait_output(
    client: &Client,
    path: impl AsRef<[u8]>,
    timeout: Option<Duration>,
) -> Result<u64> {
    let dir = Dir::of(path.as_ref())?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match dir.list(client).await? {
            Some(l) if l.error => return Err(Error::Failed(failure(client, &dir).await)),
            Some(l) if !l.finished => {}
            // Gone, or finished: the output is in place.
            _ => match client.stat(&dir.output).await {
                Ok(i) => return Ok(i.size),
                Err(e) if e.is(&ErrorCode::NotFound) => {}
                Err(e) => return Err(e.into()),
            },
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            return Err(Error::Failed(format!(
                "{} did not appear within {:?}",
                dir.show(),
                timeout.unwrap_or_default()
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL_MAX);
    }
}
