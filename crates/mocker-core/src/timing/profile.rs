//! Pass timing from measured lookup tables (the reference's `dynamo_profile` provider).
//!
//! A profile is two tables: prefill time over the number of new tokens in the pass, and
//! decode time over (KV tokens attended to, mean context per request). Both are read by
//! linear interpolation that keeps extending the end segments past the table's range, as
//! the reference does; the arithmetic is kept in the same order so the results agree to
//! the last bit.

use super::{DecodeShape, PrefillShape, TimingModel};

/// Why a set of arrays is not a usable profile.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// `prefill_isl` and `prefill_ttft_ms` differ in length.
    #[error("Prefill array length mismatch: isl={isl}, ttft={ttft}")]
    PrefillLength {
        /// Points on the ISL axis.
        isl: usize,
        /// Values given.
        ttft: usize,
    },
    /// The decode grid's shape does not match its axes.
    #[error(
        "Decode array dimension mismatch: itl shape=({rows}, {cols}), active_kv={kv}, context={context}"
    )]
    DecodeShape {
        /// Rows of `decode_itl`.
        rows: usize,
        /// Columns of `decode_itl`.
        cols: usize,
        /// Points on the KV axis.
        kv: usize,
        /// Points on the context axis.
        context: usize,
    },
    /// An axis has fewer than two points or is not strictly increasing.
    #[error("{array}: {reason}")]
    Axis {
        /// The array's name in the profile file.
        array: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An extension grid's size does not match its axes.
    #[error("{array}: has {got} values, but its axes make a {shape:?} grid")]
    GridShape {
        /// The array's name in the profile file.
        array: &'static str,
        /// Values given.
        got: usize,
        /// Lengths of its axes.
        shape: Vec<usize>,
    },
    /// A time is beyond [`MAX_PROFILE_MS`] either way.
    #[error("{array}: value {value:e} at index {index} is outside [-{max:e}, {max:e}] ms (an hour a pass)", max = MAX_PROFILE_MS)]
    TimeRange {
        /// The array's name in the profile file.
        array: &'static str,
        /// Flat index of the value.
        index: usize,
        /// The value.
        value: f64,
    },
    /// A value is NaN or infinite.
    #[error("{array}: value {value} at index {index} is not finite")]
    NotFinite {
        /// The array's name in the profile file.
        array: &'static str,
        /// Flat index of the value.
        index: usize,
        /// The value.
        value: f64,
    },
}

/// A strictly increasing axis with at least two points.
fn check_axis(array: &'static str, xs: &[f64]) -> Result<(), ProfileError> {
    check_finite(array, xs)?;
    if xs.len() < 2 {
        let reason = format!("needs at least 2 points to interpolate, got {}", xs.len());
        return Err(ProfileError::Axis { array, reason });
    }
    if let Some(i) = xs.windows(2).position(|w| w[0] >= w[1]) {
        let reason = format!(
            "axis must be strictly increasing, but value {} at index {} is followed by {}",
            xs[i],
            i,
            xs[i + 1]
        );
        return Err(ProfileError::Axis { array, reason });
    }
    Ok(())
}

/// A grid of times.
fn check_grid(array: &'static str, values: &[f64], shape: Vec<usize>) -> Result<(), ProfileError> {
    if values.len() != shape.iter().product::<usize>() {
        return Err(ProfileError::GridShape { array, got: values.len(), shape });
    }
    check_times(array, values)
}

/// Largest measured pass time a profile may give, ms (an hour, the engine args' bound of a
/// fixed pass time): a larger one would push the simulated clock past its range.
pub const MAX_PROFILE_MS: f64 = 3.6e6;

/// Finite times within [`MAX_PROFILE_MS`] (negative ones are floored at 0 when used).
fn check_times(array: &'static str, xs: &[f64]) -> Result<(), ProfileError> {
    check_finite(array, xs)?;
    match xs.iter().position(|v| v.abs() > MAX_PROFILE_MS) {
        Some(index) => Err(ProfileError::TimeRange { array, index, value: xs[index] }),
        None => Ok(()),
    }
}

fn check_finite(array: &'static str, xs: &[f64]) -> Result<(), ProfileError> {
    match xs.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(ProfileError::NotFinite { array, index, value: xs[index] }),
        None => Ok(()),
    }
}

