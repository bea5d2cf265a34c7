//! `--engine-args` and `--engine-type`, shared by `serve` and `replay` (and the Python module).

use clap::ValueEnum;
use std::path::PathBuf;

use mocker_core::config::{LaunchConfig, TimingModelConfig};
use serde_json::{Map, Value};

use crate::UsageError;

/// The engine family, as vLLM/SGLang users name it on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineType {
    /// vLLM's scheduler and paged KV cache (the default).
    Vllm,
    /// SGLang's radix cache and scheduler.
    Sglang,
    /// TensorRT-LLM's caps on the vLLM core.
    Trtllm,
}

impl EngineType {
    fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::Trtllm => "trtllm",
        }
    }
}

/// The flags that pick the engine family and the timing source, shared by every command
/// that builds engines.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EngineFlags {
    /// Engine family (engine-args key `backend`, alias `engine_type`).
    #[arg(long, value_enum)]
    pub engine_type: Option<EngineType>,
    /// Time passes by a measured Dynamo planner profile: a converted `perf_data.npz` table or
    /// a profiler results directory (converted as the reference's launcher does). Same as
    /// engine args `timing_model: {"type": "external", "provider": "dynamo_profile",
    /// "config": {"path": PATH}}`; applies to every engine of the run.
    #[arg(long, value_name = "PATH")]
    pub planner_profile_data: Option<PathBuf>,
    /// Time passes by a profile bundled into mocker, by name (`mocker profiles` lists them):
    /// a named model on a named GPU, generated from NVIDIA AIConfigurator's measurements.
    /// Unless `num_gpu_blocks` is given, the KV cache is sized from the profile's memory
    /// facts (`gpu_memory_utilization`, `mem_fraction_static`, `free_gpu_memory_fraction`).
    #[arg(long, value_name = "NAME")]
    pub timing_profile: Option<String>,
    /// Time passes from this model's architecture: a Hugging Face id of the catalogue
    /// (`mocker profiles` lists them) or a directory with its `config.json` (engine-args
    /// key `model`). The KV cache is sized from the GPU's memory unless `num_gpu_blocks` is given.
    #[arg(long, value_name = "HF_ID_OR_PATH")]
    pub model: Option<String>,
    /// The GPU the model runs on (`h100`, `a100-80gb`, `l40s`, ...; default h100 with --model).
    #[arg(long, value_name = "NAME")]
    pub gpu: Option<String>,
    /// GPUs each engine spans (engine-args key `tensor_parallel_size`).
    #[arg(long, visible_alias = "tp", value_name = "N")]
    pub tensor_parallel_size: Option<usize>,
    /// Weight quantization, as vLLM spells it (fp8, awq, gptq, mxfp4, ...); default: the
    /// model's own.
    #[arg(long, value_name = "METHOD")]
    pub quantization: Option<String>,
    /// KV cache precision, as vLLM spells it (auto, fp8, fp8_e4m3, fp8_e5m2).
    #[arg(long, value_name = "DTYPE")]
    pub kv_cache_dtype: Option<String>,
    /// Spread whole experts across the tensor-parallel GPUs (MoE models), as vLLM's flag.
    #[arg(long)]
    pub enable_expert_parallel: bool,
    /// Size a model's sliding-window layers as full-attention layers, as vLLM's flag,
    /// instead of paging them as KV cache groups that keep only each window (engine-args
    /// key `disable_hybrid_kv_cache_manager`).
    #[arg(long)]
    pub disable_hybrid_kv_cache_manager: bool,
}

impl EngineFlags {
    /// Lays the model and GPU flags over the engine args' keys.
    fn apply_hardware(&self, launch: &mut LaunchConfig) {
        let h = &mut launch.hardware;
        for (flag, key) in [
            (&self.model, &mut h.model),
            (&self.gpu, &mut h.gpu),
            (&self.quantization, &mut h.quantization),
            (&self.kv_cache_dtype, &mut h.kv_cache_dtype),
        ] {
            if flag.is_some() {
                key.clone_from(flag);
            }
        }
        if self.enable_expert_parallel {
            h.enable_expert_parallel = true;
        }
        if self.disable_hybrid_kv_cache_manager {
            h.disable_hybrid_kv_cache_manager = true;
        }
        if let Some(tp) = self.tensor_parallel_size {
            launch.tensor_parallel_size = tp;
        }
    }
}

/// Builds the launch config from `--engine-args` (JSON or @file, flat or nested) with
/// `--engine-type` folded in before parsing, so the backend's own defaults (SGLang's page
/// size, say) and checks apply exactly as if the JSON had named it.
pub fn launch_config(engine_args: Option<&str>, flags: &EngineFlags) -> Result<LaunchConfig, UsageError> {
    launch_config_for("--engine-args", engine_args, flags)
}

