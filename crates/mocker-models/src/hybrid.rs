//! KV cache groups from a model's architecture: a model whose layers do not all keep the
//! whole history (sliding-window attention: gpt-oss, Gemma 2/3, Mistral's windows) pages
//! them as vLLM's hybrid KV cache manager does: one cache group per kind of layer, sharing
//! the byte budget vLLM would give the KV cache, a sliding layer keeping only its window.
//! mocker's groups follow the reference's (`kv_cache_groups`, docs/hybrid-kv.md), so the
//! derived layout carries their rules; where a run cannot take them the layers are sized
//! as full ones and the caller is told why.

use mocker_core::config::{Backend, CacheGroupKind, KvCacheGroup, LaunchConfig, WorkerType};

use crate::arch::ModelArch;
use crate::memory::Placement;

/// What became of a model's sliding-window layers.
#[derive(Debug, Clone, PartialEq)]
pub enum HybridLayout {
    /// Paged as cache groups sharing `capacity_bytes` a GPU.
    Groups {
        /// Full-attention layers.
        full_layers: usize,
        /// Sliding-window layers.
        sliding_layers: usize,
        /// Their window, tokens.
        window: usize,
        /// The KV budget of each GPU, bytes.
        capacity_bytes: u64,
        /// Whether prefix caching was turned off for them (it was not asked for).
        prefix_caching_off: bool,
    },
    /// Sized as full layers, for this reason (the caller warns).
    Uniform(String),
    /// `disable_hybrid_kv_cache_manager` was given where it changes nothing, for this
    /// reason (the caller warns).
    Inert(String),
}

impl HybridLayout {
    /// One line for the user: what the layout is, or why the layers stay uniform.
    pub fn describe(&self, model: &str) -> String {
        match self {
            Self::Groups { full_layers, sliding_layers, window, capacity_bytes, prefix_caching_off } => {
                format!(
                    "{model}: KV cache groups from the model: {full_layers} full-attention layers and \
                 {sliding_layers} sliding-window layers (window {window}) share {:.2} GB a GPU{}; \
                 --disable-hybrid-kv-cache-manager sizes them all as full layers",
                    *capacity_bytes as f64 / 1e9,
                    if *prefix_caching_off {
                        ", prefix caching off (cache groups do not reuse prefixes)"
                    } else {
                        ""
                    }
                )
            }
            Self::Inert(why) => format!("disable_hybrid_kv_cache_manager changes nothing here: {why}"),
            Self::Uniform(why) => format!(
                "{model}: its sliding-window layers are sized as full-attention layers ({why}), so the KV \
                 cache holds fewer tokens than vLLM's; --disable-hybrid-kv-cache-manager says so on purpose"
            ),
        }
    }
}

/// Pages `m`'s sliding-window layers as cache groups in `launch` (sized by its
/// `num_gpu_blocks` of `kv_per_token`-byte tokens), when the run allows it; `None` for a
/// model without them, or with the hybrid manager disabled.
pub fn apply(
    m: &ModelArch,
    place: &Placement,
    launch: &mut LaunchConfig,
    kv_per_token: f64,
) -> Option<HybridLayout> {
    let disabled = launch.hardware.disable_hybrid_kv_cache_manager;
    let inert = |why: &str| disabled.then(|| HybridLayout::Inert(why.to_string()));
    let Some(window) = m.sliding_window.filter(|_| m.sliding_layers > 0 && m.mla.is_none()) else {
        return inert("the model has no sliding-window layers");
    };
    let e = &launch.engine;
    if e.has_kv_cache_groups() {
        return inert("the engine args give kv_cache_groups"); // the user's own groups
    }
    let blocker = if e.backend != Backend::Vllm {
        Some("cache groups are modelled on the vllm backend")
    } else if e.worker_type != WorkerType::Aggregated {
        Some("cache groups need aggregated workers")
    } else if e.enable_prefix_caching && launch.given_keys.enable_prefix_caching {
        Some("enable_prefix_caching is on, and cache groups do not reuse prefixes")
    } else if e.native_host_offload.is_some() {
        Some("cache groups have no host tier")
    } else if e.aic_nextn.is_some() {
        Some("cache groups do not model speculative decoding")
    } else if e.emit_kv_events || e.emit_kv_token_ids {
        Some("cache groups publish no KV events")
    } else if e.kv_cache_bytes_per_token.is_some() || e.kv_transfer_bytes_per_token.is_some() {
        Some("the engine args give per-token KV bytes")
    } else {
        None
    };
    if let Some(why) = blocker {
        return inert(why).or(Some(HybridLayout::Uniform(why.to_string())));
    }
    if disabled {
        return None; // asked for: the uniform pool, which the capacity line shows
    }
    let bs = launch.engine.block_size;
    let capacity_bytes = (launch.engine.num_gpu_blocks as f64 * bs as f64 * kv_per_token).floor() as u64;
    let per_layer_token = (2 * place.kv_heads_per_gpu(m) * m.head_dim) as f64 * place.kv.bytes();
    let page = |layers: usize| (bs as f64 * per_layer_token * layers as f64).ceil() as u64;
    let full_layers = m.attention_layers() - m.sliding_layers;
    let mut groups = Vec::new();
    if full_layers > 0 {
        groups.push(KvCacheGroup {
            name: "full_attention".into(),
            kind: CacheGroupKind::Attention,
            num_layers: full_layers as u32,
            block_size_tokens: bs as u32,
            page_size_bytes: page(full_layers),
            sliding_window: None,
        });
    }
    groups.push(KvCacheGroup {
        name: "sliding_attention".into(),
        kind: CacheGroupKind::Attention,
        num_layers: m.sliding_layers as u32,
        block_size_tokens: bs as u32,
        page_size_bytes: page(m.sliding_layers),
        sliding_window: Some(window as u32),
    });
    let e = &mut launch.engine;
    let prefix_caching_off = e.enable_prefix_caching;
    e.enable_prefix_caching = false;
    e.kv_cache_groups = groups;
    e.kv_cache_capacity_bytes = Some(capacity_bytes);
    Some(HybridLayout::Groups {
        full_layers,
        sliding_layers: m.sliding_layers,
        window,
        capacity_bytes,
        prefix_caching_off,
    })
}

