//! The offline discrete-event loop: W engines on one simulated clock that jumps from event
//! to event (arrivals, pass ends, delayed turns) and never sleeps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use mocker_core::config::LaunchConfig;
use mocker_core::{Engine, EngineError, EngineOptions, Request};

use crate::collector::{Collector, RecordId};
use crate::feed::{PlannedSession, PlannedTurn, SessionFeed};
use crate::report::Summary;
use crate::workload::{Load, SyntheticWorkload, WorkloadError};

/// What an offline replay runs.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Engine configuration shared by every worker.
    pub launch: LaunchConfig,
    /// Workers (engines), requests placed round-robin.
    pub num_workers: usize,
    /// The workload.
    pub workload: SyntheticWorkload,
    /// First-turn arrival times and inter-turn delays are divided by this (finite, > 0).
    pub arrival_speedup_ratio: f64,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            launch: LaunchConfig::default(),
            num_workers: 1,
            workload: SyntheticWorkload::default(),
            arrival_speedup_ratio: 1.0,
        }
    }
}

impl ReplayOptions {
    /// Checks the options every replay mode shares (workload, workers, dp size, speedup).
    pub fn validate(&self, mode: &str) -> Result<(), ReplayError> {
        self.workload.validate()?;
        if self.num_workers == 0 {
            return Err(ReplayError::Invalid {
                field: "num_workers",
                message: "must be at least 1 (got 0)".into(),
            });
        }
        if self.launch.dp_size != 1 {
            return Err(ReplayError::Invalid {
                field: "dp_size",
                message: format!("{mode} replay supports dp_size 1 only (got {})", self.launch.dp_size),
            });
        }
        let r = self.arrival_speedup_ratio;
        if !(r.is_finite() && r > 0.0) {
            return Err(ReplayError::Invalid {
                field: "arrival_speedup_ratio",
                message: format!("must be a finite number > 0 (got {r})"),
            });
        }
        Ok(())
    }

