//! JSON walking: the constructors, the flat-to-nested rewrite and the typed field readers.

use serde_json::{json, Map, Value};

use super::{
    invalid_choice, type_err, Backend, ConfigError, EngineConfig, EvictionPolicy, HostOffloadConfig,
    KvTransferTimingMode, LaunchConfig, PreemptionMode, ReasoningConfig, Result, RuntimeConfig, SglangConfig,
    SglangSchedulePolicy, TimingModelConfig, TrtllmConfig, WorkerType,
};

type Conv<T> = fn(&Value, &str) -> Result<T>;

// Accepted keys per object, space separated, in the order error messages list them.
const ENGINE_KEYS: &str = "backend num_gpu_blocks block_size max_model_len max_num_seqs \
    max_num_batched_tokens prefill_schedule_interval prefill_decode_interval \
    enable_prefix_caching enable_chunked_prefill speedup_ratio decode_speedup_ratio aic_nextn \
    aic_nextn_accept_rates aic_mtp_seed worker_type preemption_mode eviction_policy emit_kv_events \
    emit_kv_token_ids kv_transfer_bytes_per_token kv_bytes_per_token kv_cache_bytes_per_token \
    native_host_offload g3_offload kv_cache_groups kv_cache_capacity_bytes state_cache prefix_match_unit kv_transfer_bandwidth kv_transfer_timing_mode timing_model sglang trtllm";
const HOST_OFFLOAD_KEYS: &str = "scope num_host_blocks d2h_bandwidth_gbps h2d_bandwidth_gbps \
    shared_d2h_bandwidth_gbps shared_h2d_bandwidth_gbps latency_to_first_byte_ms kv_layout_id";
const LAUNCH_KEYS: &str = "engine dp_size tensor_parallel_size startup_time \
    num_gpu_blocks_is_explicit gpu_memory_utilization mem_fraction_static \
    free_gpu_memory_fraction cuda_graph_reserved_bytes output_length_distribution model gpu \
    quantization kv_cache_dtype enable_expert_parallel pass_overhead_ms frontend_latency_ms \
    disable_hybrid_kv_cache_manager dynamo";
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

/// Every key the engine-args parser accepts, spelled as in the flat form, with a key inside
/// an object named `object.key` (`sglang.schedule_policy`, `reasoning.thinking_ratio`).
/// Pure containers (`engine`, `dynamo`, `sglang`, `trtllm`) are left out, their keys are
/// listed; `timing_model` is one key (its fields are its value). Tests walk this list so a
/// new key cannot be added without saying what it does.
pub fn accepted_keys() -> Vec<String> {
    let containers = ["engine", "dynamo", "sglang", "trtllm"];
    let mut keys: Vec<String> = [ENGINE_KEYS, LAUNCH_KEYS, RUNTIME_KEYS]
        .iter()
        .flat_map(|list| list.split_whitespace())
        .filter(|k| !containers.contains(k))
        .map(str::to_string)
        .collect();
    let nested = [
        ("sglang", SGLANG_KEYS),
        ("trtllm", "capacity_scheduler_policy"),
        ("native_host_offload", HOST_OFFLOAD_KEYS),
        ("g3_offload", super::g3::G3_KEYS),
        ("state_cache", "bytes_per_request"),
        ("reasoning", REASONING_KEYS),
    ];
    for (object, list) in nested {
        keys.extend(list.split_whitespace().map(|k| format!("{object}.{k}")));
    }
    keys.extend(FLAT_ALIASES.iter().map(|(alias, _)| alias.to_string()));
    keys.extend(["is_prefill".to_string(), "is_decode".to_string(), "sglang.page_size".to_string()]);
    keys
}

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
        let mut m = match v {
            Value::Object(m) => m,
            other => return Err(type_err("engine_args", "a JSON object", &other)),
        };
        // Without an `engine` key the document can only be the flat form (or empty).
        if !m.contains_key("engine") {
            m = flat_to_nested(m)?;
        }
        let mut cfg = parse_launch(&Value::Object(m))?;
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
        let text = read_args_file(path)
            .map_err(|e| ConfigError::new("engine_args", format!("cannot read file {path:?}: {e}")))?;
        Self::from_json_str(&text)
    }
}

/// Largest engine-args file read (real ones are a few hundred bytes).
pub const MAX_ARGS_FILE_BYTES: u64 = 16 << 20;

