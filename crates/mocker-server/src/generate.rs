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
use crate::openai::response::{ContentFrames, Endpoint, Finish, ResponseHeader, Usage, UsageMode};
use crate::output::sampler::Sampler;
use crate::output::stop::{StopRules, StopScan};
use crate::plan::{reasoning_frame, with_reasoning, Phase, Replayed, RequestPlan};

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
    /// The recorded output named by `nvext.annotations` (`output_replay_id:KEY`), if any.
    pub replay_key: Option<String>,
}

/// Runs a request to its response.
pub async fn generate(
    state: Arc<AppState>,
    prepared: Prepared,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let Prepared { endpoint, mut generation, prompt, request_id, replay_key } = prepared;
    if let Some(model) = generation.model.as_deref() {
        if model != state.model_name {
            return Err(ApiError::model_not_found(model));
        }
    }
    let codec = |e: crate::tokenizer::TokenizerError| ApiError::internal(e.to_string());
    let (tokens, echo) = match prompt {
        PromptInput::Ids(ids) => {
            let echo =
                if generation.echo { Some(state.tokenizer.decode(&ids).map_err(codec)?) } else { None };
            (ids, echo)
        }
        PromptInput::Text(text) => {
            let tokens = state.tokenizer.encode(&text, generation.add_special_tokens).map_err(codec)?;
            (tokens, generation.echo.then_some(text))
        }
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid_field(
            "prompt",
            "prompt must not be empty (it tokenizes to no tokens)",
        ));
    }
    check_context(&state, &tokens, &mut generation)?;
    let plan = plan_output(&state, endpoint, replay_key.as_deref(), tokens.len(), &mut generation)?;
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
            output_token_ids: plan.replay.as_ref().map(|r| r.ids().to_vec()),
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
        live: Some(live),
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
        scan: generation.stop.is_active().then(|| StopScan::new(&generation.stop)),
        rules: generation.stop,
        finish: None,
        plan,
        reasoning: String::new(),
        last_phase: Phase::Content,
    };
    state.metrics.observe_first_token(
        rank,
        first.observed_at.saturating_duration_since(arrived),
        prompt_tokens,
    );
    if generation.stream {
        let mode =
            UsageMode { include_usage: generation.include_usage, continuous: generation.continuous_usage };
        Ok(sse_response(stream, header, first, mode, echo))
    } else {
        full_response(stream, header, first, echo).await
    }
}

/// vLLM's context-window rules: the prompt must leave room for one token; an output length
/// the client did not set is clipped to the room left (chat: it is the room left), one it
/// did set must fit.
fn check_context(state: &AppState, tokens: &[u32], generation: &mut Generation) -> Result<(), ApiError> {
    let prompt = tokens.len();
    if let Some(max_len) = state.max_model_len {
        if prompt >= max_len {
            return Err(ApiError::invalid_field(
                "prompt",
                format!(
                    "This model's maximum context length is {max_len} tokens. However, your request has \
                     {prompt} input tokens. Please reduce the length of the input messages."
                ),
            ));
        }
        let room = (max_len - prompt) as u32;
        if generation.max_tokens_given && generation.max_tokens > room {
            let max = generation.max_tokens;
            return Err(ApiError::invalid_field(
                "max_tokens",
                format!(
                    "This model's maximum context length is {max_len} tokens. However, you requested {} \
                     tokens ({prompt} in the messages, {max} in the completion). Please reduce the length \
                     of the messages or completion.",
                    prompt + max as usize
                ),
            ));
        }
    }
    if !generation.max_tokens_given {
        // Without --max-model-len the longest sequence is what one rank's KV pool holds.
        let room = state.max_model_len.unwrap_or(state.served_max_model_len).saturating_sub(prompt).max(1);
        let room = u32::try_from(room).unwrap_or(u32::MAX);
        generation.max_tokens =
            if generation.default_to_context { room } else { generation.max_tokens.min(room) };
    }
    if generation.stop.min_tokens > generation.max_tokens {
        let (min, max) = (generation.stop.min_tokens, generation.max_tokens);
        return Err(ApiError::invalid_field(
            "min_tokens",
            format!("min_tokens ({min}) must be less than or equal to the output length ({max})"),
        ));
    }
    Ok(())
}

