//! Measured operator times: AIConfigurator's database sampled per GPU system into compact
//! tables (`data/ops/<system>.json`, written by `scripts/aic_op_tables.py`), and their
//! interpolation.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The GPU facts of an AIConfigurator system, as its operator data was measured on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SystemGpu {
    /// Memory in bytes.
    pub mem_capacity: f64,
    /// Memory bandwidth in bytes/s.
    pub mem_bw: f64,
    /// Peak FLOP/s per precision.
    pub flops: BTreeMap<String, f64>,
    /// NVLink (or PCIe) bandwidth between GPUs of a node, bytes/s per direction.
    pub intra_node_bw: f64,
}

/// A GEMM table: time of `C[m, n] = A[m, k] · B[k, n]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GemmTable {
    /// Rows (tokens).
    pub m: Vec<f64>,
    /// Output features.
    pub n: Vec<f64>,
    /// Input features.
    pub k: Vec<f64>,
    /// ms, row-major over (m, n, k).
    pub ms: Vec<f64>,
}

/// Context (prefill) attention of one layer for one head configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ContextAttention {
    /// Query heads on the GPU.
    pub heads: f64,
    /// Key/value heads on the GPU.
    pub kv_heads: f64,
    /// Head size.
    pub head_dim: f64,
    /// Requests.
    pub batch: Vec<f64>,
    /// New tokens per request.
    pub isl: Vec<f64>,
    /// Cached tokens per request.
    pub prefix: Vec<f64>,
    /// ms, row-major over (batch, isl, prefix).
    pub ms: Vec<f64>,
}

/// Decode attention of one layer for one head configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GenerationAttention {
    /// Query heads on the GPU.
    pub heads: f64,
    /// Key/value heads on the GPU.
    pub kv_heads: f64,
    /// Head size.
    pub head_dim: f64,
    /// Requests.
    pub batch: Vec<f64>,
    /// Context tokens per request.
    pub context: Vec<f64>,
    /// ms, row-major over (batch, context).
    pub ms: Vec<f64>,
}

/// All-reduce of bf16 elements across a tensor-parallel group.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AllReduce {
    /// Group sizes.
    pub tp: Vec<f64>,
    /// Elements reduced.
    pub elements: Vec<f64>,
    /// ms, row-major over (tp, elements).
    pub ms: Vec<f64>,
}

/// One MoE layer (experts of one model shape) over tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MoeTable {
    /// Hidden size.
    pub hidden: usize,
    /// Expert intermediate size.
    pub inter: usize,
    /// Routed experts.
    pub experts: usize,
    /// Experts per token.
    pub topk: usize,
    /// Tensor parallelism inside each expert.
    pub moe_tp: usize,
    /// Expert parallelism.
    pub moe_ep: usize,
    /// Tokens in the pass.
    pub tokens: Vec<f64>,
    /// ms.
    pub ms: Vec<f64>,
}

/// One system's operator tables.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct OpTables {
    /// AIConfigurator's system name.
    pub system: String,
    /// Serving backend the data was measured with.
    pub backend: String,
    /// Its version.
    pub backend_version: String,
    /// The GPU facts of the system.
    pub gpu: SystemGpu,
    /// GEMMs per precision (`bf16`, `fp8`).
    pub gemm: BTreeMap<String, GemmTable>,
    /// Context attention per KV precision.
    pub context_attention: BTreeMap<String, Vec<ContextAttention>>,
    /// Decode attention per KV precision.
    pub generation_attention: BTreeMap<String, Vec<GenerationAttention>>,
    /// All-reduce per precision.
    #[serde(default)]
    pub allreduce: BTreeMap<String, AllReduce>,
    /// MoE layers per precision.
    #[serde(default)]
    pub moe: BTreeMap<String, Vec<MoeTable>>,
}

