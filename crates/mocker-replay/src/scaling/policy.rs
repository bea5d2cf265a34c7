//! The policy protocol: one call for the first tick's time, then one per tick.

use super::snapshot::ClusterSnapshot;

/// What a policy wants after a tick (the reference's `on_tick` result).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScalingDecision {
    /// Desired non-draining (active + starting) prefill workers; `None` keeps the count.
    /// Ignored by an aggregated cluster.
    pub target_prefill: Option<usize>,
    /// Desired non-draining decode workers (an aggregated cluster's whole pool).
    pub target_decode: Option<usize>,
    /// Absolute simulated ms of the next tick; `None`, a time not after this tick, or a
    /// non-finite value stops ticking for good.
    pub next_tick_ms: Option<f64>,
}

/// A policy failed; the replay stops with this message (a Python policy keeps its
/// exception aside and re-raises it unchanged).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// Decides pool sizes on simulated-time ticks (the reference's `scaling_policy` object).
pub trait ScalingPolicy {
    /// Simulated ms of the first tick: fired at `max(t, 0)`; a non-finite value disables
    /// ticking for the whole run.
    fn initial_tick_ms(&mut self) -> Result<f64, PolicyError>;
    /// Called once per tick with the cluster's settled state at that instant.
    fn on_tick(&mut self, snapshot: &ClusterSnapshot) -> Result<ScalingDecision, PolicyError>;
}
