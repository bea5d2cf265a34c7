//! Timing for any model on any GPU: a catalogue of model architectures (real
//! `config.json` files) and GPUs, a reader for a user's own `config.json`, the memory a
//! model takes, and pass times composed from its operations, each priced from measured
//! operator data (`docs/timing.md`).
//!
//! [`resolve_launch`] turns a launch configuration's `model` and `gpu` keys into the
//! core's [`mocker_core::timing::ArchTiming`] and sizes its KV cache from memory, as
//! vLLM, SGLang or TRT-LLM would on that hardware.

use std::path::Path;
use std::sync::Arc;

use mocker_core::config::{LaunchConfig, TimingModelConfig};

pub mod arch;
pub mod catalogue;
pub mod gpu;
pub mod hybrid;
pub mod memory;
pub mod ops;
pub mod pricing;
pub mod state;

pub use arch::{parse_config, ModelArch, Precision};
pub use catalogue::{find_model, model_names, models, CatalogueEntry};
pub use gpu::{find_gpu, gpu_names, gpus, GpuSpec};
pub use memory::Placement;
pub use pricing::Pricer;

/// vLLM's KV block size on CUDA GPUs (mocker's own vLLM default is the reference's 64).
pub const VLLM_BLOCK_SIZE: usize = 16;

/// GPU assumed when a launch names a model but no GPU.
pub const DEFAULT_GPU: &str = "h100";
/// Default fixed CPU time of a pass (vLLM's scheduler, input preparation and output
/// processing around the GPU's work), ms; `docs/calibration.md` says where it comes from.
pub const DEFAULT_PASS_OVERHEAD_MS: f64 = 0.5;
/// Default API-server time of a request (HTTP, tokenization, detokenization), ms.
pub const DEFAULT_FRONTEND_LATENCY_MS: f64 = 10.0;

/// Why a launch's model or GPU cannot be timed; `key` names the engine-args key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ModelError {
    /// The key (`model`, `gpu`, `quantization`, ...).
    pub key: &'static str,
    /// Why, with the allowed values where there is a list.
    pub reason: String,
}

fn err(key: &'static str, reason: impl Into<String>) -> ModelError {
    ModelError { key, reason: reason.into() }
}

/// A model as the launch names it: its architecture and what to call it.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedModel {
    /// The catalogue id, or the path it was read from.
    pub name: String,
    /// Its architecture.
    pub arch: ModelArch,
}

/// Reads the model `spec` names: a catalogue id, or a directory with a `config.json` (or
/// the file itself).
pub fn load_model(spec: &str) -> Result<NamedModel, ModelError> {
    let path = Path::new(spec);
    let file = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
    if file.is_file() {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| err("model", format!("cannot read {}: {e}", file.display())))?;
        let arch = parse_config(&text).map_err(|e| err("model", format!("{}: {}", file.display(), e)))?;
        return Ok(NamedModel { name: spec.to_string(), arch });
    }
    match find_model(spec) {
        Some(entry) => Ok(NamedModel {
            name: entry.id.clone(),
            arch: entry.arch().map_err(|e| err("model", e.to_string()))?,
        }),
        None => Err(err(
            "model",
            format!(
                "{spec:?} is neither a model of the catalogue nor a directory with a config.json; known models: {}",
                model_names().join(", ")
            ),
        )),
    }
}

/// The KV-cache precision vLLM's `--kv-cache-dtype` names (`auto`: the model's dtype).
fn kv_precision(name: Option<&str>, model: Precision) -> Result<Precision, ModelError> {
    const CHOICES: &str = "auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2";
    match name.unwrap_or("auto") {
        "auto" => Ok(match model {
            Precision::Fp32 => Precision::Fp32,
            _ => Precision::Bf16,
        }),
        "bfloat16" | "float16" | "half" => Ok(Precision::Bf16),
        "fp8" | "fp8_e4m3" | "fp8_e5m2" => Ok(Precision::Fp8),
        other => Err(err("kv_cache_dtype", format!("{other:?} is not one of: {CHOICES}"))),
    }
}

