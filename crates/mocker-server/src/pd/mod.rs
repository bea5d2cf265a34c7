//! Disaggregated prefill/decode over HTTP with vLLM's NIXL-connector contract
//! (`--kv-transfer-config`), between mocker servers in separate processes.
//!
//! * A request whose `kv_transfer_params` say `do_remote_decode` is a **prefill request**:
//!   it runs here as a handoff source, so when it finishes its KV blocks stay held, and the
//!   answer carries vLLM's `kv_transfer_params` (`do_remote_prefill`, `remote_engine_id`,
//!   `remote_block_ids`, `remote_host`, `remote_port`, `remote_request_id`, `tp_size`;
//!   streamed, in a last chunk with no choices).
//! * A request whose params say `do_remote_prefill` is a **decode request**: it reserves
//!   the prompt blocks it lacks here, then "reads" the KV from the prefill server over the
//!   side channel below; the read takes the prefill side's modelled transfer time
//!   (`kv_transfer_bytes_per_token`, `kv_transfer_bandwidth`, `kv_transfer_timing_mode`, as
//!   in the core), after which the prefill side frees its blocks and the decode side starts
//!   decoding with the prompt counted as computed. If the prefill server cannot be reached
//!   or does not hold the blocks, the decode side computes the prompt itself (vLLM's
//!   recompute fallback), logs it and counts it in `mocker:kv_transfer_recomputes_total`.
//! * A held source no decode side reads is freed after `--kv-abort-timeout-seconds`
//!   (vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, 480 s).
//!
//! With the SGLang backend the same hold / reserve / read / free lifecycle runs under
//! SGLang's PD protocol instead ([`BootstrapOptions`]): its router sends one request, with
//! `bootstrap_host`, `bootstrap_port` and `bootstrap_room`, to a prefill and a decode server
//! at once. The prefill server computes one token, puts its held KV in the room and answers
//! once the KV has been read; the decode server reserves the prompt's blocks and reads them
//! from the prefill server's bootstrap port (`POST /mocker/bootstrap/read`, JSON
//! `{bootstrap_room, missing_tokens}`), which answers when the prefill is in the room and
//! the modelled transfer is over. Of SGLang's bootstrap server this models the rendezvous
//! by room on a separate port, either side first, and the timeouts; not its rank/route
//! registry or the transfer engines' own sockets.
//!
//! The side channel is mocker's own: `POST /mocker/kv_transfer/read` on the prefill
//! server's serve port (`remote_port`), JSON `{remote_engine_id, remote_request_id,
//! remote_block_ids, missing_tokens}`. Block ids are this server's handles for the held
//! blocks (one per prompt block, unique per server), not the core's pool indices.

pub mod params;
mod peers;
mod rooms;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use mocker_core::Request as CoreRequest;
use mocker_live::{
    HandoffEvent, HandoffId, HandoffTransferTiming, LiveEngine, LiveHandoffControl, LiveHandoffEvents,
    LiveRequest,
};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::ApiError;
pub use params::{BootstrapRoom, KvRole, KvTransfer, KvTransferConfig, RemotePrefill};
pub use peers::{check_host, PeerAllowList};
use rooms::{Rooms, Taken, Withdraw};

/// Response header of a decode request whose KV was read from a prefill server: the
/// modelled transfer time in ms (what a P/D front observes per handoff).
pub const TRANSFER_MS_HEADER: &str = "x-mocker-kv-transfer-ms";

/// vLLM's default abort timeout for held prefill KV (`VLLM_NIXL_ABORT_REQUEST_TIMEOUT`).
pub const DEFAULT_ABORT_TIMEOUT: Duration = Duration::from_secs(480);

/// Options of a server that takes part in disaggregated serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdOptions {
    /// `--kv-transfer-config`.
    pub config: KvTransferConfig,
    /// How long a finished prefill holds its KV for a decode side that never reads it.
    pub abort_timeout: Duration,
    /// Refuse requests without the role's `kv_transfer_params` (a server made prefill-only or
    /// decode-only by engine-args `worker_type`, as the reference's disaggregation modes).
    pub transfers_only: bool,
    /// SGLang's bootstrap protocol instead of vLLM's `kv_transfer_params`.
    pub bootstrap: Option<BootstrapOptions>,
    /// Peers a decode server may read KV from (`--kv-peer-allow`); `None`: loopback and the
    /// server's own address ([`PeerAllowList::default_for`]).
    pub peers: Option<PeerAllowList>,
    /// A secret the servers of a P/D deployment share (`--kv-transfer-secret`): a side-channel
    /// read, abort or bootstrap read must carry it in [`SECRET_HEADER`], and this server's
    /// reads send it. `None`: only the API key (when set) guards the side channel.
    pub secret: Option<String>,
}

