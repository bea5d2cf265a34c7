#![allow(dead_code)]
//! The previous one-node-per-page radix cache, kept as a structural reference the
//! compressed cache must match page for page (matches, locks, created pages, accounting).
//! Its own LRU order is per page; the compressed cache stamps whole nodes as the reference
//! simulator does, so the lockstep test replays the compressed cache's victims here
//! ([`RadixCache::evict_exact`]) and checks each was an unlocked leaf.
//!
//! SGLang's radix prefix cache at page granularity, over a fixed page pool.
//!
//! Every tree node holds one page (`page_size` tokens) and is identified by the page's
//! sequence (chained) hash, so a lookup walks a request's page hashes through one hash map
//! instead of per-node child maps: a chained hash names its whole prefix, so a resident hash
//! implies its parent chain is resident too (nodes are only ever evicted as leaves).
//!
//! Locks follow SGLang's `inc_lock_ref`: locking a node locks its whole path to the root, so
//! a node's `lock_ref` counts the locks held at it or below it. Unlocked nodes are
//! evictable; eviction takes the least recently accessed unlocked *leaf* first, so a parent
//! goes only after all its children. Pages not in the tree are private to the requests that
//! allocated them; the pool only counts them (`free + tree + private = total`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

/// Index of a node in the cache's arena.
pub type NodeId = u32;

/// Parent of root-level nodes.
const ROOT: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    hash: u64,
    parent: u32,
    children: u32,
    lock_ref: u32,
    stamp: u64,
    /// Bumped when the arena slot is reused, so stale eviction entries are recognised.
    gen: u32,
    live: bool,
}

/// An eviction candidate: (last access, node, node generation). Entries go stale when the
/// node is locked, gains a child, is touched or evicted; they are checked when popped.
type Candidate = Reverse<(u64, NodeId, u32)>;

/// What [`RadixCache::insert`] did with a request's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inserted {
    /// Deepest node of the request's locked path after the insert.
    pub last: Option<NodeId>,
    /// Pages of the request now in the tree (the depth of `last`).
    pub depth: usize,
    /// The request's private pages that duplicated resident ones and were freed.
    pub freed_duplicates: usize,
}

/// A page-granular radix tree of cached KV pages plus the free-page count of the pool.
#[derive(Debug, Clone)]
pub struct RadixCache {
    page_size: usize,
    total_pages: usize,
    free_pages: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    by_hash: FxHashMap<u64, NodeId>,
    tree_pages: usize,
    evictable_pages: usize,
    /// Min-heap of unlocked leaves by last access (lazily invalidated: locking a leaf costs
    /// nothing here, a popped entry is used only if it still describes the node).
    lru: BinaryHeap<Candidate>,
    clock: u64,
    /// Whether evicted hashes and created page indices are reported to callers. Only KV
    /// events read them, so an engine that records none skips a push per page (at page
    /// size 1, one per token).
    report: bool,
}

impl RadixCache {
    /// An empty cache over `total_pages` pages of `page_size` tokens.
    pub fn new(total_pages: usize, page_size: usize) -> Self {
        Self {
            page_size: page_size.max(1),
            total_pages,
            free_pages: total_pages,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            by_hash: FxHashMap::with_capacity_and_hasher(total_pages.min(1 << 20), Default::default()),
            tree_pages: 0,
            evictable_pages: 0,
            lru: BinaryHeap::new(),
            clock: 0,
            report: true,
        }
    }

