//! A model's architecture facts, read from a Hugging Face `config.json`.
//!
//! One reader serves the bundled catalogue and a user's own directory, so a model read
//! from a path equals its catalogue entry. It knows the layouts of the dense decoder
//! families (Llama, Mistral, Qwen2/3, Yi, Gemma 2/3), the MoE ones (Mixtral, Qwen3-MoE,
//! Llama 4, gpt-oss, DeepSeek V2/V3 with MLA), the hybrids whose other layers keep a
//! recurrent state (Qwen3-Next's gated delta net, Nemotron-H's Mamba2) and nested
//! `text_config`s of multimodal wrappers; anything else is refused by name rather than
//! guessed.

use serde_json::{Map, Value};

/// Numeric precision of weights or KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 32-bit float.
    Fp32,
    /// 16-bit (bf16 or fp16).
    Bf16,
    /// 8-bit float or integer.
    Fp8,
    /// 4-bit weights with group scales (AWQ, GPTQ, MXFP4, NVFP4): weight-only on the
    /// matmul side, computed at 16 bits.
    Int4,
}

impl Precision {
    /// Bytes one element takes in memory (4-bit formats with their group scales).
    pub fn bytes(self) -> f64 {
        match self {
            Self::Fp32 => 4.0,
            Self::Bf16 => 2.0,
            Self::Fp8 => 1.0,
            Self::Int4 => 0.5 + 2.0 / 64.0,
        }
    }

    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
            Self::Int4 => "int4",
        }
    }
}

/// The mixture-of-experts part of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Moe {
    /// Routed experts.
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Intermediate size of one routed expert.
    pub intermediate_size: usize,
    /// Intermediate size of the always-on shared expert(s) together (0: none).
    pub shared_intermediate_size: usize,
    /// Layers whose MLP is a mixture of experts; the others are dense.
    pub moe_layers: usize,
    /// Precision of the experts' weights, where it differs from the rest of the model.
    pub expert_precision: Option<Precision>,
}

/// Multi-head latent attention (DeepSeek V2/V3): the KV cache holds one compressed
/// latent per token and layer instead of per-head keys and values.
#[derive(Debug, Clone, PartialEq)]
pub struct Mla {
    /// Rank of the compressed KV latent.
    pub kv_lora_rank: usize,
    /// Rank of the compressed query (0: queries are projected directly).
    pub q_lora_rank: usize,
    /// Per-head query/key size without rotary embedding.
    pub qk_nope_head_dim: usize,
    /// Per-head rotary query/key size (shared key part cached beside the latent).
    pub qk_rope_head_dim: usize,
    /// Per-head value size.
    pub v_head_dim: usize,
}

/// The token mixer of a hybrid model's recurrent layers: each keeps a fixed-size state a
/// request (a short convolution's window and a recurrent matrix) instead of a KV entry a
/// token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// Qwen3-Next's gated delta net (`linear_attention` layers).
    GatedDeltaNet {
        /// `linear_num_key_heads`.
        key_heads: usize,
        /// `linear_num_value_heads`.
        value_heads: usize,
        /// `linear_key_head_dim`.
        key_head_dim: usize,
        /// `linear_value_head_dim`.
        value_head_dim: usize,
        /// `linear_conv_kernel_dim`.
        conv_kernel: usize,
    },
    /// Mamba2 (Nemotron-H's `M` layers).
    Mamba2 {
        /// `mamba_num_heads`.
        heads: usize,
        /// `mamba_head_dim`.
        head_dim: usize,
        /// `ssm_state_size`.
        state_size: usize,
        /// `n_groups`.
        groups: usize,
        /// `conv_kernel`.
        conv_kernel: usize,
    },
}

/// A hybrid model's recurrent layers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recurrent {
    /// Layers whose mixer is recurrent.
    pub layers: usize,
    /// Their mixer.
    pub mixer: Mixer,
    /// Precision of the states: the model's dtype (vLLM's `mamba_cache_dtype` auto).
    pub state_precision: Precision,
    /// Precision of the SSM/temporal state where the config pins one
    /// (`mamba_ssm_cache_dtype`), else `state_precision`.
    pub ssm_precision: Precision,
}

