//! Dynamo planner profiler results (raw measurements) turned into a lookup table.
//!
//! The reference's launcher (ai-dynamo 1.6.1, `--planner-profile-data DIR`) does not
//! interpolate the raw points: it fits the planner's forward-pass regressions and samples
//! them on a regular grid. We do the same:
//! - prefill: one pass per profiled ISL, wall time = a + b·tokens (least squares with
//!   intercept; a negative slope is refused, as the planner rejects that fit);
//! - decode: each point becomes a pass of `round(kv_usage·max_kv_tokens)` KV tokens and
//!   `max(1, round(kv/context))` requests; wall time = a + b₁·requests + b₂·kv (a negative
//!   KV slope is refused; a requests slope below −1e-6 is set to 0, keeping the intercept);
//! - grid: `resolution` points from the smallest to the largest profiled ISL; KV from 0 to
//!   the largest profiled KV, context from 1 to the largest profiled KV/requests, with
//!   requests = max(1, kv/context); every prediction floored at 1 ns (1e-6 ms) and kept
//!   in milliseconds.
//!
//! The least-squares solve is our own (a two-column QR); the reference calls scikit-learn,
//! so the fitted coefficients agree to rounding, not bit for bit.

use std::path::{Path, PathBuf};

use mocker_core::timing::{ProfileArrays, ProfileTable};
use serde_json::Value;

use crate::npz::{read_capped, Npz};
use crate::LoadError;

/// Grid points per axis, as the reference's launcher uses.
pub const DEFAULT_RESOLUTION: usize = 100;

/// Wall-time floor of a prediction, in seconds (the planner's).
const MIN_WALL_S: f64 = 1e-6;

/// A requests-slope below this is treated as noise and zeroed (the planner's tolerance).
const RELAXABLE_NEGATIVE: f64 = 1e-6;

/// Whether `dir` holds profiler results in either layout the reference accepts.
pub fn is_results_dir(dir: &Path) -> bool {
    dir.is_dir()
        && (dir.join(PREFILL_NPZ).is_file() || dir.join(PREFILL_JSON).is_file())
        && (dir.join(DECODE_NPZ).is_file() || dir.join(DECODE_JSON).is_file())
}

const PREFILL_NPZ: &str = "selected_prefill_interpolation/raw_data.npz";
const PREFILL_JSON: &str = "prefill_raw_data.json";
const DECODE_NPZ: &str = "selected_decode_interpolation/raw_data.npz";
const DECODE_JSON: &str = "decode_raw_data.json";

/// Measured prefill points: tokens (as integers, like the planner) and seconds.
struct PrefillPoints {
    tokens: Vec<f64>,
    seconds: Vec<f64>,
}

/// Measured decode passes: batch size, KV tokens, seconds.
struct DecodePoints {
    requests: Vec<f64>,
    kv: Vec<f64>,
    seconds: Vec<f64>,
}

/// Converts the profiler results in `dir` to a table on a `resolution`-point grid.
pub fn convert_results_dir(dir: &Path, resolution: usize) -> Result<ProfileTable, LoadError> {
    let resolution = resolution.max(2);
    let prefill = read_prefill(dir)?;
    let decode = read_decode(dir)?;

    let (file, _) = prefill_source(dir);
    let (a, b) = fit_line(&prefill.tokens, &prefill.seconds);
    if b.is_nan() || b < 0.0 {
        let reason =
            format!("the prefill fit has a negative or undefined slope ({b}); cannot build a profile");
        return Err(LoadError::array(&file, "prefill_ttft", reason));
    }
    let lo = prefill.tokens.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = prefill.tokens.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let prefill_isl = linspace(lo, hi, resolution);
    let prefill_ttft_ms = prefill_isl.iter().map(|&x| (x * b + a).max(MIN_WALL_S) * 1000.0).collect();

    let (file, _) = decode_source(dir);
    let (a, mut b_req, b_kv) = fit_plane(&decode.requests, &decode.kv, &decode.seconds);
    if b_kv.is_nan() || b_kv < 0.0 {
        let reason =
            format!("the decode fit has a negative or undefined KV slope ({b_kv}); cannot build a profile");
        return Err(LoadError::array(&file, "z_itl", reason));
    }
    if b_req < -RELAXABLE_NEGATIVE {
        b_req = 0.0;
    }
    let max_kv = decode.kv.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let max_ctx = decode
        .kv
        .iter()
        .zip(&decode.requests)
        .map(|(kv, n)| kv / n.max(1.0))
        .fold(f64::NEG_INFINITY, f64::max);
    let kv_axis = linspace(0.0, max_kv, resolution);
    let ctx_axis = linspace(1.0, max_ctx, resolution);
    let mut itl = Vec::with_capacity(resolution * resolution);
    for &kv in &kv_axis {
        for &ctx in &ctx_axis {
            let requests = if ctx > 0.0 { (kv / ctx).max(1.0) } else { 1.0 };
            itl.push((requests * b_req + kv * b_kv + a).max(MIN_WALL_S) * 1000.0);
        }
    }
    ProfileTable::new(ProfileArrays {
        prefill_isl,
        prefill_ttft_ms,
        decode_active_kv_tokens: kv_axis,
        decode_context_length: ctx_axis,
        decode_itl: itl,
        decode_itl_shape: (resolution, resolution),
        ..Default::default()
    })
    .map_err(|e| LoadError::file(dir, format!("the converted table is unusable: {e}")))
}

