//! Engine launch configuration: parsing, normalisation and validation.
//!
//! The canonical shape mirrors the reference's normalised launch config (nested `engine` and
//! `dynamo` objects) so our canonical dump can be diffed against it key by key. The legacy flat
//! `MockEngineArgs` shape is rewritten into the nested one first, so there is a single parser and
//! a single validator; errors found after that rewrite use canonical paths (`engine.block_size`).
//! Input JSON is walked by hand instead of through serde derives so that every error carries a
//! dotted path and says which value was wrong and what is allowed; output uses `Serialize`.

use serde::Serialize;
use serde_json::{json, Map, Value};

type Result<T> = std::result::Result<T, ConfigError>;
type Conv<T> = fn(&Value, &str) -> Result<T>;

/// A configuration problem, located by the dotted path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// Dotted path of the field, e.g. `engine.block_size`.
    pub field: String,
    /// What is wrong, naming the bad value and what is allowed.
    pub message: String,
}

impl ConfigError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        let (field, message) = (field.into(), message.into());
        Self { field, message }
    }
}

/// Defines a closed set of JSON strings, one canonical spelling per variant.
macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vm])* $var),+ }

        impl $name {
            /// All variants, in the order error messages list them.
            pub const ALL: &'static [Self] = &[$(Self::$var),+];

            /// The canonical JSON spelling.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$var => $text),+ }
            }

            fn parse(v: &Value, path: &str) -> Result<Self> {
                let s = v.as_str().ok_or_else(|| type_err(path, "a string", v))?;
                let names = [$($text),+];
                let found = Self::ALL.iter().copied().find(|t| t.as_str() == s);
                found.ok_or_else(|| invalid_choice(path, s, &names))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum! {
    /// Which inference engine is simulated; selects the scheduler core and block-size default.
    Backend { #[default] Vllm = "vllm", Sglang = "sglang", Trtllm = "trtllm" }
}
string_enum! {
    /// Role of a worker in (dis)aggregated serving.
    WorkerType { #[default] Aggregated = "aggregated", Prefill = "prefill", Decode = "decode" }
}
string_enum! {
    /// Which running request vLLM evicts first when KV blocks run out.
    PreemptionMode { #[default] Lifo = "lifo", Fifo = "fifo" }
}
string_enum! {
    /// Which tokens a disaggregated KV transfer is charged for.
    KvTransferTimingMode {
        /// The whole prompt.
        #[default]
        FullPrompt = "full_prompt",
        /// Only the blocks the destination does not already cache.
        DestinationMissing = "destination_missing",
    }
}
string_enum! {
    /// Order in which SGLang admits waiting requests.
    SglangSchedulePolicy {
        /// Arrival order (legacy spelling `fcfs`).
        #[default]
        Fifo = "fifo",
        /// Longest cached prefix first.
        Lpm = "lpm",
    }
}

impl Backend {
    /// Native block (page) size used when `block_size` is omitted.
    pub fn default_block_size(self) -> usize {
        match self {
            Backend::Vllm => 64,
            Backend::Sglang => 1,
            Backend::Trtllm => 32,
        }
    }
}

/// How forward-pass time is computed.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TimingModelConfig {
    /// Built-in polynomial fit (legacy spelling `default`).
    #[default]
    Polynomial,
    /// Constant per-pass latencies in milliseconds.
    Fixed { prefill_ms: f64, decode_ms: f64 },
    /// A provider-backed model, e.g. `dynamo_profile` with `config: {"path": "x.npz"}`.
    External { provider: String, config: Value },
}

/// SGLang-only scheduler knobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SglangConfig {
    /// Admission order of waiting requests.
    pub schedule_policy: SglangSchedulePolicy,
    /// Token budget of one prefill pass.
    pub max_prefill_tokens: usize,
    /// Largest prompt chunk prefilled at once; a multiple of the page size.
    pub chunked_prefill_size: usize,
    /// Cap on the per-request remaining-output estimate used for admission.
    pub clip_max_new_tokens: usize,
    /// Scales the reserved decode headroom (higher admits less).
    pub schedule_conservativeness: f64,
}

impl Default for SglangConfig {
    fn default() -> Self {
        Self {
            schedule_policy: SglangSchedulePolicy::Fifo,
            max_prefill_tokens: 16384,
            chunked_prefill_size: 8192,
            clip_max_new_tokens: 4096,
            schedule_conservativeness: 1.0,
        }
    }
}

/// TRT-LLM-only knobs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrtllmConfig {
    /// Capacity scheduler policy; only `guaranteed_no_evict` is modelled.
    pub capacity_scheduler_policy: String,
}

impl Default for TrtllmConfig {
    fn default() -> Self {
        let capacity_scheduler_policy = "guaranteed_no_evict".to_string();
        Self { capacity_scheduler_policy }
    }
}

/// Rank-local scheduler and timing configuration of one engine (one DP rank).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineConfig {
    /// Simulated engine.
    pub backend: Backend,
    /// KV capacity per DP rank, in blocks (SGLang: pages).
    pub num_gpu_blocks: usize,
    /// Tokens per block (SGLang: page size).
    pub block_size: usize,
    /// Prompt+output length limit, if any.
    pub max_model_len: Option<usize>,
    /// Maximum running requests.
    pub max_num_seqs: usize,
    /// Per-pass token budget (vLLM/TRT-LLM; SGLang ignores it).
    pub max_num_batched_tokens: usize,
    /// vLLM with dp_size>1: prefill scheduling cadence.
    pub prefill_schedule_interval: usize,
    /// SGLang: decode passes between prefill passes (0 = off).
    pub prefill_decode_interval: usize,
    /// Reuse cached prefixes and emit KV events.
    pub enable_prefix_caching: bool,
    /// Split long prompts across passes.
    pub enable_chunked_prefill: bool,
    /// Divides all pass times; 0 means no scaling.
    pub speedup_ratio: f64,
    /// Extra divisor for decode passes.
    pub decode_speedup_ratio: f64,
    /// MTP/EAGLE draft tokens per step (1..=5).
    pub aic_nextn: Option<u32>,
    /// Comma list of conditional accept probabilities; exactly `aic_nextn` entries once built.
    pub aic_nextn_accept_rates: Option<String>,
    /// Base seed of the MTP acceptance RNG.
    pub aic_mtp_seed: u64,
    /// Role in disaggregated serving.
    pub worker_type: WorkerType,
    /// vLLM preemption victim order.
    pub preemption_mode: PreemptionMode,
    /// Keep per-block local hashes in KV events.
    pub emit_kv_events: bool,
    /// Include token ids in Stored events.
    pub emit_kv_token_ids: bool,
    /// KV bytes per token, for transfer-time modelling.
    #[serde(serialize_with = "whole_as_integer")]
    pub kv_transfer_bytes_per_token: Option<f64>,
    /// Transfer bandwidth in GB/s; None or 0 means instantaneous.
    pub kv_transfer_bandwidth: Option<f64>,
    /// Which tokens a transfer is charged for.
    pub kv_transfer_timing_mode: KvTransferTimingMode,
    /// Forward-pass time model.
    pub timing_model: TimingModelConfig,
    /// SGLang knobs (validated only for backend=sglang).
    pub sglang: SglangConfig,
    /// TRT-LLM knobs.
    pub trtllm: TrtllmConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Vllm,
            num_gpu_blocks: 16384,
            block_size: Backend::Vllm.default_block_size(),
            max_model_len: None,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            prefill_schedule_interval: 1,
            prefill_decode_interval: 0,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            speedup_ratio: 1.0,
            decode_speedup_ratio: 1.0,
            aic_nextn: None,
            aic_nextn_accept_rates: None,
            aic_mtp_seed: 42,
            worker_type: WorkerType::Aggregated,
            preemption_mode: PreemptionMode::Lifo,
            emit_kv_events: false,
            emit_kv_token_ids: false,
            kv_transfer_bytes_per_token: None,
            kv_transfer_bandwidth: None,
            kv_transfer_timing_mode: KvTransferTimingMode::FullPrompt,
            timing_model: TimingModelConfig::Polynomial,
            sglang: SglangConfig::default(),
            trtllm: TrtllmConfig::default(),
        }
    }
}