/// The thinking span and replayed tokens of one request (see [`crate::plan`]); a replayed
/// output sets the output length, clipped to the context window.
fn plan_output(
    state: &AppState,
    endpoint: Endpoint,
    replay_key: Option<&str>,
    prompt: usize,
    generation: &mut Generation,
) -> Result<RequestPlan, ApiError> {
    let mut plan =
        RequestPlan { split: endpoint == Endpoint::Chat && state.reasoning.is_some(), ..Default::default() };
    if let Some(key) = replay_key {
        let field = "nvext.annotations";
        let Some(table) = &state.replay else {
            return Err(ApiError::invalid_field(
                field,
                "output_replay_id: this server replays no recorded outputs (start it with engine-args \
                 dynamo.response_replay_trace_path)",
            ));
        };
        let ids = table.get(key).ok_or_else(|| {
            ApiError::invalid_field(field, format!("output_replay_id: no recorded output with key {key:?}"))
        })?;
        let room = state.max_model_len.unwrap_or(state.served_max_model_len).saturating_sub(prompt);
        let ids = &ids[..ids.len().min(room)];
        generation.max_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        generation.stop.min_tokens = generation.stop.min_tokens.min(generation.max_tokens);
        plan.replay = Some(Replayed::new(ids, &state.tokenizer)?);
    } else if let Some(r) = &state.reasoning {
        plan.thinking = r.thinking_len(generation.max_tokens as usize);
    }
    Ok(plan)
}

/// Appends `piece` where its phase belongs: everything to `text` unless the reasoning is
/// split out (chat), then thinking to `reasoning` and the markers nowhere.
fn route(split: bool, phase: Phase, piece: &str, text: &mut String, reasoning: &mut String) {
    match (split, phase) {
        (false, _) | (true, Phase::Content) => text.push_str(piece),
        (true, Phase::Thinking) => reasoning.push_str(piece),
        (true, Phase::Open | Phase::Close) => {}
    }
}

/// A request's remaining outputs plus what the response and the metrics need.
struct TokenStream {
    state: Arc<AppState>,
    /// The engine's stream; dropped (cancelling the request, freeing its KV) when a stop
    /// condition ends the output early.
    live: Option<LiveRequest>,
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
    rules: StopRules,
    /// Present when stop conditions are set.
    scan: Option<StopScan>,
    /// How the output ended, once it has.
    finish: Option<Finish>,
    /// Thinking span and replayed tokens.
    plan: RequestPlan,
    /// Reasoning text not yet sent (chat with a reasoning config).
    reasoning: String,
    /// Where the latest token belonged.
    last_phase: Phase,
}

impl TokenStream {
    /// Accounts one signal and appends the text it adds to `text`; sets `finish` when the
    /// output ended (the engine's last token, or a stop condition, which also cancels the
    /// engine request as vLLM aborts a stopped sequence, freeing its KV at once).
    fn step(&mut self, signal: &OutputSignal, text: &mut String) {
        let had_token = signal.token_id.is_some();
        if had_token {
            let gap = (signal.index > 0).then(|| signal.observed_at.saturating_duration_since(self.last_at));
            self.state.metrics.observe_token(self.rank, gap);
        }
        self.last_at = signal.observed_at;
        self.generated += usize::from(had_token);
        if had_token {
            let k = signal.index as usize;
            let (id, piece) = match self.plan.token(k, self.state.reasoning.as_ref()) {
                Some(fixed) => fixed,
                None => {
                    let pool = self.state.tokenizer.output_vocab();
                    let i = self.sampler.token(signal.index, pool.len());
                    (pool.id(i), pool.text(i))
                }
            };
            let (split, phase) = (self.plan.split, self.plan.phase(k));
            self.last_phase = phase;
            match &mut self.scan {
                None => route(split, phase, piece, text, &mut self.reasoning),
                Some(scan) => {
                    let step = scan.push(&self.rules, id, piece);
                    route(split, phase, &scan.text()[step.send], text, &mut self.reasoning);
                    if let Some(why) = step.stop {
                        self.live = None;
                        self.end(signal, Finish::stopped(why), FinishReason::Stop);
                        return;
                    }
                }
            }
        }
        if signal.completed {
            if let Some(scan) = &mut self.scan {
                let step = scan.finish(None);
                let (split, phase) = (self.plan.split, self.last_phase);
                route(split, phase, &scan.text()[step.send], text, &mut self.reasoning);
            }
            self.end(signal, Finish::LENGTH, FinishReason::Length);
        }
    }

