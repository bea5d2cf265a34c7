//! The engine-facing handle: a bounded, never-blocking hand-off to the background thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use mocker_core::events::KvEvent;
use tokio::sync::mpsc;

use crate::wire::PendingBatch;
use crate::worker::{self, Bound, WorkerConfig};
use crate::PublisherOptions;

/// Why a publisher could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// An option is out of range.
    #[error("{field}: {message}")]
    InvalidOption {
        /// The offending [`PublisherOptions`] field.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A socket could not bind its endpoint (in use, bad address...).
    #[error("cannot bind {endpoint}: {message}")]
    Bind {
        /// The endpoint after DP-rank offsetting.
        endpoint: String,
        /// The socket layer's reason.
        message: String,
    },
    /// The background thread or its runtime could not be started.
    #[error("cannot start the KV event publisher thread: {0}")]
    Thread(String),
}

/// Final counters of a publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent on the PUB socket.
    pub published_batches: u64,
    /// Batches dropped because the queue was full.
    pub dropped_batches: u64,
}

/// Sent batches handed back by the background thread for reuse.
pub(crate) type BatchPool = Arc<Mutex<Vec<PendingBatch>>>;

/// Counters shared with the background thread.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub published: AtomicU64,
    pub dropped: AtomicU64,
}

/// Publishes KV events over ZMQ as vLLM does: one [`publish`](Self::publish) call per
/// forward pass becomes one `KVEventBatch` on a PUB socket, numbered from 0, and the last
/// batches are kept for replay on an optional ROUTER socket.
///
/// `publish` only copies the events into a bounded queue; a background thread encodes and
/// sends them, so a slow or absent subscriber never slows the engine. When the queue is
/// full the batch is dropped and counted ([`dropped_batches`](Self::dropped_batches)); a
/// dropped batch takes no sequence number, so subscribers cannot detect it (vLLM blocks
/// instead). While batches flow the thread polls the queue every millisecond rather than
/// being woken per batch, so a batch may wait up to about a millisecond before it is sent.
///
/// Every batch carries the publisher's `dp_rank`. `Stored` events should carry token ids
/// (the engine's `emit_kv_token_ids`): subscribers such as Dynamo's indexer recompute block
/// identities from them, and blocks without tokens are sent with none.
#[derive(Debug)]
pub struct KvEventPublisher {
    tx: Option<mpsc::Sender<PendingBatch>>,
    pool: BatchPool,
    stats: Arc<Stats>,
    thread: Option<JoinHandle<()>>,
    bound: Bound,
}

impl KvEventPublisher {
    /// Binds the sockets and starts the background thread; returns once both are bound.
    pub fn start(options: PublisherOptions) -> Result<Self, PublishError> {
        let resolved = options.resolve()?;
        let (tx, rx) = mpsc::channel(options.queue_capacity);
        let stats = Arc::new(Stats::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let config = WorkerConfig {
            endpoint: resolved.endpoint,
            replay_endpoint: resolved.replay_endpoint,
            topic: options.topic.into_bytes().into(),
            dp_rank: options.dp_rank,
            block_size: resolved.block_size,
            replay_buffer_steps: options.replay_buffer_steps,
        };
        let pool = BatchPool::default();
        let (worker_stats, worker_pool) = (stats.clone(), pool.clone());
        let thread = std::thread::Builder::new()
            .name(format!("kv-events-dp{}", options.dp_rank))
            .spawn(move || worker::run(config, rx, worker_stats, worker_pool, ready_tx))
            .map_err(|e| PublishError::Thread(e.to_string()))?;
        let ready = ready_rx.recv();
        match ready {
            Ok(Ok(bound)) => Ok(Self { tx: Some(tx), pool, stats, thread: Some(thread), bound }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(PublishError::Thread("the publisher thread exited during start-up".into()))
            }
        }
    }

    /// Hands one forward pass's events over for publication as one batch; never blocks.
    /// A pass without events publishes nothing (as vLLM). Batches are stamped with the
    /// current wall time.
    pub fn publish(&self, events: &[KvEvent]) {
        if events.is_empty() {
            return;
        }
        let Some(tx) = &self.tx else { return };
        // Reserve first so a full queue costs no copy.
        match tx.try_reserve() {
            Ok(permit) => {
                // A recycled batch keeps its buffers warm: no allocation or page fault here.
                let mut batch = self.pool.lock().ok().and_then(|mut p| p.pop()).unwrap_or_default();
                batch.refill(wall_time_secs(), events);
                permit.send(batch);
            }
            Err(_) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Batches dropped because the queue was full (or the background thread had stopped).
    pub fn dropped_batches(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Batches sent on the PUB socket so far; also the next sequence number.
    pub fn published_batches(&self) -> u64 {
        self.stats.published.load(Ordering::Relaxed)
    }

    /// The PUB endpoint as bound (`tcp://HOST:PORT`, with the actual port).
    pub fn endpoint(&self) -> &str {
        &self.bound.endpoint
    }

    /// The ROUTER replay endpoint as bound, when replay is on.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.bound.replay_endpoint.as_deref()
    }

    /// Sends what is queued, then closes the sockets and joins the background thread;
    /// returns the final counters.
    pub fn shutdown(mut self) -> PublisherStats {
        self.stop();
        PublisherStats {
            published_batches: self.published_batches(),
            dropped_batches: self.dropped_batches(),
        }
    }

    fn stop(&mut self) {
        // Closing the queue lets the worker drain it and exit.
        self.tx = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wall_time_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mocker_core::events::KvEventData;

    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        // No worker drains this queue, so it stays full after two batches.
        let (tx, mut rx) = mpsc::channel(2);
        let publisher = KvEventPublisher {
            tx: Some(tx),
            pool: BatchPool::default(),
            stats: Arc::new(Stats::default()),
            thread: None,
            bound: Bound { endpoint: String::new(), replay_endpoint: None },
        };
        let batch = |id| {
            [KvEvent { event_id: id, dp_rank: 0, data: KvEventData::Removed { block_hashes: vec![id] } }]
        };
        publisher.publish(&[]);
        for id in 0..5 {
            publisher.publish(&batch(id));
        }
        assert_eq!(publisher.dropped_batches(), 3);
        let first = rx.try_recv().expect("first batch queued");
        assert_eq!(rx.try_recv().expect("second batch queued").len(), 1);
        assert!(rx.try_recv().is_err(), "the empty pass and the dropped batches are not queued");
        let want = PendingBatch::new(0.0, &batch(0));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        first.encode(0, 16, &mut a);
        want.encode(0, 16, &mut b);
        assert_eq!(a[10..], b[10..], "the queued batch is the first one published (ts aside)");
    }
}