/// The header a side-channel call carries the deployment's `--kv-transfer-secret` in.
pub const SECRET_HEADER: &str = "x-mocker-kv-transfer-secret";

/// SGLang's PD protocol on a server of the SGLang backend (`worker_type` prefill or decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// A prefill server's bootstrap port (SGLang's `--disaggregation-bootstrap-port`,
    /// engine-args `bootstrap_port`; 0 picks a free one); requests must name it.
    pub port: u16,
    /// How long a held prefill and its reader wait for each other (engine-args
    /// `handoff_session_timeout_ms`).
    pub session_timeout: Duration,
}

/// A finished prefill holding its KV until a decode side reads it.
pub(crate) struct Held {
    control: LiveHandoffControl,
    /// Keeps the handoff route registered while the KV is held.
    _events: LiveHandoffEvents,
    block_ids: Vec<u64>,
    timing: HandoffTransferTiming,
}

/// The disaggregation state of one server.
pub struct PdState {
    role: KvRole,
    transfers_only: bool,
    abort_timeout: Duration,
    /// `remote_engine_id` of this server.
    engine_id: String,
    /// Where decode servers reach this one (`remote_host`, `remote_port`).
    host: String,
    port: u16,
    /// Bearer token this server sends on reads (the servers of a pair share a key).
    api_key: Option<String>,
    held: Mutex<FxHashMap<String, Held>>,
    next_block_id: AtomicU64,
    recomputes: prometheus::IntCounter,
    client: reqwest::Client,
    /// `https` when this server has TLS: the servers of a deployment share their TLS
    /// configuration, so a peer is dialled as this server is reached.
    scheme: &'static str,
    /// SGLang's protocol: the bootstrap rooms (a prefill server's) and the port requests
    /// must name; `None` under vLLM's.
    rooms: Option<Rooms>,
    bootstrap: bool,
    bootstrap_port: u16,
    session_timeout: Duration,
    /// Where reads may go.
    peers: PeerAllowList,
    /// The deployment's shared side-channel secret: checked (as a digest) on calls in,
    /// sent on reads out.
    secret: Option<(crate::auth::ApiKey, String)>,
}

/// How long a decode server waits to connect to a prefill server: a peer that accepts no
/// connection must not hold the reserved blocks for the whole abort timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for PdState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdState")
            .field("role", &self.role)
            .field("engine_id", &self.engine_id)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("held", &self.held.lock().map(|h| h.len()).unwrap_or(0))
            .finish()
    }
}

/// The server a [`PdState`] belongs to.
pub struct PdServer<'a> {
    /// Where decode servers reach this one (`remote_host`).
    pub host: String,
    /// Its serve port (`remote_port`).
    pub port: u16,
    /// Its SGLang bootstrap port (0 without one).
    pub bootstrap_port: u16,
    /// Bearer token this server sends on reads (the servers of a pair share a key).
    pub api_key: Option<String>,
    /// `model_name` label of its counter.
    pub model_name: &'a str,
    /// Where its counter is registered.
    pub registry: &'a crate::metrics::ServerMetrics,
    /// Its TLS: reads then go over https with the deployment's trust (see [`crate::tls`]).
    pub tls: Option<&'a crate::tls::Tls>,
}

