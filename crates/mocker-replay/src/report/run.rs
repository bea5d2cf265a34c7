//! What a replay ran: timing source, KV capacity and where it came from, backend, workers
//! and router. Printed as a header above the table, written under the report's `run` key
//! and shown as the plots' subtitle, so a report read later says what produced it.
//!
//! The reference's report has no such facts; they live under one key of mocker's own so
//! every key the reference writes stays exactly as it is.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use super::summary::Summary;

/// The model and hardware a profile was measured for, when the profile states them.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileFacts {
    /// Model id (e.g. `Qwen/Qwen3-32B`).
    pub model: String,
    /// GPU system (e.g. `h200_sxm`).
    pub gpu: String,
    /// Serving engine the timings were measured on.
    pub backend: String,
    /// Tensor-parallel GPUs per engine.
    pub tp: usize,
}

/// Where a pool's pass times come from.
#[derive(Debug, Clone, PartialEq)]
pub enum TimingSource {
    /// The reference's polynomial fit (engine args leave `timing_model` at its default).
    Polynomial,
    /// Constant pass times (engine args `timing_model: {"type": "fixed", ...}`).
    Fixed {
        /// Cost of a pass with prefill work, ms.
        prefill_ms: f64,
        /// Cost of a pass with decode work only, ms.
        decode_ms: f64,
    },
    /// A profile compiled into mocker, chosen with `--timing-profile NAME`.
    BundledProfile {
        /// The bundled name.
        name: String,
        /// What it was measured for, if it says.
        profile: Option<ProfileFacts>,
    },
    /// A Dynamo planner profile (table file or results directory).
    ProfileFile {
        /// The file or directory as given.
        path: String,
        /// The flag or engine-args key that named it.
        given_by: String,
        /// What it was measured for, if it says (Dynamo's own tables do not).
        profile: Option<ProfileFacts>,
    },
    /// Composed from a model's architecture on a GPU (`--model`, `--gpu`).
    Architecture {
        /// What was modelled ("meta-llama/Llama-3.1-8B on h100, TP 1").
        label: String,
    },
    /// Another external provider, by name.
    External {
        /// The provider's name.
        provider: String,
    },
}

/// Where a pool's KV capacity came from.
#[derive(Debug, Clone, PartialEq)]
pub enum KvSource {
    /// `num_gpu_blocks` given in the engine args.
    EngineArgs,
    /// mocker's default `num_gpu_blocks` (nothing sized it).
    Default,
    /// Derived from GPU memory by the timing profile's memory facts.
    ProfileMemory {
        /// The memory-fraction key the backend reads (`gpu_memory_utilization`, ...).
        key: String,
        /// Its value (given or the backend's default).
        fraction: f64,
    },
    /// Derived from GPU memory by the model's weights and KV size (`--model`, `--gpu`).
    ModelMemory {
        /// The memory-fraction key the backend reads.
        key: String,
        /// Its value (given or the backend's default).
        fraction: f64,
    },
}

/// KV capacity of one worker of a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCapacity {
    /// KV blocks per worker.
    pub blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Where the block count came from.
    pub source: KvSource,
    /// With KV cache groups: their byte budget and pages, which replace the blocks.
    pub groups: Option<Box<KvGroupsFacts>>,
    /// With a state cache: what each request's recurrent state takes of the blocks.
    pub state: Option<Box<StateFacts>>,
}

/// A recurrent state a request kept in the same blocks as the tokens (`state_cache`, or a
/// hybrid model's recurrent layers).
#[derive(Debug, Clone, PartialEq)]
pub struct StateFacts {
    /// Bytes of one request's state (`state_cache.bytes_per_request`).
    pub bytes_per_request: u64,
    /// Blocks one state takes.
    pub blocks_per_request: usize,
    /// Bytes a token costs in the attention layers (`kv_cache_bytes_per_token`).
    pub kv_bytes_per_token: u64,
    /// The model whose recurrent layers it comes from (`None`: given in the engine args).
    pub model: Option<String>,
}

