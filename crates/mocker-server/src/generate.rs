//! One generation request from prompt to response: tokenize, check the context window,
//! submit to the least-loaded rank, wait for the first token (so an impossible request
//! still gets an HTTP error), then answer in one body or as a server-sent-event stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mocker_core::Request;
use mocker_live::{LiveRequest, OutputSignal};
use tokio::time::Instant;

use crate::app::AppState;
use crate::error::ApiError;
use crate::metrics::{FinishReason, FinishedRequest};
use crate::openai::request::{Generation, PromptInput};
use crate::openai::response::{ContentFrames, Endpoint, ResponseHeader, Usage, UsageMode};
use crate::output::sampler::Sampler;

/// A validated, tokenized request ready for the engine.
pub struct Prepared {
    /// Endpoint answered.
    pub endpoint: Endpoint,
    /// What the client asked for.
    pub generation: Generation,
    /// The prompt to tokenize.
    pub prompt: PromptInput,
    /// The client's `X-Request-Id`: the response id after its prefix, as in vLLM.
    pub request_id: Option<String>,
}

/// Runs a request to its response.
pub async fn generate(
    state: Arc<AppState>,
    prepared: Prepared,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let Prepared { endpoint, mut generation, prompt, request_id } = prepared;
    if let Some(model) = generation.model.as_deref() {
        if model != state.model_name {
            return Err(ApiError::model_not_found(model));
        }
    }
    let tokens = match prompt {
        PromptInput::Ids(ids) => ids,
        PromptInput::Text(text) => state
            .tokenizer
            .encode(&text, generation.add_special_tokens)
            .map_err(|e| ApiError::internal(e.to_string()))?,
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid_field(
            "prompt",
            "prompt must not be empty (it tokenizes to no tokens)",
        ));
    }
    check_context(&state, &tokens, &mut generation)?;
    let sampler = match generation.seed {
        Some(seed) => Sampler::seeded(seed, &tokens, 0),
        None => Sampler::random(),
    };
    let prompt_tokens = tokens.len();
    let max_tokens = generation.max_tokens as usize;
    let submitted = Instant::now();
    let (mut live, rank) = state
        .ranks
        .submit(Request {
            uuid: uuid::Uuid::new_v4().as_u128(),
            tokens,
            max_output_tokens: max_tokens,
            ..Default::default()
        })
        .await?;

    // Waiting here, not in the body, turns a rejection into a status code; clients time
    // the first byte either way.
    let first = match live.recv().await {
        Some(s) if s.rejected => return Err(state.rejection(prompt_tokens + max_tokens)),
        Some(s) => s,
        None => return Err(ApiError::unavailable("the engine stopped before the request produced a token")),
    };
    let header = ResponseHeader {
        endpoint,
        id: match request_id {
            Some(id) => format!("{}{id}", endpoint.id_prefix()),
            None => format!("{}{}", endpoint.id_prefix(), uuid::Uuid::new_v4().simple()),
        },
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: state.model_name.clone(),
    };
    let epoch = state.ranks.0[rank].started_at();
    let first_sim_ns = first.sim_time_ns;
    let scheduled_ns = first.scheduled_ns.unwrap_or(first_sim_ns).min(first_sim_ns);
    let stream = TokenStream {
        state: state.clone(),
        live,
        rank,
        arrived,
        queue: (epoch + Duration::from_nanos(scheduled_ns)).saturating_duration_since(submitted),
        scheduled_ns,
        first_sim_ns,
        last_at: first.observed_at,
        max_tokens,
        prompt_tokens,
        cached_tokens: first.cached_tokens.unwrap_or(0),
        generated: 0,
        done: false,
        sampler,
    };
    state.metrics.observe_first_token(
        rank,
        first.observed_at.saturating_duration_since(arrived),
        prompt_tokens,
    );
    if generation.stream {
        let mode =
            UsageMode { include_usage: generation.include_usage, continuous: generation.continuous_usage };
        Ok(sse_response(stream, header, first, mode))
    } else {
        full_response(stream, header, first).await
    }
}

/// vLLM's context-window rules: the prompt must leave room for one token; an output length
/// the client did not set is clipped to the room left, one it did set must fit.
fn check_context(state: &AppState, tokens: &[u32], generation: &mut Generation) -> Result<(), ApiError> {
    let Some(max_len) = state.max_model_len else { return Ok(()) };
    let prompt = tokens.len();
    if prompt >= max_len {
        return Err(ApiError::invalid_field(
            "prompt",
            format!(
                "This model's maximum context length is {max_len} tokens. However, your request has {prompt} \
                 input tokens. Please reduce the length of the input messages."
            ),
        ));
    }
    let room = (max_len - prompt) as u32;
    if !generation.max_tokens_given {
        generation.max_tokens = generation.max_tokens.min(room);
    } else if generation.max_tokens > room {
        let max = generation.max_tokens;
        return Err(ApiError::invalid_field(
            "max_tokens",
            format!(
                "This model's maximum context length is {max_len} tokens. However, you requested {} tokens \
                 ({prompt} in the messages, {max} in the completion). Please reduce the length of the \
                 messages or completion.",
                prompt + max as usize
            ),
        ));
    }
    Ok(())
}

/// A request's remaining outputs plus what the response and the metrics need.
struct TokenStream {
    state: Arc<AppState>,
    live: LiveRequest,
    /// Position of the rank serving it.
    rank: usize,
    arrived: Instant,
    /// Submission to the engine until the pass that first scheduled it.
    queue: Duration,
    /// That pass's start and the first token's pass end, on the simulated clock.
    scheduled_ns: u64,
    first_sim_ns: u64,
    last_at: Instant,
    max_tokens: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    generated: usize,
    done: bool,
    /// Picks each output token from the tokenizer's output pool.
    sampler: Sampler,
}