/// Index `i` of the segment `[xs[i], xs[i+1]]` used for `x`: the last point at or left of
/// `x`, clamped so that points beyond either end use the first or last segment.
#[inline]
fn segment(xs: &[f64], x: f64) -> usize {
    // `xs` is strictly increasing with at least two points (checked at construction).
    xs.partition_point(|&v| v <= x).saturating_sub(1).min(xs.len() - 2)
}

/// The value at `x` on the line through `(x1, y1)` and `(x2, y2)`, computed in the
/// reference's order (slope first) so both agree bit for bit.
#[inline]
fn on_line((x1, y1): (f64, f64), (x2, y2): (f64, f64), x: f64) -> f64 {
    let slope = (y2 - y1) / (x2 - x1);
    slope * (x - x1) + y1
}

/// A measured timing profile: the converted lookup-table form of Dynamo's planner profiles.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileTable {
    prefill_isl: Vec<f64>,
    prefill_ttft_ms: Vec<f64>,
    decode_kv: Vec<f64>,
    decode_context: Vec<f64>,
    /// Row-major, `decode_kv.len()` rows by `decode_context.len()` columns.
    decode_itl_ms: Vec<f64>,
    /// Prefill time by (new tokens, cached prefix), when the profile measured it.
    prefill_by_prefix: Option<Grid2>,
    /// Whole mixed-pass time by (prefill tokens, decode requests, context), when measured.
    mixed: Option<Grid3>,
}

/// Values on a rectangular grid, row-major.
#[derive(Debug, Clone, PartialEq)]
struct Grid2 {
    x: Vec<f64>,
    y: Vec<f64>,
    z: Vec<f64>,
}

impl Grid2 {
    fn at(&self, x: f64, y: f64) -> f64 {
        bilinear(&self.x, &self.y, &self.z, x, y)
    }
}

/// Values on a box grid, row-major (x slowest).
#[derive(Debug, Clone, PartialEq)]
struct Grid3 {
    x: Vec<f64>,
    y: Vec<f64>,
    z: Vec<f64>,
    v: Vec<f64>,
}

impl Grid3 {
    /// Trilinear interpolation, extended past the ends like the 2-D lookups.
    fn at(&self, x: f64, y: f64, z: f64) -> f64 {
        let i = segment(&self.x, x);
        let plane = self.y.len() * self.z.len();
        let lo = bilinear(&self.y, &self.z, &self.v[i * plane..(i + 1) * plane], y, z);
        let hi = bilinear(&self.y, &self.z, &self.v[(i + 1) * plane..(i + 2) * plane], y, z);
        on_line((self.x[i], lo), (self.x[i + 1], hi), x)
    }
}

/// Bilinear interpolation of row-major `z` over axes `xs` (rows) and `ys` (columns), in
/// the reference's order: along x on both bracketing columns, then along y.
#[inline]
fn bilinear(xs: &[f64], ys: &[f64], z: &[f64], x: f64, y: f64) -> f64 {
    let (i, j) = (segment(xs, x), segment(ys, y));
    let cols = ys.len();
    let at = |r: usize, c: usize| z[r * cols + c];
    let at_y1 = on_line((xs[i], at(i, j)), (xs[i + 1], at(i + 1, j)), x);
    let at_y2 = on_line((xs[i], at(i, j + 1)), (xs[i + 1], at(i + 1, j + 1)), x);
    on_line((ys[j], at_y1), (ys[j + 1], at_y2), y)
}

