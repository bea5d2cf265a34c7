//! The cluster state a policy sees at a tick, with the reference's keys in its order.

use serde::Serialize;

use super::traffic::TrafficStats;

/// One worker rank's latest forward pass since the previous tick (Dynamo's forward-pass
/// metrics). Variances are population variances, 0 when empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FpmEntry {
    /// Worker id in its pool.
    pub worker_id: usize,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// The pass's simulated duration, s.
    pub wall_time: f64,
    /// Requests doing prompt work in the pass.
    pub num_prefill_requests: u64,
    /// Prompt tokens computed in the pass.
    pub sum_prefill_tokens: u64,
    /// Variance of those requests' full prompt lengths.
    pub var_prefill_length: f64,
    /// Their prompt tokens already in KV before the pass (cache hits, earlier chunks).
    pub sum_prefill_kv_tokens: u64,
    /// Requests decoding in the pass.
    pub num_decode_requests: u64,
    /// Sum of their sequence lengths.
    pub sum_decode_kv_tokens: u64,
    /// Variance of their sequence lengths.
    pub var_decode_kv_tokens: f64,
    /// Fresh requests waiting when the pass was scheduled.
    pub num_queued_prefill: u64,
    /// Sum of their prompt lengths.
    pub sum_queued_prefill_tokens: u64,
    /// Variance of their prompt lengths.
    pub var_queued_prefill_length: f64,
    /// Waiting decode work: preempted requests, and destinations whose KV has not landed.
    pub num_queued_decode: u64,
    /// Sum of their KV lengths.
    pub sum_queued_decode_kv_tokens: u64,
    /// Variance of their KV lengths.
    pub var_queued_decode_kv_tokens: f64,
}

impl FpmEntry {
    /// The all-zero entry of an idle worker (published once per idle second).
    pub fn idle(worker_id: usize, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank, ..Self::default() }
    }
}

/// What `on_tick` receives: the 21 keys of the reference's snapshot, in its order.
/// An aggregated cluster reports its pool under the decode keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClusterSnapshot {
    /// 0-based index of this tick.
    pub tick_ordinal: u64,
    /// Simulated time of the tick, ms.
    pub now_ms: f64,
    /// Latest pass per active prefill worker rank since the previous tick.
    pub prefill_fpm_snapshots: Vec<FpmEntry>,
    /// The same for decode (aggregated) workers.
    pub decode_fpm_snapshots: Vec<FpmEntry>,
    /// Ready, non-draining prefill workers.
    pub active_prefill_count: usize,
    /// Ready, non-draining decode workers.
    pub active_decode_count: usize,
    /// Their ids, ascending.
    pub active_prefill_ids: Vec<usize>,
    /// Their ids, ascending.
    pub active_decode_ids: Vec<usize>,
    /// Prefill workers waiting out `startup_time`.
    pub starting_prefill_count: usize,
    /// Decode workers waiting out `startup_time`.
    pub starting_decode_count: usize,
    /// Their ids, ascending.
    pub starting_prefill_ids: Vec<usize>,
    /// Their ids, ascending.
    pub starting_decode_ids: Vec<usize>,
    /// Prefill workers draining.
    pub draining_prefill_count: usize,
    /// Decode workers draining.
    pub draining_decode_count: usize,
    /// Their ids, ascending.
    pub draining_prefill_ids: Vec<usize>,
    /// Their ids, ascending.
    pub draining_decode_ids: Vec<usize>,
    /// Active + starting prefill workers: what a target sets.
    pub non_draining_prefill_count: usize,
    /// Active + starting decode workers.
    pub non_draining_decode_count: usize,
    /// Active + starting + draining prefill workers.
    pub total_prefill_count: usize,
    /// Active + starting + draining decode workers.
    pub total_decode_count: usize,
    /// Traffic since the previous tick.
    pub traffic: TrafficStats,
}
