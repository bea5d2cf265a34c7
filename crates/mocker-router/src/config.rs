//! KV router settings (`--router-config` JSON), named and defaulted as the reference's
//! `KvRouterConfig`.

use serde_json::Value;

/// Order of the router queue (used when `router_queue_threshold` is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueuePolicy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Last come, first served.
    Lcfs,
    /// Weighted shortest processing time: fewest uncached prompt tokens first.
    Wspt,
}

/// KV router weights and switches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvRouterConfig {
    /// Blocks of prefill credit per block already cached on a worker.
    pub overlap_score_credit: f64,
    /// If > 0, a worker's credit is scaled by `1 / (1 + decay * excess / request_blocks)`,
    /// `excess` its pending prefill blocks above the least-loaded worker's: cache
    /// affinity yields to prefill balance on backlogged workers.
    pub overlap_score_credit_decay: f64,
    /// Scale of the prefill cost (alias `overlap_score_weight`); 0 also zeroes the credit.
    pub prefill_load_scale: f64,
    /// Cost per live request on a worker.
    pub decode_active_request_weight: f64,
    /// 0: cheapest worker; > 0: softmax sampling over normalised costs.
    pub router_temperature: f64,
    /// Count live requests' blocks in the decode cost.
    pub router_track_active_blocks: bool,
    /// A block already held by a live request on the worker adds no decode cost.
    pub router_assume_kv_reuse: bool,
    /// Count pending prefill tokens in the prefill cost.
    pub router_track_prefill_tokens: bool,
    /// Queue arrivals while every worker's pending prefill exceeds this many times
    /// `max_num_batched_tokens`; `None` disables queueing.
    pub router_queue_threshold: Option<f64>,
    /// Queue order.
    pub router_queue_policy: QueuePolicy,
    /// Seed of the tie-break RNG (ours: the reference's tie-breaks are unseeded).
    pub seed: u64,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        Self {
            overlap_score_credit: 1.0,
            overlap_score_credit_decay: 0.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
            router_temperature: 0.0,
            router_track_active_blocks: true,
            router_assume_kv_reuse: true,
            router_track_prefill_tokens: true,
            router_queue_threshold: None,
            router_queue_policy: QueuePolicy::Fcfs,
            seed: 42,
        }
    }
}

/// Keys `--router-config` accepts.
pub const ROUTER_CONFIG_KEYS: &str = "overlap_score_credit, overlap_score_weight, prefill_load_scale, \
     overlap_score_credit_decay, decode_active_request_weight, router_temperature, \
     router_track_active_blocks, router_assume_kv_reuse, router_track_prefill_tokens, \
     router_queue_threshold, router_queue_policy, seed";

