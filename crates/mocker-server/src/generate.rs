//! One generation request from prompt to response: tokenize, check the context window,
//! submit to the least-loaded rank, wait for the first token (so an impossible request
//! still gets an HTTP error), then answer in one body or as a server-sent-event stream.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use mocker_core::Request;
use mocker_live::{LiveRequest, OutputSignal};
use tokio::time::Instant;

use crate::choice_plan::{plan_choices, ChoicePlan, Planned};
use crate::error::ApiError;
use crate::metrics::{FinishReason, FinishedRequest};
use crate::openai::request::{Generation, PromptInput};
use crate::openai::response::{
    ChoiceBody, ContentFrames, Endpoint, Finish, FrameExtras, ResponseHeader, Usage, UsageMode,
};
use crate::output::logprobs::{LogprobsAcc, LogprobsShape};
use crate::output::sampler::Sampler;
use crate::output::stop::{StopRules, StopScan};
use crate::pd::{KvRole, KvTransfer, PrefillHandoff, ReadFrom};
use crate::plan::{reasoning_frame, with_reasoning, Phase, Replayed, RequestPlan};
use crate::state::AppState;

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
    let Started { choices, header, echo, prefill, transfer_ms, stream, mode } =
        start(state, prepared, arrived).await?;
    let mut response = if stream {
        sse_response(choices, header, mode, echo, prefill)
    } else {
        full_response(choices, header, echo, prefill).await?
    };
    if let Some(ms) = transfer_ms {
        if let Ok(v) = HeaderValue::from_str(&format!("{ms}")) {
            response.headers_mut().insert(crate::pd::TRANSFER_MS_HEADER, v);
        }
    }
    Ok(response)
}

/// A request running in the engine, its first token received (so a request the engine
/// cannot take already failed): what a protocol's response reads token by token.
pub struct Started {
    choices: Choices,
    header: ResponseHeader,
    echo: Option<String>,
    /// A disaggregated prefill's handoff: its `kv_transfer_params` once the KV is held.
    prefill: Option<(PrefillHandoff, Arc<crate::pd::PdState>, usize)>,
    transfer_ms: Option<f64>,
    stream: bool,
    mode: UsageMode,
}

/// What [`Started::next`] read.
#[derive(Debug)]
pub enum Event {
    /// Choice `index` advanced by `token` (a signal may carry none); `finish` is set when
    /// that ended the choice.
    Token {
        /// The choice.
        index: u32,
        /// Its new output token.
        token: Option<u32>,
        /// How it ended, on its last event.
        finish: Option<Finish>,
    },
    /// A choice's engine stream ended before its last token (engine stopped, slow reader
    /// cancelled, put to sleep).
    Failed(ApiError),
    /// Every choice has finished.
    Done,
}

impl Started {
    /// The prompt's length in tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.choices.streams[0].prompt_tokens
    }

    /// Prompt tokens found in the prefix cache (or transferred from a prefill server).
    pub fn cached_tokens(&self) -> usize {
        self.choices.streams[0].cached_tokens
    }

    /// Choices the request generates (`n`).
    pub fn choices(&self) -> usize {
        self.choices.streams.len()
    }

    /// The next output event of any choice; dropping `self` cancels the unfinished ones in
    /// the engine (freeing their KV) and counts them aborted.
    pub async fn next(&mut self) -> Event {
        let mut scratch = String::new();
        match self.choices.next().await {
            Next::Signal(i, signal) => {
                let stream = &mut self.choices.streams[i];
                let token = stream.step(&signal, &mut scratch);
                Event::Token { index: stream.index, token, finish: stream.finish.clone() }
            }
            Next::CutShort(i) => Event::Failed(self.choices.streams[i].cut_short()),
            Next::Done => Event::Done,
        }
    }

    /// A disaggregated prefill's `kv_transfer_params` for its decode peer, once its KV is
    /// held (call after [`Event::Done`]); `None` for any other request.
    pub async fn kv_transfer_params(&mut self) -> Result<Option<serde_json::Value>, ApiError> {
        match self.prefill.take() {
            Some((handoff, pd, prompt_tokens)) => handoff.finish(&pd, &self.header.id, prompt_tokens).await,
            None => Ok(None),
        }
    }
}

