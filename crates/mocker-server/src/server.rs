//! Starting and stopping one server: engine ranks, listener, graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use mocker_core::config::{Backend, LaunchConfig};
use mocker_kv_events::{KvEventPublisher, PublisherOptions};
use mocker_live::{LiveEngine, LiveOptions, OutputBuffering};
use tokio::net::TcpListener;

use crate::app::{router, AppState, Ranks};
use crate::metrics::{MetricFlavor, ServerMetrics};
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
    /// Bearer token required on `/v1/*`.
    pub api_key: Option<String>,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// How long in-flight streams may run on after a shutdown signal before the engine is
    /// stopped and they end with an error event.
    pub shutdown_grace: Duration,
    /// Publish KV events over ZMQ (vLLM's wire format), one PUB socket per DP rank.
    pub kv_events: Option<KvEventsOptions>,
}

/// Where KV events go: rank `r` binds the endpoints' ports + `r` (port 0 picks free ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsOptions {
    /// PUB endpoint, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// ROUTER endpoint answering replay requests, if any.
    pub replay_endpoint: Option<String>,
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
            kv_events: None,
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
}

/// A server that is bound and ready: its address is known before it serves.
pub struct BoundServer {
    listener: TcpListener,
    state: Arc<AppState>,
    grace: Duration,
    kv_events: Vec<BoundKvEvents>,
}

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
            kv_events,
        } = options;
        let mut engine = launch.engine;
        if kv_events.is_some() {
            // Routers and indexers identify blocks from their token ids.
            engine.emit_kv_events = true;
            engine.emit_kv_token_ids = true;
        }
        let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
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
                // engine's actor is gone.
                options.kv_events = Some(Box::new(move |events| publisher.publish(events)));
            }
        }
        let ranks_options: Vec<LiveOptions> = ranks_options
            .into_iter()
            // A slow HTTP reader must not be shed mid-answer: TCP back-pressure already
            // bounds it, and a whole response is at most max_tokens small signals.
            .map(|o| LiveOptions { buffering: OutputBuffering::FullResponse, ..o })
            .collect();
        let engines = if ranks_options.len() <= 1 {
            let mut options = ranks_options;
            vec![LiveEngine::start(engine.clone(), options.remove(0))?]
        } else {
            LiveEngine::start_group(engine.clone(), ranks_options)?
        };
        let flavor =
            if engine.backend == Backend::Sglang { MetricFlavor::Sglang } else { MetricFlavor::Vllm };
        let metrics = ServerMetrics::new(
            flavor,
            &model_name,
            engine.block_size,
            engines.iter().map(|e| e.metrics()).collect(),
        );
        let state = Arc::new(AppState {
            model_name,
            tokenizer,
            ranks: Ranks(engines),
            metrics,
            max_model_len: engine.max_model_len,
            api_key,
            block_size: engine.block_size,
            num_gpu_blocks: engine.num_gpu_blocks,
            max_body_bytes,
        });
        Ok(Self { listener, state, grace: shutdown_grace, kv_events: bound_events })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// The KV-event endpoints each rank bound (empty when events are off).
    pub fn kv_events(&self) -> &[BoundKvEvents] {
        &self.kv_events
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets in-flight streams finish
    /// for up to the grace period, stops the engine (ending any stream still open with an
    /// error event) and returns.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        let Self { listener, state, grace, .. } = self;
        let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
        let app = router(state.clone());
        // Each token is a small frame that must leave at once: Nagle's algorithm would hold
        // it back waiting for the client's delayed ACK.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stopping_tx.send(true);
        });
        let mut server = tokio::spawn(async move { server.await });
        let mut stopping = stopping_rx;
        // `wait_for` returns a borrow guard; it must not live inside the select's output.
        let served = tokio::select! {
            joined = &mut server => joined,
            _ = async move { stopping.wait_for(|s| *s).await.is_ok() } => {
                // Graceful shutdown waits for open connections; past the grace period,
                // stopping the engine ends their streams.
                match tokio::time::timeout(grace, &mut server).await {
                    Ok(joined) => joined,
                    Err(_) => {
                        for rank in &state.ranks.0 {
                            let _ = rank.shutdown().await;
                        }
                        server.await
                    }
                }
            }
        };
        let mut result = served.map_err(|e| std::io::Error::other(e.to_string()))?.map_err(ServerError::Io);
        for rank in &state.ranks.0 {
            if let Err(e) = rank.shutdown().await {
                result = result.and(Err(ServerError::Engine(e)));
            }
        }
        result
    }
}
