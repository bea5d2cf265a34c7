//! The replay command as a library: `mocker replay`'s flags and engine args parsed into
//! [`mocker_replay::ReplayOptions`], run offline or online, with the report files they
//! name, and `mocker sweep`'s grid of such replays. The `mocker` CLI and the Python module
//! (`python/`) both go through it, so a setting means the same and a mistake gets the same
//! message on either.

#![warn(missing_docs)]

pub mod engine_args;
pub mod online;
pub mod output;
pub mod replay;
mod run_facts;
pub mod sweep;
pub mod telemetry;

/// A user error: the message names the flag (or engine-args key) it concerns. The CLI
/// prints it after `error: ` and exits 2; the Python module raises it as a `ValueError`.
#[derive(Debug)]
pub struct UsageError(pub String);
