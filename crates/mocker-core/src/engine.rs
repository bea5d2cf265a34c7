//! The engine: one rank's scheduler chosen by backend, built from one options value.

use crate::config::{Backend, EngineConfig};
use crate::events::KvEvent;
use crate::kv::{BlockPool, RadixCache};
use crate::metrics::{EngineMetrics, LoraActivity};
use crate::request::{Request, SeqKey};
use crate::scheduler::sglang::SglangScheduler;
use crate::scheduler::vllm::{GroupedFault, Reservation, ReserveError, VllmScheduler};
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
    /// Report steady decode tokens (mid-stream, one per pass) as a count in
    /// [`Pass::steady_count`] rather than one `Output` each, so a pass costs what changes
    /// in it rather than the batch size. For shells that only aggregate tokens (offline
    /// replay without a per-request log); streaming shells need every token. The vLLM and
    /// TRT-LLM cores honour it; SGLang itemizes regardless.
    pub aggregate_steady_tokens: bool,
    /// Identify blocks of generated tokens (without planned output) by
    /// [`unique_block_identity`](crate::hashing::unique_block_identity) instead of content
    /// hashes. For shells whose prompts never contain earlier outputs and whose KV events
    /// stay in the process (offline replay): prefix hits are unchanged, hash values are not
    /// the reference's.
    pub opaque_output_blocks: bool,
    /// Offset of this rank's MTP sampler seed from `aic_mtp_seed` (wrapping add): the
    /// reference gives rank `r` of worker `w` the offset `w * dp_size + r`, so ranks draw
    /// distinct, reproducible acceptance streams.
    pub seed_offset: u64,
    /// Ranks in this rank's data-parallel group (0 and 1 both mean none): SGLang ranks
    /// split `chunked_prefill_size` between them and scale `schedule_conservativeness` by
    /// 0.3 (SGLang's attention-DP launch normalization), vLLM ranks follow
    /// `prefill_schedule_interval`. Groups step in lock-step waves (`crate::wave`).
    pub dp_size: usize,
    /// Most distinct LoRA adapters in one batch (vLLM's `--max-loras`); 0 serves none and
    /// refuses requests that name one. A waiting request whose adapter would exceed it is
    /// passed over until a batch slot's adapter finishes. vLLM and TRT-LLM cores only.
    pub max_loras: usize,
}

/// Why an engine could not be built or a request not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The configured timing model cannot be built.
    #[error(transparent)]
    Timing(#[from] TimingModelError),
    /// The request is malformed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// SGLang data-parallel ranks split `chunked_prefill_size`; it must leave each one token.
    #[error("engine.sglang.chunked_prefill_size: dp_size {dp_size} reduces chunked_prefill_size={chunked_prefill_size} to zero per rank")]
    DpChunkedPrefill {
        /// Ranks in the group.
        dp_size: usize,
        /// The configured size.
        chunked_prefill_size: usize,
    },
    /// LoRA adapters (`max_loras` > 0) on a backend or KV tier that does not model them.
    #[error(
        "max_loras: LoRA adapters are simulated on the vllm and trtllm backends, without native_host_offload"
    )]
    LoraUnsupported,
}

/// The scheduler core of the configured backend. The vLLM core is stored inline so its
/// hot path costs one predictable branch per call.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one engine per rank; inline vLLM avoids an indirection
enum Core {
    Vllm(VllmScheduler),
    Sglang(Box<SglangScheduler>),
}

/// Calls the same method on whichever core the engine has.
macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match &$self.core {
            Core::Vllm($s) => $e,
            Core::Sglang($s) => $e,
        }
    };
    (mut $self:ident, $s:ident => $e:expr) => {
        match &mut $self.core {
            Core::Vllm($s) => $e,
            Core::Sglang($s) => $e,
        }
    };
}

/// One simulated engine rank: submit requests, then step forward passes.
#[derive(Debug)]
pub struct Engine {
    core: Core,
}

