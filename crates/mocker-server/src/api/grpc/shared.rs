//! What vLLM's and SGLang's gRPC services share, in neither protocol's types: admission,
//! the prompt, running requests by id (for `Abort`), and a `Generate` in progress read token
//! by token from [`crate::generate::start`] into protocol-neutral [`Output`]s, which each
//! service maps to its own messages. So pacing, KV, prefix caching and metrics are the HTTP
//! path's on both.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::convert::{self, status};
use crate::faults::FailureType;
use crate::generate::{self, Event, Prepared, Started};
use crate::openai::request::{Generation, PromptInput};
use crate::openai::response::{Endpoint, Finish};
use crate::output::stop::StopReason;
use crate::pd::KvTransfer;
use crate::state::AppState;

type Running = Arc<Mutex<HashMap<String, CancellationToken>>>;

/// The shared state, and the running `Generate` requests by id (for `Abort`).
#[derive(Debug, Clone)]
pub struct Engine {
    /// The server's state.
    pub state: Arc<AppState>,
    running: Running,
    /// When the service started (uptime).
    pub started: SystemTime,
}

/// One event of a `Generate` response, in neither protocol's types.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// New tokens of one choice (streaming only).
    Chunk {
        /// The choice.
        index: u32,
        /// The tokens since the last chunk.
        token_ids: Vec<u32>,
        /// The choice's tokens so far.
        total: u32,
        /// Prompt and prefix-cached tokens.
        usage: (u32, u32),
    },
    /// One choice's end.
    Complete(Completed),
}

/// One choice's end.
#[derive(Debug, Clone, PartialEq)]
pub struct Completed {
    /// The choice.
    pub index: u32,
    /// Streaming, the last chunk's tokens again (the client accumulated the chunks), as both
    /// servicers send it; otherwise every token.
    pub output_ids: Vec<u32>,
    /// The choice's tokens in all.
    pub total: u32,
    /// `stop`, `length` or `abort`.
    pub finish_reason: &'static str,
    /// The stop token or string that ended it.
    pub matched: Option<StopReason>,
    /// Prompt and prefix-cached tokens.
    pub usage: (u32, u32),
    /// A prefill's `kv_transfer_params`, as JSON.
    pub kv_transfer_params_json: Option<String>,
}

/// A server-streaming response.
pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// What a `Generate` asks for, once converted from its protocol.
#[derive(Debug)]
pub struct Submit {
    /// The output asked for.
    pub generation: Generation,
    /// Token ids, or text the server tokenizes.
    pub prompt: PromptInput,
    /// Keep this many of the prompt's last tokens (vLLM's `truncate_prompt_tokens`).
    pub truncate: Option<i32>,
    /// The client's id (empty: one is made up), which `Abort` names.
    pub request_id: String,
}

/// The engine's health as a health-check RPC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Serving.
    Healthy,
    /// Within `startup_time`.
    Starting,
    /// An engine loop stopped.
    Dead,
}

/// One rank's load, as both protocols' `SchedulerLoad` has it.
#[derive(Debug, Clone, Copy)]
pub struct RankLoad {
    /// The data-parallel rank.
    pub rank: i32,
    /// Requests running and waiting.
    pub running: i32,
    /// Requests waiting.
    pub waiting: i32,
    /// KV tokens in use.
    pub used_tokens: i32,
    /// KV tokens in all.
    pub total_tokens: i32,
    /// `used_tokens / total_tokens`.
    pub usage: f64,
}

