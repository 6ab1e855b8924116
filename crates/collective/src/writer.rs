//! A writer of a collective output: join, append records (or put fixed-size ones), flush /
//! wait / test, finalise or abort.

use crate::choose::{choose, Candidate};
use crate::coordinate::coordinate;
use crate::dir::Dir;
use crate::finish::{
    check_parts, fail, failure, install, leave, leave_finished, remove_runs, wait_until,
};
use crate::fixed::{check_share, Placer};
use crate::marker::{Agreed, CoordinatorDone, Finished, Marker};
use crate::plan::cuts;
use crate::spill::Spiller;
use crate::watch::{Watch, HEARTBEAT};
use crate::{Error, Options, Order, Outcome, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use std::time::{Duration, Instant};
use tessera_client::{Client, ErrorCode, FileKind, SetAttr, Timespec};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

/// What a writer holds of its records (boxed: one per writer, and the two differ in size).
enum Records {
    /// Records of any size, with or without keys.
    Any(Box<Spiller>),
    /// Fixed-size records placed by key.
    Fixed(Box<Placer>),
}

/// One writer of a collective output. Drop it without [`Collective::finalise`] and it leaves
/// (as [`Collective::abort`]): the other writers fail with an error naming it.
pub struct Collective {
    client: Client,
    dir: Dir,
    opts: Options,
    records: Records,
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
        let records = match &opts.fixed {
            Some(f) => Records::Fixed(Box::new(Placer::new(
                client,
                &dir,
                rank,
                f.clone(),
                opts.threshold,
            ))),
            None => Records::Any(Box::new(Spiller::new(client, &dir, &opts))),
        };
        Ok(Self {
            heartbeat: tokio::spawn(beat(client.clone(), ino)),
            client: client.clone(),
            dir,
            opts,
            records,
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
        match &mut self.records {
            Records::Any(s) => s.push(record, key),
            Records::Fixed(_) => Err(Error::Invalid(
                "this collective output holds fixed-size records: put each with its key".into(),
            )),
        }
    }

    /// In arrival order: adds `count` whole records, given as their bytes one after another,
    /// as one (they stay together in the output); as [`Self::push`] for each, without the
    /// cost per record. True when the buffer holds `threshold` bytes.
    pub fn push_records(&mut self, records: &[u8], count: u64) -> Result<bool> {
        self.open()?;
        match &mut self.records {
            Records::Any(s) => s.push_records(records, count),
            Records::Fixed(_) => Err(Error::Invalid(
                "this collective output holds fixed-size records: put each with its key".into(),
            )),
        }
    }

    /// Appends a record; at `threshold` the buffer goes out as a run (ARC's
    /// `ARCWriteAfterSort`).
    pub async fn append(&mut self, record: &[u8], key: Option<&[u8]>) -> Result<()> {
        if self.push(record, key)? {
            self.flush().await?;
        }
        Ok(())
    }

    /// Adds the fixed-size record of `key` to the buffer, without I/O; true when the buffer
    /// holds `threshold` bytes: call [`Self::flush`] then. A key outside the range or a
    /// record of another size is refused; a key this writer gave before fails the writer
    /// (and, at its next flush, finalisation or abort, the whole output).
    pub fn place(&mut self, key: u64, record: &[u8]) -> Result<bool> {
        self.open()?;
        match &mut self.records {
            Records::Fixed(p) => p.place(key, record),
            Records::Any(_) => Err(Error::Invalid(
                "put is for fixed-size records (a record size and a key range): append records here"
                    .into(),
            )),
        }
    }

    /// Puts the fixed-size record of `key`: at offset `(key - start) * record_size` of the
    /// output, written in place once the buffer holds `threshold` bytes. A key given twice
    /// fails every writer, naming it.
    pub async fn put(&mut self, key: u64, record: &[u8]) -> Result<()> {
        match self.place(key, record) {
            Ok(true) => self.flush().await,
            Ok(false) => Ok(()),
            Err(Error::Failed(_)) => self.flush().await,
            Err(e) => Err(e),
        }
    }

    /// Starts writing the buffer in the background: as a run, or in place for fixed-size
    /// records (ARCFlush). Waits first for the buffer before, if it is still being written: a
    /// writer holds at most its buffer and one in flight.
    pub async fn flush(&mut self) -> Result<()> {
        self.open()?;
        if let Some(why) = self.failed() {
            return Err(Error::Failed(self.fail(&why).await));
        }
        match &mut self.records {
            Records::Any(s) => s.flush().await,
            Records::Fixed(p) => p.flush().await,
        }
    }

    /// Waits until every buffer issued is written (ARCWait).
    pub async fn wait(&mut self) -> Result<()> {
        match &mut self.records {
            Records::Any(s) => s.wait().await,
            Records::Fixed(p) => p.wait().await,
        }
    }

    /// Whether every buffer issued is written, without waiting (ARCTest).
    #[must_use]
    pub fn test(&self) -> bool {
        match &self.records {
            Records::Any(s) => s.test(),
            Records::Fixed(p) => p.test(),
        }
    }

    fn open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::Invalid(
                "this writer has finalised or left its collective output".into(),
            ));
        }
        Ok(())
    }

    /// Why this writer cannot go on (a key given twice), if so.
    fn failed(&self) -> Option<String> {
        match &self.records {
            Records::Fixed(p) => p.failed.clone(),
            Records::Any(_) => None,
        }
    }

    /// Runs issued, to remove when leaving.
    fn issued(&self) -> u32 {
        match &self.records {
            Records::Any(s) => s.issued,
            Records::Fixed(_) => 0,
        }
    }

    fn stop(&mut self) {
        self.heartbeat.abort();
        match &mut self.records {
            Records::Any(s) => s.stop(),
            Records::Fixed(p) => p.stop(),
        }
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
            remove_runs(&self.client, &self.dir, self.opts.rank, self.issued()).await;
        }
        out
    }

    /// This writer's records stored (runs, or in place) but, without keys, its buffer; its
    /// marker.
    async fn store(&mut self) -> Result<Marker> {
        let rank = self.opts.rank;
        let arrival = self.opts.order == Order::Arrival;
        let (records, bytes, runs, parts) = match &mut self.records {
            Records::Any(s) => {
                // Without keys, in rank order, the buffer goes straight into the output at
                // the end.
                if self.opts.sorted || arrival {
                    s.flush().await?;
                }
                s.wait().await?;
                let (records, bytes) = s.totals();
                (records, bytes, s.runs.clone(), s.parts.clone())
            }
            Records::Fixed(p) => {
                if let Some(why) = &p.failed {
                    return Err(Error::Failed(why.clone()));
                }
                p.close().await?;
                let name = format!("w{rank}.keys");
                self.dir
                    .put(&self.client, rank, &name, &p.key_set())
                    .await?;
                let bytes = p.records * p.fixed.record_size;
                (p.records, bytes, Vec::new(), Vec::new())
            }
        };
        Ok(Marker {
            rank,
            agreed: self.agreed(),
            host: host_name(),
            pid: std::process::id(),
            load: load_average(),
            records,
            bytes,
            runs,
            parts,
        })
    }

    /// This writer's part once every marker is in: coordinator `i`'s range merged (sorted),
    /// its own records written at its offset (without keys), or its share of the keys
    /// checked (fixed-size records).
    async fn part(
        &mut self,
        markers: &[Marker],
        coordinators: usize,
        i: usize,
    ) -> Result<CoordinatorDone> {
        let (rank, memory) = (self.opts.rank, self.opts.memory);
        let started = Instant::now();
        let before = &markers[..rank as usize];
        let (offset, records, bytes) = match &mut self.records {
            Records::Any(_) if self.opts.sorted => {
                let bounds = cuts(markers, coordinators, self.opts.top);
                let (client, dir) = (&self.client, &self.dir);
                return coordinate(client, dir, markers, &bounds, i, rank, memory).await;
            }
            Records::Any(s) => {
                let offset = before.iter().map(|m| m.bytes).sum();
                let earlier: u64 = before.iter().map(|m| m.records).sum();
                let limit = self.opts.top.map(|k| k.saturating_sub(earlier));
                let (records, bytes) = s.write_part(offset, limit, memory).await?;
                (offset, records, bytes)
            }
            Records::Fixed(p) => {
                let writers = self.opts.writers;
                check_share(&self.client, &self.dir, &p.fixed, rank, writers, memory).await?;
                (0, p.records, p.records * p.fixed.record_size)
            }
        };
        Ok(CoordinatorDone {
            index: i,
            rank,
            offset,
            records,
            bytes,
            passes: 1,
            merge_secs: started.elapsed().as_secs_f64(),
        })
    }

    async fn finalise_inner(&mut self) -> Result<Outcome> {
        let started = Instant::now();
        let marker = self.store().await?;
        let rank = self.opts.rank;
        let json = serde_json::to_vec(&marker).map_err(|e| Error::Invalid(e.to_string()))?;
        self.dir
            .put(&self.client, rank, &format!("w{rank}.done"), &json)
            .await?;
        let writers = self.opts.writers;
        let who = (rank, writers);
        let (client, dir) = (&self.client, &self.dir);
        let mut watch = Watch::new(self.opts.timeout, self.opts.join_timeout, Instant::now());
        let gone = || Error::Failed(format!("{} was removed", dir.show_dir()));
        wait_until(client, dir, who, &mut watch, |l| {
            let missing: Vec<u32> = (0..writers).filter(|r| !l.done.contains(r)).collect();
            (missing.is_empty(), missing)
        })
        .await?
        .ok_or_else(gone)?;
        let all_in = Instant::now();
        let names: Vec<String> = (0..writers).map(|r| format!("w{r}.done")).collect();
        let reads: Vec<_> = names
            .iter()
            .map(|n| self.dir.get::<Marker>(&self.client, n))
            .collect();
        let markers: Vec<Marker> = stream::iter(reads).buffered(32).try_collect().await?;
        if let Some(m) = markers.iter().find(|m| m.agreed != marker.agreed) {
            return Err(Error::Failed(format!(
                "writers {} and {} disagree on the options: {:?} and {:?}",
                m.rank, rank, m.agreed, marker.agreed
            )));
        }
        let total: u64 = markers.iter().map(|m| m.records).sum();
        let records = self.opts.top.map_or(total, |k| k.min(total));
        let coordinators: Vec<u32> = if self.opts.sorted {
            let candidates: Vec<Candidate> = markers
                .iter()
                .map(|m| Candidate {
                    rank: m.rank,
                    host: m.host.clone(),
                    bytes: m.bytes,
                    load: m.load,
                })
                .collect();
            let per_node = self.opts.coordinators_per_node;
            choose(&candidates, self.opts.strategy, per_node)
        } else if self.opts.order == Order::Arrival {
            // Every writer's records are in the output already.
            Vec::new()
        } else {
            // Every writer writes (or checks) its own part.
            (0..writers).collect()
        };
        let me = coordinators.iter().position(|&r| r == rank);
        let (mut merge, mut passes) = (None, None);
        if let Some(i) = me {
            let done = self.part(&markers, coordinators.len(), i).await?;
            merge = Some(Duration::from_secs_f64(done.merge_secs));
            passes = self.opts.sorted.then_some(done.passes);
            let json = serde_json::to_vec(&done).map_err(|e| Error::Invalid(e.to_string()))?;
            self.dir
                .put(&self.client, rank, &format!("c{i}.done"), &json)
                .await?;
        }
        let n = coordinators.len();
        let (client, dir) = (&self.client, &self.dir);
        let gone = || Error::Failed(format!("{} was removed", dir.show_dir()));
        // Coordinator 0 installs the output; writer 0 if there are no coordinators.
        let installer = coordinators.first().copied().unwrap_or(0);
        let size = if rank == installer {
            // All parts in: the output goes in place.
            wait_until(client, dir, who, &mut watch, |l| {
                let missing: Vec<u32> = (0..n)
                    .filter(|i| !l.coordinators_done.contains(i))
                    .map(|i| coordinators[i])
                    .collect();
                (missing.is_empty(), missing)
            })
            .await?
            .ok_or_else(gone)?;
            if self.opts.order == Order::Arrival {
                check_parts(client, dir, &markers).await?;
            }
            let done = Finished {
                size: self.opts.fixed.as_ref().map_or(0, crate::Fixed::size),
                records,
                coordinators: coordinators.clone(),
                aggregation_secs: all_in.elapsed().as_secs_f64(),
            };
            install(client, dir, rank, done).await?
        } else {
            wait_until(client, dir, who, &mut watch, |l| {
                let mut missing: Vec<u32> = (0..n)
                    .filter(|i| !l.coordinators_done.contains(i))
                    .map(|i| coordinators[i])
                    .collect();
                missing.push(installer);
                (l.finished, missing)
            })
            .await?
            .ok_or_else(gone)?;
            dir.get::<Finished>(client, "finished").await?.size
        };
        leave_finished(client, dir, rank, writers).await;
        let runs = match &self.records {
            Records::Any(s) => (s.runs.len() + s.parts.len()) as u32,
            Records::Fixed(_) => 0,
        };
        Ok(Outcome {
            size,
            records,
            coordinators,
            coordinator: me,
            runs,
            waited: all_in - started,
            aggregation: all_in.elapsed(),
            merge,
            passes,
        })
    }

    fn agreed(&self) -> Agreed {
        Agreed {
            writers: self.opts.writers,
            sorted: self.opts.sorted,
            order: self.opts.order,
            top: self.opts.top,
            fixed: self.opts.fixed.clone(),
            strategy: self.opts.strategy,
            coordinators_per_node: self.opts.coordinators_per_node,
        }
    }

    /// Records `why` as the output's `error` (unless one is there: then that is the reason)
    /// and removes the partial output; returns the reason.
    async fn fail(&self, why: &str) -> String {
        fail(&self.client, &self.dir, self.opts.rank, why).await
    }

    /// Leaves without finishing: the other writers' finalisation fails naming this writer
    /// (and the reason: a key it gave twice, if so), and readers find why in the output's
    /// `error`.
    pub async fn abort(&mut self, reason: &str) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.stop();
        let reason = self.failed().unwrap_or_else(|| reason.to_string());
        let (rank, runs) = (self.opts.rank, self.issued());
        leave(&self.client, &self.dir, rank, &reason, runs).await
    }
}

impl Drop for Collective {
    fn drop(&mut self) {
        self.heartbeat.abort();
        if self.closed {
            return;
        }
        self.stop();
        let reason = self
            .failed()
            .unwrap_or_else(|| "dropped without finalising".into());
        let (client, dir, rank, runs) = (
            self.client.clone(),
            self.dir.clone(),
            self.opts.rank,
            self.issued(),
        );
        self.runtime.spawn(async move {
            if let Err(e) = leave(&client, &dir, rank, &reason, runs).await {
                warn!("{}: leaving: {e}", dir.show_dir());
            }
        });
    }
}