impl Engine {
    /// Builds an engine.
    pub fn new(options: EngineOptions) -> Result<Self, EngineError> {
        let EngineOptions {
            config,
            dp_rank,
            record_kv_events,
            aggregate_steady_tokens,
            opaque_output_blocks,
            seed_offset,
            dp_size,
            max_loras,
        } = options;
        if max_loras > 0 && (config.backend == Backend::Sglang || config.native_host_offload.is_some()) {
            return Err(EngineError::LoraUnsupported);
        }
        let timing = build_timing_model(&config)?;
        let dp_size = dp_size.max(1);
        let opts = SchedulerOptions {
            dp_rank,
            record_kv_events,
            aggregate_steady_tokens,
            opaque_output_blocks,
            seed_offset,
            dp_size: dp_size.min(u32::MAX as usize) as u32,
            max_loras: max_loras.min(u32::MAX as usize) as u32,
        };
        let core = match config.backend {
            Backend::Sglang => {
                let mut config = config;
                if dp_size > 1 {
                    let s = &mut config.sglang;
                    let chunked_prefill_size = s.chunked_prefill_size;
                    if chunked_prefill_size < dp_size {
                        return Err(EngineError::DpChunkedPrefill { dp_size, chunked_prefill_size });
                    }
                    s.chunked_prefill_size /= dp_size;
                    s.schedule_conservativeness *= 0.3;
                }
                Core::Sglang(Box::new(SglangScheduler::new(&config, timing, opts)))
            }
            Backend::Vllm | Backend::Trtllm => Core::Vllm(VllmScheduler::new(&config, timing, opts)),
        };
        Ok(Self { core })
    }

    /// The simulated backend family (`Trtllm` shares the vLLM core and reports `Vllm`).
    pub fn backend(&self) -> Backend {
        match self.core {
            Core::Vllm(_) => Backend::Vllm,
            Core::Sglang(_) => Backend::Sglang,
        }
    }

    /// Queues a request for admission by the next pass.
    pub fn submit(&mut self, request: Request) -> Result<SeqKey, EngineError> {
        if request.lora.is_some() && matches!(self.core, Core::Sglang(_)) {
            return Err(SubmitError::LoraDisabled(request.uuid).into());
        }
        Ok(dispatch!(mut self, s => s.submit(request))?)
    }

    /// The LoRA adapters with running and waiting requests (empty without LoRA).
    pub fn lora_activity(&self) -> LoraActivity {
        match &self.core {
            Core::Vllm(s) => s.lora_activity(),
            Core::Sglang(_) => LoraActivity::default(),
        }
    }

    /// Runs one forward pass starting at simulated time `now_ns`.
    #[inline]
    pub fn step(&mut self, now_ns: u64) -> &Pass {
        dispatch!(mut self, s => s.step(now_ns))
    }

    /// Sets the wave counter of the coming pass (data-parallel groups, see `crate::wave`).
    pub(crate) fn prepare_wave(&mut self, wave_step: u64) {
        if let Core::Vllm(s) = &mut self.core {
            s.prepare_wave(wave_step);
        }
    }

    /// Whether the last pass computed prompt tokens.
    pub(crate) fn last_pass_prefilled(&self) -> bool {
        self.last_pass().metrics.sum_prefill_tokens > 0
    }

    /// Ends a wave of this rank's data-parallel group for SGLang's `prefill_decode_interval`,
    /// which counts the group's rounds: `stepped` whether this rank ran a pass in it,
    /// `prefilled` whether any rank computed prefill.
    pub(crate) fn end_group_round(&mut self, stepped: bool, prefilled: bool) {
        if let Core::Sglang(s) = &mut self.core {
            s.end_group_round(stepped, prefilled);
        }
    }

    /// Moves the last pass's end to its group's wave end `end_ns` (not before its own).
    pub(crate) fn stretch_last_pass(&mut self, end_ns: u64) {
        dispatch!(mut self, s => s.stretch_last_pass(end_ns))
    }

    /// When an idle engine must step again although it has no work now: the next completion
    /// of a host-tier transfer (`native_host_offload`), which may wake a waiting request.
    pub fn next_wake_ns(&self) -> Option<u64> {
        match &self.core {
            Core::Vllm(s) => s.next_wake_ns(),
            Core::Sglang(_) => None,
        }
    }

    /// The last pass completes (the shell reached its end): runs what waits for that, the
    /// host/G3 boundary of an engine sharing a G3 tier. Stepping does it too if not done.
    pub fn complete_pass(&mut self) {
        if let Core::Vllm(s) = &mut self.core {
            s.complete_pass();
        }
    }

    /// Lets host and G3 transfers still in flight finish, at the end of a run (vLLM with
    /// `native_host_offload`); returns whether any was. The engine must not step after.
    pub fn settle_transfers(&mut self) -> bool {
        match &mut self.core {
            Core::Vllm(s) => s.settle_transfers(),
            Core::Sglang(_) => false,
        }
    }