impl PdState {
    /// The disaggregation state of `server`; registers its counter.
    pub fn new(options: &PdOptions, server: PdServer<'_>) -> Self {
        let PdServer { host, port, bootstrap_port, api_key, model_name, registry, tls } = server;
        let recomputes = prometheus::IntCounter::with_opts(
            prometheus::Opts::new(
                "mocker:kv_transfer_recomputes_total",
                "Decode requests that computed their prompt locally because the prefill server's KV could not be read.",
            )
            .const_label("model_name", model_name),
        )
        .expect("valid counter");
        registry.register_collector(Box::new(recomputes.clone()));
        let own = host.parse().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let peers = options.peers.clone().unwrap_or_else(|| PeerAllowList::default_for(own));
        Self {
            peers,
            secret: options
                .secret
                .as_deref()
                .and_then(|s| crate::auth::ApiKey::new(s).map(|k| (k, s.to_string()))),
            role: options.config.role,
            transfers_only: options.transfers_only,
            abort_timeout: options.abort_timeout,
            engine_id: uuid::Uuid::new_v4().to_string(),
            host,
            port,
            api_key,
            held: Mutex::default(),
            next_block_id: AtomicU64::new(1),
            recomputes,
            client: crate::tls::http_client(tls, reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT)),
            scheme: crate::tls::scheme(tls),
            rooms: options
                .bootstrap
                .filter(|_| options.config.role == KvRole::Producer)
                .map(|b| Rooms::new(b.session_timeout)),
            bootstrap: options.bootstrap.is_some(),
            bootstrap_port,
            session_timeout: options.bootstrap.map_or(options.abort_timeout, |b| b.session_timeout),
        }
    }

    /// Whether a side-channel call carries the deployment's secret (always, without one).
    pub fn secret_matches(&self, headers: &axum::http::HeaderMap) -> bool {
        match &self.secret {
            None => true,
            Some((key, _)) => headers.get(SECRET_HEADER).is_some_and(|v| key.matches(v.as_bytes())),
        }
    }

    /// 401 unless the call carries the deployment's secret.
    fn check_secret(&self, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
        if self.secret_matches(headers) {
            Ok(())
        } else {
            Err(ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: format!("side channel: missing or wrong {SECRET_HEADER} (--kv-transfer-secret)"),
                param: None,
            })
        }
    }

    /// Refuses a transfer this server's role or protocol does not take.
    pub fn check_role(&self, transfer: &KvTransfer) -> Result<(), ApiError> {
        if self.bootstrap {
            return self.check_bootstrap(transfer);
        }
        let refused = match (transfer, self.role) {
            (KvTransfer::Bootstrap(_), _) => {
                return Err(ApiError::invalid_field(
                    "bootstrap_room",
                    "bootstrap_room: SGLang's PD fields need an SGLang-backend server with engine-args \
                     worker_type prefill or decode; this server speaks vLLM's kv_transfer_params",
                ))
            }
            (KvTransfer::None, KvRole::Producer) if self.transfers_only => {
                "do_remote_decode is required: this server is a prefill worker (engine-args worker_type prefill)"
            }
            (KvTransfer::None, KvRole::Consumer) if self.transfers_only => {
                "do_remote_prefill is required: this server is a decode worker (engine-args worker_type decode)"
            }
            (KvTransfer::Prefill, KvRole::Consumer) => {
                "do_remote_decode: this server is a kv_consumer (decode only)"
            }
            (KvTransfer::Decode(_), KvRole::Producer) => {
                "do_remote_prefill: this server is a kv_producer (prefill only)"
            }
            _ => return Ok(()),
        };
        Err(ApiError::invalid_field("kv_transfer_params", format!("kv_transfer_params.{refused}")))
    }

    /// SGLang's rules: every request carries the PD fields; a prefill server's requests
    /// name its own bootstrap port and a room no other prefill holds.
    fn check_bootstrap(&self, transfer: &KvTransfer) -> Result<(), ApiError> {
        let side = if self.role == KvRole::Producer { "prefill" } else { "decode" };
        match transfer {
            KvTransfer::Bootstrap(b) => match &self.rooms {
                Some(_) if b.port != self.bootstrap_port => Err(ApiError::invalid_field(
                    "bootstrap_port",
                    format!("bootstrap_port: {} is not this prefill server's bootstrap port {}", b.port, self.bootstrap_port),
                )),
                Some(rooms) if rooms.is_held(b.room) => Err(ApiError::invalid_field(
                    "bootstrap_room",
                    format!("bootstrap_room: room {} already holds a prefill", b.room),
                )),
                _ => Ok(()),
            },
            KvTransfer::None => Err(ApiError::invalid_field(
                "bootstrap_room",
                format!(
                    "bootstrap_room: this server is an SGLang {side} worker (engine-args worker_type {side}); \
                     requests carry bootstrap_host, bootstrap_port and bootstrap_room"
                ),
            )),
            _ => Err(ApiError::invalid_field(
                "kv_transfer_params",
                "kv_transfer_params: this server speaks SGLang's PD protocol (bootstrap_host, bootstrap_port, \
                 bootstrap_room), not vLLM's",
            )),
        }
    }

    /// This server's role.
    pub fn role(&self) -> KvRole {
        self.role
    }

    /// This server's engine id (`remote_engine_id` in its prefill answers).
    pub fn engine_id(&self) -> &str {
        &self.engine_id
    }

    /// Whether this server speaks SGLang's bootstrap protocol rather than vLLM's connector.
    pub fn is_bootstrap(&self) -> bool {
        self.bootstrap
    }

    /// Held prefills (for tests and logs).
    pub fn num_held(&self) -> usize {
        self.held.lock().expect("held").len()
    }
}

