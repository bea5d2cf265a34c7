//! Prices a model's operations on a GPU and folds them into the core's [`ArchTiming`].
//!
//! Each operation's time is read from the measured tables of the GPU's system
//! ([`OpTables`]). A GPU without tables borrows a close part's and scales each operation
//! by the ratio of the two parts' roofline times for that operation's FLOPs and bytes
//! (`docs/timing.md` has the formulas); a precision without a table is scaled the same way
//! from the bf16 one.

use mocker_core::timing::{ArchTiming, Curve, Grid, GridError};

use crate::arch::{ModelArch, Precision};
use crate::gpu::GpuSpec;
use crate::memory::Placement;
use crate::ops::{ContextAttention, GenerationAttention, OpTables};

/// Elements each token reads and writes in one fused residual-add + RMSNorm, in
/// residual widths (AIConfigurator's `add_norm`; two per layer).
const ADD_NORM_ELEMENTS: f64 = 4.0;
/// Elements each token reads and writes in the gated activation, in MLP widths (two in,
/// one out: AIConfigurator's `act_gate`).
const ACTIVATION_ELEMENTS: f64 = 3.0;
/// Fraction of peak memory bandwidth elementwise kernels reach (AIConfigurator's figure).
const ELEMENTWISE_BW_FRACTION: f64 = 0.8;
/// Fixed cost of one small kernel, ms (AIConfigurator's 3 µs).
const KERNEL_LATENCY_MS: f64 = 0.003;

/// Token-count axis of the folded curves: 1, 2, 3, 4, 6, 8, 12, ... (steps of 1.5x and 4/3x).
fn token_axis(max: f64) -> Vec<f64> {
    let mut xs = vec![1.0];
    let mut p = 2.0;
    while p <= max {
        xs.push(p);
        if p * 1.5 < max {
            xs.push(p * 1.5);
        }
        p *= 2.0;
    }
    xs
}

/// ms of one layer's token-proportional operations at some token count, on one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerOps {
    /// Query/key/value projection (MLA: the query and latent projections).
    pub qkv_proj: f64,
    /// Attention output projection.
    pub o_proj: f64,
    /// Dense MLP gate and up projections (one GEMM).
    pub mlp_gate_up: f64,
    /// Dense MLP down projection.
    pub mlp_down: f64,
    /// A MoE layer's router, experts and shared experts (0 for dense models).
    pub moe: f64,
    /// The two residual-add + RMSNorm kernels.
    pub elementwise: f64,
    /// The dense MLP's gated activation (SiLU and multiply).
    pub activation: f64,
    /// One all-reduce of the layer's hidden states (two per layer; 0 at TP 1).
    pub allreduce: f64,
    /// A recurrent layer's mixer in place of the attention projections (0 without one):
    /// its projections and recurrence.
    pub recurrent: f64,
}

/// A model placed on GPUs, with the tables that time its operations.
pub struct Pricer<'a> {
    model: &'a ModelArch,
    gpu: &'a GpuSpec,
    ops: &'a OpTables,
    place: Placement,
    /// Whether `ops` were measured on `gpu` itself (no scaling).
    native: bool,
}

impl<'a> Pricer<'a> {
    /// Prices `model` placed as `place` on `gpu`, timed by `ops` (its own or a proxy's).
    pub fn new(model: &'a ModelArch, gpu: &'a GpuSpec, ops: &'a OpTables, place: Placement) -> Self {
        let native = gpu.aic_system.as_deref() == Some(ops.system.as_str());
        Self { model, gpu, ops, place, native }
    }

    fn src_flops(&self, p: Precision) -> f64 {
        let f = &self.ops.gpu.flops;
        let bf16 = f.get("bf16").copied().unwrap_or(1e14);
        match p {
            Precision::Fp8 => f.get("fp8").copied().unwrap_or(bf16),
            _ => bf16,
        }
    }

