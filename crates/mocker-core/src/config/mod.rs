//! Engine launch configuration: parsing, normalisation and validation.
//!
//! The canonical shape mirrors the reference's normalised launch config (nested `engine` and
//! `dynamo` objects) so our canonical dump can be diffed against it key by key. The legacy flat
//! `MockEngineArgs` shape is rewritten into the nested one first, so there is a single parser and
//! a single validator; errors found after that rewrite use canonical paths (`engine.block_size`).
//! Input JSON is walked by hand instead of through serde derives so that every error carries a
//! dotted path and says which value was wrong and what is allowed; output uses `Serialize`.
//!
//! This module holds the types, their defaults and the error type; `parse` reads JSON
//! (`from_json_str`, `from_value`, `from_arg`), `validate` checks the rules and `canonical`
//! writes the dump.

mod canonical;
mod parse;
pub use parse::{accepted_keys, read_args_file, MAX_ARGS_FILE_BYTES};
#[cfg(test)]
mod tests;
mod validate;

use std::sync::Arc;

use crate::timing::ProfileTable;
use serde::Serialize;
use serde_json::Value;

type Result<T> = std::result::Result<T, ConfigError>;

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
        Self { field: field.into(), message: message.into() }
    }
}

/// `path` held a JSON value of the wrong type.
fn type_err(path: &str, expected: &str, got: &Value) -> ConfigError {
    let got = match got {
        Value::Null => "null (omit the field to use its default)".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    };
    ConfigError::new(path, format!("invalid type: expected {expected}, got {got}"))
}

