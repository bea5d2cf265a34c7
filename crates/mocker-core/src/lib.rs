//! mocker's simulation core: configuration, KV block management, schedulers, timing
//! models, events and metrics as a synchronous, deterministic state machine stepped one
//! forward pass at a time on a simulated clock. No I/O, no wall clock, no global state.

#![warn(missing_docs)]

pub mod config;
pub mod engine;
pub mod events;
pub mod hashing;
pub mod kv;
pub mod metrics;
pub mod output_length;
pub mod request;
pub mod scheduler;
pub mod timing;
pub mod transfer;
pub mod wave;

pub use engine::{Engine, EngineError, EngineOptions};
pub use request::{Admission, LoraRef, Output, OutputToken, Request, SeqKey};
pub use scheduler::{Pass, PrefixCacheBusy, SubmitError};
