//! `KvRouterConfig`: the reference's keyword constructor, mapped onto mocker's KV router
//! settings (`mocker replay --router-config`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::{json, Value};

use mocker_router::KvRouterConfig as Config;

/// KV router settings with the reference's keywords and defaults. The ones mocker's router
/// models act; the others describe a deployment (indexer threads, replicas, remote
/// indexers) or a policy mocker does not model, and are accepted only at the reference's
/// default, which is what mocker does: any other value is refused by name.
#[pyclass(module = "mocker", name = "KvRouterConfig", frozen)]
#[derive(Clone)]
pub struct KvRouterConfig {
    /// The settings, validated as `--router-config` validates them.
    pub config: Config,
}

/// A keyword mocker's router does not model: accepted only when it equals the default.
fn only_default<T: PartialEq + std::fmt::Debug>(name: &str, value: T, default: T) -> PyResult<()> {
    if value == default {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "KvRouterConfig: {name}: not supported yet (mocker's KV router does not model it); only its default \
         {default:?} is accepted (got {value:?})"
    )))
}

#[pymethods]
impl KvRouterConfig {
    /// Keywords as the reference's `KvRouterConfig`; `seed` (mocker's) seeds the router's
    /// tie-breaks.
    #[new]
    #[pyo3(signature = (
        overlap_score_weight = None,
        host_cache_hit_weight = 0.75,
        disk_cache_hit_weight = 0.25,
        router_temperature = 0.0,
        use_kv_events = true,
        *,
        router_replica_sync = false,
        router_track_active_blocks = true,
        router_track_output_blocks = false,
        router_assume_kv_reuse = true,
        router_track_prefill_tokens = true,
        router_prefill_load_model = "none",
        router_ttl_secs = 120.0,
        router_approximate_cache_policy = "ttl",
        router_queue_threshold = None,
        router_event_threads = 4,
        router_queue_policy = "fcfs",
        use_remote_indexer = false,
        serve_indexer = false,
        enable_session_prefix_index = false,
        shared_cache_multiplier = None,
        shared_cache_type = "none",
        router_predicted_ttl_secs = None,
        conditional_disagg_enabled = false,
        conditional_disagg_policy = "isl_bounding",
        conditional_disagg_eff_isl_threshold = 2048,
        conditional_disagg_eff_isl_ratio_threshold = 0.7,
        conditional_disagg_prefill_busy_threshold = None,
        conditional_disagg_decode_busy_threshold = None,
        overlap_score_credit = 1.0,
        overlap_score_credit_decay = 0.0,
        prefill_load_scale = 1.0,
        decode_active_request_weight = 0.0,
        router_policy_config = None,
        router_prefill_policy = None,
        router_decode_policy = None,
        router_tracking_hash = "public-xxh3-v1",
        router_tracking_key_file = None,
        router_tracking_key_id = None,
        seed = 42,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        overlap_score_weight: Option<f64>,
        host_cache_hit_weight: f64,
        disk_cache_hit_weight: f64,
        router_temperature: f64,
        use_kv_events: bool,
        router_replica_sync: bool,
        router_track_active_blocks: bool,
        router_track_output_blocks: bool,
        router_assume_kv_reuse: bool,
        router_track_prefill_tokens: bool,
        router_prefill_load_model: &str,
        router_ttl_secs: f64,
        router_approximate_cache_policy: &str,
        router_queue_threshold: Option<f64>,
        router_event_threads: i64,
        router_queue_policy: &str,
        use_remote_indexer: bool,
        serve_indexer: bool,
        enable_session_prefix_index: bool,
        shared_cache_multiplier: Option<f64>,
        shared_cache_type: &str,
        router_predicted_ttl_secs: Option<f64>,
        conditional_disagg_enabled: bool,
        conditional_disagg_policy: &str,
        conditional_disagg_eff_isl_threshold: i64,
        conditional_disagg_eff_isl_ratio_threshold: f64,
        conditional_disagg_prefill_busy_threshold: Option<f64>,
        conditional_disagg_decode_busy_threshold: Option<f64>,
        overlap_score_credit: f64,
        overlap_score_credit_decay: f64,
        prefill_load_scale: f64,
        decode_active_request_weight: f64,
        router_policy_config: Option<String>,
        router_prefill_policy: Option<String>,
        router_decode_policy: Option<String>,
        router_tracking_hash: &str,
        router_tracking_key_file: Option<std::path::PathBuf>,
        router_tracking_key_id: Option<String>,
        seed: u64,
    ) -> PyResult<Self> {
        only_default("host_cache_hit_weight", host_cache_hit_weight, 0.75)?;
        only_default("disk_cache_hit_weight", disk_cache_hit_weight, 0.25)?;
        only_default("use_kv_events", use_kv_events, true)?;
        only_default("router_replica_sync", router_replica_sync, false)?;
        only_default("router_track_output_blocks", router_track_output_blocks, false)?;
        only_default("router_prefill_load_model", router_prefill_load_model, "none")?;
        only_default("router_ttl_secs", router_ttl_secs, 120.0)?;
        only_default("router_approximate_cache_policy", router_approximate_cache_policy, "ttl")?;
        only_default("router_event_threads", router_event_threads, 4)?;
        only_default("use_remote_indexer", use_remote_indexer, false)?;
        only_default("serve_indexer", serve_indexer, false)?;
        only_default("enable_session_prefix_index", enable_session_prefix_index, false)?;
        only_default("shared_cache_multiplier", shared_cache_multiplier, None)?;
        only_default("shared_cache_type", shared_cache_type, "none")?;
        only_default("router_predicted_ttl_secs", router_predicted_ttl_secs, None)?;
        only_default("conditional_disagg_enabled", conditional_disagg_enabled, false)?;
        only_default("conditional_disagg_policy", conditional_disagg_policy, "isl_bounding")?;
        only_default("conditional_disagg_eff_isl_threshold", conditional_disagg_eff_isl_threshold, 2048)?;
        only_default(
            "conditional_disagg_eff_isl_ratio_threshold",
            conditional_disagg_eff_isl_ratio_threshold,
            0.7,
        )?;
        only_default(
            "conditional_disagg_prefill_busy_threshold",
            conditional_disagg_prefill_busy_threshold,
            None,
        )?;
        only_default(
            "conditional_disagg_decode_busy_threshold",
            conditional_disagg_decode_busy_threshold,
            None,
        )?;
        only_default("router_policy_config", router_policy_config, None)?;
        only_default("router_prefill_policy", router_prefill_policy, None)?;
        only_default("router_decode_policy", router_decode_policy, None)?;
        only_default("router_tracking_hash", router_tracking_hash, "public-xxh3-v1")?;
        only_default("router_tracking_key_file", router_tracking_key_file, None)?;
        only_default("router_tracking_key_id", router_tracking_key_id, None)?;
        // The keys mocker's router reads, checked by the parser `--router-config` goes
        // through. `overlap_score_weight`, when given, wins over `prefill_load_scale`, as
        // in the reference (its 0 also zeroes the overlap credit: the router derives that).
        let settings = json!({
            "overlap_score_credit": overlap_score_credit,
            "overlap_score_credit_decay": overlap_score_credit_decay,
            "prefill_load_scale": overlap_score_weight.unwrap_or(prefill_load_scale),
            "decode_active_request_weight": decode_active_request_weight,
            "router_temperature": router_temperature,
            "router_track_active_blocks": router_track_active_blocks,
            "router_assume_kv_reuse": router_assume_kv_reuse,
            "router_track_prefill_tokens": router_track_prefill_tokens,
            "router_queue_threshold": router_queue_threshold.map_or(Value::Null, Value::from),
            "router_queue_policy": router_queue_policy,
            "seed": seed,
        });
        parse(&settings.to_string())
    }

    /// A config from `--router-config` JSON: mocker's keys (`overlap_score_credit`,
    /// `router_temperature`, `router_queue_threshold`, ...), unknown keys refused.
    #[staticmethod]
    fn from_json(config_json: &str) -> PyResult<Self> {
        parse(config_json)
    }

    /// The settings as `--router-config` JSON (every key mocker's router reads).
    fn to_json(&self) -> String {
        self.config.to_json()
    }

    /// A copy (the config is immutable; kept for the reference's API).
    fn copy(&self) -> Self {
        self.clone()
    }

    fn __repr__(&self) -> String {
        format!("KvRouterConfig.from_json({:?})", self.config.to_json())
    }

    /// Blocks of prefill credit per block already cached on a worker.
    #[getter]
    fn overlap_score_credit(&self) -> f64 {
        self.config.overlap_score_credit
    }

    /// How fast the overlap credit yields to prefill balance on backlogged workers.
    #[getter]
    fn overlap_score_credit_decay(&self) -> f64 {
        self.config.overlap_score_credit_decay
    }

    /// Scale of the prefill cost (the reference's deprecated alias reads the same value).
    #[getter]
    fn prefill_load_scale(&self) -> f64 {
        self.config.prefill_load_scale
    }

    /// Alias of `prefill_load_scale`.
    #[getter]
    fn overlap_score_weight(&self) -> f64 {
        self.config.prefill_load_scale
    }

    /// Cost per live request on a worker.
    #[getter]
    fn decode_active_request_weight(&self) -> f64 {
        self.config.decode_active_request_weight
    }

    /// Softmax temperature of worker sampling (0: the cheapest worker).
    #[getter]
    fn router_temperature(&self) -> f64 {
        self.config.router_temperature
    }

    /// Queue arrivals while every worker's pending prefill exceeds this fraction of its
    /// batch budget; None disables the queue.
    #[getter]
    fn router_queue_threshold(&self) -> Option<f64> {
        self.config.router_queue_threshold
    }
}

/// `--router-config` JSON parsed and checked as the CLI does; errors name the key.
fn parse(text: &str) -> PyResult<KvRouterConfig> {
    Config::from_json(text)
        .map(|config| KvRouterConfig { config })
        .map_err(|e| PyValueError::new_err(format!("KvRouterConfig: {e}")))
}
