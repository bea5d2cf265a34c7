//! A one-node-per-page radix cache, kept as a structural reference the compressed cache
//! must match page for page (matches, locks, created pages, accounting). It keeps no
//! eviction order of its own: the compressed cache stamps whole nodes as the reference
//! simulator does, so the lockstep test replays the compressed cache's victims here
//! ([`RadixCache::evict_exact`]), which checks each was an unlocked leaf.
//!
//! Every tree node holds one page and is identified by the page's
//! sequence (chained) hash, so a lookup walks a request's page hashes through one hash map
//! instead of per-node child maps: a chained hash names its whole prefix, so a resident hash
//! implies its parent chain is resident too (nodes are only ever evicted as leaves).
//!
//! Locks follow SGLang's `inc_lock_ref`: locking a node locks its whole path to the root, so
//! a node's `lock_ref` counts the locks held at it or below it. Unlocked nodes are
//! evictable, leaves only, so a parent goes only after all its children. Pages not in the tree are private to the requests that
//! allocated them; the pool only counts them (`free + tree + private = total`).

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
    live: bool,
}

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
    total_pages: usize,
    free_pages: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    by_hash: FxHashMap<u64, NodeId>,
    tree_pages: usize,
    evictable_pages: usize,
}

impl RadixCache {
    /// An empty cache over `total_pages` pages.
    pub fn new(total_pages: usize) -> Self {
        Self {
            total_pages,
            free_pages: total_pages,
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            by_hash: FxHashMap::with_capacity_and_hasher(total_pages.min(1 << 20), Default::default()),
            tree_pages: 0,
            evictable_pages: 0,
        }
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

    /// Releases one lock on the path ending at `last`.
    pub fn unlock(&mut self, last: Option<NodeId>) {
        let Some(mut id) = last else { return };
        while id != ROOT {
            let node = &mut self.nodes[id as usize];
            debug_assert!(node.lock_ref > 0);
            node.lock_ref = node.lock_ref.saturating_sub(1);
            if node.lock_ref == 0 {
                self.evictable_pages += 1;
            }
            id = node.parent;
        }
    }

    /// Returns a request's private pages to the pool.
    pub fn free(&mut self, pages: usize) {
        self.free_pages += pages;
        debug_assert!(self.free_pages + self.tree_pages <= self.total_pages);
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
                self.nodes[parent as usize].children -= 1;
            }
        }
        Ok(())
    }

    /// Takes `pages` pages for a request after evicting `evicted`, the compressed cache's
    /// victims for the same allocation: false (nothing changes) when free plus evictable
    /// pages cannot cover it, an error when those victims leave too few pages free.
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
                    self.lock_one(id);
                    self.free_pages += 1;
                    out.freed_duplicates += 1;
                    id
                }
                Some(_) => break,
                None => {
                    let id = self.new_node(hash, cur);
                    created.push(i as u32);
                    id
                }
            };
            cur = id;
            out.last = Some(id);
            out.depth = i + 1;
        }
        out
    }

    /// Checks the cache's structural invariants (for tests): hash index, child counts,
    /// lock refs (a node's count covers its children's), evictable count and page
    /// accounting. `private_pages` is the sum of
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
        let mut evictable = 0;
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
            }
        }
        if evictable != self.evictable_pages {
            return Err(format!("evictable {} but {evictable} unlocked nodes", self.evictable_pages));
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

    /// Adds one lock to every node from `id` up to the root.
    fn lock_path(&mut self, mut id: u32) {
        while id != ROOT {
            self.lock_one(id);
            id = self.nodes[id as usize].parent;
        }
    }

    fn lock_one(&mut self, id: u32) {
        let node = &mut self.nodes[id as usize];
        if node.lock_ref == 0 {
            self.evictable_pages -= 1;
        }
        node.lock_ref += 1;
    }

    /// A new locked leaf under `parent` holding one of the caller's private pages; `insert`
    /// has indexed `hash` under the id it returns (the next free slot).
    fn new_node(&mut self, hash: u64, parent: u32) -> u32 {
        let node = Node { hash, parent, children: 0, lock_ref: 1, live: true };
        let id = match self.free_nodes.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if parent != ROOT {
            self.nodes[parent as usize].children += 1;
        }
        debug_assert_eq!(self.by_hash.get(&hash), Some(&id), "insert indexes the node first");
        self.tree_pages += 1;
        id
    }
}