/// Applies `--planner-profile-data` or `--timing-profile` and reads the profile a launch
/// config names, so the engines built from it are timed by that table (and, for profiles
/// that state memory, sized by it); errors name the flag or key they came from.
fn load_timing(flag: &str, launch: &mut LaunchConfig, flags: &EngineFlags) -> Result<(), UsageError> {
    let given = [
        ("--planner-profile-data", flags.planner_profile_data.is_some()),
        ("--timing-profile", flags.timing_profile.is_some()),
        ("--model", launch.hardware.model.is_some()),
    ];
    let mut sources: Vec<&str> = given.iter().filter(|(_, g)| *g).map(|(f, _)| *f).collect();
    if launch.engine.timing_model != TimingModelConfig::Polynomial {
        sources.push(flag);
    }
    if sources.len() > 1 {
        let named =
            sources.iter().map(|s| if *s == flag { format!("{flag} timing_model") } else { s.to_string() });
        return Err(UsageError(format!("{}: give one timing source", named.collect::<Vec<_>>().join(", "))));
    }
    let source = sources.first().copied().unwrap_or(flag);
    // An error names the flag when one set the key, else the engine args' key.
    let model_err = |e: mocker_models::ModelError| {
        let by_flag = match e.key {
            "model" => flags.model.is_some(),
            "gpu" => flags.gpu.is_some(),
            "quantization" => flags.quantization.is_some(),
            "kv_cache_dtype" => flags.kv_cache_dtype.is_some(),
            "enable_expert_parallel" => flags.enable_expert_parallel,
            "disable_hybrid_kv_cache_manager" => flags.disable_hybrid_kv_cache_manager,
            "tensor_parallel_size" => flags.tensor_parallel_size.is_some(),
            _ => false,
        };
        match by_flag {
            true => UsageError(format!("--{}: {}", e.key.replace('_', "-"), e.reason)),
            false => UsageError(format!("{flag}: {e}")),
        }
    };
    if launch.hardware.model.is_some() {
        let resolved = mocker_models::resolve_launch(launch).map_err(model_err)?;
        // What became of a hybrid model's sliding-window layers changes its capacity: say so.
        if let Some((r, layout)) = resolved.as_ref().and_then(|r| r.hybrid.as_ref().map(|h| (r, h))) {
            let kind = match layout {
                mocker_models::hybrid::HybridLayout::Groups { .. } => "note",
                _ => "warning",
            };
            eprintln!("{kind}: {flag}: {}", layout.describe(&r.model));
        }
        // So does a hybrid model's recurrent state: say what it takes of the blocks.
        if let Some((r, state)) = resolved.as_ref().and_then(|r| r.state.as_ref().map(|s| (r, s))) {
            eprintln!("note: {flag}: {}", state.describe(&r.model));
        }
        return Ok(());
    }
    mocker_models::resolve_launch(launch).map_err(model_err)?;
    let err = |e: mocker_profiles::ResolveError| UsageError(format!("{source}: {e}"));
    if let Some(path) = &flags.planner_profile_data {
        launch.engine.timing_model = mocker_profiles::timing_model_for(path);
    }
    if let Some(name) = &flags.timing_profile {
        let profile = mocker_profiles::bundled(name).ok_or_else(|| {
            UsageError(format!(
                "--timing-profile: no bundled profile {name:?}; choose one of: {}",
                mocker_profiles::bundled_names().join(", ")
            ))
        })?;
        let profile = profile.map_err(|e| err(e.into()))?;
        return mocker_profiles::use_profile(launch, &format!("bundled:{name}"), profile).map_err(err);
    }
    mocker_profiles::resolve_launch(launch).map_err(err)
}

/// The JSON text of an engine-args value: inline, or the contents of `@file`.
fn read_arg(flag: &str, arg: &str) -> Result<String, UsageError> {
    match arg.strip_prefix('@') {
        Some(path) => mocker_core::config::read_args_file(path)
            .map_err(|e| UsageError(format!("{flag}: cannot read file {path:?}: {e}"))),
        None => Ok(arg.to_string()),
    }
}

/// Engine args `over` (given by `over_flag`) laid on top of `base` (by `base_flag`): JSON
/// objects merged key by key, nested objects (`engine`, `sglang`, ...) recursively, `over`
/// winning. Both must be objects in the same form (flat, or nested under `engine`), since
/// a flat key and its nested twin cannot be ordered. Returns the merged JSON text.
pub fn merge_engine_args(
    base_flag: &str,
    base: &str,
    over_flag: &str,
    over: &str,
) -> Result<String, UsageError> {
    let object = |flag: &str, arg: &str| -> Result<Map<String, Value>, UsageError> {
        let text = read_arg(flag, arg)?;
        match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(other) => Err(UsageError(format!("{flag}: must be a JSON object (got {other})"))),
            Err(e) => Err(UsageError(format!("{flag}: invalid JSON: {e}"))),
        }
    };
    let (mut merged, over_doc) = (object(base_flag, base)?, object(over_flag, over)?);
    if merged.contains_key("engine") != over_doc.contains_key("engine") {
        return Err(UsageError(format!(
            "{over_flag}: give it in the same form as {base_flag} (both flat, or both nested under \"engine\")"
        )));
    }
    fn lay(into: &mut Map<String, Value>, from: Map<String, Value>) {
        for (k, v) in from {
            match (into.get_mut(&k), v) {
                (Some(Value::Object(a)), Value::Object(b)) => lay(a, b),
                (_, v) => {
                    into.insert(k, v);
                }
            }
        }
    }
    lay(&mut merged, over_doc);
    Ok(Value::Object(merged).to_string())
}

