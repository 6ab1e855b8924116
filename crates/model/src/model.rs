//! The model's types: its JSON form is the schema documented in docs/MODEL.md ([`SCHEMA`]).
//! Times are nanoseconds since the trace began; sizes and offsets are bytes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The schema name and version every model file carries; a reader refuses others.
pub const SCHEMA: &str = "tessera.model/1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub schema: String,
    pub source: Source,
    pub application: Application,
    pub processes: Vec<Process>,
    pub files: Vec<FileModel>,
    /// Data phases, by start.
    pub phases: Vec<Phase>,
    /// Metadata phases, by start.
    pub meta_phases: Vec<MetaPhase>,
    /// What the report draws, sampled to a bounded size.
    pub timeline: Timeline,
    pub findings: Vec<Finding>,
}

impl Model {
    /// A model from its JSON form; one of another schema is refused.
    pub fn from_json(text: &str) -> Result<Self, crate::Error> {
        #[derive(Deserialize)]
        struct Head {
            schema: String,
        }
        let head: Head = serde_json::from_str(text)?;
        if head.schema != SCHEMA {
            return Err(crate::Error::Schema { found: head.schema });
        }
        Ok(serde_json::from_str(text)?)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    pub fn file(&self, id: u32) -> Option<&FileModel> {
        self.files.get(id as usize)
    }
}

/// Where the model came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    /// What was profiled (the trace file's name).
    pub trace: String,
    /// Who wrote the trace (`mount`, `library`, `darshan`...) and in which data mode.
    pub traced_by: String,
    pub mode: String,
    /// When the trace began, Unix nanoseconds.
    pub start_unix_ns: u64,
    pub records: u64,
    /// Records the tracer had no room for: the model misses them.
    pub dropped: u64,
}

/// PIOM's application level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Application {
    /// Processes that did I/O (app_np).
    pub processes: u32,
    /// Files read or written (app_nfiles).
    pub files: u32,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub writes: u64,
    /// Operations of each kind, by name, failed ones included.
    pub ops: BTreeMap<String, u64>,
    pub errors: u64,
    /// From the first operation's start to the last one's end.
    pub wall_ns: u64,
    /// The operations' durations summed (several processes count several times).
    pub io_time_ns: u64,
    /// Time with at least one operation in flight.
    pub busy_ns: u64,
    pub metadata: MetadataLoad,
}

/// The metadata operations of the application and their rate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataLoad {
    pub creates: u64,
    pub mkdirs: u64,
    /// Attribute reads and name lookups.
    pub stats: u64,
    pub opens: u64,
    pub unlinks: u64,
    pub renames: u64,
    /// Directory listings (one per read of a directory from its start, whatever the number
    /// of requests for pages of entries it took).
    pub listings: u64,
    /// All of the above over the wall time.
    pub per_second: f64,
    /// The most in one second of the trace.
    pub peak_per_second: u64,
    pub time_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub exe: Option<String>,
    pub ops: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub io_time_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

/// How a file's, or a phase's, offsets move from one request to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessMode {
    /// Each request starts where the last ended.
    Sequential,
    /// A constant displacement other than the request size (gaps, or backwards).
    Strided,
    Random,
}

/// Whether one process or several used a file (PIOM's file_accesstype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    PerProcess,
    Shared,
}

/// Read only, write only, or both (PIOM's file_fileaccesstype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    None,
    Read,
    Write,
    ReadWrite,
}

/// PIOM's file level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileModel {
    /// Its index in [`Model::files`].
    pub id: u32,
    /// As last seen in the trace, relative to the traced directory (`inode N` if never seen).
    pub path: String,
    /// The largest end of a request, or size set, seen.
    pub size: u64,
    /// Created (or truncated to nothing) in the trace: a replay makes it; otherwise it existed
    /// before, and a replay prepares it with `size` bytes first.
    pub created: bool,
    /// Processes that read or wrote it (file_np).
    pub processes: u32,
    pub sharing: Sharing,
    pub direction: Direction,
    /// The access mode of most of its bytes.
    pub access: AccessMode,
    /// Its data phases (file_nphase).
    pub phases: u32,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub writes: u64,
    pub io_time_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataOp {
    Read,
    Write,
}

/// A request size and how many requests had it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeCount {
    pub size: u64,
    pub count: u64,
}

/// PIOM's I/O phase: a consecutive run of requests on one file of one kind with one shape,
/// by one or several processes at once, possibly repeated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Its index in [`Model::phases`] (Ph_id).
    pub id: u32,
    pub file: u32,
    pub op: DataOp,
    pub access: AccessMode,
    /// The processes in the phase and where each began (Ph_processid, Ph_np).
    pub processes: Vec<PhaseProcess>,
    /// Bytes moved, every process and repetition (Ph_weight).
    pub weight: u64,
    /// Times each process went through its run (Ph_nrep).
    pub repetitions: u32,
    /// Requests, every process and repetition (Ph_niop times np times nrep).
    pub ops: u64,
    /// The most common request size (rs).
    pub request_size: u64,
    /// Every request size and its count, largest count first (a bounded number of sizes; the
    /// rest are counted under the last).
    pub sizes: Vec<SizeCount>,
    /// The difference between consecutive requests' offsets when it is constant (disp).
    pub displacement: Option<i64>,
    /// The median time from one request's start to the next one's (dist).
    pub distance_ns: u64,
    /// The time its processes spent outside I/O between two of their requests in it (their
    /// compute): how many gaps took about how long, in powers of two. A replay keeps these,
    /// not `distance_ns`: a request's own time changes with the configuration, its
    /// application's compute does not, and how long a server sat idle changes its next
    /// answer.
    #[serde(default)]
    pub think: Vec<ThinkBin>,
    /// The mean time a process spent outside I/O before its first request in the phase.
    #[serde(default)]
    pub lead_ns: u64,
    /// The lowest offset and the highest end of its requests: where random ones fall.
    pub offset_min: u64,
    pub offset_max: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub io_time_ns: u64,
}

/// Gaps between requests of about one length: `count` of them, `mean_ns` long on average.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinkBin {
    pub count: u64,
    pub mean_ns: u64,
}

/// One process's part in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseProcess {
    pub pid: u32,
    /// Its first request's offset (PIOM's offset).
    pub initial_offset: u64,
    /// Its requests in one repetition.
    pub ops: u64,
    pub start_ns: u64,
}

/// The kind of a metadata operation, as phases group them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetaKind {
    Create,
    Mkdir,
    Stat,
    Open,
    Unlink,
    Rmdir,
    Rename,
    List,
}

/// A burst of one kind of metadata operation in one directory, by one or more processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaPhase {
    pub id: u32,
    pub kind: MetaKind,
    pub dir: String,
    pub processes: Vec<u32>,
    pub ops: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub io_time_ns: u64,
}

/// Data requests over time and bytes per process over time, bounded in size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// One of every `sampled_every` data requests, in order of start.
    pub sampled_every: u64,
    pub points: Vec<Point>,
    /// Width of a heat-map column.
    pub bin_ns: u64,
    /// Bytes each process moved in each column.
    pub heat: Vec<HeatRow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub start_ns: u64,
    pub pid: u32,
    pub file: u32,
    pub op: DataOp,
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeatRow {
    pub pid: u32,
    pub bytes: Vec<u64>,
}

/// What the model shows that a person should know, in plain words, with what it concerns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub text: String,
    pub files: Vec<u32>,
    pub phases: Vec<u32>,
    pub meta_phases: Vec<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    SmallRequests,
    RandomOnSharedFile,
    MetadataBound,
    ManyWritersOneFile,
}
