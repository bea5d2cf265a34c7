//! Offline replay: a discrete-event driver that runs workloads over simulated mocker
//! engines on one virtual clock, and the report it produces.

#![warn(missing_docs)]

pub mod collector;
pub mod driver;
pub mod feed;
pub mod report;
pub mod workload;

pub use driver::{run_synthetic, ReplayError, ReplayOptions, ReplayOutcome};
pub use workload::{Load, SyntheticWorkload};
