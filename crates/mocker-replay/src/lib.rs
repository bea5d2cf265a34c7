//! Offline replay: a discrete-event driver that runs workloads over simulated mocker
//! engines on one virtual clock, and the report it produces.

#![warn(missing_docs)]

pub mod collector;
mod deps;
pub mod driver;
pub mod feed;
pub mod gaps;
mod lanes;
pub mod limits;
pub mod options;
pub mod pass_log;
pub mod report;
pub mod request_log;
pub mod scaling;
pub mod telemetry;
pub use mocker_router as router;
pub mod trace;
pub mod workload;

pub use driver::{run_replay, run_synthetic, Hooks, ReplayOutcome};
pub use options::{Cluster, Pool, ReplayError, ReplayOptions, RouterMode, Sla, TraceWorkload, Workload};
pub use pass_log::PassRecord;
pub use request_log::RequestRecord;
pub use trace::load::load_trace;
pub use trace::{Trace, TraceError, TraceFormat, DEFAULT_TRACE_BLOCK_SIZE};
pub use workload::{Load, SyntheticWorkload};
