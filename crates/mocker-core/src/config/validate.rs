//! The validation rules. Checks run in a fixed order and the first failure is reported, so the
//! order of the statements below is part of the behaviour.

use super::parse::{join, to_string, Obj};
use super::{
    invalid_choice, type_err, Backend, ConfigError, EngineConfig, EvictionPolicy, LaunchConfig,
    PreemptionMode, Result, SglangConfig, TimingModelConfig, DEFAULT_ACCEPT_RATES,
};

/// External timing providers the config layer accepts (the engine decides what it can run).
const TIMING_PROVIDERS: [&str; 3] = ["dynamo_profile", "ais", "aic"];
const ROUTER_QUEUE_POLICIES: [&str; 3] = ["fcfs", "lcfs", "wspt"];

// Upper bounds of the numeric keys. Each is far above any real deployment and low enough
// that the engine's internal types (u32 token counts and block ids, u64 nanoseconds) and
// its up-front allocations cannot overflow or exhaust memory, so a bad value is refused
// here, by name, instead of panicking (or being truncated) inside the engine.

/// Largest `block_size` (vLLM's largest is 256; SGLang pages are 1..=64 in practice).
const MAX_BLOCK_SIZE: usize = 1 << 16;
/// Largest `num_gpu_blocks` per rank (block ids are u32 with a sentinel; 2^30 blocks of
/// 16 tokens are 16 G tokens, about a thousand 8-GPU nodes).
const MAX_NUM_GPU_BLOCKS: usize = 1 << 30;
/// Largest token count of a length or budget key (`max_model_len`,
/// `max_num_batched_tokens`, SGLang's token budgets): sequence lengths are u32 inside.
const MAX_TOKENS: usize = 1 << 30;
/// Largest `max_num_seqs`.
const MAX_NUM_SEQS: usize = 1 << 20;
/// Largest scheduling interval (`prefill_schedule_interval`, `prefill_decode_interval`).
const MAX_INTERVAL: usize = 1 << 20;
/// Largest `dp_size` and `tensor_parallel_size` (each DP rank is a simulated engine).
const MAX_PARALLEL: usize = 1024;
/// Range of a non-zero speed-up ratio: outside it a pass takes longer than the u64
/// nanosecond clock can hold, or no time at all.
const SPEEDUP_RANGE: (f64, f64) = (1e-3, 1e6);
/// Largest fixed pass time, ms (an hour).
const MAX_PASS_MS: f64 = 3.6e6;
/// Largest `startup_time`, s (a day).
const MAX_STARTUP_S: f64 = 86_400.0;
/// Largest `dynamo.handoff_session_timeout_ms` (a day).
const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Largest `kv_transfer_bytes_per_token` (10 MB; large models use 1-2 MB).
const MAX_KV_BYTES_PER_TOKEN: f64 = 1e7;
/// Range of a non-zero `kv_transfer_bandwidth`, GB/s.
const BANDWIDTH_RANGE: (f64, f64) = (1e-3, 1e6);
/// Largest `sglang.schedule_conservativeness`.
const MAX_CONSERVATIVENESS: f64 = 1e3;

impl LaunchConfig {
    /// Checks every engine, launch and runtime rule; the constructors call it.
    pub fn validate(&self) -> Result<()> {
        self.engine.validate_at("engine")?;
        int_range("dp_size", self.dp_size, 1, MAX_PARALLEL)?;
        int_range("tensor_parallel_size", self.tensor_parallel_size, 1, MAX_PARALLEL)?;
        if self.engine.g3_offload.is_some() && self.dp_size > 1 {
            // The reference accepts the args and refuses the replay: one G3 client per worker.
            let msg = format!("g3_offload supports only dp_size=1 (got {})", self.dp_size);
            return Err(ConfigError::new("engine.g3_offload".to_string(), msg));
        }
        if self.engine.native_host_offload.is_some() && self.dp_size > 1 {
            let msg = "is not simulated with dp_size > 1 yet; use dp_size 1";
            return Err(ConfigError::new("engine.native_host_offload".to_string(), msg));
        }
        if let Some(t) = self.startup_time {
            float_range("startup_time", t, 0.0, MAX_STARTUP_S)?;
        }
        if let Some(ms) = self.hardware.pass_overhead_ms {
            float_range("pass_overhead_ms", ms, 0.0, MAX_PASS_MS)?;
        }
        if let Some(ms) = self.hardware.frontend_latency_ms {
            float_range("frontend_latency_ms", ms, 0.0, MAX_PASS_MS)?;
        }
        for (key, frac) in [
            ("gpu_memory_utilization", self.gpu_memory_utilization),
            ("mem_fraction_static", self.mem_fraction_static),
            ("free_gpu_memory_fraction", self.free_gpu_memory_fraction),
        ] {
            frac.map_or(Ok(()), |x| fraction(key, x))?;
        }
        let rt = &self.dynamo;
        int_range("dynamo.handoff_session_timeout_ms", rt.handoff_session_timeout_ms, 1, MAX_TIMEOUT_MS)?;
        if let Some(p) = rt.router_queue_policy.as_deref() {
            if !ROUTER_QUEUE_POLICIES.contains(&p) {
                return Err(invalid_choice("dynamo.router_queue_policy", p, &ROUTER_QUEUE_POLICIES));
            }
        }
        if let Some(r) = &rt.reasoning {
            fraction("dynamo.reasoning.thinking_ratio", r.thinking_ratio)?;
        }
        // Accepted by the reference but acting nowhere in mocker: refused rather than ignored.
        let msg = "true is not simulated: mocker has no worker-local KV indexer (serve publishes KV events \
                   over ZMQ, with gap recovery on zmq_replay_port); remove it";
        ensure(!rt.enable_local_indexer, "dynamo.enable_local_indexer", msg)?;
        let psi = self.engine.prefill_schedule_interval;
        let msg =
            format!("acts only with dp_size > 1 (got {psi} with dp_size 1); remove it or raise dp_size");
        ensure(psi == 1 || self.dp_size > 1, "engine.prefill_schedule_interval", msg)?;
        Ok(())
    }
}

