//! The messages that travel from the client handles to the actor: commands applied at pass
//! boundaries, the cancellation lane served even mid-pass, and the registered submission
//! that rides inside a command.

use std::sync::Arc;

use mocker_core::Request;
use tokio::sync::{mpsc, oneshot};

use crate::error::LiveError;
use crate::handoff::HandoffRoute;
use crate::route::{RankShared, Route};
use crate::signal::OutputSignal;

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
    /// Change the speed-up ratio of every rank of the group from the next pass on.
    SetSpeedupRatio {
        ratio: f64,
        reply: oneshot::Sender<()>,
    },
    /// Abort every request of the rank, then drop its prefix cache (vLLM's sleep); the
    /// reply is how many requests were aborted.
    AbortAllAndReset {
        rank: u32,
        reply: oneshot::Sender<Result<usize, LiveError>>,
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
