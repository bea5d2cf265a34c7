//! Memory of a model on a tensor-parallel group, and the KV cache vLLM sizes from it.
//!
//! vLLM profiles one dummy pass of `max_num_batched_tokens` tokens, then gives the KV cache
//! what `gpu_memory_utilization` of the GPU leaves after the weights, that pass's peak
//! activations and the memory outside PyTorch (CUDA context, cuBLAS workspace, CUDA graphs,
//! NCCL buffers). Every GPU holds its shard of every block, so blocks per GPU are blocks
//! per engine.

use crate::arch::{ModelArch, Precision};

/// Memory outside the weights, activations and KV cache: CUDA context, cuBLAS workspace
/// and CUDA graphs (about what vLLM reports for 8-70B models).
pub const RUNTIME_RESERVE_BYTES: f64 = 1.0 * GIB;
/// NCCL's buffers on each GPU of a tensor-parallel group (AIConfigurator's figure).
pub const NCCL_RESERVE_BYTES: f64 = 0.4 * GIB;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// How a model is laid out on its GPUs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    /// Tensor-parallel GPUs.
    pub tp: usize,
    /// Whether experts are spread across the GPUs whole (vLLM `--enable-expert-parallel`).
    pub expert_parallel: bool,
    /// Precision of dense weights.
    pub weights: Precision,
    /// Precision of expert weights.
    pub experts: Precision,
    /// Precision of the KV cache.
    pub kv: Precision,
}

impl Placement {
    /// Key/value heads each GPU holds: sharded by TP, replicated once TP exceeds them.
    pub fn kv_heads_per_gpu(&self, m: &ModelArch) -> usize {
        (m.num_kv_heads / self.tp).max(1)
    }

    /// Bytes of weights on each GPU.
    pub fn weight_bytes_per_gpu(&self, m: &ModelArch) -> f64 {
        let experts = m.expert_params_per_layer() * m.moe_layers() as f64;
        let dense = m.parameters() - experts;
        (dense * self.weights.bytes() + experts * self.experts.bytes()) / self.tp as f64
    }

    /// KV-cache bytes one token costs on each GPU (every attention layer).
    pub fn kv_bytes_per_token_per_gpu(&self, m: &ModelArch) -> f64 {
        let per_layer = match &m.mla {
            // The latent is not split by heads: every GPU caches all of it.
            Some(_) => m.kv_elements_per_token_layer() as f64,
            None => (2 * self.kv_heads_per_gpu(m) * m.head_dim) as f64,
        };
        per_layer * m.attention_layers() as f64 * self.kv.bytes()
    }

    /// Bytes of a request's recurrent state on each GPU: every recurrent layer's
    /// convolution and SSM state (`None` for a model without recurrent layers).
    pub fn state_bytes_per_request_per_gpu(&self, m: &ModelArch) -> Option<u64> {
        m.recurrent.as_ref().map(|r| r.layers as u64 * r.state_bytes_per_layer_per_gpu(self.tp))
    }

    /// Peak activation bytes of vLLM's profiling pass on each GPU: the widest MLP
    /// intermediate and a few residual-width buffers for every token, plus fp32 logits of
    /// every sequence.
    pub fn activation_bytes_per_gpu(&self, m: &ModelArch, max_batched_tokens: usize, max_seqs: usize) -> f64 {
        let mlp = match &m.moe {
            Some(moe) => (moe.top_k * moe.intermediate_size).max(m.intermediate_size),
            None => m.intermediate_size,
        } as f64
            / self.tp as f64;
        let per_token = (3.0 * mlp + 4.0 * m.hidden_size as f64) * 2.0;
        let logits =
            max_seqs.min(max_batched_tokens) as f64 * m.vocab_size as f64 / self.tp as f64 * 4.0 * 2.0;
        max_batched_tokens as f64 * per_token + logits
    }

    /// Memory outside weights, KV and activations on each GPU.
    pub fn runtime_reserve_bytes(&self) -> f64 {
        RUNTIME_RESERVE_BYTES + if self.tp > 1 { NCCL_RESERVE_BYTES } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::parse_config;

    #[test]
    fn kv_heads_replicate_past_the_tensor_parallel_size() {
        let m = parse_config(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":8192,"intermediate_size":28672,
            "num_hidden_layers":80,"num_attention_heads":64,"num_key_value_heads":8,"vocab_size":128256}"#,
        )
        .unwrap();
        let at = |tp| Placement {
            tp,
            expert_parallel: false,
            weights: Precision::Bf16,
            experts: Precision::Bf16,
            kv: Precision::Bf16,
        };
        // 80 layers x 2 x 8 heads x 128 x 2 bytes = 320 KiB a token on one GPU.
        assert_eq!(at(1).kv_bytes_per_token_per_gpu(&m), 327_680.0);
        assert_eq!(at(8).kv_bytes_per_token_per_gpu(&m), 40_960.0);
        assert_eq!(at(16).kv_bytes_per_token_per_gpu(&m), 40_960.0, "one head each, replicated");
        assert!((at(4).weight_bytes_per_gpu(&m) * 4.0 / 1e9 - 141.1).abs() < 0.2);
    }
}
