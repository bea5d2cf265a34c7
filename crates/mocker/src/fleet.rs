//! `serve --worker-engine-args`: a mixed fleet in one process. Each worker's own engine args
//! (a JSON list with one object per worker, or a map from worker index to object) are laid
//! over the shared `--engine-args`, key by key, so one worker can differ in size, backend,
//! speed, model or GPU while the rest keep the shared settings.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::UsageError;

/// The flag's name in messages.
pub const FLAG: &str = "--worker-engine-args";

/// Each worker's own engine args (`None`: the shared ones only).
#[derive(Debug, Clone, Default)]
pub struct WorkerEngineArgs {
    entries: Vec<Option<Map<String, Value>>>,
}

impl WorkerEngineArgs {
    /// Parses the flag's value (inline JSON, `@file`, or a file path) for `workers` workers.
    pub fn parse(arg: &str, workers: usize) -> Result<Self, UsageError> {
        let text = match arg.trim_start().chars().next() {
            Some('[' | '{') => arg.to_string(),
            _ => {
                let path = arg.strip_prefix('@').unwrap_or(arg);
                mocker_core::config::read_args_file(path)
                    .map_err(|e| UsageError(format!("{FLAG}: cannot read file {path:?}: {e}")))?
            }
        };
        let doc: Value =
            serde_json::from_str(&text).map_err(|e| UsageError(format!("{FLAG}: invalid JSON: {e}")))?;
        let object = |at: &str, v: Value| match v {
            Value::Object(m) => Ok(Some(m)),
            Value::Null => Ok(None),
            other => {
                Err(UsageError(format!("{FLAG}: worker {at}: must be an engine-args object, got {other}")))
            }
        };
        let entries = match doc {
            Value::Array(list) => {
                if list.len() != workers {
                    return Err(UsageError(format!(
                        "{FLAG}: the list has {} entries but the server runs {workers} workers (--num-workers, or \
                         --prefill-workers + --decode-workers); give one object per worker or a map from worker index",
                        list.len()
                    )));
                }
                list.into_iter()
                    .enumerate()
                    .map(|(i, v)| object(&i.to_string(), v))
                    .collect::<Result<_, _>>()?
            }
            Value::Object(map) => {
                let mut entries = vec![None; workers];
                for (key, v) in map {
                    let i = key.parse::<usize>().ok().filter(|i| *i < workers).ok_or_else(|| {
                        UsageError(format!(
                            "{FLAG}: key {key:?} is not a worker index (0 to {})",
                            workers.saturating_sub(1)
                        ))
                    })?;
                    entries[i] = object(&key, v)?;
                }
                entries
            }
            other => {
                return Err(UsageError(format!(
                "{FLAG}: must be a JSON list of engine-args objects or a map from worker index, got {other}"
            )))
            }
        };
        Ok(Self { entries })
    }

    /// Worker `i`'s engine args laid over the shared ones (`base`), as engine-args text;
    /// `base` as it is when the worker has none of its own.
    pub fn engine_args(&self, i: usize, base: Option<&str>) -> Result<Option<String>, UsageError> {
        let Some(Some(own)) = self.entries.get(i) else { return Ok(base.map(str::to_string)) };
        let own_text = Value::Object(own.clone()).to_string();
        match base {
            None => Ok(Some(own_text)),
            Some(base) => crate::engine_args::merge_engine_args(
                "--engine-args",
                base,
                &format!("{FLAG} (worker {i})"),
                &own_text,
            )
            .map(Some),
        }
    }

    /// The keys worker `i`'s own object sets, flat or under `engine`.
    pub fn keys(&self, i: usize) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        if let Some(Some(own)) = self.entries.get(i) {
            for (k, v) in own {
                match (k.as_str(), v) {
                    ("engine", Value::Object(inner)) => out.extend(inner.keys().cloned()),
                    _ => {
                        out.insert(k.clone());
                    }
                }
            }
        }
        out
    }
}

/// The engine flags of `serve` and the engine-args keys each stands for: a flag and a
/// worker's own key for the same setting cannot both be given (which would win is not
/// obvious, and one of them would be silently ignored for that worker).
pub const FLAG_KEYS: &[(&str, &[&str])] = &[
    ("--block-size", &["block_size"]),
    ("--num-gpu-blocks", &["num_gpu_blocks"]),
    ("--max-num-seqs", &["max_num_seqs"]),
    ("--max-num-batched-tokens", &["max_num_batched_tokens"]),
    ("--speedup-ratio", &["speedup_ratio"]),
    ("--enable-prefix-caching / --no-enable-prefix-caching", &["enable_prefix_caching"]),
    ("--max-model-len", &["max_model_len"]),
    ("--data-parallel-size", &["dp_size", "data_parallel_size"]),
    ("--output-length-distribution", &["output_length_distribution"]),
    ("--engine-type", &["backend", "engine_type"]),
    ("--model", &["model"]),
    ("--gpu", &["gpu"]),
    ("--tensor-parallel-size", &["tensor_parallel_size"]),
    ("--quantization", &["quantization"]),
    ("--kv-cache-dtype", &["kv_cache_dtype"]),
    ("--enable-expert-parallel", &["enable_expert_parallel"]),
    ("--disable-hybrid-kv-cache-manager", &["disable_hybrid_kv_cache_manager"]),
    ("--timing-profile", &["timing_model"]),
    ("--planner-profile-data", &["timing_model"]),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_gives_each_worker_its_object_and_a_map_picks_workers() {
        let list =
            WorkerEngineArgs::parse(r#"[{"num_gpu_blocks": 64}, null, {"engine": {"block_size": 32}}]"#, 3)
                .unwrap();
        assert_eq!(list.keys(0), BTreeSet::from(["num_gpu_blocks".to_string()]));
        assert!(list.keys(1).is_empty());
        assert_eq!(list.keys(2), BTreeSet::from(["block_size".to_string()]));
        let merged: Value = serde_json::from_str(
            &list.engine_args(0, Some(r#"{"num_gpu_blocks": 8, "block_size": 16}"#)).unwrap().unwrap(),
        )
        .unwrap();
        assert_eq!(merged, serde_json::json!({"num_gpu_blocks": 64, "block_size": 16}));
        assert_eq!(list.engine_args(1, Some("{}")).unwrap().as_deref(), Some("{}"));
        let map = WorkerEngineArgs::parse(r#"{"1": {"speedup_ratio": 2}}"#, 2).unwrap();
        assert!(map.keys(0).is_empty());
        assert_eq!(map.engine_args(1, None).unwrap().as_deref(), Some(r#"{"speedup_ratio":2}"#));
    }

    #[test]
    fn shapes_that_do_not_fit_the_workers_are_refused_by_name() {
        for (arg, workers, says) in [
            (r#"[{}, {}]"#, 3, "2 entries"),
            (r#"{"3": {}}"#, 3, "not a worker index"),
            (r#"{"x": {}}"#, 3, "not a worker index"),
            (r#"[1]"#, 1, "engine-args object"),
            (r#"{"0": 5}"#, 1, "engine-args object"),
            ("/nonexistent/fleet.json", 1, "cannot read file"),
            (r#"[{"#, 1, "invalid JSON"),
        ] {
            let e = WorkerEngineArgs::parse(arg, workers).unwrap_err();
            assert!(e.0.starts_with(FLAG) && e.0.contains(says), "{arg}: {}", e.0);
        }
    }
}
