//! SGLang's scheduler service, `sglang.grpc.scheduler.SglangScheduler` (SMG's protocol, see
//! `proto/SOURCE.md`), over the same engine as vLLM's ([`super::shared`]). Replies follow
//! SMG's SGLang servicer: stream chunks carry cumulative `completion_tokens`, each response
//! names its `request_id`, `Abort` says whether the id was running.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::pb::sglang::grpc::scheduler::generate_complete::MatchedStop;
use super::pb::sglang::grpc::scheduler::sglang_scheduler_server::SglangScheduler;
use super::pb::sglang::grpc::scheduler::{
    generate_response, AbortRequest, AbortResponse, AggregateMetrics, EmbedRequest, EmbedResponse,
    GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk, GetLoadsRequest,
    GetLoadsResponse, GetModelInfoRequest, GetModelInfoResponse, GetServerInfoRequest, GetServerInfoResponse,
    HealthCheckRequest, HealthCheckResponse, ListLoadedLoRaAdaptersRequest, ListLoadedLoRaAdaptersResponse,
    LoadLoRaAdapterRequest, LoadLoRaAdapterResponse, QueueMetrics, SchedulerLoad, UnloadLoRaAdapterRequest,
    UnloadLoRaAdapterResponse,
};
use super::pb::smg::grpc::common::{
    FlushCacheRequest, FlushCacheResponse, GetTokenizerChunk, GetTokenizerRequest, KvEventBatch,
    ProfileResponse, StartProfileRequest, StopProfileRequest, SubscribeKvEventsRequest,
};
use super::sglang_convert;
use super::shared::{self, iso8601, BoxStream, Health, Output, Submit};
use crate::output::stop::StopReason;
use crate::state::AppState;

/// SGLang's service over the shared engine.
#[derive(Debug, Clone)]
pub struct Scheduler(shared::Engine);

impl Scheduler {
    /// The service over `state`.
    pub fn new(state: Arc<AppState>) -> Self {
        Self(shared::Engine::new(state))
    }
}

/// A neutral output as SGLang's message.
fn response(request_id: &str, output: Output) -> GenerateResponse {
    let response = match output {
        Output::Chunk { index, token_ids, total, usage: (prompt_tokens, cached_tokens) } => {
            generate_response::Response::Chunk(GenerateStreamChunk {
                token_ids,
                prompt_tokens,
                completion_tokens: total,
                cached_tokens,
                index,
                ..Default::default()
            })
        }
        Output::Complete(c) => generate_response::Response::Complete(GenerateComplete {
            output_ids: c.output_ids,
            finish_reason: c.finish_reason.to_string(),
            prompt_tokens: c.usage.0,
            completion_tokens: c.total,
            cached_tokens: c.usage.1,
            index: c.index,
            matched_stop: c.matched.map(|r| match r {
                StopReason::Token(id) => MatchedStop::MatchedTokenId(id),
                StopReason::Text(s) => MatchedStop::MatchedStopStr(s),
            }),
            ..Default::default()
        }),
    };
    GenerateResponse { request_id: request_id.to_string(), response: Some(response) }
}

fn not_simulated(what: &str) -> Status {
    Status::unimplemented(format!("{what}: not simulated by mocker"))
}

