//! Collective output: N writers (threads, processes, nodes) append records to one output, and
//! finalisation makes it one ordinary Tessera file holding all of them, sorted by key when
//! they carry keys (ARC's aggregation and reordering, §III-A to III-E).
//!
//! Tessera itself is the medium between the writers, as PLFS's is: no server protocol, no
//! MPI. An output `P` has a hidden working directory beside it,
//! `dirname(P)/.tessera-collective.<name>/`, where
//!
//! * each writer spills its buffer, sorted, as run files `w<rank>.r<k>` whenever it holds
//!   `threshold` bytes (in the background: ARCFlush / ARCWait / ARCTest), touches
//!   `w<rank>.alive` every second while it lives, and writes `w<rank>.done` (its runs, a
//!   sample of their keys, its node and load) when it finalises;
//! * once every marker is there, every writer makes the same choice of coordinators
//!   ([`choose`]) and the same ranges of the output order ([`plan`]); each coordinator merges
//!   its range from every run ([`merge`]) straight into the output at the offset the runs'
//!   indexes give, in large writes, and writes `c<i>.done`;
//! * coordinator 0 then renames the output to `P` (readers see nothing, then all of it),
//!   and removes the directory. A writer that dies or leaves makes every other fail, and an
//!   `error` file tells readers why; `P` never appears short.
//!
//! See docs/design/collective-output.md and the "Collective output" section of
//! docs/SEMANTICS.md.

pub mod choose;
mod coordinate;
mod dir;
pub mod fields;
mod finish;
mod fixed;
mod inflight;
pub mod keys;
pub mod marker;
pub mod merge;
pub mod order;
pub mod plan;
pub mod run;
mod spill;
mod watch;
mod writer;

pub use choose::Strategy;
pub use finish::wait_output;
pub use writer::Collective;

use std::time::Duration;

/// Errors of a collective output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Client(#[from] tessera_client::Error),
    #[error("{0}")]
    Invalid(String),
    /// The output will not be made: a writer died, left or failed (the message says which),
    /// or the writers disagree.
    #[error("collective output failed: {0}")]
    Failed(String),
    #[error("damaged collective output data: {0}")]
    Corrupt(String),
}

impl Error {
    /// The POSIX code closest to it.
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            Self::Client(e) => e.errno(),
            Self::Invalid(_) => libc::EINVAL,
            Self::Failed(_) | Self::Corrupt(_) => libc::EIO,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Fixed-size records placed by key: a record with key `k` goes to offset `(k - keys.start) *
/// record_size` of the output, written in place as buffers fill (no sort, no merge). The
/// output is `(keys.end - keys.start) * record_size` bytes; a key nobody gave reads as zeros.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fixed {
    /// Bytes of every record, 1 to [`MAX_RECORD_SIZE`].
    pub record_size: u64,
    /// The keys records may have, `[start, end)`.
    pub keys: std::ops::Range<u64>,
}

/// The largest fixed record size.
pub const MAX_RECORD_SIZE: u64 = 4 << 30;

impl Fixed {
    /// Bytes of the whole output.
    #[must_use]
    pub fn size(&self) -> u64 {
        (self.keys.end - self.keys.start) * self.record_size
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.record_size == 0 || self.record_size > MAX_RECORD_SIZE {
            return bad(format!(
                "a record size of {} bytes: fixed-size records hold from 1 byte to 4 GiB",
                self.record_size
            ));
        }
        if self.keys.start >= self.keys.end {
            return bad(format!(
                "the key range {}:{} is empty: the end must be above the start",
                self.keys.start, self.keys.end
            ));
        }
        let fits = (self.keys.end - self.keys.start)
            .checked_mul(self.record_size)
            .is_some_and(|n| n <= i64::MAX as u64);
        if !fits {
            return bad(format!(
                "{} keys of {} bytes make an output larger than a file can be",
                self.keys.end - self.keys.start,
                self.record_size
            ));
        }
        Ok(())
    }
}

/// The order of an output without keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// Rank after rank, each writer's records in the order it appended them: the same output
    /// every time. A writer's part is placed once every writer is done, so what it spilled
    /// before is written twice.
    #[default]
    Rank,
    /// Each buffer in the order it reached the output, written once, at once, at the end the
    /// output has then (a reservation at the server holding its size): a writer's records
    /// stay in its order, buffers of writers interleave. Not with `top`.
    Arrival,
}

