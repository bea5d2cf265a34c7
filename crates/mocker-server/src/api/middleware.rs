//! What stands between a request and its handler: the API key, the simulated engine
//! startup (`startup_time`: nothing but health probes, `/metrics` and `/version` is served
//! until it is up), sleep mode and failure injection on the inference routes, and the echoed
//! request id.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::{authorized, is_protected};
use crate::error::ApiError;
use crate::faults::{requested_error, FailureInjector};
use crate::sleep::SleepMode;
use crate::state::AppState;

/// The middleware: 401 JSON when a protected route lacks the key.
pub async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if request.method() != Method::OPTIONS
        && is_protected(request.uri().path())
        && !authorized(state.api_key.as_ref(), request.headers())
    {
        return ApiError::unauthorized().into_response();
    }
    next.run(request).await
}

/// Routes answered while the engine starts: health probes report the startup themselves.
fn served_while_starting(path: &str) -> bool {
    matches!(path, "/metrics" | "/version" | "/health" | "/health/ready" | "/ping")
}

/// 503 (OpenAI-style JSON) for every other route until the engine is up, as vLLM's server
/// does not answer before its engine is loaded.
pub async fn startup_gate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if !state.readiness.is_ready() && !served_while_starting(request.uri().path()) {
        return state.readiness.starting_error().into_response();
    }
    next.run(request).await
}

/// On the inference routes: the status an `X-Return-Error` header asks for, else an injected
/// failure when the draw says so, else the handler.
pub async fn inject_failures(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(response) = requested_error(request.headers(), &state.model_name) {
        return response;
    }
    if let Some(kind) = state.runtime.faults().and_then(|f| f.draw()) {
        return FailureInjector::response(kind, &state.model_name);
    }
    next.run(request).await
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

/// Load clients correlate requests by `x-request-id`; echo it as vLLM does.
pub async fn echo_request_id(request: Request, next: Next) -> Response {
    let id = request.headers().get("x-request-id").cloned();
    let mut response = next.run(request).await;
    if let Some(id) = id {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}