impl EngineConfig {
    /// Checks the engine rules, naming fields relative to `p`.
    fn validate_at(&self, p: &str) -> Result<()> {
        let f = |key: &str| join(p, key);
        let (backend, bs) = (self.backend, self.block_size);
        // A knob only `owner` implements must keep its neutral value on other backends.
        let only_for = |owner: Backend, key: &str, got: usize, neutral: usize| {
            let msg =
                format!("must be {neutral} for backend={backend} (got {got}); only {owner} supports it");
            ensure(got == neutral || backend == owner, f(key), msg)
        };
        // First, as in the reference (a state cache's block_size 1 gets its message).
        self.validate_state_cache(p)?;
        int_range(f("num_gpu_blocks"), self.num_gpu_blocks, 1, MAX_NUM_GPU_BLOCKS)?;
        int_range(f("block_size"), bs, 1, MAX_BLOCK_SIZE)?;
        let msg = format!("must be at least 2 for vllm/trtllm (got {bs})");
        ensure(backend == Backend::Sglang || bs >= 2, f("block_size"), msg)?;
        if let Some(len) = self.max_model_len {
            int_range(f("max_model_len"), len, 1, MAX_TOKENS)?;
        }
        int_range(f("max_num_seqs"), self.max_num_seqs, 1, MAX_NUM_SEQS)?;
        int_range(f("max_num_batched_tokens"), self.max_num_batched_tokens, 1, MAX_TOKENS)?;
        let psi = self.prefill_schedule_interval;
        int_range(f("prefill_schedule_interval"), psi, 1, MAX_INTERVAL)?;
        only_for(Backend::Vllm, "prefill_schedule_interval", psi, 1)?;
        int_range(f("prefill_decode_interval"), self.prefill_decode_interval, 0, MAX_INTERVAL)?;
        only_for(Backend::Sglang, "prefill_decode_interval", self.prefill_decode_interval, 0)?;
        // A prefill worker never decodes (so its skipped rounds never ran out: a dead end)
        // and a decode worker never prefills: the rule needs both on one worker.
        let (pdi, wt) = (self.prefill_decode_interval, self.worker_type);
        let msg = format!("applies to aggregated workers only (got {pdi} with worker_type={wt})");
        ensure(pdi == 0 || wt == super::WorkerType::Aggregated, f("prefill_decode_interval"), msg)?;
        let ok = self.enable_chunked_prefill || backend != Backend::Sglang;
        let msg = "false is not supported for backend=sglang; expected true";
        ensure(ok, f("enable_chunked_prefill"), msg)?;
        // SGLang's radix cache has its own eviction order; the knob would silently do nothing.
        let ok = self.eviction_policy == EvictionPolicy::Lru || backend != Backend::Sglang;
        let msg = format!("{} is not supported for backend=sglang; expected lru", self.eviction_policy);
        ensure(ok, f("eviction_policy"), msg)?;
        // SGLang and TRT-LLM (guaranteed_no_evict) pick their own victims, or none.
        let ok = self.preemption_mode == PreemptionMode::Lifo || backend == Backend::Vllm;
        let msg = format!("{} applies to backend=vllm only (got backend={backend})", self.preemption_mode);
        ensure(ok, f("preemption_mode"), msg)?;
        if backend != Backend::Sglang && self.sglang != SglangConfig::default() {
            let (given, default) =
                (serde_json::to_value(&self.sglang), serde_json::to_value(SglangConfig::default()));
            let key = match (given, default) {
                (Ok(g), Ok(d)) => g.as_object().and_then(|g| {
                    g.iter()
                        .find(|(k, v)| d.get(k.as_str()) != Some(*v))
                        .map(|(k, _)| f(&format!("sglang.{k}")))
                }),
                _ => None,
            };
            let msg = format!("applies to backend=sglang only (got backend={backend}); remove it");
            return Err(ConfigError::new(key.unwrap_or_else(|| f("sglang")), msg));
        }
        speedup(f("speedup_ratio"), self.speedup_ratio)?;
        speedup(f("decode_speedup_ratio"), self.decode_speedup_ratio)?;
        if let Some(n) = self.aic_nextn {
            ensure((1..=5).contains(&n), f("aic_nextn"), format!("must be in 1..=5 (got {n})"))?;
            let dsr = self.decode_speedup_ratio;
            // MTP output speed-up is modelled by burst sampling, not by a decode divisor.
            let msg = format!("requires decode_speedup_ratio = 1.0 (got {dsr})");
            ensure(dsr == 1.0, f("aic_nextn"), msg)?;
        }
        if let Some(raw) = &self.aic_nextn_accept_rates {
            let path = f("aic_nextn_accept_rates");
            ensure(self.aic_nextn.is_some(), path.clone(), "requires aic_nextn to be set")?;
            parse_accept_rates(raw, &path)?;
        }
        let ok = self.emit_kv_events || !self.emit_kv_token_ids;
        ensure(ok, f("emit_kv_token_ids"), "true requires emit_kv_events = true")?;
        if let Some(b) = self.kv_transfer_bytes_per_token {
            let ok = b > 0.0 && b <= MAX_KV_BYTES_PER_TOKEN;
            let msg = format!("must be positive and at most {MAX_KV_BYTES_PER_TOKEN:e} (got {b})");
            ensure(ok, f("kv_transfer_bytes_per_token"), msg)?;
        }
        if let Some(bw) = self.kv_transfer_bandwidth {
            zero_or_range(f("kv_transfer_bandwidth"), bw, BANDWIDTH_RANGE)?;
        }
        // Before the host tier's rules: the reference refuses a host tier (or
        // kv_cache_bytes_per_token) beside groups with the groups' messages.
        self.validate_kv_cache_groups(p)?;
        self.validate_g3(p)?;
        self.validate_host_offload(p)?;
        validate_timing(&self.timing_model, &f("timing_model"))?;
        let policy = &self.trtllm.capacity_scheduler_policy;
        if policy != "guaranteed_no_evict" {
            let path = f("trtllm.capacity_scheduler_policy");
            return Err(invalid_choice(&path, policy, &["guaranteed_no_evict"]));
        }
        // The SGLang block always exists (defaults), so only judge it when it is in use.
        if backend == Backend::Sglang {
            let s = &self.sglang;
            int_range(f("sglang.max_prefill_tokens"), s.max_prefill_tokens, 1, MAX_TOKENS)?;
            let chunk = s.chunked_prefill_size;
            int_range(f("sglang.chunked_prefill_size"), chunk, 1, MAX_TOKENS)?;
            let msg = format!("must be a multiple of block_size {bs} (got {chunk})");
            ensure(chunk.is_multiple_of(bs), f("sglang.chunked_prefill_size"), msg)?;
            int_range(f("sglang.clip_max_new_tokens"), s.clip_max_new_tokens, 0, MAX_TOKENS)?;
            let sc = s.schedule_conservativeness;
            float_range(f("sglang.schedule_conservativeness"), sc, 0.0, MAX_CONSERVATIVENESS)?;
        }
        Ok(())
    }
}

