//! What stands between a request and its handler besides the API key: the simulated engine
//! startup (`startup_time`: nothing but `/metrics` and `/version` is served until it is up)
//! and failure injection on the inference routes.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::app::AppState;
use crate::error::ApiError;
use crate::faults::{requested_error, FailureInjector};

/// When the simulated engine finishes starting (`startup_time` after the server started).
#[derive(Debug, Clone, Copy)]
pub struct Readiness {
    ready_at: Instant,
    startup: Duration,
}

impl Readiness {
    /// Ready `startup` from now.
    pub fn after(startup: Duration) -> Self {
        Self { ready_at: Instant::now() + startup, startup }
    }

    /// Whether the engine is up.
    pub fn is_ready(&self) -> bool {
        Instant::now() >= self.ready_at
    }

    /// The 503 answered while it is not.
    pub fn starting_error(&self) -> ApiError {
        let left = self.ready_at.saturating_duration_since(Instant::now());
        ApiError::unavailable(format!(
            "the engine is starting up (startup_time {} s); ready in {:.1} s",
            self.startup.as_secs_f64(),
            left.as_secs_f64()
        ))
    }
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
    if let Some(kind) = state.faults.as_ref().and_then(FailureInjector::draw) {
        return FailureInjector::response(kind, &state.model_name);
    }
    next.run(request).await
}
