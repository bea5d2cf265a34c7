//! Forward-pass timing models: how long a pass takes on the modelled GPU.

use std::sync::Arc;

use crate::config::{EngineConfig, TimingModelConfig};

mod arch;
mod profile;

pub use arch::{ArchTiming, Curve, Grid, GridError};
pub use profile::{ProfileArrays, ProfileError, ProfileTable};

/// What a timing model sees of one pass's prefill work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillShape {
    /// Requests that computed prompt tokens in the pass.
    pub batch: usize,
    /// Mean (floored) prompt length up to the end of this pass's chunk.
    pub mean_isl: usize,
    /// Mean (floored) tokens already present before the chunk (cache hits, earlier chunks).
    pub mean_prefix: usize,
}

/// What a timing model sees of one pass's decode work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeShape {
    /// Requests decoding one token in the pass.
    pub batch: usize,
    /// Sum of their sequence lengths (tokens whose KV is attended to).
    pub active_kv_tokens: usize,
    /// KV capacity of the rank in tokens (`num_gpu_blocks * block_size`).
    pub total_kv_tokens: usize,
}

/// A model of raw (unscaled) pass costs in milliseconds. Profile-driven or external
/// predictors implement this same pair of calls.
pub trait TimingModel: std::fmt::Debug + Send {
    /// Prefill cost in ms; 0 when nothing is prefilled.
    fn prefill_ms(&self, shape: PrefillShape) -> f64;
    /// Decode cost in ms; 0 when nothing decodes.
    fn decode_ms(&self, shape: DecodeShape) -> f64;
    /// Costs of a pass that both prefills and decodes, as (prefill part, decode part) in
    /// ms; each part is scaled by its own speedup ratio. By default the two costs add up,
    /// as in the reference; a model measured on mixed passes attributes what the mix
    /// saves to the prefill part.
    fn mixed_ms(&self, prefill: PrefillShape, decode: DecodeShape) -> (f64, f64) {
        (self.prefill_ms(prefill), self.decode_ms(decode))
    }
}

/// The work one vLLM-style pass scheduled, summed over its requests: what the pass's
/// forward-pass metrics report and what its timing is read from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassWork {
    /// Requests that computed prompt tokens.
    pub prefill_requests: usize,
    /// Prompt tokens computed in the pass.
    pub prefill_tokens: usize,
    /// Tokens those requests held before the pass (cache hits, earlier chunks).
    pub prefill_prefix_tokens: usize,
    /// Requests decoding one token.
    pub decode_requests: usize,
    /// Sum of their sequence lengths.
    pub decode_kv_tokens: usize,
}

/// Raw (prefill, decode) cost in ms of a vLLM-style pass, from the shapes its scheduler
/// builds: floored means per prefilled request, and a whole pass read from `mixed_ms` when
/// it both prefills and decodes. `total_kv_tokens` is the rank's KV capacity in tokens.
/// The scheduler prices every pass through here, and so does `mocker profiles predict`.
#[inline]
pub fn pass_ms<T: TimingModel + ?Sized>(timing: &T, w: &PassWork, total_kv_tokens: usize) -> (f64, f64) {
    let prefills = w.prefill_requests > 0;
    let decodes = w.decode_requests > 0;
    let prefill = || PrefillShape {
        batch: w.prefill_requests,
        mean_isl: (w.prefill_prefix_tokens + w.prefill_tokens) / w.prefill_requests,
        mean_prefix: w.prefill_prefix_tokens / w.prefill_requests,
    };
    let decode =
        || DecodeShape { batch: w.decode_requests, active_kv_tokens: w.decode_kv_tokens, total_kv_tokens };
    match (prefills, decodes) {
        (true, true) => timing.mixed_ms(prefill(), decode()),
        (true, false) => (timing.prefill_ms(prefill()), 0.0),
        (false, true) => (0.0, timing.decode_ms(decode())),
        (false, false) => (0.0, 0.0),
    }
}

/// The reference's default: a quadratic in prefill tokens and a quadratic in KV utilisation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Polynomial;

