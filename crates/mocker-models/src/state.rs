//! Recurrent state caches from a model's architecture: a hybrid whose other layers keep a
//! fixed-size state a request (Qwen3-Next's gated delta net, Nemotron-H's Mamba2) gets the
//! reference's `state_cache` (docs/hybrid-kv.md §2), sized as vLLM sizes it.
//!
//! vLLM pages such a model in one block pool: an attention layer's page holds `block_size`
//! tokens, a recurrent layer's page holds one request's state, and vLLM raises the
//! attention block size until the two pages are equal (`HybridAttentionMambaModelConfig`:
//! `16 × ceil(state page / (16 × attention bytes a token))`, the state page padded up to
//! it). A block of the pool is then one page of every attention layer, and a request's
//! state costs one page of every recurrent layer. That is the reference's state cache:
//! blocks of `block_size × kv_cache_bytes_per_token` bytes (attention layers only) from
//! the memory budget, and a state of `ceil(bytes_per_request / block bytes)` blocks from the
//! same `num_gpu_blocks`, `bytes_per_request` being the padded pages (for Qwen3-Next: 36
//! recurrent layers over 12 attention layers, 3 blocks a request at any block size).

use mocker_core::config::{Backend, KvTransferTimingMode, LaunchConfig, StateCacheConfig, WorkerType};

use crate::arch::{Mixer, ModelArch};
use crate::memory::Placement;
use crate::{err, ModelError};

/// A hybrid model's recurrent state as the engine keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StateLayout {
    /// Full-attention layers (their KV is the per-token cost).
    pub attention_layers: usize,
    /// Layers with a recurrent state.
    pub recurrent_layers: usize,
    /// The recurrent mixer's name (`gated delta net`, `Mamba2`).
    pub mixer: &'static str,
    /// Bytes of one request's state on each GPU: every recurrent layer's convolution and
    /// SSM state.
    pub state_bytes: u64,
    /// What vLLM holds for it (`state_cache.bytes_per_request`): each layer's state padded
    /// to a page (`block_size` tokens of one attention layer).
    pub bytes_per_request: u64,
    /// Blocks of the pool one state takes.
    pub state_blocks: usize,
    /// Tokens a block holds.
    pub block_size: usize,
    /// Whether the block size is vLLM's raised one (not given in the engine args).
    pub block_size_derived: bool,
    /// Whether prefix caching runs in align mode (asked for), else it is off.
    pub align_mode: bool,
    /// Whether prefix caching was turned off because it was not asked for.
    pub prefix_caching_off_by_default: bool,
}

impl StateLayout {
    /// One line for the user: what the state costs and how prefix caching runs.
    pub fn describe(&self, model: &str) -> String {
        let why = if self.block_size_derived {
            "vLLM's size for equal attention and state pages"
        } else {
            "block_size"
        };
        let prefix = if self.align_mode {
            "prefix caching in align mode (prefix_match_unit = block_size), as vLLM's mamba_cache_mode align"
        } else if self.prefix_caching_off_by_default {
            "prefix caching off, as vLLM's default for hybrid models (enable_prefix_caching true asks for align mode)"
        } else {
            "prefix caching off"
        };
        format!(
            "{model}: recurrent state from the model: {} {} layers keep {} bytes a request on each GPU ({} in \
             vLLM's pages), {} of the pool's {}-token blocks ({why}); {} full-attention layers page the tokens; \
             {prefix}",
            self.recurrent_layers,
            self.mixer,
            self.state_bytes,
            self.bytes_per_request,
            self.state_blocks,
            self.block_size,
            self.attention_layers,
        )
    }
}

/// The attention block size vLLM picks so an attention layer's page (`block_size` tokens)
/// holds at least one recurrent layer's state: a multiple of 16 tokens.
pub fn vllm_block_size(m: &ModelArch, place: &Placement) -> Option<usize> {
    let r = m.recurrent.as_ref()?;
    let state = r.state_bytes_per_layer_per_gpu(place.tp) as f64;
    let token = attention_bytes_per_token_layer(m, place);
    Some(16 * (state / (16.0 * token)).ceil().max(1.0) as usize)
}

fn attention_bytes_per_token_layer(m: &ModelArch, place: &Placement) -> f64 {
    (2 * place.kv_heads_per_gpu(m) * m.head_dim) as f64 * place.kv.bytes()
}

