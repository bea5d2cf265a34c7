//! The SGLang scheduling loop (modelled on SGLang v0.5.6's `get_next_batch_to_run`): a pass
//! is either a prefill pass (a batch admitted from the waiting queue; running requests do
//! not decode in it) or a decode pass (every running request samples one token, after
//! retracting requests if their next pages do not fit). KV lives in a page-granular radix
//! cache whose unlocked pages are evictable.

mod decode;
mod handoff;
mod kv;
mod mtp;
mod prefill;
mod seq;
mod steady;

use std::collections::VecDeque;

use crate::config::{EngineConfig, SglangSchedulePolicy, WorkerType};
use crate::events::{KvEvent, KvEventData};
use crate::hashing::extend_sequence_hashes;
use crate::kv::RadixCache;
use crate::metrics::EngineMetrics;
use crate::request::{Output, OutputToken, Request, SeqKey};
use crate::timing::{scaled_nanos, DecodeShape, PrefillShape, TimingModel};

use super::draft::DraftSampler;
use super::RunEntry;
use super::{Pass, PrefixCacheBusy, SchedulerOptions, SubmitError};
use prefill::PrefillBatch;
use seq::{Seq, Status};

/// One rank's SGLang-style scheduler, radix cache and timing model.
#[derive(Debug)]
pub struct SglangScheduler {
    page: u32,
    total_tokens: usize,
    max_running: usize,
    max_model_len: Option<usize>,
    prefix_caching: bool,
    policy: SglangSchedulePolicy,
    max_prefill_tokens: usize,
    chunked_prefill_size: usize,
    clip: usize,
    init_ratio: f64,
    min_ratio: f64,
    decay_step: f64,
    new_token_ratio: f64,
    prefill_decode_interval: usize,
    prefill_rounds_remaining: usize,
    speedup: f64,
    decode_speedup: f64,
    dp_rank: u32,
    record_kv_events: bool,
    kv_token_ids: bool,
    /// Count steady tokens instead of itemizing them (see `steady`).
    aggregate_steady: bool,
    opaque_output_blocks: bool,
    /// Disaggregation role: a decode worker's (re-)prefills take no time.
    worker_type: WorkerType,
    /// MTP draft acceptance (`aic_nextn`), used by decode passes.
    sampler: Option<DraftSampler>,
    /// Most tokens a decode pass emits per request (`aic_nextn + 1` with MTP off prefill
    /// workers, else 1).
    max_burst: u32,
    /// End of the previous pass: the last token time of requests in a steady run.
    last_end_ns: u64,
    timing: Box<dyn TimingModel>,

    seqs: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    retired_slots: Vec<u32>,
    /// Moves whenever KV capacity is given back (a request finishes or is let go, a
    /// decode pass retracts, an activation frees duplicate pages, a cancel): a
    /// destination that found no room is retried only once it has, as in the reference.
    capacity_generation: u64,
    /// Disaggregation destinations wait for a reservation here (the shell's queue): no
    /// request needing fresh KV is admitted meanwhile (see `set_destinations_pending`).
    destinations_pending: bool,
    waiting: VecDeque<SeqKey>,
    running: Vec<RunEntry>,
    /// Activated disaggregation destinations, joining `running` as a pass starts.
    ready: VecDeque<SeqKey>,
    /// KV events of handoff operations between passes, reported with the next pass.
    deferred_events: Vec<KvEvent>,
    cache: RadixCache,
    /// Requests marked for rejection at the next pass.
    pending_rejects: usize,

    pass_id: u64,
    next_event_id: u64,
    totals: EngineMetrics,
    /// Pages taken for this pass's token growth, not yet handed to requests.
    reserved_growth: usize,
    evicted: Vec<u64>,
    created: Vec<u32>,
    scratch_tokens: Vec<u32>,
    retired: Vec<SeqKey>,
    lpm_scratch: Vec<(bool, std::cmp::Reverse<usize>, SeqKey)>,
    batch: PrefillBatch,
    pass: Pass,
}

