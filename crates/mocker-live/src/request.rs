//! What a client holds for one request: its output stream and, for two-step admission,
//! its registration.

use std::sync::Arc;

use mocker_core::Request;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::actor::{CancelMsg, Lanes};
use crate::error::LiveError;
use crate::route::{RankShared, Route, RouteState};

/// One output of a request, delivered at the end of the pass that produced it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSignal {
    /// The client's request id.
    pub uuid: Uuid,
    /// The token; `None` only on a terminal signal without one (rejection).
    pub token_id: Option<u32>,
    /// Position of the token in the request's output (0 = first token).
    pub index: u32,
    /// Last signal of the request.
    pub completed: bool,
    /// The request can never fit this engine (set together with `completed`).
    pub rejected: bool,
    /// Prefix-cache hit at first admission, on the first signal only.
    pub cached_tokens: Option<usize>,
    /// When the pass that first admitted the request started (simulated ns, see
    /// `sim_time_ns`), on the first signal only: the end of its queueing, which vLLM's
    /// queue/prefill/inference-time metrics are measured from.
    pub scheduled_ns: Option<u64>,
    /// KV transfer delay of a disaggregated prefill, on its terminal signal.
    pub handoff_delay_ms: Option<f64>,
    /// Modelled pass-end time on the engine's simulated clock (ns since the engine started).
    pub sim_time_ns: u64,
    /// When the pass's batch was dispatched (tokio clock).
    pub observed_at: Instant,
}

/// A request admitted by a pass, as seen by the admission observer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObservedAdmission {
    /// The client's request id.
    pub uuid: Uuid,
    /// Prompt tokens reused from the prefix cache by this admission.
    pub reused_input_tokens: usize,
    /// Whether the request had been preempted before.
    pub readmission: bool,
    /// When the admission was forwarded (pass start, tokio clock).
    pub observed_at: Instant,
}

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

/// A registered, not yet applied submission; travels to the actor inside the command.
/// Dropped anywhere before the actor takes its route, it unregisters the route.
#[derive(Debug)]
pub(crate) struct Registered {
    pub route: Option<Arc<Route>>,
    pub request: Request,
    pub tx: mpsc::Sender<OutputSignal>,
    pub rank: Arc<RankShared>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(route) = self.route.take() {
            self.rank.remove(&route);
        }
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
