//! The axum application: every API family's routes assembled over the shared state, with
//! the middleware (API key, startup gate, failure injection, request ids) around them, and
//! the split of one port between them and the gRPC services.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, StatusCode, Version};
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;

use crate::api::middleware::{
    echo_request_id, inject_failures, refuse_while_sleeping, require_api_key, startup_gate,
};
use crate::api::{admin, anthropic, embeddings, lora, openai, pooling, responses, sleep, tokens, vllm};
use crate::error::ApiError;
use crate::pd;
use crate::state::AppState;

/// Builds the router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    // Failure injection applies to the inference routes only.
    let inference = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::responses))
        .route("/inference/v1/generate", post(tokens::generate_tokens))
        .route("/v1/messages", post(anthropic::messages))
        .route("/rerank", post(pooling::rerank))
        .route("/v1/rerank", post(pooling::rerank))
        .route("/v2/rerank", post(pooling::rerank))
        .route("/score", post(pooling::score))
        .route("/v1/score", post(pooling::score))
        .route("/pooling", post(pooling::pooling))
        .route_layer(middleware::from_fn_with_state(state.clone(), inject_failures))
        .route_layer(middleware::from_fn_with_state(state.clone(), refuse_while_sleeping));
    Router::new()
        .merge(inference)
        .route("/v1/models", get(openai::models))
        .route("/admin/config", get(admin::get_config).post(admin::post_config))
        .route("/health", get(vllm::health))
        .route("/ping", get(vllm::health).post(vllm::health))
        .route("/health/ready", get(vllm::ready))
        .route("/version", get(|| async { axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})) }))
        .route("/metrics", get(vllm::metrics))
        .route("/tokenize", post(vllm::tokenize))
        .route("/detokenize", post(vllm::detokenize))
        // Counting runs no engine request: like /tokenize, no failure injection.
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/reset_prefix_cache", post(vllm::reset_prefix_cache))
        .route("/sleep", post(sleep::sleep))
        .route("/wake_up", post(sleep::wake_up))
        .route("/is_sleeping", get(sleep::is_sleeping))
        .route("/v1/load_lora_adapter", post(lora::load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(lora::unload_lora_adapter))
        .merge(
            Router::new()
                .route("/mocker/kv_transfer/read", post(pd::read_handler))
                .route("/mocker/kv_transfer/abort", post(pd::abort_handler))
                .with_state(state.side_channel()),
        )
        .fallback(|request: Request| async move {
            ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("no route {} {}", request.method(), request.uri().path()),
                param: None,
            }
        })
        .method_not_allowed_fallback(|request: Request| async move {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                message: format!("method {} is not allowed on {}", request.method(), request.uri().path()),
                param: None,
            }
        })
        // The handlers enforce the limit themselves so the client gets a JSON error.
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), startup_gate))
        // Outside the routing, so unknown `/v1` paths need the key too (as in vLLM).
        .layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .layer(middleware::from_fn(echo_request_id))
        .with_state(state)
}

/// Whether a request is a gRPC call: HTTP/2 with a gRPC content type
/// (`application/grpc`, `application/grpc+proto`, ...), as gRPC clients send.
pub fn is_grpc(request: &Request) -> bool {
    request.version() == Version::HTTP_2
        && request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|ct| {
            ct == "application/grpc"
                || ct.starts_with("application/grpc+")
                || ct.starts_with("application/grpc;")
        })
}

/// One port for both: gRPC calls go to `grpc`, everything else to `http`.
pub fn dispatch(http: Router, grpc: Router) -> Router {
    use tower::ServiceExt;
    Router::new().fallback_service(tower::service_fn(move |request: Request| {
        let target = if is_grpc(&request) { grpc.clone() } else { http.clone() };
        target.oneshot(request)
    }))
}