impl SglangScheduler {
    /// A scheduler for `config` (backend sglang; `block_size` is the page size).
    pub fn new(config: &EngineConfig, timing: Box<dyn TimingModel>, options: SchedulerOptions) -> Self {
        let s = &config.sglang;
        let page = config.block_size.clamp(1, u32::MAX as usize);
        // SGLang's admission-estimate constants, scaled by schedule_conservativeness.
        let init_ratio = (0.7 * s.schedule_conservativeness).min(1.0);
        let record_kv_events = options.record_kv_events && config.enable_prefix_caching;
        let mut cache = RadixCache::new(config.num_gpu_blocks, page);
        cache.set_reporting(record_kv_events);
        let min_ratio = (init_ratio * 0.14).min(1.0);
        // Prefill workers emit their one token without verifying drafts.
        let sampler = config.aic_nextn.filter(|_| config.worker_type != WorkerType::Prefill).map(|_| {
            DraftSampler::new(
                &config.mtp_accept_rates(),
                config.aic_mtp_seed.wrapping_add(options.seed_offset),
            )
        });
        let max_burst = sampler.as_ref().map_or(1, |s| s.max_burst);
        Self {
            page: page as u32,
            total_tokens: config.num_gpu_blocks.saturating_mul(page),
            max_running: config.max_num_seqs,
            max_model_len: config.max_model_len,
            prefix_caching: config.enable_prefix_caching,
            policy: s.schedule_policy,
            max_prefill_tokens: s.max_prefill_tokens,
            chunked_prefill_size: s.chunked_prefill_size,
            clip: s.clip_max_new_tokens,
            init_ratio,
            min_ratio,
            decay_step: (init_ratio - min_ratio) / 600.0,
            new_token_ratio: init_ratio,
            prefill_decode_interval: config.prefill_decode_interval,
            prefill_rounds_remaining: 0,
            speedup: config.speedup_ratio,
            decode_speedup: config.speedup_ratio * config.decode_speedup_ratio,
            dp_rank: options.dp_rank,
            record_kv_events,
            kv_token_ids: config.emit_kv_token_ids,
            // Bursts vary per pass: MTP decodes are never steady.
            aggregate_steady: options.aggregate_steady_tokens && sampler.is_none(),
            opaque_output_blocks: options.opaque_output_blocks,
            worker_type: config.worker_type,
            sampler,
            max_burst,
            last_end_ns: 0,
            timing,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            retired_slots: Vec::new(),
            capacity_generation: 0,
            destinations_pending: false,
            waiting: VecDeque::new(),
            running: Vec::new(),
            ready: VecDeque::new(),
            deferred_events: Vec::new(),
            cache,
            pending_rejects: 0,
            pass_id: 0,
            next_event_id: 0,
            totals: EngineMetrics {
                dp_rank: options.dp_rank,
                total_blocks: config.num_gpu_blocks,
                ..Default::default()
            },
            reserved_growth: 0,
            evicted: Vec::new(),
            created: Vec::new(),
            scratch_tokens: Vec::new(),
            retired: Vec::new(),
            lpm_scratch: Vec::new(),
            batch: PrefillBatch::default(),
            pass: Pass::default(),
        }
    }

    /// Queues a request; it is considered for admission by the next pass. A request that
    /// could never be admitted or never finish in this pool is rejected by that pass.
    pub fn submit(&mut self, request: Request) -> Result<SeqKey, SubmitError> {
        let mut max_output = super::requested_output(&request)?;
        if request.tokenless() {
            // Its radix cache hashes pages and KV events from tokens.
            return Err(SubmitError::MissingTokens(request.uuid));
        }
        let prompt_len = request.tokens.len();
        let mut reject = false;
        if let Some(m) = self.max_model_len {
            reject |= prompt_len >= m;
            max_output = max_output.min(m.saturating_sub(prompt_len).max(1));
        }
        let page = self.page as usize;
        // Never admissible (prompt pages plus the clipped output reserve fill the pool) or
        // never completable (the finished sequence outgrows the pool): the reference would
        // stall on these; reject them instead.
        reject |= prompt_len.div_ceil(page) * page + max_output.min(self.clip) >= self.total_tokens;
        reject |= (prompt_len + max_output).div_ceil(page) * page > self.total_tokens;
        let hashes = match request.block_hashes {
            _ if !self.prefix_caching => Vec::new(),
            Some(h) if h.sequence.len() == prompt_len / page => h.sequence,
            _ => {
                let mut h = Vec::new();
                extend_sequence_hashes(&request.tokens, page, &mut h);
                h
            }
        };
        let seq = Seq {
            uuid: request.uuid,
            prompt: request.tokens,
            planned: request.output_token_ids,
            max_output: max_output.min(u32::MAX as usize) as u32,
            len: prompt_len as u32,
            generated: 0,
            materialized: 0,
            pages: 0,
            tree_depth: 0,
            last_node: None,
            hashes,
            status: Status::Fresh,
            reject,
            hold: false,
            first_cached: None,
            sent_first: false,
            last_token_ns: 0,
            last_token_pass: u64::MAX,
        };
        self.pending_rejects += usize::from(reject);
        let key = super::insert_slot(&mut self.seqs, &mut self.free_slots, seq);
        self.waiting.push_back(key);
        Ok(key)
    }