impl TokenStream {
    /// Accounts one signal; `true` when it carried a token.
    fn account(&mut self, signal: &OutputSignal) -> bool {
        let had_token = signal.token_id.is_some();
        if had_token {
            let gap = (signal.index > 0).then(|| signal.observed_at.saturating_duration_since(self.last_at));
            self.state.metrics.observe_token(self.rank, gap);
        }
        self.last_at = signal.observed_at;
        self.generated += usize::from(had_token);
        if signal.completed {
            self.done = true;
            let ns = |from: u64, to: u64| Duration::from_nanos(to.saturating_sub(from));
            self.state.metrics.observe_finished(&FinishedRequest {
                rank: self.rank,
                e2e: signal.observed_at.saturating_duration_since(self.arrived),
                queue: self.queue,
                prefill: ns(self.scheduled_ns, self.first_sim_ns),
                decode: ns(self.first_sim_ns, signal.sim_time_ns),
                prompt_tokens: self.prompt_tokens,
                generated: self.generated,
                max_tokens: self.max_tokens,
                n: 1,
                reason: FinishReason::Length,
            });
        }
        had_token
    }

    /// Why the stream ended before its last token.
    fn cut_short(&self) -> ApiError {
        if self.live.overflowed() {
            ApiError::unavailable(
                "the request was cancelled: its client read the stream too slowly and its output buffer \
                 (--stream-buffer-tokens) overflowed",
            )
        } else {
            ApiError::unavailable("the engine stopped before the request finished")
        }
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.generated, self.cached_tokens)
    }
}

impl Drop for TokenStream {
    /// A stream dropped before its last token (client gone, stream shed, engine stopped)
    /// is an aborted request, as vLLM counts it.
    fn drop(&mut self) {
        if !self.done {
            self.state.metrics.observe_aborted(self.rank);
        }
    }
}

async fn full_response(
    mut stream: TokenStream,
    header: ResponseHeader,
    first: OutputSignal,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut signal = Some(first);
    let state = stream.state.clone();
    let pool = state.tokenizer.output_vocab();
    while let Some(s) = signal {
        if stream.account(&s) {
            text.push_str(pool.text(stream.sampler.token(s.index, pool.len())));
        }
        if s.completed {
            break;
        }
        signal = stream.live.recv().await;
    }
    if !stream.done {
        return Err(stream.cut_short());
    }
    let body = header.body(&text, stream.usage());
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Most frames coalesced into one body chunk.
const MAX_FRAMES_PER_WRITE: usize = 64;

/// An SSE response in progress.
struct SseState {
    stream: TokenStream,
    header: ResponseHeader,
    frames: ContentFrames,
    mode: UsageMode,
    pending: Option<OutputSignal>,
    opened: bool,
    finished: bool,
}

impl SseState {
    /// Appends the frames of one signal (and the closing frames after the last).
    fn emit(&mut self, s: &OutputSignal, out: &mut Vec<u8>) {
        self.stream.account(s);
        let text = match s.token_id {
            Some(_) => {
                let pool = self.stream.state.tokenizer.output_vocab();
                pool.text(self.stream.sampler.token(s.index, pool.len()))
            }
            None => "",
        };
        self.frames.write(out, text, s.completed, self.stream.usage());
        if s.completed {
            if self.mode.include_usage {
                self.header.usage_frame(out, self.stream.usage());
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
            self.finished = true;
        }
    }
}

fn frame(json: &str) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The SSE body: one frame per token as its pass ends, the usage frame when asked, then
/// `[DONE]`. If the engine stops mid-stream the client gets an error frame before `[DONE]`,
/// never a silently truncated answer. Dropping the body (client gone) drops the
/// `LiveRequest`, which cancels the request in the engine.
fn sse_response(
    stream: TokenStream,
    header: ResponseHeader,
    first: OutputSignal,
    mode: UsageMode,
) -> Response {
    let frames = header.content_frames(mode);
    let init =
        SseState { stream, header, frames, mode, pending: Some(first), opened: false, finished: false };
    let body = futures_util::stream::unfold(init, |mut st| async move {
        if st.finished {
            return None;
        }
        let mut out = Vec::with_capacity(512);
        if !st.opened && st.header.endpoint == Endpoint::Chat {
            st.header.role_frame(&mut out, st.mode, st.stream.usage());
        }
        st.opened = true;
        let signal = match st.pending.take() {
            Some(s) => Some(s),
            None => st.stream.live.recv().await,
        };
        let Some(signal) = signal else {
            let err = st.stream.cut_short();
            out.extend_from_slice(&frame(&err.body()));
            out.extend_from_slice(b"data: [DONE]\n\n");
            st.finished = true;
            return Some((Ok::<_, Infallible>(Bytes::from(out)), st));
        };
        // A reader that fell behind the engine takes every token already delivered in
        // one write: under load that is the difference between a syscall per token and
        // one per batch. Bounded so one chunk stays small.
        let mut next = Some(signal);
        for _ in 0..MAX_FRAMES_PER_WRITE {
            let Some(signal) = next.take() else { break };
            st.emit(&signal, &mut out);
            if st.finished {
                break;
            }
            next = st.stream.live.try_recv();
        }
        // A signal taken when the chunk is full opens the next chunk.
        st.pending = next;
        Some((Ok::<_, Infallible>(Bytes::from(out)), st))
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
