//! A fixed pool of physical KV blocks: free, active (referenced) and inactive (cached,
//! evictable in least-recently-released order, or leaves first under the `lineage` policy).

use std::collections::VecDeque;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use super::prefetch;
use crate::config::EvictionPolicy;

/// Index of a physical block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// The index's hash of a block hash.
#[inline]
fn key(hash: u64) -> u64 {
    FxBuildHasher.hash_one(hash)
}

#[derive(Debug, Clone)]
struct Block {
    /// Sequence hash once the block is cached (`registered`), meaningless otherwise.
    hash: u64,
    refcount: u32,
    /// While `queued`, the position of its live entry in the LRU queue (see
    /// `BlockPool::lru`).
    lru_pos: u32,
    /// Inactive: it has a live entry in the LRU queue.
    queued: bool,
    registered: bool,
    /// First copy of its hash: the one the index points at.
    primary: bool,
    /// Registered but kept out of the index ([`Scope::Private`], not yet published).
    unindexed: bool,
    /// Its eviction is not announced (registered [`Scope::Private`] or [`Scope::Silent`]).
    silent: bool,
    /// Next copy of the same hash. Duplicates arise when concurrent requests compute the
    /// same block; only the first is visible to events, and the hash goes with the last.
    next_copy: u32,
    /// The index bucket holding this block while it is the indexed primary copy: eviction
    /// then removes the entry without a probe, whose slot read was the most frequent
    /// cache miss of a long replay. Rewritten for every entry when the index rehashes.
    bucket: u32,
}

// Two records to a cache line.
const _: () = assert!(std::mem::size_of::<Block>() == 32);

/// Blocks an eviction run (or a release) looks ahead, asking for their records.
const EVICT_LOOKAHEAD: usize = 16;

/// Lineage links of one block (kept only under [`EvictionPolicy::Lineage`]).
///
/// A cached block's parent is the block that preceded it in the registering request's block
/// list, provided that block was cached then; its children are the cached blocks registered
/// with it as parent, kept in an intrusive sibling list. Links always point at cached blocks:
/// they are cut when either end is evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lineage {
    parent: u32,
    first_child: u32,
    prev_sibling: u32,
    next_sibling: u32,
    /// Leaf-list links: inactive cached blocks without cached children, oldest first.
    leaf_prev: u32,
    leaf_next: u32,
}

impl Lineage {
    const NONE: Self = Self {
        parent: NIL,
        first_child: NIL,
        prev_sibling: NIL,
        next_sibling: NIL,
        leaf_prev: NIL,
        leaf_next: NIL,
    };
}

/// Who may look a registered block up, and whether its comings and goings are announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Indexed and announced: any request may hit it, and KV events report it.
    Shared,
    /// Indexed but never announced: a block only its own request will look up (again, after
    /// a preemption), so no KV event needs to report it.
    Silent,
    /// Neither indexed nor announced: only its own request could hit it, and that request
    /// holds it. It still takes its place in the LRU when released, so eviction order is
    /// that of a shared block; [`BlockPool::publish`] indexes it when the request lets go
    /// early (a preemption) and will look it up again.
    Private,
}

/// How much of a block-hash chain is resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Leading blocks resident (active or inactive).
    pub blocks: usize,
    /// Of those, blocks currently referenced by some request.
    pub active_blocks: usize,
}

/// The physical block pool of one rank.
#[derive(Debug, Clone)]
pub struct BlockPool {
    /// The blocks used so far; ids `blocks.len()..capacity` are free and not yet created.
    blocks: Vec<Block>,
    capacity: usize,
    free: Vec<BlockId>,
    /// Inactive blocks in release order, oldest first. Entry `k` is at position
    /// `lru_front_pos + k` (wrapping: fewer entries than positions, so positions in the
    /// queue are distinct); it is live while its block is queued at that position, and
    /// stale once the block was hit (or released again later), to be skipped. A queue
    /// rather than a linked list: eviction takes victims from the front in order, so their
    /// ids are known ahead and their records' cache misses overlap, where following links
    /// was one miss after another.
    lru: VecDeque<BlockId>,
    /// Position of the queue's front entry. Every inactive block has one live entry, so
    /// `lru.len() - num_inactive` entries are stale.
    lru_front_pos: u32,
    num_inactive: usize,
    /// The primary copy of each resident hash, keyed by that block's `hash`: an entry is
    /// its 4-byte id, not a 16-byte (hash, id) pair, so the table of a full 16k-block pool
    /// is a quarter of the size and its probes miss the cache less. Keys are already
    /// well-mixed hashes, so a one-multiply hasher is enough. Evicted hashes are removed at
    /// once: leaving them behind saved that probe but doubled the table.
    index: HashTable<BlockId>,
    policy: EvictionPolicy,
    /// Per-block lineage links under `lineage`; empty under `lru`, whose paths never touch it.
    lineage: Vec<Lineage>,
    leaf_head: u32,
    leaf_tail: u32,
    /// The blocks of the hits `allocate` checked, so pinning them needs no second probe.
    hit_ids: Vec<BlockId>,
    /// Further hashes some cached blocks are found by (a page published under a partial
    /// prefix and later completed: the reference's token aliases), and each such block's
    /// list, to drop them with it. Empty, and never consulted, unless a state cache in
    /// align mode publishes partial pages.
    aliases: rustc_hash::FxHashMap<u64, BlockId>,
    alias_of: rustc_hash::FxHashMap<BlockId, Vec<u64>>,
}

