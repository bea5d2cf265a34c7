//! The replay `.summary` object: every key of the 1.6.1 report, derived from raw totals.
//!
//! Key order matters to users who diff our output against the reference's
//! `json.dumps(summary)`, so serialization is hand-written to emit exactly the 1.6.1 order.

use std::collections::BTreeMap;

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::stats::{DistSummary, ExactDistribution, SketchDistribution};

/// Shortest duration used as a divisor, so an empty or instantaneous run yields 0 or finite
/// rates rather than NaN/inf (the reference's guard).
const MIN_DURATION_S: f64 = 1e-9;

/// One KV cache group's peak over a run: the most bytes its requests held on one worker,
/// and that as a share of the worker's byte budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupPeak {
    /// The group's name.
    pub group: String,
    /// Most bytes held at once on one worker.
    pub peak_bytes: u64,
    /// `peak_bytes / kv_cache_capacity_bytes`.
    pub peak_usage: f64,
}

/// Per-request SLA results, present only when some SLA threshold was configured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GoodputInputs {
    /// Completed requests that met every configured SLA.
    pub good_requests: u64,
    /// Output tokens emitted by those requests.
    pub good_output_tokens: u64,
}

/// Raw totals gathered by the replay collector; [`Summary::from_inputs`] derives the rest.
///
/// All token and latency figures cover completed requests only (see replay.md §10).
#[derive(Debug, Clone, Default)]
pub struct SummaryInputs {
    /// Requests that arrived (completed or not).
    pub num_requests: u64,
    /// Requests that reached terminal status `completed`.
    pub completed_requests: u64,
    /// Σ input_length over completed requests.
    pub total_input_tokens: u64,
    /// Σ tokens actually emitted by completed requests.
    pub total_output_tokens: u64,
    /// Prompt tokens actually computed (cache misses, recompute after preemption included).
    pub committed_prefill_tokens: u64,
    /// Σ over completed requests of the largest prefix-cache hit among their admissions.
    pub reused_input_tokens: u64,
    /// Σ over completed requests of the prefix-cache hit at their first admission.
    pub first_admission_reused_input_tokens: u64,
    /// Simulated end: latest terminal time of a completed request, in ms.
    pub duration_ms: f64,
    /// Simulator wall-clock time in ms (the only non-deterministic input).
    pub wall_time_ms: f64,
    /// ∫ provisioned prefill workers dt, in seconds.
    pub prefill_worker_seconds: f64,
    /// ∫ provisioned decode (or aggregated) workers dt, in seconds.
    pub decode_worker_seconds: f64,
    /// GPUs per prefill worker (TP × DP), 0 when the role is unused.
    pub prefill_gpus_per_worker: u64,
    /// GPUs per decode (or aggregated) worker (TP × DP), 0 when the role is unused.
    pub decode_gpus_per_worker: u64,
    /// Average power draw, when a power model is configured (never in 1.6.1 defaults).
    pub power_w: Option<f64>,
    /// Fraction of the run the power model covered, alongside `power_w`.
    pub power_coverage: Option<f64>,
    /// Time to first token per completed request, ms.
    pub ttft_ms: ExactDistribution,
    /// Time from first to second token per completed request with ≥ 2 tokens, ms.
    pub ttst_ms: ExactDistribution,
    /// Mean inter-token time per completed request with ≥ 2 tokens, ms.
    pub tpot_ms: ExactDistribution,
    /// Arrival to last token per completed request, ms.
    pub e2e_latency_ms: ExactDistribution,
    /// Every consecutive token gap of every completed request, pooled, ms.
    pub itl_ms: SketchDistribution,
    /// `1000 / gap` for every positive token gap, pooled, tokens/s.
    pub output_token_throughput_per_user: SketchDistribution,
    /// SLA outcome, `Some` exactly when an SLA was set (adds the `goodput_*` keys).
    pub goodput: Option<GoodputInputs>,
}

