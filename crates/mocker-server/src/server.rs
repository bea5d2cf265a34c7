//! Starting and stopping one server: engine ranks, listener, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use mocker_core::config::{Backend, LaunchConfig};
use mocker_kv_events::{KvEventPublisher, PublisherOptions};
use mocker_live::{LiveEngine, LiveOptions, OutputBuffering};
use tokio::net::TcpListener;

use crate::api::grpc::Grpc;
use crate::app::{dispatch, router};
use crate::auth::ApiKey;
use crate::conn::{accept_loop, ConnLimits, Connections, ALPN};
use crate::engine_card::EngineCard;
use crate::faults::FailureInjectionOptions;
use crate::lora::{LoraOptions, LoraRegistry};
use crate::metrics::{MetricFlavor, MetricsOptions, ServerMetrics};
use crate::pd::{KvRole, PdOptions, PdServer, PdState};
use crate::plan::{Reasoning, ReplayTable};
use crate::prefix::PromptHasher;
use crate::readiness::Readiness;
use crate::runtime::{RuntimeConfig, RuntimeSettings};
use crate::sleep::SleepMode;
use crate::state::{AppState, Ranks};
use crate::tls::{Tls, TlsOptions};
use crate::tokenizer::Tokenizer;

/// Everything one server needs.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Address to bind (`--host`, `--port`; port 0 picks a free one).
    pub addr: SocketAddr,
    /// Name served as the model (`--model-name`).
    pub model_name: String,
    /// Engine configuration; its `dp_size` ranks share one scheduler.
    pub launch: LaunchConfig,
    /// Prompt tokenizer.
    pub tokenizer: Tokenizer,
    /// Bearer token required on `/v1/*` and on state-changing routes (see [`crate::auth`]);
    /// must not be empty.
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// How long in-flight streams may run on after a shutdown signal. Then the engine is
    /// stopped (open streams end with an error event) and, a moment later, every
    /// connection still open is closed: the grace period bounds the whole shutdown.
    pub shutdown_grace: Duration,
    /// A connection is closed when a request's head (request line and headers) is not
    /// complete this long after the connection opened or its previous response ended; so
    /// this is also the idle keep-alive timeout.
    pub header_timeout: Duration,
    /// A request whose body has not fully arrived this long after its head is answered 408.
    pub body_timeout: Duration,
    /// Most open connections; beyond them a new connection is answered 503 and closed.
    pub max_connections: usize,
    /// Output tokens buffered per stream for a client that reads slower than the engine
    /// generates; when a stream's buffer is full the request is cancelled (its KV freed)
    /// and counted in `mocker:stream_overflow_cancellations_total`. Bounds the memory a
    /// client that never reads can hold: about 100 bytes per token per stream.
    pub stream_buffer_tokens: NonZeroUsize,
    /// Publish KV events over ZMQ (vLLM's wire format), one PUB socket per DP rank.
    pub kv_events: Option<KvEventsOptions>,
    /// Errors injected into inference requests (off by default).
    pub failure_injection: FailureInjectionOptions,
    /// Prompt tokens per image in chat content (`--image-tokens`, default
    /// [`DEFAULT_IMAGE_TOKENS`]).
    pub image_tokens: usize,
    /// Serve vLLM's sleep-mode routes (`--enable-sleep-mode`; 404 without it).
    pub enable_sleep_mode: bool,
    /// Length of `/v1/embeddings` vectors (`--embedding-dim`); at least 1.
    pub embedding_dim: usize,
    /// Most log-probability alternatives a request may ask for (vLLM's `--max-logprobs`,
    /// default 20, at most [`crate::output::sampler::MAX_TOP_LOGPROBS`]).
    pub max_logprobs: u32,
    /// Serve LoRA adapters (`--enable-lora`); vLLM and TRT-LLM backends only.
    pub lora: Option<LoraOptions>,
    /// Take part in disaggregated prefill/decode (`--kv-transfer-config`); vLLM backend.
    pub pd: Option<PdOptions>,
    /// Serve over TLS (`--ssl-certfile` and the other `--ssl-*` flags): the serve port,
    /// the bootstrap port, and this server's side-channel reads (over https).
    pub tls: Option<TlsOptions>,
    /// Also serve the gRPC services on this port of the same host (`--grpc-port`; 0 picks
    /// a free one). They are served on the HTTP port in any case (HTTP/2 requests with a
    /// gRPC content type); vLLM backend.
    pub grpc_port: Option<u16>,
}