    /// Scales a time measured at `src_p` on the tables' GPU to `dst_p` on the target GPU by
    /// the ratio of roofline times (`bytes_at(p)`: the operation's bytes at precision p).
    fn scale(
        &self,
        t: f64,
        flops: f64,
        bytes_at: impl Fn(Precision) -> f64,
        src_p: Precision,
        dst_p: Precision,
    ) -> f64 {
        if self.native && src_p == dst_p {
            return t;
        }
        let src = (flops / self.src_flops(src_p)).max(bytes_at(src_p) / self.ops.gpu.mem_bw);
        let dst = (flops / self.gpu.peak_flops(dst_p)).max(bytes_at(dst_p) / self.gpu.memory_bandwidth);
        if src > 0.0 {
            t * dst / src
        } else {
            t
        }
    }

    /// ms of `[m, k] · [k, n]` with weights at precision `p`.
    pub fn gemm(&self, m: f64, n: f64, k: f64, p: Precision) -> f64 {
        let (table, table_p) = match (p, self.ops.gemm.get("fp8")) {
            (Precision::Fp8, Some(t)) => (t, Precision::Fp8),
            _ => (&self.ops.gemm["bf16"], Precision::Bf16),
        };
        let t = table.at(m, n, k);
        let bytes = |q: Precision| (m * k + m * n) * 2.0 + k * n * q.bytes();
        self.scale(t, 2.0 * m * n * k, bytes, table_p, p)
    }

