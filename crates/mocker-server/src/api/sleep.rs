//! vLLM's sleep-mode routes (`--enable-sleep-mode`): `POST /sleep?level=1|2`,
//! `POST /wake_up` (optional repeated `?tags=weights|kv_cache`) and `GET /is_sleeping`;
//! what sleeping means is told in [`crate::sleep`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;
use crate::sleep::{SleepMode, TAGS};
use crate::state::AppState;

/// The query's `key=value` pairs (values percent-decoded), refusing keys not in `allowed`.
fn query_pairs(request: &Request, allowed: &[&str]) -> Result<Vec<(String, String)>, ApiError> {
    let query = request.uri().query().unwrap_or("");
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::bad_request(format!("malformed query string: {e}")))?;
    if let Some((key, _)) = pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid_field(
            key,
            format!("{key}: unsupported query parameter (allowed: {})", allowed.join(", ")),
        ));
    }
    Ok(pairs)
}

fn enabled(state: &AppState, request: &Request) -> Result<(), ApiError> {
    match state.sleep {
        Some(_) => Ok(()),
        None => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "no route {} {} (sleep mode is off: start the server with --enable-sleep-mode)",
                request.method(),
                request.uri().path()
            ),
            param: None,
        }),
    }
}

/// `POST /sleep?level=1|2[&mode=abort]`.
pub async fn sleep(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    enabled(&state, &request)?;
    for (key, value) in query_pairs(&request, &["level", "mode"])? {
        match (key.as_str(), value.as_str()) {
            // Level 1 offloads the weights, level 2 discards them: no difference without weights.
            ("level", "1" | "2") => {}
            ("level", v) => {
                return Err(ApiError::invalid_field("level", format!("level must be 1 or 2, got {v:?}")))
            }
            ("mode", "abort") => {}
            (_, v) => {
                return Err(ApiError::invalid_field(
                    "mode",
                    format!(
                        "mode {v:?} is not simulated: only \"abort\" (vLLM's default: in-flight requests are \
                         aborted)"
                    ),
                ))
            }
        }
    }
    let mode = state.sleep.as_ref().expect("checked by enabled");
    {
        let mut asleep = mode.asleep();
        // vLLM ignores a second sleep (with a warning).
        if !asleep.is_empty() {
            return Ok(StatusCode::OK.into_response());
        }
        // Set before the engine is emptied, so no new request slips in behind the abort.
        asleep.extend(TAGS);
    }
    for rank in &state.ranks.0 {
        rank.abort_all_and_reset().await.map_err(|e| ApiError::internal(e.to_string()))?;
    }
    Ok(StatusCode::OK.into_response())
}

/// `POST /wake_up[?tags=weights&tags=kv_cache]`.
pub async fn wake_up(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    enabled(&state, &request)?;
    let mut tags = Vec::new();
    for (_, value) in query_pairs(&request, &["tags"])? {
        let Some(tag) = TAGS.iter().find(|t| **t == value) else {
            return Err(ApiError::invalid_field(
                "tags",
                format!("tags: unknown tag {value:?} (allowed: {})", TAGS.join(", ")),
            ));
        };
        tags.push(*tag);
    }
    let mode = state.sleep.as_ref().expect("checked by enabled");
    let mut asleep = mode.asleep();
    if tags.is_empty() {
        asleep.clear();
    } else if tags.iter().all(|t| asleep.contains(t)) {
        // As vLLM: a tag that is not asleep makes the whole call a no-op.
        for t in tags {
            asleep.remove(t);
        }
    }
    Ok(StatusCode::OK.into_response())
}

/// `GET /is_sleeping`.
pub async fn is_sleeping(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    enabled(&state, &request)?;
    let sleeping = state.sleep.as_ref().is_some_and(SleepMode::is_sleeping);
    Ok(axum::Json(json!({ "is_sleeping": sleeping })).into_response())
}