    /// Whether a pass would do anything.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.ready.is_empty()
    }

    /// Requests held (running plus waiting, including those between prefill chunks).
    pub fn num_requests(&self) -> usize {
        self.running.len() + self.waiting.len() + self.ready.len()
    }

    /// The most recent pass.
    pub fn last_pass(&self) -> &Pass {
        &self.pass
    }

    /// The radix cache (read-only), for inspection and invariant checks.
    pub fn cache(&self) -> &RadixCache {
        &self.cache
    }

    /// Runs one pass starting at `now_ns`: a prefill pass when the waiting queue yields a
    /// batch, else a decode pass over the running requests.
    pub fn step(&mut self, now_ns: u64) -> &Pass {
        let mut pass = std::mem::take(&mut self.pass);
        pass.clear(now_ns);
        self.free_slots.append(&mut self.retired_slots);
        self.pass_id += 1;
        if self.pending_rejects > 0 {
            self.reject_marked(&mut pass);
        }
        if !self.deferred_events.is_empty() {
            pass.kv_events.append(&mut self.deferred_events);
        }
        // Activated destinations run first; while some still wait for a slot, or others
        // wait for a reservation, no prefill is admitted (the reference's order).
        while !self.ready.is_empty() && self.running.len() < self.max_running {
            let key = self.ready.pop_front().expect("non-empty");
            self.running.push(RunEntry::new(key));
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        let defer = self.prefill_rounds_remaining > 0;
        if !defer
            && self.ready.is_empty()
            && !self.destinations_pending
            && !self.waiting.is_empty()
            && self.running.len() < self.max_running
        {
            // Admission reads every running request's remaining output.
            self.catch_up_all();
            self.order_waiting();
            self.admit(&mut batch, &mut pass, false);
            if batch.keys.is_empty() && self.running.is_empty() {
                // Nothing would change: the reference stalls here for good. Let the head
                // (a partially prefilled one first) in on physical capacity alone.
                self.unstick();
                self.admit(&mut batch, &mut pass, true);
            }
        }
        let m = &mut pass.metrics;
        m.dp_rank = self.dp_rank;
        let mut retracted = 0;
        if !batch.keys.is_empty() {
            let n = batch.keys.len();
            // A decode worker recomputes a retracted request's KV for free (the reference).
            let prefill_ms = if self.worker_type == WorkerType::Decode {
                0.0
            } else {
                self.timing.prefill_ms(PrefillShape {
                    batch: n,
                    mean_isl: batch.total_isl / n,
                    mean_prefix: batch.total_prefix / n,
                })
            };
            pass.end_ns = now_ns + scaled_nanos(prefill_ms, self.speedup);
            m.num_prefill_requests = n;
            m.sum_prefill_tokens = batch.computed;
            m.sum_prefill_kv_tokens = batch.total_prefix;
            m.scheduled_tokens = batch.computed;
            self.totals.prompt_tokens_computed_total += batch.computed as u64;
            self.totals.prefix_cache_hits_total += batch.hit_tokens as u64;
            self.totals.prefix_cache_queries_total += (batch.hit_tokens + batch.computed) as u64;
            self.finish_prefill(&batch, &mut pass);
        } else if !self.running.is_empty() {
            let plan = self.retract_for_decode();
            retracted = plan.retracted;
            if retracted > 0 {
                self.capacity_generation += 1;
            }
            let (n, kv) = (self.running.len(), plan.kv);
            let decode_ms = self.timing.decode_ms(DecodeShape {
                batch: n,
                active_kv_tokens: kv,
                total_kv_tokens: self.total_tokens,
            });
            pass.end_ns = now_ns + scaled_nanos(decode_ms, self.decode_speedup);
            let m = &mut pass.metrics;
            m.num_decode_requests = n;
            m.sum_decode_kv_tokens = kv;
            m.scheduled_tokens = n;
            m.num_preempted = retracted;
            self.grow_and_append(plan.pages, &mut pass);
        }
        if retracted == 0 && batch.keys.is_empty() {
            // The estimate relaxes on every pass that is not a prefill (SGLang decays it in
            // `update_running_batch`).
            self.new_token_ratio = (self.new_token_ratio - self.decay_step).max(self.min_ratio);
        }
        self.prefill_rounds_remaining = if batch.computed > 0 {
            self.prefill_decode_interval
        } else {
            self.prefill_rounds_remaining.saturating_sub(1)
        };
        pass.metrics.num_queued_requests = self.waiting.len();
        pass.metrics.wall_time_secs = (pass.end_ns - now_ns) as f64 / 1e9;
        self.last_end_ns = pass.end_ns;
        self.batch = batch;
        self.pass = pass;
        &self.pass
    }

    /// Makes the prefill-deferral count the group's: a round in which any rank prefilled
    /// restarts it (this rank's own pass counted only its own prefill), and a round this
    /// rank sat out still counts as one.
    pub(crate) fn end_group_round(&mut self, stepped: bool, prefilled: bool) {
        if prefilled {
            self.prefill_rounds_remaining = self.prefill_decode_interval;
        } else if !stepped {
            self.prefill_rounds_remaining = self.prefill_rounds_remaining.saturating_sub(1);
        }
    }

    /// Moves the last pass's end to `end_ns` (its group's wave end, not before its own).
    pub(crate) fn stretch_last_pass(&mut self, end_ns: u64) {
        super::stretch_pass(&mut self.pass, end_ns, |key, t| {
            if let Some(seq) = self.seqs[key.0 as usize].as_mut() {
                seq.last_token_ns = t;
            }
        });
        self.last_end_ns = end_ns;
    }

    /// Nothing runs and nothing was admitted: partially prefilled requests that lpm moved
    /// behind others may hold pages the head cannot get. Continue the first of them and let
    /// the others give their KV back (they restart later).
    fn unstick(&mut self) {
        let Some(i) = self.waiting.iter().position(|k| self.seq(*k).materialized > 0) else {
            return;
        };
        let key = self.waiting.remove(i).expect("in range");
        self.waiting.push_front(key);
        for j in 1..self.waiting.len() {
            let k = self.waiting[j];
            if self.seq(k).materialized > 0 {
                self.release_kv(k);
                self.seq_mut(k).status = Status::Retracted;
                self.totals.num_preemptions_total += 1;
            }
        }
    }

    /// After a prefill forward: requests with prompt left go back to the waiting front (in
    /// order) with their computed pages cached; finished prompts join running and get the
    /// first token the forward sampled.
    fn finish_prefill(&mut self, batch: &PrefillBatch, pass: &mut Pass) {
        let from = self.running.len();
        for &key in &batch.keys {
            let seq = self.seq(key);
            if seq.materialized < seq.len {
                self.cache_materialized(key, pass);
                self.waiting.push_front(key);
            } else {
                self.running.push(RunEntry::new(key));
            }
        }
        if from == self.running.len() {
            return;
        }
        // Requests whose first token is their last finish without a KV slot for it; the
        // others need one, and keep their token for the next decode pass if none is free.
        let page = self.page;
        let needed: usize = self.running[from..]
            .iter()
            .map(|e| {
                let s = self.seqs[e.key.0 as usize].as_ref().expect("live seq");
                if s.remaining() <= 1 {
                    0
                } else {
                    (s.len + 1).div_ceil(page).saturating_sub(s.pages) as usize
                }
            })
            .sum();
        if self.cache.allocate(needed, &mut self.evicted) {
            self.reserved_growth = needed;
            self.flush_evicted(pass);
            self.append_tokens(from, true, pass);
        } else {
            self.evicted.clear();
            // Only the ones finishing now can proceed; the rest wait for a decode pass.
            self.append_final_only(from, pass);
        }
    }

    fn reject_marked(&mut self, pass: &mut Pass) {
        let mut i = 0;
        while i < self.waiting.len() {
            let key = self.waiting[i];
            let seq = self.seq(key);
            if !seq.reject {
                i += 1;
                continue;
            }
            let uuid = seq.uuid;
            self.waiting.remove(i);
            pass.outputs.push(Output {
                key,
                uuid,
                token: OutputToken::None,
                index: 0,
                itl_ns: 0,
                completed: true,
                rejected: true,
                cached_tokens: None,
            });
            self.retire(key);
        }
        self.pending_rejects = 0;
    }

    /// Current engine metrics. Active pages include cached tree pages (as the reference
    /// reports SGLang usage); SGLang has no separate inactive population.
    pub fn metrics(&self) -> EngineMetrics {
        let total = self.cache.total_pages();
        let active = total - self.cache.free_pages();
        let frac = if total == 0 { 0.0 } else { active as f64 / total as f64 };
        EngineMetrics {
            running_requests: self.running.len(),
            waiting_requests: self.waiting.len(),
            active_blocks: active,
            inactive_blocks: 0,
            total_blocks: total,
            gpu_cache_usage_perc: frac,
            physical_gpu_cache_usage_perc: frac,
            ..self.totals
        }
    }

    /// Current admission estimate of the fraction of remaining output tokens running
    /// requests will still need (SGLang's `new_token_ratio`).
    pub fn new_token_ratio(&self) -> f64 {
        self.new_token_ratio
    }

    /// The estimate's initial value (`0.7 × schedule_conservativeness`, capped at 1).
    pub fn init_new_token_ratio(&self) -> f64 {
        self.init_ratio
    }

    /// Changes the speed-up of the passes computed from now on; the decode passes keep
    /// their extra divisor (`decode_speedup_ratio`).
    pub fn set_speedup_ratio(&mut self, ratio: f64) {
        let decode_ratio = if self.speedup > 0.0 { self.decode_speedup / self.speedup } else { 1.0 };
        self.speedup = ratio;
        self.decode_speedup = ratio * decode_ratio;
    }

    /// Drops every cached page when no request holds KV; returns the `Cleared` event when
    /// KV events are recorded.
    pub fn reset_prefix_cache(&mut self) -> Result<Option<KvEvent>, PrefixCacheBusy> {
        let held = self.cache.total_pages() - self.cache.free_pages() - self.cache.evictable_pages();
        if held > 0 || !self.cache.clear(&mut self.evicted) {
            return Err(PrefixCacheBusy { active_blocks: held });
        }
        self.evicted.clear();
        if !self.record_kv_events {
            return Ok(None);
        }
        let event =
            KvEvent { event_id: self.next_event_id, dp_rank: self.dp_rank, data: KvEventData::Cleared };
        self.next_event_id += 1;
        Ok(Some(event))
    }

    /// Removes request `key` carrying `uuid` (waiting, between chunks or running), freeing
    /// its KV, and drops its undelivered outputs of the last pass. Returns whether anything
    /// was removed.
    pub fn cancel(&mut self, key: SeqKey, uuid: u128) -> bool {
        let before = self.pass.outputs.len() + self.pass.steady.len();
        let keep = |o: &Output| o.key != key || o.uuid != uuid;
        self.pass.outputs.retain(keep);
        self.pass.steady.retain(keep);
        let suppressed = before != self.pass.outputs.len() + self.pass.steady.len();
        let live = self.seqs.get(key.0 as usize).and_then(Option::as_ref).is_some_and(|s| s.uuid == uuid);
        if live {
            if let Some(i) = self.running.iter().position(|e| e.key == key) {
                self.running.remove(i);
            } else if let Some(i) = self.waiting.iter().position(|&k| k == key) {
                self.waiting.remove(i);
                if self.seq(key).reject {
                    self.pending_rejects = self.pending_rejects.saturating_sub(1);
                }
            } else if let Some(i) = self.ready.iter().position(|&k| k == key) {
                self.ready.remove(i);
            }
            self.release_kv(key);
            self.retire(key);
            self.capacity_generation += 1;
        }
        live || suppressed
    }

    /// The handle of the held request with id `uuid` (linear scan; not for hot paths).
    pub fn find(&self, uuid: u128) -> Option<SeqKey> {
        self.seqs
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.uuid == uuid))
            .map(|i| SeqKey(i as u32))
            .or_else(|| self.pass.all_outputs().find(|o| o.uuid == uuid).map(|o| o.key))
    }

    /// Checks the cache invariants plus each request's page bookkeeping (for tests).
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut private = 0usize;
        for (i, s) in self.seqs.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.tree_depth > s.pages || s.materialized > s.pages * self.page || s.materialized > s.len {
                return Err(format!(
                    "request {i}: pages {} depth {} materialized {}",
                    s.pages, s.tree_depth, s.materialized
                ));
            }
            private += s.private_pages() as usize;
        }
        for e in &self.running {
            let s = self.seq(e.key);
            if s.materialized != s.len {
                return Err(format!(
                    "running request {}: materialized {} of {}",
                    e.key.0, s.materialized, s.len
                ));
            }
        }
        self.cache.check_invariants(private)
    }

    /// See the field: the shell gates its retries of a destination that found no room.
    pub fn capacity_generation(&self) -> u64 {
        self.capacity_generation
    }

    fn retire(&mut self, key: SeqKey) {
        self.seqs[key.0 as usize] = None;
        self.retired_slots.push(key.0);
    }

    fn seq(&self, key: SeqKey) -> &Seq {
        self.seqs[key.0 as usize].as_ref().expect("live seq")
    }

    fn seq_mut(&mut self, key: SeqKey) -> &mut Seq {
        self.seqs[key.0 as usize].as_mut().expect("live seq")
    }
}