/// Tokens per image by default: Qwen2-VL's count for a 448×448 image, one token per
/// 28×28-pixel patch after its 2×2 merge, (448 / 28)² = 256.
pub const DEFAULT_IMAGE_TOKENS: usize = 256;

/// Where KV events go: rank `r` binds the endpoints' ports + `r` (port 0 picks free ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsOptions {
    /// PUB endpoint, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// ROUTER endpoint answering replay requests, if any.
    pub replay_endpoint: Option<String>,
    /// Whether `BlockStored` events carry their blocks' token ids (`emit_kv_token_ids`);
    /// without them `token_ids` is an empty list.
    pub token_ids: bool,
}

/// The endpoints one rank's publisher bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundKvEvents {
    /// DP rank.
    pub dp_rank: u32,
    /// PUB endpoint as bound.
    pub endpoint: String,
    /// ROUTER endpoint as bound.
    pub replay_endpoint: Option<String>,
}

impl ServerOptions {
    /// Options with the defaults of `mocker serve` for `engine` on `addr`.
    pub fn new(addr: SocketAddr, launch: LaunchConfig) -> Self {
        Self {
            addr,
            model_name: "mocker".to_string(),
            launch,
            tokenizer: Tokenizer::Builtin,
            api_key: None,
            max_body_bytes: 32 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(30),
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
            stream_buffer_tokens: NonZeroUsize::new(8192).expect("8192 > 0"),
            kv_events: None,
            failure_injection: FailureInjectionOptions::default(),
            image_tokens: DEFAULT_IMAGE_TOKENS,
            enable_sleep_mode: false,
            embedding_dim: 1024,
            max_logprobs: crate::output::sampler::MAX_TOP_LOGPROBS,
            lora: None,
            pd: None,
            tls: None,
            grpc_port: None,
        }
    }
}