    /// Scheduled arrival `ms` on the sped-up timeline, in ns.
    pub fn scaled_ns(&self, ms: f64) -> u64 {
        ms_to_ns(ms / self.arrival_speedup_ratio)
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A workload parameter is out of range.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The engine could not be built or refused a request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Options that are valid alone but not together, or not supported.
    #[error("{field}: {message}")]
    Invalid {
        /// The offending option.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The simulation cannot make progress.
    #[error("offline replay reached a dead end with {0} in-flight requests remaining")]
    DeadEnd(usize),
}

/// A finished replay.
#[derive(Debug, Clone)]
pub struct ReplayOutcome {
    /// The report's summary (`.summary` of the reference).
    pub summary: Summary,
}

struct Worker {
    engine: Engine,
    /// End of the pass in flight, with its start order for ties.
    busy: Option<(u64, u64)>,
    /// Collector record and session of the request in each engine slot.
    owners: Vec<SlotOwner>,
}

/// Who a request in an engine slot belongs to.
#[derive(Debug, Clone, Copy, Default)]
struct SlotOwner {
    record: RecordId,
    session: SessionId,
}

/// Index of a started session in `Sim::sessions`.
type SessionId = u32;

struct Sim {
    workers: Vec<Worker>,
    feed: SessionFeed,
    sessions: SessionTable,
    collector: Collector,
    concurrency: Option<usize>,
    in_flight: usize,
    next_worker: usize,
    pass_seq: u64,
    delay_ns: u64,
    /// Sessions whose next turn is due at a future time: (due, tie-break, session).
    delayed: BinaryHeap<Reverse<(u64, u64, SessionId)>>,
    /// Sessions whose next turn is due now.
    ready: VecDeque<SessionId>,
    delayed_seq: u64,
    /// Arrival speedup ratio (open-loop first arrivals are divided by it).
    speedup: f64,
}

/// Started sessions and their remaining turns.
#[derive(Default)]
struct SessionTable {
    slots: Vec<Option<PlannedSession>>,
    free: Vec<SessionId>,
    /// Sessions started and not finished (what the concurrency cap counts).
    active: usize,
}

impl SessionTable {
    fn start(&mut self, s: PlannedSession) -> SessionId {
        self.active += 1;
        match self.free.pop() {
            Some(sid) => {
                self.slots[sid as usize] = Some(s);
                sid
            }
            None => {
                self.slots.push(Some(s));
                (self.slots.len() - 1) as SessionId
            }
        }
    }

    fn has_turns(&self, sid: SessionId) -> bool {
        self.slots[sid as usize].as_ref().is_some_and(|s| !s.turns.is_empty())
    }

    fn next_turn(&mut self, sid: SessionId) -> Option<PlannedTurn> {
        self.slots[sid as usize].as_mut()?.turns.pop_front()
    }

    fn end(&mut self, sid: SessionId) {
        self.slots[sid as usize] = None;
        self.free.push(sid);
        self.active -= 1;
    }
}

fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

/// Runs a synthetic workload offline and returns its report.
pub fn run_synthetic(options: &ReplayOptions) -> Result<ReplayOutcome, ReplayError> {
    options.validate("offline")?;
    let engine = &options.launch.engine;
    let mut workers = Vec::with_capacity(options.num_workers);
    for _ in 0..options.num_workers {
        let engine = Engine::new(EngineOptions { config: engine.clone(), ..Default::default() })?;
        workers.push(Worker { engine, busy: None, owners: Vec::new() });
    }
    let started = Instant::now();
    let mut sim = Sim {
        workers,
        feed: SessionFeed::new(&options.workload, engine.block_size, engine.enable_prefix_caching),
        sessions: SessionTable::default(),
        collector: Collector::new(),
        concurrency: match options.workload.load {
            Load::Concurrency(c) => Some(c),
            _ => None,
        },
        in_flight: 0,
        next_worker: 0,
        pass_seq: 0,
        delay_ns: options.scaled_ns(options.workload.inter_turn_delay_ms),
        speedup: options.arrival_speedup_ratio,
        delayed: BinaryHeap::new(),
        ready: VecDeque::new(),
        delayed_seq: 0,
    };
    sim.run()?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;

    let committed: u64 = sim.workers.iter().map(|w| w.engine.metrics().prompt_tokens_computed_total).sum();
    let mut inputs = sim.collector.finish();
    let duration_s = (inputs.duration_ms / 1000.0).max(1e-9);
    inputs.committed_prefill_tokens = committed;
    inputs.wall_time_ms = wall_ms;
    inputs.decode_worker_seconds = options.num_workers as f64 * duration_s;
    inputs.decode_gpus_per_worker = (options.launch.tensor_parallel_size * options.launch.dp_size) as u64;
    let mut summary = Summary::from_inputs(inputs);
    summary.kv_eviction_policy = engine.eviction_policy.as_str().to_string();
    Ok(ReplayOutcome { summary })
}

impl Sim {
    fn run(&mut self) -> Result<(), ReplayError> {
        let mut now = 0;
        loop {
            self.drain(now)?;
            if self.done() {
                return Ok(());
            }
            let speedup = self.speedup;
            let next_arrival = self.feed.next_arrival_ms().map(|ms| ms_to_ns(ms / speedup));
            let next_delayed = self.delayed.peek().map(|Reverse((t, _, _))| *t);
            let next_pass = self.workers.iter().filter_map(|w| w.busy.map(|(t, _)| t)).min();
            match [next_arrival, next_delayed, next_pass].into_iter().flatten().min() {
                Some(t) => now = t.max(now),
                None => return Err(ReplayError::DeadEnd(self.in_flight)),
            }
        }
    }

    fn done(&self) -> bool {
        self.in_flight == 0
            && self.feed.sessions_remaining() == 0
            && self.delayed.is_empty()
            && self.ready.is_empty()
            && self.workers.iter().all(|w| w.busy.is_none())
    }

    /// Processes everything that can happen at `now`, until nothing changes.
    fn drain(&mut self, now: u64) -> Result<(), ReplayError> {
        loop {
            let mut changed = false;
            // 1. Pass completions, in (end, start order).
            while let Some(w) = self.next_completion(now) {
                self.workers[w].busy = None;
                self.deliver(w, now);
                changed = true;
            }
            // 2. Arrivals.
            changed |= self.release_arrivals(now)?;
            // 3. Idle workers with work run one pass.
            for w in 0..self.workers.len() {
                let worker = &mut self.workers[w];
                if worker.busy.is_some() || !worker.engine.has_work() {
                    continue;
                }
                let pass = worker.engine.step(now);
                if pass.end_ns > now {
                    self.pass_seq += 1;
                    worker.busy = Some((pass.end_ns, self.pass_seq));
                } else if pass.had_effect() {
                    self.deliver(w, now);
                } else {
                    return Err(ReplayError::DeadEnd(self.in_flight));
                }
                changed = true;
            }
            if !changed {
                return Ok(());
            }
        }
    }

    fn next_completion(&self, now: u64) -> Option<usize> {
        self.workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.busy.filter(|&(t, _)| t <= now).map(|b| (b, i)))
            .min()
            .map(|(_, i)| i)
    }

    /// Hands worker `w`'s last pass outputs to the collector, stamped at `t`.
    fn deliver(&mut self, w: usize, t: u64) {
        let worker = &mut self.workers[w];
        let pass = worker.engine.last_pass();
        for a in &pass.admissions {
            self.collector.on_admission(worker.owners[a.key.0 as usize].record, a.reused_tokens);
        }
        if let Some(o) = pass.steady.first() {
            self.collector.on_gaps(o.itl_ns, pass.steady.len() as u64);
        }
        for o in &pass.outputs {
            let SlotOwner { record: rec, session: sid } = worker.owners[o.key.0 as usize];
            if o.rejected {
                self.collector.on_rejected(rec);
            } else {
                if o.has_token() {
                    self.collector.on_token(rec, t, o.index, o.itl_ns);
                }
                if o.completed {
                    self.collector.on_complete(rec, t);
                }
            }
            if o.completed {
                self.in_flight -= 1;
                if !self.sessions.has_turns(sid) {
                    self.sessions.end(sid);
                } else if self.delay_ns == 0 {
                    self.ready.push_back(sid);
                } else {
                    self.delayed_seq += 1;
                    self.delayed.push(Reverse((t + self.delay_ns, self.delayed_seq, sid)));
                }
            }
        }
    }

    /// Releases every turn due at `now`; returns whether any was dispatched.
    fn release_arrivals(&mut self, now: u64) -> Result<bool, ReplayError> {
        let mut any = false;
        while let Some(&Reverse((t, _, _))) = self.delayed.peek() {
            if t > now {
                break;
            }
            let Reverse((_, _, sid)) = self.delayed.pop().expect("peeked");
            self.ready.push_back(sid);
        }
        while let Some(s) = self.ready.pop_front() {
            self.dispatch(s, now)?;
            any = true;
        }
        match self.concurrency {
            Some(c) => {
                while self.sessions.active < c {
                    let Some(s) = self.feed.start_session() else { break };
                    let sid = self.sessions.start(s);
                    self.dispatch(sid, now)?;
                    any = true;
                }
            }
            None => {
                while let Some(at) = self.feed.next_arrival_ms() {
                    let at = ms_to_ns(at / self.speedup);
                    if at > now {
                        break;
                    }
                    let s = self.feed.start_session().expect("a session was peeked");
                    let sid = self.sessions.start(s);
                    self.dispatch(sid, at)?;
                    any = true;
                }
            }
        }
        Ok(any)
    }

    /// Submits the session's next turn, placed round-robin.
    fn dispatch(&mut self, sid: SessionId, arrival_ns: u64) -> Result<(), ReplayError> {
        let Some(turn) = self.sessions.next_turn(sid) else {
            self.sessions.end(sid);
            return Ok(());
        };
        let rec = self.collector.on_arrival(arrival_ns, turn.tokens.len());
        let w = self.next_worker;
        self.next_worker = (self.next_worker + 1) % self.workers.len();
        let worker = &mut self.workers[w];
        let key = worker.engine.submit(Request {
            uuid: turn.uuid,
            tokens: turn.tokens,
            max_output_tokens: turn.max_output_tokens,
            output_token_ids: None,
            block_hashes: turn.block_hashes,
        })?;
        let slot = key.0 as usize;
        if worker.owners.len() <= slot {
            worker.owners.resize(slot + 1, SlotOwner::default());
        }
        worker.owners[slot] = SlotOwner { record: rec, session: sid };
        self.in_flight += 1;
        Ok(())
    }
}
