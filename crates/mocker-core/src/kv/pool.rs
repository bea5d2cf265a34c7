//! A fixed pool of physical KV blocks: free, active (referenced) and inactive (cached,
//! evictable in least-recently-released order).

use rustc_hash::FxHashMap;

/// Index of a physical block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    /// Sequence hash once the block is cached (`registered`), meaningless otherwise.
    hash: u64,
    refcount: u32,
    registered: bool,
    /// First copy of its hash: the one the index points at.
    primary: bool,
    /// Inactive LRU links.
    prev: u32,
    next: u32,
    /// Next copy of the same hash. Duplicates arise when concurrent requests compute the
    /// same block; only the first is visible to events, and the hash goes with the last.
    next_copy: u32,
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
    blocks: Vec<Block>,
    free: Vec<BlockId>,
    lru_head: u32,
    lru_tail: u32,
    num_inactive: usize,
    /// Hash to its primary copy. Keys are already well-mixed hashes, so a one-multiply
    /// hasher is enough. Entries of evicted hashes are left behind (an eviction then costs
    /// no random table access) and recognised as stale by the block they point at; the
    /// table is swept when stale entries outnumber the pool.
    index: FxHashMap<u64, BlockId>,
    live_hashes: usize,
    stale: usize,
}

impl BlockPool {
    /// A pool of `capacity` free blocks.
    pub fn new(capacity: usize) -> Self {
        assert!(capacity < NIL as usize, "block pool too large");
        let blocks = vec![
            Block {
                hash: 0,
                refcount: 0,
                registered: false,
                primary: false,
                prev: NIL,
                next: NIL,
                next_copy: NIL
            };
            capacity
        ];
        // Popping from the end hands out low ids first, which keeps debugging output readable.
        let free = (0..capacity as u32).rev().collect();
        Self {
            blocks,
            free,
            lru_head: NIL,
            lru_tail: NIL,
            num_inactive: 0,
            index: FxHashMap::default(),
            live_hashes: 0,
            stale: 0,
        }
    }

    /// Total physical blocks.
    pub fn capacity(&self) -> usize {
        self.blocks.len()
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
        self.free.len()
    }

    /// Distinct cached hashes (active or inactive).
    pub fn num_cached_hashes(&self) -> usize {
        self.live_hashes
    }

    /// Whether `hash` is resident in the cache.
    pub fn contains(&self, hash: u64) -> bool {
        self.resident(hash).is_some()
    }

    /// The primary copy of `hash`, if it is resident.
    #[inline]
    fn resident(&self, hash: u64) -> Option<BlockId> {
        let &id = self.index.get(&hash)?;
        let b = &self.blocks[id as usize];
        (b.registered && b.primary && b.hash == hash).then_some(id)
    }