impl Engine {
    /// The shared part of a service over `state`.
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state, running: Arc::default(), started: SystemTime::now() }
    }

    /// What an inference RPC meets before the engine: sleep mode and injected failures, as
    /// on the HTTP inference routes.
    pub fn admit(&self) -> Result<(), Status> {
        if self.state.sleep.as_ref().is_some_and(crate::sleep::SleepMode::is_sleeping) {
            return Err(status(crate::sleep::SleepMode::sleeping_error()));
        }
        if let Some(kind) = self.state.runtime.faults().and_then(|f| f.draw()) {
            let message = format!("injected failure ({}, --failure-rate)", kind.name());
            return Err(match kind {
                FailureType::RateLimit => Status::resource_exhausted(message),
                FailureType::InvalidApiKey => Status::unauthenticated(message),
                FailureType::ContextLength | FailureType::InvalidRequest => Status::invalid_argument(message),
                FailureType::ServerError => Status::internal(message),
                FailureType::ModelNotFound => Status::not_found(message),
            });
        }
        Ok(())
    }

    /// The context window.
    pub fn max_model_len(&self) -> usize {
        self.state.max_model_len.unwrap_or(self.state.served_max_model_len)
    }

    /// The prompt's token ids: given, or the text tokenized with special tokens added, then
    /// truncated as `truncate` asks.
    fn prompt(&self, prompt: PromptInput, truncate: Option<i32>) -> Result<Vec<u32>, Status> {
        let tokens = match prompt {
            PromptInput::Text(text) => {
                self.state.tokenizer.encode(&text, true).map_err(|e| Status::internal(e.to_string()))?
            }
            PromptInput::Ids(ids) => ids,
            PromptInput::Multimodal { .. } => {
                return Err(Status::invalid_argument("mm_inputs: not simulated"))
            }
        };
        let tokens = convert::truncate(tokens, truncate, self.max_model_len())?;
        if tokens.is_empty() {
            return Err(Status::invalid_argument("text: the prompt tokenizes to no tokens"));
        }
        Ok(tokens)
    }

    /// Starts a `Generate`: admission, the prompt, the engine's first token (or an abort
    /// before it); the stream then reads the choices token by token.
    pub async fn generate(&self, submit: Submit, arrived: Instant) -> Result<BoxStream<Output>, Status> {
        let Submit { generation, prompt, truncate, request_id } = submit;
        self.admit()?;
        let tokens = self.prompt(prompt, truncate)?;
        let id = if request_id.is_empty() { uuid::Uuid::new_v4().simple().to_string() } else { request_id };
        let registration = Registration::new(&self.running, id.clone())?;
        let stream = generation.stream;
        let n = generation.n as usize;
        let prefill = generation.kv_transfer == KvTransfer::Prefill;
        let prepared = Prepared {
            endpoint: Endpoint::Completions,
            generation,
            prompt: PromptInput::Ids(tokens),
            request_id: Some(id),
            replay_key: None,
        };
        let started = tokio::select! {
            biased;
            // Aborted before its first token: the engine requests are dropped with `start`.
            _ = registration.cancel.cancelled() => None,
            s = generate::start(self.state.clone(), prepared, arrived) => Some(s.map_err(status)?),
        };
        let usage = started.as_ref().map_or((0, 0), |s| (s.prompt_tokens() as u32, s.cached_tokens() as u32));
        let mut g = Progress {
            started,
            registration,
            stream,
            hold_completes: !stream || prefill,
            usage,
            outputs: vec![(Vec::new(), 0, false); n],
            held: Vec::new(),
            queue: VecDeque::new(),
            finished: false,
        };
        if g.started.is_none() {
            g.abort();
        }
        Ok(into_stream(g))
    }

    /// Aborts the running request `id`; false when none has that id.
    pub fn abort(&self, id: &str) -> bool {
        let running = self.running.lock().expect("running requests");
        running.get(id).inspect(|cancel| cancel.cancel()).is_some()
    }

    /// The engine's health.
    pub fn health(&self) -> Health {
        let running = self.state.ranks.0.iter().all(mocker_live::LiveEngine::is_running);
        match (running, self.state.readiness.is_ready()) {
            (false, _) => Health::Dead,
            (true, false) => Health::Starting,
            (true, true) => Health::Healthy,
        }
    }

    /// Requests in the engines.
    pub fn active_requests(&self) -> u32 {
        self.state.ranks.0.iter().map(|e| e.active_request_count()).sum::<usize>() as u32
    }

    /// Whether sleep mode is on.
    pub fn is_sleeping(&self) -> bool {
        self.state.sleep.as_ref().is_some_and(crate::sleep::SleepMode::is_sleeping)
    }

    /// Each rank's load, or `dp_rank`'s alone (`INVALID_ARGUMENT` if it has no such rank).
    pub fn loads(&self, dp_rank: Option<i32>) -> Result<Vec<RankLoad>, Status> {
        let ranks = &self.state.ranks.0;
        if let Some(rank) = dp_rank.filter(|&r| r < 0 || r as usize >= ranks.len()) {
            return Err(Status::invalid_argument(format!(
                "dp_rank: {rank} is not one of this server's ranks (0..{})",
                ranks.len()
            )));
        }
        Ok(ranks
            .iter()
            .enumerate()
            .filter(|(i, _)| dp_rank.is_none_or(|r| r as usize == *i))
            .map(|(i, engine)| {
                let m = *engine.metrics().borrow();
                RankLoad {
                    rank: i as i32,
                    running: m.running_requests as i32,
                    waiting: m.waiting_requests as i32,
                    used_tokens: (m.active_blocks * self.state.block_size) as i32,
                    total_tokens: (m.total_blocks * self.state.block_size) as i32,
                    usage: m.gpu_cache_usage_perc,
                }
            })
            .collect())
    }

    /// An `Embed`: admission, the prompt's prefill in the engine, mocker's deterministic
    /// embedding of the tokens.
    pub async fn embed(&self, tokens: Vec<u32>, field: &str) -> Result<Vec<f32>, Status> {
        if tokens.is_empty() {
            return Err(Status::invalid_argument(format!("{field}: the input must not be empty")));
        }
        self.admit()?;
        crate::api::embeddings::prefill(&self.state, tokens.clone(), field).await.map_err(status)?;
        let dim = self.state.embedding_dim;
        Ok(crate::api::embeddings::embedding(&tokens, dim, dim))
    }
}