impl Recurrent {
    /// Elements of one layer's (convolution, recurrent) state a request on one of `tp`
    /// GPUs, as vLLM's `MambaStateShapeCalculator` shapes them (`gated_delta_net_state_shape`,
    /// `mamba2_state_shape`): heads and convolution channels are split by TP.
    pub fn state_elements_per_gpu(&self, tp: usize) -> (usize, usize) {
        match self.mixer {
            Mixer::GatedDeltaNet { key_heads, value_heads, key_head_dim, value_head_dim, conv_kernel } => {
                let conv_dim = 2 * key_heads * key_head_dim + value_heads * value_head_dim;
                let conv = conv_dim / tp * (conv_kernel - 1);
                (conv, value_heads / tp * value_head_dim * key_head_dim)
            }
            Mixer::Mamba2 { heads, head_dim, state_size, groups, conv_kernel } => {
                // Groups that TP cannot split are replicated so each head keeps its group
                // (`extra_groups_for_head_shards`).
                // (`n_groups + (tp - n_groups)`: as many groups as GPUs).
                let groups = if groups.is_multiple_of(tp) { groups } else { tp };
                let conv_dim = heads * head_dim + 2 * groups * state_size;
                (conv_dim / tp * (conv_kernel - 1), heads / tp * head_dim * state_size)
            }
        }
    }

    /// Bytes of one layer's state a request on one of `tp` GPUs.
    pub fn state_bytes_per_layer_per_gpu(&self, tp: usize) -> u64 {
        let (conv, ssm) = self.state_elements_per_gpu(tp);
        (conv as f64 * self.state_precision.bytes() + ssm as f64 * self.ssm_precision.bytes()) as u64
    }

    /// Heads TP must divide (vLLM's `divide` asserts it): (name, count) of each.
    pub fn split_heads(&self) -> Vec<(&'static str, usize)> {
        match self.mixer {
            Mixer::GatedDeltaNet { key_heads, value_heads, .. } => {
                vec![("linear_num_key_heads", key_heads), ("linear_num_value_heads", value_heads)]
            }
            Mixer::Mamba2 { heads, .. } => vec![("mamba_num_heads", heads)],
        }
    }

    /// Parameters of one recurrent layer's mixer (projections and convolution).
    pub fn params(&self, hidden: usize) -> f64 {
        let h = hidden as f64;
        match self.mixer {
            Mixer::GatedDeltaNet { key_heads, value_heads, key_head_dim, value_head_dim, conv_kernel } => {
                let (k, v) = ((key_heads * key_head_dim) as f64, (value_heads * value_head_dim) as f64);
                // in_proj_qkvz (q, k, v and the output gate z), in_proj_ba (two per value
                // head), the convolution over q, k, v and out_proj.
                h * (2.0 * k + 2.0 * v)
                    + h * 2.0 * value_heads as f64
                    + (2.0 * k + v) * conv_kernel as f64
                    + v * h
            }
            Mixer::Mamba2 { heads, head_dim, state_size, groups, conv_kernel } => {
                let inner = (heads * head_dim) as f64;
                let bc = (2 * groups * state_size) as f64;
                // in_proj (z, x, B, C, dt), the convolution over x, B, C and out_proj.
                h * (2.0 * inner + bc + heads as f64) + (inner + bc) * conv_kernel as f64 + inner * h
            }
        }
    }

    /// Widths of the input and output projections of one layer on one of `tp` GPUs,
    /// for pricing: (input projection outputs, output projection inputs).
    pub fn projection_widths(&self, tp: usize) -> (usize, usize) {
        match self.mixer {
            Mixer::GatedDeltaNet { key_heads, value_heads, key_head_dim, value_head_dim, .. } => {
                let v = value_heads * value_head_dim;
                ((2 * key_heads * key_head_dim + 2 * v + 2 * value_heads) / tp, v / tp)
            }
            Mixer::Mamba2 { heads, head_dim, state_size, groups, .. } => {
                let inner = heads * head_dim;
                ((2 * inner + 2 * groups * state_size + heads) / tp, inner / tp)
            }
        }
    }

    /// Multiply-adds of the recurrence a token on one of `tp` GPUs: the state is updated and
    /// read once a token (decay, delta or SSM update, output).
    pub fn recurrence_flops_per_token(&self, tp: usize) -> f64 {
        let (_, ssm) = self.state_elements_per_gpu(tp);
        4.0 * 2.0 * ssm as f64
    }
}

