//! The vLLM v1 scheduling step (also TRT-LLM's `guaranteed_no_evict`, as a policy switch):
//! one token budget per pass, running requests first, then admissions from the waiting
//! queue, chunked prefill and recompute preemption.

use std::collections::VecDeque;

use crate::config::{Backend, EngineConfig, PreemptionMode, WorkerType};
use crate::events::{KvEvent, KvEventData, StoredBlock};
use crate::hashing::{chain_hash, extend_hashes, local_block_hash, unique_block_identity, PromptHashes};
use crate::kv::{BlockId, BlockPool, GroupLease, GroupedPool, Scope};
use crate::metrics::{EngineMetrics, ForwardPassMetrics, LoraActivity, Moments, QueuedWork};
use crate::request::{Admission, LoraRef, Output, OutputToken, Request, SeqKey};
use crate::timing::{pass_ms, scaled_nanos, PassWork, TimingModel};

use super::{Pass, PrefixCacheBusy, RunEntry, SchedulerOptions, SubmitError};

mod g3;
mod grouped;
mod handoff;
mod mtp;
mod offload;
mod state;
mod steady;
pub use grouped::GroupedFault;
pub use handoff::{Reservation, ReserveError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Fresh,
    Running,
    Preempted,
    /// A disaggregation destination whose prompt blocks are reserved, not yet activated.
    Reserved,
    /// An activated destination (its prompt KV arrived) waiting to join the batch.
    Landed,
    /// A finished disaggregation source that keeps its KV until released.
    Held,
}

#[derive(Debug)]
struct Seq {
    uuid: u128,
    prompt: Vec<u32>,
    planned: Option<Vec<u32>>,
    max_output: u32,
    prompt_len: u32,
    /// Prompt plus generated tokens; the last generated token is not yet computed.
    len: u32,
    num_computed: u32,
    generated: u32,
    status: Status,
    blocks: Vec<BlockId>,
    /// Sequence hashes of full blocks known so far (all prompt blocks, then generated ones
    /// as they are computed). Empty when prefix caching is off.
    hashes: Vec<u64>,
    /// The local hash of each of `hashes`, for Stored events; kept only when KV events are
    /// recorded (empty otherwise).
    local_hashes: Vec<u64>,
    first_cached: Option<u32>,
    /// Submission order on this engine: activated destinations rejoin the waiting queue
    /// in it (as the reference restores them).
    order: u64,
    /// Blocks from this index on are private to the request (`Request::shareable_blocks`;
    /// `u32::MAX` when none are).
    private_from: u32,
    /// Its private blocks are indexed: it was preempted and looks them up again.
    published: bool,
    sent_first: bool,
    /// Finished in the current pass; retired once emission is done.
    done: bool,
    /// Keep the KV after finishing (a disaggregation source), until released.
    hold: bool,
    /// When and in which pass the previous token was emitted.
    last_token_ns: u64,
    last_token_pass: u64,
    /// Pass in which `pass_*` were recorded.
    pass_id: u64,
    pass_tokens: u32,
    pass_prompt_tokens: u32,
    pass_prefix: u32,
    /// Counted in this pass's decode batch.
    pass_decode: bool,
    /// Host-offload connector state (only with `native_host_offload`).
    host: Option<offload::HostSeq>,
    /// What it holds in the cache groups (only with `kv_cache_groups`; `blocks` stays
    /// empty then).
    lease: GroupLease,
    /// Its recurrent state (only with `state_cache`, from its first allocation).
    state: Option<Box<state::SeqState>>,
    /// The LoRA adapter it runs with.
    lora: Option<LoraRef>,
    /// What its first block's hash chains onto (the adapter's root; `None` for the base model).
    hash_root: Option<u64>,
}

impl Seq {
    /// How block `blk` is registered: shared below `private_from`, else private until the
    /// request is published (preempted), silent after. An engine that records no KV events
    /// announces nothing, so its shared blocks are registered silent: their evictions then
    /// collect no hashes only to be dropped.
    fn scope_of(&self, blk: u32, announces: bool) -> Scope {
        match (blk >= self.private_from, self.published) {
            (false, _) if announces => Scope::Shared,
            (false, _) => Scope::Silent,
            (true, false) => Scope::Private,
            (true, true) => Scope::Silent,
        }
    }

    /// Appends the tokens of block `blk` to `out`.
    fn extend_block_tokens(&self, blk: u32, bs: u32, out: &mut Vec<u32>) {
        super::extend_tokens(&self.prompt, self.planned.as_deref(), self.uuid, blk * bs..(blk + 1) * bs, out);
    }

    /// `max_output` already includes the `max_model_len` cap (see `submit`).
    #[inline]
    fn generation_complete(&self) -> bool {
        self.generated >= self.max_output
    }
}

enum Scheduled {
    Yes,
    Blocked,
    CurrentPreempted,
    /// Align mode: its next aligned chunk does not fit what is left of the budget; later
    /// running requests may still use it.
    Skipped,
}

/// Prefix-cache cost of admitting a waiting request.
#[derive(Debug, Clone, Copy, Default)]
struct PrefillCost {
    cached: u32,
    active_cached: u32,
}

/// One rank's vLLM-style scheduler, KV pool and timing model: a deterministic state machine
/// stepped one forward pass at a time.
#[derive(Debug)]
pub struct VllmScheduler {
    block_size: u32,
    num_gpu_blocks: usize,
    max_num_seqs: usize,
    max_num_batched_tokens: u32,
    max_model_len: Option<usize>,
    chunked_prefill: bool,
    prefix_caching: bool,
    preemption: PreemptionMode,
    trtllm: bool,
    worker_type: WorkerType,
    speedup: f64,
    decode_speedup: f64,
    dp_rank: u32,
    record_kv_events: bool,
    kv_token_ids: bool,
    aggregate_steady: bool,
    opaque_output_blocks: bool,
    timing: Box<dyn TimingModel>,
    /// Speculative decoding (`aic_nextn`), if configured.
    mtp: Option<mtp::Mtp>,
    /// Lock-step DP waves (see `crate::wave`): prefills wait for every
    /// `prefill_schedule_interval`-th wave on a rank that decodes.
    cadence: Cadence,
    /// The host-memory KV tier (`native_host_offload`), if configured.
    offload: Option<Box<offload::Offload>>,
    /// The cache groups' byte budget (`kv_cache_groups`), if configured: it replaces the
    /// block pool's capacity, and requests then hold leases, not blocks.
    groups: Option<GroupedPool>,
    /// The first pass that needed more than the whole group budget (see [`GroupedFault`]).
    fault: Option<GroupedFault>,
    /// The recurrent-state cache (`state_cache`), if configured: states take blocks of
    /// `pool` beside the token blocks.
    state: Option<state::StateCache>,
    /// Most distinct LoRA adapters per batch (0: requests may name none).
    max_loras: u32,
    /// The adapters of the batch being scheduled, and the waiting requests passed over
    /// because theirs would exceed `max_loras` (both empty between passes).
    batch_loras: Vec<u32>,
    lora_skipped: Vec<SeqKey>,

    seqs: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    /// Slots retired by the last pass: their keys still name that pass's outputs, so they
    /// are reused only once the next pass starts.
    retired_slots: Vec<u32>,
    waiting: VecDeque<SeqKey>,
    running: Vec<RunEntry>,
    pool: BlockPool,