/// Accept rates used when `aic_nextn` is set without (or with a blank) `aic_nextn_accept_rates`.
const DEFAULT_ACCEPT_RATES: [f64; 5] = [0.85, 0.3, 0.0, 0.0, 0.0];
/// External timing providers the config layer accepts (the engine decides what it can run).
const TIMING_PROVIDERS: [&str; 3] = ["dynamo_profile", "ais", "aic"];
const ROUTER_QUEUE_POLICIES: [&str; 3] = ["fcfs", "lcfs", "wspt"];

impl EngineConfig {
    /// KV capacity of one rank in tokens; the denominator of the polynomial decode model.
    pub fn total_kv_tokens(&self) -> usize {
        self.num_gpu_blocks.saturating_mul(self.block_size)
    }

    /// Per-draft accept probabilities, exactly `aic_nextn` long (empty without MTP). Pads with 0
    /// and truncates itself so hand-built configs need no normalisation pass.
    pub fn mtp_accept_rates(&self) -> Vec<f64> {
        let Some(n) = self.aic_nextn else {
            return Vec::new();
        };
        let raw = self.aic_nextn_accept_rates.as_deref().unwrap_or("");
        let mut rates = parse_accept_rates(raw, "").unwrap_or_default();
        rates.resize(n as usize, 0.0);
        rates
    }

    fn validate_at(&self, p: &str) -> Result<()> {
        let f = |key: &str| join(p, key);
        let (backend, bs) = (self.backend, self.block_size);
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
        let msg = format!("must be 1 for backend={backend} (got {psi}); only vllm supports it");
        let ok = psi == 1 || backend == Backend::Vllm;
        ensure(ok, f("prefill_schedule_interval"), msg)?;
        let pdi = self.prefill_decode_interval;
        let msg = format!("must be 0 for backend={backend} (got {pdi}); only sglang supports it");
        let ok = pdi == 0 || backend == Backend::Sglang;
        ensure(ok, f("prefill_decode_interval"), msg)?;
        let ok = self.enable_chunked_prefill || backend != Backend::Sglang;
        let msg = "false is not supported for backend=sglang; expected true".to_string();
        ensure(ok, f("enable_chunked_prefill"), msg)?;
        non_negative(f("speedup_ratio"), self.speedup_ratio)?;
        non_negative(f("decode_speedup_ratio"), self.decode_speedup_ratio)?;
        if let Some(n) = self.aic_nextn {
            let msg = format!("must be in 1..=5 (got {n})");
            ensure((1..=5).contains(&n), f("aic_nextn"), msg)?;
            let dsr = self.decode_speedup_ratio;
            // MTP output speed-up is modelled by burst sampling, not by a decode divisor.
            let msg = format!("requires decode_speedup_ratio = 1.0 (got {dsr})");
            ensure(dsr == 1.0, f("aic_nextn"), msg)?;
        }
        if let Some(raw) = &self.aic_nextn_accept_rates {
            let path = f("aic_nextn_accept_rates");
            let msg = "requires aic_nextn to be set".to_string();
            ensure(self.aic_nextn.is_some(), path.clone(), msg)?;
            parse_accept_rates(raw, &path)?;
        }
        let ok = self.emit_kv_events || !self.emit_kv_token_ids;
        let msg = "true requires emit_kv_events = true".to_string();
        ensure(ok, f("emit_kv_token_ids"), msg)?;
        if let Some(b) = self.kv_transfer_bytes_per_token {
            let msg = format!("must be positive (got {b})");
            let ok = b.is_finite() && b > 0.0;
            ensure(ok, f("kv_transfer_bytes_per_token"), msg)?;
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
            let c = s.schedule_conservativeness;
            non_negative(f("sglang.schedule_conservativeness"), c)?;
        }
        Ok(())
    }
}

