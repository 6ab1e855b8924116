//! Replays an I/O model ([`tessera_model::Model`]) as a synthetic kernel against a directory
//! (docs/MODEL.md, Replay): the model's processes (a thread each), files, phases in their
//! order, request sizes and offsets, and metadata bursts, without the application's data or
//! compute. Each phase and the whole are measured; the replay can trace itself so that its
//! own model can be compared with the original.

mod plan;
mod run;
mod think;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use run::{prepare, replay, Prepared};

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Keep the model's distance between one request's start and the next (the application's
    /// own time between them); `None`: requests follow each other at once.
    pub think: Option<Think>,
    /// Trace the replay into a new file in this directory (mode `library`, source `replay`).
    pub trace: Option<PathBuf>,
    /// Seeds the offsets of random phases (the same seed, the same offsets).
    pub seed: u64,
}

/// How a replay spends the application's time between two requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Think {
    /// On a core, as the application's compute did: a mount's daemon on the same cores then
    /// competes for them as it did under the original.
    Burn,
    /// Asleep, as an application waiting on something else (a pipe, the network).
    Sleep,
}

/// What went wrong; nothing of the replay is measured then.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", .path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a directory", .0.display())]
    NotDir(PathBuf),
    #[error("{} is not writable: {source}", .path.display())]
    NotWritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the model's path {0:?} does not stay inside the replay directory")]
    Path(String),
    #[error("the model does not hold together: {0}")]
    Model(String),
    #[error("starting the replay's trace in {}: {source}", .path.display())]
    Trace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("starting a replay thread: {0}")]
    Thread(std::io::Error),
}

/// What a phase, or the whole replay, did and how long it took.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    pub bytes: u64,
    pub ops: u64,
    /// Metadata operations that failed (a name that was not there, or already was).
    pub errors: u64,
    /// The operations' durations summed (several processes count several times).
    pub io_time_ns: u64,
    /// From the first operation's start to the last one's end.
    pub wall_ns: u64,
    /// Bytes and operations over the wall time.
    pub bytes_per_s: f64,
    pub ops_per_s: f64,
}

impl Measure {
    fn rates(mut self) -> Self {
        let secs = self.wall_ns as f64 / 1e9;
        if secs > 0.0 {
            self.bytes_per_s = self.bytes as f64 / secs;
            self.ops_per_s = self.ops as f64 / secs;
        }
        self
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseKind {
    Data,
    Meta,
}

/// One phase of the model as replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseResult {
    pub kind: PhaseKind,
    /// Its id among the model's phases of its kind.
    pub id: u32,
    /// What it did, in a few words.
    pub what: String,
    pub processes: u32,
    pub start_ns: u64,
    #[serde(flatten)]
    pub measure: Measure,
}

/// A replay's results (JSON with `tessera replay --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The trace the model was made of.
    pub model: String,
    pub dir: PathBuf,
    /// How the time between requests was spent, if it was kept.
    pub think: Option<Think>,
    pub processes: u32,
    /// Bytes written before timing started, into files that existed before the trace.
    pub prepared_bytes: u64,
    /// Phases of both kinds, in the order they started in the trace.
    pub phases: Vec<PhaseResult>,
    pub total: Measure,
    /// The replay's own trace, if asked for.
    pub trace: Option<PathBuf>,
}
