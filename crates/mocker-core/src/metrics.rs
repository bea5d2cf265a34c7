//! Engine and forward-pass metrics, with the names vLLM and Dynamo use for them.

/// A rank's state after a pass (what `/metrics` and routers read).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineMetrics {
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Requests in the running queue.
    pub running_requests: usize,
    /// Requests in the waiting queue (fresh and preempted).
    pub waiting_requests: usize,
    /// Blocks referenced by requests.
    pub active_blocks: usize,
    /// Cached, unreferenced blocks.
    pub inactive_blocks: usize,
    /// Blocks in the pool (`num_gpu_blocks`).
    pub total_blocks: usize,
    /// `active_blocks / total_blocks` (vLLM's `kv_cache_usage_perc`, as a fraction).
    pub gpu_cache_usage_perc: f64,
    /// `(active + inactive) / total`.
    pub physical_gpu_cache_usage_perc: f64,
    /// Preemptions since start.
    pub num_preemptions_total: u64,
    /// Prompt tokens looked up in the prefix cache at admissions since start.
    pub prefix_cache_queries_total: u64,
    /// Of those, tokens found (reused).
    pub prefix_cache_hits_total: u64,
    /// Tokens computed by requests prefilling since start: cache hits excluded, a
    /// recomputed prompt and its recomputed output included (the reference's committed
    /// prefill work).
    pub prompt_tokens_computed_total: u64,
    /// Tokens generated since start.
    pub generation_tokens_total: u64,
    /// With `kv_cache_groups`: bytes held by requests (`active_blocks` then counts pages
    /// of all groups and `total_blocks` is 0, as in the reference).
    pub kv_cache_used_bytes: Option<u64>,
    /// With `kv_cache_groups`: the rank's byte budget (`kv_cache_capacity_bytes`).
    pub kv_cache_capacity_bytes: Option<u64>,
}

/// What one forward pass did (Dynamo's forward-pass metrics).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ForwardPassMetrics {
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Requests that computed prompt tokens.
    pub num_prefill_requests: usize,
    /// Prompt tokens computed.
    pub sum_prefill_tokens: usize,
    /// Prompt tokens already present before those chunks (cache hits, earlier chunks).
    pub sum_prefill_kv_tokens: usize,
    /// Requests decoding one token.
    pub num_decode_requests: usize,
    /// Sum of the decoding requests' sequence lengths.
    pub sum_decode_kv_tokens: usize,
    /// Requests still waiting after the pass was scheduled.
    pub num_queued_requests: usize,
    /// Tokens scheduled in total (the budget spent).
    pub scheduled_tokens: usize,
    /// Requests preempted during scheduling.
    pub num_preempted: usize,
    /// Modelled pass duration in seconds.
    pub wall_time_secs: f64,
}

/// The LoRA adapters with requests running and with requests waiting on a rank, each
/// named once in queue order (vLLM's `lora_requests_info` labels).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraActivity {
    /// Adapters of running requests.
    pub running: Vec<std::sync::Arc<str>>,
    /// Adapters of waiting requests (fresh and preempted).
    pub waiting: Vec<std::sync::Arc<str>>,
}
