//! I/O trace files (docs/TRACING.md): what one traced operation holds ([`Record`]), the
//! format they are stored in, a [`Writer`] that producers hand records to without ever
//! waiting on the disk, and a [`Reader`] that reads a file cut at any byte.
//!
//! The format: a header (magic, version, then key/value pairs that describe the trace and its
//! operation codes), then chunks, each a length and an xxh3 checksum over a run of items:
//! string definitions (paths and executable names are interned: defined once, in the stream,
//! before their first use, and referred to by number), records, and counted gaps (records the
//! writer had no room for). A file cut anywhere, or ending in a torn chunk, reads up to its
//! last whole chunk.

mod format;
mod reader;
mod record;
mod writer;

pub use format::{Header, MAGIC, VERSION};
pub use reader::{Item, Reader};
pub use record::{Event, Gap, Mode, Op, Record};
pub use writer::{Options, Stats, Writer};

/// What can go wrong reading a trace (a cut or torn end is not an error: see [`Reader`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a tessera trace (bad magic)")]
    NotATrace,
    #[error("trace format version {0} is newer than this reader ({VERSION})")]
    Version(u16),
    #[error("damaged trace header: {0}")]
    Header(&'static str),
}