/// How an axis is interpolated and how the value grows past its last point.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Axis {
    /// Interpolated on log2 of the coordinate; past the end the value grows as
    /// `(x / last)^power`; below the first point it stays at the first point's value.
    Log(f64),
    /// Interpolated linearly; clamped at both ends.
    Lin,
}

/// Multilinear interpolation over up to three axes with clamping and power-law growth
/// past the ends (see [`Axis`]).
pub(crate) fn interpolate(axes: &[(&[f64], Axis)], values: &[f64], point: &[f64]) -> f64 {
    let mut idx = [0usize; 3];
    let mut frac = [0f64; 3];
    let mut scale = 1.0;
    for (d, ((xs, kind), &x)) in axes.iter().zip(point).enumerate() {
        let (lo, hi) = (xs[0], xs[xs.len() - 1]);
        let c = x.clamp(lo, hi);
        if let Axis::Log(power) = kind {
            if x > hi && power != &0.0 {
                scale *= (x / hi).powf(*power);
            }
        }
        let i = xs.partition_point(|&v| v <= c).clamp(1, xs.len() - 1) - 1;
        let t = match kind {
            Axis::Log(_) if xs[i] > 0.0 => (c / xs[i]).log2() / (xs[i + 1] / xs[i]).log2(),
            _ => (c - xs[i]) / (xs[i + 1] - xs[i]),
        };
        idx[d] = i;
        frac[d] = t;
    }
    let dims: Vec<usize> = axes.iter().map(|(xs, _)| xs.len()).collect();
    let n = axes.len();
    let mut total = 0.0;
    for corner in 0..(1usize << n) {
        let mut w = 1.0;
        let mut flat = 0;
        for d in 0..n {
            let up = (corner >> d) & 1;
            w *= if up == 1 { frac[d] } else { 1.0 - frac[d] };
            flat = flat * dims[d] + idx[d] + up;
        }
        if w != 0.0 {
            total += w * values[flat];
        }
    }
    total * scale
}

impl GemmTable {
    /// ms of an `m × k` by `k × n` product.
    pub fn at(&self, m: f64, n: f64, k: f64) -> f64 {
        let g = Axis::Log(1.0);
        interpolate(&[(&self.m, g), (&self.n, g), (&self.k, g)], &self.ms, &[m, n, k])
    }
}

impl ContextAttention {
    /// ms of one layer's attention for `batch` requests of `isl` new and `prefix` cached tokens.
    pub fn at(&self, batch: f64, isl: f64, prefix: f64) -> f64 {
        let prefix_axis = if self.prefix.len() >= 2 { Some(&self.prefix[..]) } else { None };
        match prefix_axis {
            Some(p) => interpolate(
                &[(&self.batch, Axis::Log(1.0)), (&self.isl, Axis::Log(2.0)), (p, Axis::Lin)],
                &self.ms,
                &[batch, isl, prefix],
            ),
            None => {
                // No prefix in the data: the prefix adds attention work in proportion to
                // the keys each new token reads (isl/2 without it, isl/2 + prefix with it).
                let base = interpolate(
                    &[(&self.batch, Axis::Log(1.0)), (&self.isl, Axis::Log(2.0))],
                    &self.ms,
                    &[batch, isl],
                );
                base * (isl / 2.0 + prefix) / (isl / 2.0).max(1.0)
            }
        }
    }
}

impl GenerationAttention {
    /// ms of one layer's decode attention for `batch` requests of `context` tokens each.
    pub fn at(&self, batch: f64, context: f64) -> f64 {
        interpolate(
            &[(&self.batch, Axis::Log(1.0)), (&self.context, Axis::Log(1.0))],
            &self.ms,
            &[batch, context],
        )
    }
}

impl AllReduce {
    /// ms to all-reduce `elements` bf16 values across `tp` GPUs (nearest measured group
    /// size at or above `tp`).
    pub fn at(&self, tp: f64, elements: f64) -> f64 {
        interpolate(&[(&self.tp, Axis::Lin), (&self.elements, Axis::Log(1.0))], &self.ms, &[tp, elements])
    }
}