    /// Sets whether `evict`/`allocate`/`clear` append evicted hashes and `insert` appends
    /// created page indices (on by default). Off when no KV events are recorded.
    pub fn set_reporting(&mut self, report: bool) {
        self.report = report;
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool.
    pub fn total_pages(&self) -> usize {
        self.total_pages
    }

    /// Pages neither in the tree nor owned privately by a request.
    pub fn free_pages(&self) -> usize {
        self.free_pages
    }

    /// Pages held by the tree (locked or not).
    pub fn tree_pages(&self) -> usize {
        self.tree_pages
    }

    /// Tree pages no request locks (SGLang's `evictable_size`, in pages).
    pub fn evictable_pages(&self) -> usize {
        self.evictable_pages
    }

    /// Free tokens (SGLang's `available_size`).
    pub fn available_tokens(&self) -> usize {
        self.free_pages * self.page_size
    }

    /// Evictable tokens.
    pub fn evictable_tokens(&self) -> usize {
        self.evictable_pages * self.page_size
    }

    /// Whether the page with sequence hash `hash` is in the tree.
    pub fn contains(&self, hash: u64) -> bool {
        self.by_hash.contains_key(&hash)
    }

    /// Leading pages of `hashes` resident in the tree (read-only; no access stamp).
    ///
    /// Residency along one hash chain is prefix-closed (a node exists only under its
    /// parent, and only leaves are evicted), so the matched length is found by binary
    /// search: O(log n) lookups instead of one per page (pages are single tokens with
    /// SGLang's default page size).
    pub fn match_len(&self, hashes: &[u64]) -> usize {
        let (mut lo, mut hi) = (0, hashes.len());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.by_hash.contains_key(&hashes[mid - 1]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Matches the leading resident pages of `hashes` and locks that path (so it cannot be
    /// evicted while the caller sizes and makes its allocation). Returns the matched page
    /// count and the deepest matched node.
    pub fn lock_prefix(&mut self, hashes: &[u64]) -> (usize, Option<NodeId>) {
        let n = self.match_len(hashes);
        if n == 0 {
            return (0, None);
        }
        let last = self.by_hash[&hashes[n - 1]];
        self.lock_path(last);
        (n, Some(last))
    }

    /// Releases one lock on the path ending at `last`; `touch` refreshes the path's access
    /// stamps (a finished request's sequence counts as just used, a retracted one does not).
    pub fn unlock(&mut self, last: Option<NodeId>, touch: bool) {
        let Some(mut id) = last else { return };
        let now = self.tick();
        while id != ROOT {
            let node = &mut self.nodes[id as usize];
            debug_assert!(node.lock_ref > 0);
            node.lock_ref = node.lock_ref.saturating_sub(1);
            if touch {
                node.stamp = now;
            }
            let (parent, unlocked_leaf) = (node.parent, node.lock_ref == 0 && node.children == 0);
            if node.lock_ref == 0 {
                self.evictable_pages += 1;
            }
            if unlocked_leaf {
                self.push_candidate(id);
            }
            id = parent;
        }
    }

    /// Takes `pages` pages from the pool for a request, evicting unlocked leaves when free
    /// pages are short. Atomic: false (and nothing changes) when free plus evictable pages
    /// cannot cover the request. Hashes of evicted pages are appended to `evicted`.
    pub fn allocate(&mut self, pages: usize, evicted: &mut Vec<u64>) -> bool {
        if pages > self.free_pages + self.evictable_pages {
            return false;
        }
        if pages > self.free_pages {
            self.evict(pages - self.free_pages, evicted);
        }
        debug_assert!(self.free_pages >= pages);
        self.free_pages -= pages;
        true
    }

    /// Returns a request's private pages to the pool.
    pub fn free(&mut self, pages: usize) {
        self.free_pages += pages;
        debug_assert!(self.free_pages + self.tree_pages <= self.total_pages);
    }

    /// Evicts least recently accessed unlocked leaves until `pages` pages are free (or
    /// nothing evictable is left); appends the evicted hashes to `evicted`.
    pub fn evict(&mut self, pages: usize, evicted: &mut Vec<u64>) {
        let mut freed = 0;
        // A parent that just became an unlocked leaf and sorts before everything queued is
        // the next victim anyway: take it directly (chains of a finished request share one
        // stamp, so whole chains go without touching the heap).
        let mut next: Option<u32> = None;
        while freed < pages {
            let id = match next.take() {
                Some(id) => id,
                None => {
                    let Some(Reverse((stamp, id, gen))) = self.lru.pop() else { break };
                    if !self.is_candidate(id, stamp, gen) {
                        continue;
                    }
                    id
                }
            };
            let node = &mut self.nodes[id as usize];
            node.live = false;
            let (hash, parent) = (node.hash, node.parent);
            self.by_hash.remove(&hash);
            self.free_nodes.push(id);
            self.tree_pages -= 1;
            self.evictable_pages -= 1;
            self.free_pages += 1;
            if self.report {
                evicted.push(hash);
            }
            freed += 1;
            if parent != ROOT {
                let p = &mut self.nodes[parent as usize];
                p.children -= 1;
                if p.children == 0 && p.lock_ref == 0 {
                    let key = (p.stamp, parent, p.gen);
                    if self.lru.peek().is_none_or(|top| key < top.0) {
                        next = Some(parent);
                    } else {
                        self.push_candidate(parent);
                    }
                }
            }
        }
        if let Some(id) = next {
            self.push_candidate(id);
        }
    }

    /// Evicts exactly `hashes`, in order; an error names the first that is not a resident
    /// unlocked leaf at its turn.
    pub fn evict_exact(&mut self, hashes: &[u64]) -> Result<(), String> {
        for &hash in hashes {
            let Some(&id) = self.by_hash.get(&hash) else { return Err(format!("{hash:#x} not resident")) };
            let node = &mut self.nodes[id as usize];
            if node.lock_ref != 0 || node.children != 0 {
                return Err(format!(
                    "{hash:#x} evicted while locked ({}) or with {} children",
                    node.lock_ref, node.children
                ));
            }
            node.live = false;
            let parent = node.parent;
            self.by_hash.remove(&hash);
            self.free_nodes.push(id);
            self.tree_pages -= 1;
            self.evictable_pages -= 1;
            self.free_pages += 1;
            if parent != ROOT {
                let p = &mut self.nodes[parent as usize];
                p.children -= 1;
                if p.children == 0 && p.lock_ref == 0 {
                    self.push_candidate(parent);
                }
            }
        }
        Ok(())
    }

    /// [`allocate`](Self::allocate) with the compressed cache's victims `evicted`.
    pub fn allocate_exact(&mut self, pages: usize, evicted: &[u64]) -> Result<bool, String> {
        if pages > self.free_pages + self.evictable_pages {
            return Ok(false);
        }
        self.evict_exact(evicted)?;
        if self.free_pages < pages {
            return Err(format!("{} pages free after evicting, {pages} wanted", self.free_pages));
        }
        self.free_pages -= pages;
        Ok(true)
    }

    /// Inserts a request's complete pages `hashes[depth..]` below its locked path `last`
    /// (of `depth` pages) and moves its lock to the new deepest node. Pages already resident
    /// (another request computed them first) are merged: the request's private copy is
    /// freed. Indices of pages that became newly visible are appended to `created` (for
    /// Stored events). Stops early, keeping the rest private, if a hash is resident under a
    /// different parent (a hash collision; never expected).
    pub fn insert(
        &mut self,
        last: Option<NodeId>,
        depth: usize,
        hashes: &[u64],
        created: &mut Vec<u32>,
    ) -> Inserted {
        let now = self.tick();
        let mut cur = last.unwrap_or(ROOT);
        let mut out = Inserted { last, depth, freed_duplicates: 0 };
        for (i, &hash) in hashes.iter().enumerate().skip(depth) {
            // One probe per page: a vacant slot is filled with the id the node will get.
            let resident = match self.by_hash.entry(hash) {
                Entry::Occupied(e) => Some(*e.get()),
                Entry::Vacant(e) => {
                    e.insert(self.free_nodes.last().copied().unwrap_or(self.nodes.len() as u32));
                    None
                }
            };
            let id = match resident {
                Some(id) if self.nodes[id as usize].parent == cur => {
                    // Resident already: lock it (it may have been evictable) and drop the copy.
                    self.lock_one(id, now);
                    self.free_pages += 1;
                    out.freed_duplicates += 1;
                    id
                }
                Some(_) => break,
                None => {
                    let id = self.new_node(hash, cur, now);
                    if self.report {
                        created.push(i as u32);
                    }
                    id
                }
            };
            cur = id;
            out.last = Some(id);
            out.depth = i + 1;
        }
        out
    }

    /// Drops every cached page when no request locks any; false (nothing changes) otherwise.
    /// Appends the dropped hashes to `evicted`.
    pub fn clear(&mut self, evicted: &mut Vec<u64>) -> bool {
        if self.evictable_pages != self.tree_pages {
            return false;
        }
        self.evict(self.tree_pages, evicted);
        debug_assert_eq!(self.tree_pages, 0);
        true
    }

    /// Checks the cache's structural invariants (for tests): hash index, child counts,
    /// lock refs (a node's count covers its children's), evictable count and the LRU set
    /// (exactly the unlocked leaves), and page accounting. `private_pages` is the sum of
    /// pages requests own outside the tree.
    pub fn check_invariants(&self, private_pages: usize) -> Result<(), String> {
        let live: Vec<u32> = (0..self.nodes.len() as u32).filter(|&i| self.nodes[i as usize].live).collect();
        if live.len() != self.tree_pages || self.by_hash.len() != self.tree_pages {
            return Err(format!(
                "tree pages {} but {} live nodes, {} hashes",
                self.tree_pages,
                live.len(),
                self.by_hash.len()
            ));
        }
        let mut children = vec![0u32; self.nodes.len()];
        let mut child_locks = vec![0u64; self.nodes.len()];
        for &i in &live {
            let n = &self.nodes[i as usize];
            if self.by_hash.get(&n.hash) != Some(&i) {
                return Err(format!("node {i} not indexed by its hash"));
            }
            if n.parent != ROOT {
                let p = &self.nodes[n.parent as usize];
                if !p.live {
                    return Err(format!("node {i} has an evicted parent"));
                }
                children[n.parent as usize] += 1;
                child_locks[n.parent as usize] += u64::from(n.lock_ref);
            }
        }
        let candidates: HashSet<(u64, NodeId, u32)> =
            self.lru.iter().map(|c| c.0).filter(|&(s, id, g)| self.is_candidate(id, s, g)).collect();
        let mut evictable = 0;
        let mut leaves = 0;
        for &i in &live {
            let n = &self.nodes[i as usize];
            if children[i as usize] != n.children {
                return Err(format!(
                    "node {i}: {} children counted, {} recorded",
                    children[i as usize], n.children
                ));
            }
            if u64::from(n.lock_ref) < child_locks[i as usize] {
                return Err(format!(
                    "node {i}: lock_ref {} below its children's {}",
                    n.lock_ref, child_locks[i as usize]
                ));
            }
            if n.lock_ref == 0 {
                evictable += 1;
                if n.children == 0 {
                    leaves += 1;
                    if !candidates.contains(&(n.stamp, i, n.gen)) {
                        return Err(format!("unlocked leaf {i} missing from the eviction order"));
                    }
                }
            }
        }
        if evictable != self.evictable_pages {
            return Err(format!("evictable {} but {evictable} unlocked nodes", self.evictable_pages));
        }
        if leaves != candidates.len() {
            return Err(format!("{} eviction candidates but {leaves} unlocked leaves", candidates.len()));
        }
        if self.free_pages + self.tree_pages + private_pages != self.total_pages {
            return Err(format!(
                "pages not conserved: free {} + tree {} + private {private_pages} != total {}",
                self.free_pages, self.tree_pages, self.total_pages
            ));
        }
        Ok(())
    }

    /// Lock count of the node holding `hash`, if resident (for tests).
    pub fn lock_ref(&self, hash: u64) -> Option<u32> {
        self.by_hash.get(&hash).map(|&id| self.nodes[id as usize].lock_ref)
    }

    /// Queues `id` (now an unlocked leaf) for eviction; compacts the heap when stale
    /// entries dominate, so its size stays proportional to the tree.
    fn push_candidate(&mut self, id: u32) {
        let n = &self.nodes[id as usize];
        self.lru.push(Reverse((n.stamp, id, n.gen)));
        if self.lru.len() > 2 * self.tree_pages + 1024 {
            let heap = std::mem::take(&mut self.lru);
            let live: Vec<Candidate> =
                heap.into_iter().filter(|c| self.is_candidate(c.0 .1, c.0 .0, c.0 .2)).collect();
            self.lru = BinaryHeap::from(live);
        }
    }

    /// Whether an eviction entry still describes an unlocked leaf.
    #[inline]
    fn is_candidate(&self, id: u32, stamp: u64, gen: u32) -> bool {
        let n = &self.nodes[id as usize];
        n.live && n.gen == gen && n.stamp == stamp && n.lock_ref == 0 && n.children == 0
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Adds one lock to every node from `id` up to the root, refreshing their stamps.
    fn lock_path(&mut self, mut id: u32) {
        let now = self.tick();
        while id != ROOT {
            self.lock_one(id, now);
            id = self.nodes[id as usize].parent;
        }
    }

    fn lock_one(&mut self, id: u32, now: u64) {
        let node = &mut self.nodes[id as usize];
        if node.lock_ref == 0 {
            // Its eviction entry (if a leaf) goes stale: the stamp changes below.
            self.evictable_pages -= 1;
        }
        node.lock_ref += 1;
        node.stamp = now;
    }

    /// A new locked leaf under `parent` holding one of the caller's private pages; `insert`
    /// has indexed `hash` under the id it returns (the next free slot).
    fn new_node(&mut self, hash: u64, parent: u32, now: u64) -> u32 {
        let mut node = Node { hash, parent, children: 0, lock_ref: 1, stamp: now, gen: 0, live: true };
        let id = match self.free_nodes.pop() {
            Some(id) => {
                node.gen = self.nodes[id as usize].gen.wrapping_add(1);
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if parent != ROOT {
            // The caller holds the parent's lock, so it is not an eviction candidate.
            self.nodes[parent as usize].children += 1;
        }
        debug_assert_eq!(self.by_hash.get(&hash), Some(&id), "insert indexes the node first");
        self.tree_pages += 1;
        id
    }
}
