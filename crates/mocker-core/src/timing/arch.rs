//! Pass timing composed from a model's operations (`--model`, `--gpu`).
//!
//! A shell prices each operation of the model on the GPU (GEMMs, attention, MoE,
//! all-reduce, LM head) and folds them into four curves, so a pass costs a handful of
//! interpolations, like a profile lookup:
//!
//! - `linear`: everything proportional to the tokens a pass computes (projections, MLP or
//!   experts, norms, all-reduce), over the pass's token count;
//! - `logits`: LM head and sampling, over the sequences that produce a token;
//! - `prefill_attention`: context attention of a batch of prefilling requests, over
//!   (requests, new tokens each, cached tokens each);
//! - `decode_attention`: attention of a decode batch, over (requests, context each);
//!
//! plus a fixed per-pass overhead (scheduler, input preparation, launch).

use super::{DecodeShape, PrefillShape, TimingModel};

/// A piecewise-linear function over a strictly increasing axis, extended past both ends
/// along its end segments and never below zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    xs: Vec<f64>,
    ys: Vec<f64>,
}

/// Why a set of points is not a usable curve or grid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct GridError(String);

fn check_axis(name: &str, xs: &[f64]) -> Result<(), GridError> {
    if xs.len() < 2 {
        return Err(GridError(format!("{name}: needs at least 2 points, got {}", xs.len())));
    }
    if xs.iter().any(|x| !x.is_finite()) || xs.windows(2).any(|w| w[0] >= w[1]) {
        return Err(GridError(format!("{name}: must be finite and strictly increasing")));
    }
    Ok(())
}

fn check_values(name: &str, ys: &[f64], want: usize) -> Result<(), GridError> {
    if ys.len() != want {
        return Err(GridError(format!("{name}: has {} values, its axes make {want}", ys.len())));
    }
    if let Some(y) = ys.iter().find(|y| !y.is_finite() || **y < 0.0) {
        return Err(GridError(format!("{name}: value {y} is not a finite, non-negative time")));
    }
    Ok(())
}

/// Index `i` of the segment `xs[i]..xs[i+1]` that holds (or, past the ends, extends to) `x`,
/// and the fraction along it (outside 0..=1 past the ends).
#[inline]
fn locate(xs: &[f64], x: f64) -> (usize, f64) {
    let n = xs.len();
    let i = xs.partition_point(|&v| v <= x).clamp(1, n - 1) - 1;
    (i, (x - xs[i]) / (xs[i + 1] - xs[i]))
}

#[inline]
fn lerp(a: f64, b: f64, t: f64) -> f64 {
    a + (b - a) * t
}

impl Curve {
    /// A curve through `(xs[i], ys[i])`.
    pub fn new(name: &str, xs: Vec<f64>, ys: Vec<f64>) -> Result<Self, GridError> {
        check_axis(name, &xs)?;
        check_values(name, &ys, xs.len())?;
        Ok(Self { xs, ys })
    }

    /// The value at `x`.
    #[inline]
    pub fn at(&self, x: f64) -> f64 {
        let (i, t) = locate(&self.xs, x);
        lerp(self.ys[i], self.ys[i + 1], t).max(0.0)
    }
}

/// A function sampled on a grid of two or three axes (row-major values), read by
/// multilinear interpolation that extends the end segments, never below zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    axes: Vec<Vec<f64>>,
    values: Vec<f64>,
}

impl Grid {
    /// A grid over `axes` (two or three), with `values` row-major (last axis fastest).
    pub fn new(name: &str, axes: Vec<Vec<f64>>, values: Vec<f64>) -> Result<Self, GridError> {
        if !(2..=3).contains(&axes.len()) {
            return Err(GridError(format!("{name}: needs 2 or 3 axes, got {}", axes.len())));
        }
        for (i, a) in axes.iter().enumerate() {
            check_axis(&format!("{name} axis {i}"), a)?;
        }
        check_values(name, &values, axes.iter().map(Vec::len).product())?;
        Ok(Self { axes, values })
    }