impl TimingModel for Polynomial {
    #[inline]
    fn prefill_ms(&self, s: PrefillShape) -> f64 {
        let new = s.mean_isl.saturating_sub(s.mean_prefix);
        if s.batch == 0 || new == 0 {
            return 0.0;
        }
        let t = (s.batch * new) as f64;
        // Square first, as the reference (`powi(2)`): `c * t * t` rounds differently.
        4.209989e-07 * (t * t) + 1.518344e-02 * t + 1.650142e+01
    }

    #[inline]
    fn decode_ms(&self, s: DecodeShape) -> f64 {
        if s.batch == 0 {
            return 0.0;
        }
        let p = if s.total_kv_tokens == 0 {
            1.0
        } else {
            (s.active_kv_tokens as f64 / s.total_kv_tokens as f64).min(1.0)
        };
        // Square first, as the reference (`powi(2)`): `-25.74 * p * p` can land on the
        // other side of a nanosecond tie (kv 1344 of 1536: 33.2915625 ms).
        (-25.74 * (p * p) + 54.01 * p + 5.74).max(1.0)
    }
}

/// Constant costs whenever the pass has work of that kind; exact numbers for tests.
#[derive(Debug, Clone, Copy)]
pub struct Fixed {
    /// Cost of any non-empty prefill.
    pub prefill_ms: f64,
    /// Cost of any non-empty decode.
    pub decode_ms: f64,
}

impl TimingModel for Fixed {
    fn prefill_ms(&self, s: PrefillShape) -> f64 {
        if s.batch == 0 {
            0.0
        } else {
            self.prefill_ms
        }
    }
    fn decode_ms(&self, s: DecodeShape) -> f64 {
        if s.batch == 0 {
            0.0
        } else {
            self.decode_ms
        }
    }
}

/// A table (profile or architecture curves) shared by every rank and worker built from one
/// configuration.
impl<T: TimingModel + Sync> TimingModel for Arc<T> {
    #[inline]
    fn prefill_ms(&self, s: PrefillShape) -> f64 {
        self.as_ref().prefill_ms(s)
    }
    #[inline]
    fn decode_ms(&self, s: DecodeShape) -> f64 {
        self.as_ref().decode_ms(s)
    }
    #[inline]
    fn mixed_ms(&self, p: PrefillShape, d: DecodeShape) -> (f64, f64) {
        self.as_ref().mixed_ms(p, d)
    }
}

/// Error building a timing model from configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("engine.timing_model: {0}")]
pub struct TimingModelError(pub String);

/// Builds the configured timing model.
pub fn build_timing_model(config: &EngineConfig) -> Result<Box<dyn TimingModel>, TimingModelError> {
    match &config.timing_model {
        TimingModelConfig::Polynomial => Ok(Box::new(Polynomial)),
        TimingModelConfig::Fixed { prefill_ms, decode_ms } => {
            Ok(Box::new(Fixed { prefill_ms: *prefill_ms, decode_ms: *decode_ms }))
        }
        TimingModelConfig::External { provider, profile: Some(table), .. } if provider == "dynamo_profile" => {
            Ok(Box::new(Arc::clone(table)))
        }
        TimingModelConfig::Architecture { timing: Some(t), .. } => Ok(Box::new(Arc::clone(t))),
        TimingModelConfig::Architecture { label, timing: None } => Err(TimingModelError(format!(
            "the architecture timing of {label} has not been built; resolve the launch's model and gpu first"
        ))),
        TimingModelConfig::External { provider, config, .. } if provider == "dynamo_profile" => {
            Err(TimingModelError(format!(
                "the dynamo_profile table {} has not been read; load it before building the engine",
                config.get("path").unwrap_or(&serde_json::Value::Null)
            )))
        }
        TimingModelConfig::External { provider, .. } => Err(TimingModelError(format!(
            "external timing provider {provider:?} is not supported yet; use polynomial, fixed or dynamo_profile"
        ))),
    }
}

