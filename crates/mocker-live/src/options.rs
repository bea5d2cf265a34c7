//! How a client configures one rank of a live engine: output buffering, sinks, observers.

use std::num::NonZeroUsize;

use mocker_core::events::KvEvent;
use mocker_core::metrics::ForwardPassMetrics;
use tokio::sync::mpsc;

use crate::signal::ObservedAdmission;

/// How a request's outputs are buffered between the actor and its reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputBuffering {
    /// Up to `capacity` undelivered signals per request; a reader that falls further behind
    /// is cancelled at that pass boundary and its KV freed (slow-consumer shedding).
    CancelOnOverflow {
        /// Signals buffered per request (the reference's default is 8).
        capacity: NonZeroUsize,
    },
    /// Room for the request's whole declared response: unread streams never shed.
    FullResponse,
}

impl Default for OutputBuffering {
    fn default() -> Self {
        Self::CancelOnOverflow { capacity: NonZeroUsize::new(8).expect("8 > 0") }
    }
}

/// A KV-event sink: runs on the actor at pass ends, so it must not block.
pub type KvEventSink = Box<dyn FnMut(&[KvEvent]) + Send>;

/// A forward-pass-metrics sink: runs on the actor at pass ends, so it must not block.
pub type FpmSink = Box<dyn FnMut(&ForwardPassMetrics) + Send>;

/// Per-rank options of a live engine.
#[derive(Default)]
pub struct LiveOptions {
    /// Output buffering policy of every request of the rank.
    pub buffering: OutputBuffering,
    /// KV-event sink, called at a pass end with that pass's events (when there are any),
    /// and with `Cleared` by `reset_prefix_cache`. Runs on the actor: must not block.
    pub kv_events: Option<KvEventSink>,
    /// Forward-pass-metrics sink, called once per pass of the rank, at the pass end.
    pub forward_pass_metrics: Option<FpmSink>,
    /// Observer of admissions (client ids), sent at pass start. Dropping the receiver while
    /// the engine runs stops the rank; `shutdown` then reports it.
    pub admissions: Option<mpsc::UnboundedSender<ObservedAdmission>>,
    /// Most LoRA adapters in one batch (vLLM's `--max-loras`); 0 serves none. See
    /// `mocker_core::EngineOptions::max_loras`.
    pub max_loras: usize,
}

impl std::fmt::Debug for LiveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveOptions")
            .field("buffering", &self.buffering)
            .field("kv_events", &self.kv_events.is_some())
            .field("forward_pass_metrics", &self.forward_pass_metrics.is_some())
            .field("admissions", &self.admissions.is_some())
            .field("max_loras", &self.max_loras)
            .finish()
    }
}