/// How a model sits on its GPUs, from the launch's keys.
pub fn placement(launch: &LaunchConfig, model: &ModelArch) -> Result<Placement, ModelError> {
    let h = &launch.hardware;
    let mut weights = model.weight_precision;
    let mut experts = model.moe.as_ref().and_then(|m| m.expert_precision).unwrap_or(weights);
    if let Some(q) = h.quantization.as_deref() {
        let p = arch::precision_of_quant(q, None).ok_or_else(|| {
            err(
                "quantization",
                format!(
                    "{q:?} is not modelled; one of: fp8, fbgemm_fp8, modelopt, awq, awq_marlin, gptq, \
                     gptq_marlin, mxfp4, modelopt_fp4, compressed-tensors, bitsandbytes"
                ),
            )
        })?;
        weights = p;
        experts = p;
    }
    let kv = kv_precision(h.kv_cache_dtype.as_deref(), model.weight_precision)?;
    if h.enable_expert_parallel && model.moe.is_none() {
        return Err(err("enable_expert_parallel", "the model has no experts to spread"));
    }
    let tp = launch.tensor_parallel_size;
    if !model.num_heads.is_multiple_of(tp) {
        return Err(err(
            "tensor_parallel_size",
            format!("{tp} does not divide the model's {} attention heads", model.num_heads),
        ));
    }
    Ok(Placement { tp, expert_parallel: h.enable_expert_parallel, weights, experts, kv })
}

/// What [`resolve_launch`] chose, for start lines and reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The model's name.
    pub model: String,
    /// The GPU's catalogue name.
    pub gpu: String,
    /// The measured operator data that times it, and whether it was scaled from another part.
    pub ops: String,
    /// Weights per GPU, bytes.
    pub weight_bytes_per_gpu: f64,
    /// KV bytes a token costs on each GPU.
    pub kv_bytes_per_token_per_gpu: f64,
    /// What became of the model's sliding-window layers, if it has any.
    pub hybrid: Option<hybrid::HybridLayout>,
    /// The recurrent state cache of a hybrid model with recurrent layers.
    pub state: Option<state::StateLayout>,
}