/// The arrays of a profile, named as in the reference's `perf_data.npz`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProfileArrays {
    /// New prefill tokens in a pass (strictly increasing).
    pub prefill_isl: Vec<f64>,
    /// Prefill time in ms at each `prefill_isl` point.
    pub prefill_ttft_ms: Vec<f64>,
    /// Decode grid rows: KV tokens attended to in the pass (strictly increasing).
    pub decode_active_kv_tokens: Vec<f64>,
    /// Decode grid columns: mean context length per request (strictly increasing).
    pub decode_context_length: Vec<f64>,
    /// Decode time in ms, row-major.
    pub decode_itl: Vec<f64>,
    /// Shape of `decode_itl` as stored: (rows, columns).
    pub decode_itl_shape: (usize, usize),
    /// mocker's extension (empty when absent): columns of `prefill_ms`, the cached prefix
    /// per request (strictly increasing).
    pub prefill_prefix_tokens: Vec<f64>,
    /// Prefill time in ms by new tokens (rows, the `prefill_isl` axis) and cached prefix
    /// (columns), row-major.
    pub prefill_ms: Vec<f64>,
    /// mocker's extension (empty when absent): new prompt tokens of a mixed pass.
    pub mixed_prefill_tokens: Vec<f64>,
    /// Decode requests sharing a mixed pass.
    pub mixed_decode_requests: Vec<f64>,
    /// Mean context of those decode requests.
    pub mixed_decode_context: Vec<f64>,
    /// Whole mixed-pass time in ms, prefill tokens × decode requests × context, row-major.
    pub mixed_ms: Vec<f64>,
}

impl ProfileTable {
    /// Checks the arrays (lengths, grid shape, axes strictly increasing, values finite)
    /// and builds the table.
    pub fn new(a: ProfileArrays) -> Result<Self, ProfileError> {
        if a.prefill_isl.len() != a.prefill_ttft_ms.len() {
            return Err(ProfileError::PrefillLength {
                isl: a.prefill_isl.len(),
                ttft: a.prefill_ttft_ms.len(),
            });
        }
        let (rows, cols) = a.decode_itl_shape;
        if rows != a.decode_active_kv_tokens.len()
            || cols != a.decode_context_length.len()
            || rows * cols != a.decode_itl.len()
        {
            return Err(ProfileError::DecodeShape {
                rows,
                cols,
                kv: a.decode_active_kv_tokens.len(),
                context: a.decode_context_length.len(),
            });
        }
        check_axis("prefill_isl", &a.prefill_isl)?;
        check_times("prefill_ttft_ms", &a.prefill_ttft_ms)?;
        check_axis("decode_active_kv_tokens", &a.decode_active_kv_tokens)?;
        check_axis("decode_context_length", &a.decode_context_length)?;
        check_times("decode_itl", &a.decode_itl)?;
        let prefill_by_prefix = if a.prefill_prefix_tokens.is_empty() && a.prefill_ms.is_empty() {
            None
        } else {
            check_axis("prefill_prefix_tokens", &a.prefill_prefix_tokens)?;
            let shape = vec![a.prefill_isl.len(), a.prefill_prefix_tokens.len()];
            check_grid("prefill_ms", &a.prefill_ms, shape)?;
            Some(Grid2 { x: a.prefill_isl.clone(), y: a.prefill_prefix_tokens, z: a.prefill_ms })
        };
        let mixed_given =
            [&a.mixed_prefill_tokens, &a.mixed_decode_requests, &a.mixed_decode_context, &a.mixed_ms];
        let mixed = if mixed_given.iter().all(|v| v.is_empty()) {
            None
        } else {
            check_axis("mixed_prefill_tokens", &a.mixed_prefill_tokens)?;
            check_axis("mixed_decode_requests", &a.mixed_decode_requests)?;
            check_axis("mixed_decode_context", &a.mixed_decode_context)?;
            let shape = vec![
                a.mixed_prefill_tokens.len(),
                a.mixed_decode_requests.len(),
                a.mixed_decode_context.len(),
            ];
            check_grid("mixed_ms", &a.mixed_ms, shape)?;
            Some(Grid3 {
                x: a.mixed_prefill_tokens,
                y: a.mixed_decode_requests,
                z: a.mixed_decode_context,
                v: a.mixed_ms,
            })
        };
        Ok(Self {
            prefill_isl: a.prefill_isl,
            prefill_ttft_ms: a.prefill_ttft_ms,
            decode_kv: a.decode_active_kv_tokens,
            decode_context: a.decode_context_length,
            decode_itl_ms: a.decode_itl,
            prefill_by_prefix,
            mixed,
        })
    }