impl BlockPool {
    /// A pool of `capacity` free blocks with LRU eviction.
    pub fn new(capacity: usize) -> Self {
        Self::with_policy(capacity, EvictionPolicy::Lru)
    }

    /// A pool of `capacity` free blocks evicting by `policy`.
    ///
    /// Under [`EvictionPolicy::Lineage`] only leaves (inactive blocks without cached children)
    /// are evicted while any exist, least recently become-a-leaf first, so a request's chain is
    /// eaten from its tail and an evicted child can turn its parent into a leaf (at the tail).
    ///
    /// Why the capacity check of [`allocate`](Self::allocate) stays "inactive blocks minus
    /// inactive prefix hits" under lineage: parent links point strictly at earlier registered,
    /// still cached blocks, so they form a forest, and repeatedly evicting leaves empties any
    /// subtree that holds no referenced block. A request owns its blocks as a prefix, so a
    /// block it computed has its parent owned too: an active block's *recorded* parent is
    /// active whenever the block is held by a request that registered it. That is not always
    /// so, though: duplicates (two requests computing the same blocks concurrently) let a later
    /// request hit copy `k` of one request and copy `k + 1` of the other, holding a block whose
    /// recorded parent is an inactive copy it does not own; that parent then has an active
    /// descendant and can never become a leaf. (Hits that do not start at a request's first
    /// block, which the pool API allows, do the same.) When no leaf is left, eviction
    /// therefore falls back to the least-recently-released inactive block and orphans its
    /// children, so every inactive block that is not pinned as a hit remains evictable and the
    /// count is exact. `check_invariants` verifies this by draining a copy of the pool.
    pub fn with_policy(capacity: usize, policy: EvictionPolicy) -> Self {
        assert!(capacity < NIL as usize, "block pool too large");
        Self {
            // Blocks come into being on first use (see `allocate`): a run that touches a
            // tenth of a 16k-block pool then pays no page faults for the rest, which was a
            // third of the wall time of a 100-request replay. Reserving is not touching:
            // the reservation only saves the copies of growing.
            blocks: Vec::with_capacity(capacity.min(1 << 21)),
            capacity,
            free: Vec::new(),
            lru: VecDeque::new(),
            lru_front_pos: 0,
            num_inactive: 0,
            // At most one entry per block, but not sized for all of them up front: a table
            // for 16k blocks is half a megabyte, and inserts scattered over it touch (and
            // page-fault) all of it while a short run fills a fraction; the few rehashes of
            // growing from a small table cost less.
            index: HashTable::with_capacity(capacity.min(1024)),
            policy,
            lineage: Vec::new(),
            leaf_head: NIL,
            leaf_tail: NIL,
            hit_ids: Vec::new(),
            aliases: Default::default(),
            alias_of: Default::default(),
        }
    }

    /// The eviction policy.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Total physical blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks referenced by at least one request.
    pub fn num_active(&self) -> usize {
        self.blocks.len() - self.free.len() - self.num_inactive
    }

    /// Cached blocks nobody references (reusable prefixes, evictable).
    pub fn num_inactive(&self) -> usize {
        self.num_inactive
    }

    /// Anonymous free blocks.
    pub fn num_free(&self) -> usize {
        self.free.len() + (self.capacity - self.blocks.len())
    }

    /// Distinct cached hashes (active or inactive).
    pub fn num_cached_hashes(&self) -> usize {
        self.index.len()
    }

    /// Whether `hash` is resident in the cache.
    pub fn contains(&self, hash: u64) -> bool {
        self.lookup(hash).is_some()
    }

    /// The block `hash` is found at: its primary copy, else a block it is an alias of.
    #[inline]
    fn lookup(&self, hash: u64) -> Option<BlockId> {
        match self.resident(hash) {
            Some(id) => Some(id),
            None if self.aliases.is_empty() => None,
            None => self.aliases.get(&hash).copied(),
        }
    }

    /// Makes block `id` findable by `hash` too: an unregistered block is registered under
    /// it (silently, as a state cache's pages are), a block registered under another hash
    /// gets it as an alias (dropped when the block goes), unless `hash` is already found.
    pub fn register_or_alias(&mut self, id: BlockId, hash: u64) {
        let b = &self.blocks[id as usize];
        if !b.registered {
            self.register_in(id, hash, None, Scope::Silent);
        } else if b.hash != hash && self.lookup(hash).is_none() {
            self.aliases.insert(hash, id);
            self.alias_of.entry(id).or_default().push(hash);
        }
    }

    /// The primary copy of `hash`, if it is resident.
    #[inline]
    fn resident(&self, hash: u64) -> Option<BlockId> {
        let blocks = &self.blocks;
        let id = *self.index.find(key(hash), |&i| blocks[i as usize].hash == hash)?;
        debug_assert!({
            let b = &self.blocks[id as usize];
            b.registered && b.primary && b.hash == hash
        });
        Some(id)
    }

