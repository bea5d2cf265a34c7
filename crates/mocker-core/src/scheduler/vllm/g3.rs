//! The G3 tier (`g3_offload`) on the vLLM host-offload connector, as the reference
//! models it (docs/hybrid-kv.md §3.2):
//!
//! - write-through: every host store that completes is offered to G3 as one write job;
//!   its host blocks stay pinned until the write lands (blocks G3 declines are released
//!   at once), so the host tier cannot evict a block G3 is still reading.
//! - promotion: a prefix lookup that misses the GPU and host tiers probes G3; the resident
//!   blocks get pending host entries and one read job fills them. The request waits, and
//!   its next lookup finds them in the host tier and loads them like any host hit.
//! - a request that submits 1024 promotion rounds while its rank makes no progress stops
//!   promoting (a prefix larger than the host tier can evict its own promotions forever).

use std::collections::BTreeMap;
use std::sync::MutexGuard;

use rustc_hash::FxHashSet;

use crate::kv::g3_tier::{nearest_ns, G3Completion, G3Direction, G3Probe, G3Tier};
use crate::kv::host_tier::{HostLookup, TransferId};
use crate::kv::{HostTier, SharedG3};

/// Promotion rounds a waiting request may submit while its rank schedules nothing and
/// emits nothing; past it the request computes what the host tier cannot supply.
const MAX_RESTORE_ROUNDS_WITHOUT_PROGRESS: u32 = 1024;

/// A request's promotion rounds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct G3Restore {
    rounds_without_progress: u32,
    /// The rank's progress count at the request's last round.
    rank_progress: u64,
}

impl G3Restore {
    pub(super) fn bypassed(&self) -> bool {
        self.rounds_without_progress >= MAX_RESTORE_ROUNDS_WITHOUT_PROGRESS
    }

    /// Admitted or preempted: its rounds start over.
    pub(super) fn reset(&mut self) {
        self.rounds_without_progress = 0;
    }
}

#[derive(Debug)]
struct Stage {
    /// The request that asked for the promotion, until it leaves or loads (the promotion
    /// still lands in the host tier).
    owner: Option<u128>,
    /// The host entries the read fills, one per block.
    reservations: Vec<TransferId>,
}

/// One engine's side of the G3 tier.
#[derive(Debug)]
pub(super) struct G3Link {
    tier: SharedG3,
    worker: usize,
    stages: BTreeMap<u64, Stage>,
    /// (request, block) promotions already submitted at `attempted_at`: a zero-time
    /// promotion can be evicted by a later lookup at the same instant, so the same request
    /// does not promote the same block again then unless its whole prefix now fits.
    attempted_at: u64,
    attempted: FxHashSet<(u128, u64)>,
    /// Changes whenever G3 work is submitted, lands or is detached: a pass that ends when
    /// it starts retries at once if it changed (see `Offload::retry_now`).
    pub(super) epoch: u64,
    observed_completion_epoch: u64,
    /// Passes in which the rank scheduled work or emitted output.
    rank_progress: u64,
    scratch: Vec<G3Completion>,
    held: Vec<Vec<u64>>,
}