/// Reads an engine-args file of at most [`MAX_ARGS_FILE_BYTES`]; a device such as
/// `/dev/zero` would otherwise be read forever. Pipes (`@<(...)`) are fine.
pub fn read_args_file(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let pipe = {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type())
        }
        #[cfg(not(unix))]
        {
            false
        }
    };
    if !(meta.is_file() || pipe) {
        return Err(std::io::Error::other("not a regular file or a pipe"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ARGS_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_ARGS_FILE_BYTES {
        return Err(std::io::Error::other(format!("larger than {MAX_ARGS_FILE_BYTES} bytes")));
    }
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
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
        c.num_gpu_blocks_given = engine.get("num_gpu_blocks").is_some();
        c.num_gpu_blocks_is_explicit = c.num_gpu_blocks_given;
        c.given_keys = super::GivenKeys {
            max_num_seqs: engine.get("max_num_seqs").is_some(),
            max_num_batched_tokens: engine.get("max_num_batched_tokens").is_some(),
            block_size: engine.get("block_size").is_some_and(|v| !v.is_null()),
            enable_prefix_caching: engine.get("enable_prefix_caching").is_some_and(|v| !v.is_null()),
        };
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
    set_opt!(o, c.output_length_distribution, crate::output_length::OutputLengthDistribution::from_value);
    let h = &mut c.hardware;
    set_opt!(o, h.model, to_string);
    set_opt!(o, h.gpu, to_string);
    set_opt!(o, h.quantization, to_string);
    set_opt!(o, h.kv_cache_dtype, to_string);
    set!(o, h.enable_expert_parallel, to_bool);
    set_opt!(o, h.pass_overhead_ms, to_f64);
    set_opt!(o, h.frontend_latency_ms, to_f64);
    set!(o, h.disable_hybrid_kv_cache_manager, to_bool);
    set!(o, c.dynamo, parse_runtime);
    Ok(c)
}

fn parse_engine(v: &Value, path: &str) -> Result<EngineConfig> {
    let o = Obj::new(v, path, ENGINE_KEYS)?;
    super::state::require_explicit_geometry(o.map, path)?;
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
    set!(o, c.eviction_policy, EvictionPolicy::parse);
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
    set_opt!(o, c.kv_cache_bytes_per_token, to_uint);
    set_opt!(o, c.native_host_offload, parse_host_offload);
    set!(o, c.kv_cache_groups, super::groups::parse_groups);
    set_opt!(o, c.kv_cache_capacity_bytes, to_uint);
    set_opt!(o, c.state_cache, super::state::parse_state_cache);
    set_opt!(o, c.prefix_match_unit, to_uint);
    set_opt!(o, c.g3_offload, super::g3::parse_g3);
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

fn parse_host_offload(v: &Value, path: &str) -> Result<HostOffloadConfig> {
    let o = Obj::new(v, path, HOST_OFFLOAD_KEYS)?;
    let mut c =
        HostOffloadConfig { num_host_blocks: o.must("num_host_blocks", to_uint)?, ..Default::default() };
    set!(o, c.d2h_bandwidth_gbps, to_f64);
    set!(o, c.h2d_bandwidth_gbps, to_f64);
    set!(o, c.latency_to_first_byte_ms, to_f64);
    // Only a cluster-shared pool (not simulated) reads these; refused rather than ignored.
    let scope = o.opt("scope", to_string)?;
    match scope.as_deref() {
        None | Some("dp_rank_local") => {}
        Some("cluster_shared") => {
            let msg = "cluster_shared host pools are not simulated by mocker; expected dp_rank_local";
            return Err(ConfigError::new(o.path("scope"), msg));
        }
        Some(other) => {
            return Err(invalid_choice(&o.path("scope"), other, &["dp_rank_local", "cluster_shared"]))
        }
    }
    for key in ["shared_d2h_bandwidth_gbps", "shared_h2d_bandwidth_gbps", "kv_layout_id"] {
        if o.map.contains_key(key) {
            let msg = "applies only to a cluster_shared pool, which mocker does not simulate";
            return Err(ConfigError::new(o.path(key), msg));
        }
    }
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
            Ok(TimingModelConfig::External { provider, config, profile: None })
        }
        other => Err(invalid_choice(&type_path, other, &["polynomial", "fixed", "external"])),
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
pub(super) struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    pub(super) fn new(v: &'a Value, path: &str, allowed: &str) -> Result<Self> {
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

    pub(super) fn opt<T>(&self, key: &str, conv: Conv<T>) -> Result<Option<T>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => conv(v, &self.path(key)).map(Some),
        }
    }

    /// A key that must be present; null reaches `conv` like in `set`.
    pub(super) fn must<T>(&self, key: &str, conv: Conv<T>) -> Result<T> {
        let missing = || ConfigError::new(self.path(key), "missing required field");
        conv(self.map.get(key).ok_or_else(missing)?, &self.path(key))
    }
}

fn has_key(keys: &str, key: &str) -> bool {
    keys.split_whitespace().any(|k| k == key)
}

/// Dotted path of `key` inside `path` (the document root is the empty path).
pub(super) fn join(path: &str, key: &str) -> String {
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

pub(super) fn to_uint<T: TryFrom<u64>>(v: &Value, path: &str) -> Result<T> {
    let n = v.as_u64().ok_or_else(|| type_err(path, "a non-negative integer", v))?;
    let ty = std::any::type_name::<T>();
    T::try_from(n).map_err(|_| ConfigError::new(path, format!("{n} is out of range for {ty}")))
}

pub(super) fn to_f64(v: &Value, path: &str) -> Result<f64> {
    v.as_f64().ok_or_else(|| type_err(path, "a number", v))
}

fn to_bool(v: &Value, path: &str) -> Result<bool> {
    v.as_bool().ok_or_else(|| type_err(path, "a boolean", v))
}

pub(super) fn to_string(v: &Value, path: &str) -> Result<String> {
    v.as_str().map(str::to_string).ok_or_else(|| type_err(path, "a string", v))
}
