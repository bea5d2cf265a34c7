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

/// Answers `refusal` after reading the request's body (within the body limits, discarding
/// it), so the connection stays reusable. hyper closes a keep-alive connection whose
/// request body was not read when the answer went out, and a client that sent its next
/// request before the close arrived sees "server disconnected" instead of an answer.
async fn refuse(state: &AppState, request: Request, refusal: Response) -> Response {
    crate::body::drain(state.max_body_bytes, state.body_timeout, request).await;
    refusal
}

/// The middleware: 401 JSON when a protected route lacks the key.
pub async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if request.method() != Method::OPTIONS
        && is_protected(request.uri().path())
        && !authorized(state.api_key.as_ref(), request.headers())
    {
        return refuse(&state, request, ApiError::unauthorized().into_response()).await;
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
        let refusal = state.readiness.starting_error().into_response();
        return refuse(&state, request, refusal).await;
    }
    next.run(request).await
}

/// On the inference routes: the status an `X-Return-Error` header asks for, else an injected
/// failure when the draw says so, else the handler.
pub async fn inject_failures(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(response) = requested_error(request.headers(), &state.model_name) {
        return refuse(&state, request, response).await;
    }
    if let Some(kind) = state.runtime.faults().and_then(|f| f.draw()) {
        return refuse(&state, request, FailureInjector::response(kind, &state.model_name)).await;
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
        return refuse(&state, request, SleepMode::sleeping_error().into_response()).await;
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
