//! The simulated model's output lengths: where a request sets no length of its own, a real
//! model stops at its end-of-sequence token, after a number of tokens that varies from
//! request to request. [`OutputLengthDistribution`] says how many, drawn from a 64-bit key so
//! that the shells choose what makes a draw repeatable (a request's seed, a workload's
//! arrival seed) and the core stays free of random state.

use serde::Serialize;
use serde_json::Value;

use crate::config::ConfigError;
use crate::hashing::splitmix64;

/// Mean of the default chat distribution: LMSYS-Chat-1M's average response length, 214.5
/// tokens (Zheng et al., "LMSYS-Chat-1M: A Large-Scale Real-World LLM Conversation Dataset",
/// ICLR 2024, Table 1), rounded.
pub const CHAT_MEAN_TOKENS: f64 = 215.0;
/// Spread (σ of the log) of the default chat distribution: mocker's assumption, not a
/// published figure (median 130 tokens, 90% below about 470, 99% below about 1,340).
pub const CHAT_SIGMA: f64 = 1.0;
/// Longest output of the default chat distribution: draws past it are clipped.
pub const CHAT_MAX_TOKENS: u32 = 4096;
/// Largest length any distribution may name (the trace readers' bound, 2^24).
pub const MAX_TOKENS: u32 = 1 << 24;
/// Largest σ of a lognormal (e^4 ≈ 55: wider than any measured output-length spread).
const MAX_SIGMA: f64 = 4.0;

/// How many tokens the simulated model writes before its end-of-sequence token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputLengthDistribution {
    /// No end-of-sequence: outputs run to their length limit (`max_tokens`, or the context).
    None,
    /// Always `tokens`.
    Fixed {
        /// The length.
        tokens: u32,
    },
    /// Uniform over `min..=max`.
    Uniform {
        /// Shortest length.
        min: u32,
        /// Longest length.
        max: u32,
    },
    /// Lognormal with the given mean and σ of the log, rounded, then clipped to
    /// `min..=max`: output lengths of chat models are skewed this way, most answers short
    /// and a long tail.
    Lognormal {
        /// Mean of the unclipped distribution, tokens.
        mean: f64,
        /// Standard deviation of the length's logarithm.
        sigma: f64,
        /// Shortest length.
        min: u32,
        /// Longest length.
        max: u32,
    },
}

impl OutputLengthDistribution {
    /// The distribution `mocker serve` uses when none is configured: chat answers (see
    /// [`CHAT_MEAN_TOKENS`], [`CHAT_SIGMA`], [`CHAT_MAX_TOKENS`]).
    pub const CHAT: Self =
        Self::Lognormal { mean: CHAT_MEAN_TOKENS, sigma: CHAT_SIGMA, min: 1, max: CHAT_MAX_TOKENS };

    /// A short description for start-up lines and reports.
    pub fn describe(&self) -> String {
        match *self {
            Self::None => "no end-of-sequence (outputs run to the context)".to_string(),
            Self::Fixed { tokens } => format!("{tokens} tokens"),
            Self::Uniform { min, max } => format!("uniform {min}..={max} tokens"),
            Self::Lognormal { mean, sigma, min, max } => {
                format!("lognormal, mean {mean} tokens, sigma {sigma}, clipped to {min}..={max}")
            }
        }
    }