/// What the simulator needs to know of a decoder-only model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelArch {
    /// `architectures[0]` (e.g. `LlamaForCausalLM`).
    pub architecture: String,
    /// `model_type` of the text model.
    pub model_type: String,
    /// Decoder layers.
    pub num_layers: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention; equals `num_heads` for MHA).
    pub num_kv_heads: usize,
    /// Size of one attention head.
    pub head_dim: usize,
    /// Intermediate size of a dense MLP layer.
    pub intermediate_size: usize,
    /// Vocabulary (embedding and LM head rows).
    pub vocab_size: usize,
    /// Whether the LM head shares the embedding's weights.
    pub tie_word_embeddings: bool,
    /// Longest context the model was trained for.
    pub max_position_embeddings: usize,
    /// Precision of the weights as published.
    pub weight_precision: Precision,
    /// Sliding attention window, for the layers that use one.
    pub sliding_window: Option<usize>,
    /// Layers that attend within `sliding_window` only (the rest attend to everything).
    pub sliding_layers: usize,
    /// The experts, for MoE models.
    pub moe: Option<Moe>,
    /// Latent attention, for DeepSeek-style models.
    pub mla: Option<Mla>,
    /// The recurrent layers of a hybrid model (Qwen3-Next, Nemotron-H).
    pub recurrent: Option<Recurrent>,
    /// Whether attention gates its output by a second query-sized projection (Qwen3-Next's
    /// gated attention).
    pub attention_output_gate: bool,
    /// Layers with neither attention nor a recurrent mixer (Nemotron-H's MLP-only layers).
    pub mlp_only_layers: usize,
    /// Layers without an MLP (Nemotron-H's attention and Mamba layers are mixers only).
    pub mixer_only_layers: usize,
    /// Weight matrices of a dense MLP: 3 when gated (SwiGLU), 2 when not (Nemotron-H's
    /// squared ReLU).
    pub mlp_matrices: usize,
}

/// Why a `config.json` could not be read as a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("config.json: {0}")]
pub struct ArchError(pub String);

struct Cfg<'a> {
    text: &'a Map<String, Value>,
}

impl Cfg<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.text.get(key).filter(|v| !v.is_null())
    }
    fn uint(&self, key: &str) -> Result<Option<usize>, ArchError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0 && n <= 1 << 40)
                .map(|n| Some(n as usize))
                .ok_or_else(|| ArchError(format!("{key}: expected a positive integer, got {v}"))),
        }
    }
    fn need(&self, key: &str) -> Result<usize, ArchError> {
        self.uint(key)?.ok_or_else(|| ArchError(format!("{key}: missing")))
    }
    fn first(&self, keys: &[&str]) -> Result<Option<usize>, ArchError> {
        for k in keys {
            if let Some(v) = self.uint(k)? {
                return Ok(Some(v));
            }
        }
        Ok(None)
    }
    fn flag(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }
    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// Architectures the reader knows how to lay out.
pub const KNOWN_ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Llama4ForCausalLM",
    "Llama4ForConditionalGeneration",
    "GptOssForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "Qwen3NextForCausalLM",
    "NemotronHForCausalLM",
];

fn precision_of_dtype(s: Option<&str>) -> Precision {
    match s {
        Some("float32") => Precision::Fp32,
        _ => Precision::Bf16,
    }
}

/// The precision a `quantization_config` (or vLLM's `--quantization` name) gives weights.
pub fn precision_of_quant(method: &str, bits: Option<u64>) -> Option<Precision> {
    match method {
        "fp8" | "fbgemm_fp8" | "modelopt" | "ptpc_fp8" | "fp8_e4m3" => Some(Precision::Fp8),
        "awq" | "gptq" | "awq_marlin" | "gptq_marlin" | "mxfp4" | "modelopt_fp4" | "nvfp4"
        | "bitsandbytes" => match bits {
            Some(8) => Some(Precision::Fp8),
            _ => Some(Precision::Int4),
        },
        "compressed-tensors" | "compressed_tensors" => Some(match bits {
            Some(4) => Precision::Int4,
            _ => Precision::Fp8,
        }),
        _ => None,
    }
}

