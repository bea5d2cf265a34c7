//! The axum application: shared state, routes, API-key check and body limit.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use mocker_live::{LiveEngine, LiveError, LiveRequest, OutputBuffering};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::auth::{require_api_key, ApiKey};
use crate::embeddings::embeddings;
use crate::error::ApiError;
use crate::faults::FailureInjector;
use crate::gate::{inject_failures, startup_gate, Readiness};
use crate::generate::{generate, Prepared};
use crate::lora::{load_lora_adapter, unload_lora_adapter, LoraRegistry};
use crate::metrics::ServerMetrics;
use crate::openai::request::{parse_chat, parse_completion, prompt_input, PromptInput};
use crate::openai::response::Endpoint;
use crate::openai::template;
use crate::plan::{requested_replay_key, Reasoning, ReplayTable};
use crate::responses::responses;
use crate::sleep::{is_sleeping, refuse_while_sleeping, sleep, wake_up, SleepMode};
use crate::tokenizer::Tokenizer;

/// The DP ranks of one engine; requests go to the rank with the fewest active requests.
#[derive(Debug, Clone)]
pub struct Ranks(pub Vec<LiveEngine>);

impl Ranks {
    /// The least-loaded rank and its position. A response the server reads whole itself
    /// (`streamed` false) is buffered whole: the server is its reader, never a slow client.
    pub fn pick(&self, streamed: bool) -> Result<(usize, LiveEngine), ApiError> {
        let (position, rank) = self
            .0
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.active_request_count())
            .ok_or_else(|| ApiError::unavailable("no engine ranks"))?;
        let engine = if streamed { rank.clone() } else { rank.with_buffering(OutputBuffering::FullResponse) };
        Ok((position, engine))
    }

    /// Submits to the least-loaded rank; also says which (its position).
    pub async fn submit(
        &self,
        request: mocker_core::Request,
        streamed: bool,
    ) -> Result<(LiveRequest, usize), ApiError> {
        let (position, rank) = self.pick(streamed)?;
        Ok((rank.submit(request).await?, position))
    }
}

impl From<LiveError> for ApiError {
    fn from(e: LiveError) -> Self {
        match e {
            LiveError::NotRunning | LiveError::EngineGone => ApiError::unavailable(e.to_string()),
            LiveError::InvalidRequest { .. } | LiveError::NoOutputTokens => {
                ApiError::bad_request(e.to_string())
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// Name clients must use in `model` (and that `/v1/models` lists).
    pub model_name: String,
    /// Prompt tokenizer and output detokenizer.
    pub tokenizer: Tokenizer,
    /// The engine's DP ranks.
    pub ranks: Ranks,
    /// `/metrics`.
    pub metrics: ServerMetrics,
    /// Context window (`--max-model-len`, else the server's default window when the KV
    /// pool holds more); `None` leaves the pool as the limit.
    pub max_model_len: Option<usize>,
    /// The longest sequence a request may have, as `/v1/models` reports it: the context
    /// window, else what one rank's KV pool holds.
    pub served_max_model_len: usize,
    /// Where a chat request sets no output length, the simulated model's end-of-sequence
    /// lengths (engine-args `output_length_distribution`).
    pub output_lengths: mocker_core::output_length::OutputLengthDistribution,
    /// Key required on `/v1/*` and state-changing routes, when set.
    pub api_key: Option<ApiKey>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks per rank.
    pub num_gpu_blocks: usize,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Longest wait for a request body to arrive in full.
    pub body_timeout: Duration,
    /// When the simulated engine is up (`startup_time`).
    pub readiness: Readiness,
    /// Failure injection on the inference routes, when a rate is set.
    pub faults: Option<FailureInjector>,
    /// Thinking spans (`dynamo.reasoning`), when configured.
    pub reasoning: Option<Reasoning>,
    /// Recorded outputs (`dynamo.response_replay_trace_path`), when configured.
    pub replay: Option<ReplayTable>,
    /// Prompt tokens one image in a chat message counts as (`--image-tokens`).
    pub image_tokens: usize,
    /// Sleep mode (`--enable-sleep-mode`); `None` answers its routes 404.
    pub sleep: Option<SleepMode>,
    /// Length of `/v1/embeddings` vectors (`--embedding-dim`).
    pub embedding_dim: usize,
    /// LoRA adapters (`--enable-lora`); `None` answers the adapter routes 404.
    pub lora: Option<LoraRegistry>,
    /// Disaggregated prefill/decode (`--kv-transfer-config`); `None` refuses
    /// `kv_transfer_params`.
    pub pd: Option<Arc<crate::pd::PdState>>,
    /// Most log-probability alternatives a request may ask for (`--max-logprobs`).
    pub max_logprobs: u32,
    /// API-server time a request spends before the engine sees it (`frontend_latency_ms`,
    /// divided by the speedup ratio like the engine's passes).
    pub frontend_delay: Duration,
}

impl AppState {
    /// What a request's `model` selects: the served model (`None`) or one of its LoRA
    /// adapters; anything else is a 404.
    pub fn resolve_model(&self, model: Option<&str>) -> Result<Option<mocker_core::LoraRef>, ApiError> {
        match model {
            None => Ok(None),
            Some(m) if m == self.model_name => Ok(None),
            Some(m) => match self.lora.as_ref().and_then(|l| l.resolve(m)) {
                Some(lora) => Ok(Some(lora)),
                None => Err(ApiError::model_not_found(m)),
            },
        }
    }
}

impl AppState {
    /// The error for a request the KV pool can never hold.
    pub fn rejection(&self, total_tokens: usize) -> ApiError {
        let blocks = total_tokens.div_ceil(self.block_size.max(1));
        ApiError::bad_request(format!(
            "the request needs {total_tokens} tokens of KV cache ({blocks} blocks of {}), but the engine has \
             only {} blocks; it can never be scheduled",
            self.block_size, self.num_gpu_blocks
        ))
    }
}

/// Builds the router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    // Failure injection applies to the inference routes only.
    let inference = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/responses", post(responses))
        .route_layer(middleware::from_fn_with_state(state.clone(), inject_failures))
        .route_layer(middleware::from_fn_with_state(state.clone(), refuse_while_sleeping));
    Router::new()
        .merge(inference)
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ping", get(health).post(health))
        .route("/health/ready", get(ready))
        .route("/version", get(|| async { axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})) }))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/sleep", post(sleep))
        .route("/wake_up", post(wake_up))
        .route("/is_sleeping", get(is_sleeping))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .route("/mocker/kv_transfer/read", post(crate::pd::read_handler))
        .route("/mocker/kv_transfer/abort", post(crate::pd::abort_handler))
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

