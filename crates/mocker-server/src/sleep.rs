//! vLLM's sleep mode (`--enable-sleep-mode`): `POST /sleep?level=1|2`, `POST /wake_up`
//! (optional repeated `?tags=weights|kv_cache`) and `GET /is_sleeping`.
//!
//! As vLLM (which serves these routes only in dev mode, with its engine started with
//! `enable_sleep_mode`): sleeping aborts every in-flight request (vLLM's default `abort`
//! pause mode: their streams end with an error), frees all KV and drops the prefix cache,
//! publishing `AllBlocksCleared` when KV events are on. While asleep, the inference routes
//! answer 503; `/tokenize`, `/v1/models`, `/metrics` and the rest keep working. A partial
//! wake-up (`tags=weights` only) still leaves the engine asleep until `kv_cache` wakes too.
//! Levels 1 (weights offloaded) and 2 (weights discarded) differ only in what a GPU would
//! keep: the simulation has no weights, so both behave alike. Without the flag the routes
//! answer 404, as in vLLM without dev mode.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::app::AppState;
use crate::error::ApiError;

/// The memory tags vLLM puts to sleep and wakes separately.
const TAGS: [&str; 2] = ["weights", "kv_cache"];

/// Which tags are asleep (none: awake).
#[derive(Debug, Default)]
pub struct SleepMode {
    asleep: Mutex<BTreeSet<&'static str>>,
}

impl SleepMode {
    /// Whether the engine is asleep (any tag still sleeping).
    pub fn is_sleeping(&self) -> bool {
        !self.asleep.lock().expect("sleep state").is_empty()
    }

    /// The 503 every inference request gets while asleep.
    pub fn sleeping_error() -> ApiError {
        ApiError::unavailable("the model is sleeping (POST /sleep); wake it up with POST /wake_up")
    }
}

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
        let mut asleep = mode.asleep.lock().expect("sleep state");
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
    let mut asleep = mode.asleep.lock().expect("sleep state");
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

/// On the inference routes: 503 while the engine sleeps, as vLLM's protected endpoints.
pub async fn refuse_while_sleeping(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if state.sleep.as_ref().is_some_and(SleepMode::is_sleeping) {
        return SleepMode::sleeping_error().into_response();
    }
    next.run(request).await
}
