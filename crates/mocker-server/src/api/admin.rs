//! Runtime control, as llm-d-inference-sim's endpoint of the same name: `GET /admin/config`
//! reads the running server's configuration (kebab-case keys), `POST /admin/config` with a
//! partial object changes the runtime settings ([`crate::runtime::ADMIN_KEYS`]) and answers
//! the new configuration. A key that cannot change at run time, or an unknown one, is
//! refused by name and nothing changes; every change is logged to stderr and counted on
//! `/metrics` (`mocker:admin_config_changes_total`, with the current values as gauges).
//! Under `--api-key` both need the key.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::faults::FailureType;
use crate::runtime::{RuntimeSettings, ADMIN_KEYS};
use crate::state::{body, AppState};

/// Keys llm-d-inference-sim changes at run time that have no counterpart here: mocker's
/// timing comes from its engine model, whose pace `speedup-ratio` scales.
const SIM_LATENCY_KEYS: [&str; 16] = [
    "time-to-first-token",
    "time-to-first-token-std-dev",
    "inter-token-latency",
    "inter-token-latency-std-dev",
    "kv-cache-transfer-latency",
    "kv-cache-transfer-latency-std-dev",
    "prefill-overhead",
    "prefill-time-per-token",
    "prefill-time-std-dev",
    "kv-cache-transfer-time-per-token",
    "kv-cache-transfer-time-std-dev",
    "time-factor-under-load",
    "latency-calculator",
    "time-to-generate-image",
    "time-to-generate-image-std-dev",
    "image-emission-rate",
];

/// The configuration as `GET /admin/config` shows it.
fn config(state: &AppState) -> Value {
    let s = state.runtime.settings();
    let c = &state.engine_card;
    json!({
        "model": state.model_name,
        "backend": c.backend,
        "architecture": c.model,
        "gpu": c.gpu,
        "tensor-parallel-size": c.tensor_parallel_size,
        "data-parallel-size": c.data_parallel_size,
        "block-size": c.block_size,
        "num-gpu-blocks": c.num_gpu_blocks,
        "max-num-seqs": c.max_num_seqs,
        "max-num-batched-tokens": c.max_num_batched_tokens,
        "enable-prefix-caching": c.enable_prefix_caching,
        "max-model-len": state.served_max_model_len,
        "speedup-ratio": s.speedup_ratio,
        "frontend-latency-ms": s.frontend_latency_ms,
        "failure-injection-rate": s.failure.rate_percent,
        "failure-types": s.failure.types.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "failure-injection-seed": s.failure.seed,
    })
}

/// `GET /admin/config`.
pub async fn get_config(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(config(&state)).into_response()
}

/// `POST /admin/config`: a partial object of the runtime keys.
pub async fn post_config(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let bytes = body(&state, request).await?;
    let update: Map<String, Value> = match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(ApiError::bad_request("the body must be a JSON object of configuration keys")),
        Err(e) => return Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    };
    let current = state.runtime.settings();
    let new = apply(&current, &update, &config(&state))?;
    if new.speedup_ratio != current.speedup_ratio {
        for rank in &state.ranks.0 {
            rank.set_speedup_ratio(new.speedup_ratio).await?;
        }
    }
    for key in state.runtime.replace(new.clone()) {
        eprintln!("mocker: admin config: {key} changed to {}", config(&state)[key]);
    }
    Ok(axum::Json(config(&state)).into_response())
}

