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
    /// Full prompt lengths of the requests that computed prompt tokens (vLLM; for the
    /// forward-pass metrics' variance).
    pub prefill_lengths: Moments,
    /// Speculative decoding (vLLM MTP): decode forwards verified in the pass and the tokens
    /// they accepted before output limits (0 and 0 without MTP).
    pub spec_forwards: u64,
    /// See `spec_forwards`.
    pub spec_accepted_tokens: u64,
    /// Sequence lengths of the requests decoding (vLLM), without those that finished a
    /// (re)computed prompt in the pass: the forward-pass metrics' decode requests.
    pub decode_lengths: Moments,
}

/// Count, sum and sum of squares of integer samples: an exact population variance, and
/// samples can be taken back out (a request preempted after it was counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Moments {
    /// Samples.
    pub count: u64,
    /// Their sum.
    pub sum: u64,
    /// Sum of their squares.
    pub sum_sq: u128,
}

impl Moments {
    /// Adds a sample.
    #[inline]
    pub fn add(&mut self, x: u64) {
        self.count += 1;
        self.sum += x;
        self.sum_sq += u128::from(x) * u128::from(x);
    }

    /// Takes back a sample added before.
    #[inline]
    pub fn remove(&mut self, x: u64) {
        self.count -= 1;
        self.sum -= x;
        self.sum_sq -= u128::from(x) * u128::from(x);
    }

    /// Adds `k` to every sample (a steady decode run: each request one token longer per pass).
    pub fn shift(&mut self, k: i64) {
        let (n, k) = (i128::from(self.count), i128::from(k));
        let (sum, sum_sq) = (i128::from(self.sum), self.sum_sq as i128);
        self.sum_sq = (sum_sq + 2 * k * sum + n * k * k) as u128;
        self.sum = (sum + n * k) as u64;
    }

    /// Population variance (divide by n), 0 without samples.
    pub fn variance(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let n = u128::from(self.count);
        let s = u128::from(self.sum);
        // n * sum_sq >= sum^2 (Cauchy-Schwarz), so the numerator is exact and non-negative.
        (n * self.sum_sq - s * s) as f64 / (n * n) as f64
    }
}

/// What waits in a scheduler's queue (forward-pass metrics' queued fields): fresh requests
/// by prompt length, decode work (preempted requests, destinations whose KV has not
/// landed) by KV length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueuedWork {
    /// Fresh requests' prompt lengths.
    pub prefill: Moments,
    /// Queued decode work's KV lengths.
    pub decode: Moments,
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
