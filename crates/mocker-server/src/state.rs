//! What every handler shares: the engine's ranks, the served model's settings and the
//! server's limits, and the request-body reading all routes use.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Request;
use mocker_live::{LiveEngine, LiveError, LiveRequest, OutputBuffering};

use crate::auth::ApiKey;
use crate::engine_card::EngineCard;
use crate::error::ApiError;
use crate::lora::LoraRegistry;
use crate::metrics::ServerMetrics;
use crate::plan::{Reasoning, ReplayTable};
use crate::readiness::Readiness;
use crate::runtime::RuntimeConfig;
use crate::sleep::SleepMode;
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
    /// What the engine is (backend, sizes, model and GPU).
    pub engine_card: EngineCard,
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
    /// What `/admin/config` changes at run time: speed-up ratio, failure injection, the
    /// API server's latency.
    pub runtime: RuntimeConfig,
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

/// The body, at most `max_body_bytes` arriving within `body_timeout`, as a JSON error
/// otherwise.
pub async fn body(state: &AppState, request: Request) -> Result<Bytes, ApiError> {
    crate::body::read(state.max_body_bytes, state.body_timeout, request).await
}

/// The client's `X-Request-Id`, which vLLM makes the response id (after the prefix).
pub fn request_id(request: &Request) -> Option<String> {
    let id = request.headers().get("x-request-id")?.to_str().ok()?;
    (!id.is_empty()).then(|| id.to_string())
}

impl AppState {
    /// The side-channel routes' view of this server.
    pub fn side_channel(&self) -> crate::pd::SideChannel {
        crate::pd::SideChannel {
            pd: self.pd.clone(),
            block_size: self.block_size,
            api_key: self.api_key.clone(),
            max_body_bytes: self.max_body_bytes,
            body_timeout: self.body_timeout,
        }
    }
}

/// The planner of structured outputs borrows the tokenizer through the shared state.
impl AsRef<Tokenizer> for AppState {
    fn as_ref(&self) -> &Tokenizer {
        &self.tokenizer
    }
}
