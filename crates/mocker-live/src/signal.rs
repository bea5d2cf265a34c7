//! What the actor tells a request's reader and the admission observer: plain values.

use tokio::time::Instant;
use uuid::Uuid;

/// One output of a request, delivered at the end of the pass that produced it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSignal {
    /// The client's request id.
    pub uuid: Uuid,
    /// The token; `None` only on a terminal signal without one (rejection).
    pub token_id: Option<u32>,
    /// Position of the token in the request's output (0 = first token).
    pub index: u32,
    /// Last signal of the request.
    pub completed: bool,
    /// The request can never fit this engine (set together with `completed`).
    pub rejected: bool,
    /// Prefix-cache hit at first admission, on the first signal only.
    pub cached_tokens: Option<usize>,
    /// When the pass that first admitted the request started (simulated ns, see
    /// `sim_time_ns`), on the first signal only: the end of its queueing, which vLLM's
    /// queue/prefill/inference-time metrics are measured from.
    pub scheduled_ns: Option<u64>,
    /// KV transfer delay of a disaggregated prefill, on its terminal signal.
    pub handoff_delay_ms: Option<f64>,
    /// Modelled pass-end time on the engine's simulated clock (ns since the engine started).
    pub sim_time_ns: u64,
    /// When the pass's batch was dispatched (tokio clock).
    pub observed_at: Instant,
}

/// A request admitted by a pass, as seen by the admission observer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObservedAdmission {
    /// The client's request id.
    pub uuid: Uuid,
    /// Prompt tokens reused from the prefix cache by this admission.
    pub reused_input_tokens: usize,
    /// Whether the request had been preempted before.
    pub readmission: bool,
    /// When the admission was forwarded (pass start, tokio clock).
    pub observed_at: Instant,
}
