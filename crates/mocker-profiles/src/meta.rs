//! What a generated profile says about the hardware and model it was measured for: enough
//! to size the KV cache the way the serving engine would.

use serde_json::Value;

/// A profile's `meta_json` (format `mocker-profile-v1`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileMeta {
    /// Model id (e.g. `Qwen/Qwen3-32B`).
    pub model: String,
    /// GPU system (e.g. `h200_sxm`).
    pub system: String,
    /// Serving engine the timings are for (`vllm`, `sglang`, `trtllm`).
    pub backend: String,
    /// Tensor-parallel GPUs per engine.
    pub tp: usize,
    /// Memory of one GPU, bytes.
    pub gpu_memory_bytes: f64,
    /// Model weights held by one GPU, bytes.
    pub weight_bytes_per_gpu: f64,
    /// KV cache bytes one token takes on one GPU.
    pub kv_bytes_per_token_per_gpu: f64,
    /// Memory one GPU needs besides weights and KV cache (activations, communication
    /// buffers, runtime and graphs), as the generator estimated it; 0 if not stated.
    pub non_kv_bytes_per_gpu: f64,
    /// The JSON as stored, written back unchanged.
    pub raw: String,
}

impl ProfileMeta {
    /// Parses `meta_json`'s bytes; the reason names the field that is wrong.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let raw = String::from_utf8(bytes.to_vec()).map_err(|_| "is not UTF-8 text".to_string())?;
        let v: Value = serde_json::from_str(&raw).map_err(|e| format!("is not JSON: {e}"))?;
        match v.get("format").and_then(Value::as_str) {
            Some("mocker-profile-v1") => {}
            other => return Err(format!("format: expected \"mocker-profile-v1\", got {other:?}")),
        }
        let text = |k: &str| {
            v.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or(format!("{k}: missing or not a string"))
        };
        let positive = |k: &str| match v.get(k).and_then(Value::as_f64) {
            Some(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => Err(format!("{k}: missing or not a positive number")),
        };
        let tp = match v.get("tp").and_then(Value::as_u64) {
            Some(t) if (1..=1024).contains(&t) => t as usize,
            _ => return Err("tp: missing or not an integer in 1..=1024".into()),
        };
        Ok(Self {
            model: text("model")?,
            system: text("system")?,
            backend: text("backend")?,
            tp,
            gpu_memory_bytes: positive("gpu_memory_bytes")?,
            weight_bytes_per_gpu: match v.get("weight_bytes_per_gpu").and_then(Value::as_f64) {
                Some(x) if x.is_finite() && x >= 0.0 => x,
                _ => return Err("weight_bytes_per_gpu: missing or negative".into()),
            },
            kv_bytes_per_token_per_gpu: positive("kv_bytes_per_token_per_gpu")?,
            non_kv_bytes_per_gpu: match v.get("non_kv_bytes_per_gpu") {
                None => 0.0,
                Some(Value::Object(parts)) => {
                    let mut sum = 0.0;
                    for (k, x) in parts {
                        match x.as_f64() {
                            Some(b) if b.is_finite() && b >= 0.0 => sum += b,
                            _ => return Err(format!("non_kv_bytes_per_gpu.{k}: not a non-negative number")),
                        }
                    }
                    sum
                }
                Some(_) => return Err("non_kv_bytes_per_gpu: must be an object of byte counts".into()),
            },
            raw,
        })
    }
}