/// The replay report's `.summary`, one field per key, in 1.6.1 key order.
///
/// Serializes (via serde) to an object with the reference's key names and order; the six
/// distribution blocks are flattened to `mean_ttft_ms`, `p99_itl_ms`, … .
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// KV eviction policy of the simulated engines; always `"lru"` in 1.6.1.
    pub kv_eviction_policy: String,
    /// mocker's own, with KV cache groups only (the key is left out without them): each
    /// group's peak use of its worker's byte budget over the run.
    pub kv_cache_group_peak_usage: Vec<GroupPeak>,
    /// With `g3_offload` only (the key is left out without it): the G3 tier's counters,
    /// summed over `worker_local` tiers, as the reference reports them.
    pub g3_offload: Option<mocker_core::kv::G3Stats>,
    /// Prompt tokens actually computed (excludes cache hits, includes recompute).
    pub committed_prefill_tokens: u64,
    /// Requests that arrived.
    pub num_requests: u64,
    /// Requests that completed; the population of every figure below.
    pub completed_requests: u64,
    /// Σ input length of completed requests.
    pub total_input_tokens: u64,
    /// Σ emitted tokens of completed requests.
    pub total_output_tokens: u64,
    /// Simulated end time (latest completion), ms.
    pub duration_ms: f64,
    /// Simulator wall clock, ms; with `processed_*_per_s`, the only non-deterministic keys.
    pub wall_time_ms: f64,
    /// Completed requests per simulated second.
    pub request_throughput_rps: f64,
    /// Input tokens per simulated second.
    pub input_throughput_tok_s: f64,
    /// Output tokens per simulated second.
    pub output_throughput_tok_s: f64,
    /// Input + output tokens per simulated second.
    pub total_throughput_tok_s: f64,
    /// ∫ provisioned prefill workers dt (0 for aggregated runs).
    pub prefill_worker_seconds: f64,
    /// ∫ provisioned decode/aggregated workers dt.
    pub decode_worker_seconds: f64,
    /// GPUs per prefill worker (0 when unused).
    pub prefill_gpus_per_worker: u64,
    /// GPUs per decode/aggregated worker.
    pub decode_gpus_per_worker: u64,
    /// Σ worker seconds × GPUs per worker / 3600.
    pub gpu_hours: f64,
    /// Requests meeting every SLA; `None` (key omitted) without SLAs.
    pub goodput_completed_requests: Option<u64>,
    /// Good requests per simulated second; omitted without SLAs.
    pub goodput_request_throughput_rps: Option<f64>,
    /// Good requests' output tokens per simulated second; omitted without SLAs.
    pub goodput_output_throughput_tok_s: Option<f64>,
    /// Average power; serialized as null when no power model exists.
    pub power_w: Option<f64>,
    /// Power-model coverage; serialized as null when no power model exists.
    pub power_coverage: Option<f64>,
    /// Input + output tokens the simulator processed.
    pub processed_tokens: u64,
    /// Processed tokens per wall-clock second (simulator speed).
    pub processed_tokens_per_s: f64,
    /// Output tokens per wall-clock second (simulator speed).
    pub processed_output_tokens_per_s: f64,
    /// Reused (best admission) input tokens / total input tokens.
    pub prefix_cache_reused_ratio: f64,
    /// Reused input tokens at first admission / total input tokens.
    pub first_admission_prefix_cache_reused_ratio: f64,
    /// Number of TTFT samples.
    pub num_ttft_samples: u64,
    /// Number of TPOT samples (requests with ≥ 2 tokens).
    pub num_tpot_samples: u64,
    /// Number of end-to-end latency samples.
    pub num_e2e_latency_samples: u64,
    /// Time to first token, ms (exact percentiles).
    pub ttft_ms: DistSummary,
    /// Time to second token, ms (exact percentiles).
    pub ttst_ms: DistSummary,
    /// Per-request mean time per output token, ms (exact percentiles).
    pub tpot_ms: DistSummary,
    /// Pooled inter-token gaps, ms (sketched percentiles).
    pub itl_ms: DistSummary,
    /// Arrival to last token, ms (exact percentiles).
    pub e2e_latency_ms: DistSummary,
    /// Pooled per-gap `1000 / gap`, tokens/s (sketched percentiles).
    pub output_token_throughput_per_user: DistSummary,
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