/// `path` held a string outside a closed set.
fn invalid_choice(path: &str, got: &str, allowed: &[&str]) -> ConfigError {
    let expected = allowed.join(", ");
    ConfigError::new(path, format!("invalid value {got:?}; expected one of: {expected}"))
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
                let found = Self::ALL.iter().copied().find(|t| t.as_str() == s);
                found.ok_or_else(|| invalid_choice(path, s, &[$($text),+]))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

mod groups;
pub use groups::{CacheGroupKind, KvCacheGroup, MAX_EXACT_BYTES};
mod state;
pub use state::StateCacheConfig;
mod g3;
pub use g3::{G3OffloadConfig, G3Scope};

string_enum! {
    /// Which inference engine is simulated; selects the scheduler core and block-size default.
    Backend {
        /// vLLM v1 scheduler and paged block pool.
        #[default]
        Vllm = "vllm",
        /// SGLang scheduler with a radix prefix cache.
        Sglang = "sglang",
        /// TRT-LLM's guaranteed_no_evict capacity scheduler over the vLLM pool.
        Trtllm = "trtllm",
    }
}
string_enum! {
    /// Role of a worker in (dis)aggregated serving.
    WorkerType {
        /// Prefill and decode on the same worker.
        #[default]
        Aggregated = "aggregated",
        /// Prefill only; hands the KV to a decode worker after the first token.
        Prefill = "prefill",
        /// Decode only; receives prompts whose KV was transferred.
        Decode = "decode",
    }
}
string_enum! {
    /// Which running request vLLM evicts first when KV blocks run out.
    PreemptionMode {
        /// The most recently admitted running request.
        #[default]
        Lifo = "lifo",
        /// The earliest admitted running request.
        Fifo = "fifo",
    }
}
string_enum! {
    /// Which cached KV block the vLLM/TRT-LLM pool evicts when it needs a fresh one.
    EvictionPolicy {
        /// Least recently released first (the reference's only policy).
        #[default]
        Lru = "lru",
        /// Leaf blocks first (older Dynamo mocker's `MockerEvictionBackend::Lineage`): only
        /// inactive blocks without cached children are candidates while any exist.
        Lineage = "lineage",
    }
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

impl EvictionPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
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
    Fixed {
        /// Cost of any pass with prefill work.
        prefill_ms: f64,
        /// Cost of any pass with decode work.
        decode_ms: f64,
    },
    /// A provider-backed model, e.g. `dynamo_profile` with `config: {"path": "x.npz"}`.
    External {
        /// `dynamo_profile`, `ais` or `aic`.
        provider: String,
        /// Provider-specific settings.
        config: Value,
        /// The `dynamo_profile` table named by `config.path`, once a shell has read it
        /// (the core does no I/O; an engine refuses an unread profile).
        #[serde(skip)]
        profile: Option<Arc<ProfileTable>>,
    },
    /// Composed from a model's architecture on a GPU: set by a shell from the launch keys
    /// `model` and `gpu`, never written in engine args.
    Architecture {
        /// What was modelled ("meta-llama/Llama-3.1-8B on h100, TP 1").
        label: String,
        /// The composed curves (the shell builds them; the core does no I/O).
        #[serde(skip)]
        timing: Option<Arc<crate::timing::ArchTiming>>,
    },
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
        Self { capacity_scheduler_policy: "guaranteed_no_evict".to_string() }
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
    /// KV block eviction order (vLLM/TRT-LLM pool). Left out of the canonical dump when it is
    /// the default `lru`, which the reference has no key for.
    #[serde(skip_serializing_if = "EvictionPolicy::is_default")]
    pub eviction_policy: EvictionPolicy,
    /// Keep per-block local hashes in KV events.
    pub emit_kv_events: bool,
    /// Include token ids in Stored events.
    pub emit_kv_token_ids: bool,
    /// KV bytes per token, for transfer-time modelling.
    #[serde(serialize_with = "canonical::whole_as_integer")]
    pub kv_transfer_bytes_per_token: Option<f64>,
    /// KV bytes per cached token: the size of a host-tier block (`native_host_offload`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_bytes_per_token: Option<u64>,
    /// vLLM's native host-memory KV tier (OffloadingConnector), if configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub native_host_offload: Option<HostOffloadConfig>,
    /// The G3 tier below the host tier (`g3_offload`), if configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub g3_offload: Option<G3OffloadConfig>,
    /// Hybrid KV cache groups sharing `kv_cache_capacity_bytes` (empty: the linear block
    /// pool of `num_gpu_blocks`, which groups replace).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kv_cache_groups: Vec<KvCacheGroup>,
    /// The rank's byte budget for `kv_cache_groups`, page padding included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_capacity_bytes: Option<u64>,
    /// A recurrent state per request (Mamba, linear attention) in the block pool beside the
    /// token blocks, with prefix reuse only where a state checkpoint is cached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_cache: Option<StateCacheConfig>,
    /// With a state cache: checkpoint in vLLM's "align" mode, and let a prefix hit end
    /// inside a block at a multiple of this many tokens (a divisor of `block_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_match_unit: Option<usize>,
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
            eviction_policy: EvictionPolicy::Lru,
            emit_kv_events: false,
            emit_kv_token_ids: false,
            kv_transfer_bytes_per_token: None,
            kv_cache_bytes_per_token: None,
            native_host_offload: None,
            g3_offload: None,
            kv_cache_groups: Vec::new(),
            kv_cache_capacity_bytes: None,
            state_cache: None,
            prefix_match_unit: None,
            kv_transfer_bandwidth: None,
            kv_transfer_timing_mode: KvTransferTimingMode::FullPrompt,
            timing_model: TimingModelConfig::Polynomial,
            sglang: SglangConfig::default(),
            trtllm: TrtllmConfig::default(),
        }
    }
}

/// The host-memory KV tier of one rank (`native_host_offload`): prompt blocks are written
/// through to it as they are computed and loaded back on a prefix hit, over one FIFO lane
/// per direction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostOffloadConfig {
    /// Capacity in blocks (of `block_size * kv_cache_bytes_per_token` bytes).
    pub num_host_blocks: usize,
    /// Device-to-host bandwidth, decimal GB/s; 0 is instantaneous.
    pub d2h_bandwidth_gbps: f64,
    /// Host-to-device bandwidth, decimal GB/s; 0 is instantaneous.
    pub h2d_bandwidth_gbps: f64,
    /// Delay before a transfer moves its first byte.
    #[serde(skip_serializing_if = "is_zero")]
    pub latency_to_first_byte_ms: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Default for HostOffloadConfig {
    fn default() -> Self {
        Self {
            num_host_blocks: 0,
            d2h_bandwidth_gbps: 32.0,
            h2d_bandwidth_gbps: 32.0,
            latency_to_first_byte_ms: 0.0,
        }
    }
}

