//! vLLM's native host offload (`native_host_offload`) on the vLLM scheduler, as the
//! reference models its `OffloadingConnector`:
//!
//! - write-through: after scheduling, each scheduled request offers the prompt blocks it has
//!   computed (from its store cursor) to the host tier as one cohort; the copies start at the
//!   pass end on the device-to-host lane. Until a copy completes, reusing the GPU block it
//!   reads for a fresh write delays the compute of the pass that does (a fence).
//! - load: a waiting request whose prefix continues in the host tier reserves GPU blocks for
//!   it and waits (off the waiting queue, in the connector queue) for the host-to-device copy;
//!   then it is admitted with the loaded blocks as its cached prefix.
//! - a lookup that meets a block still being stored or loaded defers the request until some
//!   transfer completes.

use std::collections::VecDeque;

use super::g3::{G3Link, G3Restore};
use super::{Budget, PrefillCost, Scheduled, SeqKey, Status, VllmScheduler};
use crate::config::{G3OffloadConfig, HostOffloadConfig};
use crate::kv::host_tier::{Completed, HostLookup, StoreOutcome, TransferId, TransferKind};
use crate::kv::{BlockId, HostTier, HostTierOptions, SharedG3};
use crate::scheduler::Pass;
use rustc_hash::FxHashMap;

/// A request's progress through a host load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Load {
    None,
    /// Blocks `base..end` are being copied in by `id` (`seq.blocks` holds them, unregistered).
    Loading {
        id: TransferId,
        base: u32,
        end: u32,
    },
    /// The copy landed: the first `end` blocks are its cached prefix at admission.
    Activated {
        end: u32,
    },
}

/// Per-request connector state (kept only when offload is on).
#[derive(Debug, Clone)]
pub(super) struct HostSeq {
    /// First prompt block not yet offered to the host tier.
    next_store: u32,
    latest_store: Option<TransferId>,
    pub(super) load: Load,
    /// In the connector queue.
    queued: bool,
    /// Waits for some transfer to complete before it is looked at again.
    asleep: bool,
    /// Its G3 promotion rounds (with `g3_offload`).
    restore: G3Restore,
}

impl HostSeq {
    pub(super) fn new() -> Self {
        Self {
            next_store: 0,
            latest_store: None,
            load: Load::None,
            queued: false,
            asleep: false,
            restore: G3Restore::default(),
        }
    }
}

/// The rank's host tier and connector bookkeeping.
#[derive(Debug)]
pub(super) struct Offload {
    tier: HostTier,
    /// Requests the connector took off the waiting queue (deferred or loading), FCFS.
    connector: VecDeque<SeqKey>,
    /// Hashes being loaded, by load: another request meeting one of them is deferred.
    loading: FxHashMap<u64, TransferId>,
    /// Owner of each load in flight.
    load_owner: FxHashMap<TransferId, (SeqKey, u128)>,
    /// Source GPU blocks of each prepared store.
    store_sources: FxHashMap<TransferId, Vec<BlockId>>,
    /// Per GPU block: completion of the last store reading it (0 = none).
    source_busy_until: Vec<u64>,
    /// The current pass computes no earlier than this.
    compute_not_before: u64,
    done: Vec<Completed>,
    /// The G3 tier below (`g3_offload`), if configured.
    g3: Option<G3Link>,
    /// Counts loads started and host transfers completed; with [`G3Link::epoch`] it tells
    /// whether a pass changed the connector's state.
    load_epoch: u64,
    /// With G3: the pass that just ran took no time but changed G3 or load state, so the
    /// engine steps again at this same instant (the reference's same-timestamp retry).
    retry_at: Option<u64>,
    /// With a G3 tier shared by several engines: the end of the pass in flight, whose
    /// boundary (completions, then its stores) waits until the pass completes. The shared
    /// tier must see each engine's operations in time order, and the others step before
    /// this pass ends.
    pub(super) pending_boundary: Option<u64>,
    defers_boundaries: bool,
}