/// Times the launch's engines from its `model` on its `gpu` (default [`DEFAULT_GPU`]) and
/// sizes their KV cache from memory; `None` when the launch names no model. Keys that
/// need a model are refused without one.
pub fn resolve_launch(launch: &mut LaunchConfig) -> Result<Option<Resolved>, ModelError> {
    let h = launch.hardware.clone();
    let Some(model_spec) = h.model.as_deref() else {
        let needs_model = [
            ("gpu", h.gpu.is_some()),
            ("quantization", h.quantization.is_some()),
            ("kv_cache_dtype", h.kv_cache_dtype.is_some()),
            ("enable_expert_parallel", h.enable_expert_parallel),
            ("pass_overhead_ms", h.pass_overhead_ms.is_some()),
            ("disable_hybrid_kv_cache_manager", h.disable_hybrid_kv_cache_manager),
        ];
        if let Some((key, _)) = needs_model.iter().find(|(_, g)| *g) {
            return Err(err(
                key,
                "times passes from a model's architecture; give the model too (--model HF_ID_OR_PATH)",
            ));
        }
        return Ok(None);
    };
    if launch.engine.timing_model != TimingModelConfig::Polynomial {
        return Err(err(
            "model",
            "gives the timing from the architecture; give one timing source (model, or \
             timing_model / --timing-profile / --planner-profile-data)",
        ));
    }
    // The GPU the engine is timed on, named in the launch so what reports it (a server's
    // engine card) need not know the default.
    launch.hardware.gpu.get_or_insert_with(|| DEFAULT_GPU.to_string());
    let Setup { model, gpu, place, tables, scaled_from } = setup(launch, model_spec)?;
    apply_vllm_batch_defaults(launch, gpu);
    // Before the pool is sized: vLLM's block size for a recurrent state's pages.
    state::prepare(&model.arch, &place, launch, &model.name)?;
    let system = tables.system.clone();
    let overhead = h.pass_overhead_ms.unwrap_or(DEFAULT_PASS_OVERHEAD_MS);
    let label = format!("{} on {}, TP {}", model.name, gpu.name, place.tp);
    let timing = Pricer::new(&model.arch, gpu, &tables, place)
        .fold(label.clone(), overhead)
        .map_err(|e| err("model", format!("pricing {label}: {e}")))?;
    launch.engine.timing_model = TimingModelConfig::Architecture { label, timing: Some(Arc::new(timing)) };
    launch.hardware.pass_overhead_ms = Some(overhead);
    launch.hardware.frontend_latency_ms = Some(h.frontend_latency_ms.unwrap_or(DEFAULT_FRONTEND_LATENCY_MS));

    let weights = place.weight_bytes_per_gpu(&model.arch);
    let kv_per_token = place.kv_bytes_per_token_per_gpu(&model.arch);
    let activation = place.activation_bytes_per_gpu(
        &model.arch,
        launch.engine.max_num_batched_tokens,
        launch.engine.max_num_seqs,
    );
    let meta = mocker_profiles::ProfileMeta {
        model: model.name.clone(),
        system: gpu.name.clone(),
        backend: String::new(),
        tp: place.tp,
        gpu_memory_bytes: gpu.memory_bytes,
        weight_bytes_per_gpu: weights,
        kv_bytes_per_token_per_gpu: kv_per_token,
        non_kv_bytes_per_gpu: activation + place.runtime_reserve_bytes(),
        raw: String::new(),
    };
    mocker_profiles::size_from_memory(launch, &meta).map_err(|e| match e {
        mocker_profiles::ResolveError::Key { key, reason } => ModelError { key, reason },
        other => err("model", other.to_string()),
    })?;
    let hybrid = hybrid::apply(&model.arch, &place, launch, kv_per_token);
    let state = state::apply(&model.arch, &place, launch, &model.name)?;
    // vLLM's context defaults to the model's trained length, which the KV cache must hold.
    if launch.engine.max_model_len.is_none() {
        let pool = match &hybrid {
            // A request's full layers keep its history and its sliding layers their window.
            Some(hybrid::HybridLayout::Groups {
                capacity_bytes,
                full_layers,
                sliding_layers,
                window,
                ..
            }) => {
                let per_layer = kv_per_token / model.arch.attention_layers() as f64;
                let windows = per_layer * (*sliding_layers * *window) as f64;
                ((*capacity_bytes as f64 - windows).max(0.0) / (per_layer * (*full_layers).max(1) as f64))
                    as usize
            }
            // A request's state takes its blocks beside its tokens'.
            _ => {
                let state_blocks = launch.engine.state_blocks().unwrap_or(0);
                launch
                    .engine
                    .num_gpu_blocks
                    .saturating_sub(state_blocks)
                    .saturating_mul(launch.engine.block_size)
            }
        };
        launch.engine.max_model_len = Some(model.arch.max_position_embeddings.min(pool).max(1));
    }
    // A P/D transfer moves every GPU's shard of each token's KV (cache groups and state
    // caches model none).
    let whole_token = kv_per_token * place.tp as f64;
    let e = &launch.engine;
    if e.kv_transfer_bytes_per_token.is_none() && !e.has_kv_cache_groups() && e.state_cache.is_none() {
        launch.engine.kv_transfer_bytes_per_token = Some(whole_token);
    }
    let ops = match scaled_from {
        None => format!("{system} ({} {})", tables.backend, tables.backend_version),
        Some(proxy) => format!(
            "{system} ({} {}), scaled from {proxy} by the roofline",
            tables.backend, tables.backend_version
        ),
    };
    Ok(Some(Resolved {
        model: model.name,
        gpu: gpu.name.clone(),
        ops,
        weight_bytes_per_gpu: weights,
        kv_bytes_per_token_per_gpu: kv_per_token,
        hybrid,
        state,
    }))
}