    /// The value at `(x, y)` of a two-axis grid, or at `(x, y, z)` of a three-axis one.
    #[inline]
    pub fn at(&self, point: &[f64]) -> f64 {
        match self.axes.len() {
            2 => {
                let (i, ti) = locate(&self.axes[0], point[0]);
                let (j, tj) = locate(&self.axes[1], point[1]);
                let n = self.axes[1].len();
                let v = |a: usize, b: usize| self.values[a * n + b];
                lerp(lerp(v(i, j), v(i, j + 1), tj), lerp(v(i + 1, j), v(i + 1, j + 1), tj), ti).max(0.0)
            }
            _ => {
                let (i, ti) = locate(&self.axes[0], point[0]);
                let (j, tj) = locate(&self.axes[1], point[1]);
                let (k, tk) = locate(&self.axes[2], point[2]);
                let (n1, n2) = (self.axes[1].len(), self.axes[2].len());
                let v = |a: usize, b: usize, c: usize| self.values[(a * n1 + b) * n2 + c];
                let plane = |a: usize| {
                    lerp(
                        lerp(v(a, j, k), v(a, j, k + 1), tk),
                        lerp(v(a, j + 1, k), v(a, j + 1, k + 1), tk),
                        tj,
                    )
                };
                lerp(plane(i), plane(i + 1), ti).max(0.0)
            }
        }
    }
}

/// Pass timing from a model's operations on a GPU, folded into curves (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct ArchTiming {
    /// What was modelled, for start lines and reports (e.g. "Llama-3.1-8B on h100, TP 1").
    pub label: String,
    /// ms of token-proportional work over tokens computed in the pass.
    pub linear: Curve,
    /// ms of LM head and sampling over sequences that produce a token.
    pub logits: Curve,
    /// ms of context attention over (prefilling requests, new tokens each, cached tokens each).
    pub prefill_attention: Grid,
    /// ms of decode attention over (decoding requests, context tokens each).
    pub decode_attention: Grid,
    /// Fixed ms every pass costs (scheduler, input preparation, kernel launch).
    pub pass_overhead_ms: f64,
}

impl ArchTiming {
    #[inline]
    fn prefill_parts(&self, s: PrefillShape) -> (f64, f64) {
        let new = s.mean_isl.saturating_sub(s.mean_prefix);
        if s.batch == 0 || new == 0 {
            return (0.0, 0.0);
        }
        let tokens = (s.batch * new) as f64;
        let attention = self.prefill_attention.at(&[s.batch as f64, new as f64, s.mean_prefix as f64]);
        (tokens, attention + self.logits.at(s.batch as f64))
    }

    #[inline]
    fn decode_attention_ms(&self, s: DecodeShape) -> f64 {
        let context = s.active_kv_tokens as f64 / s.batch as f64;
        self.decode_attention.at(&[s.batch as f64, context])
    }
}

impl TimingModel for ArchTiming {
    #[inline]
    fn prefill_ms(&self, s: PrefillShape) -> f64 {
        let (tokens, rest) = self.prefill_parts(s);
        if tokens == 0.0 {
            return 0.0;
        }
        self.linear.at(tokens) + rest + self.pass_overhead_ms
    }

    #[inline]
    fn decode_ms(&self, s: DecodeShape) -> f64 {
        if s.batch == 0 {
            return 0.0;
        }
        let b = s.batch as f64;
        self.linear.at(b) + self.logits.at(b) + self.decode_attention_ms(s) + self.pass_overhead_ms
    }