/// Refuses what a recurrent state cannot run with, naming the key, and sets vLLM's block
/// size before the pool is sized from memory. Nothing for a model without recurrent layers.
pub fn prepare(
    m: &ModelArch,
    place: &Placement,
    launch: &mut LaunchConfig,
    model: &str,
) -> Result<(), ModelError> {
    let Some(r) = &m.recurrent else { return Ok(()) };
    let refuse = |key: &'static str, why: String| Err(err(key, format!("{model}: {why}")));
    for (name, heads) in r.split_heads() {
        if !heads.is_multiple_of(place.tp) {
            return refuse(
                "tensor_parallel_size",
                format!("{} does not divide the model's {heads} {name} (vLLM splits them)", place.tp),
            );
        }
    }
    if m.attention_layers() == 0 {
        return refuse("model", "has no attention layer to page tokens in".into());
    }
    let e = &launch.engine;
    let why = "its recurrent layers keep a state a request, which mocker models as the reference's \
               state_cache";
    if launch.hardware.disable_hybrid_kv_cache_manager {
        return refuse(
            "disable_hybrid_kv_cache_manager",
            "its recurrent layers need vLLM's hybrid KV cache manager (vLLM refuses to disable it for them)"
                .into(),
        );
    }
    if e.has_kv_cache_groups() {
        return refuse("kv_cache_groups", format!("{why}; the model derives it, so give no cache groups"));
    }
    if e.state_cache.is_some() {
        let derived = place.state_bytes_per_request_per_gpu(m).unwrap_or(0);
        return refuse(
            "state_cache",
            format!("derives its state ({derived} bytes a request on each GPU) from config.json; leave state_cache out"),
        );
    }
    if e.backend != Backend::Vllm {
        return refuse("backend", format!("{why}, which runs on backend=vllm only"));
    }
    if e.worker_type != WorkerType::Aggregated {
        return refuse("worker_type", format!("{why}, which runs on aggregated workers only"));
    }
    if e.native_host_offload.is_some() {
        return refuse("native_host_offload", format!("{why}, which has no host tier"));
    }
    if e.kv_transfer_bandwidth.is_some() {
        return refuse("kv_transfer_bandwidth", format!("{why}, which models no KV transfer"));
    }
    if e.kv_transfer_bytes_per_token.is_some() {
        return refuse("kv_transfer_bytes_per_token", format!("{why}, which models no KV transfer"));
    }
    if e.kv_transfer_timing_mode != KvTransferTimingMode::FullPrompt {
        return refuse("kv_transfer_timing_mode", format!("{why}, which models no KV transfer"));
    }
    let align = e.enable_prefix_caching && launch.given_keys.enable_prefix_caching;
    if align && e.emit_kv_events {
        return refuse(
            "emit_kv_events",
            "with enable_prefix_caching its state runs in align mode (prefix_match_unit), which exports no KV \
             events (emit_kv_events, which a server's KV events endpoint turns on); turn one of them off"
                .into(),
        );
    }
    if align && e.aic_nextn.is_some() {
        return refuse(
            "aic_nextn",
            "with enable_prefix_caching its state runs in align mode (prefix_match_unit), which does not \
             model speculative decoding; turn one of them off"
                .into(),
        );
    }
    let need = vllm_block_size(m, place).expect("recurrent");
    if launch.given_keys.block_size {
        if e.block_size < need {
            return refuse(
                "block_size",
                format!(
                    "{} tokens of attention a block hold less than one layer's state; vLLM raises it to {need} \
                     (give at least {need}, or leave block_size out)",
                    e.block_size
                ),
            );
        }
    } else {
        launch.engine.block_size = need;
    }
    Ok(())
}

