//! Disaggregated handoff at the engine level (live.md §7): lifecycle routes keyed by
//! handoff id, with generations so that a stale control never touches a newer
//! registration, and the KV transfer delay formula.

use std::sync::{Arc, Mutex, Weak};

use mocker_core::config::{Backend, EngineConfig, KvTransferTimingMode};
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::actor::{Command, HandoffOp};
use crate::engine::{LiveEngine, Rank};
use crate::error::LiveError;
use crate::request::LiveRequestRegistration;

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
    pub fn close_all(&mut self) {
        for (_, r) in self.registered.drain() {
            r.close();
        }
        self.latest.retain(|_, w| w.strong_count() > 0);
    }

    pub fn len(&self) -> usize {
        self.registered.len()
    }
}

/// Receives a handoff's lifecycle events; dropping it unregisters the route (the control
/// keeps working on the latest generation).
#[derive(Debug)]
pub struct LiveHandoffEvents {
    rx: mpsc::Receiver<HandoffEvent>,
    route: Arc<HandoffRoute>,
    rank: Weak<Rank>,
}

impl LiveHandoffEvents {
    /// The next event, or `None` once the route or the engine is gone.
    pub async fn recv(&mut self) -> Option<HandoffEvent> {
        self.rx.recv().await
    }
}

impl Drop for LiveHandoffEvents {
    fn drop(&mut self) {
        if let Some(rank) = self.rank.upgrade() {
            let mut t = rank.shared.handoffs.lock().expect("handoffs");
            if t.registered.get(&self.route.id).is_some_and(|r| Arc::ptr_eq(r, &self.route)) {
                t.registered.remove(&self.route.id);
            }
        }
        self.route.close();
    }
}

/// Drives one handoff registration. Cheap to clone; never keeps the engine alive.
#[derive(Debug, Clone)]
pub struct LiveHandoffControl {
    route: Arc<HandoffRoute>,
    rank: Weak<Rank>,
}

impl LiveEngine {
    /// Registers a lifecycle route for handoff `id`.
    pub fn register_handoff(
        &self,
        id: HandoffId,
    ) -> Result<(LiveHandoffControl, LiveHandoffEvents), LiveError> {
        if !self.is_running() {
            return Err(LiveError::NotRunning);
        }
        let rank = self.rank();
        let mut t = rank.shared.handoffs.lock().expect("handoffs");
        if t.registered.contains_key(&id) {
            return Err(LiveError::HandoffRouteExists(id.0));
        }
        if let Some(prev) = t.latest.get(&id).and_then(Weak::upgrade) {
            if prev.command_lock.try_lock().is_err() {
                return Err(LiveError::HandoffCommandInProgress(id.0));
            }
        }
        let (tx, rx) = mpsc::channel(8);
        let route = Arc::new(HandoffRoute {
            id,
            events: Mutex::new(Some(tx)),
            source: Mutex::new(None),
            destination: Mutex::new(None),
            command_lock: tokio::sync::Mutex::new(()),
        });
        t.registered.insert(id, route.clone());
        t.latest.insert(id, Arc::downgrade(&route));
        drop(t);
        let weak = Arc::downgrade(rank);
        Ok((
            LiveHandoffControl { route: route.clone(), rank: weak.clone() },
            LiveHandoffEvents { rx, route, rank: weak },
        ))
    }
}

impl LiveHandoffControl {
    /// The handoff id.
    pub fn id(&self) -> HandoffId {
        self.route.id
    }

    fn engine(&self) -> Result<LiveEngine, LiveError> {
        self.rank.upgrade().map(LiveEngine::from_rank).ok_or(LiveError::EngineGone)
    }

    /// Strict generation check: this route must be the registered one.
    fn check_registered(&self, e: &LiveEngine) -> Result<(), LiveError> {
        let t = e.rank().shared.handoffs.lock().expect("handoffs");
        match t.registered.get(&self.route.id) {
            Some(r) if Arc::ptr_eq(r, &self.route) => Ok(()),
            Some(_) => Err(LiveError::StaleHandoffControl(self.route.id.0)),
            None if self.is_latest(&t) => Err(LiveError::HandoffRouteGone(self.route.id.0)),
            None => Err(LiveError::StaleHandoffControl(self.route.id.0)),
        }
    }

    fn is_latest(&self, t: &HandoffTable) -> bool {
        t.latest.get(&self.route.id).is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.route))
    }

    /// Lenient generation check: this route must be the latest registration.
    fn check_latest(&self, e: &LiveEngine) -> Result<(), LiveError> {
        let t = e.rank().shared.handoffs.lock().expect("handoffs");
        if self.is_latest(&t) {
            Ok(())
        } else {
            Err(LiveError::StaleHandoffControl(self.route.id.0))
        }
    }

    async fn submit(&self, registration: LiveRequestRegistration, source: bool) -> Result<(), LiveError> {
        let _lock = self.route.command_lock.lock().await;
        let e = self.engine()?;
        self.check_registered(&e)?;
        e.submit_handoff(registration, self.route.clone(), source).await
    }

    /// Submits the prefill (source) side: it streams like any request and, once finished,
    /// holds its KV and reports `SourceHeld` until released or cancelled.
    pub async fn submit_prefill(&self, registration: LiveRequestRegistration) -> Result<(), LiveError> {
        self.submit(registration, true).await
    }

    /// Reserves the decode (destination) side's prompt blocks; reports
    /// `DestinationReserved`. Its stream yields tokens after `activate_destination`.
    pub async fn reserve_destination(&self, registration: LiveRequestRegistration) -> Result<(), LiveError> {
        self.submit(registration, false).await
    }

    async fn op(&self, op: HandoffOp) -> Result<bool, LiveError> {
        let _lock = self.route.command_lock.lock().await;
        let e = self.engine()?;
        self.check_latest(&e)?;
        if !e.is_running() {
            return Err(LiveError::NotRunning);
        }
        let (tx, rx) = oneshot::channel();
        e.command(Command::Handoff { rank: e.dp_rank(), route: self.route.clone(), op, reply: tx }).await?;
        rx.await.map_err(|_| LiveError::CommandAckDropped)
    }

    /// Frees the held source KV (after the transfer). `Ok(false)`: nothing was held.
    pub async fn release_source(&self) -> Result<bool, LiveError> {
        self.op(HandoffOp::ReleaseSource).await
    }

    /// Cancels the source, held or still running. `Ok(false)`: nothing to cancel.
    pub async fn cancel_source(&self) -> Result<bool, LiveError> {
        self.op(HandoffOp::CancelSource).await
    }

    /// Cancels the destination and frees its reservation. `Ok(false)`: nothing to cancel.
    pub async fn cancel_destination(&self) -> Result<bool, LiveError> {
        self.op(HandoffOp::CancelDestination).await
    }

    /// Activates the reserved destination (its KV has arrived): it starts decoding.
    pub async fn activate_destination(&self) -> Result<(), LiveError> {
        if self.op(HandoffOp::ActivateDestination).await? {
            Ok(())
        } else {
            Err(LiveError::UnexpectedHandoffResult(self.route.id.0, "Noop".into()))
        }
    }
}
