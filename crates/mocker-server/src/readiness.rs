//! The simulated engine startup (`startup_time`): when the engine is up, and the 503
//! answered until then.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::ApiError;

/// When the simulated engine finishes starting (`startup_time` after the server started).
#[derive(Debug, Clone, Copy)]
pub struct Readiness {
    ready_at: Instant,
    startup: Duration,
}

impl Readiness {
    /// Ready `startup` from now.
    pub fn after(startup: Duration) -> Self {
        Self { ready_at: Instant::now() + startup, startup }
    }

    /// Whether the engine is up.
    pub fn is_ready(&self) -> bool {
        Instant::now() >= self.ready_at
    }

    /// How long until it is (zero once it is).
    pub fn ready_in(&self) -> Duration {
        self.ready_at.saturating_duration_since(Instant::now())
    }

    /// The 503 answered while it is not.
    pub fn starting_error(&self) -> ApiError {
        let left = self.ready_at.saturating_duration_since(Instant::now());
        ApiError::unavailable(format!(
            "the engine is starting up (startup_time {} s); ready in {:.1} s",
            self.startup.as_secs_f64(),
            left.as_secs_f64()
        ))
    }
}
