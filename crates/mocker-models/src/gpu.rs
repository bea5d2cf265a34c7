//! The GPU catalogue: memory, bandwidth, peak FLOPS per precision and interconnect of the
//! parts users name (`h100`, `a100-80gb`, `l40s`, ...), and which measured operator data
//! times each (its own, or a close part's scaled by the roofline).

use serde::Deserialize;

use crate::arch::Precision;

/// Link between the GPUs of one tensor-parallel group.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Interconnect {
    /// `nvlink`, `pcie` or `infinity_fabric`.
    pub kind: String,
    /// Bytes/s per GPU per direction.
    pub bandwidth: f64,
    /// Seconds of fixed latency per transfer.
    #[serde(default)]
    pub latency_s: f64,
}

/// One GPU of the catalogue.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GpuSpec {
    /// The name users type.
    pub name: String,
    /// Other spellings accepted.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The part's full name.
    pub description: String,
    /// Memory of one GPU in bytes.
    pub memory_bytes: f64,
    /// Memory bandwidth in bytes/s.
    pub memory_bandwidth: f64,
    /// Dense tensor-core FLOP/s per precision name (`bf16`, `fp8`, ...).
    pub flops: std::collections::BTreeMap<String, f64>,
    /// The link between GPUs of a node.
    pub interconnect: Interconnect,
    /// AIConfigurator's system whose operator data measures exactly this part.
    #[serde(default)]
    pub aic_system: Option<String>,
    /// The catalogue GPU whose operator data is scaled to this part when it has none.
    #[serde(default)]
    pub proxy: Option<String>,
    /// Where the numbers come from.
    #[serde(default)]
    pub source: String,
}

impl GpuSpec {
    /// Peak FLOP/s a matmul reaches at `p` (weight-only 4-bit formats compute at 16 bits;
    /// a part without fp8 units computes fp8 weights at 16 bits).
    pub fn peak_flops(&self, p: Precision) -> f64 {
        let bf16 = self.flops.get("bf16").or(self.flops.get("fp16")).copied().unwrap_or(1e14);
        match p {
            Precision::Fp8 => self.flops.get("fp8").copied().unwrap_or(bf16),
            Precision::Fp32 => self.flops.get("tf32").copied().unwrap_or(bf16 / 2.0),
            Precision::Bf16 | Precision::Int4 => bf16,
        }
    }

    /// Every name this GPU answers to.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// The bundled GPU catalogue.
pub fn gpus() -> &'static [GpuSpec] {
    static GPUS: std::sync::OnceLock<Vec<GpuSpec>> = std::sync::OnceLock::new();
    GPUS.get_or_init(|| {
        serde_json::from_str(include_str!("../data/gpus.json")).expect("data/gpus.json is checked by tests")
    })
}

fn normalise(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace(['_', ' '], "-")
}

/// The catalogue GPU named `name` (any alias, case-insensitive, `_` or `-`).
pub fn find_gpu(name: &str) -> Option<&'static GpuSpec> {
    let want = normalise(name);
    gpus().iter().find(|g| g.names().any(|n| normalise(n) == want))
}

/// The names users can type, one per GPU.
pub fn gpu_names() -> Vec<&'static str> {
    gpus().iter().map(|g| g.name.as_str()).collect()
}