/// Thinking-token simulation for reasoning models.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasoningConfig {
    /// Token id that opens the thinking span.
    pub start_thinking_token_id: u32,
    /// Token id that closes the thinking span.
    pub end_thinking_token_id: u32,
    /// Fraction of output tokens spent thinking, in [0, 1].
    pub thinking_ratio: f64,
}

/// Options of the serving shell around the engine (the `dynamo` object).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuntimeConfig {
    /// Run a worker-local KV indexer.
    pub enable_local_indexer: bool,
    /// Disaggregation bootstrap port.
    pub bootstrap_port: Option<u16>,
    /// How long a prefill-to-decode handoff session may stay open.
    pub handoff_session_timeout_ms: u64,
    /// Reasoning simulation, if any.
    pub reasoning: Option<ReasoningConfig>,
    /// Where to record responses for later replay.
    pub response_replay_trace_path: Option<String>,
    /// Publish KV events on this ZMQ port.
    pub zmq_kv_events_port: Option<u16>,
    /// Serve KV-event replay on this ZMQ port.
    pub zmq_replay_port: Option<u16>,
    /// Router queue policy: `fcfs`, `lcfs` or `wspt`.
    pub router_queue_policy: Option<String>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            enable_local_indexer: false,
            bootstrap_port: None,
            handoff_session_timeout_ms: 300_000,
            zmq_kv_events_port: None,
            zmq_replay_port: None,
            router_queue_policy: None,
            reasoning: None,
            response_replay_trace_path: None,
        }
    }
}

/// A complete worker launch: engine knobs plus launch- and runtime-level options.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchConfig {
    /// Per-rank engine configuration.
    pub engine: EngineConfig,
    /// Data-parallel ranks, each with its own `engine.num_gpu_blocks`.
    pub dp_size: usize,
    /// Tensor-parallel degree (affects only memory-derived capacity).
    pub tensor_parallel_size: usize,
    /// Simulated startup delay in seconds.
    pub startup_time: Option<f64>,
    /// Whether the user fixed `num_gpu_blocks`, so memory fractions must not override it.
    pub num_gpu_blocks_is_explicit: bool,
    /// vLLM-style memory fraction.
    pub gpu_memory_utilization: Option<f64>,
    /// SGLang-style memory fraction.
    pub mem_fraction_static: Option<f64>,
    /// TRT-LLM-style memory fraction.
    pub free_gpu_memory_fraction: Option<f64>,
    /// Memory held back for CUDA graphs.
    pub cuda_graph_reserved_bytes: Option<u64>,
    /// Runtime (serving shell) options.
    pub dynamo: RuntimeConfig,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            dp_size: 1,
            tensor_parallel_size: 1,
            startup_time: None,
            num_gpu_blocks_is_explicit: false,
            gpu_memory_utilization: None,
            mem_fraction_static: None,
            free_gpu_memory_fraction: None,
            cuda_graph_reserved_bytes: None,
            dynamo: RuntimeConfig::default(),
        }
    }
}

// Accepted keys per object, space separated, in the order error messages list them.
const ENGINE_KEYS: &str = "backend num_gpu_blocks block_size max_model_len max_num_seqs \
    max_num_batched_tokens prefill_schedule_interval prefill_decode_interval \
    enable_prefix_caching enable_chunked_prefill speedup_ratio decode_speedup_ratio aic_nextn \
    aic_nextn_accept_rates aic_mtp_seed worker_type preemption_mode emit_kv_events \
    emit_kv_token_ids kv_transfer_bytes_per_token kv_bytes_per_token kv_transfer_bandwidth \
    kv_transfer_timing_mode timing_model sglang trtllm";
const LAUNCH_KEYS: &str = "engine dp_size tensor_parallel_size startup_time \
    num_gpu_blocks_is_explicit gpu_memory_utilization mem_fraction_static \
    free_gpu_memory_fraction cuda_graph_reserved_bytes dynamo";
const RUNTIME_KEYS: &str = "enable_local_indexer bootstrap_port handoff_session_timeout_ms \
    reasoning response_replay_trace_path zmq_kv_events_port zmq_replay_port router_queue_policy";
const SGLANG_KEYS: &str = "schedule_policy max_prefill_tokens chunked_prefill_size \
    clip_max_new_tokens schedule_conservativeness";
const REASONING_KEYS: &str = "start_thinking_token_id end_thinking_token_id thinking_ratio";
/// Flat-form spellings of older mocker versions and the engine keys they stand for.
const FLAT_ALIASES: [(&str, &str); 4] = [
    ("engine_type", "backend"),
    ("ais_nextn", "aic_nextn"),
    ("ais_nextn_accept_rates", "aic_nextn_accept_rates"),
    ("ais_mtp_seed", "aic_mtp_seed"),
];

impl LaunchConfig {
    /// Parses a JSON document in nested or flat form; empty input means all defaults.
    pub fn from_json_str(s: &str) -> Result<Self> {
        if s.trim().is_empty() {
            return Self::from_value(json!({}));
        }
        let v = serde_json::from_str(s)
            .map_err(|e| ConfigError::new("engine_args", format!("invalid JSON: {e}")))?;
        Self::from_value(v)
    }

    /// Builds, validates and normalises a config from a parsed JSON value.
    pub fn from_value(v: Value) -> Result<Self> {
        let v = match v {
            // Without an `engine` key the document can only be the flat form (or empty).
            Value::Object(m) if !m.contains_key("engine") => Value::Object(flat_to_nested(m)?),
            Value::Object(m) => Value::Object(m),
            other => return Err(type_err("engine_args", "a JSON object", &other)),
        };
        let mut cfg = parse_launch(&v)?;
        cfg.validate()?;
        if cfg.engine.aic_nextn.is_some() {
            let rates: Vec<String> = cfg.engine.mtp_accept_rates().iter().map(f64::to_string).collect();
            cfg.engine.aic_nextn_accept_rates = Some(rates.join(","));
        }
        Ok(cfg)
    }

