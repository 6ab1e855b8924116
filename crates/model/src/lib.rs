//! The I/O model of an application (PIOM's three levels, docs/MODEL.md): what the application
//! did as a whole ([`Application`]), per file ([`FileModel`]), and per phase ([`Phase`],
//! [`MetaPhase`]): a run of operations on one file with one shape, or a burst of one kind of
//! metadata operation in one directory. [`Profiler`] builds it from a trace's records in one
//! pass, in memory bounded by the files, processes and phases it finds, not by the trace's
//! length.
//!
//! Pure: no I/O but what the caller hands in, so every rule is testable on made-up records.

mod compare;
pub mod export;
mod findings;
mod model;
mod profile;
pub mod synthetic;

pub use compare::{compare, Check, Comparison};
pub use findings::findings;
pub use model::*;
pub use profile::{Limits, Profiler};

/// What can go wrong with a model file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a Tessera I/O model")]
    Parse(#[from] serde_json::Error),
    #[error("model schema {found:?} is not one this version reads ({SCHEMA})")]
    Schema { found: String },
}
