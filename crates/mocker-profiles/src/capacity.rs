//! KV cache size from a profile's memory facts, the way each serving engine sizes it.
//!
//! - vLLM: `gpu_memory_utilization` (default 0.9) of the GPU's memory, less the weights
//!   and the non-KV reserve, is KV cache.
//! - SGLang: `mem_fraction_static` (default 0.88) of the GPU's memory, less the weights
//!   (activations live outside SGLang's static pool).
//! - TRT-LLM: `free_gpu_memory_fraction` (default 0.9) of what the weights and the non-KV
//!   reserve leave free.
//!
//! The non-KV reserve (activations, communication buffers, runtime and CUDA graphs) is
//! the profile's own estimate, or `cuda_graph_reserved_bytes` when that is given.
//!
//! Every GPU of a tensor-parallel group holds its shard of every block, so the count is
//! the same per GPU as per engine. `num_gpu_blocks` given explicitly wins and then the
//! memory keys are refused, as is any memory key without a profile that states memory.

use mocker_core::config::{Backend, LaunchConfig};

use crate::meta::ProfileMeta;
use crate::ResolveError;

/// The memory fraction a backend reads, its default, and the key that sets it.
fn fraction_key(backend: Backend) -> (&'static str, f64) {
    match backend {
        Backend::Vllm => ("gpu_memory_utilization", 0.9),
        Backend::Sglang => ("mem_fraction_static", 0.88),
        Backend::Trtllm => ("free_gpu_memory_fraction", 0.9),
    }
}

/// The memory-fraction key `launch`'s backend reads and the value it sizes the KV cache
/// with (given, or the backend's default): what a report names as the capacity's origin.
pub fn memory_fraction(launch: &LaunchConfig) -> (&'static str, f64) {
    let (key, default) = fraction_key(launch.engine.backend);
    let given = match launch.engine.backend {
        Backend::Vllm => launch.gpu_memory_utilization,
        Backend::Sglang => launch.mem_fraction_static,
        Backend::Trtllm => launch.free_gpu_memory_fraction,
    };
    (key, given.unwrap_or(default))
}

fn given(launch: &LaunchConfig) -> Vec<(&'static str, bool)> {
    vec![
        ("gpu_memory_utilization", launch.gpu_memory_utilization.is_some()),
        ("mem_fraction_static", launch.mem_fraction_static.is_some()),
        ("free_gpu_memory_fraction", launch.free_gpu_memory_fraction.is_some()),
        ("cuda_graph_reserved_bytes", launch.cuda_graph_reserved_bytes.is_some()),
    ]
}