#[tonic::async_trait]
impl SglangScheduler for Scheduler {
    type GenerateStream = BoxStream<GenerateResponse>;
    type GetTokenizerStream = BoxStream<GetTokenizerChunk>;
    type SubscribeKvEventsStream = BoxStream<KvEventBatch>;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        let request = request.into_inner();
        let (generation, prompt) = sglang_convert::generate_request(&request)?;
        let id = if request.request_id.is_empty() {
            format!("grpc-{}", uuid::Uuid::new_v4().simple())
        } else {
            request.request_id
        };
        let submit = Submit { generation, prompt, truncate: None, request_id: id.clone() };
        let stream = self.0.generate(submit, arrived).await?;
        Ok(Response::new(shared::map_stream(stream, move |o| response(&id, o))))
    }

    async fn embed(&self, request: Request<EmbedRequest>) -> Result<Response<EmbedResponse>, Status> {
        let ids = sglang_convert::embed_request(request.get_ref())?;
        let prompt_tokens = ids.len() as u32;
        let embedding = self.0.embed(ids, "tokenized.input_ids").await?;
        Ok(Response::new(EmbedResponse { embedding_dim: embedding.len() as u32, embedding, prompt_tokens }))
    }

    async fn health_check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let (healthy, message) = match self.0.health() {
            Health::Dead => (false, "Scheduler is not alive"),
            Health::Starting => (false, "Scheduler is starting (startup_time)"),
            Health::Healthy => (true, "Health check passed"),
        };
        Ok(Response::new(HealthCheckResponse { healthy, message: message.into() }))
    }

    async fn abort(&self, request: Request<AbortRequest>) -> Result<Response<AbortResponse>, Status> {
        // `reason` is only logged by SGLang's servicer.
        let id = &request.get_ref().request_id;
        let success = self.0.abort(id);
        let message = format!("Request {id} {}", if success { "aborted" } else { "not found" });
        Ok(Response::new(AbortResponse { success, message }))
    }

    async fn get_model_info(
        &self,
        _: Request<GetModelInfoRequest>,
    ) -> Result<Response<GetModelInfoResponse>, Status> {
        let s = &self.0.state;
        let max_len = i32::try_from(self.0.max_model_len()).unwrap_or(i32::MAX);
        Ok(Response::new(GetModelInfoResponse {
            // The model the engine is timed as, as SGLang's model path (see vLLM's service).
            model_path: s.engine_card.model.clone().unwrap_or_else(|| s.model_name.clone()),
            is_generation: true,
            served_model_name: s.model_name.clone(),
            max_context_length: max_len,
            vocab_size: i32::try_from(s.tokenizer.vocab_size()).unwrap_or(i32::MAX),
            supports_vision: false,
            // SGLang leaves one position for the first output token.
            max_req_input_len: max_len.saturating_sub(1),
            ..Default::default()
        }))
    }

    async fn get_server_info(
        &self,
        _: Request<GetServerInfoRequest>,
    ) -> Result<Response<GetServerInfoResponse>, Status> {
        let now = SystemTime::now();
        let s = &self.0.state;
        let total_tokens = self.0.loads(None)?.first().map_or(0, |l| l.total_tokens);
        let started = self.0.started.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let args = serde_json::json!({
            "model_path": s.engine_card.model.clone().unwrap_or_else(|| s.model_name.clone()),
            "served_model_name": s.model_name,
            "context_length": self.0.max_model_len(),
            "dp_size": s.ranks.0.len(),
            "page_size": s.block_size,
        });
        let info = serde_json::json!({ "max_total_num_tokens": total_tokens, "is_generation": true });
        Ok(Response::new(GetServerInfoResponse {
            server_args: Some(to_struct(args)),
            scheduler_info: Some(to_struct(info)),
            active_requests: i32::try_from(self.0.active_requests()).unwrap_or(i32::MAX),
            is_paused: self.0.is_sleeping(),
            last_receive_timestamp: shared::unix_seconds(now),
            uptime_seconds: now.duration_since(self.0.started).map_or(0.0, |d| d.as_secs_f64()),
            sglang_version: env!("CARGO_PKG_VERSION").into(),
            server_type: "grpc".into(),
            start_time: Some(prost_types::Timestamp { seconds: started.as_secs() as i64, nanos: 0 }),
            max_total_num_tokens: total_tokens,
        }))
    }

    async fn get_loads(
        &self,
        request: Request<GetLoadsRequest>,
    ) -> Result<Response<GetLoadsResponse>, Status> {
        let request = request.into_inner();
        // SGLang's sections; mocker has numbers for `core` and `queues` (empty = all).
        let queues =
            request.include.is_empty() || request.include.iter().any(|s| s == "all" || s == "queues");
        if let Some(section) =
            request.include.iter().find(|s| !matches!(s.as_str(), "core" | "queues" | "all"))
        {
            return Err(Status::invalid_argument(format!(
                "include: section {section:?} is not simulated (core, queues and all are)"
            )));
        }
        let loads = self.0.loads(request.dp_rank)?;
        let count = loads.len().max(1) as f64;
        let aggregate = AggregateMetrics {
            total_running_reqs: loads.iter().map(|l| l.running).sum(),
            total_waiting_reqs: loads.iter().map(|l| l.waiting).sum(),
            total_reqs: loads.iter().map(|l| l.running + l.waiting).sum(),
            avg_token_usage: loads.iter().map(|l| l.usage).sum::<f64>() / count,
            ..Default::default()
        };
        let loads = loads
            .into_iter()
            .map(|l| SchedulerLoad {
                dp_rank: l.rank,
                num_running_reqs: l.running,
                num_waiting_reqs: l.waiting,
                num_total_reqs: l.running + l.waiting,
                num_used_tokens: l.used_tokens,
                max_total_num_tokens: l.total_tokens,
                token_usage: l.usage,
                queues: queues.then_some(QueueMetrics { waiting: l.waiting, ..Default::default() }),
                ..Default::default()
            })
            .collect::<Vec<_>>();
        Ok(Response::new(GetLoadsResponse {
            timestamp: iso8601(SystemTime::now()),
            version: env!("CARGO_PKG_VERSION").into(),
            dp_rank_count: loads.len() as i32,
            loads,
            aggregate: Some(aggregate),
        }))
    }

    async fn flush_cache(
        &self,
        _: Request<FlushCacheRequest>,
    ) -> Result<Response<FlushCacheResponse>, Status> {
        Err(not_simulated("FlushCache"))
    }

    async fn start_profile(
        &self,
        _: Request<StartProfileRequest>,
    ) -> Result<Response<ProfileResponse>, Status> {
        Err(not_simulated("StartProfile"))
    }

    async fn stop_profile(
        &self,
        _: Request<StopProfileRequest>,
    ) -> Result<Response<ProfileResponse>, Status> {
        Err(not_simulated("StopProfile"))
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

    async fn load_lo_ra_adapter(
        &self,
        _: Request<LoadLoRaAdapterRequest>,
    ) -> Result<Response<LoadLoRaAdapterResponse>, Status> {
        Err(not_simulated("LoadLoRAAdapter (LoRA is not simulated on the sglang backend)"))
    }

    async fn unload_lo_ra_adapter(
        &self,
        _: Request<UnloadLoRaAdapterRequest>,
    ) -> Result<Response<UnloadLoRaAdapterResponse>, Status> {
        Err(not_simulated("UnloadLoRAAdapter (LoRA is not simulated on the sglang backend)"))
    }

    async fn list_loaded_lo_ra_adapters(
        &self,
        _: Request<ListLoadedLoRaAdaptersRequest>,
    ) -> Result<Response<ListLoadedLoRaAdaptersResponse>, Status> {
        // None loaded: the sglang backend runs no adapters.
        Ok(Response::new(ListLoadedLoRaAdaptersResponse::default()))
    }
}