    fn end(&mut self, signal: &OutputSignal, finish: Finish, reason: FinishReason) {
        self.done = true;
        self.finish = Some(finish);
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
            reason,
        });
    }

    async fn recv(&mut self) -> Option<OutputSignal> {
        self.live.as_mut()?.recv().await
    }

    fn try_recv(&mut self) -> Option<OutputSignal> {
        self.live.as_mut()?.try_recv()
    }

    /// Why the stream ended before its last token.
    fn cut_short(&self) -> ApiError {
        if self.live.as_ref().is_some_and(LiveRequest::overflowed) {
            ApiError::unavailable(
                "the request was cancelled: its client read the stream too slowly and its output buffer \
                 (--stream-buffer-tokens) overflowed",
            )
        } else if self.state.sleep.as_ref().is_some_and(crate::sleep::SleepMode::is_sleeping) {
            ApiError::unavailable("the request was aborted: the engine was put to sleep (POST /sleep)")
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
    echo: Option<String>,
) -> Result<Response, ApiError> {
    let mut text = echo.unwrap_or_default();
    let mut signal = Some(first);
    while let Some(s) = signal {
        stream.step(&s, &mut text);
        if stream.done {
            break;
        }
        signal = stream.recv().await;
    }
    let Some(finish) = stream.finish.take() else { return Err(stream.cut_short()) };
    let mut body = header.body(&text, stream.usage(), &finish);
    if stream.plan.split {
        body = with_reasoning(body, &stream.reasoning);
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Most frames coalesced into one body chunk.
const MAX_FRAMES_PER_WRITE: usize = 64;

/// An SSE response in progress.
struct SseState {
    stream: TokenStream,
    header: ResponseHeader,
    frames: ContentFrames,
    /// The current signal's text, reused from token to token.
    text: String,
    mode: UsageMode,
    pending: Option<OutputSignal>,
    opened: bool,
    /// Whether the first content frame was written (it keeps the echoed prompt).
    opened_text: bool,
    finished: bool,
}

impl SseState {
    /// Appends the frames of one signal (and the closing frames after the last).
    fn emit(&mut self, s: &OutputSignal, out: &mut Vec<u8>) {
        // The echoed prompt (completions `echo`) leads the first frame; later frames start empty.
        if !self.opened_text {
            self.opened_text = true;
        } else {
            self.text.clear();
        }
        self.stream.step(s, &mut self.text);
        let last = self.stream.finish.as_ref();
        if self.stream.plan.split {
            // As vLLM's reasoning parsers stream: thinking as `reasoning_content` deltas, no
            // chunk for the markers (unless the output ends on one).
            if !self.stream.reasoning.is_empty() {
                reasoning_frame(&self.header, out, &self.stream.reasoning, self.mode, self.stream.usage());
                self.stream.reasoning.clear();
            }
            if self.stream.last_phase == Phase::Content || last.is_some() {
                self.frames.write(out, &self.text, last, self.stream.usage());
            }
        } else {
            self.frames.write(out, &self.text, last, self.stream.usage());
        }
        if last.is_some() {
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
    echo: Option<String>,
) -> Response {
    let frames = header.content_frames(mode);
    let init = SseState {
        stream,
        header,
        frames,
        text: echo.unwrap_or_default(),
        mode,
        pending: Some(first),
        opened: false,
        opened_text: false,
        finished: false,
    };
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
            None => st.stream.recv().await,
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
            next = st.stream.try_recv();
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