    pass_id: u64,
    /// End of the previous pass: the last token time of every steady request.
    last_end_ns: u64,
    next_event_id: u64,
    totals: EngineMetrics,
    /// Reusable scratch buffers (no allocation per pass).
    evicted: Vec<u64>,
    rejected: Vec<SeqKey>,
    scratch_tokens: Vec<u32>,
    /// The blocks the last `prefill_cost` found resident, for the allocation after it.
    matched: Vec<BlockId>,
    pass: Pass,
    /// Counts the events that give KV capacity back (a request finishing, being
    /// preempted or let go with blocks): a destination that found no room is tried again
    /// only after it changes, as in the reference.
    capacity_generation: u64,
    /// The next submission's `Seq::order`.
    next_order: u64,
    /// Disaggregation destinations wait for a reservation here: only activated ones are
    /// admitted (see [`Self::set_destinations_pending`]).
    destinations_pending: bool,
}

/// Per-pass accumulators of the scheduling loop.
#[derive(Default)]
struct Budget {
    tokens: u32,
    batch_count: usize,
    total_isl: usize,
    total_prefix: usize,
    /// All tokens scheduled for requests that compute prompt tokens this pass, recomputed
    /// output included: the reference's `sum_prefill_tokens` (committed prefill work).
    prefill_work_tokens: usize,
    scheduled_tokens: usize,
    preempted: usize,
    /// Ready requests that decode in this pass (fresh prefills sample from their prefill).
    decode_batch: usize,
    decode_kv: usize,
    /// Full prompt lengths of the prefilling requests, sequence lengths of the decoding ones.
    prefill_lengths: Moments,
    decode_lengths: Moments,
    /// This pass defers local prefill work (`prefill_schedule_interval`, DP only).
    defer_prefill: bool,
}

/// vLLM's prefill cadence under data parallelism (`prefill_schedule_interval`).
#[derive(Debug, Clone, Copy)]
struct Cadence {
    /// Ranks in the worker's group; the cadence acts only above 1 (and only on vLLM).
    dp_size: u32,
    interval: u64,
    /// The group's wave counter for the coming pass.
    wave_step: u64,
    /// The last pass that scheduled prefills left requests waiting for capacity: the next
    /// pass may prefill even off-cadence.
    capacity_bound: bool,
}

impl VllmScheduler {
    /// A scheduler for `config` (backend vllm or trtllm) with the given timing model.
    pub fn new(config: &EngineConfig, timing: Box<dyn TimingModel>, options: SchedulerOptions) -> Self {
        let prefix_caching = config.enable_prefix_caching;
        let groups = GroupedPool::from_config(config);
        Self {
            block_size: config.block_size as u32,
            num_gpu_blocks: config.num_gpu_blocks,
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens.min(u32::MAX as usize) as u32,
            max_model_len: config.max_model_len,
            chunked_prefill: config.enable_chunked_prefill,
            prefix_caching,
            preemption: config.preemption_mode,
            trtllm: config.backend == Backend::Trtllm,
            worker_type: config.worker_type,
            speedup: config.speedup_ratio,
            decode_speedup: config.speedup_ratio * config.decode_speedup_ratio,
            dp_rank: options.dp_rank,
            record_kv_events: options.record_kv_events && prefix_caching,
            kv_token_ids: config.emit_kv_token_ids,
            // Bursts vary per pass: no two passes are alike, so no steady runs; host
            // transfers complete between passes, which a run would step over. A grouped
            // lease's runs end where a page range moves (`steady_decode_passes`).
            aggregate_steady: options.aggregate_steady_tokens
                && config.aic_nextn.is_none()
                && config.native_host_offload.is_none()
                && config.state_cache.is_none(),
            opaque_output_blocks: options.opaque_output_blocks,
            timing,
            mtp: config.aic_nextn.map(|_| {
                mtp::Mtp::new(
                    &config.mtp_accept_rates(),
                    config.aic_mtp_seed.wrapping_add(options.seed_offset),
                )
            }),
            cadence: Cadence {
                dp_size: if config.backend == Backend::Vllm { options.dp_size.max(1) } else { 1 },
                interval: config.prefill_schedule_interval.max(1) as u64,
                wave_step: 0,
                capacity_bound: false,
            },
            offload: config.native_host_offload.as_ref().map(|h| {
                let bytes = config.kv_cache_bytes_per_token.unwrap_or(1);
                let g3 = config.g3_offload.as_ref();
                Box::new(offload::Offload::new(h, g3, config.block_size, bytes, config.num_gpu_blocks))
            }),
            groups,
            fault: None,
            state: config.state_blocks().map(|s| {
                let align = config.prefix_match_unit.filter(|_| prefix_caching).map(|u| u as u32);
                state::StateCache::new(s, config.aic_nextn.is_some(), align)
            }),
            max_loras: options.max_loras,
            batch_loras: Vec::new(),
            lora_skipped: Vec::new(),
            seqs: Vec::new(),
            free_slots: Vec::new(),
            retired_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pool: BlockPool::with_policy(config.num_gpu_blocks, config.eviction_policy),
            pass_id: 0,
            capacity_generation: 0,
            next_order: 0,
            destinations_pending: false,
            last_end_ns: 0,
            next_event_id: 0,
            totals: EngineMetrics {
                dp_rank: options.dp_rank,
                total_blocks: config.num_gpu_blocks,
                ..Default::default()
            },
            evicted: Vec::new(),
            rejected: Vec::new(),
            scratch_tokens: Vec::new(),
            matched: Vec::new(),
            pass: Pass::default(),
        }
    }

    /// Queues a request; it is considered for admission by the next pass.
    pub fn submit(&mut self, request: Request) -> Result<SeqKey, SubmitError> {
        let mut max_output = super::requested_output(&request)?;
        if request.lora.is_some() && self.max_loras == 0 {
            return Err(SubmitError::LoraDisabled(request.uuid));
        }
        let hash_root = request.lora.as_ref().map(LoraRef::hash_root);
        let prompt_len = request.prompt_len();
        if let Some(m) = self.max_model_len {
            // Generation stops when the sequence reaches the model length; a prompt that
            // already does is rejected at admission (the cap is kept at >= 1 for that).
            max_output = max_output.min(m.saturating_sub(prompt_len).max(1));
        }
        if self.trtllm {
            // TRT-LLM caps generation at what the pool could ever hold for this request.
            let cap = self.kv_capacity_tokens().saturating_sub(prompt_len);
            max_output = max_output.min(cap.max(1));
        }
        let bs = self.block_size as usize;
        // Sized once for the whole generation (never beyond the pool), so neither list
        // reallocates as decode crosses block boundaries.
        let final_blocks = if self.groups.is_some() {
            0 // a grouped request holds a lease, no blocks
        } else {
            (prompt_len + max_output).div_ceil(bs).min(self.num_gpu_blocks + 1)
        };
        let record = self.record_kv_events;
        let prompt_blocks = prompt_len / bs;
        let private_from = match request.shareable_blocks {
            Some(n) if self.prefix_caching => n.min(prompt_blocks) as u32,
            _ => u32::MAX,
        };
        // Locals are read only for announced (shareable) blocks.
        let locals_needed = prompt_blocks.min(private_from as usize);
        if request.tokenless() {
            // Tokens are read for hashing, token ids in events and generated blocks hashed
            // by content: none of that may happen.
            let hashed = !self.prefix_caching
                || request.block_hashes.as_ref().is_some_and(|h| {
                    h.sequence.len() == prompt_blocks && (!record || h.local.len() >= locals_needed)
                });
            let reads_back =
                request.output_token_ids.is_some() || !self.opaque_output_blocks || self.kv_token_ids;
            if !hashed || reads_back {
                return Err(SubmitError::MissingTokens(request.uuid));
            }
        }
        let (hashes, local_hashes) = match request.block_hashes {
            _ if !self.prefix_caching => (Vec::new(), Vec::new()),
            Some(h) if h.sequence.len() == prompt_blocks && (!record || h.local.len() >= locals_needed) => {
                debug_assert!(
                    !record
                        || request.tokens.is_empty()
                        || h.sequence[..locals_needed]
                            == PromptHashes::rooted(&request.tokens[..locals_needed * bs], bs, hash_root)
                                .sequence
                );
                let PromptHashes { sequence: mut h, local: mut l } = h;
                h.reserve(final_blocks.saturating_sub(h.len()));
                if record {
                    l.reserve(final_blocks.saturating_sub(l.len()));
                } else {
                    l = Vec::new();
                }
                (h, l)
            }
            _ => {
                let mut h = Vec::with_capacity(final_blocks);
                let mut l = Vec::with_capacity(if record { final_blocks } else { 0 });
                extend_hashes(hash_root, &request.tokens, bs, &mut h, record.then_some(&mut l));
                (h, l)
            }
        };
        let seq = Seq {
            uuid: request.uuid,
            prompt: request.tokens,
            planned: request.output_token_ids,
            max_output: max_output.min(u32::MAX as usize) as u32,
            prompt_len: prompt_len as u32,
            len: prompt_len as u32,
            num_computed: 0,
            generated: 0,
            status: Status::Fresh,
            order: self.next_order,
            blocks: Vec::with_capacity(final_blocks),
            hashes,
            local_hashes,
            first_cached: None,
            private_from,
            published: false,
            sent_first: false,
            done: false,
            hold: false,
            last_token_ns: 0,
            last_token_pass: u64::MAX,
            pass_id: u64::MAX,
            pass_tokens: 0,
            pass_prompt_tokens: 0,
            pass_prefix: 0,
            pass_decode: false,
            host: self.offload.is_some().then(offload::HostSeq::new),
            lease: GroupLease::default(),
            state: None,
            lora: request.lora,
            hash_root,
        };
        self.next_order += 1;
        let mut seq = seq;
        if self.state.as_ref().is_some_and(|sc| sc.align_unit().is_some()) {
            // Align mode keys checkpoints inside blocks by the prompt's own tokens.
            let unit_hashes = self.state_unit_hashes(&seq).ok_or(SubmitError::MissingTokens(seq.uuid))?;
            seq.state = Some(Box::new(state::SeqState::with_unit_hashes(unit_hashes)));
        }
        let key = super::insert_slot(&mut self.seqs, &mut self.free_slots, seq);
        self.waiting.push_back(key);
        Ok(key)
    }