/// KV cache groups sharing a byte budget (`kv_cache_groups`, or a hybrid model's layers).
#[derive(Debug, Clone, PartialEq)]
pub struct KvGroupsFacts {
    /// The budget of each worker, bytes.
    pub capacity_bytes: u64,
    /// Each group: (name, layers, tokens per page, bytes per page, sliding window).
    pub groups: Vec<(String, u32, u32, u64, Option<u32>)>,
}

impl KvGroupsFacts {
    /// Tokens of full history the budget holds, windows aside (the groups without a window
    /// pay for every token).
    pub fn full_history_tokens(&self) -> u64 {
        let per_token: f64 =
            self.groups.iter().filter(|g| g.4.is_none()).map(|g| g.3 as f64 / f64::from(g.2.max(1))).sum();
        if per_token == 0.0 {
            return 0;
        }
        (self.capacity_bytes as f64 / per_token) as u64
    }
}

/// One pool of identical workers.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolFacts {
    /// Workers in the pool.
    pub workers: usize,
    /// Their timing source.
    pub timing: TimingSource,
    /// Each worker's KV capacity.
    pub kv_capacity: KvCapacity,
}

/// The workers of a run.
// One is built a run: boxing a variant to save bytes would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Topology {
    /// Every worker prefills and decodes.
    Aggregated(PoolFacts),
    /// Prefill and decode pools with KV handed over between them.
    Disaggregated {
        /// The pool requests enter.
        prefill: PoolFacts,
        /// The pool that decodes.
        decode: PoolFacts,
    },
}

/// What a replay ran, assembled once before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct RunDescription {
    /// `offline` (simulated clock) or `online` (live engines).
    pub mode: String,
    /// Engine family: `vllm`, `sglang` or `trtllm`.
    pub backend: String,
    /// Placement: `round-robin` or `kv`.
    pub router: String,
    /// Workers, with each pool's timing and KV capacity.
    pub topology: Topology,
    /// An agentic trace's replay: its model projection and lanes.
    pub agentic: Option<AgenticFacts>,
}

/// How an agentic trace was replayed, as the reference's report records it
/// (`agentic_input_format`, `agentic_lanes`, `agentic_model_projection`,
/// `agentic_qualification`, `weka_nested_timestamp_basis`).
#[derive(Debug, Clone, PartialEq)]
pub struct AgenticFacts {
    /// `agentic_mooncake` or `weka`.
    pub input_format: String,
    /// `--agentic-lanes`, if given.
    pub lanes: Option<usize>,
    /// The models the rows name, sorted, each once.
    pub source_models: Vec<String>,
    /// `--execution-model`: what every source model is projected onto.
    pub target_model: String,
    /// Weka traces: the nested timestamp basis used (`absolute`, `relative`,
    /// `not_applicable`).
    pub weka_nested_timestamp_basis: Option<String>,
}

impl AgenticFacts {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("input_format".into(), json!(self.input_format));
        m.insert("lanes".into(), json!(self.lanes));
        m.insert(
            "model_projection".into(),
            json!({
                "policy": "project_to_configured_target",
                "source_models": self.source_models,
                "target_model": self.target_model,
            }),
        );
        // Timing comes from the configured engine, not from each source model.
        m.insert("qualification".into(), json!("functional_only"));
        if let Some(b) = &self.weka_nested_timestamp_basis {
            m.insert("weka_nested_timestamp_basis".into(), json!(b));
        }
        Value::Object(m)
    }
}

/// `n` with comma thousands separators.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

impl ProfileFacts {
    fn label(&self) -> String {
        format!("{} × {} × {} × TP {}", self.model, self.gpu, self.backend, self.tp)
    }

    fn to_json(&self) -> Value {
        json!({"model": self.model, "gpu": self.gpu, "backend": self.backend, "tp": self.tp})
    }
}

