//! The `VllmEngine` RPCs over the engine the HTTP routes use (through [`super::shared`]):
//! `Generate` goes through [`crate::generate::start`] (tokenize, context checks, submit,
//! first token) and reads the choices token by token, so pacing, KV, prefix caching and
//! metrics are the HTTP path's.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::convert::{self, Converted};
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
use super::shared::{self, iso8601, BoxStream, Health, Output, Submit};
use crate::output::stop::StopReason;
use crate::pd::KvRole;
use crate::state::AppState;

/// vLLM's service over the shared engine.
#[derive(Debug, Clone)]
pub struct Engine(shared::Engine);

impl Engine {
    /// The service over `state`.
    pub fn new(state: Arc<AppState>) -> Self {
        Self(shared::Engine::new(state))
    }
}

/// A neutral output as vLLM's message: a chunk's `completion_tokens` counts its own tokens,
/// a complete's its `output_ids`, as vLLM's servicer fills them.
fn response(output: Output) -> GenerateResponse {
    let response = match output {
        Output::Chunk { index, token_ids, usage: (prompt_tokens, cached_tokens), .. } => {
            generate_response::Response::Chunk(GenerateStreamChunk {
                completion_tokens: token_ids.len() as u32,
                token_ids,
                prompt_tokens,
                cached_tokens,
                index,
                ..Default::default()
            })
        }
        Output::Complete(c) => generate_response::Response::Complete(GenerateComplete {
            completion_tokens: c.output_ids.len() as u32,
            output_ids: c.output_ids,
            finish_reason: c.finish_reason.to_string(),
            prompt_tokens: c.usage.0,
            cached_tokens: c.usage.1,
            index: c.index,
            matched_stop: c.matched.map(|r| match r {
                StopReason::Token(id) => MatchedStop::MatchedTokenId(id),
                StopReason::Text(s) => MatchedStop::MatchedStopStr(s),
            }),
            kv_transfer_params_json: c.kv_transfer_params_json,
            ..Default::default()
        }),
    };
    GenerateResponse { response: Some(response) }
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
        let pd = self.0.state.pd.as_ref().is_some_and(|p| !p.is_bootstrap());
        let Converted { generation, prompt, truncate } = convert::generate_request(&request, pd)?;
        let submit = Submit { generation, prompt, truncate, request_id: request.request_id };
        let stream = self.0.generate(submit, arrived).await?;
        Ok(Response::new(shared::map_stream(stream, response)))
    }

    async fn embed(&self, request: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let request = request.into_inner();
        let Some(tokenized) = request.tokenized else {
            return Err(Status::invalid_argument("tokenized: EmbedRequest requires tokenized input"));
        };
        let prompt_tokens = tokenized.input_ids.len() as u32;
        let embedding = self.0.embed(tokenized.input_ids, "tokenized.input_ids").await?;
        Ok(Response::new(EmbedResponse { embedding_dim: embedding.len() as u32, embedding, prompt_tokens }))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let (healthy, message) = match self.0.health() {
            Health::Dead => (false, "Engine is not alive"),
            Health::Starting => (false, "Engine is starting (startup_time)"),
            Health::Healthy => (true, "Health"),
        };
        Ok(Response::new(HealthCheckResponse { healthy, message: message.into() }))
    }

    async fn abort(&self, request: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        // Unknown ids are ignored, as vLLM ignores them.
        for id in &request.get_ref().request_ids {
            self.0.abort(id);
        }
        Ok(Response::new(AbortResponse {}))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        let s = &self.0.state;
        let max_len = u32::try_from(self.0.max_model_len()).unwrap_or(u32::MAX);
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
        let s = &self.0.state;
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
            active_requests: self.0.active_requests(),
            is_paused: self.0.is_sleeping(),
            last_receive_timestamp: shared::unix_seconds(now),
            uptime_seconds: now.duration_since(self.0.started).map_or(0.0, |d| d.as_secs_f64()),
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
        let loads = self
            .0
            .loads(request.dp_rank)?
            .into_iter()
            .map(|l| SchedulerLoad {
                dp_rank: l.rank,
                num_running_reqs: l.running,
                num_waiting_reqs: l.waiting,
                num_total_reqs: l.running + l.waiting,
                num_used_tokens: l.used_tokens,
                max_total_num_tokens: l.total_tokens,
                token_usage: l.usage,
                ..Default::default()
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
        Err(shared::no_tokenizer())
    }

    async fn subscribe_kv_events(
        &self,
        _: Request<SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        Err(shared::no_kv_events())
    }
}
