//! Disaggregated handoff on the vLLM scheduler: a source request that keeps its KV after
//! its (prefill) output until released, and a destination whose prompt blocks are reserved
//! before the transfer and which, once activated, waits for room in the batch and decodes
//! from its prompt length.

use super::{Budget, PrefillCost, Scheduled, Status, VllmScheduler};
use crate::events::KvEvent;
use crate::request::{Request, SeqKey};
use crate::scheduler::{Pass, SubmitError};

/// A destination reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Handle for `activate` / `cancel`.
    pub key: SeqKey,
    /// Prompt tokens whose KV must be transferred: the freshly reserved blocks times the
    /// block size (resident prefix blocks are not transferred).
    pub transferable_prompt_tokens: usize,
    /// Prompt tokens already resident (prefix-cache hit).
    pub cached_tokens: usize,
    /// Removed events of blocks evicted to make room.
    pub kv_events: Vec<KvEvent>,
}

/// Why a destination could not be reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The request is malformed.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// The request could never be decoded to its end on this engine.
    #[error("request {0:#x}: the destination can never hold it")]
    Unfit(u128),
    /// Not enough free blocks now.
    #[error("request {uuid:#x}: cannot reserve {needed} KV blocks, {available} available")]
    NoCapacity {
        /// The request's id.
        uuid: u128,
        /// Blocks the prompt needs beyond its resident prefix.
        needed: usize,
        /// Blocks free or evictable.
        available: usize,
    },
}

impl VllmScheduler {
    /// Queues a disaggregation source: it runs like any request, but when it finishes its
    /// blocks stay referenced (so its KV can be transferred) until [`Self::release_held`]
    /// or a cancellation.
    pub fn submit_held(&mut self, request: Request) -> Result<SeqKey, SubmitError> {
        let key = self.submit(request)?;
        self.seq_mut(key).hold = true;
        Ok(key)
    }

    /// Whether `key` is a finished source holding its KV.
    pub fn is_held(&self, key: SeqKey, uuid: u128) -> bool {
        self.seqs
            .get(key.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.uuid == uuid && s.status == Status::Held)
    }

    /// Frees a held source's blocks; false when `key` is not a held source.
    pub fn release_held(&mut self, key: SeqKey, uuid: u128) -> bool {
        if !self.is_held(key, uuid) {
            return false;
        }
        self.seq_mut(key).hold = false;
        self.retire(key);
        true
    }

    /// Reserves the prompt blocks of a disaggregation destination now (reusing resident
    /// prefix blocks); it is not scheduled until [`Self::activate`].
    pub fn reserve(&mut self, request: Request) -> Result<Reservation, ReserveError> {
        let uuid = request.uuid;
        let key = self.submit(request)?;
        let popped = self.waiting.pop_back();
        debug_assert_eq!(popped, Some(key));
        let bs = self.block_size as usize;
        if self.trtllm {
            // guaranteed_no_evict: the destination waits until its whole footprint to
            // completion fits beside every running request's and every other reservation's.
            let seq = self.seq(key);
            let needed = self.to_completion_blocks(seq);
            let available = self.no_evict_headroom();
            if needed > available {
                self.seqs[key.0 as usize] = None;
                self.free_slots.push(key.0);
                return Err(ReserveError::NoCapacity { uuid, needed, available });
            }
        }
        let seq = self.seqs[key.0 as usize].as_mut().expect("just submitted");
        seq.status = Status::Reserved;
        let prompt = seq.prompt_len as usize;
        // TRT-LLM receives the whole prompt into fresh blocks (no resident-prefix reuse).
        let reusable =
            if self.prefix_caching && !self.trtllm { self.pool.match_prefix(&seq.hashes).blocks } else { 0 };
        // The last prompt token stays uncomputed-looking only for fresh prefills; here the
        // whole prompt is materialized, so every resident block is reused.
        let target = prompt.div_ceil(bs);
        let reusable = reusable.min(target);
        let hits = &seq.hashes[..reusable.min(seq.hashes.len())];
        if !self.pool.allocate(&mut seq.blocks, target, hits, &mut self.evicted) {
            let available = self.pool.capacity() - self.pool.num_active();
            // Never visible in any output: the slot can be reused at once.
            self.seqs[key.0 as usize] = None;
            self.free_slots.push(key.0);
            self.evicted.clear();
            return Err(ReserveError::NoCapacity { uuid, needed: target - reusable, available });
        }
        let cached = (reusable * bs).min(prompt);
        seq.first_cached = Some(cached as u32);
        self.totals.prefix_cache_queries_total += prompt as u64;
        self.totals.prefix_cache_hits_total += cached as u64;
        let mut pass = Pass::default();
        self.flush_evicted(&mut pass);
        Ok(Reservation {
            key,
            transferable_prompt_tokens: (target - reusable) * bs,
            cached_tokens: cached,
            kv_events: pass.kv_events,
        })
    }

