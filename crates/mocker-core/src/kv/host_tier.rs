//! The host-memory KV tier of one rank (vLLM's native `OffloadingConnector`, as the
//! reference models it): block residency by sequence hash, LRU eviction of resident blocks
//! nobody is loading, and one FIFO transfer lane per direction with fixed completion times.
//!
//! Stores are write-through cohorts of a request's prompt blocks: their entries exist at once
//! (pending, not yet hits) and become resident when the copy completes. Loads pin their
//! source entries until they complete. Completion effects apply when the owning scheduler
//! ticks the tier past their deadline, in (deadline, stores before loads, id) order.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

/// Identity of one transfer (stores and loads share the counter).
pub type TransferId = u64;

/// What the tier knows about a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostLookup {
    /// Not in the tier.
    Miss,
    /// Being stored: present, but not yet loadable.
    Pending,
    /// Resident and loadable.
    Hit,
}

/// The result of offering a store cohort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Every block is already present (resident or pending).
    AlreadyPresent,
    /// Too few evictable blocks: nothing changed; the caller offers the cohort again later.
    Retry,
    /// The missing blocks are reserved; the copy starts at the next [`HostTier::submit_prepared`].
    Prepared(TransferId),
}

/// Whether a transfer copies to the host (store) or back (load). Stores sort first, so
/// same-time completions apply stores before loads, as the reference does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TransferKind {
    /// Device to host.
    Store,
    /// Host to device.
    Load,
}

/// A transfer that completed by the tick time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    /// Which transfer.
    pub id: TransferId,
    /// Its direction.
    pub kind: TransferKind,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// `Some(id)` while the store that brings it in is in flight.
    pending: Option<TransferId>,
    /// Loads reading it; a pinned block is outside the LRU.
    pins: u32,
    /// Its LRU epoch while in the LRU.
    touched: Option<u64>,
}

#[derive(Debug)]
struct Transfer {
    blocks: Vec<u64>,
}

/// One direction's lane: transfers run one after another at a fixed bandwidth.
#[derive(Debug, Clone, Copy)]
struct Lane {
    /// Nanoseconds per byte (0 = instantaneous).
    ns_per_byte: f64,
    tail_ns: u64,
}

impl Lane {
    fn new(gbps: f64) -> Self {
        // GB/s is bytes per nanosecond.
        Self { ns_per_byte: if gbps > 0.0 { 1.0 / gbps } else { 0.0 }, tail_ns: 0 }
    }

    fn submit(&mut self, ready_ns: u64, bytes: u64) -> u64 {
        let start = self.tail_ns.max(ready_ns);
        self.tail_ns = start + (bytes as f64 * self.ns_per_byte).round() as u64;
        self.tail_ns
    }
}

/// Capacity and transfer parameters of a [`HostTier`].
#[derive(Debug, Clone, Copy)]
pub struct HostTierOptions {
    /// Blocks the tier holds.
    pub capacity_blocks: usize,
    /// Bytes of one block.
    pub block_bytes: u64,
    /// Device-to-host GB/s (0 = instantaneous).
    pub d2h_gbps: f64,
    /// Host-to-device GB/s (0 = instantaneous).
    pub h2d_gbps: f64,
    /// Delay before each transfer moves its first byte, ns.
    pub first_byte_ns: u64,
}

/// The host tier of one rank.
#[derive(Debug)]
pub struct HostTier {
    opts: HostTierOptions,
    entries: FxHashMap<u64, Entry>,
    /// Resident, unpinned blocks, oldest epoch first (hash breaks ties).
    lru: BTreeSet<(u64, u64)>,
    clock: u64,
    transfers: FxHashMap<TransferId, Transfer>,
    deadlines: BTreeSet<(u64, TransferKind, TransferId)>,
    d2h: Lane,
    h2d: Lane,
    prepared: Vec<TransferId>,
    next_id: TransferId,
    /// With a G3 tier below: completed stores keep their blocks pinned until the G3
    /// write-through takes them (see [`HostTier::take_held`]).
    hold_completed: bool,
    /// Blocks of completed stores awaiting that hand-off, in completion order.
    held: Vec<Vec<u64>>,
    /// Pending entries reserved for G3 promotions, by reservation.
    external: FxHashMap<TransferId, u64>,
}

