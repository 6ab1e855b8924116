//! HTML reports, each one self-contained page (no script, no external asset) whose charts are
//! drawn with plotters into inline SVG: the I/O model's page ([`model_report`]: findings,
//! offset-over-time timeline, bytes per process over time, request-size histograms and the
//! PIOM tables), the memory-over-time page of `tessera report` ([`memory_report`]) and the
//! configurations ranked by `tessera evaluate` ([`evaluate_report`]).
//!
//! Pure: a model or samples in, a string out.

mod chart;
mod evaluate_page;
mod io_charts;
mod memory;
mod model_page;
mod page;

pub use evaluate_page::evaluate_report;
pub use memory::{memory_chart, memory_report, MemorySample};
pub use model_page::model_report;