impl std::str::FromStr for Order {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "rank" => Ok(Self::Rank),
            "arrival" => Ok(Self::Arrival),
            _ => Err(format!("no order {s:?}: rank or arrival")),
        }
    }
}

/// How a writer takes part in a collective output. Every writer of one output must give the
/// same `writers`, `sorted`, `order`, `top`, `fixed`, `strategy` and `coordinators_per_node`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Writers taking part (as an MPI communicator's size).
    pub writers: u32,
    /// This writer's rank, `0..writers`.
    pub rank: u32,
    /// Records carry keys and the output is sorted by them.
    pub sorted: bool,
    /// Without keys: the order of the writers' records ([`Order`]).
    pub order: Order,
    /// Bytes a writer buffers before it writes them out as a run (ARC's threshold).
    pub threshold: usize,
    /// Keep only the first `top` records of the output order.
    pub top: Option<u64>,
    /// Fixed-size records placed by key ([`Fixed`]) instead of records of any size; neither
    /// `sorted` nor `top` then.
    pub fixed: Option<Fixed>,
    pub strategy: Strategy,
    /// Coordinators per node (node = host name).
    pub coordinators_per_node: usize,
    /// A coordinator's merge buffers; past what they allow at once, runs are merged in
    /// passes through intermediate runs in Tessera.
    pub memory: usize,
    /// A writer whose heartbeat stops this long is taken for dead.
    pub timeout: Duration,
    /// How long finalisation waits for a writer that never joined.
    pub join_timeout: Duration,
}

impl Options {
    #[must_use]
    pub fn new(writers: u32, rank: u32) -> Self {
        Self {
            writers,
            rank,
            sorted: false,
            order: Order::Rank,
            threshold: 16 << 20,
            top: None,
            fixed: None,
            strategy: Strategy::default(),
            coordinators_per_node: 1,
            memory: 64 << 20,
            timeout: Duration::from_secs(10),
            join_timeout: Duration::from_secs(300),
        }
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.writers == 0 || self.rank >= self.writers {
            return bad(format!(
                "rank {} of {} writers: ranks go from 0 to writers - 1",
                self.rank, self.writers
            ));
        }
        if self.threshold == 0 || self.coordinators_per_node == 0 {
            return bad("threshold and coordinators per node must be at least 1".into());
        }
        if self.timeout < 2 * watch::HEARTBEAT {
            return bad(format!(
                "a timeout of {:?} is too short: writers touch their heartbeat every {:?}",
                self.timeout,
                watch::HEARTBEAT
            ));
        }
        if self.order == Order::Arrival
            && (self.sorted || self.top.is_some() || self.fixed.is_some())
        {
            return bad(
                "arrival order is for records without keys, and keeps them all: not with sorted, top or fixed-size records"
                    .into(),
            );
        }
        if let Some(f) = &self.fixed {
            if self.sorted || self.top.is_some() {
                return bad(
                    "fixed-size records are placed by key: sorted and top do not apply".into(),
                );
            }
            f.check()?;
        }
        if self.memory < coordinate::MIN_MEMORY {
            return bad(format!(
                "a coordinator needs at least {} KiB of memory",
                coordinate::MIN_MEMORY >> 10
            ));
        }
        Ok(())
    }
}

/// What finalisation made.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Bytes of the output.
    pub size: u64,
    /// Records in it.
    pub records: u64,
    /// The coordinators, by rank, in the order of their ranges. Without keys, and for
    /// fixed-size records, every writer writes (or checks) its own part: all ranks.
    pub coordinators: Vec<u32>,
    /// This writer's coordinator index, if it was one.
    pub coordinator: Option<usize>,
    /// Runs this writer wrote (in arrival order: buffers it wrote into the output).
    pub runs: u32,
    /// From the start of finalisation until every writer's marker was there.
    pub waited: Duration,
    /// From then until the output was in place: aggregation (merge and writes) alone.
    pub aggregation: Duration,
    /// This writer's own merge, if it was a coordinator (without keys: the writes of its
    /// part; fixed-size records: its check of its share of the keys).
    pub merge: Option<Duration>,
    /// Its merge passes, if it merged: more than one when its runs were too many for its
    /// memory at once.
    pub passes: Option<u32>,
}
