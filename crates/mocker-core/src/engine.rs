//! The engine: one rank's scheduler chosen by backend, built from one options value.

use crate::config::{Backend, EngineConfig};
use crate::events::KvEvent;
use crate::kv::BlockPool;
use crate::metrics::EngineMetrics;
use crate::request::{Request, SeqKey};
use crate::scheduler::vllm::{Reservation, ReserveError, VllmScheduler};
use crate::scheduler::{Pass, PrefixCacheBusy, SchedulerOptions, SubmitError};
use crate::timing::{build_timing_model, TimingModelError};

/// Everything needed to build an engine.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Engine configuration (validated by the config module).
    pub config: EngineConfig,
    /// Data-parallel rank stamped on events and metrics.
    pub dp_rank: u32,
    /// Produce KV events in each pass (live shells do; offline replay need not).
    pub record_kv_events: bool,
}

/// Why an engine could not be built or a request not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The configured timing model cannot be built.
    #[error(transparent)]
    Timing(#[from] TimingModelError),
    /// The backend is not simulated yet.
    #[error("engine.backend: {0:?} is not supported yet; expected one of: vllm, trtllm")]
    UnsupportedBackend(Backend),
    /// The request is malformed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
}

/// One simulated engine rank: submit requests, then step forward passes.
#[derive(Debug)]
pub struct Engine {
    scheduler: VllmScheduler,
}

impl Engine {
    /// Builds an engine.
    pub fn new(options: EngineOptions) -> Result<Self, EngineError> {
        let EngineOptions { config, dp_rank, record_kv_events } = options;
        if config.backend == Backend::Sglang {
            return Err(EngineError::UnsupportedBackend(config.backend));
        }
        let timing = build_timing_model(&config)?;
        let scheduler = VllmScheduler::new(&config, timing, SchedulerOptions { dp_rank, record_kv_events });
        Ok(Self { scheduler })
    }

    /// Queues a request for admission by the next pass.
    pub fn submit(&mut self, request: Request) -> Result<SeqKey, EngineError> {
        Ok(self.scheduler.submit(request)?)
    }

    /// Runs one forward pass starting at simulated time `now_ns`.
    pub fn step(&mut self, now_ns: u64) -> &Pass {
        self.scheduler.step(now_ns)
    }

    /// The most recent pass; its outputs are valid until the next `step`, so a shell can
    /// deliver them at the pass end without copying.
    pub fn last_pass(&self) -> &Pass {
        self.scheduler.last_pass()
    }

    /// Drops every cached block when none is in use (vLLM's `reset_prefix_cache`);
    /// returns the `Cleared` event when KV events are recorded.
    pub fn reset_prefix_cache(&mut self) -> Result<Option<KvEvent>, PrefixCacheBusy> {
        self.scheduler.reset_prefix_cache()
    }

    /// Cancels the request with id `uuid`: removes it if waiting or running (freeing its
    /// blocks) and drops its outputs still pending in the last pass. Returns whether
    /// anything was removed. Scans the engine; shells that kept the key use [`Engine::cancel_key`].
    pub fn cancel(&mut self, uuid: u128) -> bool {
        self.scheduler.find(uuid).is_some_and(|key| self.scheduler.cancel(key, uuid))
    }

    /// [`Engine::cancel`] by the key `submit` returned; `uuid` guards against a reused key.
    pub fn cancel_key(&mut self, key: SeqKey, uuid: u128) -> bool {
        self.scheduler.cancel(key, uuid)
    }

    /// Queues a disaggregation source: when it finishes, its KV stays held (for the
    /// transfer) until [`Engine::release_held`] or a cancellation.
    pub fn submit_held(&mut self, request: Request) -> Result<SeqKey, EngineError> {
        Ok(self.scheduler.submit_held(request)?)
    }

    /// Frees a finished source's held KV; false when `key` is not a held source.
    pub fn release_held(&mut self, key: SeqKey, uuid: u128) -> bool {
        self.scheduler.release_held(key, uuid)
    }

    /// Reserves a disaggregation destination's prompt blocks now; it decodes after
    /// [`Engine::activate`].
    pub fn reserve(&mut self, request: Request) -> Result<Reservation, ReserveError> {
        self.scheduler.reserve(request)
    }

    /// Activates a reserved destination (its prompt KV has arrived); returns the Stored
    /// events of its prompt blocks, or `None` when `key` is not a reserved destination.
    pub fn activate(&mut self, key: SeqKey, uuid: u128) -> Option<Vec<KvEvent>> {
        self.scheduler.activate(key, uuid)
    }

    /// Held sources plus reserved destinations (outside the running and waiting queues).
    pub fn num_parked(&self) -> usize {
        self.scheduler.num_parked()
    }

    /// Whether the engine holds requests (a pass would do something).
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// Requests held (running plus waiting).
    pub fn num_requests(&self) -> usize {
        self.scheduler.num_requests()
    }

    /// Current engine metrics.
    pub fn metrics(&self) -> EngineMetrics {
        self.scheduler.metrics()
    }

    /// The KV block pool, for inspection.
    pub fn pool(&self) -> &BlockPool {
        self.scheduler.pool()
    }
}
