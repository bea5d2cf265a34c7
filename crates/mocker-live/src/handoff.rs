//! Disaggregated handoff records (live.md §7): ids, lifecycle events, the KV transfer
//! delay formula, and each rank's table of lifecycle routes keyed by handoff id, with
//! generations so that a stale control never touches a newer registration.

use std::sync::{Arc, Mutex, Weak};

use mocker_core::config::{Backend, EngineConfig, KvTransferTimingMode};
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::error::LiveError;

/// Identity of one disaggregated handoff (shared by its source and destination).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HandoffId(pub Uuid);

/// Which side a handoff starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoffOrder {
    /// Prefill first, then the destination reservation (vLLM).
    SourceFirst,
    /// Destination reservation first, then prefill (SGLang).
    DestinationFirst,
}

/// The handoff order of a backend.
pub fn handoff_order(backend: Backend) -> Result<HandoffOrder, LiveError> {
    match backend {
        Backend::Vllm => Ok(HandoffOrder::SourceFirst),
        Backend::Sglang => Ok(HandoffOrder::DestinationFirst),
        Backend::Trtllm => Err(LiveError::InvalidArguments("mocker handoff does not support TRT-LLM".into())),
    }
}

/// What a KV transfer costs (reported with `SourceHeld`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HandoffTransferTiming {
    /// Which tokens are charged.
    pub mode: KvTransferTimingMode,
    /// Prompt length of the source request.
    pub full_prompt_tokens: usize,
    /// KV bytes per token, if configured.
    pub kv_bytes_per_token: Option<f64>,
    /// Link bandwidth in GB/s (decimal), if configured.
    pub bandwidth_gb_s: Option<f64>,
}

impl HandoffTransferTiming {
    pub(crate) fn from_config(config: &EngineConfig, full_prompt_tokens: usize) -> Self {
        Self {
            mode: config.kv_transfer_timing_mode,
            full_prompt_tokens,
            kv_bytes_per_token: config.kv_transfer_bytes_per_token,
            bandwidth_gb_s: config.kv_transfer_bandwidth,
        }
    }

    /// Transfer delay in ms: `tokens × bytes_per_token / (bandwidth × 1e9) × 1000`, where
    /// tokens are the full prompt, or in `destination_missing` mode the destination's
    /// `missing` tokens when known. `None` when a figure is missing or bandwidth ≤ 0.
    pub fn delay_ms(&self, missing: Option<usize>) -> Option<f64> {
        let transfer = mocker_core::transfer::KvTransfer {
            mode: self.mode,
            bytes_per_token: self.kv_bytes_per_token,
            bandwidth_gb_s: self.bandwidth_gb_s,
        };
        transfer.delay_ms(self.full_prompt_tokens, missing)
    }
}

/// A lifecycle event of a handoff.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HandoffEvent {
    /// The source finished its prefill and holds its KV for the transfer.
    SourceHeld {
        /// What the transfer costs.
        transfer_timing: HandoffTransferTiming,
    },
    /// The destination reserved its prompt blocks.
    DestinationReserved {
        /// Prompt tokens whose KV must be transferred.
        transferable_prompt_tokens: usize,
    },
}

/// One registration of a handoff id on a rank.
#[derive(Debug)]
pub(crate) struct HandoffRoute {
    pub id: HandoffId,
    pub events: Mutex<Option<mpsc::Sender<HandoffEvent>>>,
    /// Scheduler ids of the source / destination submissions, set by the actor.
    pub source: Mutex<Option<u128>>,
    pub destination: Mutex<Option<u128>>,
    /// Serialises commands of this route.
    pub command_lock: tokio::sync::Mutex<()>,
}

impl HandoffRoute {
    /// Delivers a lifecycle event without blocking the actor (a route gets at most two).
    pub fn send(&self, ev: HandoffEvent) {
        let mut guard = self.events.lock().expect("handoff events");
        if let Some(tx) = guard.as_ref() {
            if tx.try_send(ev).is_err() {
                *guard = None;
            }
        }
    }

    pub fn close(&self) {
        self.events.lock().expect("handoff events").take();
    }
}