fn prefill_source(dir: &Path) -> (PathBuf, bool) {
    let npz = dir.join(PREFILL_NPZ);
    if npz.is_file() {
        (npz, true)
    } else {
        (dir.join(PREFILL_JSON), false)
    }
}

fn decode_source(dir: &Path) -> (PathBuf, bool) {
    let npz = dir.join(DECODE_NPZ);
    if npz.is_file() {
        (npz, true)
    } else {
        (dir.join(DECODE_JSON), false)
    }
}

/// Named arrays of one raw-data file, in either of its forms.
enum Raw<'p> {
    Npz(Npz<'p>),
    Json(&'p Path, serde_json::Map<String, Value>),
}

impl<'p> Raw<'p> {
    fn open(path: &'p Path, is_npz: bool) -> Result<Self, LoadError> {
        if is_npz {
            return Npz::open(path).map(Raw::Npz);
        }
        let bytes = read_capped(path)?;
        match serde_json::from_slice(&bytes) {
            Ok(Value::Object(map)) => Ok(Raw::Json(path, map)),
            Ok(_) => Err(LoadError::file(path, "must be a JSON object of arrays")),
            Err(e) => Err(LoadError::file(path, format!("invalid JSON: {e}"))),
        }
    }

    fn values(&mut self, name: &'static str) -> Result<Vec<f64>, LoadError> {
        match self {
            Raw::Npz(npz) => Ok(npz.array(name)?.values),
            Raw::Json(path, map) => {
                let err = |reason: &str| LoadError::array(path, name, reason.to_string());
                match map.get(name) {
                    None => Err(err("missing")),
                    Some(Value::Array(items)) => items
                        .iter()
                        .map(|v| v.as_f64().ok_or_else(|| err("must hold only numbers")))
                        .collect(),
                    Some(v) => v
                        .as_f64()
                        .map(|x| vec![x])
                        .ok_or_else(|| err("must be a number or an array of numbers")),
                }
            }
        }
    }
}

fn same_length(path: &Path, named: &[(&'static str, usize)]) -> Result<(), LoadError> {
    let (first, n) = named[0];
    if n == 0 {
        return Err(LoadError::array(path, first, "is empty: no profiled points".to_string()));
    }
    match named.iter().find(|(_, m)| *m != n) {
        Some((other, m)) => Err(LoadError::array(path, other, format!("has {m} values but {first} has {n}"))),
        None => Ok(()),
    }
}

fn finite(path: &Path, name: &'static str, xs: &[f64]) -> Result<(), LoadError> {
    match xs.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(LoadError::array(path, name, format!("value {} at index {i} is not finite", xs[i]))),
        None => Ok(()),
    }
}

fn read_prefill(dir: &Path) -> Result<PrefillPoints, LoadError> {
    let (path, is_npz) = prefill_source(dir);
    let mut raw = Raw::open(&path, is_npz)?;
    let isl = raw.values("prefill_isl")?;
    let ttft = raw.values("prefill_ttft")?;
    same_length(&path, &[("prefill_isl", isl.len()), ("prefill_ttft", ttft.len())])?;
    finite(&path, "prefill_isl", &isl)?;
    finite(&path, "prefill_ttft", &ttft)?;
    // A zero wall time is "no measurement" to the planner.
    let (tokens, seconds) =
        isl.iter().zip(&ttft).filter(|(_, &t)| t != 0.0).map(|(&x, &t)| (x.trunc(), t / 1000.0)).unzip();
    Ok(PrefillPoints { tokens, seconds })
}

fn read_decode(dir: &Path) -> Result<DecodePoints, LoadError> {
    let (path, is_npz) = decode_source(dir);
    let mut raw = Raw::open(&path, is_npz)?;
    let usage = raw.values("x_kv_usage")?;
    let context = raw.values("y_context_length")?;
    let itl = raw.values("z_itl")?;
    let max_kv = raw.values("max_kv_tokens")?;
    same_length(
        &path,
        &[("x_kv_usage", usage.len()), ("y_context_length", context.len()), ("z_itl", itl.len())],
    )?;
    for (name, xs) in
        [("x_kv_usage", &usage), ("y_context_length", &context), ("z_itl", &itl), ("max_kv_tokens", &max_kv)]
    {
        finite(&path, name, xs)?;
    }
    let max_kv = match max_kv.first() {
        Some(&m) if m > 0.0 => m.trunc(),
        _ => return Err(LoadError::array(&path, "max_kv_tokens", "must be a positive number".into())),
    };
    let mut points = DecodePoints { requests: vec![], kv: vec![], seconds: vec![] };
    for ((&u, &ctx), &ms) in usage.iter().zip(&context).zip(&itl) {
        if ms == 0.0 {
            continue;
        }
        // Python's round() rounds halves to even.
        let kv = (u * max_kv).round_ties_even();
        let requests = if ctx > 0.0 { (kv / ctx).round_ties_even().max(1.0) } else { 1.0 };
        points.requests.push(requests);
        points.kv.push(kv);
        points.seconds.push(ms / 1000.0);
    }
    if points.kv.is_empty() {
        return Err(LoadError::array(&path, "z_itl", "has no non-zero measurement".into()));
    }
    Ok(points)
}

/// `n` evenly spaced points from `lo` to `hi` inclusive, computed as NumPy's `linspace`.
fn linspace(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let step = (hi - lo) / (n - 1) as f64;
    let mut v: Vec<f64> = (0..n).map(|i| i as f64 * step + lo).collect();
    v[n - 1] = hi;
    v
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Least-squares line `y = a + b·x`: returns (a, b).
fn fit_line(x: &[f64], y: &[f64]) -> (f64, f64) {
    let (mx, my) = (mean(x), mean(y));
    let sxx: f64 = x.iter().map(|v| (v - mx) * (v - mx)).sum();
    let sxy: f64 = x.iter().zip(y).map(|(v, w)| (v - mx) * (w - my)).sum();
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - mx * b, b)
}

/// Least-squares plane `y = a + b₁·x₁ + b₂·x₂` on centred data by a two-column QR
/// (minimum-norm when the columns are collinear, as a least-squares solver gives):
/// returns (a, b₁, b₂).
fn fit_plane(x1: &[f64], x2: &[f64], y: &[f64]) -> (f64, f64, f64) {
    let (m1, m2, my) = (mean(x1), mean(x2), mean(y));
    let c1: Vec<f64> = x1.iter().map(|v| v - m1).collect();
    let c2: Vec<f64> = x2.iter().map(|v| v - m2).collect();
    let cy: Vec<f64> = y.iter().map(|v| v - my).collect();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
    let n1 = dot(&c1, &c1).sqrt();
    let (b1, b2) = if n1 == 0.0 {
        let n2 = dot(&c2, &c2);
        (0.0, if n2 > 0.0 { dot(&c2, &cy) / n2 } else { 0.0 })
    } else {
        let q1: Vec<f64> = c1.iter().map(|v| v / n1).collect();
        let r12 = dot(&q1, &c2);
        let v: Vec<f64> = c2.iter().zip(&q1).map(|(c, q)| c - r12 * q).collect();
        let r22 = dot(&v, &v).sqrt();
        let scale = dot(&c2, &c2).sqrt().max(f64::MIN_POSITIVE);
        if r22 <= 1e-12 * scale {
            // c2 = k·c1: split the 1-D coefficient with the smallest norm.
            let beta = dot(&q1, &cy) / n1;
            let k = r12 / n1;
            (beta / (1.0 + k * k), beta * k / (1.0 + k * k))
        } else {
            let q2: Vec<f64> = v.iter().map(|x| x / r22).collect();
            let b2 = dot(&q2, &cy) / r22;
            ((dot(&q1, &cy) - r12 * b2) / n1, b2)
        }
    };
    (my - (m1 * b1 + m2 * b2), b1, b2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_plane_fits_recover_exact_models() {
        let x = [1.0, 2.0, 4.0, 8.0];
        let y: Vec<f64> = x.iter().map(|v| 0.5 + 2.0 * v).collect();
        let (a, b) = fit_line(&x, &y);
        assert!((a - 0.5).abs() < 1e-12 && (b - 2.0).abs() < 1e-12);

        let x1 = [1.0, 2.0, 3.0, 5.0, 8.0];
        let x2 = [10.0, 40.0, 20.0, 90.0, 60.0];
        let y: Vec<f64> = x1.iter().zip(&x2).map(|(p, q)| 3.0 - 0.25 * p + 0.01 * q).collect();
        let (a, b1, b2) = fit_plane(&x1, &x2, &y);
        assert!((a - 3.0).abs() < 1e-10 && (b1 + 0.25).abs() < 1e-10 && (b2 - 0.01).abs() < 1e-12);

        // Collinear columns: minimum-norm split of the slope.
        let x2c: Vec<f64> = x1.iter().map(|v| 2.0 * v).collect();
        let y: Vec<f64> = x1.iter().map(|v| 1.0 + 5.0 * v).collect();
        let (a, b1, b2) = fit_plane(&x1, &x2c, &y);
        assert!((b1 - 1.0).abs() < 1e-9 && (b2 - 2.0).abs() < 1e-9 && (a - 1.0).abs() < 1e-9);
    }

    #[test]
    fn linspace_matches_numpy() {
        assert_eq!(linspace(1.0, 3.0, 5), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
        let v = linspace(100.0, 16372.0, 100);
        assert_eq!((v[0], v[99]), (100.0, 16372.0));
        assert!((v[20] - 3387.2727272727275).abs() < 1e-9);
    }
}