/// A prefill request on its way to holding its KV. Dropped before [`Self::finish`] (the
/// client left), it cancels the source so no KV stays held.
pub struct PrefillHandoff {
    route: Option<(LiveHandoffControl, LiveHandoffEvents)>,
    block_size: usize,
    /// SGLang's protocol: the bootstrap room its KV goes to.
    room: Option<u64>,
}

impl Drop for PrefillHandoff {
    fn drop(&mut self) {
        if let Some((control, _)) = self.route.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = control.cancel_source().await;
                });
            }
        }
    }
}

/// Submits `request` on `engine` as a handoff source; its stream runs like any request's.
/// Under SGLang's protocol its KV goes to bootstrap `room`.
pub async fn start_prefill(
    engine: &LiveEngine,
    request: CoreRequest,
    block_size: usize,
    room: Option<u64>,
) -> Result<(LiveRequest, PrefillHandoff), ApiError> {
    let (control, events) = engine.register_handoff(HandoffId(uuid::Uuid::new_v4()))?;
    let (registration, live) = engine.prepare_request(request)?;
    control.submit_prefill(registration).await?;
    Ok((live, PrefillHandoff { route: Some((control, events)), block_size, room }))
}

impl PrefillHandoff {
    /// Once the request has finished: registers its held KV under `request_id` and returns
    /// the `kv_transfer_params` of the answer; under SGLang's protocol, puts it in its room
    /// and returns once a decode server has read it (no params).
    pub async fn finish(
        mut self,
        pd: &Arc<PdState>,
        request_id: &str,
        prompt_tokens: usize,
    ) -> Result<Option<Value>, ApiError> {
        let events = &mut self.route.as_mut().expect("finished once").1;
        let timing = match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
            Ok(Some(HandoffEvent::SourceHeld { transfer_timing })) => transfer_timing,
            _ => return Err(ApiError::internal("the prefill finished without holding its KV")),
        };
        let (control, events) = self.route.take().expect("finished once");
        if let Some(room) = self.room {
            let held = Held { control, _events: events, block_ids: Vec::new(), timing };
            return finish_in_room(pd, room, held).await.map(|()| None);
        }
        // The held KV is keyed by an id this server makes unique: response ids come from the
        // client's X-Request-Id, and two prefills sharing one must never alias (the first's
        // blocks would be held forever). vLLM likewise suffixes its internal request ids.
        let request_id = format!("{request_id}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let request_id = request_id.as_str();
        let blocks = prompt_tokens.div_ceil(self.block_size.max(1)) as u64;
        let first = pd.next_block_id.fetch_add(blocks, Ordering::Relaxed);
        let block_ids: Vec<u64> = (first..first + blocks).collect();
        let params = json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_engine_id": pd.engine_id,
            "remote_block_ids": block_ids,
            "remote_host": pd.host,
            "remote_port": pd.port,
            "remote_request_id": request_id,
            "tp_size": 1,
        });
        pd.held
            .lock()
            .expect("held")
            .insert(request_id.to_string(), Held { control, _events: events, block_ids, timing });
        // vLLM frees KV no decode side read after its abort timeout.
        let (pd, id) = (pd.clone(), request_id.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(pd.abort_timeout).await;
            let expired = pd.held.lock().expect("held").remove(&id);
            if let Some(h) = expired {
                eprintln!(
                    "kv transfer: no decode side read prefill {id} within {:?}; its KV is freed",
                    pd.abort_timeout
                );
                let _ = h.control.release_source().await;
            }
        });
        Ok(Some(params))
    }
}

