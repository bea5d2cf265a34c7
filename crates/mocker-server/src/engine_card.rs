//! What the served engine is: its backend, sizes, speed and, when timed from a model's
//! architecture, the model and GPU. Each worker of a mixed fleet (`--worker-engine-args`)
//! describes itself with it on `/v1/models`, `/metrics` (`mocker:engine_info`) and
//! `/admin/config`.

use mocker_core::config::LaunchConfig;
use serde::Serialize;

/// The engine's identity and sizes, as configured at start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineCard {
    /// `vllm`, `sglang` or `trtllm`.
    pub backend: String,
    /// The architecture the passes are timed from (engine-args `model`), if any.
    pub model: Option<String>,
    /// The GPU it is timed on (engine-args `gpu`), if timed from a model.
    pub gpu: Option<String>,
    /// GPUs each engine spans.
    pub tensor_parallel_size: usize,
    /// DP ranks sharing the server.
    pub data_parallel_size: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks per rank.
    pub num_gpu_blocks: usize,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one pass.
    pub max_num_batched_tokens: usize,
    /// Whether cached prefixes are reused.
    pub enable_prefix_caching: bool,
}

impl EngineCard {
    /// The card of `launch` (after the server's own adjustments).
    pub fn new(launch: &LaunchConfig) -> Self {
        let e = &launch.engine;
        let model = launch.hardware.model.clone();
        Self {
            backend: e.backend.as_str().to_string(),
            // Named by the model resolution (its default GPU too) whenever a model is given.
            gpu: model.as_ref().and(launch.hardware.gpu.clone()),
            model,
            tensor_parallel_size: launch.tensor_parallel_size,
            data_parallel_size: launch.dp_size.max(1),
            block_size: e.block_size,
            num_gpu_blocks: e.num_gpu_blocks,
            max_num_seqs: e.max_num_seqs,
            max_num_batched_tokens: e.max_num_batched_tokens,
            enable_prefix_caching: e.enable_prefix_caching,
        }
    }

    /// The labels of `mocker:engine_info` (values as text).
    pub fn labels(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("model", self.model.clone().unwrap_or_default()),
            ("gpu", self.gpu.clone().unwrap_or_default()),
            ("tensor_parallel_size", self.tensor_parallel_size.to_string()),
            ("data_parallel_size", self.data_parallel_size.to_string()),
            ("block_size", self.block_size.to_string()),
            ("num_gpu_blocks", self.num_gpu_blocks.to_string()),
            ("max_num_seqs", self.max_num_seqs.to_string()),
            ("max_num_batched_tokens", self.max_num_batched_tokens.to_string()),
            ("enable_prefix_caching", self.enable_prefix_caching.to_string()),
        ]
    }

    /// `mocker:engine_info{model_name, engine, ...} 1`, an info gauge per DP rank (`engine`).
    pub fn collector(&self, model_name: &str, dp_ranks: &[u32]) -> Box<dyn prometheus::core::Collector> {
        let labels = self.labels();
        let mut names = vec!["model_name", "engine"];
        names.extend(labels.iter().map(|(k, _)| *k));
        let family = prometheus::GaugeVec::new(
            prometheus::Opts::new(
                "mocker:engine_info",
                "What this server's engine is: backend, model and GPU it is timed for, and its sizes.",
            ),
            &names,
        )
        .expect("valid gauge");
        for rank in dp_ranks {
            let rank = rank.to_string();
            let mut values = vec![model_name, rank.as_str()];
            values.extend(labels.iter().map(|(_, v)| v.as_str()));
            family.with_label_values(&values).set(1.0);
        }
        Box::new(family)
    }
}