    /// The G3 tier's counters (`g3_offload`), if configured (vLLM).
    pub fn g3_stats(&self) -> Option<crate::kv::G3Stats> {
        match &self.core {
            Core::Vllm(s) => s.g3_tier().map(|t| t.lock().expect("G3 tier lock").stats()),
            Core::Sglang(_) => None,
        }
    }

    /// The G3 tier this engine uses, if configured; engines handed the same tier through
    /// [`Self::share_g3`] share it (`cluster_shared`).
    pub fn g3_tier(&self) -> Option<crate::kv::SharedG3> {
        match &self.core {
            Core::Vllm(s) => s.g3_tier().cloned(),
            Core::Sglang(_) => None,
        }
    }

    /// Makes this engine worker `worker` of `tier` (a `cluster_shared` G3 tier one
    /// deployment shares) in place of its own. Call before the engine runs.
    pub fn share_g3(&mut self, tier: crate::kv::SharedG3, worker: usize) {
        if let Core::Vllm(s) = &mut self.core {
            s.share_g3(tier, worker);
        }
    }

    /// Turns the last pass into a run of the passes that would follow it back to back, as
    /// long as each only counts the steady tokens of every running request, nothing waits
    /// and the run ends by `max_end_ns`: a discrete-event shell then handles one event for
    /// many passes. The engine is left as if stepped through each pass (the last pass
    /// describes the run, see `Pass::run_ends`); [`Self::truncate_steady_run`] undoes the
    /// passes a submission would have preceded. Needs `aggregate_steady_tokens`; SGLang
    /// engines make no runs. Returns the passes added.
    pub fn extend_steady_run(&mut self, max_end_ns: u64) -> u32 {
        match &mut self.core {
            Core::Vllm(s) => s.extend_steady_run(max_end_ns),
            Core::Sglang(_) => 0,
        }
    }

    /// Drops the passes of the current run that start at or after `t_ns` (a request
    /// arrives then, and the pass starting then must see it); the first pass stays.
    pub fn truncate_steady_run(&mut self, t_ns: u64) {
        if let Core::Vllm(s) = &mut self.core {
            s.truncate_steady_run(t_ns);
        }
    }

    /// The most recent pass; its outputs are valid until the next `step`, so a shell can
    /// deliver them at the pass end without copying.
    pub fn last_pass(&self) -> &Pass {
        dispatch!(self, s => s.last_pass())
    }

    /// Changes the speed-up ratio of the passes stepped from now on (a live server's
    /// runtime control); passes already computed keep theirs. The ratio must be positive
    /// and finite.
    pub fn set_speedup_ratio(&mut self, ratio: f64) {
        debug_assert!(ratio.is_finite() && ratio > 0.0, "speed-up ratio {ratio}");
        dispatch!(mut self, s => s.set_speedup_ratio(ratio))
    }

    /// Drops every cached block when none is in use (vLLM's `reset_prefix_cache`);
    /// returns the `Cleared` event when KV events are recorded.
    pub fn reset_prefix_cache(&mut self) -> Result<Option<KvEvent>, PrefixCacheBusy> {
        dispatch!(mut self, s => s.reset_prefix_cache())
    }

    /// Cancels the request with id `uuid`: removes it if waiting or running (freeing its
    /// blocks) and drops its outputs still pending in the last pass. Returns whether
    /// anything was removed. Scans the engine; shells that kept the key use [`Engine::cancel_key`].
    pub fn cancel(&mut self, uuid: u128) -> bool {
        dispatch!(mut self, s => s.find(uuid).is_some_and(|key| s.cancel(key, uuid)))
    }

    /// [`Engine::cancel`] by the key `submit` returned; `uuid` guards against a reused key.
    pub fn cancel_key(&mut self, key: SeqKey, uuid: u128) -> bool {
        dispatch!(mut self, s => s.cancel(key, uuid))
    }

    /// Queues a disaggregation source: when it finishes, its KV stays held (for the
    /// transfer) until [`Engine::release_held`] or a cancellation.
    pub fn submit_held(&mut self, request: Request) -> Result<SeqKey, EngineError> {
        Ok(dispatch!(mut self, s => s.submit_held(request))?)
    }

    /// Frees a finished source's held KV; false when `key` is not a held source.
    pub fn release_held(&mut self, key: SeqKey, uuid: u128) -> bool {
        dispatch!(mut self, s => s.release_held(key, uuid))
    }

    /// Reserves a disaggregation destination's prompt blocks (pages) now; it decodes after
    /// [`Engine::activate`].
    pub fn reserve(&mut self, request: Request) -> Result<Reservation, ReserveError> {
        dispatch!(mut self, s => s.reserve(request))
    }

