//! A disaggregated deployment's OpenAI front (`mocker serve --prefill-workers P
//! --decode-workers D`): it runs the two steps of vLLM's P/D proxies itself, so a plain
//! client talks to prefill and decode workers as to one server.
//!
//! For `/v1/completions` and `/v1/chat/completions`: the request goes to a prefill worker
//! (round-robin, or the KV router's choice: [`PdRouting`]) with `kv_transfer_params: {do_remote_decode: true}`, `stream: false` and
//! one output token; its answer's `kv_transfer_params` go, with the client's request, to a
//! decode worker (round-robin), whose answer (streamed or not) is passed back as it comes.
//! A worker's error answer is the client's answer; when the decode step fails, the front
//! frees the prefill's held KV at once (`/mocker/kv_transfer/abort`). Both steps carry the client's
//! `Authorization` and one `X-Request-Id`. `/v1/models` and `/health` ask the workers;
//! `/metrics` is the front's own: `mocker:pd_handoffs_total` and the modelled KV transfer
//! time of each handoff, `mocker:pd_kv_transfer_seconds`.
//! With TLS ([`FrontOptions::tls`]) the front serves https and calls its workers over https
//! with the deployment's trust (see [`crate::tls`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::TryStreamExt;
use prometheus::{Encoder, Histogram, HistogramOpts, IntCounter, Opts, Registry, TextEncoder};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use mocker_router::{KvRouter, RouteId, RouteRequest};

use crate::conn::{accept_loop, ConnLimits, Connections, ALPN};
use crate::error::ApiError;
use crate::pd::TRANSFER_MS_HEADER;
use crate::prefix::{PromptBlocks, PromptHasher};
use crate::server::ServerError;
use crate::tls::{Tls, TlsOptions};

/// Where the front listens and which workers it drives.
#[derive(Debug, Clone)]
pub struct FrontOptions {
    /// Address to bind.
    pub addr: SocketAddr,
    /// Base URLs (`http://host:port`, `https://` with TLS) of the prefill workers.
    pub prefill: Vec<String>,
    /// Base URLs of the decode workers.
    pub decode: Vec<String>,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// `model_name` label of the front's metrics.
    pub model_name: String,
    /// How a request's workers are chosen.
    pub routing: PdRouting,
    /// A connection whose request head is not complete this long after it opened (or after
    /// its previous response) is closed, as on the workers (`--header-timeout-seconds`).
    pub header_timeout: Duration,
    /// A request body not in full this long after its head is answered 408
    /// (`--body-timeout-seconds`).
    pub body_timeout: Duration,
    /// Most open client connections; beyond them a new one is answered 503 and closed.
    pub max_connections: usize,
    /// How long open requests may run on after the shutdown signal.
    pub shutdown_grace: Duration,
    /// The workers' side-channel secret (`--kv-transfer-secret`), sent on aborts.
    pub kv_transfer_secret: Option<String>,
    /// TLS on the front's port and on its calls to the workers (which share it).
    pub tls: Option<TlsOptions>,
}

/// How the front picks a request's workers (`--pd-router`).
#[derive(Debug, Clone, Default)]
pub enum PdRouting {
    /// Each worker of a pool in turn.
    #[default]
    RoundRobin,
    /// The KV router's choices, as Dynamo's KV router makes them for a disaggregated
    /// deployment: the prefill worker whose cached prefix and pending prefill make the
    /// request cheapest, the decode worker holding the fewest blocks of live requests.
    Kv {
        /// The prefill pool's router; it must be fed the prefill workers' KV events
        /// (worker `i` of `prefill` is its worker `i`).
        prefill: Arc<Mutex<KvRouter>>,
        /// The decode pool's router (load only: it needs no KV events).
        decode: Arc<Mutex<KvRouter>>,
        /// Prompt blocks of a request body, as the workers hash them.
        hasher: PromptHasher,
    },
}

/// A placement the KV router tracks until its step is over (or abandoned: a client that
/// goes away drops it), so the request's load counts against its worker only meanwhile.
struct Routed {
    router: Arc<Mutex<KvRouter>>,
    id: RouteId,
}

