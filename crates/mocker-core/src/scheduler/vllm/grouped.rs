//! The vLLM core with hybrid cache groups (`kv_cache_groups`): admission, allocation and
//! faults against the rank's byte budget ([`GroupedPool`]) instead of the block pool, as
//! the reference does (docs/hybrid-kv.md §1.5). Growth and preemption are the plain
//! core's; only the capacity question differs.

use crate::kv::GroupedPool;
use crate::request::SeqKey;

use super::{Seq, VllmScheduler};

/// What the grouped admission rule decides for the waiting head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GroupedAdmission {
    /// Schedule it now.
    Admit,
    /// Leave it (and everything behind it) waiting: admission never preempts.
    Wait,
    /// Its last-token forward alone exceeds the whole budget: it can never run.
    Reject,
}

/// A forward pass that needs more than the rank's whole byte budget: the reference stops
/// the engine with this error; mocker rejects the request and reports the fault (offline
/// replay fails with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "request {uuid:#x} grouped KV forward needs {required} bytes for {tokens} scheduled tokens after \
     {before} computed tokens, exceeding the entire {capacity}-byte cache pool; reduce \
     max_num_batched_tokens or increase cache memory (kv_cache_capacity_bytes)"
)]
pub struct GroupedFault {
    /// The request.
    pub uuid: u128,
    /// Bytes its pass would hold.
    pub required: u64,
    /// Tokens the pass would compute.
    pub tokens: u32,
    /// Tokens computed before it.
    pub before: u32,
    /// The rank's budget.
    pub capacity: u64,
}

impl VllmScheduler {
    /// The reference's grouped admission of a waiting request with `budget` tokens left in
    /// the pass: rejected if even its last token's forward cannot fit the whole budget;
    /// waiting while its first chunk, `[0, min(len, budget))`, fits the budget but not
    /// what is free. A first chunk larger than the whole budget is admitted, and
    /// `schedule` reports the fault.
    pub(super) fn grouped_admission(&self, groups: &GroupedPool, seq: &Seq, budget: u32) -> GroupedAdmission {
        let len = seq.len;
        if groups.required_bytes(len.saturating_sub(1), len) > groups.capacity_bytes() {
            return GroupedAdmission::Reject;
        }
        if budget == 0 || (!self.chunked_prefill && len > budget) {
            return GroupedAdmission::Wait;
        }
        let needed = groups.required_bytes(0, len.min(budget));
        if needed <= groups.capacity_bytes() && needed > groups.free_bytes() {
            GroupedAdmission::Wait
        } else {
            GroupedAdmission::Admit
        }
    }

    /// Reserves `key`'s lease for computing tokens `[before, after)`. `Ok(false)` when the
    /// others leave no room (the caller preempts); a pass larger than the whole budget is a
    /// fault, recorded and returned.
    pub(super) fn grouped_allocate(&mut self, key: SeqKey, before: u32, after: u32) -> Result<bool, ()> {
        let groups = self.groups.as_mut().expect("grouped engine");
        let required = groups.required_bytes(before, after);
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        if required > groups.capacity_bytes() {
            let capacity = groups.capacity_bytes();
            let fault = GroupedFault { uuid: seq.uuid, required, tokens: after - before, before, capacity };
            self.fault.get_or_insert(fault);
            return Err(());
        }
        Ok(groups.allocate(&mut seq.lease, before, after))
    }

    /// Gives back what request `seq` holds in the groups (no-op without groups).
    pub(super) fn release_lease(groups: &mut Option<GroupedPool>, seq: &mut Seq) {
        if let Some(g) = groups.as_mut() {
            g.release(&mut seq.lease);
        }
    }

    /// The first pass that needed more than the rank's whole byte budget, if any.
    pub fn fault(&self) -> Option<&GroupedFault> {
        self.fault.as_ref()
    }

    /// The cache groups' byte budget (`None` without groups), for inspection.
    pub fn groups(&self) -> Option<&GroupedPool> {
        self.groups.as_ref()
    }
}

impl VllmScheduler {
    /// Takes a request whose pass faulted out of the running list (keeping the caller's
    /// `cursor` on the same neighbour) or the waiting queue, so it can be rejected.
    pub(super) fn remove_running_or_waiting(&mut self, key: SeqKey, cursor: &mut usize) {
        if let Some(i) = self.running.iter().position(|e| e.key == key) {
            self.running.remove(i);
            if *cursor != usize::MAX && i < *cursor {
                *cursor -= 1;
            }
        } else {
            self.dequeue(key);
        }
    }
}
