//! The scheduler actor: one task per group owns the core engines of every rank, runs their
//! passes behind one barrier, sleeps each modelled duration on tokio's clock and dispatches
//! the outputs to the request streams at the pass end, before the next pass can start.

use std::sync::Arc;
use std::time::Duration;

use mocker_core::config::EngineConfig;
use mocker_core::metrics::EngineMetrics;
use mocker_core::{Engine, SeqKey};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::{FpmSink, KvEventSink};
use crate::error::LiveError;
use crate::handoff::{HandoffEvent, HandoffRoute, HandoffTransferTiming};
use crate::request::{ObservedAdmission, OutputSignal, Registered};
use crate::route::{RankShared, Route, RouteState};

/// Commands applied at pass boundaries (or at once when idle).
#[derive(Debug)]
pub(crate) enum Command {
    Submit {
        rank: u32,
        reg: Registered,
        reply: oneshot::Sender<Result<(), LiveError>>,
    },
    ResetPrefixCache {
        rank: u32,
        reply: oneshot::Sender<Result<(), LiveError>>,
    },
    /// Submit one side of a handoff: the source (held after finishing) or the destination
    /// (reserved until activated).
    SubmitHandoff {
        rank: u32,
        reg: Registered,
        route: Arc<HandoffRoute>,
        source: bool,
        reply: oneshot::Sender<Result<(), LiveError>>,
    },
    /// A handoff lifecycle command; the reply says whether it was applied.
    Handoff {
        rank: u32,
        route: Arc<HandoffRoute>,
        op: HandoffOp,
        reply: oneshot::Sender<bool>,
    },
}

/// Handoff lifecycle commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandoffOp {
    ReleaseSource,
    CancelSource,
    CancelDestination,
    ActivateDestination,
}

/// Messages of the cancellation lane, served even in the middle of a pass.
#[derive(Debug)]
pub(crate) enum CancelMsg {
    /// Cancel one submission; the reply says whether anything was cancelled.
    Cancel { rank: u32, sched_id: u128, reply: Option<oneshot::Sender<bool>> },
    /// The rank's last handle is gone: retire its requests only.
    Retire { rank: u32 },
}

/// Weak ends of both lanes: request streams never keep the actor alive.
#[derive(Debug, Clone)]
pub(crate) struct Lanes {
    pub cancel: mpsc::WeakSender<CancelMsg>,
}

struct Slot {
    route: Arc<Route>,
    tx: mpsc::Sender<OutputSignal>,
    /// A handoff source: its KV stays held after its terminal output.
    source: Option<(Arc<HandoffRoute>, HandoffTransferTiming)>,
}

/// Everything the actor keeps for one rank.
pub(crate) struct RankState {
    pub engine: Engine,
    pub shared: Arc<RankShared>,
    pub metrics: watch::Sender<EngineMetrics>,
    pub kv_sink: Option<KvEventSink>,
    pub fpm_sink: Option<FpmSink>,
    pub admissions: Option<mpsc::UnboundedSender<ObservedAdmission>>,
    slots: Vec<Option<Slot>>,
    by_sched: FxHashMap<u128, SeqKey>,
    retired: bool,
    stepped: bool,
    /// Transfer settings of the engine (the prompt length is filled per request).
    pub transfer: HandoffTransferTiming,
}

impl RankState {
    pub fn new(
        engine: Engine,
        shared: Arc<RankShared>,
        metrics: watch::Sender<EngineMetrics>,
        kv_sink: Option<KvEventSink>,
        fpm_sink: Option<FpmSink>,
        admissions: Option<mpsc::UnboundedSender<ObservedAdmission>>,
    ) -> Self {
        Self {
            engine,
            shared,
            metrics,
            kv_sink,
            fpm_sink,
            admissions,
            slots: Vec::new(),
            by_sched: FxHashMap::default(),
            retired: false,
            stepped: false,
            transfer: HandoffTransferTiming::from_config(&EngineConfig::default(), 0),
        }
    }

    fn publish_metrics(&self) {
        let m = self.engine.metrics();
        self.metrics.send_if_modified(|old| {
            let changed = *old != m;
            *old = m;
            changed
        });
    }

    /// Removes one submission from the core and closes its stream.
    fn cancel(&mut self, sched_id: u128) -> bool {
        let Some(key) = self.by_sched.remove(&sched_id) else { return false };
        let applied = self.engine.cancel_key(key, sched_id);
        if let Some(slot) = self.slots[key.0 as usize].take() {
            self.shared.remove(&slot.route);
        }
        applied
    }

