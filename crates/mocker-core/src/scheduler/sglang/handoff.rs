//! Disaggregated handoff on the SGLang scheduler, over its radix cache: a source keeps its
//! pages locked and out of the tree after its (prefill) token until released; a destination
//! locks its resident prefix and takes fresh pages for the rest of the prompt before the
//! transfer, and joins the running batch, prompt present, once activated.

use super::seq::Status;
use super::SglangScheduler;
use crate::events::KvEvent;
use crate::request::{Request, SeqKey};
use crate::scheduler::vllm::{Reservation, ReserveError};
use crate::scheduler::{Pass, SubmitError};

impl SglangScheduler {
    /// Queues a disaggregation source: it runs like any request, but when it finishes its
    /// pages stay locked (so its KV can be transferred) and enter the tree only when
    /// [`Self::release_held`] lets them go.
    pub fn submit_held(&mut self, request: Request) -> Result<SeqKey, SubmitError> {
        let key = self.submit(request)?;
        self.seq_mut(key).hold = true;
        Ok(key)
    }

    fn has_status(&self, key: SeqKey, uuid: u128, status: Status) -> bool {
        self.seqs
            .get(key.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.uuid == uuid && s.status == status)
    }

    /// Frees a held source: its complete pages enter the tree as a finished request's do
    /// (their Stored events come with the next pass); false when `key` is not held.
    pub fn release_held(&mut self, key: SeqKey, uuid: u128) -> bool {
        if !self.has_status(key, uuid, Status::Held) {
            return false;
        }
        let mut pass = Pass { kv_events: std::mem::take(&mut self.deferred_events), ..Pass::default() };
        self.finish_kv(key, &mut pass);
        self.deferred_events = pass.kv_events;
        self.retire(key);
        true
    }

    /// Reserves a disaggregation destination's prompt now: its resident prefix (whole
    /// pages, up to the prompt's last complete one) is locked and the remaining pages of
    /// the prompt are taken, evicting unlocked pages if needed. It runs after
    /// [`Self::activate`].
    pub fn reserve(&mut self, request: Request) -> Result<Reservation, ReserveError> {
        let uuid = request.uuid;
        let key = self.submit(request)?;
        let popped = self.waiting.pop_back();
        debug_assert_eq!(popped, Some(key));
        let page = self.page;
        let seq = self.seqs[key.0 as usize].as_mut().expect("just submitted");
        if seq.reject {
            // It could never be decoded to its end here (the pool or `max_model_len`).
            self.pending_rejects -= 1;
            self.discard(key);
            return Err(ReserveError::Unfit(uuid));
        }
        let target = seq.len.div_ceil(page);
        let (matched, node) = if self.prefix_caching {
            let complete = (seq.len / page) as usize;
            self.cache.lock_prefix(&seq.hashes[..complete.min(seq.hashes.len())])
        } else {
            (0, None)
        };
        let matched = matched as u32;
        let fresh = (target - matched) as usize;
        if !self.cache.allocate(fresh, &mut self.evicted) {
            self.cache.unlock(node);
            self.evicted.clear();
            let available = self.cache.free_pages() + self.cache.evictable_pages();
            self.discard(key);
            return Err(ReserveError::NoCapacity { uuid, needed: fresh, available });
        }
        let seq = self.seqs[key.0 as usize].as_mut().expect("just submitted");
        seq.status = Status::Reserved;
        seq.pages = target;
        seq.tree_depth = matched;
        seq.last_node = node;
        seq.first_cached = Some(matched * page);
        let mut pass = Pass::default();
        self.flush_evicted(&mut pass);
        Ok(Reservation {
            key,
            transferable_prompt_tokens: fresh * page as usize,
            cached_tokens: (matched * page) as usize,
            kv_events: pass.kv_events,
        })
    }

    /// Forgets a request no output ever mentioned (its slot can be reused at once).
    fn discard(&mut self, key: SeqKey) {
        self.seqs[key.0 as usize] = None;
        self.free_slots.push(key.0);
    }

    /// Activates a reserved destination: its prompt KV is present, its complete prompt
    /// pages enter the tree, and it joins the running batch as the next pass starts,
    /// decoding from the prompt length. Returns the Stored events of the newly visible
    /// pages, or `None` if `key` is not reserved.
    pub fn activate(&mut self, key: SeqKey, uuid: u128) -> Option<Vec<KvEvent>> {
        if !self.has_status(key, uuid, Status::Reserved) {
            return None;
        }
        let seq = self.seq_mut(key);
        seq.status = Status::Admitted;
        seq.materialized = seq.len;
        let mut pass = Pass::default();
        let free = self.cache.free_pages();
        self.cache_materialized(key, &mut pass);
        if self.cache.free_pages() > free {
            // Its pages that duplicated resident ones went back to the pool.
            self.capacity_generation += 1;
        }
        self.ready.push_back(key);
        Some(pass.kv_events)
    }

    /// Tells the scheduler whether disaggregation destinations wait for a reservation on
    /// this engine (the shell's queue): while they do, its passes admit no request that
    /// needs fresh KV (a retracted one recomputing waits), as in the reference.
    pub fn set_destinations_pending(&mut self, pending: bool) {
        self.destinations_pending = pending;
    }

    /// Requests parked outside the queues (held sources and reserved destinations).
    pub fn num_parked(&self) -> usize {
        self.seqs.iter().flatten().filter(|s| matches!(s.status, Status::Held | Status::Reserved)).count()
    }
}
