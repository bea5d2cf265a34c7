//! The client side of a disaggregated handoff: registering a lifecycle route on a rank,
//! receiving its events and driving it (submit, reserve, activate, release, cancel).

use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};

use crate::command::{Command, HandoffOp};
use crate::engine::{LiveEngine, Rank};
use crate::error::LiveError;
use crate::handoff::{HandoffEvent, HandoffId, HandoffRoute};
use crate::request::LiveRequestRegistration;

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
            rank.shared.handoffs.lock().expect("handoffs").unregister(&self.route);
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
        let (route, rx) = rank.shared.handoffs.lock().expect("handoffs").register(id)?;
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

    async fn submit(&self, registration: LiveRequestRegistration, source: bool) -> Result<(), LiveError> {
        let _lock = self.route.command_lock.lock().await;
        let e = self.engine()?;
        e.rank().shared.handoffs.lock().expect("handoffs").check_registered(&self.route)?;
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
        e.rank().shared.handoffs.lock().expect("handoffs").check_latest(&self.route)?;
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
