//! The record of every worker's lifecycle in a scaled run (`lifecycle_operations`).

use serde::Serialize;

/// A worker pool, as the reference names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolName {
    /// The single pool of an aggregated cluster.
    Agg,
    /// A disaggregated cluster's prefill pool.
    Prefill,
    /// A disaggregated cluster's decode pool.
    Decode,
}

/// Where a worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Waiting out `startup_time`: no work, unknown to the router.
    Starting,
    /// Serving.
    Active,
    /// Takes no new work; finishes what it has.
    Draining,
    /// Gone.
    Removed,
}

/// A change of one worker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    /// Created, waiting out its start-up.
    WorkerStarting,
    /// Became active.
    WorkerReady,
    /// Began draining.
    WorkerDraining,
    /// Removed (drained, or its start-up cancelled).
    WorkerRemoved,
}

/// Why an operation happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationCause {
    /// A policy decision.
    PlannerScale,
    /// A start-up ended.
    WorkerReadyEvent,
    /// Drained workers were removed.
    DrainSettlement,
}

/// One worker's transition within an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    /// Worker id in its pool.
    pub worker_id: usize,
    /// What happened.
    pub transition: TransitionKind,
    /// State before (`None` for a new worker).
    pub prior_state: Option<WorkerState>,
    /// State after.
    pub state: WorkerState,
    /// The operation that began this worker's current phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin_operation_ordinal: Option<u64>,
    /// `startup_cancelled` on the removal of a starting worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

/// A pool's worker ids by state, ascending.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PoolState {
    /// Serving.
    pub active: Vec<usize>,
    /// Waiting out their start-up.
    pub starting: Vec<usize>,
    /// Draining.
    pub draining: Vec<usize>,
}

/// One batch of transitions in one pool at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LifecycleOperation {
    /// 0, 1, 2, ... across both pools.
    pub operation_ordinal: u64,
    /// Simulated time, ms.
    pub at_ms: f64,
    /// The pool.
    pub pool: PoolName,
    /// Why.
    pub cause: OperationCause,
    /// The tick that caused it (`planner_scale` only).
    pub planner_tick_ordinal: Option<u64>,
    /// The operation that started (or drained) the workers this one finishes.
    pub origin_operation_ordinal: Option<u64>,
    /// Added, newly draining, then removed workers.
    pub transitions: Vec<Transition>,
    /// The pool's ids after the batch.
    pub state_after_batch: PoolState,
    /// Router-queued requests this change let the router place.
    pub topology_released_request_uuids: Vec<String>,
}
