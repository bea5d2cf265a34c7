//! `mocker replay --mode online`: the offline workloads submitted to live engines on the
//! wall clock, with the offline report.
//!
//! Each worker is a [`LiveEngine`] (its own actor sleeping the modelled pass durations on
//! tokio's clock). The speedup ratio is applied exactly once, by the core, to pass durations;
//! workload arrival times are on the same timeline as offline replay, and tokens are stamped
//! with the modelled pass-end time (`sim_time_ns`), so the report measures the same
//! quantities as offline and the two agree up to when live clients reach a pass boundary.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use mocker_core::Request;
use mocker_live::{LiveEngine, LiveError, LiveOptions, LiveRequest, ObservedAdmission, OutputSignal};
use mocker_replay::collector::{Collector, RecordId};
use mocker_replay::feed::{FeedOptions, PlannedSession, PlannedTurn, PromptHashing, SessionFeed};
use mocker_replay::report::Summary;
use mocker_replay::{ReplayError, ReplayOptions, ReplayOutcome};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Why an online replay failed.
#[derive(Debug, thiserror::Error)]
pub enum OnlineError {
    /// The options are invalid (same checks as offline replay).
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A live engine failed.
    #[error(transparent)]
    Live(#[from] LiveError),
    /// The async runtime could not be built.
    #[error("cannot start the online replay runtime: {0}")]
    Runtime(String),
}

/// Runs `options` online on a fresh single-threaded tokio runtime (the CLI entry point).
pub fn run_online(options: &ReplayOptions) -> Result<ReplayOutcome, OnlineError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| OnlineError::Runtime(e.to_string()))?;
    rt.block_on(replay_online(options))
}

/// One live request of the replay, owned by the driver.
struct InFlight {
    stream: LiveRequest,
    record: RecordId,
    session: u32,
    worker: usize,
    last_ns: u64,
}

type Next = Pin<Box<dyn Future<Output = (Option<OutputSignal>, InFlight)>>>;
type Ack = Pin<Box<dyn Future<Output = Result<(), LiveError>>>>;

fn next(mut f: InFlight) -> Next {
    Box::pin(async move { (f.stream.recv().await, f) })
}

/// Runs `options` online on the current tokio runtime (usable under paused time in tests).
pub async fn replay_online(options: &ReplayOptions) -> Result<ReplayOutcome, OnlineError> {
    options.validate("online")?;
    if options.router != mocker_replay::RouterMode::RoundRobin {
        return Err(ReplayError::Invalid {
            field: "router",
            message: "online replay places requests round-robin only; use offline mode for --router kv"
                .into(),
        }
        .into());
    }
    if options.max_sim_time_ms.is_some() {
        return Err(ReplayError::Invalid {
            field: "max_sim_time_seconds",
            message: "is supported in offline mode only".into(),
        }
        .into());
    }
    // Validation refused disaggregated clusters: the entry pool is the aggregated one.
    let pool = options.cluster.entry();
    let engine_config = &pool.launch.engine;
    let (adm_tx, mut adm_rx) = mpsc::unbounded_channel::<ObservedAdmission>();
    let mut workers = Vec::with_capacity(pool.workers);
    for _ in 0..pool.workers {
        let live = LiveOptions {
            buffering: mocker_live::OutputBuffering::FullResponse,
            admissions: Some(adm_tx.clone()),
            ..Default::default()
        };
        workers.push(LiveEngine::start(engine_config.clone(), live)?);
    }
    drop(adm_tx);
    let wall = std::time::Instant::now();
    let epoch = workers[0].started_at();
    // Offsets of each worker's simulated clock from the driver's.
    let offsets: Vec<u64> = workers.iter().map(|w| (w.started_at() - epoch).as_nanos() as u64).collect();

    let mut d = Driver {
        workers: &workers,
        epoch,
        feed: SessionFeed::new(
            &options.workload,
            FeedOptions {
                block_size: engine_config.block_size,
                hashing: if engine_config.enable_prefix_caching {
                    PromptHashing::Sequence
                } else {
                    PromptHashing::Off
                },
                // Live engines publish every block's KV events.
                private_tails: false,
                tokenless: false,
            },
        ),
        sessions: Vec::new(),
        free_sessions: Vec::new(),
        active_sessions: 0,
        collector: Collector::new(),
        records: FxHashMap::default(),
        concurrency: options.workload.concurrency(),
        next_worker: 0,
        speedup: options.arrival_speedup_ratio,
        due: BinaryHeap::new(),
        due_seq: 0,
        pending: FuturesUnordered::new(),
        acks: FuturesUnordered::new(),
        frontend: Duration::from_nanos(mocker_core::timing::scaled_nanos(
            pool.launch.hardware.frontend_latency_ms.unwrap_or(0.0),
            engine_config.speedup_ratio,
        )),
    };
    let result = d.run(&offsets, &mut adm_rx).await;
    let mut committed = 0;
    for w in &workers {
        committed += w.metrics().borrow().prompt_tokens_computed_total;
    }
    for w in &workers {
        w.shutdown().await?;
    }
    result?;
    let wall_ms = wall.elapsed().as_secs_f64() * 1e3;
    let Driver { collector, .. } = d;
    let mut inputs = collector.finish();
    let duration_s = (inputs.duration_ms / 1000.0).max(1e-9);
    inputs.committed_prefill_tokens = committed;
    inputs.wall_time_ms = wall_ms;
    inputs.decode_worker_seconds = pool.workers as f64 * duration_s;
    inputs.decode_gpus_per_worker = (pool.launch.tensor_parallel_size * pool.launch.dp_size) as u64;
    let mut summary = Summary::from_inputs(inputs);
    summary.kv_eviction_policy = engine_config.eviction_policy.as_str().to_string();
    Ok(ReplayOutcome { summary, worker_tokens: Vec::new(), lifecycle_operations: Vec::new() })
}