impl Routed {
    /// Routes `prompt` with `router`: the worker and the tracking guard.
    fn place(router: &Arc<Mutex<KvRouter>>, prompt: &PromptBlocks) -> (usize, Self) {
        let placement = lock(router).route(RouteRequest::shared(prompt.isl, &prompt.hashes));
        (placement.worker, Self { router: router.clone(), id: placement.id })
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        let mut router = lock(&self.router);
        router.prefill_done(self.id);
        router.free(self.id);
    }
}

/// The router, even after a panic elsewhere poisoned its lock (its state stays consistent:
/// every update is a plain call that cannot half-apply).
fn lock(router: &Mutex<KvRouter>) -> std::sync::MutexGuard<'_, KvRouter> {
    router.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct FrontState {
    prefill: Vec<String>,
    routing: PdRouting,
    decode: Vec<String>,
    next_prefill: AtomicUsize,
    next_decode: AtomicUsize,
    max_body_bytes: usize,
    body_timeout: Duration,
    client: reqwest::Client,
    /// `https` when the deployment has TLS (for the aborts' URLs, made from params).
    scheme: &'static str,
    registry: Registry,
    handoffs: IntCounter,
    transfer: Histogram,
    kv_transfer_secret: Option<String>,
}

/// Buckets of the transfer-time histogram, in seconds (vLLM's latency buckets' low end).
const TRANSFER_BUCKETS: [f64; 14] =
    [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0];

/// A bound front, ready to serve.
pub struct BoundFront {
    listener: TcpListener,
    state: Arc<FrontState>,
    limits: ConnLimits,
    grace: Duration,
    tls: Option<Tls>,
}

impl BoundFront {
    /// Binds the front's listener.
    pub async fn bind(options: FrontOptions) -> Result<Self, ServerError> {
        if options.prefill.is_empty() || options.decode.is_empty() {
            return Err(ServerError::Options(
                "a P/D front needs at least one prefill and one decode worker".into(),
            ));
        }
        let tls =
            options.tls.as_ref().map(|o| Tls::load(o, ALPN)).transpose().map_err(ServerError::Options)?;
        let listener = TcpListener::bind(options.addr)
            .await
            .map_err(|source| ServerError::Bind { addr: options.addr, source })?;
        let registry = Registry::new();
        let label = |o: Opts| o.const_label("model_name", options.model_name.clone());
        let handoffs = IntCounter::with_opts(label(Opts::new(
            "mocker:pd_handoffs_total",
            "Requests the front ran as a prefill then a decode whose KV was transferred.",
        )))
        .expect("valid counter");
        let transfer = Histogram::with_opts(
            HistogramOpts::new("mocker:pd_kv_transfer_seconds", "Modelled KV transfer time of each handoff.")
                .const_label("model_name", options.model_name.clone())
                .buckets(TRANSFER_BUCKETS.to_vec()),
        )
        .expect("valid histogram");
        registry.register(Box::new(handoffs.clone())).expect("unique");
        registry.register(Box::new(transfer.clone())).expect("unique");
        let state = FrontState {
            prefill: options.prefill,
            routing: options.routing,
            decode: options.decode,
            next_prefill: AtomicUsize::new(0),
            next_decode: AtomicUsize::new(0),
            max_body_bytes: options.max_body_bytes,
            body_timeout: options.body_timeout,
            client: crate::tls::http_client(tls.as_ref(), reqwest::Client::builder()),
            scheme: crate::tls::scheme(tls.as_ref()),
            registry,
            handoffs,
            transfer,
            kv_transfer_secret: options.kv_transfer_secret,
        };
        let limits =
            ConnLimits { max_connections: options.max_connections, header_timeout: options.header_timeout };
        Ok(Self { listener, state: Arc::new(state), limits, grace: options.shutdown_grace, tls })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves until `shutdown` resolves, through the workers' accept loop (header timeout,
    /// connection limit); then stops accepting, lets open requests finish for the grace
    /// period and closes what is still open.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let app = Router::new()
            .route("/v1/completions", post(forward))
            .route("/v1/chat/completions", post(forward))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .fallback(|request: Request| async move {
                ApiError {
                    status: StatusCode::NOT_FOUND,
                    message: format!(
                        "no route {} {} on the P/D front",
                        request.method(),
                        request.uri().path()
                    ),
                    param: None,
                }
            })
            .with_state(self.state);
        let connections = Connections::new(self.limits.max_connections);
        let tls = self.tls.map(|t| t.acceptor().clone());
        let acceptor = tokio::spawn(accept_loop(self.listener, app, self.limits, connections.clone(), tls));
        shutdown.await;
        connections.stop.cancel();
        let _ = acceptor.await;
        if tokio::time::timeout(self.grace, connections.all_closed()).await.is_err() {
            connections.force.cancel();
            let _ = tokio::time::timeout(Duration::from_millis(200), connections.all_closed()).await;
        }
        Ok(())
    }
}

