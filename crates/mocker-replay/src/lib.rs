//! Offline replay: a discrete-event driver that runs workloads over simulated mocker
//! engines on one virtual clock, and the report it produces.

#![warn(missing_docs)]

pub mod collector;
pub mod driver;
pub mod feed;
pub mod options;
pub mod report;
pub mod router;
pub mod trace;
pub mod trace_source;
pub mod workload;

pub use driver::{run_replay, run_synthetic, ReplayOutcome};
pub use options::{ReplayError, ReplayOptions, RouterMode, Sla, TraceWorkload, Workload};
pub use trace::{load_trace, Trace, TraceError, TraceFormat};
pub use workload::{Load, SyntheticWorkload};