impl MoeTable {
    /// ms of the layer's experts for `tokens` tokens.
    pub fn at(&self, tokens: f64) -> f64 {
        interpolate(&[(&self.tokens, Axis::Log(1.0))], &self.ms, &[tokens])
    }
}

/// Why an operator table file is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("operator tables {system}: {reason}")]
pub struct OpsError {
    /// The system.
    pub system: String,
    /// What is wrong.
    pub reason: String,
}

fn check(system: &str, what: &str, axes: &[&[f64]], values: &[f64]) -> Result<(), OpsError> {
    let err = |reason: String| OpsError { system: system.to_string(), reason: format!("{what}: {reason}") };
    for a in axes {
        if a.is_empty()
            || a.windows(2).any(|w| w[0] >= w[1] || w[0].is_nan())
            || a.iter().any(|x| !x.is_finite())
        {
            return Err(err("an axis is empty or not strictly increasing".into()));
        }
    }
    let want: usize = axes.iter().map(|a| a.len()).product();
    if values.len() != want {
        return Err(err(format!("{} values for a grid of {want}", values.len())));
    }
    if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
        return Err(err("a time is negative or not finite".into()));
    }
    Ok(())
}

impl OpTables {
    /// Reads and checks one system's tables.
    pub fn parse(text: &str) -> Result<Self, OpsError> {
        let t: OpTables = serde_json::from_str(text)
            .map_err(|e| OpsError { system: "?".into(), reason: format!("not a mocker-ops-v1 file: {e}") })?;
        let s = t.system.clone();
        for (p, g) in &t.gemm {
            check(&s, &format!("gemm.{p}"), &[&g.m, &g.n, &g.k], &g.ms)?;
        }
        for (p, list) in &t.context_attention {
            for a in list {
                check(&s, &format!("context_attention.{p}"), &[&a.batch, &a.isl, &a.prefix], &a.ms)?;
            }
        }
        for (p, list) in &t.generation_attention {
            for a in list {
                check(&s, &format!("generation_attention.{p}"), &[&a.batch, &a.context], &a.ms)?;
            }
        }
        for (p, a) in &t.allreduce {
            check(&s, &format!("allreduce.{p}"), &[&a.tp, &a.elements], &a.ms)?;
        }
        for (p, list) in &t.moe {
            for m in list {
                check(&s, &format!("moe.{p}"), &[&m.tokens], &m.ms)?;
            }
        }
        if !t.gemm.contains_key("bf16") {
            return Err(OpsError { system: s, reason: "gemm.bf16: missing".into() });
        }
        if t.context_attention.get("bf16").is_none_or(Vec::is_empty)
            || t.generation_attention.get("bf16").is_none_or(Vec::is_empty)
        {
            return Err(OpsError { system: s, reason: "attention tables for bf16: missing".into() });
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_is_exact_on_points_and_grows_past_the_end() {
        let xs = [1.0, 2.0, 4.0];
        let ys = [1.0, 2.0, 4.0];
        let a = [(&xs[..], Axis::Log(1.0))];
        assert_eq!(interpolate(&a, &ys, &[2.0]), 2.0);
        assert!((interpolate(&a, &ys, &[8.0]) - 8.0).abs() < 1e-12);
        assert_eq!(interpolate(&a, &ys, &[0.5]), 1.0, "clamped below");
        // Halfway in log2 between 2 and 4.
        assert!((interpolate(&a, &ys, &[2f64.powf(1.5)]) - 3.0).abs() < 1e-12);
        let g = GemmTable {
            m: vec![1.0, 2.0],
            n: vec![1.0, 2.0],
            k: vec![1.0, 2.0],
            ms: (1..=8).map(f64::from).collect(),
        };
        assert_eq!(g.at(2.0, 1.0, 2.0), 6.0);
        assert_eq!(g.at(4.0, 1.0, 2.0), 12.0);
    }
}