impl EngineConfig {
    /// `native_host_offload` and the `kv_cache_bytes_per_token` it needs, with the
    /// reference's restrictions (vLLM, aggregated, prefix caching, no MTP).
    fn validate_host_offload(&self, p: &str) -> Result<()> {
        let f = |key: &str| join(p, key);
        let Some(h) = &self.native_host_offload else {
            // Elsewhere the reference reads it only for layouts mocker does not simulate.
            // A state cache reads it to size its states in blocks.
            let msg = "is used only by native_host_offload or state_cache here; set one of them or remove it";
            let used = self.kv_cache_bytes_per_token.is_none() || self.state_cache.is_some();
            return ensure(used, f("kv_cache_bytes_per_token"), msg);
        };
        let key = f("native_host_offload");
        let backend = self.backend;
        ensure(
            backend == Backend::Vllm,
            key.clone(),
            format!("is supported only for backend=vllm (got {backend})"),
        )?;
        ensure(self.enable_prefix_caching, key.clone(), "requires enable_prefix_caching=true")?;
        ensure(self.aic_nextn.is_none(), key.clone(), "does not support aic_nextn")?;
        let wt = self.worker_type;
        let msg = format!("is supported only for worker_type=aggregated (got {wt})");
        ensure(wt == super::WorkerType::Aggregated, key.clone(), msg)?;
        let msg = "requires kv_cache_bytes_per_token to derive the physical host block size";
        let bytes = self.kv_cache_bytes_per_token.ok_or_else(|| ConfigError::new(key.clone(), msg))?;
        int_range(f("kv_cache_bytes_per_token"), bytes, 1, MAX_KV_BYTES_PER_TOKEN as u64)?;
        int_range(format!("{key}.num_host_blocks"), h.num_host_blocks, 1, MAX_NUM_GPU_BLOCKS)?;
        for (name, x) in
            [("d2h_bandwidth_gbps", h.d2h_bandwidth_gbps), ("h2d_bandwidth_gbps", h.h2d_bandwidth_gbps)]
        {
            zero_or_range(format!("{key}.{name}"), x, BANDWIDTH_RANGE)?;
        }
        float_range(format!("{key}.latency_to_first_byte_ms"), h.latency_to_first_byte_ms, 0.0, MAX_PASS_MS)
    }
}