fn pick(urls: &[String], next: &AtomicUsize) -> String {
    urls[next.fetch_add(1, Ordering::Relaxed) % urls.len()].clone()
}

/// The client's headers that both steps carry.
fn carried(headers: &HeaderMap, request_id: &str) -> reqwest::header::HeaderMap {
    let mut out = reqwest::header::HeaderMap::new();
    if let Some(auth) = headers.get(header::AUTHORIZATION) {
        out.insert(reqwest::header::AUTHORIZATION, auth.clone());
    }
    if let Ok(id) = HeaderValue::from_str(request_id) {
        out.insert("x-request-id", id);
    }
    out
}

fn unavailable(worker: &str, e: reqwest::Error) -> ApiError {
    let e = crate::error::with_causes(&e);
    ApiError::unavailable(format!("the P/D front could not reach worker {worker}: {e}"))
}

/// A worker's answer passed back as it comes (status, content type, body stream).
fn passthrough(r: reqwest::Response) -> Response {
    passthrough_holding(r, None)
}

/// [`passthrough`], keeping `routed` until the body has been passed on or dropped.
fn passthrough_holding(r: reqwest::Response, routed: Option<Routed>) -> Response {
    let status = StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = r.headers().get(reqwest::header::CONTENT_TYPE).cloned();
    let body = Body::from_stream(r.bytes_stream().map_err(move |e| {
        let _held = &routed;
        std::io::Error::other(e)
    }));
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    response
}