/// A running request's entry in [`Engine::running`], removed when its stream ends.
struct Registration {
    running: Running,
    id: String,
    cancel: CancellationToken,
}

impl Registration {
    fn new(running: &Running, id: String) -> Result<Self, Status> {
        let mut map = running.lock().expect("running requests");
        if map.contains_key(&id) {
            return Err(Status::invalid_argument(format!(
                "request_id: a request with id {id:?} is already running"
            )));
        }
        let cancel = CancellationToken::new();
        map.insert(id.clone(), cancel.clone());
        Ok(Self { running: running.clone(), id, cancel })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.running.lock().expect("running requests").remove(&self.id);
    }
}

/// One `Generate` response in progress.
struct Progress {
    started: Option<Started>,
    registration: Registration,
    stream: bool,
    /// Completes wait for the end of the request (non-streaming; a prefill's, which carry
    /// its `kv_transfer_params_json`).
    hold_completes: bool,
    usage: (u32, u32),
    /// Each choice's tokens not yet sent, how many it has, and whether it finished.
    outputs: Vec<(Vec<u32>, u32, bool)>,
    held: Vec<Completed>,
    queue: VecDeque<Result<Output, Status>>,
    finished: bool,
}

impl Progress {
    fn completed(&self, index: u32, output_ids: Vec<u32>, finish: &Finish) -> Completed {
        Completed {
            index,
            output_ids,
            total: self.outputs[index as usize].1,
            finish_reason: finish.reason,
            matched: finish.stop_reason.clone(),
            usage: self.usage,
            kv_transfer_params_json: None,
        }
    }