impl HostTier {
    /// An empty tier.
    pub fn new(opts: HostTierOptions) -> Self {
        Self {
            opts,
            entries: FxHashMap::default(),
            lru: BTreeSet::new(),
            clock: 0,
            transfers: FxHashMap::default(),
            deadlines: BTreeSet::new(),
            d2h: Lane::new(opts.d2h_gbps),
            h2d: Lane::new(opts.h2d_gbps),
            prepared: Vec::new(),
            next_id: 0,
            hold_completed: false,
            held: Vec::new(),
            external: FxHashMap::default(),
        }
    }

    /// Keeps completed stores pinned until [`Self::unpin`] (a G3 tier writes them through).
    pub fn hold_completed_sources(&mut self) {
        self.hold_completed = true;
    }

    /// The blocks of stores completed (and held) since the last call, one list per store.
    pub fn take_held(&mut self, out: &mut Vec<Vec<u64>>) {
        out.append(&mut self.held);
    }

    /// Releases one pin of each block; the newly unpinned resident ones enter the LRU as
    /// one cohort.
    pub fn unpin(&mut self, blocks: &[u64]) {
        let mut cohort = Vec::new();
        for &h in blocks {
            let e = self.entries.get_mut(&h).expect("a pinned block stays present");
            e.pins -= 1;
            if e.pins == 0 && e.pending.is_none() {
                cohort.push(h);
            }
        }
        cohort.sort_unstable();
        self.touch_cohort(&cohort);
    }

    /// Whether reserving the blocks of `prefix` not yet present would find room, evicting
    /// resident blocks outside it; changes nothing.
    pub fn can_reserve_prefix(&self, prefix: &[u64]) -> bool {
        let mut seen = rustc_hash::FxHashSet::default();
        let missing = prefix.iter().filter(|h| seen.insert(**h) && !self.entries.contains_key(h)).count();
        let needed = missing.saturating_sub(self.opts.capacity_blocks - self.entries.len());
        self.lru.iter().filter(|(_, h)| !seen.contains(h)).take(needed).count() == needed
    }

    /// Reserves a pending entry for `hash`, which a G3 read will fill (no host transfer);
    /// evicts the least recently used block when full. `None` when there is no room or the
    /// block is present.
    pub fn reserve_external(&mut self, hash: u64) -> Option<TransferId> {
        let StoreOutcome::Prepared(id) = self.prepare_store(&[hash]) else { return None };
        // Not a store: it never enters a lane.
        self.prepared.pop();
        self.transfers.remove(&id);
        self.external.insert(id, hash);
        Some(id)
    }

    /// The G3 read behind reservation `id` landed: its block is resident, and the most
    /// recently used.
    pub fn complete_external(&mut self, id: TransferId) {
        let h = self.external.remove(&id).expect("external reservation exists");
        let e = self.entries.get_mut(&h).expect("reserved block stays present");
        e.pending = None;
        if e.pins == 0 {
            self.touch(h);
        }
    }

    /// Rolls back reservation `id` (its G3 read was not submitted).
    pub fn cancel_external(&mut self, id: TransferId) {
        let h = self.external.remove(&id).expect("external reservation exists");
        self.entries.remove(&h);
    }

    /// Blocks present (resident or pending).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the tier holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the tier knows about `hash`.
    pub fn lookup(&self, hash: u64) -> HostLookup {
        match self.entries.get(&hash) {
            None => HostLookup::Miss,
            Some(e) if e.pending.is_some() => HostLookup::Pending,
            Some(_) => HostLookup::Hit,
        }
    }

    /// Whether transfer `id` is still in flight (or prepared).
    pub fn in_flight(&self, id: TransferId) -> bool {
        self.transfers.contains_key(&id)
    }

    /// Completion time of a submitted transfer still in flight.
    pub fn deadline(&self, id: TransferId) -> Option<u64> {
        self.deadlines.iter().find(|d| d.2 == id).map(|d| d.0)
    }