    /// Walks `hashes` from the root while each block is resident.
    pub fn match_prefix(&self, hashes: &[u64]) -> PrefixMatch {
        self.match_prefix_into(hashes, &mut Vec::new())
    }

    /// [`match_prefix`](Self::match_prefix), also leaving the matched blocks in `ids`, for
    /// an [`allocate_matched`](Self::allocate_matched) that follows.
    pub fn match_prefix_into(&self, hashes: &[u64], ids: &mut Vec<BlockId>) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        ids.clear();
        if self.index.is_empty() {
            return m;
        }
        for &h in hashes {
            let Some(id) = self.lookup(h) else { break };
            ids.push(id);
            m.blocks += 1;
            if self.blocks[id as usize].refcount > 0 {
                m.active_blocks += 1;
            }
        }
        m
    }

    /// Grows `owned` to `target` blocks. The first new blocks, up to `hits.len()`, reuse the
    /// cached blocks of `hits` (indexed like `owned`); the rest are fresh, taken from free
    /// capacity first and then by evicting cached blocks in policy order, whose
    /// hashes are appended to `evicted` when their last copy goes. Returns false and changes
    /// nothing if the pool cannot supply them.
    pub fn allocate(
        &mut self,
        owned: &mut Vec<BlockId>,
        target: usize,
        hits: &[u64],
        evicted: &mut Vec<u64>,
    ) -> bool {
        self.allocate_matched(owned, target, hits, &[], evicted)
    }

    /// [`allocate`](Self::allocate) where `matched` holds the blocks a
    /// [`match_prefix_into`](Self::match_prefix_into) of the same hashes found (indexed
    /// like them): each is checked to still be its hash's resident block instead of
    /// looked up again.
    pub fn allocate_matched(
        &mut self,
        owned: &mut Vec<BlockId>,
        target: usize,
        hits: &[u64],
        matched: &[BlockId],
        evicted: &mut Vec<u64>,
    ) -> bool {
        let prev = owned.len();
        if target <= prev {
            return true;
        }
        let hits = hits.get(prev..hits.len().min(target)).unwrap_or(&[]);
        let hit_end = prev + hits.len();
        let mut inactive_hits = 0;
        self.hit_ids.clear();
        for (i, &h) in hits.iter().enumerate() {
            let known = matched.get(prev + i).copied().filter(|&id| {
                let b = &self.blocks[id as usize];
                b.registered && b.primary && b.hash == h
            });
            let Some(id) = known.or_else(|| self.resident(h)) else { return false };
            inactive_hits += usize::from(self.blocks[id as usize].refcount == 0);
            self.hit_ids.push(id);
        }
        let fresh = target - hit_end;
        let shortfall = fresh.saturating_sub(self.num_free());
        if shortfall > self.num_inactive - inactive_hits {
            return false;
        }
        owned.reserve(target - prev);
        for i in 0..self.hit_ids.len() {
            let id = self.hit_ids[i];
            self.pin(id);
            owned.push(id);
        }
        self.take_fresh(fresh, owned, evicted);
        true
    }

    /// References block `id` once more; an inactive one leaves the eviction order.
    #[inline]
    fn pin(&mut self, id: BlockId) {
        if self.blocks[id as usize].refcount == 0 {
            self.lru_unlink(id);
            if self.policy == EvictionPolicy::Lineage && self.lineage[id as usize].first_child == NIL {
                self.leaf_unlink(id);
            }
        }
        self.blocks[id as usize].refcount += 1;
    }

    /// Appends `n` newly referenced blocks to `out`, evicting in policy order; the caller
    /// checked that the pool can supply them.
    #[inline]
    fn take_fresh(&mut self, n: usize, out: &mut Vec<BlockId>, evicted: &mut Vec<u64>) {
        out.reserve(n);
        let mut left = n;
        // Freed blocks first, then never-used ones in id order (the same ids a pool created
        // whole with a free list of every block would hand out), then evictions.
        while left > 0 {
            let id = match self.free.pop() {
                Some(id) => id,
                None if self.blocks.len() < self.capacity => self.new_block(),
                None => break,
            };
            self.blocks[id as usize].refcount = 1;
            out.push(id);
            left -= 1;
        }
        if left == 0 {
            return;
        }
        if self.policy == EvictionPolicy::Lru {
            self.evict_lru_run(left, out, evicted);
        } else {
            for _ in 0..left {
                let id = self.evict(evicted);
                self.blocks[id as usize].refcount = 1;
                out.push(id);
            }
        }
    }

    /// Evicts the `n` least-recently-released blocks (there must be as many) into `out`,
    /// referenced once: the same victims, in the same order, as `n` single evictions
    /// (forgetting one does not reorder the rest). The queue names the next victims, so
    /// their records are asked for ahead of the one being evicted.
    #[inline(always)]
    fn evict_lru_run(&mut self, n: usize, out: &mut Vec<BlockId>, evicted: &mut Vec<u64>) {
        debug_assert!(n <= self.num_inactive, "eviction past the LRU");
        for &id in self.lru.iter().take(EVICT_LOOKAHEAD) {
            prefetch(&self.blocks[id as usize]);
        }
        for _ in 0..n {
            let id = loop {
                // Entries reach the front `EVICT_LOOKAHEAD` pops after they are asked for.
                if let Some(&far) = self.lru.get(EVICT_LOOKAHEAD) {
                    prefetch(&self.blocks[far as usize]);
                }
                let (id, live) = self.lru_pop_front();
                if live {
                    break id;
                }
            };
            self.blocks[id as usize].queued = false;
            self.num_inactive -= 1;
            self.forget(id, evicted);
            self.blocks[id as usize].refcount = 1;
            out.push(id);
        }
    }

    /// Registers a freshly computed full block under `hash`. `parent` is the block before it
    /// in the registering request's block list (`None` for the first block); it is recorded
    /// only under the lineage policy and only if that block is cached. Returns true when it
    /// is the first copy of that hash (so it should be announced as Stored).
    pub fn register(&mut self, id: BlockId, hash: u64, parent: Option<BlockId>) -> bool {
        self.register_in(id, hash, parent, Scope::Shared)
    }

    /// [`register`](Self::register) with a [`Scope`]: only a [`Scope::Shared`] block is
    /// ever reported (by the return value here, or in `evicted` when it goes); a
    /// [`Scope::Private`] one costs no index probe.
    #[inline]
    pub fn register_in(&mut self, id: BlockId, hash: u64, parent: Option<BlockId>, scope: Scope) -> bool {
        let b = &mut self.blocks[id as usize];
        if b.registered {
            return false;
        }
        b.registered = true;
        b.hash = hash;
        b.silent = scope != Scope::Shared;
        b.unindexed = scope == Scope::Private;
        if self.policy == EvictionPolicy::Lineage {
            if let Some(p) = parent {
                self.link_child(p, id);
            }
        }
        if scope == Scope::Private {
            return false;
        }
        self.index_block(id, hash) && scope == Scope::Shared
    }

    /// Indexes a [`Scope::Private`] block (it becomes [`Scope::Silent`]); does nothing to
    /// any other block.
    pub fn publish(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        if b.registered && b.unindexed {
            b.unindexed = false;
            let hash = b.hash;
            self.index_block(id, hash);
        }
    }

    /// Enters registered block `id` into the index; returns whether it is the first copy.
    #[inline(always)]
    fn index_block(&mut self, id: BlockId, hash: u64) -> bool {
        // One probe: an existing entry is the live primary, so this block is a duplicate.
        // A full table grows first (moving every entry, whose buckets are then rewritten),
        // so the probe below never rehashes.
        if self.index.len() == self.index.capacity() {
            self.grow_index();
        }
        debug_assert!(self.index.len() < self.index.capacity(), "the probe must not rehash");
        let blocks = &self.blocks;
        let entry = self.index.entry(
            key(hash),
            |&i| blocks[i as usize].hash == hash,
            |&i| key(blocks[i as usize].hash),
        );
        let first = match entry {
            hashbrown::hash_table::Entry::Occupied(e) => {
                // Copies queue in registration order (the reference's duplicate queue):
                // when the primary goes, the oldest duplicate takes its place, and which
                // copy a later request hits (and so pins) depends on that order.
                let mut last = *e.get() as usize;
                while self.blocks[last].next_copy != NIL {
                    last = self.blocks[last].next_copy as usize;
                }
                self.blocks[id as usize].next_copy = NIL;
                self.blocks[last].next_copy = id;
                false
            }
            hashbrown::hash_table::Entry::Vacant(e) => {
                let bucket = e.insert(id).bucket_index() as u32;
                let b = &mut self.blocks[id as usize];
                b.primary = true;
                b.bucket = bucket;
                true
            }
        };
        first
    }

    /// Makes room in the full index for up to sixteen times its entries (at most one per
    /// block of the pool). Each rehash reads every indexed block's record, scattered over
    /// the pool, and rewrites its bucket: growing by doubling did that four times over in
    /// a 16k-block pool (3% of a long replay's time); growing in one or two steps does it
    /// once or twice, while a short run's table stays small.
    #[cold]
    #[inline(never)]
    fn grow_index(&mut self) {
        let len = self.index.len();
        let target = self.capacity.min(len.saturating_mul(16)).max(len + 1);
        let blocks = &self.blocks;
        self.index.reserve(target - len, |&i| key(blocks[i as usize].hash));
        self.refresh_buckets();
    }

    /// Records every indexed primary's bucket again (after a rehash moved them).
    #[cold]
    fn refresh_buckets(&mut self) {
        for bucket in self.index.iter_buckets() {
            let id = *self.index.get_bucket(bucket).expect("a full bucket");
            self.blocks[id as usize].bucket = bucket as u32;
        }
    }

    /// Materializes the next never-used block.
    #[cold]
    fn new_block(&mut self) -> BlockId {
        self.blocks.push(Block {
            hash: 0,
            lru_pos: 0,
            queued: false,
            refcount: 0,
            registered: false,
            primary: false,
            unindexed: false,
            silent: false,
            next_copy: NIL,
            bucket: NIL,
        });
        if self.policy == EvictionPolicy::Lineage {
            self.lineage.push(Lineage::NONE);
        }
        (self.blocks.len() - 1) as BlockId
    }

    /// Drops one reference to each of `owned`, tail first, so that a request's leaf blocks
    /// are evicted before its root. Cached blocks that reach zero join the LRU tail (and,
    /// under lineage, the leaf-list tail when they have no cached children).
    pub fn release(&mut self, owned: &mut Vec<BlockId>) {
        // The records are asked for `EVICT_LOOKAHEAD` blocks ahead, so their misses overlap.
        for &id in owned.iter().rev().take(EVICT_LOOKAHEAD) {
            prefetch(&self.blocks[id as usize]);
        }
        while let Some(id) = owned.pop() {
            if let Some(ahead) = owned.len().checked_sub(EVICT_LOOKAHEAD) {
                prefetch(&self.blocks[owned[ahead] as usize]);
            }
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.refcount > 0);
            b.refcount -= 1;
            if b.refcount == 0 {
                if b.registered {
                    self.lru_push_tail(id);
                    if self.policy == EvictionPolicy::Lineage && self.lineage[id as usize].first_child == NIL
                    {
                        self.leaf_push_tail(id);
                    }
                } else {
                    self.free.push(id);
                }
            }
        }
    }

    /// Drops one reference to block `id` (as [`release`](Self::release) does for a list).
    pub fn release_one(&mut self, id: BlockId) {
        let mut one = vec![id];
        self.release(&mut one);
    }

    /// Whether `hash` is resident and, if so, whether its indexed copy is referenced.
    pub fn hit(&self, hash: u64) -> Option<bool> {
        self.lookup(hash).map(|id| self.blocks[id as usize].refcount > 0)
    }

    /// Whether block `id` is referenced by some request.
    pub fn is_active(&self, id: BlockId) -> bool {
        self.blocks[id as usize].refcount > 0
    }

    /// Whether block `id` is registered (cached under a hash), and under which.
    pub fn registration(&self, id: BlockId) -> Option<u64> {
        let b = &self.blocks[id as usize];
        b.registered.then_some(b.hash)
    }

    /// Pins the resident blocks of `hits` (appended to `hit_ids`, in order) and takes
    /// `fresh` new blocks (appended to `fresh_ids`), evicting in policy order, in one
    /// atomic step: when the pool cannot supply them it returns false and changes
    /// nothing. Unlike [`allocate`](Self::allocate) the hits need not be a prefix chain
    /// (a state checkpoint's slots are not), so several kinds of blocks can be taken for
    /// one request at once, as the reference reserves them.
    pub fn allocate_keys(
        &mut self,
        hits: &[u64],
        hit_ids: &mut Vec<BlockId>,
        fresh: usize,
        fresh_ids: &mut Vec<BlockId>,
        evicted: &mut Vec<u64>,
    ) -> bool {
        let start = hit_ids.len();
        let mut inactive_hits = 0;
        for &h in hits {
            let Some(id) = self.lookup(h) else {
                hit_ids.truncate(start);
                return false;
            };
            inactive_hits += usize::from(self.blocks[id as usize].refcount == 0);
            hit_ids.push(id);
        }
        let shortfall = fresh.saturating_sub(self.num_free());
        if shortfall > self.num_inactive - inactive_hits {
            hit_ids.truncate(start);
            return false;
        }
        for &id in &hit_ids[start..] {
            self.pin(id);
        }
        self.take_fresh(fresh, fresh_ids, evicted);
        true
    }

    /// Takes the registration away from a block only its one owner references (a state
    /// about to be overwritten): it stays owned, and other copies of its hash stay
    /// cached. Nothing happens to an unregistered block.
    pub fn unregister(&mut self, id: BlockId) {
        let b = &self.blocks[id as usize];
        if !b.registered {
            return;
        }
        debug_assert_eq!(b.refcount, 1, "only an exclusively owned block is rewritten");
        if self.policy == EvictionPolicy::Lineage {
            self.cut_lineage(id);
        }
        let mut sink = Vec::new();
        self.forget(id, &mut sink);
    }

    /// Frees block `id` if it is still an unreferenced cached copy of `hash` (an obsolete
    /// state checkpoint); returns whether it did. A block evicted and reused since is left
    /// alone unless it holds `hash` again, unreferenced.
    pub fn discard_inactive(&mut self, id: BlockId, hash: u64) -> bool {
        let b = &self.blocks[id as usize];
        if !(b.registered && b.refcount == 0 && b.hash == hash) {
            return false;
        }
        self.lru_unlink(id);
        if self.policy == EvictionPolicy::Lineage {
            if self.lineage[id as usize].first_child == NIL {
                self.leaf_unlink(id);
            }
            self.cut_lineage(id);
        }
        let mut sink = Vec::new();
        self.forget(id, &mut sink);
        self.free.push(id);
        true
    }

    /// Removes `id` from the lineage links (its children are orphaned), as its eviction does.
    fn cut_lineage(&mut self, id: BlockId) {
        let node = self.lineage[id as usize];
        let mut c = node.first_child;
        while c != NIL {
            let child = &mut self.lineage[c as usize];
            let next = child.next_sibling;
            (child.parent, child.prev_sibling, child.next_sibling) = (NIL, NIL, NIL);
            c = next;
        }
        let p = node.parent;
        if p != NIL {
            if node.prev_sibling == NIL {
                self.lineage[p as usize].first_child = node.next_sibling;
            } else {
                self.lineage[node.prev_sibling as usize].next_sibling = node.next_sibling;
            }
            if node.next_sibling != NIL {
                self.lineage[node.next_sibling as usize].prev_sibling = node.prev_sibling;
            }
            if self.lineage[p as usize].first_child == NIL && self.blocks[p as usize].refcount == 0 {
                self.leaf_push_tail(p);
            }
        }
        self.lineage[id as usize] = Lineage::NONE;
    }

    /// Forgets every inactive cached block (cache reset); their hashes go to `evicted`.
    pub fn clear_inactive(&mut self, evicted: &mut Vec<u64>) {
        while self.num_inactive > 0 {
            let id = self.evict(evicted);
            self.free.push(id);
        }
    }

    /// Evicts one inactive block chosen by the policy; there must be one.
    #[inline]
    fn evict(&mut self, evicted: &mut Vec<u64>) -> BlockId {
        match self.policy {
            EvictionPolicy::Lru => self.evict_lru(evicted),
            EvictionPolicy::Lineage => self.evict_lineage(evicted),
        }
    }

    #[inline(always)]
    fn evict_lru(&mut self, evicted: &mut Vec<u64>) -> BlockId {
        let id = self.lru_front();
        self.lru_unlink(id);
        self.forget(id, evicted);
        id
    }

    /// The oldest leaf, or, when every inactive block still has cached children (see
    /// `with_policy`), the least-recently-released inactive block, whose children are orphaned.
    fn evict_lineage(&mut self, evicted: &mut Vec<u64>) -> BlockId {
        let id = if self.leaf_head != NIL { self.leaf_head } else { self.lru_front() };
        self.lru_unlink(id);
        if self.lineage[id as usize].first_child == NIL {
            self.leaf_unlink(id);
        }
        // Orphans its children; a parent whose last cached child went becomes a leaf if
        // nobody references it.
        self.cut_lineage(id);
        self.forget(id, evicted);
        id
    }

    /// Records `id` (being registered) as a child of `parent` if that block is cached.
    fn link_child(&mut self, parent: BlockId, id: BlockId) {
        let p = &self.blocks[parent as usize];
        if parent == id || !p.registered {
            return;
        }
        let first = self.lineage[parent as usize].first_child;
        if first == NIL && p.refcount == 0 {
            self.leaf_unlink(parent);
        }
        if first != NIL {
            self.lineage[first as usize].prev_sibling = id;
        }
        let node = &mut self.lineage[id as usize];
        (node.parent, node.prev_sibling, node.next_sibling) = (parent, NIL, first);
        self.lineage[parent as usize].first_child = id;
    }

    /// Drops the registration of `id`, already unlinked from every list.
    #[inline(always)]
    fn forget(&mut self, id: BlockId, evicted: &mut Vec<u64>) {
        if !self.alias_of.is_empty() {
            self.drop_aliases(id);
        }
        let b = &mut self.blocks[id as usize];
        b.registered = false;
        let silent = std::mem::replace(&mut b.silent, false);
        if std::mem::replace(&mut b.unindexed, false) {
            return; // never indexed, never announced, and alone with its hash
        }
        let hash = b.hash;
        let next_copy = std::mem::replace(&mut b.next_copy, NIL);
        let was_primary = std::mem::replace(&mut b.primary, false);
        if !was_primary {
            // A duplicate: unlink it from its primary's copy list (rare, short).
            let mut cur = self.resident(hash).expect("duplicate without a primary");
            while self.blocks[cur as usize].next_copy != id {
                cur = self.blocks[cur as usize].next_copy;
            }
            self.blocks[cur as usize].next_copy = next_copy;
        } else {
            let bucket = self.blocks[id as usize].bucket;
            let Ok(entry) = self.index.get_bucket_entry(bucket as usize) else {
                unreachable!("a primary copy is indexed")
            };
            debug_assert_eq!(*entry.get(), id, "a primary's bucket holds it");
            if next_copy != NIL {
                let next = &mut self.blocks[next_copy as usize];
                next.primary = true;
                next.bucket = bucket;
                *entry.into_mut() = next_copy;
            } else {
                if !silent {
                    evicted.push(hash);
                }
                entry.remove();
            }
        }
    }

    #[cold]
    fn drop_aliases(&mut self, id: BlockId) {
        for hash in self.alias_of.remove(&id).unwrap_or_default() {
            self.aliases.remove(&hash);
        }
    }

    fn lru_push_tail(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.lru_pos = self.lru_front_pos.wrapping_add(self.lru.len() as u32);
        b.queued = true;
        self.lru.push_back(id);
        self.num_inactive += 1;
    }

    /// Whether the entry of `id` at position `pos` is its live one.
    #[inline]
    fn lru_live(&self, id: BlockId, pos: u32) -> bool {
        let b = &self.blocks[id as usize];
        b.queued && b.lru_pos == pos
    }

    /// Takes the front entry (there must be one): its block and whether it was live.
    #[inline]
    fn lru_pop_front(&mut self) -> (BlockId, bool) {
        let id = self.lru.pop_front().expect("an inactive block per eviction");
        let pos = self.lru_front_pos;
        self.lru_front_pos = pos.wrapping_add(1);
        (id, self.lru_live(id, pos))
    }

    /// The least-recently-released inactive block (there must be one), its stale
    /// predecessors dropped from the queue.
    fn lru_front(&mut self) -> BlockId {
        loop {
            let &id = self.lru.front().expect("eviction with an empty LRU");
            if self.lru_live(id, self.lru_front_pos) {
                return id;
            }
            self.lru_pop_front();
        }
    }

    fn leaf_push_tail(&mut self, id: BlockId) {
        let tail = self.leaf_tail;
        let node = &mut self.lineage[id as usize];
        (node.leaf_prev, node.leaf_next) = (tail, NIL);
        if tail == NIL {
            self.leaf_head = id;
        } else {
            self.lineage[tail as usize].leaf_next = id;
        }
        self.leaf_tail = id;
    }

    fn leaf_unlink(&mut self, id: BlockId) {
        let Lineage { leaf_prev: prev, leaf_next: next, .. } = self.lineage[id as usize];
        if prev == NIL {
            self.leaf_head = next;
        } else {
            self.lineage[prev as usize].leaf_next = next;
        }
        if next == NIL {
            self.leaf_tail = prev;
        } else {
            self.lineage[next as usize].leaf_prev = prev;
        }
        let node = &mut self.lineage[id as usize];
        (node.leaf_prev, node.leaf_next) = (NIL, NIL);
    }

    /// Takes inactive block `id` out of the eviction order: its queue entry goes stale.
    /// Stale entries are dropped as eviction reaches them, or all at once when they
    /// outnumber the live ones (a pool whose hits keep pinning cached blocks).
    fn lru_unlink(&mut self, id: BlockId) {
        self.blocks[id as usize].queued = false;
        self.num_inactive -= 1;
        let stale = self.lru.len() - self.num_inactive;
        if stale > 1024 && stale > self.num_inactive {
            self.compact_lru();
        }
    }

    /// Drops the stale entries; the live ones close up, their blocks' positions following.
    #[cold]
    fn compact_lru(&mut self) {
        let front = self.lru_front_pos;
        let mut kept = 0;
        for k in 0..self.lru.len() {
            let id = self.lru[k];
            if self.lru_live(id, front.wrapping_add(k as u32)) {
                self.lru[kept] = id;
                self.blocks[id as usize].lru_pos = front.wrapping_add(kept as u32);
                kept += 1;
            }
        }
        self.lru.truncate(kept);
    }

    /// Checks the pool's bookkeeping; for tests and debug assertions.
    ///
    /// Under lineage this also checks the parent/child links and the leaf list, and that
    /// evicting from a copy of the pool reaches every inactive block, leaves first (the
    /// argument of `with_policy`), leaving consistent bookkeeping behind.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_bookkeeping()?;
        if self.policy == EvictionPolicy::Lineage {
            let mut drain = self.clone();
            let mut sink = Vec::new();
            for _ in 0..self.num_inactive {
                // With the leaf list exact, an empty one means every inactive block has a
                // cached child, so (the links being a finite forest) a referenced descendant:
                // only then may a block with children go.
                let id = if drain.leaf_head != NIL { drain.leaf_head } else { drain.lru_front() };
                let is_leaf = drain.lineage[id as usize].first_child == NIL;
                if is_leaf != (drain.leaf_head != NIL) || drain.evict(&mut sink) != id {
                    return Err(format!("draining evicted around block {id} out of leaf order"));
                }
                drain.free.push(id);
            }
            if drain.num_inactive != 0 || drain.leaf_head != NIL {
                return Err(format!("draining left {} inactive blocks", drain.num_inactive));
            }
            drain.check_bookkeeping()?;
        }
        Ok(())
    }

    fn check_bookkeeping(&self) -> Result<(), String> {
        let mut in_lru = vec![false; self.blocks.len()];
        let mut n = 0;
        for (k, &cur) in self.lru.iter().enumerate() {
            let b = &self.blocks[cur as usize];
            if !self.lru_live(cur, self.lru_front_pos.wrapping_add(k as u32)) {
                continue;
            }
            if b.refcount != 0 || !b.registered || in_lru[cur as usize] {
                return Err(format!(
                    "block {cur} in LRU with refcount {} registered {} (twice: {})",
                    b.refcount, b.registered, in_lru[cur as usize]
                ));
            }
            in_lru[cur as usize] = true;
            n += 1;
        }
        if let Some((i, _)) = self.blocks.iter().enumerate().find(|&(i, b)| b.queued && !in_lru[i]) {
            return Err(format!("block {i} is queued but has no live entry"));
        }
        if n != self.num_inactive {
            return Err(format!("LRU length {n} != num_inactive {}", self.num_inactive));
        }
        let mut is_free = vec![false; self.blocks.len()];
        for &f in &self.free {
            if is_free[f as usize] || in_lru[f as usize] {
                return Err(format!("block {f} free twice or both free and cached"));
            }
            let b = &self.blocks[f as usize];
            if b.refcount != 0 || b.registered {
                return Err(format!(
                    "free block {f} has refcount {} registered {}",
                    b.refcount, b.registered
                ));
            }
            is_free[f as usize] = true;
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.refcount == 0 && !is_free[i] && !in_lru[i] {
                return Err(format!("block {i} leaked: unreferenced, neither free nor cached"));
            }
        }
        let mut copies = 0;
        for bucket in self.index.iter_buckets() {
            let primary = *self.index.get_bucket(bucket).expect("a full bucket");
            let p = &self.blocks[primary as usize];
            let hash = p.hash;
            if p.bucket as usize != bucket {
                return Err(format!("block {primary} records bucket {} but sits in {bucket}", p.bucket));
            }
            if self.resident(hash) != Some(primary) {
                return Err(format!("block {primary} is indexed under another hash"));
            }
            if !(p.registered && p.primary && p.hash == hash) {
                return Err(format!("index maps {hash:#x} to block {primary}, not its resident primary"));
            }
            let mut cur = primary;
            while cur != NIL {
                if self.blocks[cur as usize].hash != hash || !self.blocks[cur as usize].registered {
                    return Err(format!("copy list of {hash:#x} holds block {cur}"));
                }
                copies += 1;
                cur = self.blocks[cur as usize].next_copy;
            }
        }
        for (&hash, &id) in &self.aliases {
            let listed = self.alias_of.get(&id).is_some_and(|l| l.contains(&hash));
            if !self.blocks[id as usize].registered || !listed {
                return Err(format!("alias {hash:#x} of block {id}, which is not cached under it"));
            }
        }
        let registered = self.blocks.iter().filter(|b| b.registered && !b.unindexed).count();
        if copies != registered {
            return Err(format!(
                "index holds {copies} copies but {registered} indexed blocks are registered"
            ));
        }
        for (i, b) in self.blocks.iter().enumerate() {
            let private_ok = !b.unindexed || (b.registered && b.silent && !b.primary && b.next_copy == NIL);
            if !private_ok || (!b.registered && b.silent) {
                return Err(format!("block {i} has scope flags out of step with its registration"));
            }
        }
        match self.policy {
            EvictionPolicy::Lru if self.lineage.is_empty() && self.leaf_head == NIL => Ok(()),
            EvictionPolicy::Lru => Err("lineage state kept under lru".to_string()),
            EvictionPolicy::Lineage => self.check_lineage(),
        }
    }

    /// Parent/child links are acyclic, point at cached blocks and agree with the sibling
    /// lists; the leaf list holds exactly the inactive blocks without cached children.
    fn check_lineage(&self) -> Result<(), String> {
        let n = self.blocks.len();
        if self.lineage.len() != n {
            return Err(format!("{} lineage nodes for {n} blocks", self.lineage.len()));
        }
        // Parent links minus child-list entries, which must cancel out.
        let mut children = 0i64;
        for (i, (b, node)) in self.blocks.iter().zip(&self.lineage).enumerate() {
            if !b.registered {
                if *node != Lineage::NONE {
                    return Err(format!("uncached block {i} has lineage links {node:?}"));
                }
                continue;
            }
            if node.parent != NIL {
                children += 1;
                if !self.blocks[node.parent as usize].registered {
                    return Err(format!("block {i} has uncached parent {}", node.parent));
                }
            }
            // Parents are registered strictly earlier, so chains end within `n` steps.
            let (mut cur, mut steps) = (node.parent, 0);
            while cur != NIL {
                steps += 1;
                if steps > n {
                    return Err(format!("parent chain of block {i} has a cycle"));
                }
                cur = self.lineage[cur as usize].parent;
            }
            let (mut prev, mut c, mut steps) = (NIL, node.first_child, 0);
            while c != NIL {
                let child = &self.lineage[c as usize];
                steps += 1;
                if child.parent != i as u32 || child.prev_sibling != prev || steps > n {
                    return Err(format!("child list of block {i} holds block {c} ({child:?})"));
                }
                children -= 1;
                (prev, c) = (c, child.next_sibling);
            }
        }
        if children != 0 {
            return Err(format!("{children} more blocks name a parent than child lists hold"));
        }
        let mut in_leaves = vec![false; n];
        let (mut prev, mut cur) = (NIL, self.leaf_head);
        while cur != NIL {
            let (b, node) = (&self.blocks[cur as usize], &self.lineage[cur as usize]);
            if in_leaves[cur as usize] || node.leaf_prev != prev {
                return Err(format!("leaf list broken at block {cur}"));
            }
            if b.refcount != 0 || !b.registered || node.first_child != NIL {
                return Err(format!("block {cur} in the leaf list is not an inactive leaf"));
            }
            in_leaves[cur as usize] = true;
            (prev, cur) = (cur, node.leaf_next);
        }
        if prev != self.leaf_tail {
            return Err(format!("leaf tail {} but the list ends at {prev}", self.leaf_tail));
        }
        for (i, (b, node)) in self.blocks.iter().zip(&self.lineage).enumerate() {
            let leaf = b.refcount == 0 && b.registered && node.first_child == NIL;
            if leaf && !in_leaves[i] {
                return Err(format!("inactive leaf {i} missing from the leaf list"));
            }
            if !in_leaves[i] && (node.leaf_prev != NIL || node.leaf_next != NIL) {
                return Err(format!("block {i} has leaf links but is not in the leaf list"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
