//! Every engine-args key mocker accepts, in every mode, does something or says why not
//! (issue 23: no accepted-and-ignored setting). The key list comes from the parser itself
//! (`mocker_core::config::accepted_keys`), so a key added without a row here fails.
//!
//! Per key and mode the table states the outcome and the test proves it with the real
//! binary: `Refused` exits 2 naming the key; `Warned` exits 0 with a stderr warning naming
//! it; `Affects` in an offline replay changes a deterministic figure of the JSON report
//! against the same run without the key. Online replay reports wall-clock figures, so there
//! `Affects` proves the key is accepted without a warning (the engine is the offline one's
//! core). `Serve` names the serve test (or the shared core) that pins the key's effect; serve
//! is not started for it here.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

const BIN: &str = env!("CARGO_BIN_EXE_mocker");

/// What a key does in one mode.
#[derive(Debug, Clone, Copy)]
enum O {
    /// Changes the run's result.
    Affects,
    /// Exit 2, the key named on stderr.
    Refused,
    /// Exit 2, naming the other key of the row's base that this mode cannot take.
    RefusedAs(&'static str),
    /// Exit 0, a stderr warning names the key and where it applies.
    Warned,
    /// Serve honours it; the named test (or the shared core) pins how.
    Serve(&'static str),
    /// Not a setting in this mode (the mode sets it itself).
    Na,
}
use O::*;

/// One row: `key` set by `variant` (flat JSON, laid over `base`) on workload `args`, with
/// the outcome in aggregated offline replay, disaggregated offline replay (the JSON in both
/// pools), online replay and serve. `name` is what stderr must mention.
struct Row {
    key: &'static str,
    name: &'static str,
    base: &'static str,
    variant: &'static str,
    args: &'static [&'static str],
    agg: O,
    disagg: O,
    online: O,
    serve: O,
}

/// SGLang prefill/decode servers' rendezvous keys (tests/serve_e2e.rs).
const SGLANG_PD: O = Serve("sglang_prefill_and_decode_servers_meet_in_bootstrap_rooms");

/// Serve makes prefill-only / decode-only servers of worker_type (tests/serve_e2e.rs).
const PD_ROLES: O = Serve("worker_type_makes_prefill_only_and_decode_only_servers");

/// Serve draws chat output lengths from it (mocker-server's tests/output_length.rs).
const OUTPUT_LENGTHS: O = Serve("mocker-server tests/output_length.rs");

/// A synthetic workload that leaves the output length to the engine args.
const NO_OSL: &[&str] = &["--input-tokens", "256", "--request-count", "16", "--concurrency", "8"];

const SMALL: &[&str] =
    &["--input-tokens", "256", "--output-tokens", "16", "--request-count", "16", "--concurrency", "8"];
const PREFIX: &[&str] = &[
    "--input-tokens",
    "256",
    "--output-tokens",
    "16",
    "--request-count",
    "32",
    "--concurrency",
    "8",
    "--shared-prefix-ratio",
    "0.5",
    "--num-prefix-groups",
    "4",
];
const KV_ROUTER: &[&str] = &[
    "--input-tokens",
    "256",
    "--output-tokens",
    "16",
    "--request-count",
    "48",
    "--request-rate",
    "400",
    "--router",
    "kv",
    "--router-config",
    r#"{"router_queue_threshold": 0.2}"#,
];
/// The workload of every online replay: a few short requests.
const ONLINE: &[&str] =
    &["--input-tokens", "64", "--output-tokens", "4", "--request-count", "4", "--concurrency", "2"];
/// Arrivals spread in time, so new prompts meet running decodes.
const RATE: &[&str] =
    &["--input-tokens", "256", "--output-tokens", "32", "--request-count", "32", "--request-rate", "100"];
/// Short prompts with long outputs: KV grows while decoding, so a small pool preempts.
const LONG_OUT: &[&str] =
    &["--input-tokens", "64", "--output-tokens", "256", "--request-count", "32", "--request-rate", "100"];
/// Shared prefixes arriving over time, so a waiting queue has prefix matches to order by.
const PREFIX_RATE: &[&str] = &[
    "--input-tokens",
    "256",
    "--output-tokens",
    "16",
    "--request-count",
    "64",
    "--request-rate",
    "200",
    "--shared-prefix-ratio",
    "0.5",
    "--num-prefix-groups",
    "4",
];
const HOST: &str = r#"{"num_gpu_blocks": 24, "block_size": 16, "kv_cache_bytes_per_token": 100000,
    "native_host_offload": {"num_host_blocks": 200}}"#;