/// Converts a raw cost to the simulated duration in integer nanoseconds: divided by the
/// speedup ratio (0 means "no scaling", as in the reference) and rounded like a `Duration`.
#[inline]
pub fn scaled_nanos(raw_ms: f64, ratio: f64) -> u64 {
    let ms = if ratio > 0.0 && raw_ms > 0.0 { raw_ms / ratio } else { raw_ms };
    if ms <= 0.0 || !ms.is_finite() {
        return 0;
    }
    round_to_u64(ms * 1e6)
}

/// `x.round() as u64` without the libm call `round` is on the default x86-64 target (one
/// per pass priced, one per arrival). Equal for every `x`: below 2^52 the remainder
/// `x - ⌊x⌋` is computed without error, above it `x` is whole, past `u64` both saturate,
/// and a negative or NaN `x` gives 0 either way.
#[inline]
pub fn round_to_u64(x: f64) -> u64 {
    let whole = x as u64;
    whole.saturating_add(u64::from(x - whole as f64 >= 0.5))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(isl: usize) -> f64 {
        Polynomial.prefill_ms(PrefillShape { batch: 1, mean_isl: isl, mean_prefix: 0 })
    }
    fn d(kv: usize, total: usize) -> f64 {
        Polynomial.decode_ms(DecodeShape { batch: 1, active_kv_tokens: kv, total_kv_tokens: total })
    }

    #[test]
    fn polynomial_matches_reference_examples() {
        assert!((p(1000) - 32.1058589).abs() < 1e-6);
        assert!((p(64) - 17.4748846).abs() < 1e-6);
        assert!((p(2512) - 57.2987850).abs() < 1e-6);
        assert!((d(1001, 1048576) - 5.791536).abs() < 1e-6);
        assert!((d(1001, 1280) - 32.235622).abs() < 1e-6);
        assert_eq!(p(0), 0.0);
        assert_eq!(
            Polynomial.decode_ms(DecodeShape { batch: 0, active_kv_tokens: 5, total_kv_tokens: 9 }),
            0.0
        );
        // Full utilisation and beyond clamp to p = 1.
        assert_eq!(d(10, 0), d(2000, 1000));
    }

    #[test]
    fn prefill_uses_batch_times_new_tokens() {
        let s = PrefillShape { batch: 9, mean_isl: 910, mean_prefix: 0 };
        assert_eq!(Polynomial.prefill_ms(s), p(8190));
        let hit = PrefillShape { batch: 1, mean_isl: 1024, mean_prefix: 960 };
        assert!((Polynomial.prefill_ms(hit) - 17.474885).abs() < 1e-6);
    }

    #[test]
    fn speedup_scaling_rounds_to_nanoseconds() {
        assert_eq!(scaled_nanos(32.1058589, 0.0), 32_105_859);
        assert_eq!(scaled_nanos(2.0, 2.0), 1_000_000);
        assert_eq!(scaled_nanos(0.0, 2.0), 0);
        // TTFT 16.052930 at speedup 2 for isl 1000.
        assert_eq!(scaled_nanos(p(1000), 2.0), 16_052_929);
    }

    #[test]
    fn rounding_matches_round_half_away_from_zero() {
        let below_half = 0.5 - f64::EPSILON / 4.0;
        let edges =
            [below_half, 0.5, 1.5, 2.5, 1e-300, 4503599627370495.5, 2f64.powi(52), 2f64.powi(53) + 2.0];
        let far = [1.8e19, 1e300, f64::MAX, f64::INFINITY, -0.4, -0.5, -2.5, f64::NEG_INFINITY, f64::NAN];
        for x in edges.into_iter().chain(far) {
            assert_eq!(round_to_u64(x), x.round() as u64, "{x:e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn rounding_matches_round(bits in proptest::num::u64::ANY) {
            // Every double, through its bit pattern (negative ones, infinities, NaNs too).
            let x = f64::from_bits(bits);
            proptest::prop_assert_eq!(round_to_u64(x), x.round() as u64);
        }

        #[test]
        fn rounding_matches_round_near_halves(n in 0u64..1 << 40, ulps in -3i64..=3) {
            let half = n as f64 + 0.5;
            let x = f64::from_bits((half.to_bits() as i64 + ulps) as u64);
            proptest::prop_assert_eq!(round_to_u64(x), x.round() as u64);
        }
    }
}