    /// Query heads, KV heads and head size one GPU's attention works with.
    fn heads(&self) -> (f64, f64, f64) {
        let m = self.model;
        let heads = (m.num_heads as f64 / self.place.tp as f64).max(1.0);
        match &m.mla {
            // Latent attention reads one (kv_lora + rope)-wide latent per token, like
            // that many key+value elements; its queries are nope + rope wide.
            Some(mla) => {
                let d = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) as f64;
                (heads, m.kv_elements_per_token_layer() as f64 / (2.0 * d), d)
            }
            None => (heads, self.place.kv_heads_per_gpu(m) as f64, m.head_dim as f64),
        }
    }

    fn kv_table<T>(&self, tables: &'a std::collections::BTreeMap<String, Vec<T>>) -> (&'a [T], Precision) {
        match (self.place.kv, tables.get("fp8")) {
            (Precision::Fp8, Some(t)) if !t.is_empty() => (t, Precision::Fp8),
            _ => (&tables["bf16"], Precision::Bf16),
        }
    }

    fn nearest<T>(list: &[T], want: (f64, f64, f64), key: impl Fn(&T) -> (f64, f64, f64)) -> &T {
        let dist = |t: &T| {
            let (h, kv, d) = key(t);
            (want.0 / h).ln().abs() + (want.1 / kv).ln().abs() + 2.0 * (want.2 / d).ln().abs()
        };
        list.iter().min_by(|a, b| dist(a).total_cmp(&dist(b))).expect("checked non-empty")
    }

    /// ms of one layer's context attention: `batch` requests of `new` tokens after `prefix`.
    pub fn context_attention(&self, batch: f64, new: f64, prefix: f64) -> f64 {
        let (h, kv, d) = self.heads();
        let (list, table_p) = self.kv_table(&self.ops.context_attention);
        let cfg: &ContextAttention = Self::nearest(list, (h, kv, d), |c| (c.heads, c.kv_heads, c.head_dim));
        // Compute-bound: in proportion to query heads x head size. AIConfigurator scales a
        // prefix's saving over the kernel's fixed cost too, which can price a short chunk
        // after a prefix below the same chunk alone; more keys never cost less.
        let measured = cfg.at(batch, new, prefix).max(cfg.at(batch, new, 0.0));
        let t = measured * (h * d) / (cfg.heads * cfg.head_dim);
        let flops = 4.0 * batch * new * (prefix + new / 2.0) * h * d;
        let bytes = |q: Precision| batch * (new + prefix) * 2.0 * kv * d * q.bytes();
        self.scale(t, flops, bytes, table_p, self.place.kv)
    }

    /// ms of one layer's decode attention: `batch` requests attending to `context` tokens.
    pub fn generation_attention(&self, batch: f64, context: f64) -> f64 {
        let (h, kv, d) = self.heads();
        let (list, table_p) = self.kv_table(&self.ops.generation_attention);
        let cfg: &GenerationAttention =
            Self::nearest(list, (h, kv, d), |c| (c.heads, c.kv_heads, c.head_dim));
        // Memory-bound: in proportion to the KV bytes read.
        let t = cfg.at(batch, context) * (kv * d) / (cfg.kv_heads * cfg.head_dim);
        let flops = 4.0 * batch * context * h * d;
        let bytes = |q: Precision| batch * context * 2.0 * kv * d * q.bytes();
        self.scale(t, flops, bytes, table_p, self.place.kv)
    }

    /// ms to all-reduce `elements` bf16 values across the tensor-parallel group.
    pub fn allreduce(&self, elements: f64) -> f64 {
        let tp = self.place.tp as f64;
        if self.place.tp <= 1 {
            return 0.0;
        }
        let link = |bw: f64, lat: f64| lat + 2.0 * (tp - 1.0) / tp * elements * 2.0 / bw;
        let src_link = link(self.ops.gpu.intra_node_bw, 1e-5);
        let dst_link = link(self.gpu.interconnect.bandwidth, self.gpu.interconnect.latency_s.max(1e-6));
        match self.ops.allreduce.get("bf16") {
            Some(a) => {
                let measured = a.at(tp.min(*a.tp.last().unwrap_or(&8.0)), elements);
                if self.native && self.place.tp <= 8 {
                    measured
                } else {
                    measured * dst_link / src_link
                }
            }
            None => dst_link * 1e3,
        }
    }

    /// ms of the dense gated MLP of intermediate size `inter` (whole model) for `t` tokens.
    fn mlp(&self, t: f64, inter: f64, p: Precision) -> f64 {
        let h = self.model.hidden_size as f64;
        let i = inter / self.place.tp as f64;
        self.gemm(t, 2.0 * i, h, p) + self.gemm(t, h, i, p)
    }

    /// ms of one MoE layer's experts (router, routed and shared) for `t` tokens.
    pub fn moe(&self, t: f64) -> f64 {
        let m = self.model;
        let Some(moe) = &m.moe else { return 0.0 };
        let h = m.hidden_size as f64;
        let (e, k) = (moe.experts as f64, moe.top_k as f64);
        let p = self.place.experts;
        let tp = self.place.tp as f64;
        let router = self.gemm(t, e, h, self.place.weights);
        let shared = if moe.shared_intermediate_size > 0 {
            self.mlp(t, moe.shared_intermediate_size as f64, self.place.weights)
        } else {
            0.0
        };
        let (local_experts, inter) = if self.place.expert_parallel {
            (e / tp, moe.intermediate_size as f64)
        } else {
            (e, moe.intermediate_size as f64 / tp)
        };
        let measured = self.ops.moe.get("bf16").and_then(|list| {
            list.iter().find(|x| {
                !self.place.expert_parallel
                    && x.hidden == m.hidden_size
                    && x.inter == moe.intermediate_size
                    && x.experts == moe.experts
                    && x.topk == moe.top_k
                    && x.moe_tp == self.place.tp
                    && x.moe_ep == 1
            })
        });
        // Experts a pass of t tokens touches (each picks k of e at random) and the tokens
        // each touched expert computes.
        let touched_share = 1.0 - (1.0 - k / e).powf(t);
        let touched = local_experts * touched_share;
        let per_expert = (t * k / e) / touched_share;
        let flops = 2.0 * 3.0 * t * k * h * inter * if self.place.expert_parallel { 1.0 / tp } else { 1.0 };
        let bytes = |q: Precision| touched * 3.0 * h * inter * q.bytes() + t * k * h * 2.0 * 2.0;
        let experts = match measured {
            Some(table) => self.scale(table.at(t), flops, bytes, Precision::Bf16, p),
            None => {
                let floor = self.gemm(1.0, 128.0, 128.0, p);
                let one = self.gemm(per_expert, 2.0 * inter, h, p) + self.gemm(per_expert, h, inter, p);
                touched * (one - 2.0 * floor).max(0.0) + 2.0 * floor
            }
        };
        // Expert parallelism sends each token's hidden state to its experts' GPUs and back.
        let exchange = if self.place.expert_parallel { 2.0 * self.allreduce(t * h) } else { 0.0 };
        router + shared + experts + exchange
    }

    /// ms of each token-proportional operation of one layer for `t` tokens.
    pub fn layer_ops(&self, t: f64) -> LayerOps {
        let m = self.model;
        let h = m.hidden_size as f64;
        let (heads, kv, d) = self.heads();
        let p = self.place.weights;
        let (qkv_proj, o_proj) = match &m.mla {
            Some(mla) => {
                let q_lora = mla.q_lora_rank as f64;
                let latent = (mla.kv_lora_rank + mla.qk_rope_head_dim) as f64;
                let q = if q_lora > 0.0 {
                    self.gemm(t, q_lora + latent, h, p) + self.gemm(t, heads * d, q_lora, p)
                } else {
                    self.gemm(t, heads * d + latent, h, p)
                };
                let kv_b = self.gemm(
                    t,
                    heads * (mla.qk_nope_head_dim + mla.v_head_dim) as f64,
                    mla.kv_lora_rank as f64,
                    p,
                );
                (q + kv_b, self.gemm(t, h, heads * mla.v_head_dim as f64, p))
            }
            None => {
                // A gated attention (Qwen3-Next) projects a gate beside each query.
                let q = if m.attention_output_gate { 2.0 * heads } else { heads };
                (self.gemm(t, (q + 2.0 * kv) * d, h, p), self.gemm(t, h, heads * d, p))
            }
        };
        let i = m.intermediate_size as f64 / self.place.tp as f64;
        LayerOps {
            qkv_proj,
            o_proj,
            mlp_gate_up: self.gemm(t, 2.0 * i, h, p),
            mlp_down: self.gemm(t, h, i, p),
            moe: self.moe(t),
            elementwise: 2.0 * self.memory_op(t * ADD_NORM_ELEMENTS * h * 2.0),
            activation: self.memory_op(t * ACTIVATION_ELEMENTS * i * 2.0),
            allreduce: self.allreduce(t * h),
            recurrent: self.recurrent_layer(t),
        }
    }

    /// ms of one recurrent layer's mixer for `t` tokens (0 without one): its input and
    /// output projections and the recurrence, compute-bound at the roofline (the state
    /// traffic is a sequence's, priced with the logits).
    pub fn recurrent_layer(&self, t: f64) -> f64 {
        let m = self.model;
        let Some(r) = &m.recurrent else { return 0.0 };
        let h = m.hidden_size as f64;
        let p = self.place.weights;
        let (inp, out) = r.projection_widths(self.place.tp);
        let scan =
            t * r.recurrence_flops_per_token(self.place.tp) / self.gpu.peak_flops(Precision::Bf16) * 1e3;
        self.gemm(t, inp as f64, h, p) + self.gemm(t, h, out as f64, p) + scan + KERNEL_LATENCY_MS
    }

    /// ms of the token-proportional work of a whole pass of `t` tokens.
    pub fn linear(&self, t: f64) -> f64 {
        let m = self.model;
        let h = m.hidden_size as f64;
        let ops = self.layer_ops(t);
        let attention = m.attention_layers() as f64 * (ops.qkv_proj + ops.o_proj);
        let recurrent = m.recurrent_layers() as f64 * ops.recurrent;
        let every_layer = ops.elementwise + 2.0 * ops.allreduce;
        let dense = m.dense_mlp_layers() as f64 * (ops.mlp_gate_up + ops.activation + ops.mlp_down);
        let moe = m.moe_layers() as f64 * ops.moe;
        // The embedding gathers a row a token; vocabulary-parallel, it ends in an all-reduce.
        let embedding = self.memory_op(t * h * 2.0) + self.allreduce(t * h);
        m.num_layers as f64 * every_layer + attention + recurrent + dense + moe + embedding
    }

    /// ms of a memory-bound kernel moving `bytes`, as AIConfigurator prices one.
    fn memory_op(&self, bytes: f64) -> f64 {
        bytes / (self.gpu.memory_bandwidth * ELEMENTWISE_BW_FRACTION) * 1e3 + KERNEL_LATENCY_MS
    }

    /// ms of the per-sequence work of a pass of `s` sequences: the LM head and sampling, and
    /// a hybrid model's recurrent states read and written.
    pub fn logits(&self, s: f64) -> f64 {
        let m = self.model;
        let v = m.vocab_size as f64 / self.place.tp as f64;
        let head = self.gemm(s, v, m.hidden_size as f64, self.place.weights);
        // Gathering the vocabulary shards, then softmax and sampling over fp32 logits.
        let gather = if self.place.tp > 1 { self.allreduce(s * v / 2.0) } else { 0.0 };
        let sample =
            s * m.vocab_size as f64 * 4.0 * 3.0 / (self.gpu.memory_bandwidth * ELEMENTWISE_BW_FRACTION) * 1e3
                + 2.0 * KERNEL_LATENCY_MS;
        // A recurrent layer reads and writes each sequence's state once a pass.
        let states = match &m.recurrent {
            Some(r) => {
                let bytes = 2.0 * s * r.layers as f64 * r.state_bytes_per_layer_per_gpu(self.place.tp) as f64;
                bytes / (self.gpu.memory_bandwidth * ELEMENTWISE_BW_FRACTION) * 1e3
            }
            None => 0.0,
        };
        head + gather + sample + states
    }

    /// Context attention of all layers: full layers see every token, sliding ones their window.
    fn all_context_attention(&self, batch: f64, new: f64, prefix: f64) -> f64 {
        let m = self.model;
        let full = (m.attention_layers() - m.sliding_layers) as f64;
        let mut t = full * self.context_attention(batch, new, prefix);
        if let (Some(w), n) = (m.sliding_window, m.sliding_layers) {
            if n > 0 {
                let w = w as f64;
                let chunk = new.min(w);
                let within = self.context_attention(batch, chunk, prefix.min(w)) * new / chunk;
                t += n as f64 * within;
            }
        }
        t
    }

    fn all_generation_attention(&self, batch: f64, context: f64) -> f64 {
        let m = self.model;
        let full = (m.attention_layers() - m.sliding_layers) as f64;
        let mut t = full * self.generation_attention(batch, context);
        if let (Some(w), n) = (m.sliding_window, m.sliding_layers) {
            if n > 0 {
                t += n as f64 * self.generation_attention(batch, context.min(w as f64));
            }
        }
        t
    }

    /// Folds the operations into the core's curves.
    pub fn fold(&self, label: String, pass_overhead_ms: f64) -> Result<ArchTiming, GridError> {
        let tokens = token_axis(131072.0);
        let linear = tokens.iter().map(|&t| self.linear(t)).collect();
        let seqs = token_axis(16384.0);
        let logits = seqs.iter().map(|&s| self.logits(s)).collect();
        let batch: Vec<f64> = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0].to_vec();
        let new: Vec<f64> =
            [1.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0]
                .to_vec();
        let prefix: Vec<f64> = [0.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 131072.0].to_vec();
        let mut prefill = Vec::with_capacity(batch.len() * new.len() * prefix.len());
        for &b in &batch {
            for &n in &new {
                for &p in &prefix {
                    prefill.push(self.all_context_attention(b, n, p));
                }
            }
        }
        let dbatch: Vec<f64> = (0..12).map(|i| f64::from(1u32 << i)).collect();
        let context: Vec<f64> = [
            1.0, 16.0, 64.0, 256.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0,
            262144.0,
        ]
        .to_vec();
        let mut decode = Vec::with_capacity(dbatch.len() * context.len());
        for &b in &dbatch {
            for &c in &context {
                decode.push(self.all_generation_attention(b, c));
            }
        }
        Ok(ArchTiming {
            label,
            linear: Curve::new("linear", tokens, linear)?,
            logits: Curve::new("logits", seqs, logits)?,
            prefill_attention: Grid::new("prefill_attention", vec![batch, new, prefix], prefill)?,
            decode_attention: Grid::new("decode_attention", vec![dbatch, context], decode)?,
            pass_overhead_ms,
        })
    }
}