    /// The arrays back, as they would be written to a profile file.
    pub fn arrays(&self) -> ProfileArrays {
        ProfileArrays {
            prefill_isl: self.prefill_isl.clone(),
            prefill_ttft_ms: self.prefill_ttft_ms.clone(),
            decode_active_kv_tokens: self.decode_kv.clone(),
            decode_context_length: self.decode_context.clone(),
            decode_itl: self.decode_itl_ms.clone(),
            decode_itl_shape: (self.decode_kv.len(), self.decode_context.len()),
            prefill_prefix_tokens: self.prefill_by_prefix.as_ref().map(|g| g.y.clone()).unwrap_or_default(),
            prefill_ms: self.prefill_by_prefix.as_ref().map(|g| g.z.clone()).unwrap_or_default(),
            mixed_prefill_tokens: self.mixed.as_ref().map(|g| g.x.clone()).unwrap_or_default(),
            mixed_decode_requests: self.mixed.as_ref().map(|g| g.y.clone()).unwrap_or_default(),
            mixed_decode_context: self.mixed.as_ref().map(|g| g.z.clone()).unwrap_or_default(),
            mixed_ms: self.mixed.as_ref().map(|g| g.v.clone()).unwrap_or_default(),
        }
    }

    /// Raw prefill time (ms, before floors) for `tokens` new tokens in one pass.
    pub fn prefill_at(&self, tokens: f64) -> f64 {
        let (xs, ys) = (&self.prefill_isl, &self.prefill_ttft_ms);
        let i = segment(xs, tokens);
        on_line((xs[i], ys[i]), (xs[i + 1], ys[i + 1]), tokens)
    }

    /// Raw decode time (ms, before floors) at `kv` tokens and mean context `context`.
    pub fn decode_at(&self, kv: f64, context: f64) -> f64 {
        bilinear(&self.decode_kv, &self.decode_context, &self.decode_itl_ms, kv, context)
    }

    /// Raw prefill time (ms, before floors) for `tokens` new tokens whose requests hold
    /// `prefix` cached tokens each: the prefix table where measured, else the 1-D table.
    pub fn prefill_with_prefix_at(&self, tokens: f64, prefix: f64) -> f64 {
        match &self.prefill_by_prefix {
            Some(g) => g.at(tokens, prefix),
            None => self.prefill_at(tokens),
        }
    }

    /// Raw whole-pass time (ms) of a mixed pass, if the profile measured mixed passes.
    pub fn mixed_at(&self, prefill_tokens: f64, decode_requests: f64, context: f64) -> Option<f64> {
        self.mixed.as_ref().map(|g| g.at(prefill_tokens, decode_requests, context))
    }

    /// Whether the profile carries mocker's extensions (prefix table, mixed passes).
    pub fn has_extensions(&self) -> (bool, bool) {
        (self.prefill_by_prefix.is_some(), self.mixed.is_some())
    }
}

impl TimingModel for ProfileTable {
    #[inline]
    fn prefill_ms(&self, s: PrefillShape) -> f64 {
        let new = s.mean_isl.saturating_sub(s.mean_prefix);
        if s.batch == 0 || new == 0 {
            return 0.0;
        }
        // NaN (impossible with finite tables) would read as "no time", as in the reference.
        let ms = self.prefill_with_prefix_at((s.batch * new) as f64, s.mean_prefix as f64);
        if ms.is_nan() {
            0.0
        } else {
            ms.max(0.0)
        }
    }

    #[inline]
    fn decode_ms(&self, s: DecodeShape) -> f64 {
        if s.batch == 0 {
            return 0.0;
        }
        let context = s.active_kv_tokens / s.batch;
        let ms = self.decode_at(s.active_kv_tokens as f64, context as f64);
        // Emitting passes never collapse onto one timestamp.
        if ms.is_nan() {
            1.0
        } else {
            ms.max(1.0)
        }
    }