    /// Cancels every request of the rank and refuses new ones.
    fn retire(&mut self) {
        self.retired = true;
        let ids: Vec<u128> = self.by_sched.keys().copied().collect();
        for id in ids {
            self.cancel(id);
        }
        self.shared.stop();
        self.publish_metrics();
    }

    fn apply_submit(&mut self, reg: Registered) -> Result<(), LiveError> {
        self.apply_submission(reg, None)
    }

    /// Applies a submission: ordinary (`handoff` None), a handoff source or destination.
    fn apply_submission(
        &mut self,
        mut reg: Registered,
        handoff: Option<(Arc<HandoffRoute>, bool)>,
    ) -> Result<(), LiveError> {
        let route = reg.route.take().expect("unapplied registration");
        if self.retired || !self.shared.is_running() {
            self.shared.remove(&route);
            return Err(LiveError::NotRunning);
        }
        if reg.tx.is_closed() {
            // The stream was dropped before admission: nothing to run.
            self.shared.remove(&route);
            return Ok(());
        }
        let request = std::mem::take(&mut reg.request);
        let prompt_len = request.tokens.len();
        let mut source = None;
        let submitted = match &handoff {
            None => self.engine.submit(request).map_err(|e| e.to_string()),
            Some((h, true)) => {
                let timing = HandoffTransferTiming { full_prompt_tokens: prompt_len, ..self.transfer };
                source = Some((h.clone(), timing));
                self.engine.submit_held(request).map_err(|e| e.to_string())
            }
            Some((h, false)) => match self.engine.reserve(request) {
                Ok(r) => {
                    if let Some(sink) = self.kv_sink.as_mut() {
                        if !r.kv_events.is_empty() {
                            sink(&r.kv_events);
                        }
                    }
                    h.send(HandoffEvent::DestinationReserved {
                        transferable_prompt_tokens: r.transferable_prompt_tokens,
                    });
                    Ok(r.key)
                }
                Err(e) => Err(e.to_string()),
            },
        };
        match submitted {
            Ok(key) => {
                let i = key.0 as usize;
                if self.slots.len() <= i {
                    self.slots.resize_with(i + 1, || None);
                }
                self.by_sched.insert(route.sched_id, key);
                match &handoff {
                    Some((h, true)) => *h.source.lock().expect("handoff") = Some(route.sched_id),
                    Some((h, false)) => *h.destination.lock().expect("handoff") = Some(route.sched_id),
                    None => {}
                }
                route.set(RouteState::Active);
                self.slots[i] = Some(Slot { route, tx: reg.tx.clone(), source });
                Ok(())
            }
            Err(message) => {
                self.shared.remove(&route);
                Err(LiveError::InvalidRequest { id: route.client_id, message })
            }
        }
    }

    fn apply_handoff(&mut self, route: &HandoffRoute, op: HandoffOp) -> bool {
        let side = match op {
            HandoffOp::ReleaseSource | HandoffOp::CancelSource => &route.source,
            HandoffOp::CancelDestination | HandoffOp::ActivateDestination => &route.destination,
        };
        let Some(sched) = *side.lock().expect("handoff") else { return false };
        let Some(&key) = self.by_sched.get(&sched) else { return false };
        match op {
            HandoffOp::ReleaseSource => {
                if !self.engine.release_held(key, sched) {
                    return false;
                }
                self.by_sched.remove(&sched);
                if let Some(slot) = self.slots[key.0 as usize].take() {
                    self.shared.remove(&slot.route);
                }
                true
            }
            HandoffOp::CancelSource | HandoffOp::CancelDestination => self.cancel(sched),
            HandoffOp::ActivateDestination => match self.engine.activate(key, sched) {
                Some(events) => {
                    if let Some(sink) = self.kv_sink.as_mut() {
                        if !events.is_empty() {
                            sink(&events);
                        }
                    }
                    true
                }
                None => false,
            },
        }
    }