/// Validates, tokenizes and submits a request, and waits for each choice's first token.
pub async fn start(state: Arc<AppState>, prepared: Prepared, arrived: Instant) -> Result<Started, ApiError> {
    let Prepared { endpoint, mut generation, prompt, request_id, replay_key } = prepared;
    let lora = state.resolve_model(generation.model.as_deref())?;
    let transfer = std::mem::take(&mut generation.kv_transfer);
    if let Some(pd) = &state.pd {
        pd.check_role(&transfer)?;
    }
    if let (KvTransfer::Bootstrap(_), None) = (&transfer, &state.pd) {
        return Err(ApiError::invalid_field(
            "bootstrap_room",
            "bootstrap_room: SGLang's PD fields need an SGLang-backend server started as a prefill or decode \
             worker (engine-args worker_type prefill or decode)",
        ));
    }
    if transfer != KvTransfer::None {
        if state.pd.is_none() {
            return Err(ApiError::invalid_field(
                "kv_transfer_params",
                "kv_transfer_params: this server has no KV connector; start it with --kv-transfer-config \
                 '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'",
            ));
        }
        if generation.n > 1 {
            return Err(ApiError::invalid_field(
                "n",
                "n: a disaggregated request generates one sequence (n = 1)",
            ));
        }
    }
    let (tokens, echo) = prompt_tokens(&state, prompt, &generation)?;
    check_context(&state, &tokens, &mut generation)?;
    check_output_size(&state, &generation)?;
    if matches!(transfer, KvTransfer::Bootstrap(_))
        && state.pd.as_ref().is_some_and(|pd| pd.role() == KvRole::Producer)
    {
        // SGLang's prefill server computes the first token only; its decode peer, sent the
        // same request, generates the rest.
        generation.max_tokens = 1;
        generation.stop.min_tokens = generation.stop.min_tokens.min(1);
    }
    if replay_key.is_some() && (generation.structured.is_some() || generation.tools.is_some()) {
        return Err(ApiError::invalid_field(
            "nvext.annotations",
            "output_replay_id replays recorded tokens; it cannot be combined with response_format or tools",
        ));
    }
    let req_plan = plan_output(&state, endpoint, replay_key.as_deref(), tokens.len(), &mut generation)?;
    let n = generation.n;
    let prompt_tokens = tokens.len();
    let max_tokens = generation.max_tokens as usize;
    // Plans first: a schema the generator cannot satisfy is a 400 before anything runs.
    let samplers: Vec<Sampler> = (0..n)
        .map(|index| match generation.seed {
            Some(seed) => Sampler::seeded(seed, &tokens, index),
            None => Sampler::random(),
        })
        .collect();
    let choice_plans = plan_choices(
        &state,
        &samplers,
        generation.structured.as_ref(),
        generation.tools.as_ref(),
        generation.max_tokens,
    )
    .await?;
    let mut plans = Vec::with_capacity(n as usize);
    for (sampler, plan) in samplers.into_iter().zip(choice_plans) {
        // Structured output and tool calls are written from their first token: no thinking span.
        let mut req_plan = req_plan.clone();
        if plan.planned.is_some() {
            req_plan.thinking = 0;
        } else if let Some(len) = eos_length(&state, &generation, &sampler, &req_plan) {
            req_plan.eos_at = Some(len);
            if let Some(r) = &state.reasoning {
                req_plan.thinking = r.thinking_len(len);
            }
        }
        plans.push((sampler, plan, req_plan));
    }
    // n > 1 is n engine requests for one prompt, as vLLM fans a parent request out into
    // children: the first computes the prompt's KV and the others, admitted in the same
    // pass or later, find its full blocks in the prefix cache.
    let submitted = Instant::now();
    // The API server's own time (HTTP, tokenization, detokenization) as the configuration
    // models it, before the engine sees the request.
    let delay = state.runtime.frontend_delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let mut lives = Vec::with_capacity(n as usize);
    let mut prefill: Option<PrefillHandoff> = None;
    // A decode whose prompt KV was transferred counts the whole prompt as computed.
    let mut transfer_ms = None;
    for (sampler, plan, req_plan) in plans {
        let planned_len = plan.planned.as_ref().map(Planned::len);
        let request = Request {
            uuid: uuid::Uuid::new_v4().as_u128(),
            tokens: tokens.clone(),
            // Planned output ends where the plan does (the model writes EOS there), as does
            // an output whose length was drawn.
            max_output_tokens: planned_len.or(req_plan.eos_at).map_or(max_tokens, |l| l.min(max_tokens)),
            output_token_ids: req_plan.replay.as_ref().map(|r| r.ids().to_vec()),
            lora: lora.clone(),
            ..Default::default()
        };
        let (live, rank) = match (&transfer, &state.pd) {
            (KvTransfer::Prefill, Some(_)) => {
                let (rank, engine) = state.ranks.pick(generation.stream)?;
                let (live, handoff) =
                    crate::pd::start_prefill(&engine, request, state.block_size, None).await?;
                prefill = Some(handoff);
                (live, rank)
            }
            (KvTransfer::Bootstrap(b), Some(pd)) if pd.role() == KvRole::Producer => {
                let (rank, engine) = state.ranks.pick(generation.stream)?;
                let (live, handoff) =
                    crate::pd::start_prefill(&engine, request, state.block_size, Some(b.room)).await?;
                prefill = Some(handoff);
                (live, rank)
            }
            (KvTransfer::Decode(remote), Some(pd)) => {
                let (rank, engine) = state.ranks.pick(generation.stream)?;
                let (live, read) =
                    crate::pd::start_decode(pd, &engine, request, ReadFrom::Nixl(remote)).await?;
                transfer_ms = read;
                (live, rank)
            }
            (KvTransfer::Bootstrap(b), Some(pd)) => {
                let (rank, engine) = state.ranks.pick(generation.stream)?;
                let (live, read) = crate::pd::start_decode(pd, &engine, request, ReadFrom::Room(b)).await?;
                transfer_ms = read;
                (live, rank)
            }
            _ => state.ranks.submit(request, generation.stream).await?,
        };
        lives.push((live, rank, sampler, plan, req_plan));
    }
    drop(tokens);

    let header = ResponseHeader {
        endpoint,
        id: match request_id {
            Some(id) => format!("{}{id}", endpoint.id_prefix()),
            None => format!("{}{}", endpoint.id_prefix(), uuid::Uuid::new_v4().simple()),
        },
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        // As vLLM: an adapter's requests are answered in its name.
        model: lora.as_ref().map_or_else(|| state.model_name.clone(), |l| l.name.to_string()),
    };
    let mut choices = Vec::with_capacity(n as usize);
    let mut firsts = Vec::with_capacity(n as usize);
    for (index, (mut live, rank, sampler, plan, req_plan)) in lives.into_iter().enumerate() {
        // Waiting here, not in the body, turns a rejection into a status code; clients
        // time the first byte either way.
        let first = match live.recv().await {
            Some(s) if s.rejected => return Err(state.rejection(prompt_tokens + max_tokens)),
            Some(s) => s,
            None => {
                return Err(ApiError::unavailable("the engine stopped before the request produced a token"))
            }
        };
        let epoch = state.ranks.0[rank].started_at();
        let first_sim_ns = first.sim_time_ns;
        let scheduled_ns = first.scheduled_ns.unwrap_or(first_sim_ns).min(first_sim_ns);
        state.metrics.observe_first_token(
            rank,
            first.observed_at.saturating_duration_since(arrived),
            prompt_tokens,
        );
        choices.push(TokenStream {
            state: state.clone(),
            index: index as u32,
            live: Some(live),
            rank,
            arrived,
            queue: (epoch + Duration::from_nanos(scheduled_ns)).saturating_duration_since(submitted),
            scheduled_ns,
            first_sim_ns,
            last_at: first.observed_at,
            max_tokens,
            n: n as usize,
            prompt_tokens,
            cached_tokens: if transfer_ms.is_some() {
                prompt_tokens
            } else {
                first.cached_tokens.unwrap_or(0)
            },
            generated: 0,
            done: false,
            sampler,
            scan: generation.stop.is_active().then(|| StopScan::new(&generation.stop)),
            rules: generation.stop.clone(),
            finish: None,
            plan,
            req_plan,
            reasoning: String::new(),
            last_phase: Phase::Content,
            logprobs: generation.logprobs.map(LogprobsAcc::new),
            text_len: echo.as_ref().map_or(0, String::len),
            ids: generation.token_ids.then(Vec::new),
        });
        firsts.push(Some(first));
    }
    let choices = Choices { streams: choices, firsts, cursor: 0 };
    let prefill =
        prefill.map(|h| (h, state.pd.clone().expect("a prefill needs the connector"), prompt_tokens));
    let mode = UsageMode { include_usage: generation.include_usage, continuous: generation.continuous_usage };
    Ok(Started { choices, header, echo, prefill, transfer_ms, stream: generation.stream, mode })
}