    /// With measured mixed passes, the whole pass is read from them; the decode part is
    /// what decoding alone costs and the prefill part the rest (at least 0), plus what the
    /// cached prefix adds to prefilling. Without them the two costs add up.
    fn mixed_ms(&self, p: PrefillShape, d: DecodeShape) -> (f64, f64) {
        let decode = self.decode_ms(d);
        let new = p.mean_isl.saturating_sub(p.mean_prefix);
        let Some(grid) = &self.mixed else {
            return (self.prefill_ms(p), decode);
        };
        if p.batch == 0 || new == 0 || d.batch == 0 {
            return (self.prefill_ms(p), decode);
        }
        let tokens = (p.batch * new) as f64;
        let context = (d.active_kv_tokens / d.batch) as f64;
        let whole = grid.at(tokens, d.batch as f64, context);
        let prefix_extra = match &self.prefill_by_prefix {
            Some(g) if p.mean_prefix > 0 => (g.at(tokens, p.mean_prefix as f64) - g.at(tokens, 0.0)).max(0.0),
            _ => 0.0,
        };
        let prefill = (whole - decode).max(0.0) + prefix_extra;
        (if prefill.is_nan() { 0.0 } else { prefill }, decode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(isl: &[f64], ttft: &[f64], kv: &[f64], ctx: &[f64], itl: &[f64]) -> ProfileTable {
        ProfileTable::new(ProfileArrays {
            prefill_isl: isl.to_vec(),
            prefill_ttft_ms: ttft.to_vec(),
            decode_active_kv_tokens: kv.to_vec(),
            decode_context_length: ctx.to_vec(),
            decode_itl: itl.to_vec(),
            decode_itl_shape: (kv.len(), ctx.len()),
            ..Default::default()
        })
        .unwrap()
    }

    fn reference_example() -> ProfileTable {
        table(
            &[0.0, 1000.0, 2000.0],
            &[0.0, 100.0, 300.0],
            &[0.0, 10000.0],
            &[0.0, 1000.0],
            &[2.0, 4.0, 10.0, 20.0],
        )
    }

    fn prefill(t: &ProfileTable, tokens: usize) -> f64 {
        t.prefill_ms(PrefillShape { batch: 1, mean_isl: tokens, mean_prefix: 0 })
    }

    fn decode(t: &ProfileTable, batch: usize, kv: usize) -> f64 {
        t.decode_ms(DecodeShape { batch, active_kv_tokens: kv, total_kv_tokens: 1 << 20 })
    }

    #[test]
    fn prefill_interpolates_and_extends_end_segments() {
        let t = reference_example();
        assert_eq!(prefill(&t, 500), 50.0);
        assert_eq!(prefill(&t, 3000), 500.0);
        assert_eq!(prefill(&t, 1000), 100.0);
        assert_eq!(prefill(&t, 0), 0.0);
        // A batch is looked up at batch × (isl − prefix), with the means as given.
        let s = PrefillShape { batch: 3, mean_isl: 600, mean_prefix: 100 };
        assert_eq!(t.prefill_ms(s), 200.0);
    }

    #[test]
    fn prefill_below_the_table_follows_the_first_segment_and_floors_at_zero() {
        let falling = table(&[1000.0, 2000.0], &[200.0, 100.0], &[0.0, 1.0], &[0.0, 1.0], &[1.0; 4]);
        assert_eq!(prefill(&falling, 100), 290.0);
        assert_eq!(prefill(&falling, 5000), 0.0, "negative extrapolation floors at 0");
    }

    #[test]
    fn decode_is_bilinear_with_extrapolation_and_a_one_ms_floor() {
        let t = reference_example();
        assert!((decode(&t, 1, 501) - 3.6036008).abs() < 1e-12);
        assert!((decode(&t, 1, 3001) - 17.6076008).abs() < 1e-12);
        // Context is the integer mean: 1001 tokens over 2 requests reads column 500.
        let two = decode(&t, 2, 1001);
        assert!((two - t.decode_at(1001.0, 500.0)).abs() == 0.0);
        let low = table(&[0.0, 1.0], &[0.0, 1.0], &[0.0, 10.0], &[0.0, 10.0], &[0.1, 0.1, 0.1, 0.1]);
        assert_eq!(decode(&low, 1, 5), 1.0);
        assert_eq!(decode(&t, 0, 5), 0.0);
    }

    /// The reference example with a prefix table and a mixed-pass grid.
    fn extended() -> ProfileTable {
        let mut a = reference_example().arrays();
        a.prefill_prefix_tokens = vec![0.0, 1000.0];
        // Rows: new tokens 0, 1000, 2000; a 1000-token prefix adds 10, 20, 30 ms.
        a.prefill_ms = vec![0.0, 10.0, 100.0, 120.0, 300.0, 330.0];
        a.mixed_prefill_tokens = vec![0.0, 2000.0];
        a.mixed_decode_requests = vec![1.0, 3.0];
        a.mixed_decode_context = vec![0.0, 1000.0];
        // A mixed pass costs 10 ms plus 0.1 ms per prefill token plus 1 ms per decode request.
        a.mixed_ms = vec![11.0, 11.0, 13.0, 13.0, 211.0, 211.0, 213.0, 213.0];
        ProfileTable::new(a).unwrap()
    }

    #[test]
    fn the_prefix_table_prices_cached_prefix_and_round_trips() {
        let t = extended();
        assert_eq!(t.has_extensions(), (true, true));
        let s = |batch, isl, prefix| t.prefill_ms(PrefillShape { batch, mean_isl: isl, mean_prefix: prefix });
        assert_eq!(s(1, 1000, 0), 100.0);
        assert_eq!(s(1, 1500, 500), 110.0, "1000 new tokens behind a 500-token prefix");
        assert_eq!(s(1, 3000, 1000), 120.0 + 210.0, "2000 new behind 1000: the last row's value");
        assert_eq!(ProfileTable::new(t.arrays()).unwrap(), t);
        // Without the table, a prefix changes nothing but the new-token count.
        let plain = reference_example();
        assert_eq!(plain.prefill_ms(PrefillShape { batch: 1, mean_isl: 1500, mean_prefix: 500 }), 100.0);
    }

    #[test]
    fn mixed_passes_are_read_whole_and_split_into_decode_and_the_rest() {
        let t = extended();
        let p = PrefillShape { batch: 1, mean_isl: 1000, mean_prefix: 0 };
        let d = DecodeShape { batch: 2, active_kv_tokens: 1000, total_kv_tokens: 1 << 20 };
        let (prefill, decode) = t.mixed_ms(p, d);
        assert_eq!(decode, t.decode_ms(d));
        // Whole pass: 10 + 0.1·1000 + 1·2 = 112 ms.
        assert!((prefill + decode - 112.0).abs() < 1e-9, "{prefill} + {decode}");
        // A cached prefix adds what the prefix table says it adds (10 ms at 1000 new tokens,
        // 1000 prefix; half of it at a 500-token prefix).
        let hit = PrefillShape { batch: 1, mean_isl: 1500, mean_prefix: 500 };
        let (with_prefix, _) = t.mixed_ms(hit, d);
        assert!((with_prefix - prefill - 10.0).abs() < 1e-9, "{with_prefix} vs {prefill}");
        // Without mixed measurements the costs add up, as in the reference.
        let plain = reference_example();
        assert_eq!(plain.mixed_ms(p, d), (plain.prefill_ms(p), plain.decode_ms(d)));
    }

    #[test]
    fn malformed_arrays_are_refused_with_the_reference_wording() {
        let mut a = reference_example().arrays();
        a.prefill_ttft_ms.pop();
        let e = ProfileTable::new(a).unwrap_err();
        assert_eq!(e.to_string(), "Prefill array length mismatch: isl=3, ttft=2");

        let mut a = reference_example().arrays();
        a.decode_context_length.push(2000.0);
        let e = ProfileTable::new(a).unwrap_err().to_string();
        assert!(e.starts_with("Decode array dimension mismatch: itl shape=(2, 2)"), "{e}");

        let mut a = reference_example().arrays();
        a.prefill_isl = vec![0.0, 1000.0, 1000.0];
        let e = ProfileTable::new(a).unwrap_err().to_string();
        assert!(e.contains("prefill_isl") && e.contains("strictly increasing"), "{e}");

        let mut a = extended().arrays();
        a.mixed_ms.pop();
        let e = ProfileTable::new(a).unwrap_err().to_string();
        assert!(e.contains("mixed_ms") && e.contains("[2, 2, 2]"), "{e}");

        let mut a = extended().arrays();
        a.prefill_prefix_tokens = vec![5.0, 0.0];
        assert!(ProfileTable::new(a).unwrap_err().to_string().contains("prefill_prefix_tokens"));

        let mut a = reference_example().arrays();
        a.decode_itl[3] = f64::NAN;
        assert!(ProfileTable::new(a).unwrap_err().to_string().contains("decode_itl"));
    }
}