    /// Parses a CLI argument: inline JSON, or `@path` to read the JSON from a file.
    pub fn from_arg(arg: &str) -> Result<Self> {
        let Some(path) = arg.strip_prefix('@') else {
            return Self::from_json_str(arg);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("engine_args", format!("cannot read file {path:?}: {e}")))?;
        Self::from_json_str(&text)
    }

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
        let timeout = rt.handoff_session_timeout_ms;
        positive("dynamo.handoff_session_timeout_ms", timeout)?;
        if let Some(p) = rt.router_queue_policy.as_deref() {
            if !ROUTER_QUEUE_POLICIES.contains(&p) {
                let path = "dynamo.router_queue_policy";
                return Err(invalid_choice(path, p, &ROUTER_QUEUE_POLICIES));
            }
        }
        if let Some(r) = &rt.reasoning {
            fraction("dynamo.reasoning.thinking_ratio", r.thinking_ratio)?;
        }
        Ok(())
    }

    /// The canonical nested form with every default filled in, keyed like the reference.
    pub fn to_canonical_json(&self) -> Value {
        serde_json::to_value(self).expect("plain data always serialises")
    }
}

/// Sorts flat top-level keys into the nested `engine` / launch / `dynamo` objects, resolving
/// legacy aliases on the way.
fn flat_to_nested(flat: Map<String, Value>) -> Result<Map<String, Value>> {
    for (alias, canonical) in FLAT_ALIASES {
        if flat.contains_key(alias) && flat.contains_key(canonical) {
            let msg = format!("duplicate field: {alias} is a legacy alias of {canonical}");
            return Err(ConfigError::new(alias, msg));
        }
    }
    let (mut top, mut engine) = (Map::new(), Map::new());
    let mut dynamo = match flat.get("dynamo") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => return Err(type_err("dynamo", "an object", other)),
    };
    let mut role_flags = None;
    for (key, value) in flat {
        let alias = FLAT_ALIASES.iter().find(|(a, _)| *a == key).map(|(_, c)| *c);
        if key == "dynamo" {
            continue;
        } else if key == "is_prefill" || key == "is_decode" {
            let flag = to_bool(&value, &key)?;
            let (p, d) = role_flags.get_or_insert((false, false));
            *(if key == "is_prefill" { p } else { d }) = flag;
        } else if has_key(LAUNCH_KEYS, &key) {
            top.insert(key, value);
        } else if has_key(RUNTIME_KEYS, &key) {
            if dynamo.contains_key(&key) {
                let msg = format!("duplicate field: {key} also given inside dynamo");
                return Err(ConfigError::new(key, msg));
            }
            dynamo.insert(key, value);
        } else if let Some(canonical) = alias {
            engine.insert(canonical.to_string(), value);
        } else if has_key(ENGINE_KEYS, &key) {
            engine.insert(key, value);
        } else {
            let aliases = FLAT_ALIASES.map(|(a, _)| a).join(" ");
            let all = format!("{ENGINE_KEYS} {LAUNCH_KEYS} {RUNTIME_KEYS} {aliases} is_prefill is_decode");
            return Err(unknown_field(&key, &all.replace(" engine ", " ")));
        }
    }
    if let Some(flags) = role_flags {
        if engine.contains_key("worker_type") {
            let msg = "cannot be combined with is_prefill/is_decode; give only worker_type";
            return Err(ConfigError::new("worker_type", msg));
        }
        let role = match flags {
            (true, true) => {
                let msg = "is_prefill and is_decode cannot both be true";
                return Err(ConfigError::new("is_prefill", msg));
            }
            (true, false) => WorkerType::Prefill,
            (false, true) => WorkerType::Decode,
            (false, false) => WorkerType::Aggregated,
        };
        engine.insert("worker_type".into(), json!(role));
    }
    // Old mocker versions used 0 to ask for the backend's native block size.
    if engine.get("block_size").and_then(Value::as_u64) == Some(0) {
        engine.remove("block_size");
    }
    let page = match engine.get_mut("sglang") {
        Some(Value::Object(sglang)) => sglang.remove("page_size").filter(|p| !p.is_null()),
        _ => None,
    };
    if let Some(page) = page {
        let page_size: usize = to_uint(&page, "sglang.page_size")?;
        match engine.get("block_size").filter(|b| !b.is_null()) {
            Some(b) if b.as_u64() != Some(page_size as u64) => {
                let msg = format!("{page_size} conflicts with block_size {b}; give one of them");
                return Err(ConfigError::new("sglang.page_size", msg));
            }
            _ => engine.insert("block_size".into(), json!(page_size)),
        };
    }
    top.insert("engine".into(), Value::Object(engine));
    if !dynamo.is_empty() {
        top.insert("dynamo".into(), Value::Object(dynamo));
    }
    Ok(top)
}

/// Overwrites `$cfg.$field` from the JSON key named like the field, when the key is present.
macro_rules! set {
    ($obj:ident, $cfg:ident.$field:ident, $conv:expr) => {
        $obj.set(stringify!($field), &mut $cfg.$field, $conv)?
    };
}

/// Like `set!` for optional fields, where null also means "none".
macro_rules! set_opt {
    ($obj:ident, $cfg:ident.$field:ident, $conv:expr) => {
        $cfg.$field = $obj.opt(stringify!($field), $conv)?
    };
}

fn parse_launch(v: &Value) -> Result<LaunchConfig> {
    let o = Obj::new(v, "", LAUNCH_KEYS)?;
    let mut c = LaunchConfig::default();
    if let Some(engine) = o.map.get("engine") {
        c.engine = parse_engine(engine, "engine")?;
        c.num_gpu_blocks_is_explicit = engine.get("num_gpu_blocks").is_some();
    }
    set!(o, c.dp_size, to_uint);
    set!(o, c.tensor_parallel_size, to_uint);
    set_opt!(o, c.startup_time, to_f64);
    // An explicit flag wins over the derived one (the reference does the same).
    set!(o, c.num_gpu_blocks_is_explicit, to_bool);
    set_opt!(o, c.gpu_memory_utilization, to_f64);
    set_opt!(o, c.mem_fraction_static, to_f64);
    set_opt!(o, c.free_gpu_memory_fraction, to_f64);
    set_opt!(o, c.cuda_graph_reserved_bytes, to_uint);
    set!(o, c.dynamo, parse_runtime);
    Ok(c)
}