impl Offload {
    pub(super) fn new(
        cfg: &HostOffloadConfig,
        g3: Option<&G3OffloadConfig>,
        block_size: usize,
        bytes_per_token: u64,
        gpu_blocks: usize,
    ) -> Self {
        let block_bytes = block_size as u64 * bytes_per_token;
        let mut tier = HostTier::new(HostTierOptions {
            capacity_blocks: cfg.num_host_blocks,
            block_bytes: block_size as u64 * bytes_per_token,
            d2h_gbps: cfg.d2h_bandwidth_gbps,
            h2d_gbps: cfg.h2d_bandwidth_gbps,
            first_byte_ns: (cfg.latency_to_first_byte_ms * 1e6).round() as u64,
        });
        let g3 = g3.map(|g| {
            // G3 writes read the host copy: it stays pinned until they land.
            tier.hold_completed_sources();
            // An engine owns its tier until a deployment shares one (`share_g3`).
            G3Link::new(
                std::sync::Arc::new(std::sync::Mutex::new(crate::kv::G3Tier::new(g, 1, block_bytes))),
                0,
            )
        });
        Self {
            tier,
            connector: VecDeque::new(),
            loading: FxHashMap::default(),
            load_owner: FxHashMap::default(),
            store_sources: FxHashMap::default(),
            source_busy_until: vec![0; gpu_blocks],
            compute_not_before: 0,
            done: Vec::new(),
            g3,
            load_epoch: 0,
            retry_at: None,
            pending_boundary: None,
            defers_boundaries: false,
        }
    }

    /// Whether a pass's boundary waits for the pass to complete (see `pending_boundary`).
    pub(super) fn defers_boundaries(&self) -> bool {
        self.defers_boundaries
    }

    /// Replaces this engine's G3 tier with `tier`, shared by a deployment, as its worker
    /// `worker`. Only before the engine has run.
    pub(super) fn share_g3(&mut self, tier: SharedG3, worker: usize) {
        debug_assert!(self.g3.is_some(), "the engine has a G3 tier to share");
        self.g3 = Some(G3Link::new(tier, worker));
        self.defers_boundaries = true;
    }

    /// Forgets a same-instant retry (the run is over).
    pub(super) fn clear_retry(&mut self) {
        self.retry_at = None;
    }

    /// The G3 tier, if configured.
    pub(super) fn g3_tier(&self) -> Option<&SharedG3> {
        self.g3.as_ref().map(G3Link::tier)
    }

    /// With G3: the state a same-instant retry compares.
    pub(super) fn g3_epoch(&self) -> Option<u64> {
        self.g3.as_ref().map(|g| g.epoch + self.load_epoch)
    }

    /// Called at the end of a pass that started at `now` (see `retry_at`).
    pub(super) fn end_pass(&mut self, now: u64, end: u64, epoch_before: Option<u64>, progressed: bool) {
        if let Some(g) = self.g3.as_mut() {
            if progressed {
                g.note_rank_progress();
            }
        }
        self.retry_at = None;
        if epoch_before.is_some() && end == now {
            let changed = self.g3_epoch() != epoch_before;
            if changed || self.next_deadline().is_some_and(|d| d <= now) {
                self.retry_at = Some(now);
            }
        }
    }

    /// Requests in the connector queue.
    pub(super) fn queued(&self) -> usize {
        self.connector.len()
    }

    /// The next transfer completion, for waking an idle engine.
    pub(super) fn next_deadline(&self) -> Option<u64> {
        let g3 = self.g3.as_ref().and_then(G3Link::next_deadline_ns);
        [self.tier.next_deadline(), g3, self.retry_at, self.pending_boundary].into_iter().flatten().min()
    }

    /// When the pass starting at `now` may compute.
    pub(super) fn compute_start(&self, now: u64) -> u64 {
        self.compute_not_before.max(now)
    }

