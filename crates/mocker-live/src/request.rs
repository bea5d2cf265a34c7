//! What a client holds for one request: its output stream and, for two-step admission,
//! its registration.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::command::{CancelMsg, Lanes, Registered};
use crate::error::LiveError;
use crate::route::{Route, RouteState};
use crate::signal::OutputSignal;

/// The registration half of [`crate::LiveEngine::prepare_request`]: hand it to
/// [`crate::LiveEngine::submit_prepared`]. Dropping it unsubmitted closes the paired stream
/// and frees the request id at once.
#[derive(Debug)]
pub struct LiveRequestRegistration {
    pub(crate) inner: Option<Registered>,
    pub(crate) engine_id: usize,
}

impl LiveRequestRegistration {
    /// The client request id.
    pub fn id(&self) -> Uuid {
        self.inner.as_ref().map_or(Uuid::nil(), |r| r.route.as_ref().expect("route").client_id)
    }
}

/// A request's output stream, owned by the caller.
///
/// `recv` yields the request's signals in order and `None` after the terminal one, after a
/// cancellation, or when the engine stops. Dropping the stream before its terminal signal
/// cancels the request (fire and forget); the request's KV is freed.
#[derive(Debug)]
pub struct LiveRequest {
    pub(crate) route: Arc<Route>,
    pub(crate) rx: mpsc::Receiver<OutputSignal>,
    pub(crate) lanes: Lanes,
    pub(crate) rank: u32,
    pub(crate) finished: bool,
}

impl LiveRequest {
    /// The client request id.
    pub fn id(&self) -> Uuid {
        self.route.client_id
    }

    /// The next signal, or `None` once the stream is over.
    pub async fn recv(&mut self) -> Option<OutputSignal> {
        if self.finished {
            return None;
        }
        let s = self.rx.recv().await;
        match s {
            Some(s) if s.completed => self.finished = true,
            None => self.finished = true,
            _ => {}
        }
        s
    }

    /// The next signal if it was already delivered, without waiting (lets a reader that
    /// fell behind take a run of signals at once).
    pub fn try_recv(&mut self) -> Option<OutputSignal> {
        if self.finished {
            return None;
        }
        let s = self.rx.try_recv().ok()?;
        self.finished = s.completed;
        Some(s)
    }

    /// Whether the engine cut the stream short because its buffer was full (the reader fell
    /// a whole buffer behind, see [`crate::OutputBuffering::CancelOnOverflow`]): then `recv`
    /// ends with `None` before the terminal signal.
    pub fn overflowed(&self) -> bool {
        self.route.overflowed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Cancels the request and waits until the scheduler cleaned it up: `Ok(true)` when a
    /// cancellation was applied, `Ok(false)` when there was nothing left to cancel.
    pub async fn cancel(mut self) -> Result<bool, LiveError> {
        self.finished = true;
        self.rx.close();
        cancel_route(&self.route, &self.lanes, self.rank).await
    }
}

impl Drop for LiveRequest {
    fn drop(&mut self) {
        if self.finished || self.route.get() == RouteState::Closed {
            return;
        }
        // A submission not yet applied sees the closed stream when the actor applies it.
        self.rx.close();
        if self.route.get() == RouteState::Submitting {
            return;
        }
        let Some(lane) = self.lanes.cancel.upgrade() else { return };
        let msg = CancelMsg::Cancel { rank: self.rank, sched_id: self.route.sched_id, reply: None };
        if let Err(mpsc::error::TrySendError::Full(msg)) = lane.try_send(msg) {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = lane.send(msg).await;
                });
            }
        }
    }
}

/// The cancellation procedure shared by `LiveEngine::cancel` and `LiveRequest::cancel`.
pub(crate) async fn cancel_route(route: &Arc<Route>, lanes: &Lanes, rank: u32) -> Result<bool, LiveError> {
    if !route.wait_for_admission().await {
        return Ok(false);
    }
    let lane = lanes.cancel.upgrade().ok_or(LiveError::NotAcceptingCancellations)?;
    let (tx, rx) = oneshot::channel();
    lane.send(CancelMsg::Cancel { rank, sched_id: route.sched_id, reply: Some(tx) })
        .await
        .map_err(|_| LiveError::NotAcceptingCancellations)?;
    drop(lane);
    rx.await.map_err(|_| LiveError::CancellationAckDropped)
}