/// Accept rates used when `aic_nextn` is set without (or with a blank) `aic_nextn_accept_rates`.
const DEFAULT_ACCEPT_RATES: [f64; 5] = [0.85, 0.3, 0.0, 0.0, 0.0];

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
        let mut rates = validate::parse_accept_rates(raw, "").unwrap_or_default();
        rates.resize(n as usize, 0.0);
        rates
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
            reasoning: None,
            response_replay_trace_path: None,
            zmq_kv_events_port: None,
            zmq_replay_port: None,
            router_queue_policy: None,
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
    /// Whether the engine args gave `num_gpu_blocks`: what `num_gpu_blocks_is_explicit`
    /// is unless that key says otherwise (a difference acts only with a profile's memory).
    /// Not part of the canonical form: it is a fact about the input, not a setting.
    #[serde(skip)]
    pub num_gpu_blocks_given: bool,
    /// Which engine keys with GPU-dependent vLLM defaults the engine args gave: without
    /// them a model on a GPU takes vLLM's defaults.
    #[serde(skip)]
    pub given_keys: GivenKeys,
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
    /// Where a request sets no output length, the simulated model's end-of-sequence
    /// lengths (mocker's own key; `None`: the shell's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_length_distribution: Option<crate::output_length::OutputLengthDistribution>,
    /// The simulated model and GPU, for timing from the architecture and sizing the KV
    /// cache from memory (mocker's keys `model`, `gpu`, ..., read by a shell).
    #[serde(flatten)]
    pub hardware: HardwareConfig,
}

/// Which engine keys with GPU-dependent vLLM defaults the engine args gave. A fact about the input, not a setting: it takes
/// no part in comparing configurations (a canonical form, which writes every key, equals
/// the configuration it came from).
#[derive(Debug, Clone, Copy, Default)]
pub struct GivenKeys {
    /// `max_num_seqs` was given.
    pub max_num_seqs: bool,
    /// `max_num_batched_tokens` was given.
    pub max_num_batched_tokens: bool,
    /// `block_size` was given.
    pub block_size: bool,
    /// `enable_prefix_caching` was given.
    pub enable_prefix_caching: bool,
}

impl PartialEq for GivenKeys {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Which model on which GPU a launch simulates (`--model`, `--gpu`, vLLM's
/// `--quantization`, `--kv-cache-dtype`, `--enable-expert-parallel`) and the serving
/// overheads beside the GPU's passes. Empty: timing comes from `engine.timing_model`.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct HardwareConfig {
    /// A model of the catalogue (Hugging Face id) or a directory holding its `config.json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A GPU of the catalogue (`h100`, `a100-80gb`, `l40s`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Weight quantization as vLLM spells it (`fp8`, `awq`, `gptq`, ...); default: the
    /// model's own `quantization_config`, else its dtype.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
    /// KV cache precision as vLLM spells it (`auto`, `fp8`, `fp8_e4m3`, `fp8_e5m2`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<String>,
    /// Shard experts across the tensor-parallel GPUs instead of slicing each expert.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enable_expert_parallel: bool,
    /// Fixed CPU time of every pass (scheduling, input preparation, launch), in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass_overhead_ms: Option<f64>,
    /// Time a request spends in the API server before the engine sees it and after its
    /// tokens leave (HTTP, tokenization, detokenization), in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontend_latency_ms: Option<f64>,
    /// Size a model's sliding-window layers as full-attention layers instead of paging them
    /// as KV cache groups (vLLM's `--disable-hybrid-kv-cache-manager`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disable_hybrid_kv_cache_manager: bool,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            dp_size: 1,
            tensor_parallel_size: 1,
            startup_time: None,
            num_gpu_blocks_is_explicit: false,
            num_gpu_blocks_given: false,
            given_keys: GivenKeys::default(),
            gpu_memory_utilization: None,
            mem_fraction_static: None,
            free_gpu_memory_fraction: None,
            cuda_graph_reserved_bytes: None,
            dynamo: RuntimeConfig::default(),
            output_length_distribution: None,
            hardware: HardwareConfig::default(),
        }
    }
}
