//! The scheduler actor: one task per group owns the core engines of every rank, runs their
//! passes behind one barrier, sleeps each modelled duration on tokio's clock and dispatches
//! the outputs to the request streams at the pass end, before the next pass can start.

use std::time::Duration;

use mocker_core::metrics::ForwardPassMetrics;
use mocker_core::wave::Waves;
use mocker_core::SeqKey;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::command::{CancelMsg, Command};
use crate::error::LiveError;
use crate::rank::RankState;
use crate::signal::ObservedAdmission;

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
    /// The ranks' lock-step waves (shared with offline replay).
    waves: Waves,
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
        let waves = Waves::new(ranks.len());
        Self {
            ranks,
            cmd_rx,
            cancel_rx,
            token,
            epoch,
            now_ns: 0,
            failed: Vec::new(),
            lanes_closed: false,
            waves,
        }
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
                let res = r.reset_prefix_cache();
                r.publish_metrics();
                let _ = reply.send(res);
            }
            Command::SetSpeedupRatio { ratio, reply } => {
                for r in &mut self.ranks {
                    r.engine.set_speedup_ratio(ratio);
                }
                let _ = reply.send(());
            }
            Command::AbortAllAndReset { rank, reply } => {
                let r = &mut self.ranks[rank as usize];
                let aborted = r.cancel_all();
                let res = r.reset_prefix_cache().map(|()| aborted);
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
            // One wave: every rank with work runs a pass, all ending with the slowest.
            let end = self.waves.step(&mut self.ranks, start, |r| (&mut r.engine, !r.retired));
            let mut effect = false;
            for (i, r) in self.ranks.iter_mut().enumerate() {
                r.stepped = self.waves.stepped(i);
                if !r.stepped {
                    continue;
                }
                let pass = r.engine.last_pass();
                effect |= pass.had_effect();
                for a in &pass.admissions {
                    if let Some(slot) = r.slots.get_mut(a.key.0 as usize).and_then(Option::as_mut) {
                        slot.scheduled_ns.get_or_insert(start);
                    }
                }
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
            let group = self.ranks.len() > 1;
            for r in &mut self.ranks {
                if !r.stepped {
                    // An idle sibling crosses the shared boundary too: it reports an empty
                    // pass lasting the group's pass.
                    if group && !r.retired {
                        if let Some(sink) = r.fpm_sink.as_mut() {
                            let m = ForwardPassMetrics {
                                dp_rank: r.engine.metrics().dp_rank,
                                num_queued_requests: r.engine.metrics().waiting_requests,
                                wall_time_secs: (end - start) as f64 / 1e9,
                                ..Default::default()
                            };
                            sink(&m);
                        }
                    }
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
            // Nothing runs any more: leave the watch at an idle snapshot (totals kept).
            let mut m = r.engine.metrics();
            m.running_requests = 0;
            m.waiting_requests = 0;
            m.active_blocks = 0;
            m.gpu_cache_usage_perc = 0.0;
            r.metrics.send_replace(m);
            if let Some(tx) = &r.lora {
                tx.send_replace(mocker_core::metrics::LoraActivity::default());
            }
        }
    }
}