/// Gives `launch` the model's state cache, once its pool is sized (`prepare` ran first);
/// `None` for a model without recurrent layers.
pub fn apply(
    m: &ModelArch,
    place: &Placement,
    launch: &mut LaunchConfig,
    model: &str,
) -> Result<Option<StateLayout>, ModelError> {
    let Some(r) = &m.recurrent else { return Ok(None) };
    let state_bytes = place.state_bytes_per_request_per_gpu(m).expect("recurrent");
    // vLLM pads each layer's state to the attention page, and holds the padded pages.
    let token = attention_bytes_per_token_layer(m, place);
    let page = (token * launch.engine.block_size as f64).ceil() as u64;
    let bytes_per_request = r.layers as u64 * page.max(r.state_bytes_per_layer_per_gpu(place.tp));
    // Whole bytes: the attention layers' KV a token on each GPU.
    let per_token = (token * m.attention_layers() as f64).ceil() as u64;
    let given_pc = launch.given_keys.enable_prefix_caching;
    let block_size_derived = !launch.given_keys.block_size;
    let e = &mut launch.engine;
    let align_mode = e.enable_prefix_caching && given_pc;
    let prefix_caching_off_by_default = !given_pc && e.enable_prefix_caching;
    e.enable_prefix_caching = align_mode;
    e.prefix_match_unit = align_mode.then_some(e.block_size);
    e.kv_cache_bytes_per_token = Some(per_token);
    e.state_cache = Some(StateCacheConfig { bytes_per_request });
    let state_blocks = e.state_blocks().expect("state cache set");
    if e.num_gpu_blocks < state_blocks + 1 {
        return Err(err(
            "num_gpu_blocks",
            format!(
                "{model}: {} blocks cannot hold one token block and one {state_blocks}-block recurrent state",
                e.num_gpu_blocks
            ),
        ));
    }
    Ok(Some(StateLayout {
        attention_layers: m.attention_layers(),
        recurrent_layers: r.layers,
        mixer: match r.mixer {
            Mixer::GatedDeltaNet { .. } => "gated delta net",
            Mixer::Mamba2 { .. } => "Mamba2",
        },
        state_bytes,
        bytes_per_request,
        state_blocks,
        block_size: e.block_size,
        block_size_derived,
        align_mode,
        prefix_caching_off_by_default,
    }))
}

#[cfg(test)]
mod tests {
    use mocker_core::config::LaunchConfig;
    use serde_json::json;

    use crate::resolve_launch;

    #[test]
    fn a_mamba2_hybrid_gets_its_state_cache_as_vllm_pages_it() {
        let dir = std::env::temp_dir().join(format!("mocker-state-nemotron-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = json!({"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
            "hidden_size": 4480, "num_hidden_layers": 8, "num_attention_heads": 40, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 15680, "vocab_size": 131072,
            "hybrid_override_pattern": "M-M*M-M-", "mamba_num_heads": 128, "mamba_head_dim": 80,
            "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "torch_dtype": "bfloat16"});
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let mut launch =
            LaunchConfig::from_value(json!({"engine": {}, "model": dir.to_str().unwrap(), "gpu": "h100"}))
                .unwrap();
        let r = resolve_launch(&mut launch).unwrap().unwrap();
        let s = r.state.expect("a state cache");
        // A layer's state: 36,864 x 2 bytes of convolution and 1,310,720 x 4 of SSM (float32,
        // vLLM's default for Nemotron-H); an attention layer's token: 2 x 8 heads x 128 x 2
        // bytes = 4096. vLLM: 16 x ceil(5,316,608 / (16 x 4096)) = 1312.
        assert_eq!((s.recurrent_layers, s.attention_layers, s.state_bytes), (4, 1, 4 * 5_316_608));
        assert_eq!((s.block_size, s.state_blocks, s.mixer), (1312, 4, "Mamba2"));
        let e = &launch.engine;
        assert_eq!((e.block_size, e.kv_cache_bytes_per_token), (1312, Some(4096)));
        assert!(
            !e.enable_prefix_caching
                && e.prefix_match_unit.is_none()
                && e.kv_transfer_bytes_per_token.is_none()
        );
        assert!(launch.validate().is_ok(), "the derived state cache passes the reference's rules");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_fp8_kv_cache_doubles_the_block_and_leaves_the_state_in_the_model_dtype() {
        let resolve = |kv: Option<&str>| {
            let mut args = json!({"engine": {}, "model": "Qwen/Qwen3-Next-80B-A3B-Instruct", "gpu": "h100",
                "tensor_parallel_size": 4});
            if let Some(kv) = kv {
                args["kv_cache_dtype"] = json!(kv);
            }
            let mut launch = LaunchConfig::from_value(args).unwrap();
            let s = resolve_launch(&mut launch).unwrap().unwrap().state.unwrap();
            (s, launch.engine.kv_cache_bytes_per_token.unwrap())
        };
        let (bf16, bf16_token) = resolve(None);
        let (fp8, fp8_token) = resolve(Some("fp8"));
        // vLLM's mamba_cache_dtype follows the model, not --kv-cache-dtype.
        assert_eq!((bf16.state_bytes, fp8.state_bytes), (9_879_552, 9_879_552));
        // Half the bytes an attention token: twice the tokens a page of the same state.
        assert_eq!((bf16_token, fp8_token), (12_288, 6_144));
        assert_eq!((bf16.block_size, fp8.block_size), (272, 544));
        assert_eq!((bf16.state_blocks, fp8.state_blocks), (3, 3));
        assert!(bf16.prefix_caching_off_by_default && !bf16.align_mode);
    }
}