    /// Hands the last pass's outputs to their streams; streams that are full or closed are
    /// cancelled now, at the same boundary, so no further pass runs with them.
    fn dispatch(&mut self, sim_time_ns: u64, failed: &mut Vec<(SeqKey, u128)>) {
        let observed_at = Instant::now();
        let pass = self.engine.last_pass();
        for o in pass.all_outputs() {
            let Some(slot) = self.slots.get(o.key.0 as usize).and_then(Option::as_ref) else { continue };
            if slot.route.sched_id != o.uuid {
                continue;
            }
            let held = o.completed && !o.rejected && slot.source.is_some();
            let handoff_delay_ms = match &slot.source {
                Some((h, timing)) if held => {
                    h.send(HandoffEvent::SourceHeld { transfer_timing: *timing });
                    timing.delay_ms(None)
                }
                _ => None,
            };
            let signal = OutputSignal {
                uuid: slot.route.client_id,
                token_id: o.token_id(),
                index: o.index,
                completed: o.completed,
                rejected: o.rejected,
                cached_tokens: o.cached_tokens.map(|c| c as usize),
                handoff_delay_ms,
                sim_time_ns,
                observed_at,
            };
            if o.completed {
                // Unregister before the terminal is readable, so the id is free by then.
                self.shared.remove(&slot.route);
            }
            let ok = slot.tx.try_send(signal).is_ok();
            if held {
                // The source's KV stays held (slot and id kept) until release or cancel.
                continue;
            }
            if o.completed || !ok {
                let slot = self.slots[o.key.0 as usize].take().expect("slot");
                self.by_sched.remove(&o.uuid);
                if !ok {
                    self.shared.remove(&slot.route);
                    if !o.completed {
                        failed.push((o.key, o.uuid));
                    }
                }
            }
        }
        for &(key, uuid) in failed.iter() {
            self.engine.cancel_key(key, uuid);
        }
        failed.clear();
    }
}

/// The actor of one group.
pub(crate) struct Actor {
    pub ranks: Vec<RankState>,
    pub cmd_rx: mpsc::Receiver<Command>,
    pub cancel_rx: mpsc::Receiver<CancelMsg>,
    pub token: CancellationToken,
    pub epoch: Instant,
    /// End of the last pass on the simulated clock (ns since `epoch`).
    now_ns: u64,
    failed: Vec<(SeqKey, u128)>,
    lanes_closed: bool,
}

/// How many queued messages one idle or boundary snapshot applies (so a lane that is
/// refilled as fast as it drains cannot starve the passes).
const SNAPSHOT: usize = 1024;

/// tokio's timer granularity: a sleep may end up to this late.
const TIMER_TICK_NS: u64 = 1_000_000;

impl Actor {
    pub fn new(
        ranks: Vec<RankState>,
        cmd_rx: mpsc::Receiver<Command>,
        cancel_rx: mpsc::Receiver<CancelMsg>,
        token: CancellationToken,
        epoch: Instant,
    ) -> Self {
        Self { ranks, cmd_rx, cancel_rx, token, epoch, now_ns: 0, failed: Vec::new(), lanes_closed: false }
    }

    fn elapsed_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    fn apply_cancel(&mut self, msg: CancelMsg) {
        match msg {
            CancelMsg::Cancel { rank, sched_id, reply } => {
                let r = &mut self.ranks[rank as usize];
                let applied = r.cancel(sched_id);
                r.publish_metrics();
                if let Some(reply) = reply {
                    let _ = reply.send(applied);
                }
            }
            CancelMsg::Retire { rank } => self.ranks[rank as usize].retire(),
        }
    }

