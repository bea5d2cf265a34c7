//! vLLM's sleep mode (`--enable-sleep-mode`): `POST /sleep?level=1|2`, `POST /wake_up`
//! (optional repeated `?tags=weights|kv_cache`) and `GET /is_sleeping`.
//!
//! As vLLM (which serves these routes only in dev mode, with its engine started with
//! `enable_sleep_mode`): sleeping aborts every in-flight request (vLLM's default `abort`
//! pause mode: their streams end with an error), frees all KV and drops the prefix cache,
//! publishing `AllBlocksCleared` when KV events are on. While asleep, the inference routes
//! answer 503; `/tokenize`, `/v1/models`, `/metrics` and the rest keep working. A partial
//! wake-up (`tags=weights` only) still leaves the engine asleep until `kv_cache` wakes too.
//! Levels 1 (weights offloaded) and 2 (weights discarded) differ only in what a GPU would
//! keep: the simulation has no weights, so both behave alike. Without the flag the routes
//! answer 404, as in vLLM without dev mode.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::error::ApiError;

/// The memory tags vLLM puts to sleep and wakes separately.
pub const TAGS: [&str; 2] = ["weights", "kv_cache"];

/// Which tags are asleep (none: awake).
#[derive(Debug, Default)]
pub struct SleepMode {
    asleep: Mutex<BTreeSet<&'static str>>,
}

impl SleepMode {
    /// Whether the engine is asleep (any tag still sleeping).
    pub fn is_sleeping(&self) -> bool {
        !self.asleep.lock().expect("sleep state").is_empty()
    }

    /// The tags asleep now, to change them.
    pub fn asleep(&self) -> std::sync::MutexGuard<'_, BTreeSet<&'static str>> {
        self.asleep.lock().expect("sleep state")
    }

    /// The 503 every inference request gets while asleep.
    pub fn sleeping_error() -> ApiError {
        ApiError::unavailable("the model is sleeping (POST /sleep); wake it up with POST /wake_up")
    }
}