    /// Reads the next event into the queue.
    async fn advance(&mut self) {
        let Some(started) = self.started.as_mut() else {
            self.finished = true;
            return;
        };
        let event = tokio::select! {
            biased;
            _ = self.registration.cancel.cancelled() => None,
            e = started.next() => Some(e),
        };
        match event {
            None => self.abort(),
            Some(Event::Token { index, token, finish }) => {
                let i = index as usize;
                if let Some(t) = token {
                    self.outputs[i].0.push(t);
                    self.outputs[i].1 += 1;
                }
                if self.stream && (token.is_some() || finish.is_some()) {
                    self.queue.push_back(Ok(Output::Chunk {
                        index,
                        token_ids: token.into_iter().collect(),
                        total: self.outputs[i].1,
                        usage: self.usage,
                    }));
                }
                if let Some(finish) = finish {
                    self.outputs[i].2 = true;
                    let ids = if self.stream {
                        token.into_iter().collect()
                    } else {
                        std::mem::take(&mut self.outputs[i].0)
                    };
                    let c = self.completed(index, ids, &finish);
                    if self.hold_completes {
                        self.held.push(c);
                    } else {
                        self.queue.push_back(Ok(Output::Complete(c)));
                    }
                }
            }
            Some(Event::Failed(e)) => {
                self.queue.push_back(Err(status(e)));
                self.finished = true;
            }
            Some(Event::Done) => {
                let params = match started.kv_transfer_params().await {
                    Ok(p) => p.map(|v| v.to_string()),
                    Err(e) => {
                        self.queue.push_back(Err(status(e)));
                        self.finished = true;
                        return;
                    }
                };
                self.held.sort_by_key(|c| c.index);
                for mut c in std::mem::take(&mut self.held) {
                    c.kv_transfer_params_json.clone_from(&params);
                    self.queue.push_back(Ok(Output::Complete(c)));
                }
                self.finished = true;
            }
        }
    }

    /// An abort: drops the engine requests (freeing their KV; the metrics count them
    /// aborted) and ends each unfinished choice with `finish_reason: "abort"`.
    fn abort(&mut self) {
        self.started = None;
        let abort = Finish { reason: "abort", stop_reason: None };
        for i in 0..self.outputs.len() {
            if self.outputs[i].2 {
                continue;
            }
            let ids = if self.stream { Vec::new() } else { std::mem::take(&mut self.outputs[i].0) };
            let c = self.completed(i as u32, ids, &abort);
            self.held.push(c);
        }
        self.held.sort_by_key(|c| c.index);
        for c in std::mem::take(&mut self.held) {
            self.queue.push_back(Ok(Output::Complete(c)));
        }
        self.finished = true;
    }
}

fn into_stream(progress: Progress) -> BoxStream<Output> {
    Box::pin(futures_util::stream::unfold(progress, |mut g| async move {
        loop {
            if let Some(item) = g.queue.pop_front() {
                return Some((item, g));
            }
            if g.finished {
                return None;
            }
            g.advance().await;
        }
    }))
}

/// Maps a neutral stream to a protocol's messages.
pub fn map_stream<T: 'static>(
    stream: BoxStream<Output>,
    f: impl Fn(Output) -> T + Send + 'static,
) -> BoxStream<T> {
    Box::pin(stream.map(move |item| item.map(&f)))
}

/// Seconds since the Unix epoch.
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `GetTokenizer`, which neither service serves.
pub fn no_tokenizer() -> Status {
    Status::unimplemented("GetTokenizer: mocker does not serve its tokenizer files over gRPC")
}

/// `SubscribeKvEvents`, which neither service serves.
pub fn no_kv_events() -> Status {
    Status::unimplemented(
        "SubscribeKvEvents: mocker publishes KV events over ZMQ (--kv-events-endpoint), not over gRPC",
    )
}

/// `2026-01-02T03:04:05.678Z` (UTC).
pub fn iso8601(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_iso8601_utc() {
        assert_eq!(iso8601(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_767_323_045_678);
        assert_eq!(iso8601(t), "2026-01-02T03:04:05.678Z");
    }
}