impl TimingSource {
    /// Full wording, for the header.
    fn label(&self) -> String {
        let with = |base: String, p: &Option<ProfileFacts>| match p {
            Some(p) => format!("{base}: {}", p.label()),
            None => base,
        };
        match self {
            Self::Polynomial => "the reference's polynomial fit (default)".into(),
            Self::Fixed { prefill_ms, decode_ms } => {
                format!("fixed, {prefill_ms} ms per prefill pass, {decode_ms} ms per decode pass")
            }
            Self::BundledProfile { name, profile } => {
                with(format!("bundled profile {name} (--timing-profile)"), profile)
            }
            Self::ProfileFile { path, given_by, profile } => {
                with(format!("Dynamo profile {path} ({given_by})"), profile)
            }
            Self::Architecture { label } => format!("architecture: {label} (--model, --gpu)"),
            Self::External { provider } => format!("external provider {provider}"),
        }
    }

    /// A few words, for a plot's subtitle (paths shortened to their last component).
    fn short(&self) -> String {
        match self {
            Self::Polynomial => "polynomial (reference fit)".into(),
            Self::Fixed { prefill_ms, decode_ms } => format!("fixed {prefill_ms}/{decode_ms} ms"),
            Self::BundledProfile { name, .. } => format!("profile {name}"),
            Self::ProfileFile { path, .. } => {
                let trimmed = path.trim_end_matches('/');
                format!("profile {}", trimmed.rsplit('/').next().unwrap_or(trimmed))
            }
            Self::Architecture { label } => label.clone(),
            Self::External { provider } => provider.clone(),
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        let profile = |m: &mut Map<String, Value>, p: &Option<ProfileFacts>| {
            if let Some(p) = p {
                m.insert("profile".into(), p.to_json());
            }
        };
        let source = match self {
            Self::Polynomial => "polynomial",
            Self::Fixed { prefill_ms, decode_ms } => {
                m.insert("prefill_ms".into(), json!(prefill_ms));
                m.insert("decode_ms".into(), json!(decode_ms));
                "fixed"
            }
            Self::BundledProfile { name, profile: p } => {
                m.insert("name".into(), json!(name));
                profile(&mut m, p);
                "bundled_profile"
            }
            Self::ProfileFile { path, given_by, profile: p } => {
                m.insert("path".into(), json!(path));
                m.insert("given_by".into(), json!(given_by));
                profile(&mut m, p);
                "profile_file"
            }
            Self::Architecture { label } => {
                m.insert("label".into(), json!(label));
                "architecture"
            }
            Self::External { provider } => {
                m.insert("provider".into(), json!(provider));
                "external"
            }
        };
        m.insert("source".into(), json!(source));
        m.insert("description".into(), json!(self.label()));
        Value::Object(m)
    }
}

impl KvCapacity {
    /// Tokens a worker's KV cache holds (with cache groups: of full history, windows aside).
    pub fn tokens(&self) -> u64 {
        match &self.groups {
            Some(g) => g.full_history_tokens(),
            None => self.blocks as u64 * self.block_size as u64,
        }
    }

    fn label(&self) -> String {
        let source = match &self.source {
            KvSource::EngineArgs => "num_gpu_blocks from engine args".to_string(),
            KvSource::Default => "mocker's default num_gpu_blocks".to_string(),
            KvSource::ProfileMemory { key, fraction } => {
                format!("derived from GPU memory by the profile, {key} {fraction}")
            }
            KvSource::ModelMemory { key, fraction } => {
                format!("derived from GPU memory by the model's size, {key} {fraction}")
            }
        };
        if let Some(g) = &self.groups {
            let names: Vec<String> = g
                .groups
                .iter()
                .map(|(name, layers, _, _, window)| match window {
                    Some(w) => format!("{name} ({layers} layers, window {w})"),
                    None => format!("{name} ({layers} layers)"),
                })
                .collect();
            return format!(
                "cache groups {} share {} bytes = {} tokens of full history ({source})",
                names.join(", "),
                grouped(g.capacity_bytes),
                grouped(self.tokens())
            );
        }
        let state = match &self.state {
            Some(st) => format!(
                ", shared with a recurrent state of {} blocks ({} bytes) a request{} (at most {} requests)",
                st.blocks_per_request,
                grouped(st.bytes_per_request),
                st.model.as_ref().map(|m| format!(" from {m}'s recurrent layers")).unwrap_or_default(),
                grouped(self.max_requests().unwrap_or(0))
            ),
            None => String::new(),
        };
        format!(
            "{} blocks × {} tokens = {} tokens{state} ({source})",
            grouped(self.blocks as u64),
            self.block_size,
            grouped(self.tokens())
        )
    }