/// `current` with `update`'s keys laid on, every key checked first (nothing changes when
/// one is refused). `shown` is the configuration GET shows: its other keys are known but
/// fixed at start.
fn apply(
    current: &RuntimeSettings,
    update: &Map<String, Value>,
    shown: &Value,
) -> Result<RuntimeSettings, ApiError> {
    let mut new = current.clone();
    for (key, value) in update {
        let bad = |why: &str| ApiError::invalid_field(key, format!("{key}: {why}, got {value}"));
        match key.as_str() {
            "speedup-ratio" => {
                new.speedup_ratio = value
                    .as_f64()
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .ok_or_else(|| bad("must be a positive number"))?;
            }
            "frontend-latency-ms" => {
                new.frontend_latency_ms = value
                    .as_f64()
                    .filter(|v| v.is_finite() && (0.0..=3.6e6).contains(v))
                    .ok_or_else(|| bad("must be a number of milliseconds from 0 to 3600000"))?;
            }
            "failure-injection-rate" => {
                new.failure.rate_percent = value
                    .as_f64()
                    .filter(|v| (0.0..=100.0).contains(v))
                    .ok_or_else(|| bad("must be a percentage from 0 to 100"))?;
            }
            "failure-types" => {
                let names = value.as_array().ok_or_else(|| bad("must be a list of failure types"))?;
                let allowed = FailureType::ALL.map(FailureType::name).join(", ");
                new.failure.types = names
                    .iter()
                    .map(|n| n.as_str().and_then(FailureType::parse))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad(&format!("each must be one of {allowed}")))?;
            }
            "failure-injection-seed" => {
                new.failure.seed = match value {
                    Value::Null => None,
                    v => Some(v.as_u64().ok_or_else(|| bad("must be an unsigned integer or null (random)"))?),
                };
            }
            k if shown.get(k).is_some() || SIM_LATENCY_KEYS.contains(&k) => {
                return Err(ApiError::invalid_field(
                    key,
                    format!(
                        "field '{key}' is not admin-configurable (the runtime keys are: {}; mocker's latencies come \
                         from its engine model, scaled by speedup-ratio)",
                        ADMIN_KEYS.join(", ")
                    ),
                ));
            }
            _ => {
                return Err(ApiError::invalid_field(
                    key,
                    format!("unknown field '{key}' (the runtime keys are: {})", ADMIN_KEYS.join(", ")),
                ))
            }
        }
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FailureInjectionOptions;

    fn settings() -> RuntimeSettings {
        RuntimeSettings {
            speedup_ratio: 1.0,
            frontend_latency_ms: 0.0,
            failure: FailureInjectionOptions::default(),
        }
    }

    fn update(text: &str) -> Map<String, Value> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn runtime_keys_change_and_others_are_refused_by_name() {
        let shown = json!({"block-size": 16, "speedup-ratio": 1.0});
        let new = apply(
            &settings(),
            &update(
                r#"{"speedup-ratio": 4, "failure-injection-rate": 25, "failure-types": ["rate_limit"],
                        "failure-injection-seed": 7, "frontend-latency-ms": 12.5}"#,
            ),
            &shown,
        )
        .unwrap();
        assert_eq!(new.speedup_ratio, 4.0);
        assert_eq!(new.failure.rate_percent, 25.0);
        assert_eq!(new.failure.types, vec![FailureType::RateLimit]);
        assert_eq!(new.failure.seed, Some(7));
        assert_eq!(new.frontend_latency_ms, 12.5);
        for (body, named) in [
            (r#"{"block-size": 32}"#, "block-size"),
            (r#"{"time-to-first-token": "10ms"}"#, "time-to-first-token"),
            (r#"{"nonsense": 1}"#, "nonsense"),
            (r#"{"speedup-ratio": 0}"#, "speedup-ratio"),
            (r#"{"speedup-ratio": "fast"}"#, "speedup-ratio"),
            (r#"{"failure-injection-rate": 101}"#, "failure-injection-rate"),
            (r#"{"failure-types": ["bogus"]}"#, "failure-types"),
            (r#"{"frontend-latency-ms": -1}"#, "frontend-latency-ms"),
        ] {
            let e = apply(&settings(), &update(body), &shown).unwrap_err();
            assert!(e.message.contains(named), "{body}: {}", e.message);
            assert_eq!(e.param.as_deref(), Some(named), "{body}");
        }
    }

    #[test]
    fn one_refused_key_changes_nothing() {
        let e = apply(
            &settings(),
            &update(r#"{"speedup-ratio": 4, "block-size": 32}"#),
            &json!({"block-size": 16}),
        );
        assert!(e.is_err());
    }
}