/// The host tier of `HOST` cut to 16 blocks, so prefixes it loses can come back from G3.
const G3_HOST: &str = r#"{"num_gpu_blocks": 24, "block_size": 16, "kv_cache_bytes_per_token": 100000,
    "native_host_offload": {"num_host_blocks": 16}}"#;
/// `G3_HOST` with a G3 tier of 4096 blocks.
const G3: &str = r#"{"num_gpu_blocks": 24, "block_size": 16, "kv_cache_bytes_per_token": 100000,
    "native_host_offload": {"num_host_blocks": 16}, "g3_offload": {"scope": "worker_local", "num_g3_blocks": 4096}}"#;
const REASONING: &str =
    r#"{"reasoning": {"start_thinking_token_id": 1, "end_thinking_token_id": 2, "thinking_ratio": 0.5}}"#;
const XFER: &str = r#"{"kv_transfer_bytes_per_token": 200000, "kv_transfer_bandwidth": 1}"#;
/// Two cache groups (full attention and a 64-token window) and the capacity they need.
const GROUPS: &str = r#"{"enable_prefix_caching": false, "block_size": 16, "kv_cache_capacity_bytes": 1073741824,
    "kv_cache_groups": [{"name": "full", "kind": "attention", "num_layers": 1, "block_size_tokens": 16, "page_size_bytes": 1024},
    {"name": "swa", "kind": "attention", "num_layers": 1, "block_size_tokens": 16, "page_size_bytes": 1024, "sliding_window": 64}]}"#;
/// A state cache of 4 blocks per request in a 64-block pool (its geometry is explicit, as
/// the reference requires).
const STATE: &str = r#"{"num_gpu_blocks": 64, "block_size": 16, "kv_cache_bytes_per_token": 1024,
    "state_cache": {"bytes_per_request": 65536}}"#;
const CORE: O =
    Serve("the live engine runs the same core (serve_e2e::stream_arrivals_follow_the_modelled_pass_times)");

