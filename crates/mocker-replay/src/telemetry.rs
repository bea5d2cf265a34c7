//! Telemetry sampled over simulated time (the reference's `capture_telemetry`): a baseline
//! sample at the start, one every interval, a final one at the last completion; each with
//! the interval's traffic, every live worker's scheduler gauges, the pools' interval
//! counters, the router queues and the pools' worker ids. Key names and order are the
//! reference's.

use serde::Serialize;

use crate::scaling::{PolicyError, TrafficStats};

/// Which sample it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleKind {
    /// At the start, gauges only.
    Baseline,
    /// Every interval.
    Periodic,
    /// At the last completion, when anything happened since the last periodic sample.
    Final,
}

/// The interval's traffic, under the telemetry's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SampleTraffic {
    /// Interval length, s.
    pub duration_s: f64,
    /// Requests that arrived.
    pub arriving_requests: u64,
    /// Requests that completed (rejections excluded).
    pub completed_requests: u64,
    /// Mean input length of the completions.
    pub avg_isl: f64,
    /// Mean output length of the completions.
    pub avg_osl: f64,
    /// Mean TTFT of completions with one, ms.
    pub avg_ttft_ms: f64,
    /// Mean of completions' own mean ITL, ms.
    pub avg_itl_ms: f64,
    /// Completions behind `avg_ttft_ms`.
    pub ttft_count: u64,
    /// Completions behind `avg_itl_ms`.
    pub itl_count: u64,
    /// Mean KV-router hit rate of the interval's placements.
    pub avg_router_kv_hit_rate: f64,
    /// Placements behind it.
    pub router_kv_hit_rate_count: u64,
    /// Tokens per decode forward; `None` without forwards.
    pub avg_accept_length: Option<f64>,
    /// Decode forwards.
    pub accept_length_forward_count: u64,
}

impl From<TrafficStats> for SampleTraffic {
    fn from(t: TrafficStats) -> Self {
        Self {
            duration_s: t.duration_s,
            arriving_requests: t.num_req,
            completed_requests: t.shape_count,
            avg_isl: t.avg_isl,
            avg_osl: t.avg_osl,
            avg_ttft_ms: t.avg_ttft_ms,
            avg_itl_ms: t.avg_itl_ms,
            ttft_count: t.ttft_count,
            itl_count: t.itl_count,
            avg_router_kv_hit_rate: t.avg_kv_hit_rate,
            router_kv_hit_rate_count: t.hit_rate_count,
            avg_accept_length: t.avg_accept_length,
            accept_length_forward_count: t.accept_length_forward_count,
        }
    }
}

/// One live worker rank's scheduler state as of its last update (a submission or a pass
/// completion).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GaugeRow {
    /// Worker id in its pool.
    pub worker_id: usize,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Blocks referenced by live requests.
    pub active_blocks: u64,
    /// Cached blocks no live request holds (vLLM).
    pub inactive_blocks: u64,
    /// KV capacity in blocks.
    pub total_blocks: u64,
    /// `active / total`.
    pub active_cache_usage: f64,
    /// `(active + inactive) / total`.
    pub physical_cache_usage: f64,
    /// Requests running.
    pub running_requests: u64,
    /// Requests waiting.
    pub waiting_requests: u64,
    /// Bytes held, with KV cache groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_used_bytes: Option<u64>,
    /// Byte budget, with KV cache groups.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_capacity_bytes: Option<u64>,
}

/// A pool's counters over the interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IntervalCounters {
    /// Prompt tokens found cached at admissions (SGLang; vLLM reports 0).
    pub cache_hit_tokens: u64,
    /// Prompt tokens looked up (SGLang; vLLM reports 0).
    pub cache_total_tokens: u64,
    /// New preemptions.
    pub preemptions: u64,
}

/// One telemetry sample (17 keys, the reference's order).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TelemetrySample {
    /// 0, 1, 2, ...
    pub sample_ordinal: u64,
    /// Baseline, periodic or final.
    pub kind: SampleKind,
    /// The interval `(interval_start_ms, sampled_at_ms]`.
    pub interval_start_ms: f64,
    /// See `interval_start_ms`.
    pub sampled_at_ms: f64,
    /// The interval's traffic.
    pub traffic: SampleTraffic,
    /// Gauges of every live prefill worker rank (starting and draining too).
    pub prefill_scheduler_metrics: Vec<GaugeRow>,
    /// The same for decode (aggregated) workers.
    pub decode_scheduler_metrics: Vec<GaugeRow>,
    /// The prefill pool's counters over the interval.
    pub prefill_interval_metrics: IntervalCounters,
    /// The decode (aggregated) pool's counters over the interval.
    pub decode_interval_metrics: IntervalCounters,
    /// Requests waiting in the prefill router's queue.
    pub router_pending_prefill_requests: u64,
    /// Requests waiting in the decode (aggregated) router's queue.
    pub router_pending_decode_requests: u64,
    /// Ids by state, ascending.
    pub active_prefill_ids: Vec<usize>,
    /// See `active_prefill_ids`.
    pub active_decode_ids: Vec<usize>,
    /// See `active_prefill_ids`.
    pub starting_prefill_ids: Vec<usize>,
    /// See `active_prefill_ids`.
    pub starting_decode_ids: Vec<usize>,
    /// See `active_prefill_ids`.
    pub draining_prefill_ids: Vec<usize>,
    /// See `active_prefill_ids`.
    pub draining_decode_ids: Vec<usize>,
}

/// Where samples go; an error stops the replay.
pub type TelemetrySink<'a> = &'a mut dyn FnMut(&TelemetrySample) -> Result<(), PolicyError>;

/// Checks a sampling interval: positive and finite (ms).
pub fn check_interval(ms: f64) -> Result<(), String> {
    if ms.is_finite() && ms > 0.0 {
        Ok(())
    } else {
        Err(format!("must be a positive finite number (got {ms})"))
    }
}