    /// With a state cache: how many requests the blocks hold at once, each with its state
    /// and at least one token block.
    pub fn max_requests(&self) -> Option<u64> {
        self.state.as_ref().map(|s| self.blocks as u64 / (s.blocks_per_request as u64 + 1))
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "blocks": self.blocks,
            "block_size": self.block_size,
            "tokens": self.tokens(),
        });
        if let Some(g) = &self.groups {
            v["kv_cache_capacity_bytes"] = json!(g.capacity_bytes);
            v["kv_cache_groups"] = json!(g
                .groups
                .iter()
                .map(|(name, layers, tokens, page, window)| json!({"name": name, "num_layers": layers,
                    "block_size_tokens": tokens, "page_size_bytes": page, "sliding_window": window}))
                .collect::<Vec<_>>());
        }
        if let Some(st) = &self.state {
            v["state_cache"] = json!({
                "bytes_per_request": st.bytes_per_request,
                "blocks_per_request": st.blocks_per_request,
                "kv_cache_bytes_per_token": st.kv_bytes_per_token,
                "max_requests": self.max_requests(),
                "from_model": st.model,
            });
        }
        let source = match &self.source {
            KvSource::EngineArgs => "engine_args",
            KvSource::Default => "default",
            KvSource::ProfileMemory { key, fraction } => {
                v["memory_fraction_key"] = json!(key);
                v["memory_fraction"] = json!(fraction);
                "profile_memory"
            }
            KvSource::ModelMemory { key, fraction } => {
                v["memory_fraction_key"] = json!(key);
                v["memory_fraction"] = json!(fraction);
                "model_memory"
            }
        };
        v["source"] = json!(source);
        v
    }
}

/// `v` with every object's keys sorted, as the reference's `json.dumps(sort_keys=True)`
/// writes nested objects too (serde_json here keeps insertion order).
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let m: BTreeMap<String, Value> = m.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(m.into_iter().collect())
        }
        other => other,
    }
}

impl RunDescription {
    fn workers(&self) -> String {
        match &self.topology {
            Topology::Aggregated(p) => {
                format!("{} worker{}", p.workers, if p.workers == 1 { "" } else { "s" })
            }
            Topology::Disaggregated { prefill, decode } => {
                format!("disaggregated, {} prefill + {} decode workers", prefill.workers, decode.workers)
            }
        }
    }

    fn pools(&self) -> Vec<(&'static str, &PoolFacts)> {
        match &self.topology {
            Topology::Aggregated(p) => vec![("", p)],
            Topology::Disaggregated { prefill, decode } => vec![("prefill ", prefill), ("decode ", decode)],
        }
    }