    /// Fences the pass behind stores still reading `fresh` blocks.
    pub(super) fn fence(&mut self, fresh: &[BlockId], now: u64) {
        for &id in fresh {
            let busy = self.source_busy_until[id as usize];
            if busy > now {
                self.compute_not_before = self.compute_not_before.max(busy);
            }
        }
    }
}

/// How a waiting request's prefix continues in the host tier.
#[derive(PartialEq, Eq)]
enum Lookup {
    Miss,
    Deferred,
    /// Prompt blocks `base..end` are resident in the host tier.
    Hit {
        base: u32,
        end: u32,
    },
}

impl VllmScheduler {
    fn off(&mut self) -> &mut Offload {
        self.offload.as_mut().expect("offload configured")
    }

    fn host(&mut self, key: SeqKey) -> &mut HostSeq {
        self.seq_mut(key).host.as_mut().expect("offload state")
    }

    /// Whether a connector-queued request is ready to be looked at.
    pub(super) fn has_ready_connector(&self) -> bool {
        self.offload.as_ref().is_some_and(|o| {
            o.connector.iter().any(|&k| {
                self.seqs[k.0 as usize]
                    .as_ref()
                    .and_then(|s| s.host.as_ref())
                    .is_some_and(|h| h.queued && !h.asleep)
            })
        })
    }

    /// Takes request `key` off whichever queue holds it, as it is admitted or rejected.
    pub(super) fn dequeue(&mut self, key: SeqKey) {
        if self.waiting.front() == Some(&key) {
            self.waiting.pop_front();
            return;
        }
        if let Some(h) = self.seq_mut(key).host.as_mut().filter(|h| h.queued) {
            h.queued = false;
            h.asleep = false;
            let off = self.off();
            if let Some(i) = off.connector.iter().position(|&k| k == key) {
                off.connector.remove(i);
            }
        } else if let Some(i) = self.waiting.iter().position(|&k| k == key) {
            self.waiting.remove(i);
        }
    }

    /// Moves `key` to the connector queue (behind earlier ones) asleep until a transfer completes.
    fn sleep(&mut self, key: SeqKey) {
        let h = self.host(key);
        h.asleep = true;
        if h.queued {
            return;
        }
        h.queued = true;
        if self.waiting.front() == Some(&key) {
            self.waiting.pop_front();
        } else if let Some(i) = self.waiting.iter().position(|&k| k == key) {
            self.waiting.remove(i);
        }
        self.off().connector.push_back(key);
    }

    /// The next request to admit: the first awake connector waiter, else the waiting head.
    fn next_candidate(&self) -> Option<SeqKey> {
        let off = self.offload.as_ref()?;
        let host = |k: SeqKey| self.seqs[k.0 as usize].as_ref().and_then(|s| s.host.as_ref());
        // With G3, an awake waiter that holds GPU blocks for a load goes first (the
        // reference's G1 owner), so promotions cannot starve it of the blocks it holds.
        let owner = off.g3.as_ref().and_then(|_| {
            off.connector
                .iter()
                .copied()
                .find(|&k| host(k).is_some_and(|h| !h.asleep && h.load != Load::None))
        });
        let ready =
            owner.or_else(|| off.connector.iter().copied().find(|&k| host(k).is_some_and(|h| !h.asleep)));
        ready.or_else(|| self.waiting.front().copied())
    }