    /// Free blocks once every running request and every reserved or activated (not yet
    /// admitted) destination has its footprint to completion (TRT-LLM's no-evict
    /// accounting for handoffs).
    fn no_evict_headroom(&self) -> usize {
        let running: usize = self.running.iter().map(|e| self.remaining_reservation(self.seq(e.key))).sum();
        let reserved: usize = self
            .seqs
            .iter()
            .flatten()
            .filter(|s| matches!(s.status, Status::Reserved | Status::Landed))
            .map(|s| self.remaining_reservation(s))
            .sum();
        (self.num_gpu_blocks - self.pool.num_active()).saturating_sub(running + reserved)
    }

    /// Whether `key` is a destination waiting for activation.
    pub fn is_reserved(&self, key: SeqKey, uuid: u128) -> bool {
        self.seqs
            .get(key.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.uuid == uuid && s.status == Status::Reserved)
    }

    /// Activates a reserved destination: its prompt KV is now present (transferred), so it
    /// rejoins the waiting queue in its submission order and, once admitted (batch room
    /// permitting, `max_num_seqs`), samples its first token without computing its prompt.
    /// Returns the Stored events of its newly visible prompt blocks, or `None` if `key` is
    /// not reserved.
    pub fn activate(&mut self, key: SeqKey, uuid: u128) -> Option<Vec<KvEvent>> {
        if !self.is_reserved(key, uuid) {
            return None;
        }
        let seq = self.seq_mut(key);
        seq.status = Status::Landed;
        seq.num_computed = seq.prompt_len;
        let (cached, prompt, order) = (seq.first_cached.unwrap_or(0), seq.prompt_len, seq.order);
        let mut pass = Pass::default();
        if self.prefix_caching {
            self.finalize_blocks(key, cached, prompt, &mut pass);
        }
        let seqs = &self.seqs;
        let at = self
            .waiting
            .iter()
            .position(|k| seqs[k.0 as usize].as_ref().is_some_and(|s| s.order > order))
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, key);
        Some(pass.kv_events)
    }

    /// Tells the scheduler whether disaggregation destinations wait for a reservation on
    /// this engine (the shell's queue): while they do, its passes admit only activated
    /// destinations, whose KV is already here, and requests that would need fresh KV (a
    /// preempted one recomputing) wait, as in the reference (and vLLM, which serves
    /// requests that received remote KV first).
    pub fn set_destinations_pending(&mut self, pending: bool) {
        self.destinations_pending = pending;
    }

    /// Admits activated destinations from the waiting queue, in order, skipping every
    /// other waiting request (see [`Self::set_destinations_pending`]).
    pub(super) fn admit_landed(&mut self, b: &mut Budget, pass: &mut Pass) {
        let bs = self.block_size as usize;
        let mut i = 0;
        while self.running.len() < self.max_num_seqs && i < self.waiting.len() {
            let key = self.waiting[i];
            let seq = self.seq(key);
            if seq.status != Status::Landed {
                i += 1;
                continue;
            }
            let needed = (seq.len as usize).div_ceil(bs).saturating_sub(seq.blocks.len());
            if needed > self.num_gpu_blocks - self.pool.num_active() {
                break;
            }
            // `schedule` admits the waiting head.
            self.waiting.remove(i);
            self.waiting.push_front(key);
            let mut cursor = usize::MAX;
            match self.schedule(key, Some(PrefillCost::default()), b, pass, &mut cursor) {
                Scheduled::Yes => {}
                Scheduled::Blocked | Scheduled::CurrentPreempted | Scheduled::Skipped => {
                    if self.waiting.front() == Some(&key) {
                        self.waiting.pop_front();
                        self.waiting.insert(i, key);
                    }
                    break;
                }
            }
        }
    }

    /// Whether the running batch is at `max_num_seqs`: the reference reserves no waiting
    /// destination then.
    pub fn batch_full(&self) -> bool {
        self.running.len() >= self.max_num_seqs
    }

    /// Requests parked outside the queues (held sources and reserved destinations).
    pub fn num_parked(&self) -> usize {
        self.seqs.iter().flatten().filter(|s| matches!(s.status, Status::Held | Status::Reserved)).count()
    }
}