#[cfg(test)]
mod tests {
    use mocker_core::config::LaunchConfig;
    use serde_json::json;

    use super::HybridLayout;
    use crate::resolve_launch;

    fn resolve(args: serde_json::Value) -> (LaunchConfig, Option<HybridLayout>) {
        let mut launch = LaunchConfig::from_value(args).unwrap();
        let r = resolve_launch(&mut launch).unwrap().unwrap();
        (launch, r.hybrid)
    }

    #[test]
    fn sliding_window_models_page_their_layers_as_groups_in_the_same_budget() {
        for (model, full, sliding, window) in
            [("openai/gpt-oss-120b", 18, 18, 128), ("google/gemma-3-27b-it", 10, 52, 1024)]
        {
            let (uniform, none) =
                resolve(json!({"engine": {}, "model": model, "disable_hybrid_kv_cache_manager": true}));
            assert!(none.is_none() && !uniform.engine.has_kv_cache_groups(), "{model}");
            let (launch, layout) = resolve(json!({"engine": {}, "model": model}));
            let Some(HybridLayout::Groups { full_layers, sliding_layers, window: w, capacity_bytes, .. }) =
                layout
            else {
                panic!("{model}: {layout:?}")
            };
            assert_eq!((full_layers, sliding_layers, w), (full, sliding, window), "{model}");
            let e = &launch.engine;
            assert_eq!(e.kv_cache_capacity_bytes, Some(capacity_bytes));
            assert!(!e.enable_prefix_caching && e.kv_transfer_bytes_per_token.is_none());
            // The same bytes vLLM gives the cache: the uniform pool's blocks of whole tokens.
            let uniform_bytes = uniform.engine.num_gpu_blocks as f64
                * uniform.engine.block_size as f64
                * (e.kv_cache_groups.iter().map(|g| g.page_size_bytes).sum::<u64>() as f64
                    / e.block_size as f64);
            assert!((capacity_bytes as f64 - uniform_bytes).abs() / uniform_bytes < 1e-6, "{model}");
            // Pages per layer kind: the sliding group's keeps only its window.
            let page_per_layer: Vec<u64> =
                e.kv_cache_groups.iter().map(|g| g.page_size_bytes / u64::from(g.num_layers)).collect();
            assert_eq!(page_per_layer[0], page_per_layer[1]);
            assert_eq!(e.kv_cache_groups[1].sliding_window, Some(window as u32));
            assert!(launch.validate().is_ok(), "{model}: derived groups pass the reference's rules");
            assert!(e.max_model_len > uniform.engine.max_model_len, "{model}: a longer context fits");
        }
    }

    #[test]
    fn runs_the_groups_cannot_serve_keep_uniform_layers_and_say_why() {
        let cases = [
            (
                json!({"engine": {"enable_prefix_caching": true}, "model": "openai/gpt-oss-20b"}),
                "enable_prefix_caching",
            ),
            (json!({"engine": {"backend": "sglang"}, "model": "openai/gpt-oss-20b"}), "vllm"),
            (json!({"engine": {"worker_type": "prefill"}, "model": "openai/gpt-oss-20b"}), "aggregated"),
            (json!({"engine": {"aic_nextn": 2}, "model": "openai/gpt-oss-20b"}), "speculative"),
        ];
        for (args, needle) in cases {
            let (launch, layout) = resolve(args.clone());
            match layout {
                Some(HybridLayout::Uniform(why)) => assert!(why.contains(needle), "{args}: {why}"),
                other => panic!("{args}: {other:?}"),
            }
            assert!(!launch.engine.has_kv_cache_groups());
        }
        // A model without sliding layers has nothing to page differently.
        assert!(resolve(json!({"engine": {}, "model": "Qwen/Qwen3-8B"})).1.is_none());
    }
}