    /// One pass computes every token together: the decode part is what its tokens add to
    /// the prefill's (the GEMMs' marginal cost, their logits, their attention).
    #[inline]
    fn mixed_ms(&self, p: PrefillShape, d: DecodeShape) -> (f64, f64) {
        let (tokens, rest) = self.prefill_parts(p);
        if tokens == 0.0 {
            return (0.0, self.decode_ms(d));
        }
        if d.batch == 0 {
            return (self.prefill_ms(p), 0.0);
        }
        let b = d.batch as f64;
        let prefill_linear = self.linear.at(tokens);
        let prefill = prefill_linear + rest + self.pass_overhead_ms;
        let added_linear = (self.linear.at(tokens + b) - prefill_linear).max(0.0);
        let added_logits = (self.logits.at(p.batch as f64 + b) - self.logits.at(p.batch as f64)).max(0.0);
        (prefill, added_linear + added_logits + self.decode_attention_ms(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> ArchTiming {
        let axis = |v: &[f64]| v.to_vec();
        ArchTiming {
            label: "test".into(),
            linear: Curve::new("linear", axis(&[1.0, 1024.0]), vec![1.0, 11.0]).unwrap(),
            logits: Curve::new("logits", axis(&[1.0, 256.0]), vec![0.1, 0.6]).unwrap(),
            prefill_attention: Grid::new(
                "prefill",
                vec![axis(&[1.0, 2.0]), axis(&[16.0, 1024.0]), axis(&[0.0, 1024.0])],
                vec![0.1, 0.2, 1.0, 2.0, 0.2, 0.4, 2.0, 4.0],
            )
            .unwrap(),
            decode_attention: Grid::new(
                "decode",
                vec![axis(&[1.0, 64.0]), axis(&[16.0, 4096.0])],
                vec![0.01, 0.1, 0.1, 2.0],
            )
            .unwrap(),
            pass_overhead_ms: 2.0,
        }
    }

    #[test]
    fn curves_interpolate_and_extend_their_end_segments() {
        let c = Curve::new("c", vec![0.0, 10.0, 20.0], vec![0.0, 10.0, 30.0]).unwrap();
        assert_eq!(c.at(5.0), 5.0);
        assert_eq!(c.at(15.0), 20.0);
        assert_eq!(c.at(30.0), 50.0);
        assert_eq!(c.at(-100.0), 0.0, "never below zero");
        assert!(Curve::new("c", vec![0.0, 0.0], vec![1.0, 2.0]).is_err());
        assert!(Curve::new("c", vec![0.0, 1.0], vec![1.0]).is_err());
        assert!(Curve::new("c", vec![0.0, 1.0], vec![1.0, f64::NAN]).is_err());
    }

    #[test]
    fn grids_interpolate_each_axis() {
        let g = Grid::new("g", vec![vec![0.0, 1.0], vec![0.0, 1.0]], vec![0.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(g.at(&[0.5, 0.5]), 1.5);
        assert_eq!(g.at(&[1.0, 0.0]), 2.0);
        assert_eq!(g.at(&[2.0, 1.0]), 5.0, "extends past the end");
        let g3 = Grid::new(
            "g",
            vec![vec![0.0, 1.0], vec![0.0, 1.0], vec![0.0, 1.0]],
            (0..8).map(f64::from).collect(),
        )
        .unwrap();
        assert_eq!(g3.at(&[1.0, 0.0, 1.0]), 5.0);
        assert_eq!(g3.at(&[0.5, 0.5, 0.5]), 3.5);
        assert!(Grid::new("g", vec![vec![0.0, 1.0]], vec![0.0, 1.0]).is_err());
    }

    #[test]
    fn a_pass_adds_its_operations_and_overhead() {
        let t = timing();
        let p = PrefillShape { batch: 1, mean_isl: 1024, mean_prefix: 0 };
        // linear(1024) 11 + attention(1, 1024, 0) 1.0 + logits(1) 0.1 + overhead 2.
        assert!((t.prefill_ms(p) - 14.1).abs() < 1e-9);
        let d = DecodeShape { batch: 64, active_kv_tokens: 64 * 4096, total_kv_tokens: 1 << 20 };
        let linear64 = 1.0 + 10.0 * 63.0 / 1023.0;
        let logits64 = 0.1 + 0.5 * 63.0 / 255.0;
        assert!((t.decode_ms(d) - (linear64 + logits64 + 2.0 + 2.0)).abs() < 1e-9);
        assert_eq!(t.prefill_ms(PrefillShape { batch: 1, mean_isl: 64, mean_prefix: 64 }), 0.0);
        assert_eq!(t.decode_ms(DecodeShape { batch: 0, active_kv_tokens: 0, total_kv_tokens: 1 }), 0.0);
    }

    #[test]
    fn a_mixed_pass_costs_less_than_its_parts_apart() {
        let t = timing();
        let p = PrefillShape { batch: 1, mean_isl: 512, mean_prefix: 0 };
        let d = DecodeShape { batch: 32, active_kv_tokens: 32 * 1024, total_kv_tokens: 1 << 20 };
        let (pp, dd) = t.mixed_ms(p, d);
        assert_eq!(pp, t.prefill_ms(p));
        assert!(dd > 0.0);
        assert!(pp + dd < t.prefill_ms(p) + t.decode_ms(d), "one overhead and one weight read");
        assert_eq!(t.mixed_ms(p, DecodeShape { batch: 0, ..d }), (t.prefill_ms(p), 0.0));
    }
}
