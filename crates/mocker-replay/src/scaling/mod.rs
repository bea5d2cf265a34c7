//! Scaling in the loop: a policy called on simulated-time ticks sets how many workers each
//! pool should have; new workers serve after their launch's `startup_time`, removed ones
//! drain. The types here are what a policy sees and returns, and the record of every
//! worker's lifecycle; the driver applies them (`driver::scaling`).

mod lifecycle;
mod plan;
mod policy;
mod snapshot;
mod traffic;

pub use lifecycle::{
    LifecycleOperation, OperationCause, PoolName, PoolState, Transition, TransitionKind, WorkerState,
};
pub use plan::{PlanStep, ScalingPlan};
pub use policy::{PolicyError, ScalingDecision, ScalingPolicy};
pub use snapshot::{ClusterSnapshot, FpmEntry};
pub use traffic::{TrafficStats, TrafficWindow};
