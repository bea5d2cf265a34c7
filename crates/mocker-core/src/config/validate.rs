//! The validation rules. Checks run in a fixed order and the first failure is reported, so the
//! order of the statements below is part of the behaviour.

use super::parse::{join, to_string, Obj};
use super::{
    invalid_choice, type_err, Backend, ConfigError, EngineConfig, EvictionPolicy, LaunchConfig, Result,
    TimingModelConfig, DEFAULT_ACCEPT_RATES,
};

/// External timing providers the config layer accepts (the engine decides what it can run).
const TIMING_PROVIDERS: [&str; 3] = ["dynamo_profile", "ais", "aic"];
const ROUTER_QUEUE_POLICIES: [&str; 3] = ["fcfs", "lcfs", "wspt"];

impl LaunchConfig {
    /// Checks every engine, launch and runtime rule; the constructors call it.
    pub fn validate(&self) -> Result<()> {
        self.engine.validate_at("engine")?;
        positive("dp_size", self.dp_size)?;
        positive("tensor_parallel_size", self.tensor_parallel_size)?;
        if let Some(t) = self.startup_time {
            non_negative("startup_time", t)?;
        }
        for (key, frac) in [
            ("gpu_memory_utilization", self.gpu_memory_utilization),
            ("mem_fraction_static", self.mem_fraction_static),
            ("free_gpu_memory_fraction", self.free_gpu_memory_fraction),
        ] {
            frac.map_or(Ok(()), |x| fraction(key, x))?;
        }
        let rt = &self.dynamo;
        positive("dynamo.handoff_session_timeout_ms", rt.handoff_session_timeout_ms)?;
        if let Some(p) = rt.router_queue_policy.as_deref() {
            if !ROUTER_QUEUE_POLICIES.contains(&p) {
                return Err(invalid_choice("dynamo.router_queue_policy", p, &ROUTER_QUEUE_POLICIES));
            }
        }
        if let Some(r) = &rt.reasoning {
            fraction("dynamo.reasoning.thinking_ratio", r.thinking_ratio)?;
        }
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
        positive(f("num_gpu_blocks"), self.num_gpu_blocks)?;
        positive(f("block_size"), bs)?;
        let msg = format!("must be at least 2 for vllm/trtllm (got {bs})");
        ensure(backend == Backend::Sglang || bs >= 2, f("block_size"), msg)?;
        if let Some(len) = self.max_model_len {
            positive(f("max_model_len"), len)?;
        }
        positive(f("max_num_seqs"), self.max_num_seqs)?;
        positive(f("max_num_batched_tokens"), self.max_num_batched_tokens)?;
        let psi = self.prefill_schedule_interval;
        positive(f("prefill_schedule_interval"), psi)?;
        only_for(Backend::Vllm, "prefill_schedule_interval", psi, 1)?;
        only_for(Backend::Sglang, "prefill_decode_interval", self.prefill_decode_interval, 0)?;
        let ok = self.enable_chunked_prefill || backend != Backend::Sglang;
        let msg = "false is not supported for backend=sglang; expected true";
        ensure(ok, f("enable_chunked_prefill"), msg)?;
        // SGLang's radix cache has its own eviction order; the knob would silently do nothing.
        let ok = self.eviction_policy == EvictionPolicy::Lru || backend != Backend::Sglang;
        let msg = format!("{} is not supported for backend=sglang; expected lru", self.eviction_policy);
        ensure(ok, f("eviction_policy"), msg)?;
        non_negative(f("speedup_ratio"), self.speedup_ratio)?;
        non_negative(f("decode_speedup_ratio"), self.decode_speedup_ratio)?;
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
            let ok = b.is_finite() && b > 0.0;
            ensure(ok, f("kv_transfer_bytes_per_token"), format!("must be positive (got {b})"))?;
        }
        if let Some(bw) = self.kv_transfer_bandwidth {
            non_negative(f("kv_transfer_bandwidth"), bw)?;
        }
        validate_timing(&self.timing_model, &f("timing_model"))?;
        let policy = &self.trtllm.capacity_scheduler_policy;
        if policy != "guaranteed_no_evict" {
            let path = f("trtllm.capacity_scheduler_policy");
            return Err(invalid_choice(&path, policy, &["guaranteed_no_evict"]));
        }
        // The SGLang block always exists (defaults), so only judge it when it is in use.
        if backend == Backend::Sglang {
            let s = &self.sglang;
            positive(f("sglang.max_prefill_tokens"), s.max_prefill_tokens)?;
            let chunk = s.chunked_prefill_size;
            positive(f("sglang.chunked_prefill_size"), chunk)?;
            let msg = format!("must be a multiple of block_size {bs} (got {chunk})");
            ensure(chunk.is_multiple_of(bs), f("sglang.chunked_prefill_size"), msg)?;
            non_negative(f("sglang.schedule_conservativeness"), s.schedule_conservativeness)?;
        }
        Ok(())
    }
}

fn validate_timing(t: &TimingModelConfig, path: &str) -> Result<()> {
    match t {
        TimingModelConfig::Polynomial => Ok(()),
        TimingModelConfig::Fixed { prefill_ms, decode_ms } => {
            non_negative(join(path, "prefill_ms"), *prefill_ms)?;
            non_negative(join(path, "decode_ms"), *decode_ms)
        }
        TimingModelConfig::External { provider, config } => {
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

fn positive<N>(field: impl Into<String>, n: N) -> Result<()>
where
    N: PartialOrd + Default + std::fmt::Display,
{
    ensure(n > N::default(), field, format!("must be positive (got {n})"))
}

fn non_negative(field: impl Into<String>, x: f64) -> Result<()> {
    ensure(x.is_finite() && x >= 0.0, field, format!("must be finite and non-negative (got {x})"))
}

fn fraction(field: &str, x: f64) -> Result<()> {
    let ok = x.is_finite() && (0.0..=1.0).contains(&x);
    ensure(ok, field, format!("must be finite and in [0, 1] (got {x})"))
}