    /// The lines printed above the table, each ending in `\n`.
    pub fn header(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Run: {} replay, {}, router {}, backend {}",
            self.mode,
            self.workers(),
            self.router,
            self.backend
        );
        let pools = self.pools();
        if pools.iter().all(|(_, p)| p.timing == pools[0].1.timing) {
            let _ = writeln!(out, "Timing: {}", pools[0].1.timing.label());
        } else {
            for (name, p) in &pools {
                let _ = writeln!(out, "Timing ({}): {}", name.trim_end(), p.timing.label());
            }
        }
        for (name, p) in &pools {
            let _ = writeln!(out, "KV cache per {name}worker: {}", p.kv_capacity.label());
        }
        if let Some(a) = &self.agentic {
            let lanes = a.lanes.map_or("plays at their authored times".into(), |n| format!("{n} lanes"));
            let _ = writeln!(
                out,
                "Agentic: {lanes}; source models {} projected onto {}",
                a.source_models.join(", "),
                a.target_model
            );
        }
        out
    }

    /// One line naming the run, for the plots: workers, router, backend, timing source.
    pub fn subtitle(&self) -> String {
        let pools = self.pools();
        let timing = if pools.iter().all(|(_, p)| p.timing == pools[0].1.timing) {
            pools[0].1.timing.short()
        } else {
            let each: Vec<String> = pools.iter().map(|(n, p)| format!("{}{}", n, p.timing.short())).collect();
            each.join(" / ")
        };
        format!("{}, router {}, {}, timing: {timing}", self.workers(), self.router, self.backend)
    }

    /// The report's `run` object (keys sorted).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("mode".into(), json!(self.mode));
        m.insert("backend".into(), json!(self.backend));
        m.insert("router".into(), json!(self.router));
        match &self.topology {
            Topology::Aggregated(p) => {
                m.insert("num_workers".into(), json!(p.workers));
                m.insert("timing".into(), p.timing.to_json());
                m.insert("kv_capacity".into(), p.kv_capacity.to_json());
            }
            Topology::Disaggregated { prefill, decode } => {
                for (name, p) in [("prefill", prefill), ("decode", decode)] {
                    m.insert(format!("num_{name}_workers"), json!(p.workers));
                    m.insert(format!("{name}_timing"), p.timing.to_json());
                    m.insert(format!("{name}_kv_capacity"), p.kv_capacity.to_json());
                }
            }
        }
        if let Some(a) = &self.agentic {
            m.insert("agentic".into(), a.to_json());
        }
        sorted(Value::Object(m))
    }

    /// The `--report-json` text: the summary's keys as [`Summary::to_json_pretty`] writes
    /// them, plus `run`, all sorted, 2-space indent, no trailing newline.
    pub fn report_json_pretty(&self, summary: &Summary) -> String {
        let mut report: BTreeMap<String, Value> = match summary.to_json_value() {
            Value::Object(map) => map.into_iter().collect(),
            _ => unreachable!("summary serializes to an object"),
        };
        report.insert("run".into(), self.to_json());
        serde_json::to_string_pretty(&report).expect("report serializes to JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::summary::SummaryInputs;

    fn profiled(workers: usize) -> PoolFacts {
        PoolFacts {
            workers,
            timing: TimingSource::BundledProfile {
                name: "h200-qwen3-32b-vllm-tp2".into(),
                profile: Some(ProfileFacts {
                    model: "Qwen/Qwen3-32B".into(),
                    gpu: "h200_sxm".into(),
                    backend: "vllm".into(),
                    tp: 2,
                }),
            },
            kv_capacity: KvCapacity {
                blocks: 12_345,
                block_size: 16,
                source: KvSource::ProfileMemory { key: "gpu_memory_utilization".into(), fraction: 0.9 },
                groups: None,
                state: None,
            },
        }
    }

    fn aggregated() -> RunDescription {
        RunDescription {
            mode: "offline".into(),
            backend: "vllm".into(),
            router: "kv".into(),
            topology: Topology::Aggregated(profiled(2)),
            agentic: None,
        }
    }

    #[test]
    fn header_names_timing_capacity_workers_and_router() {
        let text = aggregated().header();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "Run: offline replay, 2 workers, router kv, backend vllm",
                "Timing: bundled profile h200-qwen3-32b-vllm-tp2 (--timing-profile): Qwen/Qwen3-32B × h200_sxm \
                 × vllm × TP 2",
                "KV cache per worker: 12,345 blocks × 16 tokens = 197,520 tokens (derived from GPU memory by \
                 the profile, gpu_memory_utilization 0.9)",
            ]
        );
    }

    #[test]
    fn a_state_cache_says_what_each_request_takes_of_the_blocks() {
        let kv = KvCapacity {
            blocks: 10_609,
            block_size: 272,
            source: KvSource::ModelMemory { key: "gpu_memory_utilization".into(), fraction: 0.9 },
            groups: None,
            state: Some(Box::new(StateFacts {
                bytes_per_request: 9_879_552,
                blocks_per_request: 3,
                kv_bytes_per_token: 12_288,
                model: Some("Qwen/Qwen3-Next-80B-A3B-Instruct".into()),
            })),
        };
        assert_eq!(kv.max_requests(), Some(2652));
        assert_eq!(
            kv.label(),
            "10,609 blocks × 272 tokens = 2,885,648 tokens, shared with a recurrent state of 3 blocks \
             (9,879,552 bytes) a request from Qwen/Qwen3-Next-80B-A3B-Instruct's recurrent layers (at most \
             2,652 requests) (derived from GPU memory by the model's size, gpu_memory_utilization 0.9)"
        );
        let v = kv.to_json();
        assert_eq!(v["state_cache"]["blocks_per_request"], 3);
        assert_eq!(v["state_cache"]["max_requests"], 2652);
        assert_eq!(v["state_cache"]["from_model"], "Qwen/Qwen3-Next-80B-A3B-Instruct");
    }

    #[test]
    fn disaggregated_pools_are_named_and_differing_timing_split() {
        let mut decode = profiled(3);
        decode.timing = TimingSource::Polynomial;
        decode.kv_capacity = KvCapacity {
            blocks: 1000,
            block_size: 64,
            source: KvSource::EngineArgs,
            groups: None,
            state: None,
        };
        let run = RunDescription {
            mode: "offline".into(),
            backend: "vllm".into(),
            router: "round-robin".into(),
            topology: Topology::Disaggregated { prefill: profiled(1), decode },
            agentic: None,
        };
        let text = run.header();
        assert!(
            text.starts_with("Run: offline replay, disaggregated, 1 prefill + 3 decode workers,"),
            "{text}"
        );
        assert!(text.contains("\nTiming (prefill): bundled profile"), "{text}");
        assert!(text.contains("\nTiming (decode): the reference's polynomial fit"), "{text}");
        assert!(text.contains("\nKV cache per decode worker: 1,000 blocks × 64 tokens = 64,000 tokens (num_gpu_blocks from engine args)"), "{text}");
        let v = run.to_json();
        assert_eq!((v["num_prefill_workers"].as_u64(), v["num_decode_workers"].as_u64()), (Some(1), Some(3)));
        assert_eq!(v["decode_kv_capacity"]["source"], "engine_args");
        assert_eq!(v["prefill_timing"]["profile"]["tp"], 2);
        assert!(v.get("num_workers").is_none() && v.get("timing").is_none());
        assert_eq!(
            run.subtitle(),
            "disaggregated, 1 prefill + 3 decode workers, router round-robin, vllm, timing: prefill profile \
             h200-qwen3-32b-vllm-tp2 / decode polynomial (reference fit)"
        );
    }

    #[test]
    fn report_keeps_every_summary_key_and_adds_run_sorted() {
        let summary = Summary::from_inputs(SummaryInputs { num_requests: 3, ..Default::default() });
        let text = aggregated().report_json_pretty(&summary);
        let v: Value = serde_json::from_str(&text).unwrap();
        let plain: Value = serde_json::from_str(&summary.to_json_pretty()).unwrap();
        let (with, without) = (v.as_object().unwrap(), plain.as_object().unwrap());
        assert_eq!(with.len(), without.len() + 1);
        assert!(without.iter().all(|(k, x)| with.get(k) == Some(x)));
        let run = &v["run"];
        assert_eq!(
            run["kv_capacity"],
            json!({"blocks": 12345, "block_size": 16, "tokens": 197520, "source": "profile_memory",
                   "memory_fraction_key": "gpu_memory_utilization", "memory_fraction": 0.9})
        );
        assert_eq!(run["timing"]["source"], "bundled_profile");
        assert_eq!(run["timing"]["profile"]["gpu"], "h200_sxm");
        assert_eq!((run["num_workers"].as_u64(), run["router"].as_str()), (Some(2), Some("kv")));
        // Nested keys sorted too, like the top level.
        let keys: Vec<&String> = run.as_object().unwrap().keys().collect();
        let mut want = keys.clone();
        want.sort();
        assert_eq!(keys, want);
        assert_eq!(
            aggregated().subtitle(),
            "2 workers, router kv, vllm, timing: profile h200-qwen3-32b-vllm-tp2"
        );
    }
}
