//! `--engine-args` and `--engine-type`, shared by `serve` and `replay`.

use clap::ValueEnum;
use mocker_core::config::LaunchConfig;
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

/// Builds the launch config from `--engine-args` (JSON or @file, flat or nested) with
/// `--engine-type` folded in before parsing, so the backend's own defaults (SGLang's page
/// size, say) and checks apply exactly as if the JSON had named it.
pub fn launch_config(
    engine_args: Option<&str>,
    engine_type: Option<EngineType>,
) -> Result<LaunchConfig, UsageError> {
    launch_config_for("--engine-args", engine_args, engine_type)
}

/// [`launch_config`] for engine args given by `flag` (errors name it).
pub fn launch_config_for(
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
        Some(arg) => match arg.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| UsageError(format!("{flag}: cannot read file {path:?}: {e}")))?,
            None => arg.to_string(),
        },
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