/// Why a server could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The engine could not start or failed.
    #[error(transparent)]
    Engine(#[from] mocker_live::LiveError),
    /// Serving failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
    /// A KV-event publisher could not start.
    #[error("--kv-events-endpoint: {0}")]
    KvEvents(#[from] mocker_kv_events::PublishError),
    /// An option is out of range (the message names it).
    #[error("{0}")]
    Options(String),
    /// Shutdown did not complete in order (what was left is named).
    #[error("shutdown: {0}")]
    Shutdown(String),
}

/// A server that is bound and ready: its address is known before it serves.
pub struct BoundServer {
    listener: TcpListener,
    /// `--grpc-port`'s listener.
    grpc_listener: Option<TcpListener>,
    /// The gRPC service this backend serves.
    grpc_served: Option<crate::api::grpc::Service>,
    state: Arc<AppState>,
    grace: Duration,
    limits: ConnLimits,
    kv_events: Vec<BoundKvEvents>,
    /// An SGLang prefill server's bootstrap port (its rooms' read endpoint).
    bootstrap: Option<TcpListener>,
    /// TLS on every port, when configured.
    tls: Option<Tls>,
}

/// After the grace period: how long the engine may take to stop, and how long connections
/// then get to write their streams' closing error events before they are closed.
const ENGINE_STOP_TIME: Duration = Duration::from_millis(500);
const FINAL_FLUSH_TIME: Duration = Duration::from_millis(200);

impl BoundServer {
    /// Starts the engine ranks and binds the listener.
    pub async fn bind(options: ServerOptions, ranks_options: Vec<LiveOptions>) -> Result<Self, ServerError> {
        let ServerOptions {
            addr,
            model_name,
            launch,
            tokenizer,
            api_key,
            max_body_bytes,
            shutdown_grace,
            header_timeout,
            body_timeout,
            max_connections,
            stream_buffer_tokens,
            kv_events,
            failure_injection,
            image_tokens,
            enable_sleep_mode,
            embedding_dim,
            max_logprobs,
            lora,
            pd,
            tls,
            grpc_port,
        } = options;
        if grpc_port.is_some() && launch.engine.backend == Backend::Trtllm {
            return Err(ServerError::Options(format!(
                "--grpc-port: gRPC services are simulated on the vllm and sglang backends only, not on {:?}",
                launch.engine.backend
            )));
        }
        match (&pd, launch.engine.backend) {
            (Some(o), Backend::Sglang) if o.bootstrap.is_none() => return Err(ServerError::Options(
                "--kv-transfer-config: vLLM's KV-transfer contract is simulated on the vllm backend; the \
                     sglang backend speaks SGLang's bootstrap protocol (engine-args worker_type)"
                    .into(),
            )),
            (Some(o), Backend::Vllm) if o.bootstrap.is_some() => {
                return Err(ServerError::Options(
                    "SGLang's bootstrap protocol is simulated on the sglang backend only".into(),
                ))
            }
            (Some(_), Backend::Trtllm) => {
                return Err(ServerError::Options(
                    "disaggregated serving is simulated on the vllm and sglang backends, not trtllm".into(),
                ))
            }
            _ => {}
        }
        if embedding_dim == 0 {
            return Err(ServerError::Options("--embedding-dim: must be at least 1, got 0".into()));
        }
        let most = crate::output::sampler::MAX_TOP_LOGPROBS;
        if max_logprobs > most {
            return Err(ServerError::Options(format!(
                "--max-logprobs: at most {most} (the alternatives mocker's sampler ranks), got {max_logprobs}"
            )));
        }
        let api_key_plain = api_key.clone();
        let api_key = match api_key.as_deref() {
            None => None,
            Some(key) => Some(
                ApiKey::new(key)
                    .ok_or_else(|| ServerError::Options("--api-key: must not be empty".into()))?,
            ),
        };
        if max_connections == 0 {
            return Err(ServerError::Options("--max-connections: must be at least 1, got 0".into()));
        }
        let replay = match &launch.dynamo.response_replay_trace_path {
            Some(path) => Some(ReplayTable::from_path(path).map_err(|e| {
                ServerError::Options(format!("engine-args dynamo.response_replay_trace_path: {e}"))
            })?),
            None => None,
        };
        let reasoning = launch.dynamo.reasoning.as_ref().map(|r| Reasoning::new(r, &tokenizer));
        let lora = match &lora {
            None => None,
            Some(_) if launch.engine.backend == Backend::Sglang => {
                return Err(ServerError::Options(
                    "--enable-lora: LoRA adapters are simulated on the vllm and trtllm backends only".into(),
                ))
            }
            Some(_) if launch.engine.native_host_offload.is_some() => {
                return Err(ServerError::Options(
                    "--enable-lora: LoRA adapters cannot be combined with engine-args native_host_offload"
                        .into(),
                ))
            }
            Some(o) => Some(LoraRegistry::new(o, &model_name).map_err(ServerError::Options)?),
        };
        let max_loras = lora.as_ref().map_or(0, LoraRegistry::max_loras);
        let engine_card = EngineCard::new(&launch);
        let mut engine = launch.engine;
        if let Some(kv) = &kv_events {
            engine.emit_kv_events = true;
            engine.emit_kv_token_ids = kv.token_ids;
        }
        // Before anything binds or starts: a bad file is a usage error, not a half-started server.
        let tls = tls.as_ref().map(|o| Tls::load(o, ALPN)).transpose().map_err(ServerError::Options)?;
        let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
        let grpc_listener = match grpc_port {
            Some(port) => {
                let at = SocketAddr::new(addr.ip(), port);
                Some(TcpListener::bind(at).await.map_err(|source| ServerError::Bind { addr: at, source })?)
            }
            None => None,
        };
        let grpc_served = match engine.backend {
            Backend::Vllm => Some(crate::api::grpc::Service::Vllm),
            Backend::Sglang => Some(crate::api::grpc::Service::Sglang),
            Backend::Trtllm => None,
        };
        let ranks_options = if ranks_options.is_empty() {
            (0..launch.dp_size.max(1)).map(|_| LiveOptions::default()).collect()
        } else {
            ranks_options
        };
        let mut bound_events = Vec::new();
        let mut ranks_options: Vec<LiveOptions> = ranks_options;
        if let Some(kv) = &kv_events {
            for (rank, options) in ranks_options.iter_mut().enumerate() {
                let publisher = KvEventPublisher::start(PublisherOptions {
                    endpoint: kv.endpoint.clone(),
                    replay_endpoint: kv.replay_endpoint.clone(),
                    dp_rank: rank as u32,
                    block_size: engine.block_size,
                    ..Default::default()
                })?;
                bound_events.push(BoundKvEvents {
                    dp_rank: rank as u32,
                    endpoint: publisher.endpoint().to_string(),
                    replay_endpoint: publisher.replay_endpoint().map(str::to_string),
                });
                // The sink owns the publisher: it is dropped (flushed and joined) when the
                // engine's actor is gone. A sink the caller gave (an in-process router's
                // index) still sees every event.
                options.kv_events = Some(match options.kv_events.take() {
                    None => Box::new(move |events| publisher.publish(events)),
                    Some(mut also) => Box::new(move |events| {
                        publisher.publish(events);
                        also(events);
                    }),
                });
            }
        }
        let flavor =
            if engine.backend == Backend::Sglang { MetricFlavor::Sglang } else { MetricFlavor::Vllm };
        let metrics = ServerMetrics::new(MetricsOptions {
            flavor,
            model_name: model_name.clone(),
            dp_ranks: (0..ranks_options.len() as u32).collect(),
            block_size: engine.block_size,
            max_model_len: served_max_model_len(&engine),
            max_loras,
            kv_cache_groups: engine.kv_cache_groups.iter().map(|g| g.name.clone()).collect(),
            kv_cache_capacity_bytes: engine.kv_cache_capacity_bytes.unwrap_or(0),
        });
        let ranks_options: Vec<LiveOptions> = ranks_options
            .into_iter()
            .enumerate()
            // A reader that falls a whole buffer behind (one that never reads) is shed, so
            // memory stays bounded per stream and, with the connection limit, in total.
            .map(|(rank, mut o)| {
                o.forward_pass_metrics = metrics.iteration_sink(rank, o.forward_pass_metrics.take());
                LiveOptions {
                    buffering: OutputBuffering::CancelOnOverflow { capacity: stream_buffer_tokens },
                    max_loras,
                    ..o
                }
            })
            .collect();
        let engines = if ranks_options.len() <= 1 {
            let mut options = ranks_options;
            vec![LiveEngine::start(engine.clone(), options.remove(0))?]
        } else {
            LiveEngine::start_group(engine.clone(), ranks_options)?
        };
        metrics.attach_engines(engines.iter().map(|e| e.metrics()).collect(), engines.clone());
        let bootstrap = match pd
            .as_ref()
            .and_then(|o| o.bootstrap.filter(|_| o.config.role == KvRole::Producer))
        {
            Some(b) => {
                let at = SocketAddr::new(addr.ip(), b.port);
                Some(TcpListener::bind(at).await.map_err(|source| ServerError::Bind { addr: at, source })?)
            }
            None => None,
        };
        let bootstrap_port = bootstrap.as_ref().and_then(|l| l.local_addr().ok()).map_or(0, |a| a.port());
        let pd = pd.map(|o| {
            let bound = listener.local_addr().unwrap_or(addr);
            // Decode servers dial this address; an unspecified bind is reachable on loopback.
            let host =
                if bound.ip().is_unspecified() { "127.0.0.1".to_string() } else { bound.ip().to_string() };
            Arc::new(PdState::new(
                &o,
                PdServer {
                    host,
                    port: bound.port(),
                    bootstrap_port,
                    api_key: api_key_plain.clone(),
                    model_name: &model_name,
                    registry: &metrics,
                    tls: tls.as_ref(),
                },
            ))
        });
        let model_name_for_runtime = model_name.clone();
        let (dp_ranks, created) = (metrics.dp_ranks().to_vec(), metrics.created());
        let state = Arc::new(AppState {
            engine_card,
            model_name,
            tokenizer,
            ranks: Ranks(engines),
            metrics,
            max_model_len: max_model_len(&engine),
            served_max_model_len: served_max_model_len(&engine),
            output_lengths: launch
                .output_length_distribution
                .unwrap_or(mocker_core::output_length::OutputLengthDistribution::CHAT),
            api_key,
            block_size: engine.block_size,
            num_gpu_blocks: engine.num_gpu_blocks,
            max_body_bytes,
            body_timeout,
            readiness: Readiness::after(Duration::from_secs_f64(launch.startup_time.unwrap_or(0.0))),
            runtime: RuntimeConfig::new(
                RuntimeSettings {
                    speedup_ratio: engine.speedup_ratio,
                    frontend_latency_ms: launch.hardware.frontend_latency_ms.unwrap_or(0.0),
                    failure: failure_injection,
                },
                &model_name_for_runtime,
                &dp_ranks,
                created,
            ),
            reasoning,
            replay,
            image_tokens,
            sleep: enable_sleep_mode.then(SleepMode::default),
            embedding_dim,
            max_logprobs,
            lora,
            pd,
        });
        state
            .metrics
            .register_collector(state.engine_card.collector(&state.model_name, state.metrics.dp_ranks()));
        for collector in state.runtime.collectors() {
            state.metrics.register_collector(collector);
        }
        let limits = ConnLimits { max_connections, header_timeout };
        Ok(Self {
            listener,
            grpc_listener,
            grpc_served,
            state,
            grace: shutdown_grace,
            limits,
            kv_events: bound_events,
            bootstrap,
            tls,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// The full name of the gRPC service this server serves (its backend's), if any.
    pub fn grpc_service(&self) -> Option<&'static str> {
        self.grpc_served.map(crate::api::grpc::Service::name)
    }

    /// The `--grpc-port` address, when one was asked for.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Computes request bodies' prompt blocks as this server does: what a KV-aware router
    /// in front of it (`mocker serve --pd-router kv`) scores workers with.
    pub fn prompt_hasher(&self) -> PromptHasher {
        PromptHasher::new(self.state.clone())
    }

    /// An SGLang prefill server's bootstrap address (where decode servers read its rooms).
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Whether the server speaks TLS: its URLs are `https://`.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The KV-event endpoints each rank bound (empty when events are off).
    pub fn kv_events(&self) -> &[BoundKvEvents] {
        &self.kv_events
    }

    /// Serves until `shutdown` resolves, then stops accepting and lets open connections
    /// finish for up to the grace period. Past it, stops the engine (ending any stream still
    /// open with an error event), gives connections a moment to write that, closes every
    /// connection still open, and returns.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let Self { listener, grpc_listener, grpc_served, state, grace, limits, bootstrap, tls, .. } = self;
        let tls_acceptor = tls.as_ref().map(|t| t.acceptor().clone());
        // The bootstrap port serves room reads only, with the main port's header timeout
        // and connection limit; it stops with the server.
        let bootstrap = bootstrap.map(|l| {
            let rooms = axum::Router::new()
                .route("/mocker/bootstrap/read", axum::routing::post(crate::pd::bootstrap_read_handler))
                .with_state(state.side_channel());
            let connections = Connections::new(limits.max_connections);
            tokio::spawn(accept_loop(l, rooms, limits, connections, tls_acceptor.clone()))
        });
        let _stop_bootstrap = bootstrap.map(|task| AbortOnDrop(task.abort_handle()));
        let connections = Connections::new(limits.max_connections);
        let grpc = Grpc::new(state.clone(), grpc_served).await;
        let app = dispatch(router(state.clone()), grpc.router());
        let acceptor =
            tokio::spawn(accept_loop(listener, app, limits, connections.clone(), tls_acceptor.clone()));
        // The gRPC port shares the connection limit, TLS and the shutdown.
        let grpc_acceptor = grpc_listener
            .map(|l| tokio::spawn(accept_loop(l, grpc.router(), limits, connections.clone(), tls_acceptor)));
        shutdown.await;
        grpc.shutting_down().await;
        connections.stop.cancel();
        // The listener is closed once the loop is gone: new connections are refused.
        let _ = acceptor.await;
        if let Some(task) = grpc_acceptor {
            let _ = task.await;
        }
        let mut result = Ok(());
        if tokio::time::timeout(grace, connections.all_closed()).await.is_err() {
            result = result.and(stop_engine(&state).await);
            let _ = tokio::time::timeout(FINAL_FLUSH_TIME, connections.all_closed()).await;
            connections.force.cancel();
            // Forced connections drop their futures at once; bounded all the same.
            let _ = tokio::time::timeout(FINAL_FLUSH_TIME, connections.all_closed()).await;
            if connections.open() > 0 {
                result = result.and(Err(ServerError::Shutdown(format!(
                    "{} connections did not close after the grace period",
                    connections.open()
                ))));
            }
        }
        result.and(stop_engine(&state).await)
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Context window served when `--max-model-len` is not given: 32,768 tokens, the native
/// window of Qwen3 and of Mistral 7B v0.2 (vLLM serves a model's own
/// `max_position_embeddings`; mocker has no model to read it from), or the KV pool when that
/// holds less.
pub const DEFAULT_MAX_MODEL_LEN: usize = 32_768;

/// The context window the server enforces: `--max-model-len` when set, else
/// [`DEFAULT_MAX_MODEL_LEN`] when one rank's KV pool holds more; `None` leaves the pool as
/// the limit (longer requests are refused as never schedulable).
fn max_model_len(engine: &mocker_core::config::EngineConfig) -> Option<usize> {
    let pool = engine.num_gpu_blocks.saturating_mul(engine.block_size);
    engine.max_model_len.or((pool > DEFAULT_MAX_MODEL_LEN).then_some(DEFAULT_MAX_MODEL_LEN))
}

/// The longest sequence a request may have: the context window, else what one rank's KV
/// pool holds. What `/v1/models` reports as `max_model_len`.
pub fn served_max_model_len(engine: &mocker_core::config::EngineConfig) -> usize {
    max_model_len(engine).unwrap_or(engine.num_gpu_blocks * engine.block_size)
}

/// Stops every rank (idempotent), within [`ENGINE_STOP_TIME`].
async fn stop_engine(state: &AppState) -> Result<(), ServerError> {
    let stop = async {
        let mut result = Ok(());
        for rank in &state.ranks.0 {
            if let Err(e) = rank.shutdown().await {
                result = result.and(Err(ServerError::Engine(e)));
            }
        }
        result
    };
    match tokio::time::timeout(ENGINE_STOP_TIME, stop).await {
        Ok(r) => r,
        Err(_) => Err(ServerError::Shutdown(format!(
            "the engine did not stop within {} ms",
            ENGINE_STOP_TIME.as_millis()
        ))),
    }
}