impl G3Link {
    pub(super) fn new(tier: SharedG3, worker: usize) -> Self {
        Self {
            tier,
            worker,
            stages: BTreeMap::new(),
            attempted_at: 0,
            attempted: FxHashSet::default(),
            epoch: 0,
            observed_completion_epoch: 0,
            rank_progress: 0,
            scratch: Vec::new(),
            held: Vec::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, G3Tier> {
        self.tier.lock().expect("G3 tier lock")
    }

    /// The tier (for its report).
    pub(super) fn tier(&self) -> &SharedG3 {
        &self.tier
    }

    pub(super) fn note_rank_progress(&mut self) {
        self.rank_progress += 1;
    }

    /// Write-through: the stores the host tier completed (and holds) become G3 writes,
    /// one job per store; blocks G3 declines (present already, or no room) are released.
    pub(super) fn store_completed(&mut self, host: &mut HostTier, now_ns: u64) {
        host.take_held(&mut self.held);
        if self.held.is_empty() {
            return;
        }
        let now = now_ns as f64 / 1e6;
        let mut tier = self.tier.lock().expect("G3 tier lock");
        for blocks in self.held.drain(..) {
            let accepted = tier.submit(self.worker, G3Direction::Write, &blocks, now).map(|(_, k)| k);
            let accepted = accepted.unwrap_or_default();
            let declined: Vec<u64> = blocks.iter().copied().filter(|b| !accepted.contains(b)).collect();
            host.unpin(&declined);
            self.epoch += u64::from(!accepted.is_empty());
        }
    }

    /// Promotes the blocks of `keys` (a prompt past its GPU prefix) that only G3 holds.
    /// True when a transfer now in flight will wake the request (a promotion it
    /// submitted, or a block still being written or promoted).
    pub(super) fn stage(
        &mut self,
        host: &mut HostTier,
        owner: u128,
        restore: &mut G3Restore,
        keys: &[u64],
        now_ns: u64,
    ) -> bool {
        if now_ns > self.attempted_at {
            self.attempted_at = now_ns;
            self.attempted.clear();
        }
        let mut missing = Vec::new();
        let mut reservations = Vec::new();
        let mut deferred = false;
        let mut tier = self.tier.lock().expect("G3 tier lock");
        for &key in keys {
            match host.lookup(key) {
                HostLookup::Hit => {}
                HostLookup::Pending => deferred = true,
                HostLookup::Miss => match tier.probe(self.worker, key) {
                    G3Probe::Resident => {
                        if self.attempted.contains(&(owner, key)) {
                            let prefix: Vec<u64> = keys
                                .iter()
                                .copied()
                                .take_while(|&k| {
                                    host.lookup(k) != HostLookup::Miss || tier.contains(self.worker, k)
                                })
                                .collect();
                            if !host.can_reserve_prefix(&prefix) {
                                break;
                            }
                        }
                        let Some(id) = host.reserve_external(key) else { break };
                        missing.push(key);
                        reservations.push(id);
                    }
                    G3Probe::Pending => deferred = true,
                    G3Probe::Miss => break,
                },
            }
        }
        if missing.is_empty() {
            return deferred;
        }
        let Some((job, _)) = tier.submit(self.worker, G3Direction::Read, &missing, now_ns as f64 / 1e6)
        else {
            for id in reservations {
                host.cancel_external(id);
            }
            return deferred;
        };
        if restore.rank_progress != self.rank_progress {
            restore.rank_progress = self.rank_progress;
            restore.rounds_without_progress = 0;
        }
        restore.rounds_without_progress += 1;
        if restore.bypassed() {
            tier.note_bypass();
        }
        drop(tier);
        self.attempted.extend(missing.into_iter().map(|k| (owner, k)));
        self.stages.insert(job, Stage { owner: Some(owner), reservations });
        self.epoch += 1;
        true
    }

    /// Takes this engine's finished jobs due by `now_ns`: landed writes release their host
    /// blocks, landed reads make their host entries resident. True when anything finished
    /// in the tier since the last call (a peer's write may serve a deferred request).
    pub(super) fn advance(&mut self, host: &mut HostTier, now_ns: u64) -> bool {
        let mut done = std::mem::take(&mut self.scratch);
        let epoch = {
            let mut tier = self.lock();
            tier.take_completed(self.worker, now_ns, &mut done);
            tier.completion_epoch()
        };
        let progressed = !done.is_empty() || epoch != self.observed_completion_epoch;
        self.observed_completion_epoch = epoch;
        for c in done.drain(..) {
            match c.dir {
                G3Direction::Write => host.unpin(&c.keys),
                G3Direction::Read => {
                    let stage = self.stages.remove(&c.id).expect("a promotion owns its reservations");
                    for id in stage.reservations {
                        host.complete_external(id);
                    }
                }
            }
            self.epoch += 1;
        }
        self.scratch = done;
        progressed
    }

    /// Detaches request `owner` from its promotions in flight (they still land).
    pub(super) fn release(&mut self, owner: u128) {
        let mut detached = false;
        for stage in self.stages.values_mut().filter(|s| s.owner == Some(owner)) {
            stage.owner = None;
            detached = true;
        }
        self.epoch += u64::from(detached);
    }

    /// The next nanosecond at which this engine has G3 work to take up.
    pub(super) fn next_deadline_ns(&self) -> Option<u64> {
        let tier = self.lock();
        if tier.completion_epoch() != self.observed_completion_epoch {
            // A peer took the last completion: this engine still has to observe it.
            return Some(nearest_ns(tier.now_ms()));
        }
        tier.next_deadline(self.worker).map(nearest_ns)
    }
}