impl Summary {
    /// Derives every report value from the collector's totals, following replay.md §10.
    pub fn from_inputs(mut inputs: SummaryInputs) -> Self {
        let duration_s = (inputs.duration_ms / 1000.0).max(MIN_DURATION_S);
        let wall_s = (inputs.wall_time_ms / 1000.0).max(MIN_DURATION_S);
        let input = inputs.total_input_tokens;
        let output = inputs.total_output_tokens;
        let processed_tokens = input + output;
        let gpu_hours = (inputs.prefill_worker_seconds * inputs.prefill_gpus_per_worker as f64
            + inputs.decode_worker_seconds * inputs.decode_gpus_per_worker as f64)
            / 3600.0;
        let goodput = inputs.goodput;
        Summary {
            kv_eviction_policy: "lru".to_string(),
            kv_cache_group_peak_usage: Vec::new(),
            g3_offload: None,
            committed_prefill_tokens: inputs.committed_prefill_tokens,
            num_requests: inputs.num_requests,
            completed_requests: inputs.completed_requests,
            total_input_tokens: input,
            total_output_tokens: output,
            duration_ms: inputs.duration_ms,
            wall_time_ms: inputs.wall_time_ms,
            request_throughput_rps: inputs.completed_requests as f64 / duration_s,
            input_throughput_tok_s: input as f64 / duration_s,
            output_throughput_tok_s: output as f64 / duration_s,
            total_throughput_tok_s: processed_tokens as f64 / duration_s,
            prefill_worker_seconds: inputs.prefill_worker_seconds,
            decode_worker_seconds: inputs.decode_worker_seconds,
            prefill_gpus_per_worker: inputs.prefill_gpus_per_worker,
            decode_gpus_per_worker: inputs.decode_gpus_per_worker,
            gpu_hours,
            goodput_completed_requests: goodput.map(|g| g.good_requests),
            goodput_request_throughput_rps: goodput.map(|g| g.good_requests as f64 / duration_s),
            goodput_output_throughput_tok_s: goodput.map(|g| g.good_output_tokens as f64 / duration_s),
            power_w: inputs.power_w,
            power_coverage: inputs.power_coverage,
            processed_tokens,
            processed_tokens_per_s: processed_tokens as f64 / wall_s,
            processed_output_tokens_per_s: output as f64 / wall_s,
            prefix_cache_reused_ratio: ratio(inputs.reused_input_tokens, input),
            first_admission_prefix_cache_reused_ratio: ratio(
                inputs.first_admission_reused_input_tokens,
                input,
            ),
            num_ttft_samples: inputs.ttft_ms.len() as u64,
            num_tpot_samples: inputs.tpot_ms.len() as u64,
            num_e2e_latency_samples: inputs.e2e_latency_ms.len() as u64,
            ttft_ms: inputs.ttft_ms.summarize(),
            ttst_ms: inputs.ttst_ms.summarize(),
            tpot_ms: inputs.tpot_ms.summarize(),
            itl_ms: inputs.itl_ms.summarize(),
            e2e_latency_ms: inputs.e2e_latency_ms.summarize(),
            output_token_throughput_per_user: inputs.output_token_throughput_per_user.summarize(),
        }
    }

    /// The six distribution blocks with their key suffixes, in report order.
    pub fn distributions(&self) -> [(&'static str, &DistSummary); 6] {
        [
            ("ttft_ms", &self.ttft_ms),
            ("ttst_ms", &self.ttst_ms),
            ("tpot_ms", &self.tpot_ms),
            ("itl_ms", &self.itl_ms),
            ("e2e_latency_ms", &self.e2e_latency_ms),
            ("output_token_throughput_per_user", &self.output_token_throughput_per_user),
        ]
    }

    /// The summary as a JSON object in 1.6.1 key order (what `.summary` returns).
    pub fn to_json_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("summary serializes to JSON")
    }

