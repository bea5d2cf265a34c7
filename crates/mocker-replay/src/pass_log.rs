//! Forward-pass records (`--report-passes`): one per simulated pass, the per-iteration data
//! the reference's planner reads as forward-pass metrics.

use mocker_core::Pass;
use serde::Serialize;

/// One simulated forward pass of one worker (a DP rank counts as a worker).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PassRecord {
    /// The worker that ran the pass (its index in the report's worker list).
    pub worker: usize,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// The worker's pool: `agg`, `prefill` or `decode`.
    pub pool: &'static str,
    /// Simulated start and end, ms.
    pub start_ms: f64,
    /// See `start_ms`.
    pub end_ms: f64,
    /// Requests that computed prompt tokens, and how many tokens.
    pub num_prefill_requests: usize,
    /// See `num_prefill_requests`.
    pub prefill_tokens: usize,
    /// Prompt tokens already present before the computed ones (cache hits, earlier chunks).
    pub prefill_cached_tokens: usize,
    /// Requests that decoded, and the KV tokens they attend to.
    pub num_decode_requests: usize,
    /// See `num_decode_requests`.
    pub decode_kv_tokens: usize,
    /// Requests still waiting when the pass was scheduled.
    pub num_queued_requests: usize,
    /// Requests preempted while scheduling it.
    pub num_preempted: usize,
    /// KV blocks in use after scheduling, and the pool's size (null for a radix cache).
    pub kv_blocks_used: Option<usize>,
    /// See `kv_blocks_used`.
    pub kv_blocks_total: Option<usize>,
}

/// Appends the records of `pass` (every pass of a steady run) to `out`.
pub(crate) fn records(
    pass: &Pass,
    worker: usize,
    pool: &'static str,
    kv_blocks: Option<(usize, usize)>,
    out: &mut Vec<PassRecord>,
) {
    let m = &pass.metrics;
    let record = |start_ns: u64, end_ns: u64, decode_kv_tokens: usize| PassRecord {
        worker,
        dp_rank: m.dp_rank,
        pool,
        start_ms: start_ns as f64 / 1e6,
        end_ms: end_ns as f64 / 1e6,
        num_prefill_requests: m.num_prefill_requests,
        prefill_tokens: m.sum_prefill_tokens,
        prefill_cached_tokens: m.sum_prefill_kv_tokens,
        num_decode_requests: m.num_decode_requests,
        decode_kv_tokens,
        num_queued_requests: m.num_queued_requests,
        num_preempted: m.num_preempted,
        kv_blocks_used: kv_blocks.map(|(used, _)| used),
        kv_blocks_total: kv_blocks.map(|(_, total)| total),
    };
    let n = pass.run_ends.len();
    if n == 0 {
        out.push(record(pass.start_ns, pass.end_ns, m.sum_decode_kv_tokens));
        return;
    }
    // A run repeats one pure decode pass, each attending to one more token per request;
    // its metrics are the last pass's.
    let mut start = pass.start_ns;
    for (k, &end) in pass.run_ends.iter().enumerate() {
        let behind = (n - 1 - k) * m.num_decode_requests;
        out.push(record(start, end, m.sum_decode_kv_tokens - behind));
        start = end;
    }
}