/// The value of `key` in the engine section of `--engine-args` (nested under `engine`, or
/// flat), when given: serve needs to tell a key set to its default from one left out.
pub fn given_engine_key(engine_args: Option<&str>, key: &str) -> Result<Option<Value>, UsageError> {
    let Some(arg) = engine_args else { return Ok(None) };
    let text = read_arg("--engine-args", arg)?;
    let Ok(Value::Object(doc)) = serde_json::from_str::<Value>(&text) else { return Ok(None) };
    let engine = match doc.get("engine") {
        Some(Value::Object(e)) => e,
        _ => &doc,
    };
    Ok(engine.get(key).cloned())
}

/// [`launch_config`] for engine args given by `flag` (errors name it).
pub fn launch_config_for(
    flag: &str,
    engine_args: Option<&str>,
    flags: &EngineFlags,
) -> Result<LaunchConfig, UsageError> {
    launch_config_with(flag, engine_args, flags, |_| ())
}

/// [`launch_config_for`] with a command's own engine flags laid on (`overrides`) before the
/// timing source is read and the KV cache sized, so a `--block-size` or
/// `--max-num-batched-tokens` flag sizes the cache as the same engine-args key would.
pub fn launch_config_with(
    flag: &str,
    engine_args: Option<&str>,
    flags: &EngineFlags,
    overrides: impl FnOnce(&mut LaunchConfig),
) -> Result<LaunchConfig, UsageError> {
    let mut launch = parse_launch(flag, engine_args, flags.engine_type)?;
    overrides(&mut launch);
    flags.apply_hardware(&mut launch);
    launch.validate().map_err(|e| UsageError(format!("{flag}: {e}")))?;
    load_timing(flag, &mut launch, flags)?;
    Ok(launch)
}

/// The launch config as given, before any profile is read.
fn parse_launch(
    flag: &str,
    engine_args: Option<&str>,
    engine_type: Option<EngineType>,
) -> Result<LaunchConfig, UsageError> {
    let err = |e: mocker_core::config::ConfigError| UsageError(format!("{flag}: {e}"));
    let Some(kind) = engine_type else {
        return match engine_args {
            Some(arg) => LaunchConfig::from_arg(arg).map_err(err),
            None => Ok(LaunchConfig::default()),
        };
    };
    let text = match engine_args {
        Some(arg) => read_arg(flag, arg)?,
        None => String::new(),
    };
    let mut doc = if text.trim().is_empty() {
        Map::new()
    } else {
        match serde_json::from_str(&text) {
            Ok(Value::Object(m)) => m,
            // Let the config parser word the error for anything that is not an object.
            _ => return LaunchConfig::from_json_str(&text).map_err(err),
        }
    };
    let engine = match doc.get_mut("engine") {
        Some(Value::Object(e)) => e,
        Some(_) => return LaunchConfig::from_json_str(&text).map_err(err),
        None => &mut doc,
    };
    for key in ["backend", "engine_type"] {
        if let Some(v) = engine.get(key) {
            if v.as_str() != Some(kind.name()) {
                return Err(UsageError(format!(
                    "--engine-type {}: conflicts with engine args {key} = {v}",
                    kind.name()
                )));
            }
        }
    }
    engine.remove("engine_type");
    engine.insert("backend".into(), Value::from(kind.name()));
    LaunchConfig::from_value(Value::Object(doc)).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_engine_args_win_key_by_key_at_every_depth() {
        let base = r#"{"engine": {"block_size": 64, "sglang": {"schedule_policy": "lpm", "page_size": 64}}, "dp_size": 2}"#;
        let over = r#"{"engine": {"sglang": {"schedule_policy": "fcfs"}, "max_num_seqs": 8}}"#;
        let merged: Value =
            serde_json::from_str(&merge_engine_args("--a", base, "--b", over).unwrap()).unwrap();
        let want: Value = serde_json::from_str(
            r#"{"engine": {"block_size": 64, "max_num_seqs": 8,
                "sglang": {"schedule_policy": "fcfs", "page_size": 64}}, "dp_size": 2}"#,
        )
        .unwrap();
        assert_eq!(merged, want);
        let e = merge_engine_args("--a", "[1]", "--b", "{}").unwrap_err();
        assert!(e.0.contains("--a") && e.0.contains("JSON object"), "{}", e.0);
        let e = merge_engine_args("--a", "{}", "--b", "{oops").unwrap_err();
        assert!(e.0.contains("--b") && e.0.contains("invalid JSON"), "{}", e.0);
    }
}