    /// Activates a reserved destination (its prompt KV has arrived); returns the Stored
    /// events of its prompt blocks, or `None` when `key` is not a reserved destination.
    pub fn activate(&mut self, key: SeqKey, uuid: u128) -> Option<Vec<KvEvent>> {
        dispatch!(mut self, s => s.activate(key, uuid))
    }

    /// Changes whenever the engine gives KV capacity or a batch slot back (a request
    /// finishes, is preempted, retracted or let go); a destination that found no room is
    /// retried only once it has changed, as in the reference.
    pub fn capacity_generation(&self) -> u64 {
        match &self.core {
            Core::Vllm(s) => s.capacity_generation(),
            Core::Sglang(s) => s.capacity_generation(),
        }
    }

    /// Tells the engine whether disaggregation destinations wait for a reservation on it:
    /// while they do, it admits only activated destinations (a preempted or retracted
    /// request recomputing waits), as in the reference.
    pub fn set_destinations_pending(&mut self, pending: bool) {
        dispatch!(mut self, s => s.set_destinations_pending(pending))
    }

    /// Whether the running batch is at `max_num_seqs` (vLLM/TRT-LLM; SGLang: never, its
    /// destinations are not gated on it).
    pub fn batch_full(&self) -> bool {
        match &self.core {
            Core::Vllm(s) => s.batch_full(),
            Core::Sglang(_) => false,
        }
    }

    /// Held sources plus reserved destinations (outside the running and waiting queues).
    pub fn num_parked(&self) -> usize {
        dispatch!(self, s => s.num_parked())
    }

    /// KV capacity in blocks (SGLang: pages), for sizing checks.
    pub fn kv_capacity_blocks(&self) -> usize {
        match &self.core {
            Core::Vllm(s) => s.pool().capacity(),
            Core::Sglang(s) => s.cache().total_pages(),
        }
    }

    /// The first forward pass this engine could never run, if any: a pass of cache groups
    /// larger than the whole byte budget (its request was rejected). A shell that mirrors
    /// the reference stops with it (offline replay does).
    pub fn fault(&self) -> Option<&GroupedFault> {
        match &self.core {
            Core::Vllm(s) => s.fault(),
            Core::Sglang(_) => None,
        }
    }

    /// Whether the engine holds requests (a pass would do something).
    pub fn has_work(&self) -> bool {
        dispatch!(self, s => s.has_work())
    }

    /// With `kv_cache_groups`: the pages and bytes each group's live requests hold, in the
    /// configured groups' order (empty without groups).
    pub fn kv_group_usage(&self) -> Vec<(u64, u64)> {
        match &self.core {
            Core::Vllm(s) => s.kv_group_usage(),
            Core::Sglang(_) => Vec::new(),
        }
    }

    /// What waits in the scheduler's queue now (vLLM; SGLang reports nothing queued yet).
    pub fn queued_work(&self) -> crate::metrics::QueuedWork {
        match &self.core {
            Core::Vllm(s) => s.queued_work(),
            Core::Sglang(_) => crate::metrics::QueuedWork::default(),
        }
    }

    /// Requests held (running plus waiting).
    pub fn num_requests(&self) -> usize {
        dispatch!(self, s => s.num_requests())
    }

    /// Current engine metrics.
    pub fn metrics(&self) -> EngineMetrics {
        dispatch!(self, s => s.metrics())
    }

    /// The vLLM/TRT-LLM block pool, for inspection (`None` for SGLang, see [`Engine::radix`]).
    pub fn pool(&self) -> Option<&BlockPool> {
        match &self.core {
            Core::Vllm(s) => Some(s.pool()),
            Core::Sglang(_) => None,
        }
    }

    /// The SGLang radix cache, for inspection (`None` for vLLM/TRT-LLM).
    pub fn radix(&self) -> Option<&RadixCache> {
        match &self.core {
            Core::Vllm(_) => None,
            Core::Sglang(s) => Some(s.cache()),
        }
    }

    /// Whether the prefix cache holds the block (page) with sequence hash `hash`.
    pub fn is_cached(&self, hash: u64) -> bool {
        match &self.core {
            Core::Vllm(s) => s.pool().contains(hash),
            Core::Sglang(s) => s.cache().contains(hash),
        }
    }

    /// Checks the KV bookkeeping invariants of either backend (for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        match &self.core {
            Core::Vllm(s) => s.pool().check_invariants(),
            Core::Sglang(s) => s.check_invariants(),
        }
    }
}