    /// Admissions with the host tier: (b) of the pass, replacing `admit_waiting`.
    pub(super) fn admit_waiting_offload(&mut self, b: &mut Budget, pass: &mut Pass, now: u64) {
        let bs = self.block_size;
        // vLLM does not consult the connector once the pass's token budget is spent.
        while self.running.len() < self.max_num_seqs && b.tokens > 0 {
            let Some(key) = self.next_candidate() else { break };
            let mut matched = std::mem::take(&mut self.matched);
            let seq = self.seq(key);
            if self.never_fits(seq) {
                self.dequeue(key);
                self.reject(key, pass);
                continue;
            }
            if seq.status == Status::Landed {
                // An activated destination: its prompt KV arrived by transfer, so there is
                // nothing to look up or load, and its blocks are held already.
                self.matched = matched;
                let mut cursor = usize::MAX;
                match self.schedule(key, Some(PrefillCost::default()), b, pass, &mut cursor) {
                    Scheduled::Yes => continue,
                    Scheduled::Blocked | Scheduled::CurrentPreempted | Scheduled::Skipped => break,
                }
            }
            let mut cost = self.prefill_cost(seq, &mut matched);
            self.matched = matched;
            if let Load::Activated { end } = self.seq(key).host.as_ref().expect("offload state").load {
                // The first retry after a load admits exactly the loaded prefix.
                cost.cached = cost.cached.min(end * bs);
                cost.active_cached = cost.cached;
            }
            let lookup = self.host_lookup(key, cost, now);
            let hit = match lookup {
                Lookup::Deferred => {
                    self.sleep(key);
                    continue;
                }
                Lookup::Miss => None,
                Lookup::Hit { base, end } => Some((base, end)),
            };
            let seq = self.seq(key);
            let reused_blocks = cost.active_cached as usize / bs as usize;
            let needed = (seq.len as usize).div_ceil(bs as usize) - reused_blocks;
            let mut available = self.num_gpu_blocks - self.pool.num_active();
            if hit.is_some() {
                available = available.saturating_sub(self.inflight_reserved_blocks());
            }
            if needed > available {
                break;
            }
            if let Some((base, end)) = hit {
                if !self.start_load(key, base, end, now) {
                    break;
                }
                continue;
            }
            let budget_before = b.tokens;
            let mut cursor = usize::MAX;
            match self.schedule(key, Some(cost), b, pass, &mut cursor) {
                Scheduled::Yes => {}
                Scheduled::Blocked | Scheduled::CurrentPreempted | Scheduled::Skipped => break,
            }
            if budget_before == b.tokens && b.tokens == 0 {
                break;
            }
        }
    }

    /// Blocks that running chunked prefills and loading requests will still claim: vLLM keeps
    /// them free when deciding whether another (non-preemptible) load may start.
    fn inflight_reserved_blocks(&self) -> usize {
        let bs = self.block_size as usize;
        let running: usize = self
            .running
            .iter()
            .map(|e| self.seq(e.key))
            .filter(|s| s.num_computed < s.prompt_len)
            .map(|s| (s.len as usize).div_ceil(bs).saturating_sub(s.blocks.len()))
            .sum();
        let loading: usize = self
            .offload
            .as_ref()
            .map(|o| {
                o.load_owner
                    .values()
                    .filter_map(|&(k, _)| self.seqs[k.0 as usize].as_ref())
                    .map(|s| (s.len as usize).div_ceil(bs).saturating_sub(s.blocks.len()))
                    .sum()
            })
            .unwrap_or(0);
        running + loading
    }