    /// The report file's text: 2-space indent, keys sorted, like the reference CLI's
    /// `json.dumps(report, indent=2, sort_keys=True)`. No trailing newline.
    pub fn to_json_pretty(&self) -> String {
        let sorted: BTreeMap<String, serde_json::Value> = match self.to_json_value() {
            serde_json::Value::Object(map) => map.into_iter().collect(),
            _ => unreachable!("summary serializes to an object"),
        };
        serde_json::to_string_pretty(&sorted).expect("summary serializes to JSON")
    }
}

impl Serialize for Summary {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("kv_eviction_policy", &self.kv_eviction_policy)?;
        map.serialize_entry("committed_prefill_tokens", &self.committed_prefill_tokens)?;
        // The reference puts it right after committed_prefill_tokens.
        if let Some(g3) = &self.g3_offload {
            map.serialize_entry("g3_offload", g3)?;
        }
        map.serialize_entry("num_requests", &self.num_requests)?;
        map.serialize_entry("completed_requests", &self.completed_requests)?;
        map.serialize_entry("total_input_tokens", &self.total_input_tokens)?;
        map.serialize_entry("total_output_tokens", &self.total_output_tokens)?;
        map.serialize_entry("duration_ms", &self.duration_ms)?;
        map.serialize_entry("wall_time_ms", &self.wall_time_ms)?;
        map.serialize_entry("request_throughput_rps", &self.request_throughput_rps)?;
        map.serialize_entry("input_throughput_tok_s", &self.input_throughput_tok_s)?;
        map.serialize_entry("output_throughput_tok_s", &self.output_throughput_tok_s)?;
        map.serialize_entry("total_throughput_tok_s", &self.total_throughput_tok_s)?;
        map.serialize_entry("prefill_worker_seconds", &self.prefill_worker_seconds)?;
        map.serialize_entry("decode_worker_seconds", &self.decode_worker_seconds)?;
        map.serialize_entry("prefill_gpus_per_worker", &self.prefill_gpus_per_worker)?;
        map.serialize_entry("decode_gpus_per_worker", &self.decode_gpus_per_worker)?;
        map.serialize_entry("gpu_hours", &self.gpu_hours)?;
        // The reference omits goodput keys entirely (not null) when no SLA is set.
        if let Some(v) = self.goodput_completed_requests {
            map.serialize_entry("goodput_completed_requests", &v)?;
        }
        if let Some(v) = self.goodput_request_throughput_rps {
            map.serialize_entry("goodput_request_throughput_rps", &v)?;
        }
        if let Some(v) = self.goodput_output_throughput_tok_s {
            map.serialize_entry("goodput_output_throughput_tok_s", &v)?;
        }
        map.serialize_entry("power_w", &self.power_w)?;
        map.serialize_entry("power_coverage", &self.power_coverage)?;
        map.serialize_entry("processed_tokens", &self.processed_tokens)?;
        map.serialize_entry("processed_tokens_per_s", &self.processed_tokens_per_s)?;
        map.serialize_entry("processed_output_tokens_per_s", &self.processed_output_tokens_per_s)?;
        map.serialize_entry("prefix_cache_reused_ratio", &self.prefix_cache_reused_ratio)?;
        map.serialize_entry(
            "first_admission_prefix_cache_reused_ratio",
            &self.first_admission_prefix_cache_reused_ratio,
        )?;
        map.serialize_entry("num_ttft_samples", &self.num_ttft_samples)?;
        map.serialize_entry("num_tpot_samples", &self.num_tpot_samples)?;
        map.serialize_entry("num_e2e_latency_samples", &self.num_e2e_latency_samples)?;
        for (suffix, dist) in self.distributions() {
            for (stat, value) in dist.named_values() {
                map.serialize_entry(&format!("{stat}_{suffix}"), &value)?;
            }
        }
        if !self.kv_cache_group_peak_usage.is_empty() {
            map.serialize_entry("kv_cache_group_peak_usage", &self.kv_cache_group_peak_usage)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Key order of `run_mocker_synthetic_trace_replay(..., sla_ttft_ms=200, sla_itl_ms=10)
    /// .summary` from ai-dynamo-runtime 1.6.1, verbatim.
    const REFERENCE_KEYS_WITH_SLA: &str = "
        kv_eviction_policy committed_prefill_tokens num_requests completed_requests
        total_input_tokens total_output_tokens duration_ms wall_time_ms request_throughput_rps
        input_throughput_tok_s output_throughput_tok_s total_throughput_tok_s
        prefill_worker_seconds decode_worker_seconds prefill_gpus_per_worker
        decode_gpus_per_worker gpu_hours goodput_completed_requests
        goodput_request_throughput_rps goodput_output_throughput_tok_s power_w power_coverage
        processed_tokens processed_tokens_per_s processed_output_tokens_per_s
        prefix_cache_reused_ratio first_admission_prefix_cache_reused_ratio num_ttft_samples
        num_tpot_samples num_e2e_latency_samples mean_ttft_ms min_ttft_ms max_ttft_ms
        median_ttft_ms p75_ttft_ms p90_ttft_ms p95_ttft_ms p99_ttft_ms std_ttft_ms mean_ttst_ms
        min_ttst_ms max_ttst_ms median_ttst_ms p75_ttst_ms p90_ttst_ms p95_ttst_ms p99_ttst_ms
        std_ttst_ms mean_tpot_ms min_tpot_ms max_tpot_ms median_tpot_ms p75_tpot_ms p90_tpot_ms
        p95_tpot_ms p99_tpot_ms std_tpot_ms mean_itl_ms min_itl_ms max_itl_ms median_itl_ms
        p75_itl_ms p90_itl_ms p95_itl_ms p99_itl_ms std_itl_ms mean_e2e_latency_ms
        min_e2e_latency_ms max_e2e_latency_ms median_e2e_latency_ms p75_e2e_latency_ms
        p90_e2e_latency_ms p95_e2e_latency_ms p99_e2e_latency_ms std_e2e_latency_ms
        mean_output_token_throughput_per_user min_output_token_throughput_per_user
        max_output_token_throughput_per_user median_output_token_throughput_per_user
        p75_output_token_throughput_per_user p90_output_token_throughput_per_user
        p95_output_token_throughput_per_user p99_output_token_throughput_per_user
        std_output_token_throughput_per_user
    ";

    /// The 1.6.1 probe: synthetic 1000/100 × 100 requests, concurrency 16, one worker.
    fn reference_inputs() -> SummaryInputs {
        let mut inputs = SummaryInputs {
            num_requests: 100,
            completed_requests: 100,
            total_input_tokens: 100_000,
            total_output_tokens: 10_000,
            committed_prefill_tokens: 100_000,
            duration_ms: 6606.648914999993,
            wall_time_ms: 5.734413,
            decode_worker_seconds: 6.606648914999994,
            decode_gpus_per_worker: 1,
            ..SummaryInputs::default()
        };
        inputs.ttft_ms.extend([90.0, 171.0, 336.0]);
        inputs.tpot_ms.extend([8.0, 8.25]);
        inputs.e2e_latency_ms.extend([700.0, 990.0, 1150.0]);
        inputs.itl_ms.add_n(6.6, 99);
        inputs
    }

    fn keys(summary: &Summary) -> Vec<String> {
        let value = summary.to_json_value();
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn key_order_matches_reference() {
        let reference: Vec<&str> = REFERENCE_KEYS_WITH_SLA.split_whitespace().collect();
        assert_eq!(reference.len(), 84);
        let mut inputs = reference_inputs();
        inputs.goodput = Some(GoodputInputs { good_requests: 92, good_output_tokens: 9200 });
        assert_eq!(keys(&Summary::from_inputs(inputs)), reference);

        let without: Vec<&str> = reference.into_iter().filter(|k| !k.starts_with("goodput_")).collect();
        assert_eq!(without.len(), 81);
        assert_eq!(keys(&Summary::from_inputs(reference_inputs())), without);
    }

    #[test]
    fn derived_values_match_reference_probe() {
        let mut inputs = reference_inputs();
        inputs.goodput = Some(GoodputInputs { good_requests: 92, good_output_tokens: 9200 });
        let s = Summary::from_inputs(inputs);
        // Numbers printed by 1.6.1 for the same totals.
        assert_eq!(s.request_throughput_rps, 15.13626670443409);
        assert_eq!(s.input_throughput_tok_s, 15136.26670443409);
        assert_eq!(s.output_throughput_tok_s, 1513.626670443409);
        assert_eq!(s.total_throughput_tok_s, 16649.893374877498);
        assert_eq!(s.gpu_hours, 0.001835180254166665);
        assert_eq!(s.processed_tokens, 110_000);
        assert_eq!(s.processed_tokens_per_s, 19182434.191607755);
        assert_eq!(s.processed_output_tokens_per_s, 1743857.6537825232);
        assert_eq!(s.goodput_completed_requests, Some(92));
        assert_eq!(s.goodput_request_throughput_rps, Some(13.925365368079364));
        assert_eq!(s.goodput_output_throughput_tok_s, Some(1392.5365368079363));
        assert_eq!((s.num_ttft_samples, s.num_tpot_samples, s.num_e2e_latency_samples), (3, 2, 3));
        assert_eq!(s.ttft_ms.median, 171.0);
        // Sketched: 6.6 reads back as its bin's centre, the very value 1.6.1 printed for
        // median_itl_ms in this probe.
        assert_eq!((s.itl_ms.median, s.itl_ms.mean), (6.599541183735777, 6.6));
        assert_eq!((s.kv_eviction_policy.as_str(), s.power_w, s.power_coverage), ("lru", None, None));
        let v = s.to_json_value();
        assert!(v["power_w"].is_null() && v["power_coverage"].is_null());
        assert_eq!(v["mean_ttft_ms"], 199.0);
        assert_eq!(v["p99_itl_ms"], 6.599541183735777);
        assert_eq!(v["std_output_token_throughput_per_user"], 0.0);
    }

    #[test]
    fn ratios_and_zero_guards() {
        let empty = Summary::from_inputs(SummaryInputs { num_requests: 4, ..Default::default() });
        assert_eq!(empty.request_throughput_rps, 0.0);
        assert_eq!(empty.prefix_cache_reused_ratio, 0.0);
        assert_eq!(empty.first_admission_prefix_cache_reused_ratio, 0.0);
        assert_eq!(empty.ttft_ms, DistSummary::default());

        let s = Summary::from_inputs(SummaryInputs {
            completed_requests: 2,
            total_input_tokens: 1000,
            total_output_tokens: 10,
            reused_input_tokens: 250,
            first_admission_reused_input_tokens: 125,
            prefill_worker_seconds: 36.0,
            prefill_gpus_per_worker: 2,
            decode_worker_seconds: 72.0,
            decode_gpus_per_worker: 4,
            ..Default::default()
        });
        // Zero duration and wall time divide by 1e-9 s instead of producing inf/NaN.
        assert_eq!(s.request_throughput_rps, 2.0 / 1e-9);
        assert_eq!(s.processed_tokens_per_s, 1010.0 / 1e-9);
        assert_eq!((s.prefix_cache_reused_ratio, s.first_admission_prefix_cache_reused_ratio), (0.25, 0.125));
        assert_eq!(s.gpu_hours, (36.0 * 2.0 + 72.0 * 4.0) / 3600.0);
    }

    #[test]
    fn pretty_json_is_sorted_with_two_space_indent() {
        let text = Summary::from_inputs(reference_inputs()).to_json_pretty();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!((lines[0], *lines.last().unwrap()), ("{", "}"));
        let body = &lines[1..lines.len() - 1];
        assert!(body.iter().all(|l| l.starts_with("  \"") && !l.starts_with("   ")));
        let names: Vec<&str> = body.iter().map(|l| l.trim_start().split('"').nth(1).unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
        assert_eq!(names.len(), 81);
        assert!(body.contains(&"  \"power_w\": null,"));
        assert!(body.contains(&"  \"kv_eviction_policy\": \"lru\","));
        let reparsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reparsed["duration_ms"], 6606.648914999993);
    }
}