    /// Whether outputs end at a drawn length at all.
    pub fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }

    /// The range every draw falls in (`None` for no end-of-sequence).
    pub fn range(&self) -> Option<(u32, u32)> {
        match *self {
            Self::None => None,
            Self::Fixed { tokens } => Some((tokens, tokens)),
            Self::Uniform { min, max } | Self::Lognormal { min, max, .. } => Some((min, max)),
        }
    }

    /// The length drawn for `key` (any 64-bit value; equal keys give equal lengths), or
    /// `None` when the distribution has no end-of-sequence.
    pub fn sample(&self, key: u64) -> Option<u32> {
        // Callers pass structured keys (seeds, counters), which must not map to
        // neighbouring lengths.
        let key = splitmix64(key);
        match *self {
            Self::None => None,
            Self::Fixed { tokens } => Some(tokens),
            Self::Uniform { min, max } => {
                let span = u64::from(max - min) + 1;
                Some(min + ((u128::from(key) * u128::from(span)) >> 64) as u32)
            }
            Self::Lognormal { mean, sigma, min, max } => {
                // Box-Muller from the key's two halves; u1 is kept off 0 so ln is finite.
                let u1 = ((key >> 32) as f64 + 0.5) / 4_294_967_296.0;
                let u2 = (key & 0xFFFF_FFFF) as f64 / 4_294_967_296.0;
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let mu = mean.ln() - sigma * sigma / 2.0;
                let x = (mu + sigma * z).exp().round();
                Some(x.clamp(f64::from(min), f64::from(max)) as u32)
            }
        }
    }

    /// Reads the JSON form (`{"type": "lognormal", "mean": 215, "sigma": 1, "max": 4096}`,
    /// `{"type": "uniform", "min": 50, "max": 500}`, `{"type": "fixed", "tokens": 200}`,
    /// `{"type": "none"}`), checking every field; errors name `path.field`.
    pub fn from_value(v: &Value, path: &str) -> Result<Self, ConfigError> {
        let field = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
        let map = v.as_object().ok_or_else(|| {
            ConfigError::new(
                path,
                format!(r#"expected an object like {{"type": "lognormal", "mean": 215}}, got {v}"#),
            )
        })?;
        let kind = match map.get("type") {
            None => {
                return Err(ConfigError::new(
                    field("type"),
                    "missing required field; one of: lognormal, uniform, fixed, none",
                ))
            }
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(ConfigError::new(field("type"), format!("expected a string, got {other}")))
            }
        };
        let allowed: &[&str] = match kind {
            "none" => &["type"],
            "fixed" => &["type", "tokens"],
            "uniform" => &["type", "min", "max"],
            "lognormal" => &["type", "mean", "sigma", "min", "max"],
            other => {
                return Err(ConfigError::new(
                    field("type"),
                    format!("invalid value {other:?}; expected one of: lognormal, uniform, fixed, none"),
                ))
            }
        };
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ConfigError::new(
                field(k),
                format!("unknown field for type {kind:?}; expected one of: {}", allowed.join(", ")),
            ));
        }
        let count = |k: &str, default: Option<u32>| -> Result<u32, ConfigError> {
            match map.get(k) {
                None => default.ok_or_else(|| ConfigError::new(field(k), "missing required field")),
                Some(v) => match v.as_u64() {
                    Some(n) if (1..=u64::from(MAX_TOKENS)).contains(&n) => Ok(n as u32),
                    _ => Err(ConfigError::new(
                        field(k),
                        format!("must be an integer in 1..={MAX_TOKENS}, got {v}"),
                    )),
                },
            }
        };
        let real = |k: &str, default: Option<f64>, lo: f64, hi: f64| -> Result<f64, ConfigError> {
            match map.get(k) {
                None => default.ok_or_else(|| ConfigError::new(field(k), "missing required field")),
                Some(v) => match v.as_f64() {
                    Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x),
                    _ => {
                        Err(ConfigError::new(field(k), format!("must be a number in [{lo}, {hi}], got {v}")))
                    }
                },
            }
        };
        let ordered = |min: u32, max: u32| {
            if min > max {
                Err(ConfigError::new(field("min"), format!("{min} is above max ({max})")))
            } else {
                Ok(())
            }
        };
        Ok(match kind {
            "none" => Self::None,
            "fixed" => Self::Fixed { tokens: count("tokens", None)? },
            "uniform" => {
                let (min, max) = (count("min", None)?, count("max", None)?);
                ordered(min, max)?;
                Self::Uniform { min, max }
            }
            _ => {
                let mean = real("mean", None, 1.0, f64::from(MAX_TOKENS))?;
                let sigma = real("sigma", Some(CHAT_SIGMA), 0.0, MAX_SIGMA)?;
                let (min, max) = (count("min", Some(1))?, count("max", Some(CHAT_MAX_TOKENS))?);
                ordered(min, max)?;
                Self::Lognormal { mean, sigma, min, max }
            }
        })
    }

    /// Reads the JSON text of a flag (`--output-length-distribution`).
    pub fn from_json_str(text: &str, path: &str) -> Result<Self, ConfigError> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| ConfigError::new(path, format!("invalid JSON: {e}")))?;
        Self::from_value(&v, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<OutputLengthDistribution, ConfigError> {
        OutputLengthDistribution::from_value(&v, "output_length_distribution")
    }

    #[test]
    fn the_chat_default_has_its_published_mean_and_stays_in_range() {
        let d = OutputLengthDistribution::CHAT;
        let n = 200_000u64;
        let draws: Vec<u32> = (0..n).map(|k| d.sample(k).unwrap()).collect();
        assert!(draws.iter().all(|&x| (1..=CHAT_MAX_TOKENS).contains(&x)));
        let mean = draws.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
        // Clipping at 4,096 takes a little off the tail's mean.
        assert!((mean - CHAT_MEAN_TOKENS).abs() < 5.0, "mean {mean}");
        let mut sorted = draws.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2];
        // exp(mu) = 215 / e^0.5 = 130.4
        assert!((125..=136).contains(&median), "median {median}");
    }

    #[test]
    fn draws_are_a_function_of_the_key() {
        let d = OutputLengthDistribution::CHAT;
        assert_eq!(d.sample(42), d.sample(42));
        let distinct: std::collections::BTreeSet<u32> = (0..100).filter_map(|k| d.sample(k)).collect();
        assert!(distinct.len() > 50, "neighbouring keys must not give neighbouring lengths");
    }

    #[test]
    fn uniform_and_fixed_cover_exactly_their_range() {
        let d = parse(json!({"type": "uniform", "min": 3, "max": 6})).unwrap();
        let seen: std::collections::BTreeSet<u32> = (0..1000).filter_map(|k| d.sample(k)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![3, 4, 5, 6]);
        let f = parse(json!({"type": "fixed", "tokens": 9})).unwrap();
        assert_eq!(f.sample(7), Some(9));
        assert_eq!(parse(json!({"type": "none"})).unwrap().sample(7), None);
    }

    #[test]
    fn lognormal_defaults_and_clipping() {
        let d = parse(json!({"type": "lognormal", "mean": 100})).unwrap();
        assert_eq!(d, OutputLengthDistribution::Lognormal { mean: 100.0, sigma: 1.0, min: 1, max: 4096 });
        let narrow = parse(json!({"type": "lognormal", "mean": 100, "min": 90, "max": 110})).unwrap();
        assert!((0..1000).filter_map(|k| narrow.sample(k)).all(|x| (90..=110).contains(&x)));
        let exact = parse(json!({"type": "lognormal", "mean": 100, "sigma": 0})).unwrap();
        assert_eq!(exact.sample(5), Some(100));
    }

    #[test]
    fn bad_values_name_the_field() {
        let cases = [
            (json!(5), "output_length_distribution"),
            (json!({}), "output_length_distribution.type"),
            (json!({"type": "gauss"}), "output_length_distribution.type"),
            (json!({"type": "fixed"}), "output_length_distribution.tokens"),
            (json!({"type": "fixed", "tokens": 0}), "output_length_distribution.tokens"),
            (json!({"type": "uniform", "min": 5, "max": 2}), "output_length_distribution.min"),
            (json!({"type": "lognormal", "mean": -1}), "output_length_distribution.mean"),
            (json!({"type": "lognormal", "mean": 10, "sigma": 9}), "output_length_distribution.sigma"),
            (json!({"type": "none", "max": 5}), "output_length_distribution.max"),
            (json!({"type": "lognormal", "mean": 10, "median": 5}), "output_length_distribution.median"),
        ];
        for (v, field) in cases {
            let e = parse(v.clone()).unwrap_err();
            assert_eq!(e.field, field, "{v}: {e}");
        }
    }
}