/// A model placed on a GPU with the tables that price it.
struct Setup {
    model: NamedModel,
    gpu: &'static GpuSpec,
    place: Placement,
    tables: ops::OpTables,
    scaled_from: Option<String>,
}

fn setup(launch: &LaunchConfig, model_spec: &str) -> Result<Setup, ModelError> {
    let model = load_model(model_spec)?;
    let gpu_name = launch.hardware.gpu.as_deref().unwrap_or(DEFAULT_GPU);
    let gpu = find_gpu(gpu_name).ok_or_else(|| {
        err("gpu", format!("{gpu_name:?} is not a GPU of the catalogue; known: {}", gpu_names().join(", ")))
    })?;
    let place = placement(launch, &model.arch)?;
    let (system, scaled_from) = ops_system(gpu)?;
    let tables = catalogue::op_tables(&system)
        .ok_or_else(|| err("gpu", format!("no operator tables bundled for {system}")))?
        .map_err(|e| err("gpu", e.to_string()))?;
    Ok(Setup { model, gpu, place, tables, scaled_from })
}

/// The launch's model on its GPU: each token-proportional operation of one layer at each
/// of `tokens`, for listing what a pass is made of (`mocker profiles ops`).
pub fn layer_operations(launch: &LaunchConfig, tokens: &[f64]) -> Result<Vec<pricing::LayerOps>, ModelError> {
    let spec = launch.hardware.model.as_deref().ok_or_else(|| err("model", "is required"))?;
    let s = setup(launch, spec)?;
    let pricer = Pricer::new(&s.model.arch, s.gpu, &s.tables, s.place);
    Ok(tokens.iter().map(|&t| pricer.layer_ops(t)).collect())
}

/// vLLM's OpenAI server sizes its batch by the GPU when the user does not: 8192 tokens and
/// 1024 sequences a pass on parts with 70 GiB or more (A100 excepted), 2048 and 256 on the
/// rest (`EngineArgs._set_default_args` in vLLM's V1 engine). Its CUDA block size is 16.
pub fn vllm_batch_defaults(gpu: &GpuSpec) -> (usize, usize) {
    let gib = 1024.0 * 1024.0 * 1024.0;
    if gpu.memory_bytes >= 70.0 * gib && !gpu.name.starts_with("a100") {
        (1024, 8192)
    } else {
        (256, 2048)
    }
}

fn apply_vllm_batch_defaults(launch: &mut LaunchConfig, gpu: &GpuSpec) {
    if launch.engine.backend != mocker_core::config::Backend::Vllm {
        return;
    }
    let (seqs, tokens) = vllm_batch_defaults(gpu);
    let given = launch.given_keys;
    if !given.max_num_seqs {
        launch.engine.max_num_seqs = seqs;
    }
    if !given.block_size {
        launch.engine.block_size = VLLM_BLOCK_SIZE;
    }
    if !given.max_num_batched_tokens {
        launch.engine.max_num_batched_tokens = tokens;
    }
}

/// The operator data that times `gpu`: its own system's, or its proxy's (named).
fn ops_system(gpu: &GpuSpec) -> Result<(String, Option<String>), ModelError> {
    if let Some(s) = &gpu.aic_system {
        if catalogue::op_systems().contains(&s.as_str()) {
            return Ok((s.clone(), None));
        }
    }
    let proxy = gpu
        .proxy
        .as_deref()
        .and_then(find_gpu)
        .ok_or_else(|| err("gpu", format!("{} has no operator data and no proxy with some", gpu.name)))?;
    match &proxy.aic_system {
        Some(s) if catalogue::op_systems().contains(&s.as_str()) => Ok((s.clone(), Some(proxy.name.clone()))),
        _ => Err(err("gpu", format!("{}'s proxy {} has no operator data", gpu.name, proxy.name))),
    }
}