/// Puts a finished SGLang prefill's held KV in its room and waits until a decode server has
/// read it; frees it when none does within the session timeout (or the client leaves).
async fn finish_in_room(pd: &Arc<PdState>, room: u64, held: Held) -> Result<(), ApiError> {
    let rooms = pd.rooms.as_ref().expect("an SGLang prefill server has rooms");
    let (finished, serial) = match rooms.deliver(room, held) {
        Ok(delivered) => delivered,
        Err(held) => {
            let _ = held.control.release_source().await;
            return Err(ApiError::invalid_field(
                "bootstrap_room",
                format!("bootstrap_room: room {room} already holds a prefill"),
            ));
        }
    };
    let _withdraw = Withdraw { pd: pd.clone(), room, serial };
    match tokio::time::timeout(rooms.timeout, finished).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(ApiError {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!(
                "no decode server read bootstrap room {room} within {:?} (handoff_session_timeout_ms); \
                 the prefill's KV is freed",
                rooms.timeout
            ),
            param: None,
        }),
    }
}

/// The side channel's read request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadBody {
    remote_engine_id: String,
    remote_request_id: Option<String>,
    remote_block_ids: Vec<u64>,
    /// Prompt tokens the decode side lacks (`destination_missing` charges these).
    missing_tokens: usize,
}

/// `POST /mocker/kv_transfer/read`: the decode side reads a held prefill's KV. Answers once
/// the modelled transfer is over; the blocks are freed then, even if the reader is gone.
pub async fn read_handler(State(state): State<SideChannel>, request: Request) -> Result<Response, ApiError> {
    let Some(pd) = state.pd.clone() else {
        return Err(not_found("no KV connector here (start the server with --kv-transfer-config)".into()));
    };
    pd.check_secret(request.headers())?;
    let b: ReadBody = read_body(&state, request).await?;
    if b.remote_engine_id != pd.engine_id {
        // 421 Misdirected Request: the decode side reports a bad remote_engine_id as a 400.
        return Err(ApiError {
            status: StatusCode::MISDIRECTED_REQUEST,
            message: format!("read: engine {} is not this server's ({})", b.remote_engine_id, pd.engine_id),
            param: None,
        });
    }
    let held = {
        let mut table = pd.held.lock().expect("held");
        let key = match &b.remote_request_id {
            Some(id) => Some(id.clone()),
            None => table.iter().find(|(_, h)| h.block_ids == b.remote_block_ids).map(|(k, _)| k.clone()),
        };
        match key.and_then(|k| table.remove(&k)) {
            Some(h) if h.block_ids == b.remote_block_ids => h,
            Some(h) => {
                let ids = h.block_ids.clone();
                if let Some(id) = &b.remote_request_id {
                    table.insert(id.clone(), h);
                }
                return Err(not_found(format!(
                    "read: request holds blocks {ids:?}, not {:?}",
                    b.remote_block_ids
                )));
            }
            None => {
                return Err(not_found(
                    "read: no held prefill with these blocks (already read or expired)".into(),
                ))
            }
        }
    };
    transfer(held, b.missing_tokens, state.block_size, pd.abort_timeout, |_| {}).await
}

/// A 404 for a read that finds nothing to read.
fn not_found(message: String) -> ApiError {
    ApiError { status: StatusCode::NOT_FOUND, message, param: None }
}

/// The JSON body of a side-channel read.
async fn read_body<T: serde::de::DeserializeOwned>(
    state: &SideChannel,
    request: Request,
) -> Result<T, ApiError> {
    let bytes = crate::body::read(state.max_body_bytes, state.body_timeout, request).await?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("read: {e}")))
}

