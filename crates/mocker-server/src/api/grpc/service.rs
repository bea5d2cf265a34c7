//! The `VllmEngine` RPCs over the same engine the HTTP routes use: `Generate` goes through
//! [`crate::generate::start`] (tokenize, context checks, submit, first token) and reads the
//! choices token by token, so pacing, KV, prefix caching and metrics are the HTTP path's.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::convert::{self, status, Converted};
use super::pb::generate_complete::MatchedStop;
use super::pb::smg::grpc::common::{
    GetTokenizerChunk, GetTokenizerRequest, KvEventBatch, SubscribeKvEventsRequest,
};
use super::pb::vllm_engine_server::VllmEngine;
use super::pb::{
    generate_response, AbortRequest, AbortResponse, EmbedRequest, EmbedResponse, GenerateComplete,
    GenerateRequest, GenerateResponse, GenerateStreamChunk, GetLoadsRequest, GetLoadsResponse,
    GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse,
    HealthCheckRequest, HealthCheckResponse, SchedulerLoad,
};
use crate::faults::FailureType;
use crate::generate::{self, Event, Prepared, Started};
use crate::openai::request::PromptInput;
use crate::openai::response::{Endpoint, Finish};
use crate::output::stop::StopReason;
use crate::pd::{KvRole, KvTransfer};
use crate::state::AppState;

type Running = Arc<Mutex<HashMap<String, CancellationToken>>>;

/// The service: the shared state, and the running `Generate` requests by id (for `Abort`).
#[derive(Debug, Clone)]
pub struct Engine {
    state: Arc<AppState>,
    running: Running,
    started: SystemTime,
}

impl Engine {
    /// The service over `state`.
    pub fn new(state: Arc<AppState>) -> Self {
        Self { state, running: Arc::default(), started: SystemTime::now() }
    }