fn validate_timing(t: &TimingModelConfig, path: &str) -> Result<()> {
    match t {
        TimingModelConfig::Polynomial | TimingModelConfig::Architecture { .. } => Ok(()),
        TimingModelConfig::Fixed { prefill_ms, decode_ms } => {
            float_range(join(path, "prefill_ms"), *prefill_ms, 0.0, MAX_PASS_MS)?;
            float_range(join(path, "decode_ms"), *decode_ms, 0.0, MAX_PASS_MS)
        }
        TimingModelConfig::External { provider, config, .. } => {
            if !TIMING_PROVIDERS.contains(&provider.as_str()) {
                let choices = TIMING_PROVIDERS.join(", ");
                let msg =
                    format!("unsupported external timing provider {provider:?}; expected one of: {choices}");
                return Err(ConfigError::new(join(path, "provider"), msg));
            }
            let config_path = join(path, "config");
            if provider == "dynamo_profile" {
                // The profile itself is loaded elsewhere; here we only insist that one is named.
                Obj::new(config, &config_path, "path")?.must("path", to_string)?;
            } else if !config.is_object() {
                return Err(type_err(&config_path, "an object", config));
            }
            Ok(())
        }
    }
}

/// Parses a comma list of probabilities; a blank list means the built-in defaults.
pub(super) fn parse_accept_rates(raw: &str, path: &str) -> Result<Vec<f64>> {
    if raw.trim().is_empty() {
        return Ok(DEFAULT_ACCEPT_RATES.to_vec());
    }
    let parse_one = |(i, item): (usize, &str)| {
        let item = item.trim();
        let bad = |what: String| ConfigError::new(path, format!("entry {i} {what}"));
        let x: f64 = item.parse().map_err(|_| bad(format!("({item:?}) is not a number")))?;
        fraction(path, x).map_err(|e| bad(e.message))?;
        Ok(x)
    };
    raw.split(',').enumerate().map(parse_one).collect()
}

fn ensure(ok: bool, field: impl Into<String>, message: impl Into<String>) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(field, message))
    }
}

/// `n` in `lo..=hi`; the message names the range.
fn int_range<N>(field: impl Into<String>, n: N, lo: N, hi: N) -> Result<()>
where
    N: PartialOrd + std::fmt::Display,
{
    ensure(lo <= n && n <= hi, field, format!("must be in {lo}..={hi} (got {n})"))
}

/// `x` finite and in `[lo, hi]`.
fn float_range(field: impl Into<String>, x: f64, lo: f64, hi: f64) -> Result<()> {
    let ok = x.is_finite() && lo <= x && x <= hi;
    ensure(ok, field, format!("must be finite and in [{lo}, {hi}] (got {x})"))
}

/// 0 (the feature's "off" value) or `x` in `[lo, hi]`.
fn zero_or_range(field: impl Into<String>, x: f64, (lo, hi): (f64, f64)) -> Result<()> {
    let ok = x == 0.0 || (lo <= x && x <= hi);
    ensure(ok, field, format!("must be 0 or in [{lo:e}, {hi:e}] (got {x})"))
}

/// A speed-up ratio: 0 means no scaling.
fn speedup(field: impl Into<String>, x: f64) -> Result<()> {
    zero_or_range(field, x, SPEEDUP_RANGE)
}

fn fraction(field: &str, x: f64) -> Result<()> {
    let ok = x.is_finite() && (0.0..=1.0).contains(&x);
    ensure(ok, field, format!("must be finite and in [0, 1] (got {x})"))
}