/// The handoff routes of a rank.
#[derive(Debug, Default)]
pub(crate) struct HandoffTable {
    /// Routes whose event stream is alive.
    registered: FxHashMap<HandoffId, Arc<HandoffRoute>>,
    /// The latest registration of each id (even after its events were dropped).
    latest: FxHashMap<HandoffId, Weak<HandoffRoute>>,
}

impl HandoffTable {
    /// Registers a new generation of `id`: refused while one is registered, or while an
    /// older generation's command is still in flight.
    pub fn register(
        &mut self,
        id: HandoffId,
    ) -> Result<(Arc<HandoffRoute>, mpsc::Receiver<HandoffEvent>), LiveError> {
        if self.registered.contains_key(&id) {
            return Err(LiveError::HandoffRouteExists(id.0));
        }
        if let Some(prev) = self.latest.get(&id).and_then(Weak::upgrade) {
            if prev.command_lock.try_lock().is_err() {
                return Err(LiveError::HandoffCommandInProgress(id.0));
            }
        }
        // A route gets at most two events; 8 leaves room without ever blocking the actor.
        let (tx, rx) = mpsc::channel(8);
        let route = Arc::new(HandoffRoute {
            id,
            events: Mutex::new(Some(tx)),
            source: Mutex::new(None),
            destination: Mutex::new(None),
            command_lock: tokio::sync::Mutex::new(()),
        });
        self.registered.insert(id, route.clone());
        self.latest.insert(id, Arc::downgrade(&route));
        // A dead entry answers nothing (every check holds a live route), but its Weak keeps
        // the route's allocation: prune them once they outnumber the live ones, so a server
        // that has seen many handoffs holds memory for those in flight only (amortised O(1)).
        if self.latest.len() > 2 * self.registered.len() + 64 {
            self.latest.retain(|_, w| w.strong_count() > 0);
        }
        Ok((route, rx))
    }

    /// Unregisters `route` if it is still the registered generation of its id.
    pub fn unregister(&mut self, route: &Arc<HandoffRoute>) {
        if self.registered.get(&route.id).is_some_and(|r| Arc::ptr_eq(r, route)) {
            self.registered.remove(&route.id);
        }
    }

    fn is_latest(&self, route: &Arc<HandoffRoute>) -> bool {
        self.latest.get(&route.id).is_some_and(|w| w.as_ptr() == Arc::as_ptr(route))
    }

    /// Strict generation check: `route` must be the registered one.
    pub fn check_registered(&self, route: &Arc<HandoffRoute>) -> Result<(), LiveError> {
        match self.registered.get(&route.id) {
            Some(r) if Arc::ptr_eq(r, route) => Ok(()),
            Some(_) => Err(LiveError::StaleHandoffControl(route.id.0)),
            None if self.is_latest(route) => Err(LiveError::HandoffRouteGone(route.id.0)),
            None => Err(LiveError::StaleHandoffControl(route.id.0)),
        }
    }

    /// Lenient generation check: `route` must be the latest registration (its events may
    /// already be gone).
    pub fn check_latest(&self, route: &Arc<HandoffRoute>) -> Result<(), LiveError> {
        if self.is_latest(route) {
            Ok(())
        } else {
            Err(LiveError::StaleHandoffControl(route.id.0))
        }
    }

    /// Closes every route's event stream (the rank stopped).
    pub fn close_all(&mut self) {
        for (_, r) in self.registered.drain() {
            r.close();
        }
        self.latest.retain(|_, w| w.strong_count() > 0);
    }

    /// Registered routes.
    pub fn len(&self) -> usize {
        self.registered.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 45 item 10: every expired handoff left its route's allocation behind.
    #[test]
    fn finished_handoffs_do_not_accumulate() {
        let mut table = HandoffTable::default();
        let mut live = Vec::new();
        for i in 0..10_000u128 {
            let (route, _events) = table.register(HandoffId(Uuid::from_u128(i))).unwrap();
            if i % 1000 == 0 {
                live.push(route.clone());
            } else {
                table.unregister(&route);
            }
        }
        assert!(table.latest.len() <= 2 * table.len() + 65, "{} entries kept", table.latest.len());
        // The routes still held stay the latest of their ids.
        for route in &live {
            table.check_latest(route).unwrap();
        }
    }
}