    /// What an inference RPC meets before the engine: sleep mode and injected failures, as
    /// on the HTTP inference routes.
    fn admit(&self) -> Result<(), Status> {
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

    /// The prompt's token ids: given, or the text tokenized as vLLM does (special tokens
    /// added), then truncated as `truncate_prompt_tokens` asks.
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
        let max_len = self.state.max_model_len.unwrap_or(self.state.served_max_model_len);
        let tokens = convert::truncate(tokens, truncate, max_len)?;
        if tokens.is_empty() {
            return Err(Status::invalid_argument("text: the prompt tokenizes to no tokens"));
        }
        Ok(tokens)
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
struct Generation {
    started: Option<Started>,
    registration: Registration,
    stream: bool,
    /// Completes wait for the end of the request (non-streaming; a prefill's, which carry
    /// its `kv_transfer_params_json`).
    hold_completes: bool,
    prompt_tokens: u32,
    cached_tokens: u32,
    /// Each choice's tokens so far, and whether it finished.
    outputs: Vec<(Vec<u32>, bool)>,
    held: Vec<GenerateComplete>,
    queue: VecDeque<Result<GenerateResponse, Status>>,
    finished: bool,
}

fn chunk(c: GenerateStreamChunk) -> GenerateResponse {
    GenerateResponse { response: Some(generate_response::Response::Chunk(c)) }
}

fn complete(c: GenerateComplete) -> GenerateResponse {
    GenerateResponse { response: Some(generate_response::Response::Complete(c)) }
}

impl Generation {
    fn complete_of(&self, index: u32, output_ids: Vec<u32>, finish: &Finish) -> GenerateComplete {
        GenerateComplete {
            completion_tokens: output_ids.len() as u32,
            output_ids,
            finish_reason: finish.reason.to_string(),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            index,
            matched_stop: finish.stop_reason.as_ref().map(|r| match r {
                StopReason::Token(id) => MatchedStop::MatchedTokenId(*id),
                StopReason::Text(s) => MatchedStop::MatchedStopStr(s.clone()),
            }),
            ..Default::default()
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
                }
                if self.stream && (token.is_some() || finish.is_some()) {
                    let token_ids: Vec<u32> = token.into_iter().collect();
                    self.queue.push_back(Ok(chunk(GenerateStreamChunk {
                        completion_tokens: token_ids.len() as u32,
                        token_ids,
                        prompt_tokens: self.prompt_tokens,
                        cached_tokens: self.cached_tokens,
                        index,
                        ..Default::default()
                    })));
                }
                if let Some(finish) = finish {
                    self.outputs[i].1 = true;
                    // Streaming, the complete repeats the last delta (the client accumulated
                    // the chunks), as vLLM's servicer sends it; otherwise it has every token.
                    let ids = if self.stream {
                        token.into_iter().collect()
                    } else {
                        std::mem::take(&mut self.outputs[i].0)
                    };
                    let c = self.complete_of(index, ids, &finish);
                    if self.hold_completes {
                        self.held.push(c);
                    } else {
                        self.queue.push_back(Ok(complete(c)));
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
                    self.queue.push_back(Ok(complete(c)));
                }
                self.finished = true;
            }
        }
    }

    /// `Abort`: drops the engine requests (freeing their KV; the metrics count them
    /// aborted) and ends each unfinished choice with `finish_reason: "abort"`.
    fn abort(&mut self) {
        self.started = None;
        let abort = Finish { reason: "abort", stop_reason: None };
        for i in 0..self.outputs.len() {
            if self.outputs[i].1 {
                continue;
            }
            let ids = if self.stream { Vec::new() } else { std::mem::take(&mut self.outputs[i].0) };
            let c = self.complete_of(i as u32, ids, &abort);
            self.held.push(c);
        }
        self.held.sort_by_key(|c| c.index);
        for c in std::mem::take(&mut self.held) {
            self.queue.push_back(Ok(complete(c)));
        }
        self.finished = true;
    }
}

/// A server-streaming response.
pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn into_stream(generation: Generation) -> BoxStream<GenerateResponse> {
    Box::pin(futures_util::stream::unfold(generation, |mut g| async move {
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

#[tonic::async_trait]
impl VllmEngine for Engine {
    type GenerateStream = BoxStream<GenerateResponse>;
    type GetTokenizerStream = BoxStream<GetTokenizerChunk>;
    type SubscribeKvEventsStream = BoxStream<KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        let request = request.into_inner();
        let Converted { generation, prompt, truncate } =
            convert::generate_request(&request, self.state.pd.as_ref().is_some_and(|p| !p.is_bootstrap()))?;
        self.admit()?;
        let tokens = self.prompt(prompt, truncate)?;
        let id = if request.request_id.is_empty() {
            uuid::Uuid::new_v4().simple().to_string()
        } else {
            request.request_id.clone()
        };
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
        let (prompt_tokens, cached_tokens) =
            started.as_ref().map_or((0, 0), |s| (s.prompt_tokens() as u32, s.cached_tokens() as u32));
        let mut g = Generation {
            started,
            registration,
            stream,
            hold_completes: !stream || prefill,
            prompt_tokens,
            cached_tokens,
            outputs: vec![(Vec::new(), false); n],
            held: Vec::new(),
            queue: VecDeque::new(),
            finished: false,
        };
        if g.started.is_none() {
            g.abort();
        }
        Ok(Response::new(into_stream(g)))
    }

    async fn embed(&self, request: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let request = request.into_inner();
        let Some(tokenized) = request.tokenized else {
            return Err(Status::invalid_argument("tokenized: EmbedRequest requires tokenized input"));
        };
        if tokenized.input_ids.is_empty() {
            return Err(Status::invalid_argument("tokenized.input_ids: the input must not be empty"));
        }
        self.admit()?;
        let tokens = tokenized.input_ids;
        crate::api::embeddings::prefill(&self.state, tokens.clone(), "tokenized.input_ids")
            .await
            .map_err(status)?;
        let dim = self.state.embedding_dim;
        let embedding = crate::api::embeddings::embedding(&tokens, dim, dim);
        Ok(Response::new(EmbedResponse {
            embedding_dim: embedding.len() as u32,
            embedding,
            prompt_tokens: tokens.len() as u32,
        }))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let running = self.state.ranks.0.iter().all(mocker_live::LiveEngine::is_running);
        let (healthy, message) = match (running, self.state.readiness.is_ready()) {
            (false, _) => (false, "Engine is not alive"),
            (true, false) => (false, "Engine is starting (startup_time)"),
            (true, true) => (true, "Health"),
        };
        Ok(Response::new(HealthCheckResponse { healthy, message: message.into() }))
    }

    async fn abort(&self, request: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        let running = self.running.lock().expect("running requests");
        // Unknown ids are ignored, as vLLM ignores them.
        for id in &request.get_ref().request_ids {
            if let Some(cancel) = running.get(id) {
                cancel.cancel();
            }
        }
        Ok(Response::new(AbortResponse {}))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        let s = &self.state;
        let max_len = s.max_model_len.unwrap_or(s.served_max_model_len);
        let max_len = u32::try_from(max_len).unwrap_or(u32::MAX);
        Ok(Response::new(GetModelInfoResponse {
            // The model the engine is timed as (engine-args `model`), as vLLM's model path;
            // so each worker of a mixed fleet says what it is.
            model_path: s.engine_card.model.clone().unwrap_or_else(|| s.model_name.clone()),
            is_generation: true,
            max_context_length: max_len,
            vocab_size: s.tokenizer.vocab_size(),
            supports_vision: false,
            served_model_name: s.model_name.clone(),
            max_req_input_len: i32::try_from(max_len).unwrap_or(i32::MAX),
            ..Default::default()
        }))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let now = SystemTime::now();
        let s = &self.state;
        let (connector, role, engine_id) = match &s.pd {
            Some(pd) if !pd.is_bootstrap() => {
                let role = match pd.role() {
                    KvRole::Both => "kv_both",
                    KvRole::Producer => "kv_producer",
                    KvRole::Consumer => "kv_consumer",
                };
                ("NixlConnector", role, pd.engine_id().to_string())
            }
            _ => ("", "", String::new()),
        };
        Ok(Response::new(GetServerInfoResponse {
            active_requests: s.ranks.0.iter().map(|e| e.active_request_count()).sum::<usize>() as u32,
            is_paused: s.sleep.as_ref().is_some_and(crate::sleep::SleepMode::is_sleeping),
            last_receive_timestamp: now.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            uptime_seconds: now.duration_since(self.started).map_or(0.0, |d| d.as_secs_f64()),
            server_type: "vllm-grpc".into(),
            kv_connector: connector.into(),
            kv_role: role.into(),
            kv_engine_id: engine_id,
            data_parallel_size: s.ranks.0.len() as i32,
            shm_namespace_id: String::new(),
        }))
    }

    async fn get_loads(
        &self,
        request: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        let request = request.into_inner();
        if let Some(section) = request.include.iter().find(|s| s.as_str() != "core") {
            return Err(Status::invalid_argument(format!(
                "include: section {section:?} is not reported (only \"core\")"
            )));
        }
        let ranks = &self.state.ranks.0;
        if let Some(rank) = request.dp_rank.filter(|&r| r < 0 || r as usize >= ranks.len()) {
            return Err(Status::invalid_argument(format!(
                "dp_rank: {rank} is not one of this server's ranks (0..{})",
                ranks.len()
            )));
        }
        let loads = ranks
            .iter()
            .enumerate()
            .filter(|(i, _)| request.dp_rank.is_none_or(|r| r as usize == *i))
            .map(|(i, engine)| {
                let m = *engine.metrics().borrow();
                SchedulerLoad {
                    dp_rank: i as i32,
                    num_running_reqs: m.running_requests as i32,
                    num_waiting_reqs: m.waiting_requests as i32,
                    num_total_reqs: (m.running_requests + m.waiting_requests) as i32,
                    num_used_tokens: (m.active_blocks * self.state.block_size) as i32,
                    max_total_num_tokens: (m.total_blocks * self.state.block_size) as i32,
                    token_usage: m.gpu_cache_usage_perc,
                    ..Default::default()
                }
            })
            .collect::<Vec<_>>();
        Ok(Response::new(GetLoadsResponse {
            timestamp: iso8601(SystemTime::now()),
            version: env!("CARGO_PKG_VERSION").into(),
            dp_rank_count: loads.len() as i32,
            loads,
        }))
    }

    async fn get_tokenizer(
        &self,
        _: Request<GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        Err(Status::unimplemented("GetTokenizer: mocker does not serve its tokenizer files over gRPC"))
    }

    async fn subscribe_kv_events(
        &self,
        _: Request<SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        Err(Status::unimplemented(
            "SubscribeKvEvents: mocker publishes KV events over ZMQ (--kv-events-endpoint), not over gRPC",
        ))
    }
}

/// `2026-01-02T03:04:05.678Z` (UTC).
fn iso8601(t: SystemTime) -> String {
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