/// Models the transfer of `held`'s KV to a reader that lacks `missing_tokens`: waits the
/// modelled delay, frees the blocks, then calls `done` with the delay in ms. Spawned, so
/// the transfer ends and the blocks are freed even if the reader goes away. The answer
/// tells the reader the delay. A reader cannot lack more than the prompt's blocks (of
/// `block_size` tokens), and a transfer
/// longer than `limit` (the abort timeout, past which the reader has given up) would hold
/// the blocks for nothing: both are refused with a 400 and the blocks freed at once.
async fn transfer(
    held: Held,
    missing_tokens: usize,
    block_size: usize,
    limit: Duration,
    done: impl FnOnce(f64) + Send + 'static,
) -> Result<Response, ApiError> {
    let prompt = held.timing.full_prompt_tokens.div_ceil(block_size.max(1)) * block_size.max(1);
    let delay_ms = held.timing.delay_ms(Some(missing_tokens)).unwrap_or(0.0);
    let delay = Duration::try_from_secs_f64(delay_ms / 1000.0).ok().filter(|d| *d <= limit);
    let refusal = if missing_tokens > prompt {
        Some(format!(
            "missing_tokens: {missing_tokens} is more than the prompt's blocks hold ({prompt} tokens)"
        ))
    } else if delay.is_none() {
        Some(format!(
            "missing_tokens: the modelled transfer ({delay_ms} ms) is longer than the abort timeout ({limit:?}), \
             past which the reader has given up"
        ))
    } else {
        None
    };
    if let Some(message) = refusal {
        let _ = held.control.release_source().await;
        return Err(ApiError::invalid_field("missing_tokens", format!("read: {message}; the KV is freed")));
    }
    let delay = delay.unwrap_or_default();
    let transfer = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let _ = held.control.release_source().await;
        done(delay_ms);
    });
    // The headers go at once and name the modelled time; the body follows when the
    // transfer is over. A reader thus bounds its wait by the transfer it was promised,
    // and a peer that answers no headers is given up on quickly.
    let body = futures_util::stream::once(async move {
        let _ = transfer.await;
        Ok::<_, std::convert::Infallible>(json!({ "transfer_ms": delay_ms }).to_string())
    });
    let mut response = axum::body::Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("application/json"));
    if let Ok(v) = axum::http::HeaderValue::from_str(&format!("{delay_ms}")) {
        headers.insert(TRANSFER_MS_HEADER, v);
    }
    Ok(response)
}

/// How long a reader waits for a side-channel answer's headers beyond the prefill it
/// waits for: a peer that accepted the connection but sends nothing is given up on then.
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// What a reader allows for the body to arrive: the promised transfer time plus a margin,
/// never more than the abort timeout (a peer promising longer has held nothing that long).
fn read_body_timeout(transfer_ms: f64, abort_timeout: Duration) -> Duration {
    let promised = Duration::try_from_secs_f64(transfer_ms.max(0.0) / 1000.0).unwrap_or(Duration::MAX);
    promised.saturating_add(promised / 10).saturating_add(Duration::from_secs(2)).min(abort_timeout)
}

/// A decode server's read of a bootstrap room.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoomRead {
    bootstrap_room: u64,
    /// Prompt tokens the decode side lacks (`destination_missing` charges these).
    missing_tokens: usize,
    /// How long the reader waits for the room's prefill: its own session timeout, so each
    /// side waits at most its own `handoff_session_timeout_ms`.
    wait_ms: u64,
}

/// `POST /mocker/bootstrap/read` on a prefill server's bootstrap port: waits (at most the
/// shorter of the two sides' session timeouts) for the room's prefill, then answers once
/// the modelled transfer is over and the prefill's blocks are freed.
pub async fn bootstrap_read_handler(
    State(state): State<SideChannel>,
    request: Request,
) -> Result<Response, ApiError> {
    let Some(rooms) = state.pd.as_ref().and_then(|pd| pd.rooms.as_ref()) else {
        return Err(not_found("no bootstrap rooms here".into()));
    };
    // The bootstrap port has no middleware; a room's KV is the server's to guard all the same.
    if !crate::auth::authorized(state.api_key.as_ref(), request.headers()) {
        return Err(ApiError::unauthorized());
    }
    if let Some(pd) = &state.pd {
        pd.check_secret(request.headers())?;
    }
    let b: RoomRead = read_body(&state, request).await?;
    let taken = rooms.take(b.bootstrap_room).map_err(|m| ApiError {
        status: StatusCode::CONFLICT,
        message: format!("read: {m}"),
        param: None,
    })?;
    let (held, done) = match taken {
        Taken::Ready(handover) => handover,
        Taken::Wait(arrival) => {
            let wait = rooms.timeout.min(Duration::from_millis(b.wait_ms));
            match tokio::time::timeout(wait, arrival).await {
                Ok(Ok(handover)) => handover,
                _ => {
                    rooms.forget_reader(b.bootstrap_room);
                    return Err(not_found(format!(
                        "read: no prefill came to bootstrap room {} within {wait:?}",
                        b.bootstrap_room
                    )));
                }
            }
        }
    };
    let limit = state.pd.as_ref().map_or(DEFAULT_ABORT_TIMEOUT, |pd| pd.abort_timeout);
    transfer(held, b.missing_tokens, state.block_size, limit, move |delay_ms| {
        let _ = done.send(delay_ms);
    })
    .await
}