/// Token ids of a chat prompt with images: the text around each image tokenized on its
/// own, each image as `--image-tokens` ids derived from a hash of its URL (or data URL),
/// so the same image gives the same ids and shares prefix-cache blocks as vLLM's
/// multimodal hashing makes it.
/// The prompt's token ids, and the text `echo` gives back (when asked for and known).
/// Most tokens one request's choices may generate together (`n` × `max_tokens`).
pub const MAX_REQUEST_OUTPUT_TOKENS: u64 = 1 << 24;
/// Most log-probability entries one request's response may carry (`n` × `max_tokens` ×
/// (1 + alternatives)): with them a response is ~100 bytes a token and alternative.
pub const MAX_REQUEST_LOGPROB_ENTRIES: u64 = 1 << 22;

/// Refuses a request whose response could not be held: `n` × `max_tokens` beyond
/// [`MAX_REQUEST_OUTPUT_TOKENS`], alternatives beyond `--max-logprobs`, or log-probabilities
/// beyond [`MAX_REQUEST_LOGPROB_ENTRIES`].
fn check_output_size(state: &AppState, generation: &Generation) -> Result<(), ApiError> {
    let tokens = u64::from(generation.n) * u64::from(generation.max_tokens);
    if tokens > MAX_REQUEST_OUTPUT_TOKENS {
        return Err(ApiError::invalid_field(
            "n",
            format!(
                "n × max_tokens: {} × {} = {tokens} tokens exceeds {MAX_REQUEST_OUTPUT_TOKENS} a request; lower n \
                 or max_tokens",
                generation.n, generation.max_tokens
            ),
        ));
    }
    let Some(shape) = generation.logprobs else { return Ok(()) };
    let (field, top) = match shape {
        LogprobsShape::Chat { top } => ("top_logprobs", top),
        LogprobsShape::Completion { top } => ("logprobs", top),
    };
    if top > state.max_logprobs {
        return Err(ApiError::invalid_field(
            field,
            format!("Requested {field} of {top}, which is greater than max allowed: {}", state.max_logprobs),
        ));
    }
    let entries = tokens * (1 + u64::from(top));
    if entries > MAX_REQUEST_LOGPROB_ENTRIES {
        return Err(ApiError::invalid_field(
            field,
            format!(
                "{field}: n × max_tokens × (1 + {field}) = {entries} log-probability entries exceeds \
                 {MAX_REQUEST_LOGPROB_ENTRIES} a request; lower n, max_tokens or {field}"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn prompt_tokens(
    state: &AppState,
    prompt: PromptInput,
    generation: &Generation,
) -> Result<(Vec<u32>, Option<String>), ApiError> {
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
        PromptInput::Multimodal { text, images } => {
            (multimodal_tokens(state, &text, &images, generation.add_special_tokens)?, None)
        }
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid_field(
            "prompt",
            "prompt must not be empty (it tokenizes to no tokens)",
        ));
    }
    Ok((tokens, echo))
}

pub(crate) fn multimodal_tokens(
    state: &AppState,
    text: &str,
    images: &[(usize, String)],
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    let codec = |e: crate::tokenizer::TokenizerError| ApiError::internal(e.to_string());
    let vocab = u64::from(state.tokenizer.vocab_size().max(1));
    let mut out = Vec::new();
    let mut from = 0;
    for (i, (at, url)) in images.iter().enumerate() {
        if *at > from {
            out.extend(
                state.tokenizer.encode(&text[from..*at], add_special_tokens && i == 0).map_err(codec)?,
            );
        }
        from = *at;
        let key = xxhash_rust::xxh3::xxh3_64(url.as_bytes());
        out.extend((0..state.image_tokens as u64).map(|j| {
            let h = xxhash_rust::xxh3::xxh3_64_with_seed(&j.to_le_bytes(), key);
            (h % vocab) as u32
        }));
    }
    out.extend(state.tokenizer.encode(&text[from..], false).map_err(codec)?);
    Ok(out)
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

/// Sampler stream of the end-of-sequence draw (see [`Sampler::draw`]).
const EOS_STREAM: u64 = 6;

/// The output length drawn for one choice of a chat request that set none: where the
/// simulated model writes its end-of-sequence token, no earlier than `min_tokens`, or `None`
/// when the output runs to its limit (`ignore_eos`, no end-of-sequence configured, a
/// replayed output, or a draw at or past the room the context leaves).
fn eos_length(
    state: &AppState,
    generation: &Generation,
    sampler: &Sampler,
    plan: &RequestPlan,
) -> Option<usize> {
    if generation.max_tokens_given
        || !generation.default_to_context
        || generation.ignore_eos
        || plan.replay.is_some()
    {
        return None;
    }
    let drawn = state.output_lengths.sample(sampler.draw(EOS_STREAM, 0))?;
    let len = drawn.max(generation.stop.min_tokens);
    (len < generation.max_tokens).then_some(len as usize)
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

/// One choice's remaining outputs plus what the response and the metrics need.
struct TokenStream {
    state: Arc<AppState>,
    /// The choice's `index`.
    index: u32,
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
    /// The request's `n`.
    n: usize,
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
    /// Planned tokens (JSON, tool-call arguments), when not free text.
    plan: ChoicePlan,
    /// Thinking span and replayed tokens.
    req_plan: RequestPlan,
    /// Reasoning text not yet sent (chat with a reasoning config).
    reasoning: String,
    /// Where the latest token belonged.
    last_phase: Phase,
    /// Log-probabilities of the tokens not yet written out, when asked.
    logprobs: Option<LogprobsAcc>,
    /// Bytes of text so far (echoed prompt included): the next token's `text_offset`.
    text_len: usize,
    /// Token ids not yet written out, when the request collects them.
    ids: Option<Vec<u32>>,
}

impl TokenStream {
    /// Accounts one signal and appends the text it adds to `text`; sets `finish` when the
    /// output ended (the engine's last token, or a stop condition, which also cancels the
    /// engine request as vLLM aborts a stopped sequence, freeing its KV at once).
    /// Returns the token's id, if the signal carried one.
    fn step(&mut self, signal: &OutputSignal, text: &mut String) -> Option<u32> {
        let had_token = signal.token_id.is_some();
        if had_token {
            let gap = (signal.index > 0).then(|| signal.observed_at.saturating_duration_since(self.last_at));
            self.state.metrics.observe_token(self.rank, gap);
        }
        self.last_at = signal.observed_at;
        self.generated += usize::from(had_token);
        let mut token = None;
        if had_token {
            let pool = self.state.tokenizer.output_vocab();
            let k = signal.index as usize;
            let fixed = self.req_plan.token(k, self.state.reasoning.as_ref());
            let (id, piece, entry) = match &self.plan.planned {
                _ if fixed.is_some() => {
                    let (id, piece) = fixed.expect("checked");
                    (id, piece, None)
                }
                Some(p) if k < p.len() => {
                    let (id, piece) = p.token(signal.index as usize);
                    (id, piece, None)
                }
                _ => {
                    let i = self.sampler.token(signal.index, pool.len());
                    (pool.id(i), pool.text(i), Some(i))
                }
            };
            if let Some(acc) = &mut self.logprobs {
                acc.push(&self.sampler, pool, signal.index, piece, entry, self.text_len);
            }
            if let Some(ids) = &mut self.ids {
                ids.push(id);
            }
            self.text_len += piece.len();
            let (split, phase) = (self.req_plan.split, self.req_plan.phase(k));
            self.last_phase = phase;
            match &mut self.scan {
                None => route(split, phase, piece, text, &mut self.reasoning),
                Some(scan) => {
                    let step = scan.push(&self.rules, id, piece);
                    route(split, phase, &scan.text()[step.send], text, &mut self.reasoning);
                    if let Some(why) = step.stop {
                        self.live = None;
                        self.end(signal, Finish::stopped(why), FinishReason::Stop);
                        return Some(id);
                    }
                }
            }
            token = Some(id);
        }
        if signal.completed {
            if let Some(scan) = &mut self.scan {
                let step = scan.finish(None);
                let (split, phase) = (self.req_plan.split, self.last_phase);
                route(split, phase, &scan.text()[step.send], text, &mut self.reasoning);
            }
            // A plan written to its end, or a drawn length reached, is the model's own end of
            // output.
            let complete =
                self.plan.planned.as_ref().is_some_and(|p| self.generated >= p.len() && !p.is_cut())
                    || self.req_plan.eos_at.is_some_and(|at| self.generated >= at);
            match (complete, self.plan.tool_call.is_some()) {
                (true, true) => self.end(signal, Finish::TOOL_CALLS, FinishReason::Stop),
                (true, false) => self.end(signal, Finish::EOS, FinishReason::Stop),
                (false, _) => self.end(signal, Finish::LENGTH, FinishReason::Length),
            }
        }
        token
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
            n: self.n,
            reason,
        });
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

/// The choices of one request, read as their signals arrive.
struct Choices {
    streams: Vec<TokenStream>,
    /// Each choice's first signal, until it is taken.
    firsts: Vec<Option<OutputSignal>>,
    /// Where the next poll starts, so no choice starves the others.
    cursor: usize,
}

/// What [`Choices::next`] found.
enum Next {
    /// A signal of choice `.0`.
    Signal(usize, OutputSignal),
    /// Choice `.0`'s engine stream ended before its last token.
    CutShort(usize),
    /// Every choice has finished.
    Done,
}

impl Choices {
    fn all_done(&self) -> bool {
        self.streams.iter().all(|s| s.done)
    }

    /// A signal already delivered, if any (no waiting).
    fn try_next(&mut self) -> Option<Next> {
        if let Some(i) = self.firsts.iter().position(Option::is_some) {
            return Some(Next::Signal(i, self.firsts[i].take().expect("present")));
        }
        let n = self.streams.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            let s = &mut self.streams[i];
            if s.done {
                continue;
            }
            if let Some(signal) = s.live.as_mut().and_then(LiveRequest::try_recv) {
                self.cursor = (i + 1) % n;
                return Some(Next::Signal(i, signal));
            }
        }
        None
    }

    /// The next signal of any unfinished choice.
    async fn next(&mut self) -> Next {
        if self.all_done() {
            return Next::Done;
        }
        if let Some(next) = self.try_next() {
            return next;
        }
        let cursor = self.cursor;
        let streams = &mut self.streams;
        let n = streams.len();
        let found = std::future::poll_fn(|cx| {
            for k in 0..n {
                let i = (cursor + k) % n;
                let s = &mut streams[i];
                if s.done {
                    continue;
                }
                let Some(live) = s.live.as_mut() else { return Poll::Ready(Next::CutShort(i)) };
                // `recv` is cancel-safe: polling a fresh future each time loses nothing.
                let recv = std::pin::pin!(live.recv());
                match recv.poll(cx) {
                    Poll::Ready(Some(signal)) => return Poll::Ready(Next::Signal(i, signal)),
                    Poll::Ready(None) => return Poll::Ready(Next::CutShort(i)),
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        })
        .await;
        if let Next::Signal(i, _) = &found {
            self.cursor = (i + 1) % n;
        }
        found
    }

    fn usage(&self) -> Usage {
        let generated = self.streams.iter().map(|s| s.generated).sum();
        let first = &self.streams[0];
        Usage::new(first.prompt_tokens, generated, first.cached_tokens)
    }
}

async fn full_response(
    mut choices: Choices,
    header: ResponseHeader,
    echo: Option<String>,
    prefill: Option<(PrefillHandoff, Arc<crate::pd::PdState>, usize)>,
) -> Result<Response, ApiError> {
    let mut texts: Vec<String> = vec![echo.unwrap_or_default(); choices.streams.len()];
    loop {
        match choices.next().await {
            Next::Signal(i, s) => {
                choices.streams[i].step(&s, &mut texts[i]);
            }
            Next::CutShort(i) => return Err(choices.streams[i].cut_short()),
            Next::Done => break,
        }
    }
    let usage = choices.usage();
    let split = choices.streams.first().is_some_and(|s| s.req_plan.split);
    let reasoning: Vec<String> = if split {
        choices.streams.iter_mut().map(|s| std::mem::take(&mut s.reasoning)).collect()
    } else {
        Vec::new()
    };
    let bodies: Vec<ChoiceBody> = choices
        .streams
        .iter_mut()
        .zip(texts)
        .map(|(s, text)| ChoiceBody {
            text,
            finish: s.finish.take().expect("a finished choice has a finish"),
            logprobs: s.logprobs.take().map(|acc| acc.to_raw()),
            tool_call: s.plan.tool_call.clone(),
            token_ids: s.ids.take(),
        })
        .collect();
    drop(choices);
    if split || prefill.is_some() {
        // These rewrite the body as a JSON value: small (a one-token prefill) or rare.
        let mut body = header.body(&bodies, usage);
        if split {
            let reasoning: Vec<&str> = reasoning.iter().map(String::as_str).collect();
            body = with_reasoning(body, &reasoning);
        }
        if let Some((handoff, pd, prompt_tokens)) = prefill {
            if let Some(params) = handoff.finish(&pd, &header.id, prompt_tokens).await? {
                let mut value: serde_json::Value = serde_json::from_str(&body).expect("our own JSON");
                value["kv_transfer_params"] = params;
                body = value.to_string();
            }
        }
        return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
    }
    // The body goes out a choice at a time, each serialized only when it is sent and
    // dropped after, so a large response is never held twice. Its length is counted
    // first (serializing into a counter), so clients still get a Content-Length.
    let (head, tail) = header.body_ends(usage);
    let mut length = head.len() + tail.len() + bodies.len().saturating_sub(1);
    for (i, c) in bodies.iter().enumerate() {
        let mut counter = ByteCounter(0);
        header.write_choice(&mut counter, i, c);
        length += counter.0;
    }
    let mut pending = bodies.into_iter().enumerate();
    let mut parts = Some(head).into_iter().map(Bytes::from).chain(std::iter::from_fn(move || {
        pending.next().map(|(i, c)| {
            let mut out =
                Vec::with_capacity(c.text.len() + c.logprobs.as_ref().map_or(0, |l| l.get().len()) + 256);
            if i > 0 {
                out.push(b',');
            }
            header.write_choice(&mut out, i, &c);
            Bytes::from(out)
        })
    }));
    let mut tail = Some(Bytes::from(tail));
    let stream = futures_util::stream::iter(std::iter::from_fn(move || {
        parts.next().or_else(|| tail.take()).map(Ok::<_, std::convert::Infallible>)
    }));
    let mut response = axum::body::Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
    headers.insert(header::CONTENT_LENGTH, axum::http::HeaderValue::from(length));
    Ok(response)
}

/// An `io::Write` that only counts what is written to it.
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Most frames coalesced into one body chunk.
const MAX_FRAMES_PER_WRITE: usize = 64;

/// An SSE response in progress.
struct SseState {
    choices: Choices,
    header: ResponseHeader,
    frames: ContentFrames,
    /// The current signal's text, reused from token to token.
    text: String,
    /// The echoed prompt (completions `echo`), which leads each choice's first frame.
    echo: Option<String>,
    mode: UsageMode,
    /// A signal taken when the previous chunk was full: it opens the next chunk.
    pending: Option<Next>,
    opened: bool,
    /// Per choice: whether its first content frame was written.
    opened_text: Vec<bool>,
    finished: bool,
    /// A disaggregated prefill: its `kv_transfer_params` frame goes after the last token,
    /// once its KV is held (`closing` from then until it is written).
    prefill: Option<(PrefillHandoff, Arc<crate::pd::PdState>, usize)>,
    closing: bool,
}

impl SseState {
    /// Appends the frames of one signal of choice `i` (and the closing frames after the
    /// request's last).
    fn emit(&mut self, i: usize, s: &OutputSignal, out: &mut Vec<u8>) {
        self.text.clear();
        let first = !std::mem::replace(&mut self.opened_text[i], true);
        if first {
            if let Some(echo) = &self.echo {
                self.text.push_str(echo);
            }
        }
        let stream = &mut self.choices.streams[i];
        let _ = stream.step(s, &mut self.text);
        let usage = self.choices.usage();
        let stream = &mut self.choices.streams[i];
        let last = stream.finish.as_ref();
        let logprobs = stream.logprobs.as_ref();
        let extras = FrameExtras { logprobs, token_ids: stream.ids.as_deref() };
        match &stream.plan.tool_call {
            Some(head) => {
                let lp = logprobs.map(LogprobsAcc::to_raw);
                let head = first.then_some(head);
                self.header.tool_frame(
                    out,
                    stream.index,
                    head,
                    &self.text,
                    lp.as_deref(),
                    last,
                    self.mode,
                    usage,
                );
            }
            None if stream.req_plan.split => {
                // As vLLM's reasoning parsers stream: thinking as `reasoning_content`
                // deltas, no chunk for the markers (unless the output ends on one).
                if !stream.reasoning.is_empty() {
                    reasoning_frame(&self.header, out, stream.index, &stream.reasoning, self.mode, usage);
                }
                if stream.last_phase == Phase::Content || last.is_some() {
                    self.frames.write(out, stream.index, &self.text, last, usage, extras);
                }
                stream.reasoning.clear();
            }
            None => self.frames.write(out, stream.index, &self.text, last, usage, extras),
        }
        if let Some(acc) = &mut stream.logprobs {
            acc.clear();
        }
        if let Some(ids) = &mut stream.ids {
            ids.clear();
        }
        if self.choices.all_done() {
            if self.prefill.is_some() {
                self.closing = true;
                return;
            }
            self.close(out);
        }
    }

    /// The trailing frames: usage when asked, then `[DONE]`.
    fn close(&mut self, out: &mut Vec<u8>) {
        if self.mode.include_usage {
            self.header.usage_frame(out, self.choices.usage());
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.finished = true;
    }
}

fn frame(json: &str) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The SSE body: one frame per token and choice as its pass ends, the usage frame when
/// asked, then `[DONE]`. If the engine stops mid-stream the client gets an error frame
/// before `[DONE]`, never a silently truncated answer. Dropping the body (client gone)
/// drops the `LiveRequest`s, which cancels the requests in the engine.
fn sse_response(
    choices: Choices,
    header: ResponseHeader,
    mode: UsageMode,
    echo: Option<String>,
    prefill: Option<(PrefillHandoff, Arc<crate::pd::PdState>, usize)>,
) -> Response {
    let frames = header.content_frames(mode);
    let n = choices.streams.len();
    let init = SseState {
        choices,
        header,
        frames,
        text: String::new(),
        echo,
        mode,
        pending: None,
        opened: false,
        opened_text: vec![false; n],
        finished: false,
        prefill,
        closing: false,
    };
    let body = futures_util::stream::unfold(init, move |mut st| async move {
        if st.finished {
            return None;
        }
        let mut out = Vec::with_capacity(512);
        if !st.opened && st.header.endpoint == Endpoint::Chat {
            for i in 0..n {
                st.header.role_frame(&mut out, i as u32, st.mode, st.choices.usage());
            }
        }
        st.opened = true;
        // A reader that fell behind the engine takes every token already delivered in
        // one write: under load that is the difference between a syscall per token and
        // one per batch. Bounded so one chunk stays small.
        let mut next = match st.pending.take() {
            Some(pending) => Some(pending),
            None => Some(st.choices.next().await),
        };
        for _ in 0..MAX_FRAMES_PER_WRITE {
            match next.take() {
                None => break,
                Some(Next::Signal(i, signal)) => st.emit(i, &signal, &mut out),
                Some(Next::CutShort(i)) => {
                    let err = st.choices.streams[i].cut_short();
                    out.extend_from_slice(&frame(&err.body()));
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    st.finished = true;
                }
                Some(Next::Done) => st.finished = true,
            }
            if st.finished || st.closing {
                break;
            }
            next = st.choices.try_next();
        }
        if st.closing && !st.finished {
            let (handoff, pd, prompt_tokens) = st.prefill.take().expect("closing a prefill");
            match handoff.finish(&pd, &st.header.id, prompt_tokens).await {
                Ok(Some(params)) => st.header.kv_transfer_frame(&mut out, &params),
                Ok(None) => {}
                Err(e) => out.extend_from_slice(&frame(&e.body())),
            }
            st.close(&mut out);
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