/// Sizes `launch`'s KV cache from `meta`, or refuses memory keys that cannot apply.
pub(crate) fn apply(launch: &mut LaunchConfig, meta: Option<&ProfileMeta>) -> Result<(), ResolveError> {
    let set: Vec<&'static str> = given(launch).into_iter().filter(|(_, g)| *g).map(|(k, _)| k).collect();
    let Some(meta) = meta else {
        if launch.num_gpu_blocks_is_explicit != launch.num_gpu_blocks_given {
            return Err(ResolveError::Key {
                key: "num_gpu_blocks_is_explicit",
                reason: format!(
                    "{} differs from whether num_gpu_blocks is given, which matters only when a timing \
                     profile's memory facts size the KV cache (--timing-profile NAME); remove it",
                    launch.num_gpu_blocks_is_explicit
                ),
            });
        }
        return match set.first() {
            Some(&key) => Err(ResolveError::Key {
                key,
                reason:
                    "sizes the KV cache from a timing profile's memory facts (--timing-profile NAME, or a \
                         generated profile with meta_json); without one, set num_gpu_blocks"
                        .into(),
            }),
            None => Ok(()),
        };
    };
    let backend = launch.engine.backend;
    let (key, _) = fraction_key(backend);
    if let Some(&other) = set.iter().find(|&&k| k != key && k != "cuda_graph_reserved_bytes") {
        return Err(ResolveError::Key {
            key: other,
            reason: format!("does not apply to the {} backend (it reads {key})", backend_name(backend)),
        });
    }
    if launch.tensor_parallel_size != 1 && launch.tensor_parallel_size != meta.tp {
        return Err(ResolveError::Key {
            key: "tensor_parallel_size",
            reason: format!(
                "{} conflicts with the profile, measured at TP {}",
                launch.tensor_parallel_size, meta.tp
            ),
        });
    }
    launch.tensor_parallel_size = meta.tp;
    if launch.num_gpu_blocks_is_explicit {
        return match set.first() {
            Some(&k) => Err(ResolveError::Key {
                key: k,
                reason: "has no effect when num_gpu_blocks is given; give one or the other".into(),
            }),
            None => Ok(()),
        };
    }
    let (_, fraction) = memory_fraction(launch);
    let reserved = launch.cuda_graph_reserved_bytes.map_or(meta.non_kv_bytes_per_gpu, |b| b as f64);
    let (gpu, weights) = (meta.gpu_memory_bytes, meta.weight_bytes_per_gpu);
    let kv_bytes = match backend {
        Backend::Vllm => gpu * fraction - weights - reserved,
        Backend::Sglang => gpu * fraction - weights,
        Backend::Trtllm => (gpu - weights - reserved) * fraction,
    };
    let block_tokens = launch.engine.block_size as f64;
    let blocks = (kv_bytes / (meta.kv_bytes_per_token_per_gpu * block_tokens)).floor();
    if blocks.is_nan() || blocks < 1.0 {
        return Err(ResolveError::Key {
            key,
            reason: format!(
                "at {fraction} the {:.1} GB GPU has no room for KV cache after {:.1} GB of weights per GPU",
                gpu / 1e9,
                weights / 1e9
            ),
        });
    }
    launch.engine.num_gpu_blocks = blocks.min(f64::from(1u32 << 30)) as usize;
    Ok(())
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Vllm => "vllm",
        Backend::Sglang => "sglang",
        Backend::Trtllm => "trtllm",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tp: usize) -> ProfileMeta {
        ProfileMeta {
            model: "Qwen/Qwen3-32B".into(),
            system: "b300_sxm".into(),
            backend: "vllm".into(),
            tp,
            gpu_memory_bytes: 288e9,
            weight_bytes_per_gpu: 65.5e9 / tp as f64,
            kv_bytes_per_token_per_gpu: 262_144.0 / tp as f64,
            non_kv_bytes_per_gpu: 5e9,
            raw: String::new(),
        }
    }

    #[test]
    fn vllm_sizes_the_cache_from_utilization_weights_and_reserve() {
        let mut l = LaunchConfig::default();
        l.engine.block_size = 16;
        apply(&mut l, Some(&meta(1))).unwrap();
        // (0.9 × 288 GB − 65.5 GB − 5 GB) / (256 KiB × 16 tokens).
        assert_eq!(
            l.engine.num_gpu_blocks,
            ((0.9 * 288e9 - 65.5e9 - 5e9) / (262_144.0f64 * 16.0)).floor() as usize
        );
        let mut given = LaunchConfig { cuda_graph_reserved_bytes: Some(1 << 30), ..Default::default() };
        given.engine.block_size = 16;
        apply(&mut given, Some(&meta(1))).unwrap();
        assert!(given.engine.num_gpu_blocks > l.engine.num_gpu_blocks, "a smaller reserve leaves more KV");
        let mut tight = LaunchConfig { gpu_memory_utilization: Some(0.5), ..Default::default() };
        tight.engine.block_size = 16;
        apply(&mut tight, Some(&meta(1))).unwrap();
        assert!(tight.engine.num_gpu_blocks < l.engine.num_gpu_blocks / 2);
        // Two GPUs: half the weights and half of each token's KV per GPU: more blocks.
        let mut tp2 = LaunchConfig::default();
        tp2.engine.block_size = 16;
        apply(&mut tp2, Some(&meta(2))).unwrap();
        assert!(tp2.engine.num_gpu_blocks > 2 * l.engine.num_gpu_blocks);
        assert_eq!(tp2.tensor_parallel_size, 2);
    }

    #[test]
    fn memory_keys_that_cannot_apply_are_refused() {
        let refuse = |l: &mut LaunchConfig, m: Option<&ProfileMeta>, key: &str| {
            let e = apply(l, m).unwrap_err().to_string();
            assert!(e.starts_with(key), "{e}");
        };
        refuse(
            &mut LaunchConfig { gpu_memory_utilization: Some(0.8), ..Default::default() },
            None,
            "gpu_memory_utilization",
        );
        refuse(
            &mut LaunchConfig { num_gpu_blocks_is_explicit: true, ..Default::default() },
            None,
            "num_gpu_blocks_is_explicit",
        );
        // Agreeing with whether num_gpu_blocks was given, the key changes nothing: accepted.
        let mut agreed = LaunchConfig {
            num_gpu_blocks_is_explicit: true,
            num_gpu_blocks_given: true,
            ..Default::default()
        };
        apply(&mut agreed, None).unwrap();
        refuse(
            &mut LaunchConfig { mem_fraction_static: Some(0.8), ..Default::default() },
            Some(&meta(1)),
            "mem_fraction_static",
        );
        refuse(
            &mut LaunchConfig {
                gpu_memory_utilization: Some(0.8),
                num_gpu_blocks_is_explicit: true,
                ..Default::default()
            },
            Some(&meta(1)),
            "gpu_memory_utilization",
        );
        refuse(
            &mut LaunchConfig { tensor_parallel_size: 4, ..Default::default() },
            Some(&meta(2)),
            "tensor_parallel_size",
        );
        refuse(
            &mut LaunchConfig { gpu_memory_utilization: Some(0.2), ..Default::default() },
            Some(&meta(1)),
            "gpu_memory_utilization",
        );
        // Nothing given and no profile: nothing to do.
        apply(&mut LaunchConfig::default(), None).unwrap();
    }
}
