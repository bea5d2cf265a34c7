//! What the actor keeps for one rank: its core engine, the slot table that maps the core's
//! request keys to output streams (the hot delivery path: no hashing per token), sinks and
//! metrics, and how submissions, cancellations and handoff commands apply to them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mocker_core::config::EngineConfig;
use mocker_core::metrics::{EngineMetrics, LoraActivity};
use mocker_core::{Engine, SeqKey};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::command::{HandoffOp, Registered};
use crate::error::LiveError;
use crate::handoff::{HandoffEvent, HandoffRoute, HandoffTransferTiming};
use crate::options::{FpmSink, KvEventSink};
use crate::route::{RankShared, Route, RouteState};
use crate::signal::{ObservedAdmission, OutputSignal};

pub(crate) struct Slot {
    pub(crate) route: Arc<Route>,
    tx: mpsc::Sender<OutputSignal>,
    /// A handoff source: its KV stays held after its terminal output.
    source: Option<(Arc<HandoffRoute>, HandoffTransferTiming)>,
    /// Start of the pass that first admitted the request (simulated ns), once admitted.
    pub(crate) scheduled_ns: Option<u64>,
}

/// Everything the actor keeps for one rank.
pub(crate) struct RankState {
    pub engine: Engine,
    pub shared: Arc<RankShared>,
    pub metrics: watch::Sender<EngineMetrics>,
    pub kv_sink: Option<KvEventSink>,
    pub fpm_sink: Option<FpmSink>,
    pub admissions: Option<mpsc::UnboundedSender<ObservedAdmission>>,
    pub(crate) slots: Vec<Option<Slot>>,
    by_sched: FxHashMap<u128, SeqKey>,
    pub(crate) retired: bool,
    pub(crate) stepped: bool,
    /// Transfer settings of the engine (the prompt length is filled per request).
    pub transfer: HandoffTransferTiming,
    /// Adapters running and waiting, when the rank serves LoRA adapters.
    pub lora: Option<watch::Sender<LoraActivity>>,
    /// With KV cache groups: the pages and bytes each group holds, as of the last pass.
    pub kv_groups: Option<watch::Sender<Vec<(u64, u64)>>>,
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
            lora: None,
            kv_groups: None,
        }
    }

    pub(crate) fn publish_metrics(&self) {
        let m = self.engine.metrics();
        self.metrics.send_if_modified(|old| {
            let changed = *old != m;
            *old = m;
            changed
        });
        if let Some(tx) = &self.kv_groups {
            let usage = self.engine.kv_group_usage();
            tx.send_if_modified(|old| {
                let changed = *old != usage;
                if changed {
                    *old = usage;
                }
                changed
            });
        }
        if let Some(tx) = &self.lora {
            let a = self.engine.lora_activity();
            tx.send_if_modified(|old| {
                let changed = *old != a;
                if changed {
                    *old = a;
                }
                changed
            });
        }
    }

    /// Removes one submission from the core and closes its stream.
    pub(crate) fn cancel(&mut self, sched_id: u128) -> bool {
        let Some(key) = self.by_sched.remove(&sched_id) else { return false };
        let applied = self.engine.cancel_key(key, sched_id);
        if let Some(slot) = self.slots[key.0 as usize].take() {
            self.shared.remove(&slot.route);
        }
        applied
    }

    /// Cancels every request of the rank; returns how many there were.
    pub(crate) fn cancel_all(&mut self) -> usize {
        let ids: Vec<u128> = self.by_sched.keys().copied().collect();
        for &id in &ids {
            self.cancel(id);
        }
        ids.len()
    }

    /// Drops every cached block (only when none is in use), sending the `Cleared` event
    /// to the KV-event sink.
    pub(crate) fn reset_prefix_cache(&mut self) -> Result<(), LiveError> {
        match self.engine.reset_prefix_cache() {
            Ok(Some(ev)) => {
                if let Some(sink) = self.kv_sink.as_mut() {
                    sink(std::slice::from_ref(&ev));
                }
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(LiveError::PrefixCacheBusy(e.to_string())),
        }
    }

    /// Cancels every request of the rank and refuses new ones.
    pub(crate) fn retire(&mut self) {
        self.retired = true;
        self.cancel_all();
        self.shared.stop();
        self.publish_metrics();
    }

    pub(crate) fn apply_submit(&mut self, reg: Registered) -> Result<(), LiveError> {
        self.apply_submission(reg, None)
    }

    /// Applies a submission: ordinary (`handoff` None), a handoff source or destination.
    pub(crate) fn apply_submission(
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
                self.slots[i] = Some(Slot { route, tx: reg.tx.clone(), source, scheduled_ns: None });
                Ok(())
            }
            Err(message) => {
                self.shared.remove(&route);
                Err(LiveError::InvalidRequest { id: route.client_id, message })
            }
        }
    }

    pub(crate) fn apply_handoff(&mut self, route: &HandoffRoute, op: HandoffOp) -> bool {
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
    pub(crate) fn dispatch(&mut self, sim_time_ns: u64, failed: &mut Vec<(SeqKey, u128)>) {
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
                scheduled_ns: if o.index == 0 { slot.scheduled_ns } else { None },
                handoff_delay_ms,
                sim_time_ns,
                observed_at,
            };
            if o.completed {
                // Unregister before the terminal is readable, so the id is free by then.
                self.shared.remove(&slot.route);
            }
            let ok = match slot.tx.try_send(signal) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // The reader fell a whole buffer behind: shed it, so one stuck client
                    // can never make the server buffer without limit.
                    slot.route.overflowed.store(true, Ordering::Release);
                    if !o.completed {
                        self.shared.overflow_cancellations.fetch_add(1, Ordering::Relaxed);
                    }
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            };
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
