//! The background threads: the publishing thread owns the ZMQ context and the PUB socket,
//! encodes batches, numbers them and keeps the replay buffer; the replay thread
//! ([`crate::replay`]) owns the ROUTER socket.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::guard;
use crate::publisher::{BatchPool, PublishError, Stats};
use crate::replay::{ReplayBuffer, ReplayService, SharedBuffer, REPLAY_SNDHWM};
use crate::wire::PendingBatch;

/// Messages queued per subscriber before PUB drops for it: vLLM's high-water mark.
const PUB_SNDHWM: i32 = 100_000;

/// What the TCP guard in front of the PUB port allows a peer: subscriptions are small, one
/// frame each; a subscriber more than 32 MiB behind is disconnected.
const PUB_GUARD: guard::Limits = guard::Limits {
    max_message_bytes: PUB_MAX_INBOUND_BYTES as u64,
    max_frames: 4,
    outbound: guard::Outbound::Disconnect(32 << 20),
    max_peers: 256,
};

/// The replay port's guard: a request is an empty delimiter and an 8-byte sequence number.
const REPLAY_GUARD: guard::Limits = guard::Limits {
    max_message_bytes: REPLAY_MAX_INBOUND_BYTES as u64,
    max_frames: 4,
    outbound: guard::Outbound::Backpressure(1 << 20),
    max_peers: 256,
};

/// Largest inbound message a PUB peer may send (subscriptions are topic prefixes); a peer
/// that announces a bigger one is disconnected before anything is allocated for it.
const PUB_MAX_INBOUND_BYTES: i64 = 64 * 1024;

/// Largest inbound message on the replay socket (a request frame is 8 bytes).
const REPLAY_MAX_INBOUND_BYTES: i64 = 4 * 1024;

/// Inbound messages queued per replay peer before libzmq stops reading from it.
const REPLAY_RCVHWM: i32 = 256;

/// A peer must finish the ZMTP handshake within this time or is disconnected.
const HANDSHAKE_MS: i32 = 10_000;

/// How long closing the PUB socket waits for queued messages to reach subscribers.
const PUB_LINGER_MS: i32 = 100;

/// Queue polling period while batches are flowing: the most a batch waits before it is sent.
const POLL_TICK: Duration = Duration::from_millis(1);

/// Sent batches kept for reuse by `publish`.
const POOL_CAPACITY: usize = 4;

/// Empty polls after which the worker parks until the next batch wakes it.
const PARK_AFTER_IDLE_TICKS: u32 = 100;

/// The in-process endpoint that tells the replay thread to stop.
const STOP_ENDPOINT: &str = "inproc://kv-events-replay-stop";

pub(crate) struct WorkerConfig {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: Bytes,
    pub dp_rank: u32,
    pub block_size: u32,
    pub replay_buffer_steps: usize,
}

/// Endpoints as actually bound.
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
}

type Ready = std::sync::mpsc::SyncSender<Result<Bound, PublishError>>;

/// The running replay thread and how to stop it.
struct Replay {
    stop: zmq::Socket,
    thread: JoinHandle<()>,
    guard: Option<guard::Guard>,
}

impl Replay {
    fn stop(self) {
        drop(self.guard);
        // The thread is parked in poll on the stop socket, so this wakes it at once.
        let _ = self.stop.send(&b""[..], zmq::DONTWAIT);
        let _ = self.thread.join();
    }
}

