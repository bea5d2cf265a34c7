//! OpenAI's API: `/v1/completions`, `/v1/chat/completions`, `/v1/models` (`/v1/embeddings`
//! and `/v1/responses` have modules of their own).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::generate::{generate, Prepared};
use crate::openai::request::{parse_chat, parse_completion};
use crate::openai::response::Endpoint;
use crate::openai::template;
use crate::plan::requested_replay_key;
use crate::state::{body, request_id, AppState};

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let request_id = request_id(&request);
    let bytes = body(&state, request).await?;
    let (generation, prompt) = parse_completion(&bytes)?;
    let replay_key = requested_replay_key(&bytes)?;
    let prepared = Prepared { endpoint: Endpoint::Completions, generation, prompt, request_id, replay_key };
    generate(state, prepared, arrived).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let request_id = request_id(&request);
    let bytes = body(&state, request).await?;
    let (generation, messages) = parse_chat(&bytes)?;
    let prompt = template::prompt(&messages);
    let replay_key = requested_replay_key(&bytes)?;
    generate(
        state,
        Prepared { endpoint: Endpoint::Chat, generation, prompt, request_id, replay_key },
        arrived,
    )
    .await
}

/// `GET /v1/models`: the served model and its LoRA adapters.
pub async fn models(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let created =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut data = vec![json!({
        "id": state.model_name,
        "object": "model",
        "created": created,
        "owned_by": "mocker",
        "root": state.model_name,
        "parent": null,
        "max_model_len": state.served_max_model_len,
        // mocker's own: what this worker's engine is (each worker of a mixed fleet differs).
        "mocker_engine": state.engine_card,
    })];
    if let Some(lora) = &state.lora {
        data.extend(lora.model_cards(created));
    }
    axum::Json(json!({ "object": "list", "data": data }))
}