/// Load clients correlate requests by `x-request-id`; echo it as vLLM does.
async fn echo_request_id(request: Request, next: Next) -> Response {
    let id = request.headers().get("x-request-id").cloned();
    let mut response = next.run(request).await;
    if let Some(id) = id {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

/// The body, at most `max_body_bytes` arriving within `body_timeout`, as a JSON error
/// otherwise.
pub(crate) async fn body(state: &AppState, request: Request) -> Result<Bytes, ApiError> {
    let limit = state.max_body_bytes;
    let request = request.map(|b| axum::body::Body::new(http_body_util::Limited::new(b, limit)));
    let read = tokio::time::timeout(state.body_timeout, Bytes::from_request(request, &()));
    let Ok(read) = read.await else {
        return Err(ApiError::body_timeout(state.body_timeout));
    };
    read.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_request(format!("could not read the request body: {e}"))
        }
    })
}

/// The client's `X-Request-Id`, which vLLM makes the response id (after the prefix).
pub(crate) fn request_id(request: &Request) -> Option<String> {
    let id = request.headers().get("x-request-id")?.to_str().ok()?;
    (!id.is_empty()).then(|| id.to_string())
}

async fn completions(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let request_id = request_id(&request);
    let bytes = body(&state, request).await?;
    let (generation, prompt) = parse_completion(&bytes)?;
    let replay_key = requested_replay_key(&bytes)?;
    let prepared = Prepared { endpoint: Endpoint::Completions, generation, prompt, request_id, replay_key };
    generate(state, prepared, arrived).await
}

async fn chat_completions(
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

/// `/health` and `/ping` (vLLM's alias, GET and POST): 200 while every rank's engine runs,
/// 503 while it starts (`startup_time`) and once one has stopped.
async fn health(State(state): State<Arc<AppState>>) -> Response {
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
async fn ready(state: State<Arc<AppState>>) -> Response {
    health(state).await
}

async fn models(State(state): State<Arc<AppState>>) -> impl IntoResponse {
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
    })];
    if let Some(lora) = &state.lora {
        data.extend(lora.model_cards(created));
    }
    axum::Json(json!({ "object": "list", "data": data }))
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(crate::metrics::CONTENT_TYPE));
    (headers, state.metrics.render())
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

async fn tokenize(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
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

async fn detokenize(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let bytes = body(&state, request).await?;
    let parsed: DetokenizeBody = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::invalid_field("tokens", format!("tokens: expected a list of token ids ({e})"))
    })?;
    let prompt = state.tokenizer.decode(&parsed.tokens).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(axum::Json(json!({ "prompt": prompt })).into_response())
}

async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    for rank in &state.ranks.0 {
        rank.reset_prefix_cache().await.map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    Ok(StatusCode::OK.into_response())
}