/// The side channel's abort request.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AbortBody {
    /// The prefill server's engine id.
    pub remote_engine_id: String,
    /// The prefill's request id (its answer's `remote_request_id`).
    pub remote_request_id: String,
}

/// `POST /mocker/kv_transfer/abort`: frees a held prefill's KV at once (a P/D front whose
/// decode step failed). 404 when nothing is held under that id.
pub async fn abort_handler(State(state): State<SideChannel>, request: Request) -> Result<Response, ApiError> {
    let Some(pd) = state.pd.clone() else {
        return Err(not_found("no KV connector here (start the server with --kv-transfer-config)".into()));
    };
    pd.check_secret(request.headers())?;
    let bytes = crate::body::read(state.max_body_bytes, state.body_timeout, request).await?;
    let b: AbortBody =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("abort: {e}")))?;
    if b.remote_engine_id != pd.engine_id {
        return Err(not_found(format!("abort: engine {} is not this server's", b.remote_engine_id)));
    }
    let held = pd.held.lock().expect("held").remove(&b.remote_request_id);
    match held {
        Some(h) => {
            let _ = h.control.release_source().await;
            Ok(StatusCode::OK.into_response())
        }
        None => Err(not_found(format!("abort: nothing held under {}", b.remote_request_id))),
    }
}

/// What the side-channel routes (`/mocker/kv_transfer/*`, the bootstrap port) need of their
/// server: its P/D state, KV block size, API key and body limits.
#[derive(Clone)]
pub struct SideChannel {
    /// The server's P/D state; `None` answers the routes 404.
    pub pd: Option<Arc<PdState>>,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The server's `--api-key`.
    pub api_key: Option<crate::auth::ApiKey>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Longest wait for a request body.
    pub body_timeout: Duration,
}