/// Reads a model from the text of its `config.json`.
pub fn parse_config(text: &str) -> Result<ModelArch, ArchError> {
    let root: Value = serde_json::from_str(text).map_err(|e| ArchError(format!("not JSON: {e}")))?;
    let Value::Object(root) = root else {
        return Err(ArchError("must be a JSON object".into()));
    };
    let architecture = root
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !KNOWN_ARCHITECTURES.contains(&architecture.as_str()) {
        return Err(ArchError(format!(
            "architectures: {architecture:?} is not a layout mocker knows; known: {}",
            KNOWN_ARCHITECTURES.join(", ")
        )));
    }
    // Multimodal wrappers keep the language model under `text_config`.
    let text = match root.get("text_config") {
        Some(Value::Object(t)) => t,
        _ => &root,
    };
    let c = Cfg { text };
    let top = Cfg { text: &root };
    let model_type = c.str("model_type").or(top.str("model_type")).unwrap_or_default().to_string();
    let num_layers = c.need("num_hidden_layers")?;
    let hidden_size = c.need("hidden_size")?;
    let num_heads = c.need("num_attention_heads")?;
    let num_kv_heads = c.uint("num_key_value_heads")?.unwrap_or(num_heads);
    if num_heads % num_kv_heads != 0 {
        return Err(ArchError(format!(
            "num_key_value_heads: {num_kv_heads} does not divide num_attention_heads {num_heads}"
        )));
    }
    let head_dim = c.uint("head_dim")?.unwrap_or(hidden_size / num_heads);
    let vocab_size = c.need("vocab_size")?;
    let max_position_embeddings = c.uint("max_position_embeddings")?.unwrap_or(4096);
    // Transformers' default where the file is silent: Gemma ties its LM head, others do not.
    let tie_word_embeddings = c
        .flag("tie_word_embeddings")
        .or(top.flag("tie_word_embeddings"))
        .unwrap_or(model_type.starts_with("gemma"));
    let dtype = c.str("torch_dtype").or(c.str("dtype")).or(top.str("torch_dtype")).or(top.str("dtype"));
    let mut weight_precision = precision_of_dtype(dtype);
    let mut expert_precision = None;
    if let Some(Value::Object(q)) = root.get("quantization_config").or(text.get("quantization_config")) {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or_default();
        let bits = q.get("bits").or(q.get("w_bit")).and_then(Value::as_u64);
        match precision_of_quant(method, bits) {
            // gpt-oss quantizes only its experts (attention, router, embeddings stay 16-bit).
            Some(p) if method == "mxfp4" => expert_precision = Some(p),
            Some(p) => weight_precision = p,
            None => {
                return Err(ArchError(format!(
                    "quantization_config.quant_method: {method:?} is not modelled; known: fp8, awq, gptq, \
                     mxfp4, modelopt, modelopt_fp4, compressed-tensors, bitsandbytes"
                )))
            }
        }
    }

    let (sliding_window, sliding_layers) = sliding(&c, num_layers)?;
    let moe = moe(&c, num_layers, expert_precision)?;
    let intermediate_size = match model_type.as_str() {
        // Llama 4's dense layers use `intermediate_size_mlp`; `intermediate_size` is an expert's.
        "llama4_text" | "llama4" => c.first(&["intermediate_size_mlp", "intermediate_size"])?,
        _ => c.uint("intermediate_size")?,
    }
    .unwrap_or(4 * hidden_size);
    let hybrid = recurrent(&c, num_layers, precision_of_dtype(dtype))?;
    let attention_output_gate = model_type == "qwen3_next";
    let mlp_matrices = if model_type == "nemotron_h" { 2 } else { 3 };
    let mla = match c.uint("kv_lora_rank")? {
        None => None,
        Some(kv_lora_rank) => Some(Mla {
            kv_lora_rank,
            q_lora_rank: c.uint("q_lora_rank")?.unwrap_or(0),
            qk_nope_head_dim: c.need("qk_nope_head_dim")?,
            qk_rope_head_dim: c.need("qk_rope_head_dim")?,
            v_head_dim: c.need("v_head_dim")?,
        }),
    };
    Ok(ModelArch {
        architecture,
        model_type,
        num_layers,
        hidden_size,
        num_heads,
        num_kv_heads,
        head_dim,
        intermediate_size,
        vocab_size,
        tie_word_embeddings,
        max_position_embeddings,
        weight_precision,
        sliding_window,
        sliding_layers,
        moe,
        mla,
        recurrent: hybrid.recurrent,
        attention_output_gate,
        mlp_only_layers: hybrid.mlp_only,
        mixer_only_layers: hybrid.mixer_only,
        mlp_matrices,
    })
}

/// What a hybrid model's layer pattern says, beside attention.
struct Hybrid {
    recurrent: Option<Recurrent>,
    mlp_only: usize,
    mixer_only: usize,
}