impl KvRouterConfig {
    /// Parses a JSON object of overrides; errors name the key and what is allowed.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
        let Value::Object(map) = value else {
            return Err(format!("must be a JSON object (got {value})"));
        };
        let mut c = Self::default();
        for (k, v) in &map {
            let num = || {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| format!("{k}: must be a finite number (got {v})"))
            };
            let flag = || v.as_bool().ok_or_else(|| format!("{k}: must be true or false (got {v})"));
            match k.as_str() {
                "overlap_score_credit" => c.overlap_score_credit = num()?,
                "overlap_score_weight" | "prefill_load_scale" => c.prefill_load_scale = num()?,
                "overlap_score_credit_decay" => c.overlap_score_credit_decay = num()?,
                "decode_active_request_weight" => c.decode_active_request_weight = num()?,
                "router_temperature" => c.router_temperature = num()?,
                "router_track_active_blocks" => c.router_track_active_blocks = flag()?,
                "router_assume_kv_reuse" => c.router_assume_kv_reuse = flag()?,
                "router_track_prefill_tokens" => c.router_track_prefill_tokens = flag()?,
                "router_queue_threshold" => {
                    c.router_queue_threshold = if v.is_null() { None } else { Some(num()?) }
                }
                "router_queue_policy" => {
                    c.router_queue_policy = match v.as_str() {
                        Some("fcfs") => QueuePolicy::Fcfs,
                        Some("lcfs") => QueuePolicy::Lcfs,
                        Some("wspt") => QueuePolicy::Wspt,
                        _ => return Err(format!("{k}: must be one of fcfs, lcfs, wspt (got {v})")),
                    }
                }
                "seed" => {
                    c.seed =
                        v.as_u64().ok_or_else(|| format!("{k}: must be a non-negative integer (got {v})"))?
                }
                _ => return Err(format!("unknown key {k:?}; expected one of: {ROUTER_CONFIG_KEYS}")),
            }
        }
        c.validate().map_err(|(f, m)| format!("{f}: {m}"))?;
        Ok(c)
    }

    /// The JSON object [`KvRouterConfig::from_json`] reads back as this config: every key,
    /// `prefill_load_scale` for the scale (not its alias).
    pub fn to_json(&self) -> String {
        let policy = match self.router_queue_policy {
            QueuePolicy::Fcfs => "fcfs",
            QueuePolicy::Lcfs => "lcfs",
            QueuePolicy::Wspt => "wspt",
        };
        serde_json::json!({
            "overlap_score_credit": self.overlap_score_credit,
            "overlap_score_credit_decay": self.overlap_score_credit_decay,
            "prefill_load_scale": self.prefill_load_scale,
            "decode_active_request_weight": self.decode_active_request_weight,
            "router_temperature": self.router_temperature,
            "router_track_active_blocks": self.router_track_active_blocks,
            "router_assume_kv_reuse": self.router_assume_kv_reuse,
            "router_track_prefill_tokens": self.router_track_prefill_tokens,
            "router_queue_threshold": self.router_queue_threshold,
            "router_queue_policy": policy,
            "seed": self.seed,
        })
        .to_string()
    }

    /// Applies the router keys a worker's engine args carry in their `dynamo` object, as
    /// the reference does: `dynamo.router_queue_policy` overrides `router_queue_policy`.
    pub fn with_runtime(self, runtime: &mocker_core::config::RuntimeConfig) -> Self {
        let policy = match runtime.router_queue_policy.as_deref() {
            Some("fcfs") => QueuePolicy::Fcfs,
            Some("lcfs") => QueuePolicy::Lcfs,
            Some("wspt") => QueuePolicy::Wspt,
            // Validated with the engine args; anything else cannot reach here.
            _ => self.router_queue_policy,
        };
        Self { router_queue_policy: policy, ..self }
    }

    /// The prefill pool's router in a disaggregated replay (as the reference derives it):
    /// prefix-aware, without the blocks of live requests, which leave after their prefill.
    pub fn for_prefill_pool(self) -> Self {
        Self { router_track_active_blocks: false, ..self }
    }

    /// The decode pool's router in a disaggregated replay (as the reference derives it):
    /// pure load balance on held blocks, no prefix or prefill term.
    pub fn for_decode_pool(self) -> Self {
        Self {
            prefill_load_scale: 0.0,
            router_assume_kv_reuse: false,
            router_track_prefill_tokens: false,
            ..self
        }
    }

    /// Range checks: `(field, message)` of the first bad value.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (field, v) in [
            ("overlap_score_credit", self.overlap_score_credit),
            ("overlap_score_credit_decay", self.overlap_score_credit_decay),
            ("prefill_load_scale", self.prefill_load_scale),
            ("decode_active_request_weight", self.decode_active_request_weight),
            ("router_temperature", self.router_temperature),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err((field, format!("must be a finite number >= 0 (got {v})")));
            }
        }
        if let Some(t) = self.router_queue_threshold {
            if !(t.is_finite() && t >= 0.0) {
                return Err(("router_queue_threshold", format!("must be a finite number >= 0 (got {t})")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_and_bad_keys_are_named() {
        let c = KvRouterConfig::from_json(
            r#"{"overlap_score_weight": 2, "router_queue_threshold": 1.5, "router_queue_policy": "wspt", "seed": 7}"#,
        )
        .unwrap();
        assert_eq!(c.prefill_load_scale, 2.0);
        assert_eq!(c.router_queue_threshold, Some(1.5));
        assert_eq!((c.router_queue_policy, c.seed), (QueuePolicy::Wspt, 7));
        let e = KvRouterConfig::from_json(r#"{"temprature": 1}"#).unwrap_err();
        assert!(e.contains("temprature") && e.contains("router_temperature"), "{e}");
        let e = KvRouterConfig::from_json(r#"{"router_queue_policy": "random"}"#).unwrap_err();
        assert!(e.contains("fcfs, lcfs, wspt"), "{e}");
        assert!(KvRouterConfig::from_json(r#"{"router_temperature": -1}"#)
            .unwrap_err()
            .contains("router_temperature"));
        let c = KvRouterConfig::from_json(r#"{"overlap_score_credit_decay": 0.5}"#).unwrap();
        assert_eq!(c.overlap_score_credit_decay, 0.5);
        assert!(KvRouterConfig::from_json(r#"{"overlap_score_credit_decay": -1}"#)
            .unwrap_err()
            .contains("overlap_score_credit_decay"));
        assert!(KvRouterConfig::from_json("[]").unwrap_err().contains("object"));
    }

    #[test]
    fn to_json_reads_back_as_the_same_config() {
        let c = KvRouterConfig {
            overlap_score_credit: 0.5,
            overlap_score_credit_decay: 0.25,
            prefill_load_scale: 2.0,
            decode_active_request_weight: 3.0,
            router_temperature: 0.1,
            router_track_active_blocks: false,
            router_assume_kv_reuse: false,
            router_track_prefill_tokens: false,
            router_queue_threshold: Some(1.5),
            router_queue_policy: QueuePolicy::Lcfs,
            seed: 7,
        };
        for c in [c, KvRouterConfig::default()] {
            assert_eq!(KvRouterConfig::from_json(&c.to_json()).unwrap(), c);
        }
    }
}
