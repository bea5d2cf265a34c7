//! The live mocker engine: the simulation core driven on tokio's clock. One actor task per
//! group of data-parallel ranks owns the core engines, runs their passes behind one barrier,
//! sleeps each modelled pass duration and hands every output to the stream of the request
//! that owns it, at the pass end. Requests enter on a bounded command lane; cancellations
//! have their own bounded lane that the actor serves even while a pass is in flight.
//!
//! The modules form three layers; a module imports only from its own layer or those below
//! (`tests/layers.rs` checks it, and that no two modules import each other):
//!
//! - types (bottom): `error`, `ids`, `signal` (what readers receive), `options` (what a
//!   rank is started with), `handoff` (handoff records and each rank's route table),
//!   `route` (per-submission records shared by handles and actor), `command` (messages to
//!   the actor);
//! - actor (middle): `rank` (what the actor keeps per rank and how commands apply),
//!   `actor` (the task that runs the passes);
//! - client (top): `engine` (`LiveEngine`, the handle that starts and drives a group),
//!   `request` (a request's stream and registration), `handoff_control` (driving one
//!   handoff).
//!
//! The HTTP side of a handoff (how two servers find each other) lives in `mocker-server`.

#![warn(missing_docs)]

// types
mod command;
mod error;
mod handoff;
mod ids;
mod options;
mod route;
mod signal;
// actor
mod actor;
mod rank;
// client
mod engine;
mod handoff_control;
mod request;

pub use engine::LiveEngine;
pub use error::LiveError;
pub use handoff::{handoff_order, HandoffEvent, HandoffId, HandoffOrder, HandoffTransferTiming};
pub use handoff_control::{LiveHandoffControl, LiveHandoffEvents};
pub use ids::{deterministic_output_tokens, stable_request_uuid};
pub use options::{FpmSink, KvEventSink, LiveOptions, OutputBuffering};
pub use request::{LiveRequest, LiveRequestRegistration};
pub use signal::{ObservedAdmission, OutputSignal};