struct Driver<'a> {
    workers: &'a [LiveEngine],
    epoch: Instant,
    feed: SessionFeed,
    sessions: Vec<Option<VecDeque<PlannedTurn>>>,
    free_sessions: Vec<u32>,
    active_sessions: usize,
    collector: Collector,
    /// Client id -> record, for admissions (removed at completion).
    records: FxHashMap<u128, RecordId>,
    concurrency: Option<usize>,
    next_worker: usize,
    /// Arrival speedup ratio: open-loop first arrivals are divided by it, as the reference
    /// does (engine pass times are scaled separately, by the engine's own speedup_ratio).
    speedup: f64,
    /// Turns due at a future time: (due ns, tie-break, session).
    due: BinaryHeap<Reverse<(u64, u64, u32)>>,
    due_seq: u64,
    pending: FuturesUnordered<Next>,
    /// Submissions sent but not yet acknowledged: turns due together are all sent before
    /// the driver yields, so the engine applies them at one boundary, as offline replay.
    acks: FuturesUnordered<Ack>,
    /// API-server time before a request reaches its engine (`frontend_latency_ms`).
    frontend: Duration,
}

impl Driver<'_> {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    async fn run(
        &mut self,
        offsets: &[u64],
        adm: &mut mpsc::UnboundedReceiver<ObservedAdmission>,
    ) -> Result<(), OnlineError> {
        if let Some(c) = self.concurrency {
            while self.active_sessions < c {
                let Some(s) = self.feed.start_session() else { break };
                let sid = self.start(s);
                let now = self.now_ns();
                self.dispatch(sid, now).await?;
            }
        }
        loop {
            self.release_due().await?;
            if self.pending.is_empty()
                && self.acks.is_empty()
                && self.due.is_empty()
                && self.feed.sessions_remaining() == 0
            {
                return Ok(());
            }
            let next_due = self.next_due_ns();
            let sleep = async {
                match next_due {
                    Some(t) => tokio::time::sleep_until(self.epoch + Duration::from_nanos(t)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                Some(ack) = self.acks.next() => ack?,
                Some((signal, f)) = self.pending.next() => {
                    // Admissions are sent at pass start, before any output of that pass.
                    while let Ok(a) = adm.try_recv() {
                        if let Some(&rec) = self.records.get(&a.uuid.as_u128()) {
                            let t = self.now_ns();
                            self.collector.on_admission(rec, a.reused_input_tokens as u32, t);
                        }
                    }
                    self.on_signal(signal, f, offsets).await?;
                }
                _ = sleep => {}
            }
        }
    }

    fn next_due_ns(&mut self) -> Option<u64> {
        let delayed = self.due.peek().map(|Reverse((t, _, _))| *t);
        let arrival = if self.concurrency.is_none() {
            self.feed.next_arrival_ms().map(|ms| (ms / self.speedup * 1e6).round() as u64)
        } else {
            None
        };
        [delayed, arrival].into_iter().flatten().min()
    }

    fn start(&mut self, s: PlannedSession) -> u32 {
        self.active_sessions += 1;
        match self.free_sessions.pop() {
            Some(sid) => {
                self.sessions[sid as usize] = Some(s.turns);
                sid
            }
            None => {
                self.sessions.push(Some(s.turns));
                (self.sessions.len() - 1) as u32
            }
        }
    }

    fn end(&mut self, sid: u32) {
        self.sessions[sid as usize] = None;
        self.free_sessions.push(sid);
        self.active_sessions -= 1;
    }

    /// Releases delayed turns and open-loop arrivals that are due.
    async fn release_due(&mut self) -> Result<(), OnlineError> {
        let now = self.now_ns();
        while let Some(&Reverse((t, _, sid))) = self.due.peek() {
            if t > now {
                break;
            }
            self.due.pop();
            self.dispatch(sid, t).await?;
        }
        if self.concurrency.is_none() {
            while let Some(at) = self.feed.next_arrival_ms() {
                let at = (at / self.speedup * 1e6).round() as u64;
                if at > now {
                    break;
                }
                let s = self.feed.start_session().expect("a session was peeked");
                let sid = self.start(s);
                self.dispatch(sid, at).await?;
            }
        }
        Ok(())
    }

    /// Submits the session's next turn, arriving at `arrival_ns`, placed round-robin.
    async fn dispatch(&mut self, sid: u32, arrival_ns: u64) -> Result<(), OnlineError> {
        let Some(turn) = self.sessions[sid as usize].as_mut().and_then(VecDeque::pop_front) else {
            self.end(sid);
            return Ok(());
        };
        let record = self.collector.on_arrival(arrival_ns, turn.tokens.len());
        let worker = self.next_worker;
        self.next_worker = (self.next_worker + 1) % self.workers.len();
        let (registration, stream) = self.workers[worker].prepare_request(Request {
            uuid: turn.uuid,
            tokens: turn.tokens,
            max_output_tokens: turn.max_output_tokens,
            output_token_ids: None,
            block_hashes: turn.block_hashes,
            shareable_blocks: None,
            prompt_len: None,
            lora: None,
        })?;
        let engine = self.workers[worker].clone();
        let frontend = self.frontend;
        self.acks.push(Box::pin(async move {
            if !frontend.is_zero() {
                tokio::time::sleep(frontend).await;
            }
            engine.submit_prepared(registration).await
        }));
        self.records.insert(stream.id().as_u128(), record);
        self.pending.push(next(InFlight { stream, record, session: sid, worker, last_ns: 0 }));
        Ok(())
    }

    async fn on_signal(
        &mut self,
        signal: Option<OutputSignal>,
        mut f: InFlight,
        offsets: &[u64],
    ) -> Result<(), OnlineError> {
        let Some(o) = signal else {
            // The stream ended without a terminal: the engine stopped.
            return Err(LiveError::NotRunning.into());
        };
        let t = o.sim_time_ns + offsets[f.worker];
        if o.rejected {
            self.collector.on_rejected(f.record, t);
        } else if o.token_id.is_some() {
            let itl = if o.index == 0 { 0 } else { t - f.last_ns };
            self.collector.on_token(f.record, t, o.index, itl);
            f.last_ns = t;
        }
        if !o.completed {
            self.pending.push(next(f));
            return Ok(());
        }
        if !o.rejected {
            self.collector.on_complete(f.record, t);
        }
        self.records.remove(&f.stream.id().as_u128());
        let sid = f.session;
        let delay = self.sessions[sid as usize].as_ref().and_then(|s| s.front()).map(|t| t.delay_ms);
        if let Some(d) = delay.filter(|&d| d > 0.0) {
            self.due_seq += 1;
            self.due.push(Reverse((t + (d / self.speedup * 1e6).round() as u64, self.due_seq, sid)));
        } else if delay.is_some() {
            self.dispatch(sid, t).await?;
        } else {
            self.end(sid);
            if let Some(c) = self.concurrency {
                while self.active_sessions < c {
                    let Some(s) = self.feed.start_session() else { break };
                    let sid = self.start(s);
                    self.dispatch(sid, t).await?;
                }
            }
        }
        Ok(())
    }
}