#[rustfmt::skip]
fn rows() -> Vec<Row> {
    let r = |key, base, variant, args, [agg, disagg, online, serve]: [O; 4]| Row {
        key, name: leaf(key), base, variant, args, agg, disagg, online, serve,
    };
    let named = |name, row: Row| Row { name, ..row };
    vec![
        r("backend", "{}", r#"{"backend": "sglang"}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("engine_type", "{}", r#"{"engine_type": "sglang"}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("num_gpu_blocks", "{}", r#"{"num_gpu_blocks": 12}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("block_size", "{}", r#"{"block_size": 16}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("max_model_len", "{}", r#"{"max_model_len": 264}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("max_num_seqs", "{}", r#"{"max_num_seqs": 2}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("max_num_batched_tokens", "{}", r#"{"max_num_batched_tokens": 128}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("prefill_schedule_interval", "{}", r#"{"prefill_schedule_interval": 4}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("prefill_schedule_interval", r#"{"dp_size": 2}"#, r#"{"prefill_schedule_interval": 4}"#, RATE,
          [Affects, RefusedAs("dp_size"), RefusedAs("dp_size"), Serve("live DP ranks run the core's wave scheduler")]),
        r("prefill_decode_interval", r#"{"backend": "sglang"}"#, r#"{"prefill_decode_interval": 2}"#, RATE, [Affects, Refused, Affects, CORE]),
        r("prefill_decode_interval", "{}", r#"{"prefill_decode_interval": 2}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("enable_prefix_caching", "{}", r#"{"enable_prefix_caching": false}"#, PREFIX, [Affects, Affects, Affects, CORE]),
        r("enable_chunked_prefill", r#"{"max_num_batched_tokens": 300}"#, r#"{"enable_chunked_prefill": false}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("speedup_ratio", "{}", r#"{"speedup_ratio": 2}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("decode_speedup_ratio", "{}", r#"{"decode_speedup_ratio": 2}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("aic_nextn", "{}", r#"{"aic_nextn": 2}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("ais_nextn", "{}", r#"{"ais_nextn": 2}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("aic_nextn_accept_rates", r#"{"aic_nextn": 2}"#, r#"{"aic_nextn_accept_rates": "1,1"}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("ais_nextn_accept_rates", r#"{"ais_nextn": 2}"#, r#"{"ais_nextn_accept_rates": "1,1"}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("aic_mtp_seed", r#"{"aic_nextn": 2}"#, r#"{"aic_mtp_seed": 7}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("ais_mtp_seed", r#"{"ais_nextn": 2}"#, r#"{"ais_mtp_seed": 7}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("worker_type", "{}", r#"{"worker_type": "prefill"}"#, SMALL, [Refused, Na, Refused, PD_ROLES]),
        named("worker_type", r("is_prefill", "{}", r#"{"is_prefill": true}"#, SMALL, [Refused, Na, Refused, PD_ROLES])),
        named("worker_type", r("is_decode", "{}", r#"{"is_decode": true}"#, SMALL, [Refused, Na, Refused, PD_ROLES])),
        r("preemption_mode", r#"{"num_gpu_blocks": 20, "block_size": 16}"#, r#"{"preemption_mode": "fifo"}"#, LONG_OUT, [Affects, Affects, Affects, CORE]),
        r("preemption_mode", r#"{"backend": "sglang"}"#, r#"{"preemption_mode": "fifo"}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("eviction_policy", r#"{"num_gpu_blocks": 24, "block_size": 16}"#, r#"{"eviction_policy": "lineage"}"#, PREFIX,
          [Affects, Affects, Affects, CORE]),
        r("eviction_policy", r#"{"backend": "sglang"}"#, r#"{"eviction_policy": "lineage"}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("emit_kv_events", "{}", r#"{"emit_kv_events": true}"#, SMALL,
          [Warned, Warned, Warned, Serve("serve_kv_events::emit_kv_events_false_publishes_nothing_and_true_needs_an_endpoint")]),
        r("emit_kv_token_ids", r#"{"emit_kv_events": true}"#, r#"{"emit_kv_token_ids": true}"#, SMALL,
          [Warned, Warned, Warned, Serve("serve_kv_events::emit_kv_token_ids_false_sends_stored_blocks_without_tokens")]),
        r("kv_transfer_bytes_per_token", r#"{"kv_transfer_bandwidth": 1}"#, r#"{"kv_transfer_bytes_per_token": 200000}"#, SMALL,
          [Warned, Affects, Warned, Warned]),
        named("kv_transfer_bytes_per_token", r("kv_bytes_per_token", r#"{"kv_transfer_bandwidth": 1}"#, r#"{"kv_bytes_per_token": 200000}"#, SMALL,
          [Warned, Affects, Warned, Warned])),
        r("kv_transfer_bandwidth", r#"{"kv_transfer_bytes_per_token": 200000}"#, r#"{"kv_transfer_bandwidth": 1}"#, SMALL,
          [Warned, Affects, Warned, Warned]),
        r("kv_transfer_timing_mode", XFER, r#"{"kv_transfer_timing_mode": "destination_missing"}"#, PREFIX,
          [Warned, Affects, Warned, Warned]),
        r("kv_cache_bytes_per_token", "{}", r#"{"kv_cache_bytes_per_token": 100000}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("kv_cache_bytes_per_token", STATE, r#"{"kv_cache_bytes_per_token": 4096}"#, PREFIX,
          [Affects, RefusedAs("state_cache"), Affects, CORE]),
        r("state_cache", r#"{"num_gpu_blocks": 64, "block_size": 16}"#,
          r#"{"kv_cache_bytes_per_token": 1024, "state_cache": {"bytes_per_request": 65536}}"#, PREFIX,
          [Affects, Refused, Affects, CORE]),
        named("state_cache", r("state_cache.bytes_per_request", STATE, r#"{"state_cache": {"bytes_per_request": 262143}}"#,
          PREFIX, [Affects, Refused, Affects, CORE])),
        r("prefix_match_unit", STATE, r#"{"prefix_match_unit": 4}"#, PREFIX, [Affects, RefusedAs("state_cache"), Affects, CORE]),
        r("prefix_match_unit", r#"{"block_size": 16}"#, r#"{"prefix_match_unit": 4}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("native_host_offload", r#"{"num_gpu_blocks": 24, "block_size": 16}"#,
          r#"{"kv_cache_bytes_per_token": 100000, "native_host_offload": {"num_host_blocks": 200}}"#, PREFIX, [Affects, Refused, Refused, Refused]),
        named("native_host_offload", r("native_host_offload.num_host_blocks", HOST, r#"{"native_host_offload": {"num_host_blocks": 2}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("native_host_offload", r("native_host_offload.d2h_bandwidth_gbps", HOST, r#"{"native_host_offload": {"d2h_bandwidth_gbps": 0.01}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("native_host_offload", r("native_host_offload.h2d_bandwidth_gbps", HOST, r#"{"native_host_offload": {"h2d_bandwidth_gbps": 0.01}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("native_host_offload", r("native_host_offload.latency_to_first_byte_ms", HOST, r#"{"native_host_offload": {"latency_to_first_byte_ms": 50}}"#,
          PREFIX, [Affects, Refused, Refused, Refused])),
        r("native_host_offload.scope", HOST, r#"{"native_host_offload": {"scope": "cluster_shared"}}"#, SMALL,
          [Refused, Refused, Refused, Refused]),
        r("native_host_offload.shared_d2h_bandwidth_gbps", HOST, r#"{"native_host_offload": {"shared_d2h_bandwidth_gbps": 1}}"#,
          SMALL, [Refused, Refused, Refused, Refused]),
        r("native_host_offload.shared_h2d_bandwidth_gbps", HOST, r#"{"native_host_offload": {"shared_h2d_bandwidth_gbps": 1}}"#,
          SMALL, [Refused, Refused, Refused, Refused]),
        r("native_host_offload.kv_layout_id", HOST, r#"{"native_host_offload": {"kv_layout_id": 1}}"#, SMALL,
          [Refused, Refused, Refused, Refused]),
        // G3 hangs below the host tier, which only aggregated offline replay simulates.
        r("g3_offload", G3_HOST, r#"{"g3_offload": {"scope": "worker_local", "num_g3_blocks": 4096}}"#, PREFIX,
          [Affects, Refused, Refused, Refused]),
        r("g3_offload", "{}", r#"{"g3_offload": {"scope": "worker_local", "num_g3_blocks": 8}}"#, SMALL,
          [Refused, Refused, Refused, Refused]),
        // One worker: the shared pool differs from a local one only by its aggregate caps.
        named("g3_offload", r("g3_offload.scope", G3, r#"{"g3_offload": {"scope": "cluster_shared", "shared_read_bandwidth_gbps": 0.01}}"#,
          PREFIX, [Affects, Refused, Refused, Refused])),
        named("g3_offload", r("g3_offload.num_g3_blocks", G3, r#"{"g3_offload": {"num_g3_blocks": 4}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("g3_offload", r("g3_offload.latency_to_first_byte_ms", G3, r#"{"g3_offload": {"latency_to_first_byte_ms": 50}}"#,
          PREFIX, [Affects, Refused, Refused, Refused])),
        named("g3_offload", r("g3_offload.read_bandwidth_gbps", G3, r#"{"g3_offload": {"read_bandwidth_gbps": 0.01}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("g3_offload", r("g3_offload.write_bandwidth_gbps", G3, r#"{"g3_offload": {"write_bandwidth_gbps": 0.01}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("g3_offload", r("g3_offload.shared_read_bandwidth_gbps", G3,
          r#"{"g3_offload": {"scope": "cluster_shared", "shared_read_bandwidth_gbps": 0.01}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        named("g3_offload", r("g3_offload.shared_write_bandwidth_gbps", G3,
          r#"{"g3_offload": {"scope": "cluster_shared", "shared_write_bandwidth_gbps": 0.01}}"#, PREFIX,
          [Affects, Refused, Refused, Refused])),
        r("kv_cache_groups", r#"{"enable_prefix_caching": false, "block_size": 16}"#,
          r#"{"kv_cache_capacity_bytes": 65536, "kv_cache_groups": [{"name": "full", "kind": "attention", "num_layers": 1,
              "block_size_tokens": 16, "page_size_bytes": 1024}]}"#, SMALL, [Affects, Refused, Affects, CORE]),
        r("kv_cache_capacity_bytes", GROUPS, r#"{"kv_cache_capacity_bytes": 40000}"#, SMALL,
          [Affects, RefusedAs("kv_cache_groups"), Affects, CORE]),
        r("kv_cache_capacity_bytes", "{}", r#"{"kv_cache_capacity_bytes": 40000}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("timing_model", "{}", r#"{"timing_model": {"type": "fixed", "prefill_ms": 30, "decode_ms": 3}}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("sglang.schedule_policy", r#"{"backend": "sglang", "max_num_seqs": 2}"#, r#"{"sglang": {"schedule_policy": "lpm"}}"#,
          PREFIX_RATE, [Affects, Affects, Affects, CORE]),
        r("sglang.max_prefill_tokens", r#"{"backend": "sglang"}"#, r#"{"sglang": {"max_prefill_tokens": 128}}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("sglang.chunked_prefill_size", r#"{"backend": "sglang"}"#, r#"{"sglang": {"chunked_prefill_size": 64}}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("sglang.clip_max_new_tokens", r#"{"backend": "sglang", "num_gpu_blocks": 1000}"#,
          r#"{"sglang": {"clip_max_new_tokens": 1}}"#, LONG_OUT, [Affects, Affects, Affects, CORE]),
        r("sglang.schedule_conservativeness", r#"{"backend": "sglang", "num_gpu_blocks": 1000}"#,
          r#"{"sglang": {"schedule_conservativeness": 10}}"#, LONG_OUT, [Affects, Affects, Affects, CORE]),
        r("sglang.page_size", r#"{"backend": "sglang"}"#, r#"{"sglang": {"page_size": 16}}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("sglang.max_prefill_tokens", "{}", r#"{"sglang": {"max_prefill_tokens": 128}}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("trtllm.capacity_scheduler_policy", "{}", r#"{"trtllm": {"capacity_scheduler_policy": "max_utilization"}}"#, SMALL,
          [Refused, Refused, Refused, Refused]),
        r("dp_size", "{}", r#"{"dp_size": 2}"#, SMALL, [Affects, Refused, Refused, Serve("serve_kv_events (one publisher per DP rank)")]),
        r("tensor_parallel_size", "{}", r#"{"tensor_parallel_size": 2}"#, SMALL, [Affects, Affects, Affects, Warned]),
        r("model", "{}", r#"{"model": "meta-llama/Llama-3.1-8B"}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("gpu", r#"{"model": "meta-llama/Llama-3.1-8B"}"#, r#"{"gpu": "a100"}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("gpu", "{}", r#"{"gpu": "a100"}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("quantization", r#"{"model": "meta-llama/Llama-3.1-8B"}"#, r#"{"quantization": "fp8"}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("kv_cache_dtype", r#"{"model": "meta-llama/Llama-3.1-8B"}"#, r#"{"kv_cache_dtype": "fp8"}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("enable_expert_parallel", r#"{"model": "mistralai/Mixtral-8x7B-v0.1", "tensor_parallel_size": 2}"#,
          r#"{"enable_expert_parallel": true}"#, SMALL, [Affects, Affects, Affects, CORE]),
        r("disable_hybrid_kv_cache_manager", r#"{"model": "openai/gpt-oss-20b"}"#, r#"{"disable_hybrid_kv_cache_manager": true}"#,
          SMALL, [Affects, Warned, Affects, CORE]),
        r("disable_hybrid_kv_cache_manager", "{}", r#"{"disable_hybrid_kv_cache_manager": true}"#, SMALL,
          [Refused, Refused, Refused, Refused]),
        r("pass_overhead_ms", r#"{"model": "meta-llama/Llama-3.1-8B"}"#, r#"{"pass_overhead_ms": 5}"#, SMALL,
          [Affects, Affects, Affects, CORE]),
        r("pass_overhead_ms", "{}", r#"{"pass_overhead_ms": 5}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("frontend_latency_ms", "{}", r#"{"frontend_latency_ms": 50}"#, SMALL,
          [Affects, Affects, Affects, Serve("serve_e2e::frontend_latency_delays_every_first_token")]),
        r("output_length_distribution", "{}", r#"{"output_length_distribution": {"type": "uniform", "min": 4, "max": 40}}"#,
          // Online rows run ONLINE's workload, whose --output-tokens sets the lengths.
          NO_OSL, [Affects, Affects, Warned, OUTPUT_LENGTHS]),
        r("output_length_distribution", "{}", r#"{"output_length_distribution": {"type": "uniform", "min": 4, "max": 40}}"#,
          SMALL, [Warned, Warned, Warned, OUTPUT_LENGTHS]),
        r("startup_time", "{}", r#"{"startup_time": 5}"#, SMALL,
          [Warned, Warned, Warned, Serve("serve_gateway::nothing_is_served_until_the_simulated_startup_is_over")]),
        r("num_gpu_blocks_is_explicit", "{}", r#"{"num_gpu_blocks_is_explicit": true}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("gpu_memory_utilization", "{}", r#"{"gpu_memory_utilization": 0.5}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("mem_fraction_static", "{}", r#"{"mem_fraction_static": 0.5}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("free_gpu_memory_fraction", "{}", r#"{"free_gpu_memory_fraction": 0.5}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("cuda_graph_reserved_bytes", "{}", r#"{"cuda_graph_reserved_bytes": 1000}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("enable_local_indexer", "{}", r#"{"enable_local_indexer": true}"#, SMALL, [Refused, Refused, Refused, Refused]),
        r("bootstrap_port", "{}", r#"{"bootstrap_port": 7000}"#, SMALL, [Warned, Warned, Warned, SGLANG_PD]),
        r("handoff_session_timeout_ms", "{}", r#"{"handoff_session_timeout_ms": 5000}"#, SMALL, [Warned, Warned, Warned, SGLANG_PD]),
        r("reasoning", "{}", REASONING, SMALL,
          [Warned, Warned, Warned, Serve("serve_plan::reasoning_spans_are_raw_in_completions_and_split_in_chat")]),
        named("reasoning", r("reasoning.start_thinking_token_id", REASONING, r#"{"reasoning": {"start_thinking_token_id": 5}}"#,
          SMALL, [Warned, Warned, Warned, Serve("serve_plan::reasoning_spans_are_raw_in_completions_and_split_in_chat")])),
        named("reasoning", r("reasoning.end_thinking_token_id", REASONING, r#"{"reasoning": {"end_thinking_token_id": 5}}"#,
          SMALL, [Warned, Warned, Warned, Serve("serve_plan::reasoning_spans_are_raw_in_completions_and_split_in_chat")])),
        named("reasoning", r("reasoning.thinking_ratio", REASONING, r#"{"reasoning": {"thinking_ratio": 0.9}}"#,
          SMALL, [Warned, Warned, Warned, Serve("serve_plan::reasoning_spans_are_raw_in_completions_and_split_in_chat")])),
        r("response_replay_trace_path", "{}", r#"{"response_replay_trace_path": "/nonexistent/mocker-trace.jsonl"}"#, SMALL,
          [Warned, Warned, Warned, Refused]),
        r("zmq_kv_events_port", "{}", r#"{"zmq_kv_events_port": 5999}"#, SMALL,
          [Warned, Warned, Warned, Serve("serve_kv_events::subscriber_sees_the_cores_blocks_gap_free_with_removals_and_replay")]),
        r("zmq_replay_port", "{}", r#"{"zmq_replay_port": 5998}"#, SMALL, [Warned, Warned, Warned, Refused]),
        r("router_queue_policy", "{}", r#"{"router_queue_policy": "lcfs"}"#, SMALL, [Warned, Warned, Warned, Warned]),
        r("router_queue_policy", r#"{"num_gpu_blocks": 40, "block_size": 16}"#, r#"{"router_queue_policy": "lcfs"}"#, KV_ROUTER,
          [Affects, Affects, Na, Warned]),
    ]
}

/// The last dotted component: what an error or warning is sure to spell.
fn leaf(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

/// `over` laid on `base`, objects merged key by key.
fn lay(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                lay(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn doc(parts: &[&str]) -> Value {
    let mut v = json!({});
    for p in parts {
        lay(&mut v, serde_json::from_str(p).unwrap_or_else(|e| panic!("bad row JSON {p}: {e}")));
    }
    v
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Agg,
    Disagg,
    Online,
    Serve,
}

fn scratch() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `mocker replay` in `mode` with `engine` as the engine args; returns the output and the
/// report's deterministic figures.
fn replay(mode: Mode, engine: &Value, args: &[&str], report: &Path) -> (Output, Option<Map<String, Value>>) {
    let mut cmd = Command::new(BIN);
    // Online replay paces the simulation in real time and proves only acceptance, so it
    // runs a workload of a fraction of a second whatever the row's is.
    let args = if mode == Mode::Online { ONLINE } else { args };
    cmd.arg("replay").args(args).arg("--report-json").arg(report);
    match mode {
        Mode::Agg => cmd.args(["--engine-args", &engine.to_string()]),
        Mode::Online => cmd.args(["--mode", "online", "--engine-args", &engine.to_string()]),
        Mode::Disagg => {
            let role = |wt: &str| {
                let mut e = engine.clone();
                lay(&mut e, json!({ "worker_type": wt }));
                e.to_string()
            };
            cmd.args(["--prefill-engine-args", &role("prefill"), "--decode-engine-args", &role("decode")])
        }
        Mode::Serve => unreachable!("serve is not a replay"),
    };
    let out = cmd.output().expect("run mocker");
    let figures = out.status.success().then(|| {
        let text = std::fs::read_to_string(report).expect("report written");
        let Value::Object(mut m) = serde_json::from_str(&text).expect("report JSON") else {
            panic!("report")
        };
        for volatile in ["wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"] {
            m.remove(volatile);
        }
        m
    });
    (out, figures)
}

/// `mocker serve` on a free port: the exit code if it stopped within a few seconds, else
/// the stderr it wrote before announcing its address (then it is stopped).
fn serve(engine: &Value) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--engine-args", &engine.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mocker serve");
    let mut text = String::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Every check happens before the server binds, and the announcement follows the bind.
    for line in lines.by_ref() {
        let line = line.unwrap_or_default();
        let up = line.contains("serving model on");
        text.push_str(&line);
        text.push('\n');
        if up {
            child.kill().ok();
            child.wait().ok();
            return (None, text);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("wait for mocker serve") {
            return (status.code(), text);
        }
        assert!(Instant::now() < deadline, "mocker serve neither started nor exited: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn warned(stderr: &str, name: &str) -> bool {
    stderr.lines().any(|l| l.starts_with("warning") && l.contains(name))
}

/// Checks one row in one mode; returns a failure description.
fn check(row: &Row, mode: Mode, want: O, dir: &Path, n: usize) -> Option<String> {
    let (base, variant) = (doc(&[row.base]), doc(&[row.base, row.variant]));
    let what = format!("{} ({}) in {mode:?}: expected {want:?}", row.key, row.variant);
    if mode == Mode::Serve {
        let (code, stderr) = serve(&variant);
        return match want {
            Refused if code == Some(2) && stderr.contains(row.name) => None,
            RefusedAs(other) if code == Some(2) && stderr.contains(other) => None,
            Warned if code.is_none() && warned(&stderr, row.name) => None,
            Refused | RefusedAs(_) | Warned => Some(format!("{what}; exit {code:?}, stderr:\n{stderr}")),
            _ => None,
        };
    }
    let report = |tag: &str| dir.join(format!("{n}-{tag}.json"));
    let (out, figures) = replay(mode, &variant, row.args, &report("variant"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code();
    let fail = |why: &str| Some(format!("{what}; {why}; exit {code:?}, stderr:\n{stderr}"));
    match want {
        Refused if code == Some(2) && stderr.contains(row.name) => None,
        RefusedAs(other) if code == Some(2) && stderr.contains(other) => None,
        Warned if code == Some(0) && warned(&stderr, row.name) => None,
        Refused | RefusedAs(_) | Warned => fail("wrong outcome"),
        Affects if code != Some(0) => fail("the run failed"),
        // In a disaggregated run the JSON goes to both pools; a key that acts on one side
        // (the transfer keys on the source) is rightly warned about on the other.
        Affects
            if stderr.lines().any(|l| {
                l.starts_with("warning") && l.contains(row.name) && !l.contains("--decode-engine-args")
            }) =>
        {
            fail("warned about a key that acts")
        }
        Affects if mode == Mode::Online => None,
        Affects => {
            let (base_out, base_figures) = replay(mode, &base, row.args, &report("base"));
            let Some(base_figures) = base_figures else {
                return fail(&format!("the baseline failed: {}", String::from_utf8_lossy(&base_out.stderr)));
            };
            if base_figures == figures.unwrap() {
                fail("the report is the same as without the key")
            } else {
                None
            }
        }
        Serve(_) | Na => None,
    }
}

#[test]
fn every_accepted_key_acts_is_refused_or_is_warned_about_in_every_mode() {
    let rows = rows();
    let accepted: BTreeSet<String> = mocker_core::config::accepted_keys().into_iter().collect();
    let covered: BTreeSet<String> = rows.iter().map(|r| r.key.to_string()).collect();
    let missing: Vec<_> = accepted.difference(&covered).collect();
    assert!(missing.is_empty(), "accepted keys without a row in the table: {missing:?}");
    let stale: Vec<_> = covered.difference(&accepted).collect();
    assert!(stale.is_empty(), "rows for keys the parser does not accept: {stale:?}");

    // A row that leaves a key's proof to a serve test must name a test that exists.
    for pin in rows.iter().filter_map(|r| match r.serve {
        Serve(pin) => Some(pin),
        _ => None,
    }) {
        let Some((file, test)) = pin.split([' ', '(']).find_map(|word| word.split_once("::")) else {
            continue;
        };
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(format!("{file}.rs"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{pin}: {}: {e}", path.display()));
        let name = test.trim_end_matches(')');
        assert!(text.contains(&format!("fn {name}(")), "{pin}: no test {name} in {}", path.display());
    }

    let jobs: Vec<(&Row, Mode, O)> = rows
        .iter()
        .flat_map(|r| {
            [(Mode::Agg, r.agg), (Mode::Disagg, r.disagg), (Mode::Online, r.online), (Mode::Serve, r.serve)]
                .map(|(m, o)| (r, m, o))
        })
        .filter(|(_, _, o)| !matches!(o, Serve(_) | Na))
        .collect();
    let dir = scratch();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(row, mode, want)) = jobs.get(i) else { break };
                if let Some(f) = check(row, mode, want, &dir, i) {
                    failures.lock().unwrap().push(f);
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} checks failed:\n\n{}",
        failures.len(),
        jobs.len(),
        failures.join("\n\n")
    );
}