    /// The earliest completion still due.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first().map(|d| d.0)
    }

    /// Marks `hash` most recently used, if it is resident and unpinned (others are not in
    /// the LRU and ignore touches, as vLLM's policy does).
    pub fn touch(&mut self, hash: u64) {
        self.clock += 1;
        let epoch = self.clock;
        self.touch_at(hash, epoch);
    }

    fn touch_at(&mut self, hash: u64, epoch: u64) {
        let Some(e) = self.entries.get_mut(&hash) else { return };
        if e.pending.is_some() || e.pins > 0 {
            return;
        }
        if let Some(old) = e.touched.replace(epoch) {
            self.lru.remove(&(old, hash));
        }
        self.lru.insert((epoch, hash));
    }

    /// Makes `hashes` most recently used as one cohort (one epoch, hash order inside).
    fn touch_cohort(&mut self, hashes: &[u64]) {
        if hashes.is_empty() {
            return;
        }
        self.clock += 1;
        let epoch = self.clock;
        for &h in hashes {
            self.touch_at(h, epoch);
        }
    }

    /// Offers a store cohort: the blocks of `cohort` not yet present are reserved (evicting
    /// least recently used resident blocks outside the cohort when full), all or nothing.
    pub fn prepare_store(&mut self, cohort: &[u64]) -> StoreOutcome {
        let missing: Vec<u64> = {
            let mut seen = rustc_hash::FxHashSet::default();
            cohort.iter().copied().filter(|h| seen.insert(*h) && !self.entries.contains_key(h)).collect()
        };
        if missing.is_empty() {
            return StoreOutcome::AlreadyPresent;
        }
        let free = self.opts.capacity_blocks - self.entries.len();
        let needed = missing.len().saturating_sub(free);
        if needed > 0 {
            // Cohort members are pending or pinned-free residents; those resident ones must
            // not be evicted to make room for their own cohort.
            let victims: Vec<u64> =
                self.lru.iter().map(|&(_, h)| h).filter(|h| !cohort.contains(h)).take(needed).collect();
            if victims.len() < needed {
                return StoreOutcome::Retry;
            }
            for h in victims {
                let e = self.entries.remove(&h).expect("LRU block is present");
                self.lru.remove(&(e.touched.expect("LRU block has an epoch"), h));
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        for &h in &missing {
            self.entries.insert(h, Entry { pending: Some(id), pins: 0, touched: None });
        }
        self.transfers.insert(id, Transfer { blocks: missing });
        self.prepared.push(id);
        StoreOutcome::Prepared(id)
    }

    /// Starts the prepared stores at `now_ns` (a pass boundary), in order; calls `submitted`
    /// with each one's id and completion time.
    pub fn submit_prepared(&mut self, now_ns: u64, mut submitted: impl FnMut(TransferId, u64)) {
        let ready = now_ns + self.opts.first_byte_ns;
        for i in 0..self.prepared.len() {
            let id = self.prepared[i];
            let bytes = self.opts.block_bytes * self.transfers[&id].blocks.len() as u64;
            let at = self.d2h.submit(ready, bytes);
            self.deadlines.insert((at, TransferKind::Store, id));
            submitted(id, at);
        }
        self.prepared.clear();
    }

    /// Queues a load of resident `blocks` that may start no earlier than `not_before_ns`;
    /// pins them until it completes. Returns its id and completion time, or `None` when a
    /// block is not resident.
    pub fn schedule_load(&mut self, blocks: &[u64], not_before_ns: u64) -> Option<(TransferId, u64)> {
        if blocks.iter().any(|h| self.lookup(*h) != HostLookup::Hit) {
            return None;
        }
        for &h in blocks {
            let e = self.entries.get_mut(&h).expect("checked resident");
            if let Some(epoch) = e.touched.take() {
                self.lru.remove(&(epoch, h));
            }
            e.pins += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        let bytes = self.opts.block_bytes * blocks.len() as u64;
        let at = self.h2d.submit(not_before_ns + self.opts.first_byte_ns, bytes);
        self.transfers.insert(id, Transfer { blocks: blocks.to_vec() });
        self.deadlines.insert((at, TransferKind::Load, id));
        Some((id, at))
    }

    /// Applies every completion due by `now_ns`, appending them to `done` in completion
    /// order: stored blocks become resident (one LRU cohort per store), loaded blocks are
    /// unpinned (the newly unpinned ones one cohort per load).
    pub fn tick(&mut self, now_ns: u64, done: &mut Vec<Completed>) {
        while let Some(&(at, kind, id)) = self.deadlines.first() {
            if at > now_ns {
                break;
            }
            self.deadlines.pop_first();
            let t = self.transfers.remove(&id).expect("due transfer exists");
            let mut cohort = Vec::with_capacity(t.blocks.len());
            for &h in &t.blocks {
                let e = self.entries.get_mut(&h).expect("transfer blocks stay present");
                match kind {
                    TransferKind::Store => {
                        e.pending = None;
                        e.pins += u32::from(self.hold_completed);
                    }
                    TransferKind::Load => e.pins -= 1,
                }
                if e.pins == 0 && e.pending.is_none() {
                    cohort.push(h);
                }
            }
            cohort.sort_unstable();
            self.touch_cohort(&cohort);
            if kind == TransferKind::Store && self.hold_completed {
                self.held.push(t.blocks);
            }
            done.push(Completed { id, kind });
        }
    }

    /// Checks the tier's bookkeeping; for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.entries.len() > self.opts.capacity_blocks {
            return Err(format!("{} blocks over capacity {}", self.entries.len(), self.opts.capacity_blocks));
        }
        let in_lru = self.entries.values().filter(|e| e.touched.is_some()).count();
        if in_lru != self.lru.len() {
            return Err(format!("LRU holds {} blocks, entries say {in_lru}", self.lru.len()));
        }
        for (h, e) in &self.entries {
            let evictable = e.pending.is_none() && e.pins == 0;
            if evictable != e.touched.is_some() {
                return Err(format!("block {h:#x} evictable {evictable} but LRU membership differs"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(capacity: usize) -> HostTier {
        // 1000-byte blocks at 1 GB/s: 1000 ns per block.
        HostTier::new(HostTierOptions {
            capacity_blocks: capacity,
            block_bytes: 1000,
            d2h_gbps: 1.0,
            h2d_gbps: 1.0,
            first_byte_ns: 0,
        })
    }

    #[test]
    fn a_store_is_pending_until_its_lane_deadline() {
        let mut t = tier(4);
        assert_eq!(t.prepare_store(&[1, 2]), StoreOutcome::Prepared(0));
        assert_eq!(t.lookup(1), HostLookup::Pending);
        let mut at = Vec::new();
        t.submit_prepared(10, |id, d| at.push((id, d)));
        assert_eq!(at, [(0, 2010)]);
        // A second store queues behind the first on the same lane.
        t.prepare_store(&[3]);
        t.submit_prepared(500, |id, d| at.push((id, d)));
        assert_eq!(at[1], (1, 3010));
        let mut done = Vec::new();
        t.tick(2009, &mut done);
        assert!(done.is_empty());
        t.tick(3010, &mut done);
        assert_eq!(done.len(), 2);
        assert_eq!(t.lookup(1), HostLookup::Hit);
        t.check_invariants().unwrap();
    }

    #[test]
    fn full_tier_evicts_least_recent_unpinned_outside_the_cohort() {
        let mut t = tier(3);
        t.prepare_store(&[1, 2, 3]);
        t.submit_prepared(0, |_, _| {});
        t.tick(u64::MAX, &mut Vec::new());
        t.touch(1); // 2 and 3 are now older
        let (_, _) = t.schedule_load(&[2], 0).unwrap(); // pinned: not evictable
        assert_eq!(t.prepare_store(&[1, 3, 4]), StoreOutcome::Retry, "1 and 3 are in the cohort, 2 pinned");
        assert_eq!(t.prepare_store(&[4]), StoreOutcome::Prepared(2));
        assert_eq!(t.lookup(3), HostLookup::Miss);
        assert_eq!(t.lookup(1), HostLookup::Hit);
        assert_eq!(t.prepare_store(&[1, 4]), StoreOutcome::AlreadyPresent);
        t.check_invariants().unwrap();
    }
}