    /// Whether a pass would do anything (there is running or waiting work).
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || self.has_ready_connector()
    }

    /// The next host-tier or G3 transfer event, if any: an idle engine steps then.
    pub fn next_wake_ns(&self) -> Option<u64> {
        self.offload.as_ref().and_then(|o| o.next_deadline())
    }

    /// Lets the host and G3 transfers still in flight finish (a run's end: the reference
    /// reports the G3 writes of the last stores as completed). Returns whether any was.
    pub fn settle_transfers(&mut self) -> bool {
        let mut any = false;
        let mut pass = std::mem::take(&mut self.pass);
        if let Some(o) = self.offload.as_mut() {
            o.clear_retry();
        }
        if self.offload.is_some() {
            self.offload_complete_pass(&mut pass);
        }
        while let Some(t) = self.offload.as_ref().and_then(|o| o.next_deadline()) {
            // Each tick takes up every event due by `t`, so the deadlines move on.
            let t = t.max(self.last_end_ns);
            self.offload_tick(t, &mut pass);
            self.last_end_ns = t;
            any = true;
        }
        self.pass = pass;
        any
    }

    /// The last pass completes (its end time has come): runs its host/G3 boundary if it
    /// waited for this (a G3 tier shared by several engines); otherwise nothing to do.
    pub fn complete_pass(&mut self) {
        if self.offload.as_ref().is_some_and(|o| o.pending_boundary.is_some()) {
            let mut pass = std::mem::take(&mut self.pass);
            self.offload_complete_pass(&mut pass);
            self.pass = pass;
        }
    }

    /// The G3 tier (`g3_offload`), if configured: its counters are the report's.
    pub fn g3_tier(&self) -> Option<&crate::kv::SharedG3> {
        self.offload.as_ref().and_then(|o| o.g3_tier())
    }

    /// Makes this engine worker `worker` of a G3 tier its deployment shares
    /// (`cluster_shared`), in place of its own. Only before the engine has run.
    pub fn share_g3(&mut self, tier: crate::kv::SharedG3, worker: usize) {
        if let Some(o) = self.offload.as_mut() {
            o.share_g3(tier, worker);
        }
    }

    /// Changes whenever KV capacity or a batch slot is given back (see the field); a
    /// shell retries a destination that found no room only once it has changed.
    pub fn capacity_generation(&self) -> u64 {
        self.capacity_generation
    }

    /// Requests held by the engine (running plus waiting).
    pub fn num_requests(&self) -> usize {
        self.running.len() + self.waiting.len() + self.offload.as_ref().map_or(0, |o| o.queued())
    }

    /// With cache groups: the pages and bytes each group's live leases hold, in the
    /// groups' order (empty without groups).
    pub fn kv_group_usage(&self) -> Vec<(u64, u64)> {
        self.groups.as_ref().map_or_else(Vec::new, |g| g.group_usage().collect())
    }

    /// What waits in the queue now (after a pass was scheduled, the forward-pass
    /// metrics' queued fields): fresh requests by prompt length, preempted ones by prompt
    /// plus generated tokens, destinations whose KV has not landed by prompt length.
    pub fn queued_work(&self) -> QueuedWork {
        let mut q = QueuedWork::default();
        for key in &self.waiting {
            let Some(seq) = self.seqs[key.0 as usize].as_ref() else { continue };
            match seq.status {
                Status::Preempted => q.decode.add(u64::from(seq.prompt_len + seq.generated)),
                Status::Reserved => q.decode.add(u64::from(seq.prompt_len)),
                Status::Landed => q.decode.add(u64::from(seq.prompt_len)),
                _ => q.prefill.add(u64::from(seq.prompt_len)),
            }
        }
        q
    }

    /// Current engine metrics.
    pub fn metrics(&self) -> EngineMetrics {
        if let Some(g) = &self.groups {
            // As the reference: no block count; usage is bytes over the budget.
            let usage = g.used_bytes() as f64 / g.capacity_bytes() as f64;
            return EngineMetrics {
                running_requests: self.running.len(),
                waiting_requests: self.waiting.len(),
                active_blocks: g.active_pages() as usize,
                inactive_blocks: 0,
                total_blocks: 0,
                gpu_cache_usage_perc: usage,
                physical_gpu_cache_usage_perc: usage,
                kv_cache_used_bytes: Some(g.used_bytes()),
                kv_cache_capacity_bytes: Some(g.capacity_bytes()),
                ..self.totals
            };
        }
        let total = self.pool.capacity();
        let active = self.pool.num_active();
        let inactive = self.pool.num_inactive();
        let frac = |n: usize| if total == 0 { 0.0 } else { n as f64 / total as f64 };
        EngineMetrics {
            running_requests: self.running.len(),
            waiting_requests: self.waiting.len(),
            active_blocks: active,
            inactive_blocks: inactive,
            total_blocks: total,
            gpu_cache_usage_perc: frac(active),
            physical_gpu_cache_usage_perc: frac(active + inactive),
            ..self.totals
        }
    }

    /// The adapters of running and waiting requests (empty without LoRA).
    pub fn lora_activity(&self) -> LoraActivity {
        let mut a = LoraActivity::default();
        if self.max_loras == 0 {
            return a;
        }
        let names = |keys: &mut dyn Iterator<Item = SeqKey>, out: &mut Vec<std::sync::Arc<str>>| {
            for key in keys {
                if let Some(l) = &self.seq(key).lora {
                    if !out.contains(&l.name) {
                        out.push(l.name.clone());
                    }
                }
            }
        };
        names(&mut self.running.iter().map(|e| e.key), &mut a.running);
        names(&mut self.waiting.iter().copied(), &mut a.waiting);
        a
    }

    /// Changes the speed-up of the passes computed from now on; the decode passes keep
    /// their extra divisor (`decode_speedup_ratio`).
    pub fn set_speedup_ratio(&mut self, ratio: f64) {
        let decode_ratio = if self.speedup > 0.0 { self.decode_speedup / self.speedup } else { 1.0 };
        self.speedup = ratio;
        self.decode_speedup = ratio * decode_ratio;
    }

    /// Drops every cached block, as vLLM's `reset_prefix_cache`: only when no block is in
    /// use (otherwise nothing changes and `Err(PrefixCacheBusy)` says how many are).
    /// Returns the `Cleared` event when KV events are recorded.
    pub fn reset_prefix_cache(&mut self) -> Result<Option<KvEvent>, PrefixCacheBusy> {
        let active = self.pool.num_active();
        if active > 0 {
            return Err(PrefixCacheBusy { active_blocks: active });
        }
        self.pool.clear_inactive(&mut self.evicted);
        self.evicted.clear();
        if !self.record_kv_events {
            return Ok(None);
        }
        let event =
            KvEvent { event_id: self.next_event_id, dp_rank: self.dp_rank, data: KvEventData::Cleared };
        self.next_event_id += 1;
        Ok(Some(event))
    }

    /// Removes request `key` (which must carry `uuid`, so a stale key whose slot was reused
    /// never matches): a waiting or running request leaves its queue and frees its blocks,
    /// and its outputs still held in the last pass (not yet delivered by the shell) are
    /// dropped. Returns whether anything was removed. Safe between passes and while a
    /// computed pass is "in flight" in a live shell.
    pub fn cancel(&mut self, key: SeqKey, uuid: u128) -> bool {
        let suppressed = self.suppress_outputs(key, uuid);
        let live = self.seqs.get(key.0 as usize).and_then(Option::as_ref).is_some_and(|s| s.uuid == uuid);
        if live {
            if let Some(i) = self.running.iter().position(|e| e.key == key) {
                self.running.remove(i);
            } else {
                self.dequeue(key);
            }
            self.seq_mut(key).hold = false;
            self.retire(key);
        }
        live || suppressed
    }

    /// The handle of the held request with id `uuid` (a linear scan: for cancellation by
    /// id, not for hot paths).
    pub fn find(&self, uuid: u128) -> Option<SeqKey> {
        self.seqs
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.uuid == uuid))
            .map(|i| SeqKey(i as u32))
            .or_else(|| self.pass.all_outputs().find(|o| o.uuid == uuid).map(|o| o.key))
    }

    fn suppress_outputs(&mut self, key: SeqKey, uuid: u128) -> bool {
        let before = self.pass.outputs.len() + self.pass.steady.len();
        let keep = |o: &Output| o.key != key || o.uuid != uuid;
        self.pass.outputs.retain(keep);
        self.pass.steady.retain(keep);
        before != self.pass.outputs.len() + self.pass.steady.len()
    }

    /// The most recent pass (its outputs stay here until the next `step`).
    pub fn last_pass(&self) -> &Pass {
        &self.pass
    }

    /// The KV block pool (read-only), for inspection and invariant checks.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Runs one forward pass starting at `now_ns` and returns what happened.
    pub fn step(&mut self, now_ns: u64) -> &Pass {
        let mut pass = std::mem::take(&mut self.pass);
        pass.clear(now_ns);
        self.free_slots.append(&mut self.retired_slots);
        self.pass_id += 1;
        self.state_begin_step();
        let defer_prefill = self.defers_prefill();
        let mut b = Budget { tokens: self.max_num_batched_tokens, defer_prefill, ..Default::default() };
        if self.offload.is_some() {
            // A boundary still waiting (the shell did not complete the pass) comes first.
            self.offload_complete_pass(&mut pass);
        }
        let g3_epoch = self.offload.as_ref().and_then(|o| o.g3_epoch());
        if self.offload.is_some() {
            self.offload_tick(now_ns, &mut pass);
        }

        self.schedule_running(&mut b, &mut pass);
        // A pass that had to preempt admits nothing new.
        if b.preempted == 0 {
            if self.offload.is_some() {
                self.admit_waiting_offload(&mut b, &mut pass, now_ns);
            } else {
                self.admit_waiting(&mut b, &mut pass);
            }
        }
        if !defer_prefill && b.preempted == 0 {
            self.cadence.capacity_bound = !self.waiting.is_empty();
        }
        if self.mtp.is_some() {
            self.mtp_reserve(&mut b);
            self.flush_evicted(&mut pass);
        }
        let mut compute_start = now_ns;
        if let Some(off) = &self.offload {
            compute_start = off.compute_start(now_ns);
            self.offer_stores();
            self.flush_evicted(&mut pass);
        }
        let (prefill_ns, decode_ns) = self.pass_cost(&b, &mut pass.metrics);
        pass.end_ns = compute_start + prefill_ns + decode_ns;
        if self.mtp.is_some() {
            self.emit_mtp(&mut pass);
        } else {
            self.emit(&mut pass);
        }
        if self.offload.as_ref().is_some_and(|o| o.defers_boundaries() && pass.end_ns > now_ns) {
            self.offload.as_mut().expect("offload configured").pending_boundary = Some(pass.end_ns);
            let progressed = b.scheduled_tokens > 0 || !pass.outputs.is_empty();
            let off = self.offload.as_mut().expect("offload configured");
            off.end_pass(now_ns, pass.end_ns, g3_epoch, progressed);
        } else if self.offload.is_some() {
            self.offload_boundary(pass.end_ns, &mut pass);
            let progressed = b.scheduled_tokens > 0 || !pass.outputs.is_empty();
            let off = self.offload.as_mut().expect("offload configured");
            off.end_pass(now_ns, pass.end_ns, g3_epoch, progressed);
        }

        let m = &mut pass.metrics;
        m.dp_rank = self.dp_rank;
        m.num_prefill_requests = b.batch_count;
        m.sum_prefill_tokens = b.prefill_work_tokens;
        m.sum_prefill_kv_tokens = b.total_prefix;
        m.num_queued_requests = self.waiting.len();
        m.scheduled_tokens = b.scheduled_tokens;
        m.num_preempted = b.preempted;
        m.wall_time_secs = (prefill_ns + decode_ns) as f64 / 1e9;
        m.prefill_lengths = b.prefill_lengths;
        m.decode_lengths = b.decode_lengths;
        self.totals.prompt_tokens_computed_total += b.prefill_work_tokens as u64;
        self.last_end_ns = pass.end_ns;
        self.pass = pass;
        &self.pass
    }

    /// Whether this pass is off the prefill cadence: DP ranks (vLLM) prefill only every
    /// `prefill_schedule_interval`-th wave while they decode, unless the last prefilling
    /// pass left requests waiting for capacity.
    fn defers_prefill(&self) -> bool {
        let c = &self.cadence;
        c.dp_size > 1
            && !c.wave_step.is_multiple_of(c.interval)
            && !c.capacity_bound
            && self.running.iter().any(|e| {
                let seq = self.seq(e.key);
                seq.num_computed >= seq.prompt_len
            })
    }

    /// Sets the group's wave counter for the next pass (see `crate::wave`).
    pub(crate) fn prepare_wave(&mut self, wave_step: u64) {
        self.cadence.wave_step = wave_step;
    }

    /// Moves the last pass's end to `end_ns` (its group's wave end, not before its own):
    /// its tokens are emitted then, so their gaps and every later gap count from it.
    pub(crate) fn stretch_last_pass(&mut self, end_ns: u64) {
        super::stretch_pass(&mut self.pass, end_ns, |key, t| {
            if let Some(seq) = self.seqs[key.0 as usize].as_mut() {
                seq.last_token_ns = t;
            }
        });
        self.last_end_ns = end_ns;
    }

    /// (a) Running requests first, in running order, while budget remains.
    fn schedule_running(&mut self, b: &mut Budget, pass: &mut Pass) {
        let mut i = 0;
        while i < self.running.len() && b.tokens > 0 {
            let (n, kv, kv_sq) = self.plain_decode_run(&mut i, b.tokens);
            b.decode_batch += n;
            b.decode_kv += kv;
            b.decode_lengths.count += n as u64;
            b.decode_lengths.sum += kv as u64;
            b.decode_lengths.sum_sq += u128::from(kv_sq);
            b.scheduled_tokens += n;
            b.tokens -= n as u32;
            if i >= self.running.len() || b.tokens == 0 {
                break;
            }
            self.catch_up(i, false);
            let key = self.running[i].key;
            if self.state.is_some() && !self.state_can_compute(self.seq(key)) {
                // Its tokens and state outgrew the whole pool: the reference drops it.
                let mut cursor = i;
                self.remove_running_or_waiting(key, &mut cursor);
                self.reject(key, pass);
                continue;
            }
            if b.defer_prefill && self.seq(key).num_computed < self.seq(key).prompt_len {
                // A prompt still being computed waits for the prefill cadence.
                i += 1;
                continue;
            }
            match self.schedule(key, None, b, pass, &mut i) {
                Scheduled::Yes | Scheduled::Skipped => i += 1,
                Scheduled::Blocked => break,
                Scheduled::CurrentPreempted => {}
            }
        }
        // Requests the budget did not reach get no token, so their steady runs end here.
        for j in i..self.running.len() {
            self.catch_up(j, false);
        }
    }

    /// Fast path for the common case, from `running[*i]` on: requests decoding one token
    /// that fits their last block and completes no block, so no allocation, hashing or
    /// event can result (with cache groups: decoding one token whose lease grows or
    /// shrinks in place). Stops at the first request that needs the general path and
    /// returns how many were scheduled and their KV. Counts stay in locals so the loop
    /// does not round-trip the budget through memory.
    #[inline]
    fn plain_decode_run(&mut self, i: &mut usize, budget: u32) -> (usize, usize, u64) {
        let bs = self.block_size;
        let pass_id = self.pass_id;
        let check_boundary = self.prefix_caching;
        // With a state cache only a token that leaves the state as it is may pass here.
        let state = self.state.as_ref().map(|sc| sc.align_unit().is_some());
        // With a state cache grouped requests take the state path (`schedule`).
        let grouped = self.groups.is_some() && self.state.is_none();
        // Squares for the forward-pass metrics' variance: a multiply per token, in u64
        // (a batch of 1024 requests of 2^20 tokens sums to 2^50).
        let (mut n, mut kv, mut kv_sq) = (0usize, 0usize, 0u64);
        while *i < self.running.len() && (n as u32) < budget {
            let entry = self.running[*i];
            if entry.is_steady(pass_id) {
                let len = entry.kv_len(pass_id);
                n += 1;
                kv += len;
                kv_sq += (len * len) as u64;
                *i += 1;
                continue;
            }
            if entry.in_run() {
                if !grouped {
                    break; // its steady run ends: the general path catches it up
                }
                self.catch_up(*i, false);
            }
            let Some(seq) = self.seqs[entry.key.0 as usize].as_mut() else { break };
            let len = seq.len;
            let decode = seq.num_computed + 1 == len && seq.num_computed >= seq.prompt_len;
            let plain = if grouped {
                // A grouped decode token only moves its lease (a run ends where a page
                // range moves): reallocated here, as the general path would. When the
                // others leave no room, nothing changes and the general path preempts.
                decode && self.groups.as_mut().is_some_and(|g| g.allocate(&mut seq.lease, len - 1, len))
            } else {
                // Block size is almost always a power of two: no division per token then.
                let rem = if bs.is_power_of_two() { len & (bs - 1) } else { len % bs };
                decode
                    && len as usize <= seq.blocks.len() * bs as usize
                    && (!check_boundary || rem != 0)
                    && state.is_none_or(|align| state::decode_leaves_state(seq, len, bs, align))
            };
            if !plain {
                break;
            }
            seq.num_computed = len;
            seq.pass_id = pass_id;
            seq.pass_tokens = 1;
            seq.pass_prompt_tokens = 0;
            seq.pass_decode = true;
            n += 1;
            kv += len as usize;
            kv_sq += u64::from(len) * u64::from(len);
            *i += 1;
        }
        (n, kv, kv_sq)
    }

    /// (b) Admissions from the waiting head, FCFS, while sequences and blocks allow. With
    /// LoRA, as vLLM: a request whose adapter would make the batch's adapters exceed
    /// `max_loras` is passed over (it keeps its place at the head, in order) and the
    /// requests behind it are considered.
    fn admit_waiting(&mut self, b: &mut Budget, pass: &mut Pass) {
        if self.destinations_pending {
            return self.admit_landed(b, pass);
        }
        if self.max_loras == 0 {
            return self.admit_waiting_fcfs(b, pass);
        }
        let mut loras = std::mem::take(&mut self.batch_loras);
        for e in &self.running {
            if let Some(l) = &self.seq(e.key).lora {
                if !loras.contains(&l.id) {
                    loras.push(l.id);
                }
            }
        }
        self.batch_loras = loras;
        self.admit_waiting_fcfs(b, pass);
        self.batch_loras.clear();
        while let Some(key) = self.lora_skipped.pop() {
            self.waiting.push_front(key);
        }
    }

    fn admit_waiting_fcfs(&mut self, b: &mut Budget, pass: &mut Pass) {
        let bs = self.block_size as usize;
        while self.running.len() < self.max_num_seqs {
            let Some(&key) = self.waiting.front() else { break };
            let lora = self.seq(key).lora.as_ref().map(|l| l.id);
            if let Some(id) = lora {
                if self.batch_loras.len() >= self.max_loras as usize && !self.batch_loras.contains(&id) {
                    self.waiting.pop_front();
                    self.lora_skipped.push(key);
                    continue;
                }
            }
            let mut matched = std::mem::take(&mut self.matched);
            let seq = self.seq(key);
            if self.never_fits(seq) {
                self.waiting.pop_front();
                self.reject(key, pass);
                continue;
            }
            if let Some(groups) = &self.groups {
                match self.grouped_admission(groups, seq, b.tokens) {
                    grouped::GroupedAdmission::Admit => {}
                    grouped::GroupedAdmission::Wait => break,
                    grouped::GroupedAdmission::Reject => {
                        self.waiting.pop_front();
                        self.reject(key, pass);
                        continue;
                    }
                }
            }
            let cost = self.prefill_cost(seq, &mut matched);
            self.matched = matched;
            let seq = self.seq(key);
            let reused_blocks = cost.active_cached as usize / bs;
            let free_capacity = self.num_gpu_blocks - self.pool.num_active();
            let (needed, available) = if self.trtllm {
                // Reserve every running request's footprint to completion: never evict.
                let reserved: usize =
                    self.running.iter().map(|e| self.remaining_reservation(self.seq(e.key))).sum();
                let needed = self.to_completion_blocks(seq).saturating_sub(reused_blocks + seq.blocks.len());
                (needed, free_capacity.saturating_sub(reserved))
            } else if self.state.is_some() {
                match self.state_admission(seq, cost.cached, cost.active_cached) {
                    state::StateAdmission::Needs(n) => (n, free_capacity),
                    state::StateAdmission::Impossible => {
                        self.waiting.pop_front();
                        self.reject(key, pass);
                        continue;
                    }
                }
            } else {
                // The whole known sequence must fit, even when it will be chunked (an
                // activated destination already holds its prompt's blocks).
                (
                    (seq.len as usize).div_ceil(bs).saturating_sub(reused_blocks + seq.blocks.len()),
                    free_capacity,
                )
            };
            if needed > available && self.groups.is_none() {
                if self.running.is_empty() && self.unblock_landed() {
                    continue;
                }
                break;
            }
            if b.defer_prefill && seq.len - cost.cached > 1 {
                // Off the prefill cadence only near-total prefix hits are admitted.
                break;
            }
            let budget_before = b.tokens;
            let mut cursor = usize::MAX;
            match self.schedule(key, Some(cost), b, pass, &mut cursor) {
                Scheduled::Yes => {}
                Scheduled::Blocked | Scheduled::CurrentPreempted | Scheduled::Skipped => break,
            }
            if let Some(id) = lora.filter(|id| !self.batch_loras.contains(id)) {
                self.batch_loras.push(id);
            }
            if budget_before == b.tokens && b.tokens == 0 {
                break;
            }
        }
    }

    /// With nothing running, a waiting head that does not fit can only be waiting for
    /// blocks that activated destinations behind it hold: moves the first of those to the
    /// head so it runs (and frees them as it ends). The reference stalls for good there
    /// ("effect-free zero-duration pass"); whether one was moved.
    fn unblock_landed(&mut self) -> bool {
        let seqs = &self.seqs;
        let landed = |k: &SeqKey| seqs[k.0 as usize].as_ref().is_some_and(|s| s.status == Status::Landed);
        match self.waiting.iter().position(landed) {
            Some(0) | None => false,
            Some(i) => {
                let key = self.waiting.remove(i).expect("in the queue");
                self.waiting.push_front(key);
                true
            }
        }
    }

    /// Requests that could never complete here are rejected instead of looping forever.
    fn never_fits(&self, seq: &Seq) -> bool {
        let prompt = seq.prompt_len as usize;
        if self.max_model_len.is_some_and(|m| prompt >= m) {
            return true;
        }
        if seq.status != Status::Fresh {
            return false;
        }
        if !self.chunked_prefill && prompt > self.max_num_batched_tokens as usize {
            return true;
        }
        if self.trtllm {
            return self.to_completion_blocks(seq) > self.num_gpu_blocks;
        }
        if self.groups.is_some() {
            return false; // `grouped_admission` judges bytes
        }
        // The last sampled token is never computed, so the peak footprint is
        // prompt + output - 1 tokens.
        (prompt + seq.max_output as usize - 1).div_ceil(self.block_size as usize) > self.num_gpu_blocks
    }

    /// Blocks the request holds at completion (`max_output` already carries the
    /// `max_model_len` cap).
    fn to_completion_blocks(&self, seq: &Seq) -> usize {
        ((seq.prompt_len + seq.max_output) as usize).div_ceil(self.block_size as usize)
    }

    fn remaining_reservation(&self, seq: &Seq) -> usize {
        self.to_completion_blocks(seq).saturating_sub(seq.blocks.len())
    }

    /// Prefix lookup for a waiting request, with vLLM's recompute rule.
    /// The matched blocks go to `matched` (emptied when there is no lookup).
    fn prefill_cost(&self, seq: &Seq, matched: &mut Vec<BlockId>) -> PrefillCost {
        matched.clear();
        if !self.prefix_caching || seq.num_computed != 0 {
            return PrefillCost::default();
        }
        let m = self.pool.match_prefix_into(&seq.hashes, matched);
        if m.blocks == 0 {
            return PrefillCost::default();
        }
        if self.state.is_some() {
            // Only up to a boundary with a cached state checkpoint.
            let (cached, active_cached) = self.state_prefix(seq, matched);
            return PrefillCost { cached, active_cached };
        }
        let bs = self.block_size;
        let len = seq.len;
        let mut cached = (m.blocks as u32 * bs).min(len);
        let mut active_cached = (m.active_blocks as u32 * bs).min(len);
        if !self.trtllm && !seq.generation_complete() {
            // The last prompt token must be computed to sample from it.
            let max_cached = (len - 1) / bs * bs;
            cached = cached.min(max_cached);
            active_cached = active_cached.min(max_cached);
            if self.mtp.is_some() && cached >= bs {
                // The draft head needs the hidden state of one more block.
                cached -= bs;
                active_cached = active_cached.min(cached);
            }
        }
        PrefillCost { cached, active_cached }
    }

    /// Schedules `key` for this pass; `cost` is given for admissions from waiting.
    /// `cursor` is the caller's position in `running`, kept valid across preemptions.
    fn schedule(
        &mut self,
        key: SeqKey,
        cost: Option<PrefillCost>,
        b: &mut Budget,
        pass: &mut Pass,
        cursor: &mut usize,
    ) -> Scheduled {
        let bs = self.block_size;
        let seq = self.seq(key);
        let cached = match cost {
            Some(c) if seq.num_computed == 0 => c.cached,
            _ => 0,
        };
        let before = seq.num_computed + cached;
        let remaining = seq.len - before;
        let prompt_len = seq.prompt_len;
        if before < prompt_len && !self.chunked_prefill && prompt_len - before > b.tokens {
            return Scheduled::Blocked;
        }
        let mut want = remaining.min(b.tokens);
        if self.state.is_some() {
            want = self.state_align_chunk(seq, before, want);
            if want == 0 && remaining > 0 && b.tokens > 0 {
                return Scheduled::Skipped;
            }
        }
        if want == 0 && remaining > 0 {
            return Scheduled::Blocked;
        }
        let reusable = (cached / bs) as usize;
        loop {
            let target = (before + want).div_ceil(bs) as usize;
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let hits = &seq.hashes[..reusable.min(seq.hashes.len())];
            // Only an admission's cost matched this request's blocks.
            let matched = if cost.is_some() { &self.matched[..] } else { &[] };
            let prev = seq.blocks.len();
            if self.state.is_some() {
                if self.state_allocate(key, before + want, cached) {
                    self.seq_mut(key).num_computed = before + want;
                    break;
                }
            } else if self.groups.is_some() {
                match self.grouped_allocate(key, before, before + want) {
                    Ok(true) => {
                        self.seq_mut(key).num_computed = before + want;
                        break;
                    }
                    Ok(false) => {}
                    Err(()) => {
                        // Larger than the whole budget: it can never run.
                        self.remove_running_or_waiting(key, cursor);
                        self.reject(key, pass);
                        return Scheduled::CurrentPreempted;
                    }
                }
            } else if self.pool.allocate_matched(&mut seq.blocks, target, hits, matched, &mut self.evicted) {
                seq.num_computed = before + want;
                if let Some(off) = self.offload.as_mut() {
                    // Fresh blocks may still be read by a store to the host tier.
                    let fresh_from = prev.max(hits.len().min(target));
                    off.fence(&seq.blocks[fresh_from.min(seq.blocks.len())..], pass.start_ns);
                }
                break;
            }
            if self.trtllm {
                // guaranteed_no_evict never preempts; admission control should prevent this.
                want = 0;
                break;
            }
            let Some(victim_idx) = self.pick_victim() else {
                want = 0;
                break;
            };
            let victim = self.running[victim_idx].key;
            // A steady victim before the cursor already got its decode token this pass.
            self.catch_up(victim_idx, victim_idx < *cursor);
            self.preempt(victim_idx, b);
            if *cursor != usize::MAX && victim_idx < *cursor {
                *cursor -= 1;
            }
            if victim == key {
                self.flush_evicted(pass);
                return Scheduled::CurrentPreempted;
            }
        }
        self.flush_evicted(pass);
        let seq = self.seq(key);
        if want == 0 && seq.num_computed < seq.len {
            return Scheduled::Blocked;
        }
        let after = before + want;
        if self.prefix_caching {
            self.finalize_blocks(key, before, after, pass);
        }
        if self.state.is_some() {
            self.state_alias_completed(key, before / bs, after / bs);
            self.state_commit(key, after);
        }
        let prefix = before.min(prompt_len);
        let prompt_tokens = after.min(prompt_len) - prefix;
        let pass_id = self.pass_id;
        let from_waiting = cost.is_some();
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        seq.pass_id = pass_id;
        seq.pass_tokens = want;
        seq.pass_prompt_tokens = prompt_tokens;
        seq.pass_prefix = prefix;
        // A request finishing its prompt samples its first token from the prefill forward,
        // unless drafts must be verified (MTP): then it joins the decode forward.
        seq.pass_decode = seq.num_computed == seq.len
            && (self.mtp.is_some() || !(seq.generated == 0 && prompt_tokens > 0))
            && !seq.generation_complete();
        if seq.pass_decode {
            b.decode_batch += 1;
            b.decode_kv += seq.len as usize;
            // A request finishing its (re)computed prompt here counts as prefill only in the
            // forward-pass metrics, as the reference's: it decoded nothing yet.
            if prompt_tokens == 0 {
                b.decode_lengths.add(u64::from(seq.len));
            }
        }
        if prompt_tokens > 0 && self.worker_type != WorkerType::Decode {
            b.prefill_lengths.add(u64::from(prompt_len));
            b.batch_count += 1;
            b.total_isl += (prefix + prompt_tokens) as usize;
            b.total_prefix += prefix as usize;
        }
        if prompt_tokens > 0 {
            b.prefill_work_tokens += want as usize;
        }
        b.scheduled_tokens += want as usize;
        if from_waiting {
            if self.offload.is_some() {
                self.dequeue(key);
                self.offload_admitted(key, cached);
            } else {
                self.waiting.pop_front();
            }
            let seq = self.seq_mut(key);
            let readmission = seq.status == Status::Preempted;
            // A destination's prompt was counted as it was reserved.
            let landed = seq.status == Status::Landed;
            seq.status = Status::Running;
            if seq.first_cached.is_none() {
                seq.first_cached = Some(cached);
            }
            let uuid = seq.uuid;
            let queried = seq.len;
            self.running.push(RunEntry::new(key));
            if !landed {
                self.totals.prefix_cache_queries_total += u64::from(queried);
                self.totals.prefix_cache_hits_total += u64::from(cached);
            }
            pass.admissions.push(Admission { key, uuid, reused_tokens: cached, readmission });
        }
        b.tokens -= want;
        Scheduled::Yes
    }

    fn pick_victim(&self) -> Option<usize> {
        if self.running.is_empty() {
            return None;
        }
        Some(match self.preemption {
            PreemptionMode::Lifo => self.running.len() - 1,
            PreemptionMode::Fifo => 0,
        })
    }

    /// Recompute preemption: the victim loses its KV and goes back to the waiting front.
    fn preempt(&mut self, idx: usize, b: &mut Budget) {
        let key = self.running.remove(idx).key;
        if self.offload.is_some() {
            self.offload_preempted(key);
        }
        let pass_id = self.pass_id;
        let worker_type = self.worker_type;
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        if seq.pass_id == pass_id {
            // Already scheduled this pass: give back its budget and its share of the batch.
            b.tokens += seq.pass_tokens;
            b.scheduled_tokens -= seq.pass_tokens as usize;
            if seq.pass_prompt_tokens > 0 {
                b.prefill_work_tokens -= seq.pass_tokens as usize;
            }
            if seq.pass_prompt_tokens > 0 && worker_type != WorkerType::Decode {
                b.prefill_lengths.remove(u64::from(seq.prompt_len));
                b.batch_count -= 1;
                b.total_isl -= (seq.pass_prefix + seq.pass_prompt_tokens) as usize;
                b.total_prefix -= seq.pass_prefix as usize;
            }
            if seq.pass_decode {
                b.decode_batch -= 1;
                b.decode_kv -= seq.len as usize;
                if seq.pass_prompt_tokens == 0 {
                    b.decode_lengths.remove(u64::from(seq.len));
                }
            }
            seq.pass_id = u64::MAX;
        }
        if !seq.published && (seq.private_from as usize) < seq.blocks.len() {
            // It will look its private blocks up again on re-admission.
            for &id in &seq.blocks[seq.private_from as usize..] {
                self.pool.publish(id);
            }
            seq.published = true;
        }
        if self.state.is_some() {
            // The state goes first, as the reference releases it.
            self.state_release(key, true);
        }
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        self.pool.release(&mut seq.blocks);
        Self::release_lease(&mut self.groups, seq);
        self.capacity_generation += 1;
        seq.num_computed = 0;
        seq.status = Status::Preempted;
        self.waiting.push_front(key);
        self.totals.num_preemptions_total += 1;
        b.preempted += 1;
    }

    /// Registers the blocks completed by computing tokens [before, after) and records the
    /// resulting Stored events (one per maximal run of newly visible blocks).
    fn finalize_blocks(&mut self, key: SeqKey, before: u32, after: u32, pass: &mut Pass) {
        let bs = self.block_size;
        let (mut first, end) = (before / bs, after / bs);
        if first >= end {
            return;
        }
        let record = self.record_kv_events;
        if !record {
            // Without KV events a block whose hash is known (a prompt block) needs only its
            // registration: the loop below would build nothing else for it.
            let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
            let known_end = end.min(seq.hashes.len() as u32);
            for blk in first..known_end {
                let idx = blk as usize;
                let prev_block = idx.checked_sub(1).map(|i| seq.blocks[i]);
                self.pool.register_in(
                    seq.blocks[idx],
                    seq.hashes[idx],
                    prev_block,
                    seq.scope_of(blk, record),
                );
            }
            first = first.max(known_end);
        }
        let mut run: Vec<StoredBlock> = Vec::new();
        if record {
            run.reserve((end - first) as usize);
        }
        let mut run_parent: Option<u64> = None;
        for blk in first..end {
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let idx = blk as usize;
            // The event's parent is the previous block; the hash chains onto the adapter's root.
            let parent = if idx == 0 { None } else { Some(seq.hashes[idx - 1]) };
            let hash_parent = if idx == 0 { seq.hash_root } else { parent };
            let scope = seq.scope_of(blk, record);
            let announce = record && scope == Scope::Shared;
            // Known blocks (the prompt's, hashed before submit) carry both hashes; tokens
            // are needed only for new generated blocks and for event token ids.
            let known = idx < seq.hashes.len();
            let opaque = !known && self.opaque_output_blocks && seq.planned.is_none();
            if (!known && !opaque) || (announce && self.kv_token_ids) {
                self.scratch_tokens.clear();
                seq.extend_block_tokens(blk, bs, &mut self.scratch_tokens);
            }
            let (hash, local) = if known {
                (seq.hashes[idx], if announce { seq.local_hashes[idx] } else { 0 })
            } else if opaque {
                // Past the prompt's known blocks, so the block holds generated tokens.
                let h = unique_block_identity(seq.uuid, blk);
                seq.hashes.push(h);
                if announce {
                    seq.local_hashes.push(h);
                }
                (h, h)
            } else {
                let local = local_block_hash(&self.scratch_tokens);
                let h = hash_parent.map_or(local, |p| chain_hash(p, local));
                seq.hashes.push(h);
                if announce {
                    seq.local_hashes.push(local);
                }
                (h, local)
            };
            let prev_block = idx.checked_sub(1).map(|i| seq.blocks[i]);
            let visible = self.pool.register_in(seq.blocks[idx], hash, prev_block, scope);
            if !announce {
                continue;
            }
            if visible {
                if run.is_empty() {
                    run_parent = parent;
                }
                let token_ids = self.kv_token_ids.then(|| self.scratch_tokens.clone());
                run.push(StoredBlock { block_hash: hash, tokens_hash: local, token_ids });
            } else if !run.is_empty() {
                let blocks = std::mem::take(&mut run);
                let lora = self.seq(key).lora.clone();
                self.push_event(pass, KvEventData::Stored { parent_hash: run_parent, blocks, lora });
            }
        }
        if !run.is_empty() {
            let lora = self.seq(key).lora.clone();
            self.push_event(pass, KvEventData::Stored { parent_hash: run_parent, blocks: run, lora });
        }
    }

    fn flush_evicted(&mut self, pass: &mut Pass) {
        if self.evicted.is_empty() {
            return;
        }
        if self.record_kv_events {
            // One exact allocation for the event; the scratch keeps its capacity.
            let block_hashes = self.evicted.clone();
            self.evicted.clear();
            self.push_event(pass, KvEventData::Removed { block_hashes });
        } else {
            self.evicted.clear();
        }
    }

    fn push_event(&mut self, pass: &mut Pass, data: KvEventData) {
        pass.kv_events.push(KvEvent { event_id: self.next_event_id, dp_rank: self.dp_rank, data });
        self.next_event_id += 1;
    }

    /// KV capacity of the rank in tokens (`num_gpu_blocks * block_size`).
    fn kv_capacity_tokens(&self) -> usize {
        self.num_gpu_blocks * self.block_size as usize
    }

    /// Pass cost from what was scheduled (§4.3 of the core spec).
    fn pass_cost(&self, b: &Budget, m: &mut ForwardPassMetrics) -> (u64, u64) {
        let (batch, kv) = (b.decode_batch, b.decode_kv);
        m.num_decode_requests = batch;
        m.sum_decode_kv_tokens = kv;
        let prefills = b.batch_count > 0 && self.worker_type != WorkerType::Decode;
        let decodes = batch > 0 && self.worker_type != WorkerType::Prefill;
        let mut work = PassWork::default();
        if prefills {
            work.prefill_requests = b.batch_count;
            work.prefill_tokens = b.total_isl - b.total_prefix;
            work.prefill_prefix_tokens = b.total_prefix;
        }
        if decodes {
            work.decode_requests = batch;
            work.decode_kv_tokens = kv;
        }
        let total_kv_tokens = self.decode_total_kv_tokens(kv);
        let (prefill_ms, decode_ms) = pass_ms(self.timing.as_ref(), &work, total_kv_tokens);
        (scaled_nanos(prefill_ms, self.speedup), scaled_nanos(decode_ms, self.decode_speedup))
    }

    /// The KV capacity a decode pass holding `kv` tokens is priced against. With groups
    /// the reference prices decode against the active tokens themselves (utilisation 1):
    /// the linear pool it would divide by does not exist.
    fn decode_total_kv_tokens(&self, kv: usize) -> usize {
        if self.groups.is_some() {
            kv
        } else {
            self.kv_capacity_tokens()
        }
    }

    /// Every ready request samples one token; finished ones release their KV.
    fn emit(&mut self, pass: &mut Pass) {
        let mut finished = false;
        let mut tokens = 0;
        let mut steady = 0;
        let (end_ns, pass_id) = (pass.end_ns, self.pass_id);
        for i in 0..self.running.len() {
            let entry = self.running[i];
            if entry.is_steady(pass_id) {
                steady += 1;
                continue;
            }
            let key = entry.key;
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            if seq.num_computed != seq.len {
                continue;
            }
            // Requests always have output left here: submit rejects zero-output requests
            // and a finished request is retired in the pass that completes it.
            debug_assert!(!seq.generation_complete());
            let index = seq.generated;
            let token = match &seq.planned {
                Some(p) => OutputToken::Planned(p[index as usize]),
                None => OutputToken::Generated,
            };
            seq.generated += 1;
            seq.len += 1;
            let completed = seq.generation_complete();
            let cached_tokens = if seq.sent_first { None } else { seq.first_cached };
            seq.sent_first = true;
            let itl_ns = if index == 0 { 0 } else { end_ns - seq.last_token_ns };
            let steady = index >= 2 && !completed && seq.last_token_pass.wrapping_add(1) == pass_id;
            seq.last_token_ns = end_ns;
            seq.last_token_pass = pass_id;
            let out = Output {
                key,
                uuid: seq.uuid,
                token,
                index,
                itl_ns,
                completed,
                rejected: false,
                cached_tokens,
            };
            if steady {
                pass.steady.push(out);
            } else {
                pass.outputs.push(out);
            }
            seq.done = completed;
            finished |= completed;
            tokens += 1;
            if !completed {
                let seq = self.seq(key);
                let (passes, len) = (self.steady_passes(seq), seq.len);
                self.running[i].start_run(pass_id, len, passes);
            }
        }
        if steady > 0 {
            pass.steady_count = steady;
            pass.steady_itl_ns = end_ns - self.last_end_ns;
        }
        self.totals.generation_tokens_total += tokens + steady as u64;
        if finished {
            self.retire_done();
        } else {
            self.retire_rejected();
        }
    }

    /// Retires the requests that finished in this pass, then the rejected ones.
    fn retire_done(&mut self) {
        let seqs = &self.seqs;
        let mut retired = std::mem::take(&mut self.rejected);
        self.running.retain(|e| {
            let done = seqs[e.key.0 as usize].as_ref().is_some_and(|s| s.done);
            if done {
                retired.push(e.key);
            }
            !done
        });
        self.rejected = retired;
        self.retire_rejected();
    }

    /// Retires the requests rejected (or finished) in this pass.
    fn retire_rejected(&mut self) {
        for i in 0..self.rejected.len() {
            let key = self.rejected[i];
            self.retire(key);
        }
        self.rejected.clear();
    }

    fn reject(&mut self, key: SeqKey, pass: &mut Pass) {
        let seq = self.seq(key);
        pass.outputs.push(Output {
            key,
            uuid: seq.uuid,
            token: OutputToken::None,
            itl_ns: 0,
            index: 0,
            completed: true,
            rejected: true,
            cached_tokens: None,
        });
        self.rejected.push(key);
    }

    fn retire(&mut self, key: SeqKey) {
        let seq = self.seq(key);
        // A finish frees a batch slot even when a source keeps its blocks.
        if seq.done || !seq.blocks.is_empty() || seq.lease.bytes() > 0 {
            self.capacity_generation += 1;
        }
        if let Some(seq) = self.seqs[key.0 as usize].as_mut().filter(|s| s.hold && s.done) {
            // A finished source: park it with its blocks until `release_held`.
            seq.status = Status::Held;
            return;
        }
        if self.state.is_some() {
            self.state_release(key, false);
        }
        let mut seq = self.seqs[key.0 as usize].take().expect("live seq");
        self.pool.release(&mut seq.blocks);
        Self::release_lease(&mut self.groups, &mut seq);
        self.retired_slots.push(key.0);
    }

    fn seq(&self, key: SeqKey) -> &Seq {
        self.seqs[key.0 as usize].as_ref().expect("live seq")
    }

    fn seq_mut(&mut self, key: SeqKey) -> &mut Seq {
        self.seqs[key.0 as usize].as_mut().expect("live seq")
    }
}
