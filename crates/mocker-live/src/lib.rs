//! The live mocker engine: the simulation core driven on tokio's clock. One actor task per
//! group of data-parallel ranks owns the core engines, runs their passes behind one barrier,
//! sleeps each modelled pass duration and hands every output to the stream of the request
//! that owns it, at the pass end. Requests enter on a bounded command lane; cancellations
//! have their own bounded lane that the actor serves even while a pass is in flight.

#![warn(missing_docs)]

mod actor;
mod engine;
mod error;
mod handoff;
mod ids;
mod rank;
mod request;
mod route;

pub use engine::{FpmSink, KvEventSink, LiveEngine, LiveOptions, OutputBuffering};
pub use error::LiveError;
pub use handoff::{
    handoff_order, HandoffEvent, HandoffId, HandoffOrder, HandoffTransferTiming, LiveHandoffControl,
    LiveHandoffEvents,
};
pub use ids::{deterministic_output_tokens, stable_request_uuid};
pub use request::{LiveRequest, LiveRequestRegistration, ObservedAdmission, OutputSignal};