async fn forward(State(state): State<Arc<FrontState>>, request: Request) -> Result<Response, ApiError> {
    let path = request.uri().path().to_string();
    let headers = request.headers().clone();
    let request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string);
    let read = axum::body::to_bytes(request.into_body(), state.max_body_bytes);
    let bytes: Bytes = match tokio::time::timeout(state.body_timeout, read).await {
        Ok(read) => read.map_err(|_| ApiError::payload_too_large(state.max_body_bytes))?,
        Err(_) => return Err(ApiError::body_timeout(state.body_timeout)),
    };
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let Value::Object(original) = body else {
        return Err(ApiError::bad_request("request body: expected a JSON object"));
    };
    if original.contains_key("kv_transfer_params") {
        return Err(ApiError::invalid_field(
            "kv_transfer_params",
            "kv_transfer_params: the P/D front sets these itself; send the request without them",
        ));
    }
    let headers = carried(&headers, &request_id);

    // Step 1: the prefill, one token, not streamed.
    let mut prefill = original.clone();
    prefill
        .insert("kv_transfer_params".into(), json!({"do_remote_decode": true, "do_remote_prefill": false}));
    prefill.insert("stream".into(), Value::Bool(false));
    prefill.remove("stream_options");
    prefill.insert("max_tokens".into(), json!(1));
    if prefill.contains_key("max_completion_tokens") {
        prefill.insert("max_completion_tokens".into(), json!(1));
    }
    prefill.remove("min_tokens");
    let prompt = match &state.routing {
        PdRouting::RoundRobin => None,
        PdRouting::Kv { hasher, .. } => Some(hasher.blocks(&path, &bytes)?),
    };
    let (worker, routed) = match (&state.routing, &prompt) {
        (PdRouting::Kv { prefill, .. }, Some(prompt)) => {
            let (w, routed) = Routed::place(prefill, prompt);
            (state.prefill[w].clone(), Some(routed))
        }
        _ => (pick(&state.prefill, &state.next_prefill), None),
    };
    let answer = state
        .client
        .post(format!("{worker}{path}"))
        .headers(headers.clone())
        .json(&prefill)
        .send()
        .await
        .map_err(|e| unavailable(&worker, e))?;
    if !answer.status().is_success() {
        return Ok(passthrough(answer));
    }
    let answer: Value = answer.json().await.map_err(|e| unavailable(&worker, e))?;
    drop(routed);
    let params = answer.get("kv_transfer_params").cloned().filter(|p| p.is_object()).ok_or_else(|| {
        ApiError::internal(format!("prefill worker {worker} answered without kv_transfer_params"))
    })?;

    // Step 2: the client's request, decoded where the KV goes.
    let mut decode = original;
    decode.insert("kv_transfer_params".into(), params.clone());
    let (worker, routed) = match (&state.routing, &prompt) {
        (PdRouting::Kv { decode, .. }, Some(prompt)) => {
            let (w, routed) = Routed::place(decode, prompt);
            (state.decode[w].clone(), Some(routed))
        }
        _ => (pick(&state.decode, &state.next_decode), None),
    };
    let response = state
        .client
        .post(format!("{worker}{path}"))
        .headers(headers.clone())
        .json(&decode)
        .send()
        .await
        .map_err(|e| unavailable(&worker, e));
    let response = match response {
        Ok(r) if r.status().is_success() => r,
        failed => {
            // The decode side refused or is gone: free the prefill's KV now, not at its timeout.
            abort_prefill(&state, &params, &headers).await;
            match failed {
                Ok(r) => return Ok(passthrough(r)),
                Err(e) => return Err(e),
            }
        }
    };
    if let Some(ms) = response
        .headers()
        .get(TRANSFER_MS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<f64>().ok())
    {
        state.handoffs.inc();
        state.transfer.observe(ms / 1000.0);
    }
    // The decode's load counts on its worker until its answer has been passed on.
    let mut out = passthrough_holding(response, routed);
    if let Ok(id) = HeaderValue::from_str(&request_id) {
        out.headers_mut().insert("x-request-id", id);
    }
    Ok(out)
}

async fn abort_prefill(state: &FrontState, params: &Value, headers: &reqwest::header::HeaderMap) {
    let (Some(host), Some(port)) = (params["remote_host"].as_str(), params["remote_port"].as_u64()) else {
        return;
    };
    let body = json!({
        "remote_engine_id": params["remote_engine_id"],
        "remote_request_id": params["remote_request_id"],
    });
    let mut call = state
        .client
        .post(format!("{}://{host}:{port}/mocker/kv_transfer/abort", state.scheme))
        .headers(headers.clone())
        .json(&body);
    if let Some(secret) = &state.kv_transfer_secret {
        call = call.header(crate::pd::SECRET_HEADER, secret);
    }
    let _ = call.send().await;
}

async fn models(State(state): State<Arc<FrontState>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let worker = &state.decode[0];
    let r = state
        .client
        .get(format!("{worker}/v1/models"))
        .headers(carried(&headers, &uuid::Uuid::new_v4().to_string()))
        .send()
        .await
        .map_err(|e| unavailable(worker, e))?;
    Ok(passthrough(r))
}

async fn health(State(state): State<Arc<FrontState>>) -> Response {
    for worker in state.prefill.iter().chain(&state.decode) {
        let ok = state
            .client
            .get(format!("{worker}/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if !ok {
            return ApiError::unavailable(format!("worker {worker} is not healthy")).into_response();
        }
    }
    StatusCode::OK.into_response()
}

async fn metrics(State(state): State<Arc<FrontState>>) -> Response {
    let mut out = Vec::new();
    TextEncoder::new().encode(&state.registry.gather(), &mut out).expect("text encoding cannot fail");
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], out).into_response()
}
