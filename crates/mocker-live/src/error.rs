//! Errors of the live engine, worded like the reference's (live.md quotes them).

/// Why a live-engine operation failed. Clone, so that every caller of `shutdown` sees the
/// same result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    /// Built outside a tokio runtime.
    #[error("LiveEngine::start requires an active Tokio runtime")]
    NoRuntime,
    /// The engine configuration or options are invalid.
    #[error("invalid Mocker engine arguments: {0}")]
    InvalidArguments(String),
    /// The engine (or this rank) has stopped or is shutting down.
    #[error("live Mocker engine is not running")]
    NotRunning,
    /// The engine that issued a handle is gone.
    #[error("live Mocker engine no longer exists")]
    EngineGone,
    /// A request with an empty effective output.
    #[error("live requests must generate at least one output token")]
    NoOutputTokens,
    /// The caller's request id is in use by an active request.
    #[error("request {0} is already active")]
    AlreadyActive(uuid::Uuid),
    /// A registration was handed to an engine other than the one that prepared it.
    #[error("prepared request belongs to a different live Mocker engine")]
    ForeignRegistration,
    /// The core refused the request (empty prompt, ...).
    #[error("invalid request {id}: {message}")]
    InvalidRequest {
        /// Client id of the request.
        id: uuid::Uuid,
        /// The core's reason.
        message: String,
    },
    /// The command lane is closed (the scheduler actor is gone).
    #[error("Mocker scheduler is not accepting commands")]
    NotAcceptingCommands,
    /// The actor dropped a command without answering.
    #[error("Mocker scheduler dropped a command acknowledgement")]
    CommandAckDropped,
    /// The cancellation lane is closed.
    #[error("Mocker scheduler is not accepting cancellations")]
    NotAcceptingCancellations,
    /// The actor dropped a cancellation without answering.
    #[error("Mocker scheduler dropped a cancellation acknowledgement")]
    CancellationAckDropped,
    /// The prefix cache is in use.
    #[error("{0}")]
    PrefixCacheBusy(String),
    /// The scheduler actor failed (returned an error).
    #[error("live Mocker scheduler failed: {0}")]
    SchedulerFailed(String),
    /// The scheduler actor task panicked or was aborted.
    #[error("live Mocker scheduler task failed: {0}")]
    SchedulerTaskFailed(String),
    /// The admission observer's receiver was dropped while the engine ran.
    #[error("live Mocker event dispatcher failed: live Mocker admission receiver closed")]
    AdmissionReceiverClosed,
    /// Routes survived shutdown (a bug, reported rather than hidden).
    #[error("live Mocker shutdown left active request routes")]
    LeakedRoutes,
    /// `register_handoff` for an id whose route is still registered.
    #[error("handoff HandoffId({0}) already has a lifecycle route")]
    HandoffRouteExists(uuid::Uuid),
    /// `register_handoff` while the previous generation still runs a command.
    #[error("handoff HandoffId({0}) still has a scheduler command in progress")]
    HandoffCommandInProgress(uuid::Uuid),
    /// A control of an earlier registration of the id.
    #[error("handoff HandoffId({0}) control belongs to an earlier registration")]
    StaleHandoffControl(uuid::Uuid),
    /// The route's events were dropped before a submission through it.
    #[error("handoff HandoffId({0}) lifecycle route is no longer registered")]
    HandoffRouteGone(uuid::Uuid),
    /// The scheduler could not apply a handoff command.
    #[error("unexpected scheduler handoff result for HandoffId({0}): {1}")]
    UnexpectedHandoffResult(uuid::Uuid, String),
    /// Handoff routes survived shutdown.
    #[error("live Mocker shutdown left active handoff routes")]
    LeakedHandoffRoutes,
}
