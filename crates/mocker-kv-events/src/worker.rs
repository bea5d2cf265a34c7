//! The background thread: owns the sockets, encodes batches, numbers them, keeps the replay
//! buffer and answers replay requests.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{
    PubSocket, RouterRecvHalf, RouterSendHalf, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage,
};

use crate::publisher::{BatchPool, PublishError, Stats};
use crate::wire::PendingBatch;

/// Sequence value of the replay end marker: -1 as a big-endian i64, as vLLM sends it.
pub const REPLAY_END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// How long the worker keeps running after its queue closes, so the socket tasks can write
/// the last messages out before the sockets close.
const LINGER: Duration = Duration::from_millis(50);

/// Queue polling period while batches are flowing: the most a batch waits before it is sent.
const POLL_TICK: Duration = Duration::from_millis(1);

/// Sent batches kept for reuse by `publish`.
const POOL_CAPACITY: usize = 4;

/// Empty polls after which the worker parks until the next batch wakes it.
const PARK_AFTER_IDLE_TICKS: u32 = 100;

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

/// The last published batches, oldest first.
struct ReplayBuffer {
    entries: VecDeque<(u64, Bytes)>,
    capacity: usize,
}

impl ReplayBuffer {
    fn push(&mut self, seq: u64, payload: Bytes) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back((seq, payload));
    }

    /// Every buffered batch with a sequence number of at least `start`.
    fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        let first = self.entries.partition_point(|(s, _)| *s < start);
        self.entries.range(first..).cloned().collect()
    }
}

pub(crate) fn run(
    cfg: WorkerConfig,
    rx: mpsc::Receiver<PendingBatch>,
    stats: Arc<Stats>,
    pool: BatchPool,
    ready: Ready,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(PublishError::Thread(e.to_string())));
            return;
        }
    };
    runtime.block_on(serve(cfg, rx, stats, pool, ready));
}

async fn serve(
    cfg: WorkerConfig,
    mut rx: mpsc::Receiver<PendingBatch>,
    stats: Arc<Stats>,
    pool: BatchPool,
    ready: Ready,
) {
    let bind_err = |endpoint: &str, e: zeromq::ZmqError| PublishError::Bind {
        endpoint: endpoint.to_string(),
        message: e.to_string(),
    };
    let mut pub_socket = PubSocket::new();
    let endpoint = match pub_socket.bind(&cfg.endpoint).await {
        Ok(ep) => ep.to_string(),
        Err(e) => {
            let _ = ready.send(Err(bind_err(&cfg.endpoint, e)));
            return;
        }
    };
    let mut replay = None;
    let mut replay_endpoint = None;
    if let Some(ep) = &cfg.replay_endpoint {
        let mut router = RouterSocket::new();
        match router.bind(ep).await {
            Ok(bound) => replay_endpoint = Some(bound.to_string()),
            Err(e) => {
                let _ = ready.send(Err(bind_err(ep, e)));
                return;
            }
        }
        replay = Some(router);
    }
    if ready.send(Ok(Bound { endpoint, replay_endpoint })).is_err() {
        return;
    }

    let buffer = replay.map(|router| {
        let buffer = Arc::new(Mutex::new(ReplayBuffer {
            entries: VecDeque::with_capacity(cfg.replay_buffer_steps.min(1 << 16)),
            capacity: cfg.replay_buffer_steps,
        }));
        let (send, recv) = router.split();
        // Replays run beside live publishing, so a client that reads slowly delays only
        // its own replay.
        tokio::spawn(serve_replays(send, recv, buffer.clone()));
        buffer
    });

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
    // While batches keep coming, poll the queue on a short tick instead of being woken per
    // batch: waking this thread would cost the engine thread a syscall (and often a context
    // switch) in every `publish`. After a quiet spell, park on the queue until the next one.
    let mut idle_ticks = 0;
    loop {
        let mut got = false;
        loop {
            match rx.try_recv() {
                Ok(batch) => {
                    out.send(batch).await;
                    got = true;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    tokio::time::sleep(LINGER).await;
                    return;
                }
            }
        }
        idle_ticks = if got { 0 } else { idle_ticks + 1 };
        if idle_ticks < PARK_AFTER_IDLE_TICKS {
            tokio::time::sleep(POLL_TICK).await;
            continue;
        }
        match rx.recv().await {
            Some(batch) => {
                out.send(batch).await;
                idle_ticks = 0;
            }
            None => {
                tokio::time::sleep(LINGER).await;
                return;
            }
        }
    }
}

/// The PUB side: numbering, encoding, sending and keeping batches for replay.
struct Outbound {
    pub_socket: PubSocket,
    topic: Bytes,
    dp_rank: u32,
    block_size: u32,
    seq: u64,
    last_len: usize,
    buffer: Option<Arc<Mutex<ReplayBuffer>>>,
    stats: Arc<Stats>,
    pool: BatchPool,
}

impl Outbound {
    async fn send(&mut self, batch: PendingBatch) {
        let mut encoded = Vec::with_capacity(self.last_len);
        batch.encode(self.dp_rank, self.block_size, &mut encoded);
        self.last_len = encoded.len();
        let payload = Bytes::from(encoded);
        let seq = Bytes::copy_from_slice(&self.seq.to_be_bytes());
        let message =
            ZmqMessage::try_from(vec![self.topic.clone(), seq, payload.clone()]).expect("three frames");
        // PUB never waits for subscribers (it drops for slow ones), so this returns at once;
        // an error would only mean no peer got it, which replay covers.
        let _ = self.pub_socket.send(message).await;
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

/// Answers `[identity, empty, start_seq u64 BE]` with `[identity, empty, seq, payload]` for
/// every buffered batch from `start_seq` on, then `[identity, empty, -1 i64 BE, empty]`.
/// Malformed requests are ignored, as vLLM does.
async fn serve_replays(mut send: RouterSendHalf, mut recv: RouterRecvHalf, buffer: Arc<Mutex<ReplayBuffer>>) {
    loop {
        let request = match recv.recv().await {
            Ok(m) => m.into_vec(),
            Err(_) => {
                // A peer vanished mid-message; do not spin if that repeats.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let [identity, _delimiter, start] = <[Bytes; 3]>::try_from(request).unwrap_or_default();
        let Ok(start) = <[u8; 8]>::try_from(&start[..]) else { continue };
        let entries = buffer.lock().expect("replay buffer lock").since(u64::from_be_bytes(start));
        let reply = |seq: Bytes, payload: Bytes| {
            ZmqMessage::try_from(vec![identity.clone(), Bytes::new(), seq, payload]).expect("four frames")
        };
        let mut delivered = true;
        for (seq, payload) in entries {
            if send.send(reply(Bytes::copy_from_slice(&seq.to_be_bytes()), payload)).await.is_err() {
                delivered = false;
                break;
            }
        }
        if delivered {
            let _ = send.send(reply(Bytes::from_static(&REPLAY_END_SEQ), Bytes::new())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_buffer_keeps_the_last_batches_and_serves_from_a_sequence() {
        let mut b = ReplayBuffer { entries: VecDeque::new(), capacity: 3 };
        for s in 0..5u64 {
            b.push(s, Bytes::from(vec![s as u8]));
        }
        let seqs = |v: Vec<(u64, Bytes)>| v.into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(seqs(b.since(0)), vec![2, 3, 4]);
        assert_eq!(seqs(b.since(3)), vec![3, 4]);
        assert_eq!(seqs(b.since(5)), Vec::<u64>::new());
        assert_eq!(b.since(4)[0].1, Bytes::from(vec![4u8]));
    }
}