/// A JSON object as a protobuf `Struct`.
fn to_struct(value: serde_json::Value) -> prost_types::Struct {
    use prost_types::value::Kind;
    fn convert(v: serde_json::Value) -> prost_types::Value {
        let kind = match v {
            serde_json::Value::Null => Kind::NullValue(0),
            serde_json::Value::Bool(b) => Kind::BoolValue(b),
            serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
            serde_json::Value::String(s) => Kind::StringValue(s),
            serde_json::Value::Array(a) => {
                Kind::ListValue(prost_types::ListValue { values: a.into_iter().map(convert).collect() })
            }
            serde_json::Value::Object(o) => Kind::StructValue(to_struct(serde_json::Value::Object(o))),
        };
        prost_types::Value { kind: Some(kind) }
    }
    match value {
        serde_json::Value::Object(o) => {
            prost_types::Struct { fields: o.into_iter().map(|(k, v)| (k, convert(v))).collect() }
        }
        _ => prost_types::Struct::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::grpc::shared::Completed;

    #[test]
    fn chunks_count_cumulatively_and_every_response_names_its_request() {
        let chunk = response("r1", Output::Chunk { index: 1, token_ids: vec![7], total: 5, usage: (64, 48) });
        assert_eq!(chunk.request_id, "r1");
        let Some(generate_response::Response::Chunk(c)) = chunk.response else { panic!("{chunk:?}") };
        assert_eq!(
            (c.token_ids, c.completion_tokens, c.prompt_tokens, c.cached_tokens, c.index),
            (vec![7], 5, 64, 48, 1)
        );
        let done = response(
            "r1",
            Output::Complete(Completed {
                index: 0,
                output_ids: vec![9],
                total: 12,
                finish_reason: "stop",
                matched: Some(StopReason::Text("end".into())),
                usage: (3, 0),
                kv_transfer_params_json: None,
            }),
        );
        let Some(generate_response::Response::Complete(c)) = done.response else { panic!("{done:?}") };
        assert_eq!((c.output_ids, c.completion_tokens, c.finish_reason.as_str()), (vec![9], 12, "stop"));
        assert_eq!(c.matched_stop, Some(MatchedStop::MatchedStopStr("end".into())));
    }

    #[test]
    fn json_objects_become_structs() {
        let s = to_struct(serde_json::json!({"a": 1, "b": [true, null], "c": {"d": "e"}}));
        assert_eq!(s.fields.len(), 3);
        assert_eq!(s.fields["a"].kind, Some(prost_types::value::Kind::NumberValue(1.0)));
        assert!(matches!(s.fields["c"].kind, Some(prost_types::value::Kind::StructValue(_))));
    }
}
