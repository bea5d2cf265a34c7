//! vLLM's own routes beside the OpenAI API: health probes, `/metrics`, `/tokenize`,
//! `/detokenize` and `/reset_prefix_cache`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mocker_live::LiveEngine;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::request::{parse_chat, prompt_input, PromptInput};
use crate::openai::template;
use crate::state::{body, AppState};

/// `/health` and `/ping` (vLLM's alias, GET and POST): 200 while every rank's engine runs,
/// 503 while it starts (`startup_time`) and once one has stopped.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if !state.readiness.is_ready() {
        return state.readiness.starting_error().into_response();
    }
    match state.ranks.0.iter().all(LiveEngine::is_running) {
        true => StatusCode::OK.into_response(),
        false => ApiError::unavailable("the engine is not running").into_response(),
    }
}

/// `/health/ready`: as `/health`: ready once the simulated startup is over, until the
/// engine stops.
pub async fn ready(state: State<Arc<AppState>>) -> Response {
    health(state).await
}

/// `GET /metrics`: Prometheus text with vLLM's (or SGLang's) names.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::metrics::CONTENT_TYPE));
    (headers, state.metrics.render())
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

/// `POST /tokenize`: a prompt or chat messages to token ids, as vLLM counts them.
pub async fn tokenize(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let bytes = body(&state, request).await?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let add_special = value.get("add_special_tokens").and_then(Value::as_bool);
    let tokens = if value.get("messages").is_some() {
        let (_, messages) = parse_chat(&bytes)?;
        match template::prompt(&messages) {
            PromptInput::Multimodal { text, images } => {
                Ok(crate::generate::multimodal_tokens(&state, &text, &images, add_special.unwrap_or(false))?)
            }
            _ => state.tokenizer.encode(&template::render(&messages), add_special.unwrap_or(false)),
        }
    } else {
        match prompt_input(&value["prompt"])? {
            PromptInput::Text(text) | PromptInput::Multimodal { text, .. } => {
                state.tokenizer.encode(&text, add_special.unwrap_or(true))
            }
            PromptInput::Ids(ids) => Ok(ids),
        }
    }
    .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(axum::Json(json!({"count": tokens.len(), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": null}))
        .into_response())
}

/// `POST /detokenize`: token ids back to text.
pub async fn detokenize(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let bytes = body(&state, request).await?;
    let parsed: DetokenizeBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid_field("tokens", format!("tokens: expected a list of token ids ({e})"))
    })?;
    let prompt = state.tokenizer.decode(&parsed.tokens).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(axum::Json(json!({ "prompt": prompt })).into_response())
}

/// `POST /reset_prefix_cache`: drops every rank's cached prefixes.
pub async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    for rank in &state.ranks.0 {
        rank.reset_prefix_cache().await.map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    Ok(StatusCode::OK.into_response())
}