fn parse_engine(v: &Value, path: &str) -> Result<EngineConfig> {
    let o = Obj::new(v, path, ENGINE_KEYS)?;
    let mut c = EngineConfig::default();
    set!(o, c.backend, Backend::parse);
    // null is accepted (as in the reference): "no value" is exactly what selects the default.
    c.block_size = o.opt("block_size", to_uint)?.unwrap_or(c.backend.default_block_size());
    set!(o, c.num_gpu_blocks, to_uint);
    set_opt!(o, c.max_model_len, to_uint);
    set!(o, c.max_num_seqs, to_uint);
    set!(o, c.max_num_batched_tokens, to_uint);
    set!(o, c.prefill_schedule_interval, to_uint);
    set!(o, c.prefill_decode_interval, to_uint);
    set!(o, c.enable_prefix_caching, to_bool);
    set!(o, c.enable_chunked_prefill, to_bool);
    set!(o, c.speedup_ratio, to_f64);
    set!(o, c.decode_speedup_ratio, to_f64);
    set_opt!(o, c.aic_nextn, to_uint);
    set_opt!(o, c.aic_nextn_accept_rates, to_string);
    set!(o, c.aic_mtp_seed, to_uint);
    set!(o, c.worker_type, WorkerType::parse);
    set!(o, c.preemption_mode, PreemptionMode::parse);
    set!(o, c.emit_kv_events, to_bool);
    set!(o, c.emit_kv_token_ids, to_bool);
    // Key presence, not value, makes a duplicate: `{"kv_bytes_per_token": null, ...}` is two.
    if o.map.contains_key("kv_bytes_per_token") {
        if o.map.contains_key("kv_transfer_bytes_per_token") {
            let msg = "duplicate field: alias of kv_transfer_bytes_per_token, give only one";
            return Err(ConfigError::new(o.path("kv_bytes_per_token"), msg));
        }
        c.kv_transfer_bytes_per_token = o.opt("kv_bytes_per_token", to_f64)?;
    } else {
        set_opt!(o, c.kv_transfer_bytes_per_token, to_f64);
    }
    set_opt!(o, c.kv_transfer_bandwidth, to_f64);
    set!(o, c.kv_transfer_timing_mode, KvTransferTimingMode::parse);
    set!(o, c.timing_model, parse_timing);
    set!(o, c.sglang, parse_sglang);
    set!(o, c.trtllm, |v, p| {
        let o = Obj::new(v, p, "capacity_scheduler_policy")?;
        let mut c = TrtllmConfig::default();
        set!(o, c.capacity_scheduler_policy, to_string);
        Ok(c)
    });
    Ok(c)
}

fn parse_sglang(v: &Value, path: &str) -> Result<SglangConfig> {
    let o = Obj::new(v, path, SGLANG_KEYS)?;
    let mut c = SglangConfig::default();
    set!(o, c.schedule_policy, |v, p| match v.as_str() {
        Some("fcfs") => Ok(SglangSchedulePolicy::Fifo),
        _ => SglangSchedulePolicy::parse(v, p),
    });
    set!(o, c.max_prefill_tokens, to_uint);
    set!(o, c.chunked_prefill_size, to_uint);
    set!(o, c.clip_max_new_tokens, to_uint);
    set!(o, c.schedule_conservativeness, to_f64);
    Ok(c)
}

fn parse_timing(v: &Value, path: &str) -> Result<TimingModelConfig> {
    let type_path = join(path, "type");
    let kind = match v.as_object().map(|m| m.get("type")) {
        None => return Err(type_err(path, r#"an object like {"type": "polynomial"}"#, v)),
        Some(None) => return Err(ConfigError::new(type_path, "missing required field")),
        Some(Some(t)) => to_string(t, &type_path)?,
    };
    match kind.as_str() {
        "polynomial" | "default" => Obj::new(v, path, "type").map(|_| TimingModelConfig::Polynomial),
        "fixed" => {
            let o = Obj::new(v, path, "type prefill_ms decode_ms")?;
            let prefill_ms = o.must("prefill_ms", to_f64)?;
            let decode_ms = o.must("decode_ms", to_f64)?;
            Ok(TimingModelConfig::Fixed { prefill_ms, decode_ms })
        }
        "external" => {
            let o = Obj::new(v, path, "type provider config")?;
            let provider = o.must("provider", to_string)?;
            let config = o.map.get("config").cloned().unwrap_or_else(|| json!({}));
            Ok(TimingModelConfig::External { provider, config })
        }
        other => {
            let kinds = ["polynomial", "fixed", "external"];
            Err(invalid_choice(&type_path, other, &kinds))
        }
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

fn parse_runtime(v: &Value, path: &str) -> Result<RuntimeConfig> {
    let o = Obj::new(v, path, RUNTIME_KEYS)?;
    let mut c = RuntimeConfig::default();
    set!(o, c.enable_local_indexer, to_bool);
    set_opt!(o, c.bootstrap_port, to_uint);
    set!(o, c.handoff_session_timeout_ms, to_uint);
    set_opt!(o, c.zmq_kv_events_port, to_uint);
    set_opt!(o, c.zmq_replay_port, to_uint);
    set_opt!(o, c.router_queue_policy, to_string);
    set_opt!(o, c.response_replay_trace_path, to_string);
    set_opt!(o, c.reasoning, |v, p| {
        let r = Obj::new(v, p, REASONING_KEYS)?;
        Ok(ReasoningConfig {
            start_thinking_token_id: r.must("start_thinking_token_id", to_uint)?,
            end_thinking_token_id: r.must("end_thinking_token_id", to_uint)?,
            thinking_ratio: r.must("thinking_ratio", to_f64)?,
        })
    });
    Ok(c)
}

/// A JSON object whose keys were checked against an allow-list; remembers its path.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn new(v: &'a Value, path: &str, allowed: &str) -> Result<Self> {
        let map = v.as_object().ok_or_else(|| type_err(path, "an object", v))?;
        if let Some(k) = map.keys().find(|k| !has_key(allowed, k)) {
            return Err(unknown_field(&join(path, k), allowed));
        }
        Ok(Self { path: path.to_string(), map })
    }

    fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Absent keys keep the default; an explicit null reaches `conv` and is rejected there,
    /// because a null usually means a caller failed to fill a value, not that it wants a default.
    fn set<T>(&self, key: &str, slot: &mut T, conv: Conv<T>) -> Result<()> {
        if let Some(v) = self.map.get(key) {
            *slot = conv(v, &self.path(key))?;
        }
        Ok(())
    }

    fn opt<T>(&self, key: &str, conv: Conv<T>) -> Result<Option<T>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => conv(v, &self.path(key)).map(Some),
        }
    }

    fn must<T>(&self, key: &str, conv: Conv<T>) -> Result<T> {
        let missing = || ConfigError::new(self.path(key), "missing required field");
        conv(self.map.get(key).ok_or_else(missing)?, &self.path(key))
    }
}