/// Where a decode request reads its prompt's KV.
#[derive(Debug, Clone, Copy)]
pub enum ReadFrom<'a> {
    /// vLLM's NIXL contract: the prefill answer's `kv_transfer_params`.
    Nixl(&'a RemotePrefill),
    /// SGLang's: the request's bootstrap room on the prefill server's bootstrap port.
    Room(&'a BootstrapRoom),
}

/// Submits `request` on `engine` as a decode request whose prompt KV `from` holds: the
/// stream yields tokens once the read is over. Falls back to computing the prompt here
/// when the read fails. Returns the stream and, when the KV was transferred, the modelled
/// transfer time in ms (answered in [`TRANSFER_MS_HEADER`]).
pub async fn start_decode(
    pd: &PdState,
    engine: &LiveEngine,
    request: CoreRequest,
    from: ReadFrom<'_>,
) -> Result<(LiveRequest, Option<f64>), ApiError> {
    // The peer is checked before anything is reserved: a refused one holds no blocks.
    let peer = match from {
        ReadFrom::Nixl(r) => pd.peers.resolve("kv_transfer_params.remote_host", &r.host, r.port).await?,
        ReadFrom::Room(b) => pd.peers.resolve("bootstrap_host", &b.host, b.port).await?,
    };
    let (control, mut events) = engine.register_handoff(HandoffId(uuid::Uuid::new_v4()))?;
    let (registration, live) = engine.prepare_request(request.clone())?;
    control.reserve_destination(registration).await?;
    let missing = match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
        Ok(Some(HandoffEvent::DestinationReserved { transferable_prompt_tokens })) => {
            transferable_prompt_tokens
        }
        _ => return Err(ApiError::unavailable("the decode engine could not reserve the prompt's blocks")),
    };
    let (url, body, timeout) = match from {
        ReadFrom::Nixl(remote) => {
            let body = ReadBody {
                remote_engine_id: remote.engine_id.clone(),
                remote_request_id: remote.request_id.clone(),
                remote_block_ids: remote.block_ids.clone(),
                missing_tokens: missing,
            };
            let url = format!("{}://{peer}/mocker/kv_transfer/read", pd.scheme);
            (url, serde_json::to_value(body).expect("plain JSON"), READ_HEADER_TIMEOUT)
        }
        ReadFrom::Room(b) => {
            let wait_ms = pd.session_timeout.as_millis().min(u64::MAX as u128) as u64;
            let body = RoomRead { bootstrap_room: b.room, missing_tokens: missing, wait_ms };
            let url = format!("{}://{peer}/mocker/bootstrap/read", pd.scheme);
            // The prefill server bounds the wait for its prefill by `wait_ms`; its answer's
            // headers follow, then the modelled transfer.
            (url, serde_json::to_value(body).expect("plain JSON"), pd.session_timeout + READ_HEADER_TIMEOUT)
        }
    };
    let mut call = pd.client.post(&url).json(&body);
    if let Some(key) = &pd.api_key {
        call = call.bearer_auth(key);
    }
    if let Some((_, secret)) = &pd.secret {
        call = call.header(SECRET_HEADER, secret);
    }
    let sent = match tokio::time::timeout(timeout, call.send()).await {
        Ok(answer) => answer.map_err(|e| format!("{url}: {}", crate::error::with_causes(&e))),
        Err(_) => Err(format!("{url}: no answer within {timeout:?}")),
    };
    let read: Result<f64, String> = match sent {
        Ok(r) if r.status().is_success() => {
            let promised = r
                .headers()
                .get(TRANSFER_MS_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|ms| ms.is_finite() && *ms >= 0.0);
            match promised {
                None => Err(format!("{url} answered without a {TRANSFER_MS_HEADER} header")),
                Some(ms) => {
                    match tokio::time::timeout(read_body_timeout(ms, pd.abort_timeout), r.json::<Value>())
                        .await
                    {
                        Ok(Ok(answer)) => Ok(answer["transfer_ms"].as_f64().unwrap_or(ms)),
                        Ok(Err(e)) => Err(format!("{url}: {e}")),
                        Err(_) => Err(format!("{url}: the promised {ms} ms transfer did not end in time")),
                    }
                }
            }
        }
        Ok(r) if r.status() == StatusCode::MISDIRECTED_REQUEST => {
            let _ = control.cancel_destination().await;
            let ReadFrom::Nixl(remote) = from else {
                return Err(ApiError::internal(format!("{url} answered 421")));
            };
            return Err(ApiError::invalid_field(
                "kv_transfer_params",
                format!(
                    "kv_transfer_params.remote_engine_id: {} is not the engine at {}:{}",
                    remote.engine_id, remote.host, remote.port
                ),
            ));
        }
        Ok(r) => {
            let status = r.status();
            let text = tokio::time::timeout(READ_HEADER_TIMEOUT, r.text()).await;
            Err(format!("{url} answered {status}: {}", text.ok().and_then(Result::ok).unwrap_or_default()))
        }
        Err(e) => Err(e),
    };
    match read {
        Ok(transfer_ms) => {
            control.activate_destination().await?;
            Ok((live, Some(transfer_ms)))
        }
        Err(why) => {
            eprintln!("kv transfer: cannot read the prompt's KV ({why}); computing the prompt here instead");
            pd.recomputes.inc();
            let _ = control.cancel_destination().await;
            drop(live);
            let live = engine.submit(CoreRequest { uuid: 0, ..request }).await?;
            Ok((live, None))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_waits_for_the_promise_but_never_past_the_abort_timeout() {
        let abort = Duration::from_secs(480);
        assert_eq!(read_body_timeout(1000.0, abort), Duration::from_millis(3100));
        assert_eq!(read_body_timeout(0.0, abort), Duration::from_secs(2));
        // A peer promising a year (or infinity, or garbage) is waited on no longer than 480 s.
        for promise in [3.15e10, f64::INFINITY, -5.0] {
            assert!(read_body_timeout(promise, abort) <= abort, "{promise}");
        }
    }
}