    /// Walks `hashes` from the root while each block is resident.
    pub fn match_prefix(&self, hashes: &[u64]) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        if self.live_hashes == 0 {
            return m;
        }
        for &h in hashes {
            let Some(id) = self.resident(h) else { break };
            m.blocks += 1;
            if self.blocks[id as usize].refcount > 0 {
                m.active_blocks += 1;
            }
        }
        m
    }

    /// Grows `owned` to `target` blocks. The first new blocks, up to `hits.len()`, reuse the
    /// cached blocks of `hits` (indexed like `owned`); the rest are fresh, taken from free
    /// capacity first and then by evicting least-recently-released cached blocks, whose
    /// hashes are appended to `evicted` when their last copy goes. Returns false and changes
    /// nothing if the pool cannot supply them.
    pub fn allocate(
        &mut self,
        owned: &mut Vec<BlockId>,
        target: usize,
        hits: &[u64],
        evicted: &mut Vec<u64>,
    ) -> bool {
        let prev = owned.len();
        if target <= prev {
            return true;
        }
        let hits = hits.get(prev..hits.len().min(target)).unwrap_or(&[]);
        let hit_end = prev + hits.len();
        let mut inactive_hits = 0;
        for &h in hits {
            match self.resident(h) {
                Some(id) if self.blocks[id as usize].refcount == 0 => inactive_hits += 1,
                Some(_) => {}
                None => return false,
            }
        }
        let fresh = target - hit_end;
        let shortfall = fresh.saturating_sub(self.free.len());
        if shortfall > self.num_inactive - inactive_hits {
            return false;
        }
        owned.reserve(target - prev);
        for &h in hits {
            let id = self.resident(h).expect("hit checked above");
            let b = &mut self.blocks[id as usize];
            if b.refcount == 0 {
                self.lru_unlink(id);
            }
            self.blocks[id as usize].refcount += 1;
            owned.push(id);
        }
        for _ in 0..fresh {
            let id = match self.free.pop() {
                Some(id) => id,
                None => self.evict_lru(evicted),
            };
            self.blocks[id as usize].refcount = 1;
            owned.push(id);
        }
        true
    }

    /// Registers a freshly computed full block under `hash`. Returns true when it is the
    /// first copy of that hash (so it should be announced as Stored).
    pub fn register(&mut self, id: BlockId, hash: u64) -> bool {
        let b = &mut self.blocks[id as usize];
        if b.registered {
            return false;
        }
        b.registered = true;
        b.hash = hash;
        let blocks = &mut self.blocks;
        // One probe: an existing entry is either a live primary (this block is a duplicate)
        // or stale, in which case it is taken over.
        match self.index.entry(hash) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let p = *e.get() as usize;
                if blocks[p].registered && blocks[p].primary && blocks[p].hash == hash {
                    blocks[id as usize].next_copy = blocks[p].next_copy;
                    blocks[p].next_copy = id;
                    return false;
                }
                e.insert(id);
                self.stale -= 1;
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(id);
            }
        }
        blocks[id as usize].primary = true;
        self.live_hashes += 1;
        true
    }

    /// Drops one reference to each of `owned`, tail first, so that a request's leaf blocks
    /// are evicted before its root. Cached blocks that reach zero join the LRU tail.
    pub fn release(&mut self, owned: &mut Vec<BlockId>) {
        while let Some(id) = owned.pop() {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.refcount > 0);
            b.refcount -= 1;
            if b.refcount == 0 {
                if b.registered {
                    self.lru_push_tail(id);
                } else {
                    self.free.push(id);
                }
            }
        }
    }

    /// Forgets every inactive cached block (cache reset); their hashes go to `evicted`.
    pub fn clear_inactive(&mut self, evicted: &mut Vec<u64>) {
        while self.lru_head != NIL {
            let id = self.evict_lru(evicted);
            self.free.push(id);
        }
    }

    fn evict_lru(&mut self, evicted: &mut Vec<u64>) -> BlockId {
        let id = self.lru_head;
        debug_assert!(id != NIL, "eviction with an empty LRU");
        self.lru_unlink(id);
        let b = &mut self.blocks[id as usize];
        b.registered = false;
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
        } else if next_copy != NIL {
            self.blocks[next_copy as usize].primary = true;
            self.index.insert(hash, next_copy);
        } else {
            evicted.push(hash);
            self.live_hashes -= 1;
            self.stale += 1;
            if self.stale > self.blocks.len().max(1024) {
                self.sweep_stale();
            }
        }
        id
    }

    /// Drops index entries whose hash is no longer resident.
    fn sweep_stale(&mut self) {
        let blocks = &self.blocks;
        self.index.retain(|&h, &mut id| {
            let b = &blocks[id as usize];
            b.registered && b.primary && b.hash == h
        });
        self.stale = 0;
    }

    fn lru_push_tail(&mut self, id: BlockId) {
        let tail = self.lru_tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NIL;
        }
        if tail == NIL {
            self.lru_head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.lru_tail = id;
        self.num_inactive += 1;
    }

    fn lru_unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next)
        };
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        self.num_inactive -= 1;
    }

    /// Checks the pool's bookkeeping; for tests and debug assertions.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut in_lru = vec![false; self.blocks.len()];
        let mut n = 0;
        let mut cur = self.lru_head;
        while cur != NIL {
            let b = &self.blocks[cur as usize];
            if b.refcount != 0 || !b.registered {
                return Err(format!(
                    "block {cur} in LRU with refcount {} registered {}",
                    b.refcount, b.registered
                ));
            }
            in_lru[cur as usize] = true;
            n += 1;
            cur = b.next;
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
        let mut live = 0;
        for (&hash, &primary) in &self.index {
            if self.resident(hash) != Some(primary) {
                continue;
            }
            live += 1;
            let mut cur = primary;
            while cur != NIL {
                if self.blocks[cur as usize].hash != hash || !self.blocks[cur as usize].registered {
                    return Err(format!("copy list of {hash:#x} holds block {cur}"));
                }
                copies += 1;
                cur = self.blocks[cur as usize].next_copy;
            }
        }
        if live != self.live_hashes || self.index.len() != live + self.stale {
            return Err(format!(
                "{live} resident hashes, {} counted live, {} stale of {} entries",
                self.live_hashes,
                self.stale,
                self.index.len()
            ));
        }
        let registered = self.blocks.iter().filter(|b| b.registered).count();
        if copies != registered {
            return Err(format!("index holds {copies} copies but {registered} blocks are registered"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_allocation_prefers_free_then_evicts_oldest_release() {
        let mut pool = BlockPool::new(4);
        let mut ev = Vec::new();
        let mut a = Vec::new();
        assert!(pool.allocate(&mut a, 2, &[], &mut ev));
        assert!(pool.register(a[0], 10));
        assert!(pool.register(a[1], 11));
        let mut b = Vec::new();
        assert!(pool.allocate(&mut b, 2, &[], &mut ev));
        pool.register(b[0], 20);
        pool.release(&mut a); // LRU: 11, 10 (tail first)
        pool.release(&mut b); // LRU: 11, 10, 20 ; b[1] was private -> free
        assert_eq!(pool.num_inactive(), 3);
        assert_eq!(pool.num_free(), 1);
        let mut c = Vec::new();
        assert!(pool.allocate(&mut c, 2, &[], &mut ev));
        assert_eq!(ev, vec![11]);
        assert!(!pool.allocate(&mut c, 5, &[], &mut ev), "only 4 blocks exist");
        assert_eq!(c.len(), 2, "failed allocation changes nothing");
        pool.check_invariants().unwrap();
    }

    #[test]
    fn prefix_hits_are_pinned_and_not_evictable() {
        let mut pool = BlockPool::new(3);
        let mut ev = Vec::new();
        let mut a = Vec::new();
        pool.allocate(&mut a, 3, &[], &mut ev);
        for (i, &id) in a.iter().enumerate() {
            pool.register(id, 100 + i as u64);
        }
        pool.release(&mut a);
        assert_eq!(pool.match_prefix(&[100, 101, 999]), PrefixMatch { blocks: 2, active_blocks: 0 });
        // Reusing 2 blocks and needing 2 fresh: only 1 evictable block is not a hit.
        let mut b = Vec::new();
        assert!(!pool.allocate(&mut b, 4, &[100, 101], &mut ev));
        assert!(pool.allocate(&mut b, 3, &[100, 101], &mut ev));
        assert_eq!(ev, vec![102]);
        assert_eq!(pool.match_prefix(&[100, 101]), PrefixMatch { blocks: 2, active_blocks: 2 });
        pool.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_copies_are_removed_with_the_last_copy() {
        let mut pool = BlockPool::new(2);
        let mut ev = Vec::new();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        pool.allocate(&mut a, 1, &[], &mut ev);
        pool.allocate(&mut b, 1, &[], &mut ev);
        assert!(pool.register(a[0], 7));
        assert!(!pool.register(b[0], 7), "second copy is not announced");
        pool.release(&mut a);
        pool.release(&mut b);
        let mut c = Vec::new();
        pool.allocate(&mut c, 1, &[], &mut ev);
        assert!(ev.is_empty(), "one copy of 7 is still resident");
        assert!(pool.contains(7));
        pool.allocate(&mut c, 2, &[], &mut ev);
        assert_eq!(ev, vec![7]);
        pool.check_invariants().unwrap();
    }
}