pub(crate) fn run(
    cfg: WorkerConfig,
    rx: mpsc::Receiver<PendingBatch>,
    stats: Arc<Stats>,
    pool: BatchPool,
    ready: Ready,
) {
    let context = zmq::Context::new();
    let (pub_socket, endpoint, pub_guard) = match bind_pub(&context, &cfg.endpoint) {
        Ok(bound) => bound,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let (buffer, replay, replay_endpoint) = match &cfg.replay_endpoint {
        None => (None, None, None),
        Some(ep) => {
            let buffer = Arc::new(Mutex::new(ReplayBuffer::new(cfg.replay_buffer_steps)));
            match start_replay(&context, ep, cfg.dp_rank, buffer.clone()) {
                Ok((replay, bound)) => (Some(buffer), Some(replay), Some(bound)),
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            }
        }
    };
    if ready.send(Ok(Bound { endpoint, replay_endpoint })).is_err() {
        if let Some(r) = replay {
            r.stop();
        }
        return;
    }
    let mut out = Outbound {
        pub_socket,
        topic: cfg.topic,
        dp_rank: cfg.dp_rank,
        block_size: cfg.block_size,
        seq: 0,
        last_len: 0,
        buffer,
        stats,
        pool,
    };
    drain(rx, &mut out);
    drop(pub_guard);
    if let Some(r) = replay {
        r.stop();
    }
    // Dropping the PUB socket lingers up to PUB_LINGER_MS for queued messages; dropping the
    // context then waits for both sockets to be closed.
    drop(out);
    drop(context);
}

/// Sends batches until the queue is closed and empty.
///
/// While batches keep coming the queue is polled on a short tick instead of waking this
/// thread per batch: waking it would cost the engine thread a syscall (and often a context
/// switch) in every `publish`. After a quiet spell the thread parks on the queue.
fn drain(mut rx: mpsc::Receiver<PendingBatch>, out: &mut Outbound) {
    let mut idle_ticks = 0;
    loop {
        let mut got = false;
        loop {
            match rx.try_recv() {
                Ok(batch) => {
                    out.send(batch);
                    got = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
        idle_ticks = if got { 0 } else { idle_ticks + 1 };
        if idle_ticks < PARK_AFTER_IDLE_TICKS {
            std::thread::sleep(POLL_TICK);
            continue;
        }
        match rx.blocking_recv() {
            Some(batch) => {
                out.send(batch);
                idle_ticks = 0;
            }
            None => return,
        }
    }
}

fn bind_error(endpoint: &str, e: zmq::Error) -> PublishError {
    PublishError::Bind { endpoint: endpoint.to_string(), message: e.to_string() }
}

/// Options every listening socket gets: a message-size cap enforced before allocation, a
/// handshake deadline, TCP keepalive (as vLLM's peers set), IPv6 addresses accepted.
fn harden(socket: &zmq::Socket, max_inbound: i64) -> zmq::Result<()> {
    socket.set_maxmsgsize(max_inbound)?;
    socket.set_handshake_ivl(HANDSHAKE_MS)?;
    socket.set_tcp_keepalive(1)?;
    socket.set_ipv6(true)
}

/// Binds `endpoint` and returns the endpoint as bound (with the actual port).
fn bind(socket: &zmq::Socket, endpoint: &str) -> Result<String, PublishError> {
    socket.bind(endpoint).map_err(|e| bind_error(endpoint, e))?;
    match socket.get_last_endpoint() {
        Ok(Ok(bound)) => Ok(bound),
        Ok(Err(_)) => Err(bind_error(endpoint, zmq::Error::EINVAL)),
        Err(e) => Err(bind_error(endpoint, e)),
    }
}

fn bind_pub(
    context: &zmq::Context,
    endpoint: &str,
) -> Result<(zmq::Socket, String, Option<guard::Guard>), PublishError> {
    let setup = || -> zmq::Result<zmq::Socket> {
        let socket = context.socket(zmq::PUB)?;
        harden(&socket, PUB_MAX_INBOUND_BYTES)?;
        socket.set_sndhwm(PUB_SNDHWM)?;
        socket.set_linger(PUB_LINGER_MS)?;
        Ok(socket)
    };
    let socket = setup().map_err(|e| bind_error(endpoint, e))?;
    let (bound, guard) = bind_guarded(&socket, endpoint, PUB_GUARD, "kv-pub")?;
    Ok((socket, bound, guard))
}

/// Binds `socket` behind a [`guard`] when `endpoint` is TCP (libzmq on loopback, the guard
/// on the endpoint), else directly. Returns the public endpoint as bound.
fn bind_guarded(
    socket: &zmq::Socket,
    endpoint: &str,
    limits: guard::Limits,
    name: &str,
) -> Result<(String, Option<guard::Guard>), PublishError> {
    let Some(public) = guard::tcp_address(endpoint) else {
        return Ok((bind(socket, endpoint)?, None));
    };
    let internal = bind(socket, "tcp://127.0.0.1:0")?;
    let internal: std::net::SocketAddr = internal
        .trim_start_matches("tcp://")
        .parse()
        .map_err(|_| bind_error(endpoint, zmq::Error::EINVAL))?;
    let guard = guard::start(&public, internal, limits, name)
        .map_err(|e| PublishError::Bind { endpoint: endpoint.to_string(), message: e.to_string() })?;
    Ok((guard.endpoint(), Some(guard)))
}

/// Binds the ROUTER and starts the replay thread on it.
fn start_replay(
    context: &zmq::Context,
    endpoint: &str,
    dp_rank: u32,
    buffer: SharedBuffer,
) -> Result<(Replay, String), PublishError> {
    let setup = || -> zmq::Result<(zmq::Socket, zmq::Socket, zmq::Socket)> {
        let router = context.socket(zmq::ROUTER)?;
        harden(&router, REPLAY_MAX_INBOUND_BYTES)?;
        // Mandatory: a full or vanished client is reported (EAGAIN / EHOSTUNREACH) instead
        // of its replies being dropped silently, so the service can come back to it.
        router.set_router_mandatory(true)?;
        router.set_sndhwm(REPLAY_SNDHWM)?;
        router.set_rcvhwm(REPLAY_RCVHWM)?;
        router.set_linger(0)?;
        let stop_rx = context.socket(zmq::PAIR)?;
        stop_rx.bind(STOP_ENDPOINT)?;
        let stop_tx = context.socket(zmq::PAIR)?;
        stop_tx.set_linger(0)?;
        stop_tx.connect(STOP_ENDPOINT)?;
        Ok((router, stop_rx, stop_tx))
    };
    let (router, stop_rx, stop_tx) = setup().map_err(|e| bind_error(endpoint, e))?;
    let (bound, guard) = bind_guarded(&router, endpoint, REPLAY_GUARD, "kv-replay")?;
    let service = ReplayService::new(router, stop_rx, buffer);
    let thread = std::thread::Builder::new()
        .name(format!("kv-replay-dp{dp_rank}"))
        .spawn(move || service.run())
        .map_err(|e| PublishError::Thread(e.to_string()))?;
    Ok((Replay { stop: stop_tx, thread, guard }, bound))
}

/// The PUB side: numbering, encoding, sending and keeping batches for replay.
struct Outbound {
    pub_socket: zmq::Socket,
    topic: Bytes,
    dp_rank: u32,
    block_size: u32,
    seq: u64,
    last_len: usize,
    buffer: Option<SharedBuffer>,
    stats: Arc<Stats>,
    pool: BatchPool,
}

impl Outbound {
    fn send(&mut self, batch: PendingBatch) {
        let mut encoded = Vec::with_capacity(self.last_len);
        batch.encode(self.dp_rank, self.block_size, &mut encoded);
        self.last_len = encoded.len();
        let payload = Bytes::from(encoded);
        let frames: [&[u8]; 3] = [&self.topic, &self.seq.to_be_bytes(), &payload];
        // PUB never waits: a subscriber whose queue is at the high-water mark misses this
        // batch (replay covers it), and DONTWAIT makes sure nothing else can block here.
        let _ = self.pub_socket.send_multipart(frames, zmq::DONTWAIT);
        if let Some(buffer) = &self.buffer {
            buffer.lock().expect("replay buffer lock").push(self.seq, payload);
        }
        self.seq += 1;
        self.stats.published.store(self.seq, Ordering::Relaxed);
        if let Ok(mut pool) = self.pool.lock() {
            if pool.len() < POOL_CAPACITY {
                pool.push(batch);
            }
        }
    }
}