    /// Looks the request's prompt up in the host tier past its GPU prefix, then touches
    /// its prompt blocks in reverse order (vLLM's LRU touch).
    fn host_lookup(&mut self, key: SeqKey, cost: PrefillCost, now: u64) -> Lookup {
        let bs = self.block_size;
        let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
        let h = seq.host.as_ref().expect("offload state");
        match h.load {
            Load::Activated { .. } => return Lookup::Miss,
            Load::Loading { .. } => return Lookup::Deferred,
            Load::None => {}
        }
        let off = self.offload.as_ref().expect("offload configured");
        if h.latest_store.is_some_and(|id| off.tier.in_flight(id)) {
            return Lookup::Deferred;
        }
        let prompt_blocks = (seq.prompt_len / bs) as usize;
        let base = (cost.cached / bs) as usize;
        // The last prompt token is always computed: never load the block that holds it.
        let limit = ((seq.len - 1) / bs) as usize;
        let n = prompt_blocks.min(seq.hashes.len());
        let mut outcome = Lookup::Miss;
        let off = self.offload.as_mut().expect("offload configured");
        if let Some(g3) = off.g3.as_mut() {
            // G3 first: promotions of what only G3 holds make the request wait for them.
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let (uuid, h) = (seq.uuid, seq.host.as_mut().expect("offload state"));
            if base >= n {
                g3.release(uuid);
            } else if !h.restore.bypassed()
                && g3.stage(&mut off.tier, uuid, &mut h.restore, &seq.hashes[base..n], now)
            {
                outcome = Lookup::Deferred;
            }
        }
        let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
        let keys = &seq.hashes[..n];
        let off = self.offload.as_ref().expect("offload configured");
        if outcome != Lookup::Deferred && base < keys.len() {
            let (mut end, mut deferred) = (base, false);
            for &k in &keys[base..] {
                match off.tier.lookup(k) {
                    HostLookup::Miss => break,
                    HostLookup::Pending => deferred = true,
                    HostLookup::Hit => deferred |= off.loading.contains_key(&k),
                }
                end += 1;
            }
            let end = end.min(limit.max(base));
            outcome = if deferred {
                Lookup::Deferred
            } else if end > base {
                Lookup::Hit { base: base as u32, end: end as u32 }
            } else {
                Lookup::Miss
            };
        }
        let n = keys.len();
        for i in (0..n).rev() {
            let k = self.seq(key).hashes[i];
            self.off().tier.touch(k);
        }
        outcome
    }

    /// Reserves GPU blocks for host blocks `base..end` of `key` (keeping its GPU prefix)
    /// and queues their copy; the request sleeps until it lands. False when the pool cannot
    /// supply the blocks.
    fn start_load(&mut self, key: SeqKey, base: u32, end: u32, now: u64) -> bool {
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        debug_assert!(seq.blocks.is_empty());
        let hits = &seq.hashes[..base as usize];
        if !self.pool.allocate(&mut seq.blocks, end as usize, hits, &mut self.evicted) {
            return false;
        }
        let uuid = seq.uuid;
        let keys: Vec<u64> = seq.hashes[base as usize..end as usize].to_vec();
        let fresh: Vec<BlockId> = seq.blocks[base as usize..].to_vec();
        let off = self.offload.as_mut().expect("offload configured");
        let not_before = fresh.iter().map(|&id| off.source_busy_until[id as usize]).fold(now, u64::max);
        let (id, _) = off.tier.schedule_load(&keys, not_before).expect("looked-up blocks are resident");
        for &k in &keys {
            off.loading.insert(k, id);
        }
        off.load_owner.insert(id, (key, uuid));
        off.load_epoch += 1;
        if let Some(g3) = off.g3.as_mut() {
            g3.release(uuid);
        }
        self.host(key).load = Load::Loading { id, base, end };
        self.sleep(key);
        true
    }

    /// Write-through: each request scheduled in this pass offers the prompt blocks it has
    /// computed so far (from its cursor) as one store cohort.
    pub(super) fn offer_stores(&mut self) {
        let bs = self.block_size;
        let pass_id = self.pass_id;
        for i in 0..self.running.len() {
            let key = self.running[i].key;
            let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
            if seq.pass_id != pass_id {
                continue;
            }
            let h = seq.host.as_ref().expect("offload state");
            let end = (seq.num_computed.min(seq.prompt_len) / bs).min(seq.hashes.len() as u32);
            let start = h.next_store;
            if end <= start {
                continue;
            }
            let off = self.offload.as_mut().expect("offload configured");
            let (s, e) = (start as usize, end as usize);
            let missing: Vec<BlockId> = (s..e)
                .filter(|&i| off.tier.lookup(seq.hashes[i]) == HostLookup::Miss)
                .map(|i| seq.blocks[i])
                .collect();
            if missing.is_empty() {
                self.host(key).next_store = end;
                continue;
            }
            match off.tier.prepare_store(&seq.hashes[s..e]) {
                StoreOutcome::AlreadyPresent => self.host(key).next_store = end,
                StoreOutcome::Retry => {}
                StoreOutcome::Prepared(id) => {
                    off.store_sources.insert(id, missing);
                    for j in (0..seq.hashes.len().min(((seq.prompt_len) / bs) as usize)).rev() {
                        off.tier.touch(seq.hashes[j]);
                    }
                    let h = self.host(key);
                    h.latest_store = Some(id);
                    h.next_store = end;
                }
            }
        }
    }