/// The recurrent layers of a hybrid model: Qwen3-Next's `linear_attention` layers (from
/// `layer_types`, else every layer but each `full_attention_interval`-th), Nemotron-H's
/// `M` layers of `hybrid_override_pattern` (`*` attention, `-` MLP, `E` experts; newer
/// transformers list the same as `layers_block_type`: mamba, attention, mlp, moe).
fn recurrent(c: &Cfg<'_>, layers: usize, dtype: Precision) -> Result<Hybrid, ArchError> {
    // vLLM keeps the SSM state in `mamba_ssm_cache_dtype` (auto: the model's dtype), except
    // that for Nemotron-H it reads the config's key and defaults it to float32
    // (`NemotronHForCausalLMConfig`: "only float32 is known to have no accuracy issues").
    let ssm_precision = match c.str("mamba_ssm_cache_dtype") {
        Some("float32") => Precision::Fp32,
        Some("float16") | Some("bfloat16") => Precision::Bf16,
        _ if c.str("model_type") == Some("nemotron_h") => Precision::Fp32,
        _ => dtype,
    };
    let none = Hybrid { recurrent: None, mlp_only: 0, mixer_only: 0 };
    match c.str("model_type") {
        Some("qwen3_next") => {
            let linear = match c.get("layer_types") {
                Some(Value::Array(types)) => {
                    if types.len() != layers {
                        return Err(ArchError(format!(
                            "layer_types: {} entries for {layers} num_hidden_layers",
                            types.len()
                        )));
                    }
                    if let Some(t) = types
                        .iter()
                        .find(|t| !matches!(t.as_str(), Some("linear_attention") | Some("full_attention")))
                    {
                        return Err(ArchError(format!(
                            "layer_types: {t} is not linear_attention or full_attention"
                        )));
                    }
                    types.iter().filter(|t| t.as_str() == Some("linear_attention")).count()
                }
                _ => layers - layers / c.need("full_attention_interval")?,
            };
            let mixer = Mixer::GatedDeltaNet {
                key_heads: c.need("linear_num_key_heads")?,
                value_heads: c.need("linear_num_value_heads")?,
                key_head_dim: c.need("linear_key_head_dim")?,
                value_head_dim: c.need("linear_value_head_dim")?,
                conv_kernel: c.need("linear_conv_kernel_dim")?,
            };
            let recurrent = (linear > 0).then_some(Recurrent {
                layers: linear,
                mixer,
                state_precision: dtype,
                ssm_precision,
            });
            Ok(Hybrid { recurrent, ..none })
        }
        Some("nemotron_h") => {
            // Newer transformers spell the pattern as `layers_block_type`, a list of kinds.
            let listed: Option<String> = match c.get("layers_block_type") {
                Some(Value::Array(kinds)) => Some(
                    kinds
                        .iter()
                        .map(|k| match k.as_str() {
                            Some("mamba") => Ok('M'),
                            Some("attention") => Ok('*'),
                            Some("mlp") => Ok('-'),
                            Some("moe") => Ok('E'),
                            _ => Err(ArchError(format!(
                                "layers_block_type: {k} is not mamba, attention, mlp or moe"
                            ))),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                _ => None,
            };
            let pattern = match (&listed, c.str("hybrid_override_pattern")) {
                (Some(p), _) => p.as_str(),
                (None, Some(p)) => p,
                (None, None) => {
                    return Err(ArchError("hybrid_override_pattern (or layers_block_type): missing".into()))
                }
            };
            if pattern.chars().count() != layers {
                return Err(ArchError(format!(
                    "hybrid_override_pattern: {} layers for {layers} num_hidden_layers",
                    pattern.chars().count()
                )));
            }
            if let Some(x) = pattern.chars().find(|ch| !"M*-E".contains(*ch)) {
                return Err(ArchError(format!(
                    "hybrid_override_pattern: {x:?} is not a layer kind mocker knows (M, *, -, E)"
                )));
            }
            if pattern.contains('E') {
                return Err(ArchError(
                    "hybrid_override_pattern: expert layers (E) are not modelled; known: M, *, -".into(),
                ));
            }
            let count = |k: char| pattern.chars().filter(|&ch| ch == k).count();
            let mixer = Mixer::Mamba2 {
                heads: c.need("mamba_num_heads")?,
                head_dim: c.need("mamba_head_dim")?,
                state_size: c
                    .first(&["ssm_state_size", "mamba_d_state"])?
                    .ok_or_else(|| ArchError("ssm_state_size: missing".into()))?,
                groups: c.first(&["n_groups", "mamba_n_groups"])?.unwrap_or(1),
                conv_kernel: c.first(&["conv_kernel", "mamba_d_conv"])?.unwrap_or(4),
            };
            let recurrent = (count('M') > 0).then_some(Recurrent {
                layers: count('M'),
                mixer,
                state_precision: dtype,
                ssm_precision,
            });
            Ok(Hybrid { recurrent, mlp_only: count('-'), mixer_only: count('M') + count('*') })
        }
        _ => Ok(none),
    }
}

/// The sliding window and how many layers use it: `layer_types` where given, Gemma's
/// patterns otherwise, every layer for Mistral-style configs with a window, none when
/// `use_sliding_window` is false (Qwen2.5).
fn sliding(c: &Cfg<'_>, layers: usize) -> Result<(Option<usize>, usize), ArchError> {
    let Some(window) = c.uint("sliding_window")? else {
        return Ok((None, 0));
    };
    if c.flag("use_sliding_window") == Some(false) {
        return Ok((None, 0));
    }
    if let Some(Value::Array(types)) = c.get("layer_types") {
        let n = types.iter().filter(|t| t.as_str() == Some("sliding_attention")).count();
        return Ok((Some(window).filter(|_| n > 0), n));
    }
    let n = match c.str("model_type") {
        // Gemma 2 alternates local and global layers.
        Some("gemma2") => layers / 2,
        // Gemma 3: five local layers for every global one (`sliding_window_pattern` 6).
        Some("gemma3_text") | Some("gemma3") => {
            let pattern = c.uint("sliding_window_pattern")?.unwrap_or(6);
            layers - layers / pattern
        }
        _ => layers,
    };
    Ok((Some(window), n))
}

fn moe(c: &Cfg<'_>, layers: usize, expert_precision: Option<Precision>) -> Result<Option<Moe>, ArchError> {
    let Some(experts) = c.first(&["num_local_experts", "num_experts", "n_routed_experts"])? else {
        return Ok(None);
    };
    let top_k = c.need("num_experts_per_tok")?;
    if top_k > experts {
        return Err(ArchError(format!("num_experts_per_tok: {top_k} exceeds the {experts} experts")));
    }
    let intermediate_size = c
        .first(&["moe_intermediate_size", "intermediate_size"])?
        .ok_or_else(|| ArchError("moe_intermediate_size: missing".into()))?;
    let model_type = c.str("model_type").unwrap_or_default();
    let shared_intermediate_size = if let Some(n) = c.uint("n_shared_experts")? {
        n * intermediate_size
    } else if let Some(s) = c.uint("shared_expert_intermediate_size")? {
        s
    } else if model_type.starts_with("llama4") {
        // Llama 4 adds one shared expert the size of a routed one.
        intermediate_size
    } else {
        0
    };
    let dense_first = c.uint("first_k_dense_replace")?.unwrap_or(0).min(layers);
    let step = c.first(&["interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq"])?.unwrap_or(1);
    let mlp_only = match c.get("mlp_only_layers") {
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    };
    let moe_layers = ((layers - dense_first) / step).saturating_sub(mlp_only).max(1);
    Ok(Some(Moe {
        experts,
        top_k,
        intermediate_size,
        shared_intermediate_size,
        moe_layers,
        expert_precision,
    }))
}

impl ModelArch {
    /// Attention layers: every decoder layer but a hybrid's recurrent and MLP-only ones.
    pub fn attention_layers(&self) -> usize {
        self.num_layers - self.recurrent_layers() - self.mlp_only_layers
    }

    /// Layers with a recurrent state (0 for a transformer).
    pub fn recurrent_layers(&self) -> usize {
        self.recurrent.as_ref().map_or(0, |r| r.layers)
    }

    /// Parameters of the model (embedding, LM head if untied, attention, recurrent mixers,
    /// MLPs, experts).
    pub fn parameters(&self) -> f64 {
        let h = self.hidden_size as f64;
        let embed = self.vocab_size as f64 * h * if self.tie_word_embeddings { 1.0 } else { 2.0 };
        let recurrent = self.recurrent.as_ref().map_or(0.0, |r| r.layers as f64 * r.params(self.hidden_size));
        self.attention_layers() as f64 * self.attention_params()
            + recurrent
            + self.dense_mlp_layers() as f64 * self.dense_mlp_params()
            + self.expert_params_per_layer() * self.moe_layers() as f64
            + embed
    }

    /// Parameters of one layer's attention projections.
    pub fn attention_params(&self) -> f64 {
        let h = self.hidden_size as f64;
        match &self.mla {
            Some(m) => {
                let heads = self.num_heads as f64;
                let qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
                let q = if m.q_lora_rank > 0 {
                    h * m.q_lora_rank as f64 + m.q_lora_rank as f64 * heads * qk
                } else {
                    h * heads * qk
                };
                let kv_a = h * (m.kv_lora_rank + m.qk_rope_head_dim) as f64;
                let kv_b = m.kv_lora_rank as f64 * heads * (m.qk_nope_head_dim + m.v_head_dim) as f64;
                q + kv_a + kv_b + heads * m.v_head_dim as f64 * h
            }
            None => {
                let d = self.head_dim as f64;
                // A gated attention projects each query twice: the query and its gate.
                let q = if self.attention_output_gate { 2 * self.num_heads } else { self.num_heads };
                h * (q + 2 * self.num_kv_heads) as f64 * d + self.num_heads as f64 * d * h
            }
        }
    }

    /// Layers with a dense MLP.
    pub fn dense_mlp_layers(&self) -> usize {
        self.num_layers - self.mixer_only_layers - self.moe_layers()
    }

    /// Layers with experts.
    pub fn moe_layers(&self) -> usize {
        self.moe.as_ref().map_or(0, |m| m.moe_layers)
    }

    /// Parameters of one dense MLP.
    pub fn dense_mlp_params(&self) -> f64 {
        self.mlp_matrices as f64 * self.hidden_size as f64 * self.intermediate_size as f64
    }

    /// Parameters of one MoE layer: router, routed and shared experts.
    pub fn expert_params_per_layer(&self) -> f64 {
        self.moe.as_ref().map_or(0.0, |m| {
            let h = self.hidden_size as f64;
            h * m.experts as f64
                + 3.0 * h * (m.experts * m.intermediate_size + m.shared_intermediate_size) as f64
        })
    }

    /// Parameters a token touches (total for dense models).
    pub fn active_parameters(&self) -> f64 {
        match &self.moe {
            None => self.parameters(),
            Some(m) => {
                let h = self.hidden_size as f64;
                let routed = 3.0 * h * (m.experts * m.intermediate_size) as f64;
                let active = 3.0 * h * (m.top_k * m.intermediate_size) as f64;
                self.parameters() - (routed - active) * m.moe_layers as f64
            }
        }
    }

    /// KV-cache elements one token stores in one full-attention layer, over the whole model
    /// (before tensor parallelism).
    pub fn kv_elements_per_token_layer(&self) -> usize {
        match &self.mla {
            Some(m) => m.kv_lora_rank + m.qk_rope_head_dim,
            None => 2 * self.num_kv_heads * self.head_dim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_llama_config_reads_its_facts() {
        let text = r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":4096,
            "intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,
            "num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":131072,
            "torch_dtype":"bfloat16","tie_word_embeddings":false}"#;
        let m = parse_config(text).unwrap();
        assert_eq!((m.num_layers, m.head_dim, m.num_kv_heads), (32, 128, 8));
        // Llama-3.1-8B has 8.03 B parameters.
        assert!((m.parameters() / 1e9 - 8.03).abs() < 0.01, "{}", m.parameters());
        assert_eq!(m.kv_elements_per_token_layer(), 2048);
        assert!(m.moe.is_none() && m.mla.is_none() && m.sliding_window.is_none());
    }

    #[test]
    fn unknown_layouts_and_bad_values_are_refused_by_name() {
        let e = parse_config(r#"{"architectures":["BertModel"]}"#).unwrap_err();
        assert!(e.0.contains("BertModel") && e.0.contains("LlamaForCausalLM"), "{e}");
        let e = parse_config(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":-4,"num_hidden_layers":2,
            "num_attention_heads":2,"vocab_size":10}"#,
        )
        .unwrap_err();
        assert!(e.0.starts_with("hidden_size"), "{e}");
        let e = parse_config(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
            "num_attention_heads":6,"num_key_value_heads":4,"vocab_size":10}"#,
        )
        .unwrap_err();
        assert!(e.0.starts_with("num_key_value_heads"), "{e}");
        assert!(parse_config("[1]").is_err() && parse_config("{").is_err());
    }

    #[test]
    fn qwen3_next_reads_its_linear_attention_layers() {
        let entry = crate::find_model("Qwen/Qwen3-Next-80B-A3B-Instruct").unwrap();
        let m = entry.arch().unwrap();
        assert_eq!(
            (m.attention_layers(), m.recurrent_layers(), m.num_kv_heads, m.head_dim),
            (12, 36, 2, 256)
        );
        let r = m.recurrent.unwrap();
        // gated_delta_net_state_shape at TP 1: conv (2 x 16 x 128 + 32 x 128) x 3, temporal
        // 32 x 128 x 128; bf16.
        assert_eq!(r.state_elements_per_gpu(1), (24_576, 524_288));
        assert_eq!(r.state_bytes_per_layer_per_gpu(1), 1_097_728);
        assert_eq!(r.state_bytes_per_layer_per_gpu(4), 274_432);
        assert!(m.attention_output_gate && m.moe.as_ref().unwrap().moe_layers == 48);
        assert!((m.parameters() / 1e9 - 79.7).abs() < 0.2, "{}", m.parameters() / 1e9);
        // layer_types, where given, says which layers are linear; it must cover them all.
        let text = entry.config_text();
        let mut v: Value = serde_json::from_str(text).unwrap();
        let types: Vec<&str> =
            (0..48).map(|i| if i % 2 == 1 { "full_attention" } else { "linear_attention" }).collect();
        v["layer_types"] = serde_json::json!(types);
        assert_eq!(parse_config(&v.to_string()).unwrap().recurrent_layers(), 24);
        v["layer_types"] = serde_json::json!(["linear_attention"]);
        assert!(parse_config(&v.to_string()).unwrap_err().0.starts_with("layer_types"));
    }

    #[test]
    fn nemotron_h_reads_its_mamba2_layers_from_the_pattern() {
        let config = |pattern: &str, extra: &str| {
            format!(
                r#"{{"architectures":["NemotronHForCausalLM"],"model_type":"nemotron_h","hidden_size":4480,
                "num_hidden_layers":{},"num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,
                "intermediate_size":15680,"vocab_size":131072,"hybrid_override_pattern":"{pattern}",
                "mamba_num_heads":128,"mamba_head_dim":80,"ssm_state_size":128,"n_groups":8,
                "conv_kernel":4,"torch_dtype":"bfloat16"{extra}}}"#,
                pattern.len()
            )
        };
        let m = parse_config(&config("M-M*M-M-", "")).unwrap();
        // M: Mamba2 mixer only; *: attention only; -: MLP only.
        assert_eq!((m.recurrent_layers(), m.attention_layers(), m.dense_mlp_layers()), (4, 1, 3));
        let r = m.recurrent.unwrap();
        // mamba2_state_shape: conv (128 x 80 + 2 x 8 x 128) x 3, SSM 128 x 80 x 128.
        assert_eq!(r.state_elements_per_gpu(1), (36_864, 1_310_720));
        // 8 groups over 16 GPUs: replicated to 16, so 10240 + 2 x 16 x 128 channels.
        assert_eq!(r.state_elements_per_gpu(16).0, 14_336 / 16 * 3);
        // vLLM keeps Nemotron-H's SSM state in float32 unless the config says otherwise.
        assert_eq!(r.state_bytes_per_layer_per_gpu(1), 36_864 * 2 + 1_310_720 * 4);
        let bf16_ssm = parse_config(&config("M-M*M-M-", r#","mamba_ssm_cache_dtype":"bfloat16""#)).unwrap();
        assert_eq!(bf16_ssm.recurrent.unwrap().state_bytes_per_layer_per_gpu(1), (36_864 + 1_310_720) * 2);
        assert!(parse_config(&config("M-E*", "")).unwrap_err().0.contains("expert layers"));
        // Newer transformers list the kinds instead of the pattern string.
        let listed = config("M-M*M-M-", "").replace(
            r#""hybrid_override_pattern":"M-M*M-M-""#,
            r#""layers_block_type":["mamba","mlp","mamba","attention","mamba","mlp","mamba","mlp"]"#,
        );
        assert_eq!(parse_config(&listed).unwrap(), m);
        assert!(parse_config(&config("M-X*", "")).unwrap_err().0.contains("'X'"));
    }
}
