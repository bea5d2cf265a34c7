//! The description of what a replay runs (timing source, KV capacity and its origin,
//! backend, workers, router), read off the resolved options once before the run.

use std::path::Path;

use mocker_core::config::{LaunchConfig, TimingModelConfig};
use mocker_replay::report::{
    KvCapacity, KvGroupsFacts, KvSource, PoolFacts, ProfileFacts, RunDescription, StateFacts, TimingSource,
    Topology,
};
use mocker_replay::{Cluster, Pool, ReplayOptions, RouterMode};
use serde_json::Value;

use crate::engine_args::EngineFlags;

/// What describing a run needs besides the options: how the timing was asked for.
pub struct DescribeOptions<'a> {
    /// The resolved replay.
    pub replay: &'a ReplayOptions,
    /// The engine flags as given (tell `--planner-profile-data` from an engine-args path).
    pub engine: &'a EngineFlags,
    /// `offline` or `online`.
    pub mode: &'a str,
}

/// Describes the run `o` sets up.
pub fn describe(o: &DescribeOptions<'_>) -> RunDescription {
    let pool = |p: &Pool| pool_facts(p, o.engine);
    let topology = match &o.replay.cluster {
        Cluster::Aggregated(p) => Topology::Aggregated(pool(p)),
        Cluster::Disaggregated { prefill, decode } => {
            Topology::Disaggregated { prefill: pool(prefill), decode: pool(decode) }
        }
    };
    RunDescription {
        mode: o.mode.to_string(),
        backend: o.replay.cluster.entry().launch.engine.backend.as_str().to_string(),
        router: match o.replay.router {
            RouterMode::RoundRobin => "round-robin",
            RouterMode::Kv => "kv",
        }
        .to_string(),
        topology,
        agentic: None,
    }
}

fn pool_facts(pool: &Pool, flags: &EngineFlags) -> PoolFacts {
    let launch = &pool.launch;
    let (timing, meta) = timing(launch, flags);
    // The profile sized the cache exactly when it states memory and num_gpu_blocks was not
    // explicit (mocker_profiles' capacity rules); otherwise the count is as given or default.
    let by_model = matches!(timing, TimingSource::Architecture { .. });
    let source = if (meta.is_some() || by_model) && !launch.num_gpu_blocks_is_explicit {
        let (key, fraction) = mocker_profiles::memory_fraction(launch);
        match by_model {
            true => KvSource::ModelMemory { key: key.to_string(), fraction },
            false => KvSource::ProfileMemory { key: key.to_string(), fraction },
        }
    } else if launch.num_gpu_blocks_given {
        KvSource::EngineArgs
    } else {
        KvSource::Default
    };
    let e = &launch.engine;
    let groups =
        e.kv_cache_capacity_bytes.filter(|_| e.has_kv_cache_groups()).map(|capacity_bytes| KvGroupsFacts {
            capacity_bytes,
            groups: e
                .kv_cache_groups
                .iter()
                .map(|g| {
                    (g.name.clone(), g.num_layers, g.block_size_tokens, g.page_size_bytes, g.sliding_window)
                })
                .collect(),
        });
    let state = e.state_cache.zip(e.state_blocks()).map(|(s, blocks)| StateFacts {
        bytes_per_request: s.bytes_per_request,
        blocks_per_request: blocks,
        kv_bytes_per_token: e.kv_cache_bytes_per_token.unwrap_or(0),
        // Derived from the model's recurrent layers when a model named in the launch
        // sized the engine (mocker_models refuses a state_cache given beside one).
        model: launch.hardware.model.clone().filter(|_| by_model),
    });
    let kv_capacity = KvCapacity {
        blocks: e.num_gpu_blocks,
        block_size: e.block_size,
        source,
        groups: groups.map(Box::new),
        state: state.map(Box::new),
    };
    PoolFacts { workers: pool.workers, timing, kv_capacity }
}

/// The timing source of `launch` and the memory facts of its profile, if it has any.
fn timing(
    launch: &LaunchConfig,
    flags: &EngineFlags,
) -> (TimingSource, Option<mocker_profiles::ProfileMeta>) {
    match &launch.engine.timing_model {
        TimingModelConfig::Polynomial => (TimingSource::Polynomial, None),
        TimingModelConfig::Fixed { prefill_ms, decode_ms } => {
            (TimingSource::Fixed { prefill_ms: *prefill_ms, decode_ms: *decode_ms }, None)
        }
        TimingModelConfig::External { provider, config, .. } if provider == "dynamo_profile" => {
            let path = config.get("path").and_then(Value::as_str).unwrap_or_default();
            // mocker_profiles labels a bundled profile `bundled:NAME`; reading its meta again
            // is a few kilobytes, once per pool.
            if let Some(name) = path.strip_prefix("bundled:") {
                let meta = mocker_profiles::bundled(name).and_then(Result::ok).and_then(|p| p.meta);
                let profile = meta.as_ref().map(facts);
                return (TimingSource::BundledProfile { name: name.to_string(), profile }, meta);
            }
            let meta = if Path::new(path).is_file() {
                mocker_profiles::read_meta(Path::new(path)).ok().flatten()
            } else {
                None
            };
            let given_by = if flags.planner_profile_data.is_some() {
                "--planner-profile-data"
            } else {
                "engine args timing_model"
            };
            let source = TimingSource::ProfileFile {
                path: path.to_string(),
                given_by: given_by.to_string(),
                profile: meta.as_ref().map(facts),
            };
            (source, meta)
        }
        TimingModelConfig::External { provider, .. } => {
            (TimingSource::External { provider: provider.clone() }, None)
        }
        TimingModelConfig::Architecture { label, .. } => {
            (TimingSource::Architecture { label: label.clone() }, None)
        }
    }
}

fn facts(m: &mocker_profiles::ProfileMeta) -> ProfileFacts {
    ProfileFacts { model: m.model.clone(), gpu: m.system.clone(), backend: m.backend.clone(), tp: m.tp }
}