    /// A preempted request's pending store must finish before its blocks are rewritten.
    pub(super) fn offload_preempted(&mut self, key: SeqKey) {
        self.host(key).restore.reset();
        let Some(id) = self.seq(key).host.as_ref().and_then(|h| h.latest_store) else { return };
        let off = self.off();
        if let Some(at) = off.tier.deadline(id) {
            off.compute_not_before = off.compute_not_before.max(at);
        }
    }

    /// Settles transfers due by `now`: loads land in their requests' reserved blocks, and
    /// any completion wakes the connector queue.
    pub(super) fn offload_tick(&mut self, now: u64, pass: &mut Pass) {
        let mut done = std::mem::take(&mut self.off().done);
        done.clear();
        self.off().tier.tick(now, &mut done);
        let off = self.off();
        off.load_epoch += done.len() as u64;
        let mut g3_progress = false;
        if let Some(g3) = off.g3.as_mut() {
            g3.store_completed(&mut off.tier, now);
            g3_progress = g3.advance(&mut off.tier, now);
        }
        for c in &done {
            if c.kind == TransferKind::Store {
                self.off().store_sources.remove(&c.id);
                continue;
            }
            let off = self.off();
            off.loading.retain(|_, id| *id != c.id);
            let Some((key, uuid)) = off.load_owner.remove(&c.id) else { continue };
            let live = self.seqs[key.0 as usize].as_ref().is_some_and(|s| s.uuid == uuid);
            if !live {
                continue;
            }
            let Load::Loading { base, end, .. } = self.host(key).load else { continue };
            // The copied blocks now hold their prompt blocks: register them.
            if self.prefix_caching {
                self.finalize_blocks(key, base * self.block_size, end * self.block_size, pass);
            }
            self.host(key).load = Load::Activated { end };
        }
        if !done.is_empty() || g3_progress {
            let keys: Vec<SeqKey> = self.off().connector.iter().copied().collect();
            for k in keys {
                if let Some(h) = self.seqs[k.0 as usize].as_mut().and_then(|s| s.host.as_mut()) {
                    h.asleep = false;
                }
            }
        }
        self.off().done = done;
    }

    /// Runs the boundary of the pass that ended, if it waited (see `pending_boundary`).
    pub(super) fn offload_complete_pass(&mut self, pass: &mut Pass) {
        if let Some(end) = self.offload.as_mut().and_then(|o| o.pending_boundary.take()) {
            self.offload_boundary(end, pass);
        }
    }

    /// The pass boundary at `end`: due completions, then the prepared stores start.
    pub(super) fn offload_boundary(&mut self, end: u64, pass: &mut Pass) {
        self.offload_tick(end, pass);
        let off = self.off();
        let (tier, sources, busy) = (&mut off.tier, &off.store_sources, &mut off.source_busy_until);
        tier.submit_prepared(end, |id, at| {
            for &b in sources.get(&id).map_or(&[][..], Vec::as_slice) {
                busy[b as usize] = busy[b as usize].max(at);
            }
        });
        self.offload_tick(end, pass);
    }

    /// On admission: the store cursor skips the reused prefix; the load is consumed.
    pub(super) fn offload_admitted(&mut self, key: SeqKey, cached: u32) {
        let bs = self.block_size;
        if let Some(h) = self.seq_mut(key).host.as_mut() {
            h.restore.reset();
            if let Load::Activated { .. } = h.load {
                h.next_store = cached / bs;
            }
            h.load = Load::None;
        }
    }
}
