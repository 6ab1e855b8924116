//! Ranking cluster configurations for one workload (`tessera evaluate`): the candidates file
//! and its price table ([`plan`]), the measured runs and both cost models ([`rank`]), and the
//! scaling model that extrapolates past what this machine can emulate ([`scaling`]). Pure:
//! building the emulated hosts and running the workload is the CLI's part.

pub mod plan;
pub mod rank;
pub mod scaling;

pub use plan::{Candidate, Plan, Price, Target};
pub use rank::{rank, Bound, Outcome, Run, Spread, Verdict};
pub use scaling::{leave_one_out, Check, Extrapolation, Point, Scaling};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad candidates file: {0}")]
    Plan(String),
    #[error("scaling model: {0}")]
    Scaling(String),
}