fn has_key(keys: &str, key: &str) -> bool {
    keys.split_whitespace().any(|k| k == key)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn unknown_field(path: &str, allowed: &str) -> ConfigError {
    let expected = allowed.split_whitespace().collect::<Vec<_>>().join(", ");
    ConfigError::new(path, format!("unknown field; expected one of: {expected}"))
}

fn type_err(path: &str, expected: &str, got: &Value) -> ConfigError {
    let got = match got {
        Value::Null => "null (omit the field to use its default)".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    };
    let msg = format!("invalid type: expected {expected}, got {got}");
    ConfigError::new(path, msg)
}

fn invalid_choice(path: &str, got: &str, allowed: &[&str]) -> ConfigError {
    let expected = allowed.join(", ");
    let msg = format!("invalid value {got:?}; expected one of: {expected}");
    ConfigError::new(path, msg)
}

fn to_uint<T: TryFrom<u64>>(v: &Value, path: &str) -> Result<T> {
    let n = v.as_u64().ok_or_else(|| type_err(path, "a non-negative integer", v))?;
    let ty = std::any::type_name::<T>();
    T::try_from(n).map_err(|_| ConfigError::new(path, format!("{n} is out of range for {ty}")))
}

fn to_f64(v: &Value, path: &str) -> Result<f64> {
    v.as_f64().ok_or_else(|| type_err(path, "a number", v))
}

fn to_bool(v: &Value, path: &str) -> Result<bool> {
    v.as_bool().ok_or_else(|| type_err(path, "a boolean", v))
}

fn to_string(v: &Value, path: &str) -> Result<String> {
    v.as_str().map(str::to_string).ok_or_else(|| type_err(path, "a string", v))
}

fn ensure(ok: bool, field: impl Into<String>, message: String) -> Result<()> {
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
    let msg = format!("must be positive (got {n})");
    ensure(n > N::default(), field, msg)
}

fn non_negative(field: impl Into<String>, x: f64) -> Result<()> {
    let msg = format!("must be finite and non-negative (got {x})");
    ensure(x.is_finite() && x >= 0.0, field, msg)
}

fn fraction(field: &str, x: f64) -> Result<()> {
    let msg = format!("must be finite and in [0, 1] (got {x})");
    let ok = x.is_finite() && (0.0..=1.0).contains(&x);
    ensure(ok, field, msg)
}

/// The reference stores bytes-per-token as an integer; print whole values the same way.
fn whole_as_integer<S: serde::Serializer>(v: &Option<f64>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match v {
        Some(b) if b.fract() == 0.0 && (0.0..9.0e15).contains(b) => s.serialize_some(&(*b as u64)),
        _ => v.serialize(s),
    }
}

/// Parses a comma list of probabilities; a blank list means the built-in defaults.
fn parse_accept_rates(raw: &str, path: &str) -> Result<Vec<f64>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> LaunchConfig {
        LaunchConfig::from_json_str(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn err(s: &str) -> ConfigError {
        match LaunchConfig::from_json_str(s) {
            Ok(c) => panic!("{s} unexpectedly parsed: {c:?}"),
            Err(e) => e,
        }
    }

    /// Each non-blank line is `<expected field> <json that must fail>`.
    fn assert_fields(table: &str) -> Vec<ConfigError> {
        let lines = table.lines().map(str::trim).filter(|l| !l.is_empty());
        let check = |line: &str| {
            let (field, json) = line.split_once(' ').unwrap();
            let e = err(json.trim());
            assert_eq!(e.field, field, "{json} -> {e}");
            e
        };
        lines.map(check).collect()
    }

    #[test]
    fn defaults_match_reference_dump() {
        let d = LaunchConfig::default();
        assert_eq!(parse(""), d);
        assert_eq!(parse("{}"), d);
        assert_eq!(parse(r#"{"engine":{}}"#), d);
        assert_eq!(d.engine.total_kv_tokens(), 16384 * 64);
        let text = include_str!("../tests/data/reference_default_launch.json");
        let reference: Value = serde_json::from_str(text).unwrap();
        // Compare as text too, so key order matches and dumps diff cleanly.
        let ours = d.to_canonical_json();
        assert_eq!(ours.to_string(), reference.to_string());
    }

    #[test]
    fn backend_native_block_size_only_when_omitted() {
        assert_eq!(parse(r#"{"engine":{"backend":"sglang"}}"#).engine.block_size, 1);
        assert_eq!(parse(r#"{"engine":{"backend":"trtllm"}}"#).engine.block_size, 32);
        let c = parse(r#"{"engine":{"backend":"trtllm","block_size":null}}"#);
        assert_eq!(c.engine.block_size, 32);
        let c = parse(r#"{"engine":{"backend":"sglang","block_size":16}}"#);
        assert_eq!(c.engine.block_size, 16);
    }

    #[test]
    fn flat_and_nested_forms_agree() {
        let nested = parse(
            r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":100,
               "worker_type":"prefill","aic_nextn":2,"kv_transfer_bytes_per_token":128,
               "sglang":{"schedule_policy":"lpm"}},
               "dp_size":2,"dynamo":{"zmq_kv_events_port":5557,"enable_local_indexer":true}}"#,
        );
        let flat = parse(
            r#"{"engine_type":"sglang","sglang":{"page_size":16,"schedule_policy":"lpm"},
               "num_gpu_blocks":100,"is_prefill":true,"ais_nextn":2,"kv_bytes_per_token":128,
               "dp_size":2,"zmq_kv_events_port":5557,"dynamo":{"enable_local_indexer":true}}"#,
        );
        assert_eq!(flat, nested);
        assert!(nested.num_gpu_blocks_is_explicit);
        let c = parse(r#"{"engine":{"num_gpu_blocks":9},"num_gpu_blocks_is_explicit":false}"#);
        assert!(!c.num_gpu_blocks_is_explicit);
        assert_eq!(nested.engine.aic_nextn_accept_rates.as_deref(), Some("0.85,0.3"));
        let canonical = nested.to_canonical_json();
        assert_eq!(canonical["engine"]["kv_transfer_bytes_per_token"], json!(128));
        assert_eq!(LaunchConfig::from_value(canonical).unwrap(), nested);
        let c = parse(r#"{"block_size":0,"engine_type":"trtllm","is_decode":true}"#);
        assert_eq!((c.engine.block_size, c.engine.worker_type), (32, WorkerType::Decode));
        let c = parse(r#"{"block_size":16,"sglang":{"page_size":16}}"#);
        assert_eq!(c.engine.block_size, 16);
    }

    #[test]
    fn flat_form_conflicts() {
        let errors = assert_fields(
            r#"
            is_prefill {"is_prefill":true,"is_decode":true}
            worker_type {"is_prefill":false,"worker_type":"decode"}
            is_prefill {"is_prefill":1}
            engine_type {"backend":"vllm","engine_type":"vllm"}
            ais_nextn {"ais_nextn":2,"aic_nextn":2}
            engine.kv_bytes_per_token {"kv_bytes_per_token":null,"kv_transfer_bytes_per_token":1}
            sglang.page_size {"block_size":32,"sglang":{"page_size":16}}
            zmq_replay_port {"zmq_replay_port":1,"dynamo":{"zmq_replay_port":2}}
            watermark {"watermark":0.01}
            "#,
        );
        assert!(errors[3].message.starts_with("duplicate field"), "{}", errors[3]);
        assert!(errors[8].message.contains("engine_type, ais_nextn"), "{}", errors[8]);
    }

    #[test]
    fn every_validation_rule_names_its_field() {
        assert_fields(
            r#"
            engine.num_gpu_blocks {"engine":{"num_gpu_blocks":0}}
            engine.block_size {"engine":{"block_size":1}}
            engine.block_size {"engine":{"backend":"trtllm","block_size":1}}
            engine.block_size {"engine":{"backend":"sglang","block_size":0}}
            engine.max_model_len {"engine":{"max_model_len":0}}
            engine.max_num_seqs {"engine":{"max_num_seqs":0}}
            engine.max_num_batched_tokens {"engine":{"max_num_batched_tokens":0}}
            engine.prefill_schedule_interval {"engine":{"prefill_schedule_interval":0}}
            engine.prefill_schedule_interval {"engine":{"backend":"trtllm","prefill_schedule_interval":2}}
            engine.prefill_decode_interval {"engine":{"prefill_decode_interval":2}}
            engine.enable_chunked_prefill {"engine":{"backend":"sglang","enable_chunked_prefill":false}}
            engine.speedup_ratio {"engine":{"speedup_ratio":-1}}
            engine.decode_speedup_ratio {"engine":{"decode_speedup_ratio":-0.5}}
            engine.aic_nextn {"engine":{"aic_nextn":0}}
            engine.aic_nextn {"engine":{"aic_nextn":6}}
            engine.aic_nextn {"engine":{"aic_nextn":2,"decode_speedup_ratio":2}}
            engine.aic_nextn_accept_rates {"engine":{"aic_nextn_accept_rates":"0.5"}}
            engine.aic_nextn_accept_rates {"engine":{"aic_nextn":2,"aic_nextn_accept_rates":"0.5,1.5"}}
            engine.aic_nextn_accept_rates {"engine":{"aic_nextn":2,"aic_nextn_accept_rates":"0.5,,0"}}
            engine.emit_kv_token_ids {"engine":{"emit_kv_token_ids":true}}
            engine.kv_transfer_bytes_per_token {"engine":{"kv_transfer_bytes_per_token":0}}
            engine.kv_transfer_bandwidth {"engine":{"kv_transfer_bandwidth":-1}}
            engine.timing_model.prefill_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":-1,"decode_ms":1}}}
            engine.timing_model.decode_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":1,"decode_ms":-1}}}
            engine.timing_model.decode_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":1}}}
            engine.timing_model.type {"engine":{"timing_model":{}}}
            engine.timing_model.type {"engine":{"timing_model":{"type":"bogus"}}}
            engine.timing_model.provider {"engine":{"timing_model":{"type":"external","provider":"foo"}}}
            engine.timing_model.config.path {"engine":{"timing_model":{"type":"external","provider":"dynamo_profile"}}}
            engine.trtllm.capacity_scheduler_policy {"engine":{"trtllm":{"capacity_scheduler_policy":"max_utilization"}}}
            engine.sglang.max_prefill_tokens {"engine":{"backend":"sglang","sglang":{"max_prefill_tokens":0}}}
            engine.sglang.chunked_prefill_size {"engine":{"backend":"sglang","sglang":{"chunked_prefill_size":0}}}
            engine.sglang.chunked_prefill_size {"engine":{"backend":"sglang","block_size":7}}
            engine.sglang.schedule_conservativeness {"engine":{"backend":"sglang","sglang":{"schedule_conservativeness":-1}}}
            dp_size {"engine":{},"dp_size":0}
            tensor_parallel_size {"engine":{},"tensor_parallel_size":0}
            startup_time {"engine":{},"startup_time":-1}
            gpu_memory_utilization {"engine":{},"gpu_memory_utilization":1.5}
            mem_fraction_static {"engine":{},"mem_fraction_static":-0.1}
            free_gpu_memory_fraction {"engine":{},"free_gpu_memory_fraction":2}
            dynamo.handoff_session_timeout_ms {"engine":{},"dynamo":{"handoff_session_timeout_ms":0}}
            dynamo.router_queue_policy {"engine":{},"dynamo":{"router_queue_policy":"xyz"}}
            dynamo.reasoning.thinking_ratio {"dynamo":{"reasoning":{"start_thinking_token_id":1,"end_thinking_token_id":2,"thinking_ratio":1.5}}}
            dynamo.reasoning.end_thinking_token_id {"dynamo":{"reasoning":{"start_thinking_token_id":1,"thinking_ratio":0.5}}}
            "#,
        );
        // SGLang knobs are inert for other backends, so they are not judged there.
        parse(r#"{"engine":{"sglang":{"max_prefill_tokens":0,"schedule_conservativeness":-1}}}"#);
    }

    #[test]
    fn messages_name_value_and_choices() {
        let messages: Vec<String> = assert_fields(
            r#"
            engine.preemption_mode {"engine":{"preemption_mode":"lru"}}
            engine.block_size {"engine":{"block_size":1}}
            engine.block_size {"engine":{"block_size":"64"}}
            engine.timing_model.provider {"engine":{"timing_model":{"type":"external","provider":"foo"}}}
            engine.block_size {"engine":{"block_size":64.0}}
            dynamo.bootstrap_port {"engine":{},"dynamo":{"bootstrap_port":70000}}
            engine_args [1]
            engine_args {not json
            "#,
        )
        .iter()
        .map(ToString::to_string)
        .collect();
        let expected_prefixes = [
            r#"engine.preemption_mode: invalid value "lru"; expected one of: lifo, fifo"#,
            "engine.block_size: must be at least 2 for vllm/trtllm (got 1)",
            r#"engine.block_size: invalid type: expected a non-negative integer, got string "64""#,
            r#"engine.timing_model.provider: unsupported external timing provider "foo"; "#,
            "engine.block_size: invalid type: expected a non-negative integer, got number 64.0",
            "dynamo.bootstrap_port: 70000 is out of range for u16",
        ];
        for (msg, want) in messages.iter().zip(expected_prefixes) {
            assert!(msg.starts_with(want), "{msg}");
        }
    }

    #[test]
    fn unknown_fields_rejected_with_path() {
        let errors = assert_fields(
            r#"
            engine.bogus {"engine":{"bogus":1}}
            bogus {"engine":{},"bogus":1}
            engine.sglang.bogus {"engine":{"sglang":{"bogus":1}}}
            engine.sglang.page_size {"engine":{"sglang":{"page_size":16}}}
            engine.trtllm.x {"engine":{"trtllm":{"x":1}}}
            engine.timing_model.x {"engine":{"timing_model":{"type":"polynomial","x":1}}}
            dynamo.bogus {"engine":{},"dynamo":{"bogus":1}}
            dynamo.reasoning.x {"dynamo":{"reasoning":{"x":1}}}
            engine.engine_type {"engine":{"engine_type":"vllm"}}
            "#,
        );
        let want = "unknown field; expected one of: backend, num_gpu_blocks, block_size,";
        assert!(errors[0].message.starts_with(want), "{}", errors[0]);
    }

    #[test]
    fn explicit_null_for_non_optional_is_an_error() {
        let errors = assert_fields(
            r#"
            engine.num_gpu_blocks {"engine":{"num_gpu_blocks":null}}
            engine.speedup_ratio {"engine":{"speedup_ratio":null}}
            engine.sglang {"engine":{"sglang":null}}
            engine.timing_model {"engine":{"timing_model":null}}
            engine {"engine":null}
            dynamo {"engine":{},"dynamo":null}
            dp_size {"engine":{},"dp_size":null}
            engine.max_num_seqs {"max_num_seqs":null}
            "#,
        );
        assert!(errors.iter().all(|e| e.message.contains("got null")), "{errors:?}");
        let c = parse(r#"{"engine":{"max_model_len":null,"aic_nextn":null},"dynamo":{"reasoning":null}}"#);
        assert_eq!(c, LaunchConfig::default());
    }

    #[test]
    fn legacy_spellings_and_accept_rate_normalisation() {
        let c =
            parse(r#"{"engine":{"timing_model":{"type":"default"},"sglang":{"schedule_policy":"fcfs"}}}"#);
        assert_eq!(c.engine.timing_model, TimingModelConfig::Polynomial);
        assert_eq!(c.engine.sglang.schedule_policy, SglangSchedulePolicy::Fifo);
        for (n, raw, want) in [
            (3, None, "0.85,0.3,0"),
            (3, Some("0.9"), "0.9,0,0"),
            (2, Some("0.9,0.5,0.2"), "0.9,0.5"),
            (2, Some(" "), "0.85,0.3"),
            (2, Some("0.50, 1"), "0.5,1"),
        ] {
            let rates = raw.map_or(String::new(), |r| format!(r#","aic_nextn_accept_rates":"{r}""#));
            let c = parse(&format!(r#"{{"engine":{{"aic_nextn":{n}{rates}}}}}"#));
            assert_eq!(c.engine.aic_nextn_accept_rates.as_deref(), Some(want));
            assert_eq!(c.engine.mtp_accept_rates().len(), n);
        }
    }

    #[test]
    fn from_arg_reads_at_file() {
        let name = format!("mocker-config-test-{}.json", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, r#"{"block_size":16,"dp_size":2}"#).unwrap();
        let c = LaunchConfig::from_arg(&format!("@{}", path.display()));
        std::fs::remove_file(&path).unwrap();
        let c = c.unwrap();
        assert_eq!((c.engine.block_size, c.dp_size), (16, 2));
        assert_eq!(LaunchConfig::from_arg(r#"{"dp_size":3}"#).unwrap().dp_size, 3);
        let e = LaunchConfig::from_arg("@/nonexistent/mocker/args.json").unwrap_err();
        assert_eq!(e.field, "engine_args");
    }
}