    fn apply_command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit { rank, reg, reply } => {
                let r = &mut self.ranks[rank as usize];
                let res = r.apply_submit(reg);
                r.publish_metrics();
                let _ = reply.send(res);
            }
            Command::SubmitHandoff { rank, reg, route, source, reply } => {
                let r = &mut self.ranks[rank as usize];
                let res = r.apply_submission(reg, Some((route, source)));
                r.publish_metrics();
                let _ = reply.send(res);
            }
            Command::Handoff { rank, route, op, reply } => {
                let r = &mut self.ranks[rank as usize];
                let applied = !r.retired && r.apply_handoff(&route, op);
                r.publish_metrics();
                let _ = reply.send(applied);
            }
            Command::ResetPrefixCache { rank, reply } => {
                let r = &mut self.ranks[rank as usize];
                let res = match r.engine.reset_prefix_cache() {
                    Ok(Some(ev)) => {
                        if let Some(sink) = r.kv_sink.as_mut() {
                            sink(std::slice::from_ref(&ev));
                        }
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(LiveError::PrefixCacheBusy(e.to_string())),
                };
                r.publish_metrics();
                let _ = reply.send(res);
            }
        }
    }

    /// Applies the cancellations, then the commands, already queued.
    fn apply_snapshot(&mut self) {
        for _ in 0..SNAPSHOT {
            match self.cancel_rx.try_recv() {
                Ok(m) => self.apply_cancel(m),
                Err(_) => break,
            }
        }
        for _ in 0..SNAPSHOT {
            match self.cmd_rx.try_recv() {
                Ok(c) => self.apply_command(c),
                Err(_) => break,
            }
        }
    }

    /// Runs until shutdown or until every handle is gone.
    pub async fn run(mut self) -> Result<(), LiveError> {
        let mut stalled = false;
        // Whether the actor came straight from a boundary: then the next pass starts exactly
        // at that boundary's modelled time, so a late wake-up of tokio's timer never skews
        // the simulated clock. After idling, the clock catches up with tokio's.
        let mut continuous = false;
        // When the last boundary was reached on tokio's clock: idle time is measured from
        // there, so the timer's millisecond granularity never shifts the simulated clock.
        let mut boundary_at = self.epoch;
        loop {
            self.apply_snapshot();
            let has_work = self.ranks.iter().any(|r| !r.retired && r.engine.has_work());
            if self.lanes_closed && !has_work {
                return Ok(());
            }
            if !has_work || stalled {
                stalled = false;
                tokio::select! {
                    biased;
                    _ = self.token.cancelled() => return Ok(()),
                    m = self.cancel_rx.recv() => match m {
                        Some(m) => self.apply_cancel(m),
                        None => return Ok(()),
                    },
                    c = self.cmd_rx.recv() => match c {
                        Some(c) => self.apply_command(c),
                        None => return Ok(()),
                    },
                }
                continuous = false;
                continue;
            }
            let start = if continuous {
                self.now_ns
            } else {
                // ... but never more than a timer tick behind tokio's clock.
                let idle = boundary_at.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                (self.now_ns + idle).max(self.elapsed_ns().saturating_sub(TIMER_TICK_NS))
            };
            let mut end = start;
            let mut effect = false;
            for r in &mut self.ranks {
                r.stepped = !r.retired && r.engine.has_work();
                if !r.stepped {
                    continue;
                }
                let pass = r.engine.step(start);
                end = end.max(pass.end_ns);
                effect |= pass.had_effect();
                if let Some(tx) = &r.admissions {
                    let observed_at = Instant::now();
                    let mut closed = false;
                    for a in &pass.admissions {
                        let Some(slot) = r.slots.get(a.key.0 as usize).and_then(Option::as_ref) else {
                            continue;
                        };
                        let ev = ObservedAdmission {
                            uuid: slot.route.client_id,
                            reused_input_tokens: a.reused_tokens as usize,
                            readmission: a.readmission,
                            observed_at,
                        };
                        closed |= tx.send(ev).is_err();
                    }
                    if closed {
                        r.admissions = None;
                        r.shared.fail(LiveError::AdmissionReceiverClosed);
                        r.retire();
                    }
                }
            }
            let deadline = self.epoch + Duration::from_nanos(end);
            let sleep = tokio::time::sleep_until(deadline);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    biased;
                    _ = self.token.cancelled() => return Ok(()),
                    m = self.cancel_rx.recv(), if !self.lanes_closed => match m {
                        Some(m) => self.apply_cancel(m),
                        None => self.lanes_closed = true,
                    },
                    _ = &mut sleep => break,
                }
            }
            self.now_ns = end;
            boundary_at = Instant::now();
            for r in &mut self.ranks {
                if !r.stepped {
                    continue;
                }
                let pass = r.engine.last_pass();
                if let Some(sink) = r.kv_sink.as_mut() {
                    if !pass.kv_events.is_empty() {
                        sink(&pass.kv_events);
                    }
                }
                if let Some(sink) = r.fpm_sink.as_mut() {
                    sink(&pass.metrics);
                }
                r.dispatch(end, &mut self.failed);
                r.publish_metrics();
            }
            stalled = !effect;
            // Commands applied by the snapshot right after this boundary join the pass that
            // starts at it, as in offline replay.
            continuous = true;
            // Let the readers just woken run before the next pass (on a current-thread
            // runtime a pass whose deadline already passed would not yield otherwise), and
            // keep a zero-duration engine from starving the runtime.
            tokio::task::yield_now().await;
        }
    }
}

impl Drop for Actor {
    fn drop(&mut self) {
        // Normal exit, shutdown or panic alike: every stream closes, every route goes.
        self.token.cancel();
        for r in &mut self.ranks {
            r.shared.stop();
            r.slots.clear();
        }
    }
}
