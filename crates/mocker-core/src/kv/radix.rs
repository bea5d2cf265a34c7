//! SGLang's radix prefix cache at page granularity, over a fixed page pool.
//!
//! The tree is compressed: a node holds a run of consecutive pages (their sequence hashes,
//! in order), so inserting a request's new suffix creates one node, a lookup compares a
//! node's run as a slice, and eviction takes pages off a leaf's tail in one step. Nodes are
//! indexed by their *first* page's hash: a chained hash names its whole prefix, so it
//! identifies the node's place in the tree (the parent is checked anyway).
//!
//! Every page of a node shares its lock count and its access stamp, as in the reference's
//! compressed tree: locks and unlocks cover whole root paths ending at a node's last page,
//! so a node is split (head above, tail keeping its id and stamp) wherever such a path
//! would end inside it. Interior pages of a node have exactly one child, the next page. A
//! request that grows its own unshared leaf (a decoded token completing a page) appends to
//! that leaf instead of adding a node. As the reference's, a lookup stamps the nodes it
//! matches whole (a head split off by a match ending inside a node keeps the node's
//! stamp), an insert stamps the request's path before adding below it (an insert that adds
//! nothing stamps nothing), and unlocking stamps nothing.
//!
//! Locks follow SGLang's `inc_lock_ref`: locking a node locks its whole path to the root, so
//! a node's `lock_ref` counts the locks held at it or below it. Unlocked pages are
//! evictable; eviction takes the least recently accessed unlocked *leaf* page first, so a
//! parent goes only after all its children. Pages not in the tree are private to the
//! requests that allocated them; the pool only counts them (`free + tree + private = total`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

/// Index of a node in the cache's arena. A request's handle names the node ending at its
/// deepest page; splits keep the id on the tail part, so handles stay valid.
pub type NodeId = u32;

/// Parent of root-level nodes.
const ROOT: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Node {
    /// Sequence hashes of the node's pages, in order; empty once evicted (the buffer is
    /// kept for the slot's next node).
    hashes: Vec<u64>,
    parent: u32,
    children: u32,
    lock_ref: u32,
    /// Access stamp of the node's pages.
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

/// A compressed, page-granular radix tree of cached KV pages plus the free-page count of
/// the pool.
#[derive(Debug, Clone)]
pub struct RadixCache {
    page_size: usize,
    total_pages: usize,
    free_pages: usize,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    /// Live nodes by the hash of their first page.
    by_first: FxHashMap<u64, NodeId>,
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

/// Leading pages two hash runs share.
#[inline]
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
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
            by_first: FxHashMap::default(),
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

    /// Whether the page with sequence hash `hash` is in the tree. Scans the tree (only
    /// first pages are indexed): for inspection and tests, not the scheduling path.
    pub fn contains(&self, hash: u64) -> bool {
        self.find(hash).is_some()
    }

    /// Leading pages of `hashes` resident in the tree (read-only; no access stamp).
    pub fn match_len(&self, hashes: &[u64]) -> usize {
        self.walk(hashes).0
    }

    /// Matches the leading resident pages of `hashes` and locks that path (so it cannot be
    /// evicted while the caller sizes and makes its allocation). Returns the matched page
    /// count and the deepest matched node (split so that it ends at the last match).
    pub fn lock_prefix(&mut self, hashes: &[u64]) -> (usize, Option<NodeId>) {
        let (n, mut last, used) = self.walk(hashes);
        if n == 0 {
            return (0, None);
        }
        let now = self.tick();
        if used < self.nodes[last as usize].hashes.len() {
            // A match ending inside a node: the head split off keeps the node's stamp (the
            // reference touches only nodes matched whole).
            last = self.split(last, used);
            self.lock_one(last, None);
            let parent = self.nodes[last as usize].parent;
            self.lock_path_from(parent, now);
        } else {
            self.lock_path_from(last, now);
        }
        (n, Some(last))
    }

    /// Releases one lock on the path ending at `last` (stamping nothing: a finished
    /// request's insert already stamped its path, a retracted request's is left as it was).
    pub fn unlock(&mut self, last: Option<NodeId>) {
        let Some(mut id) = last else { return };
        while id != ROOT {
            let node = &mut self.nodes[id as usize];
            debug_assert!(node.lock_ref > 0);
            node.lock_ref = node.lock_ref.saturating_sub(1);
            let (parent, unlocked_leaf) = (node.parent, node.lock_ref == 0 && node.children == 0);
            if node.lock_ref == 0 {
                self.evictable_pages += node.hashes.len();
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

    /// Evicts least recently accessed unlocked leaf pages until `pages` pages are free (or
    /// nothing evictable is left); appends the evicted hashes to `evicted`, deepest first.
    ///
    /// Taking a whole tail run at once is the per-page order: the unlocked leaf with the
    /// oldest stamp goes first, and the page it exposes shares that stamp, so it is again
    /// the oldest. Stamps of distinct unlocked leaves never tie (each tick stamps one root
    /// path, and one path holds at most one leaf), so the heap's id tie-break is never used.
    pub fn evict(&mut self, pages: usize, evicted: &mut Vec<u64>) {
        let mut freed = 0;
        // A parent that just became an unlocked leaf and sorts before everything queued is
        // the next victim anyway: take it directly without touching the heap.
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
            let len = node.hashes.len();
            let take = (pages - freed).min(len);
            let keep = len - take;
            if self.report {
                evicted.extend(node.hashes[keep..].iter().rev());
            }
            let first = node.hashes[0];
            node.hashes.truncate(keep);
            let parent = node.parent;
            self.tree_pages -= take;
            self.evictable_pages -= take;
            self.free_pages += take;
            freed += take;
            if keep > 0 {
                // Still the oldest unlocked leaf: back in the queue with the same key.
                self.push_candidate(id);
                break;
            }
            self.nodes[id as usize].live = false;
            self.by_first.remove(&first);
            self.free_nodes.push(id);
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

    /// Inserts a request's complete pages `hashes[depth..]` below its locked path `last`
    /// (of `depth` pages) and moves its lock to the new deepest node. Pages already resident
    /// (another request computed them first) are merged: the request's private copy is
    /// freed. Indices of pages that became newly visible are appended to `created` (for
    /// Stored events). Stops early, keeping the rest private, if a run's first hash is
    /// resident under a different parent (a hash collision; never expected).
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
        let mut i = depth;
        if i < hashes.len() {
            // The reference refreshes the request's whole path before inserting below it
            // (and only when there is something to insert).
            self.touch_path(cur, now);
        }
        if i < hashes.len() && self.extend_leaf(cur, &hashes[i..], now) {
            if self.report {
                created.extend(i as u32..hashes.len() as u32);
            }
            out.depth = hashes.len();
            return out;
        }
        while i < hashes.len() {
            // One probe per run: a vacant slot is filled with the id the new node will get.
            let resident = match self.by_first.entry(hashes[i]) {
                Entry::Occupied(e) => Some(*e.get()),
                Entry::Vacant(e) => {
                    e.insert(self.free_nodes.last().copied().unwrap_or(self.nodes.len() as u32));
                    None
                }
            };
            match resident {
                Some(id) if self.nodes[id as usize].parent == cur => {
                    // Resident already: lock the shared run (splitting where the request's
                    // pages stop matching) and drop the request's copies.
                    let m = common_prefix(&self.nodes[id as usize].hashes, &hashes[i..]);
                    if m < self.nodes[id as usize].hashes.len() {
                        // Matched in part: the head split off keeps the node's stamp.
                        let head = self.split(id, m);
                        self.lock_one(head, None);
                        cur = head;
                    } else {
                        self.lock_one(id, Some(now));
                        cur = id;
                    }
                    self.free_pages += m;
                    out.freed_duplicates += m;
                    i += m;
                }
                Some(_) => break,
                None => {
                    // A new node is stamped after the path (the reference reads its clock
                    // again to create it).
                    let stamp = self.tick();
                    cur = self.new_node(&hashes[i..], cur, stamp);
                    if self.report {
                        created.extend(i as u32..hashes.len() as u32);
                    }
                    i = hashes.len();
                }
            }
            out.last = Some(cur);
            out.depth = i;
        }
        out
    }

    /// Appends `run` to `id` when it is a leaf only the caller locks and `run` is not
    /// resident: the same tree as a new child holding `run` (locked once, by the caller),
    /// without a node per insert. The whole node takes the insert's stamp `now`.
    fn extend_leaf(&mut self, id: u32, run: &[u64], now: u64) -> bool {
        if id == ROOT {
            return false;
        }
        let node = &self.nodes[id as usize];
        if node.children != 0 || node.lock_ref != 1 || self.by_first.contains_key(&run[0]) {
            return false;
        }
        let node = &mut self.nodes[id as usize];
        node.hashes.extend_from_slice(run);
        node.stamp = now;
        self.tree_pages += run.len();
        true
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

    /// Checks the cache's structural invariants (for tests): non-empty runs, globally
    /// unique page hashes, the first-page index, child counts, lock refs (a node's count
    /// covers its children's), evictable count and the LRU set (exactly the unlocked
    /// leaves), and page accounting. `private_pages` is the sum of pages requests own
    /// outside the tree.
    pub fn check_invariants(&self, private_pages: usize) -> Result<(), String> {
        let live: Vec<u32> = (0..self.nodes.len() as u32).filter(|&i| self.nodes[i as usize].live).collect();
        let pages: usize = live.iter().map(|&i| self.nodes[i as usize].hashes.len()).sum();
        if pages != self.tree_pages || self.by_first.len() != live.len() {
            return Err(format!(
                "tree pages {} but {pages} pages in {} live nodes, {} indexed",
                self.tree_pages,
                live.len(),
                self.by_first.len()
            ));
        }
        let mut seen = HashSet::new();
        let mut children = vec![0u32; self.nodes.len()];
        let mut child_locks = vec![0u64; self.nodes.len()];
        for &i in &live {
            let n = &self.nodes[i as usize];
            let Some(&first) = n.hashes.first() else {
                return Err(format!("live node {i} holds no page"));
            };
            if self.by_first.get(&first) != Some(&i) {
                return Err(format!("node {i} not indexed by its first hash"));
            }
            if let Some(h) = n.hashes.iter().find(|&&h| !seen.insert(h)) {
                return Err(format!("page {h:#x} resident twice"));
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
                evictable += n.hashes.len();
                if n.children == 0 {
                    leaves += 1;
                    if !candidates.contains(&(n.stamp, i, n.gen)) {
                        return Err(format!("unlocked leaf {i} missing from the eviction order"));
                    }
                }
            }
        }
        if evictable != self.evictable_pages {
            return Err(format!("evictable {} but {evictable} unlocked pages", self.evictable_pages));
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

    /// Lock count of the page with sequence hash `hash`, if resident (for tests; scans).
    pub fn lock_ref(&self, hash: u64) -> Option<u32> {
        self.find(hash).map(|id| self.nodes[id as usize].lock_ref)
    }

    /// Live nodes in the tree (for tests: compression keeps this well below the pages).
    pub fn node_count(&self) -> usize {
        self.by_first.len()
    }

    /// The live node holding the page `hash`, by a scan.
    fn find(&self, hash: u64) -> Option<u32> {
        (0..self.nodes.len() as u32).find(|&i| {
            let n = &self.nodes[i as usize];
            n.live && n.hashes.contains(&hash)
        })
    }

    /// Walks `hashes` down from the root: (pages matched, deepest node reached or `ROOT`,
    /// pages of that node matched). One index probe per node, a slice compare per run.
    fn walk(&self, hashes: &[u64]) -> (usize, u32, usize) {
        let (mut n, mut cur, mut used) = (0, ROOT, 0);
        while n < hashes.len() {
            let Some(&id) = self.by_first.get(&hashes[n]) else { break };
            let node = &self.nodes[id as usize];
            if node.parent != cur {
                break;
            }
            let m = common_prefix(&node.hashes, &hashes[n..]);
            n += m;
            cur = id;
            used = m;
            if m < node.hashes.len() {
                break;
            }
        }
        (n, cur, used)
    }

    /// Splits node `id` after its first `k` pages (`0 < k < len`): a new node takes the head
    /// run and the node's place under its parent; `id` keeps the tail, its children, its
    /// eviction entry and every handle naming it. Both parts keep the lock count and stamp,
    /// so the per-page state is unchanged. Returns the head.
    fn split(&mut self, id: u32, k: usize) -> u32 {
        debug_assert!(k > 0 && k < self.nodes[id as usize].hashes.len());
        let mut head_hashes = match self.free_nodes.last() {
            Some(&slot) => std::mem::take(&mut self.nodes[slot as usize].hashes),
            None => Vec::new(),
        };
        let tail = &mut self.nodes[id as usize];
        head_hashes.clear();
        head_hashes.extend_from_slice(&tail.hashes[..k]);
        tail.hashes.drain(..k);
        let stamp = tail.stamp;
        let (parent, lock_ref, tail_first) = (tail.parent, tail.lock_ref, tail.hashes[0]);
        let head = Node { hashes: head_hashes, parent, children: 1, lock_ref, stamp, gen: 0, live: true };
        let head = self.place(head);
        self.nodes[id as usize].parent = head;
        let first = self.nodes[head as usize].hashes[0];
        self.by_first.insert(first, head);
        self.by_first.insert(tail_first, id);
        head
    }

    /// Stores `node` in a free arena slot (bumping its generation) or a new one.
    fn place(&mut self, mut node: Node) -> u32 {
        match self.free_nodes.pop() {
            Some(id) => {
                node.gen = self.nodes[id as usize].gen.wrapping_add(1);
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Queues `id` (now an unlocked leaf) for eviction; compacts the heap when stale
    /// entries dominate, so its size stays proportional to the tree.
    fn push_candidate(&mut self, id: u32) {
        let n = &self.nodes[id as usize];
        self.lru.push(Reverse((n.stamp, id, n.gen)));
        if self.lru.len() > 2 * self.by_first.len() + 1024 {
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

    /// Adds one lock to every node from `id` up to the root, stamping them `now`.
    fn lock_path_from(&mut self, mut id: u32, now: u64) {
        while id != ROOT {
            self.lock_one(id, Some(now));
            id = self.nodes[id as usize].parent;
        }
    }

    /// Adds one lock to `id`, stamping it `now` if given. A locked node is no eviction
    /// candidate: its queued entry is recognised as stale when popped.
    fn lock_one(&mut self, id: u32, now: Option<u64>) {
        let node = &mut self.nodes[id as usize];
        if node.lock_ref == 0 {
            self.evictable_pages -= node.hashes.len();
        }
        node.lock_ref += 1;
        if let Some(now) = now {
            node.stamp = now;
        }
    }

    /// Stamps every node from `id` up to the root `now` (re-queueing an unlocked leaf).
    fn touch_path(&mut self, mut id: u32, now: u64) {
        while id != ROOT {
            let node = &mut self.nodes[id as usize];
            node.stamp = now;
            let (parent, unlocked_leaf) = (node.parent, node.lock_ref == 0 && node.children == 0);
            if unlocked_leaf {
                self.push_candidate(id);
            }
            id = parent;
        }
    }

    /// A new locked leaf under `parent` holding the caller's private pages `run` (one node
    /// for the whole run: they share the insert's stamp and the caller's lock); `insert`
    /// has indexed `run[0]` under the id it returns (the next free slot).
    fn new_node(&mut self, run: &[u64], parent: u32, now: u64) -> u32 {
        let mut hashes = match self.free_nodes.last() {
            Some(&slot) => std::mem::take(&mut self.nodes[slot as usize].hashes),
            None => Vec::new(),
        };
        hashes.clear();
        hashes.extend_from_slice(run);
        let id =
            self.place(Node { hashes, parent, children: 0, lock_ref: 1, stamp: now, gen: 0, live: true });
        if parent != ROOT {
            // The caller holds the parent's lock, so it is not an eviction candidate.
            self.nodes[parent as usize].children += 1;
        }
        debug_assert_eq!(self.by_first.get(&run[0]), Some(&id), "insert indexes the node first");
        self.tree_pages += run.len();
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_lock_unlock_evict_leaf_first() {
        let mut c = RadixCache::new(8, 4);
        let mut ev = Vec::new();
        assert!(c.allocate(3, &mut ev));
        let mut created = Vec::new();
        let ins = c.insert(None, 0, &[10, 11, 12], &mut created);
        assert_eq!((ins.depth, ins.freed_duplicates, created.clone()), (3, 0, vec![0, 1, 2]));
        c.check_invariants(0).unwrap();
        assert_eq!(c.evictable_pages(), 0);
        c.unlock(ins.last);
        assert_eq!(c.evictable_pages(), 3);
        c.check_invariants(0).unwrap();
        c.evict(1, &mut ev);
        assert_eq!(ev, vec![12], "the leaf goes first");
        c.check_invariants(0).unwrap();
        assert_eq!(c.match_len(&[10, 11, 12]), 2);
    }

    #[test]
    fn duplicate_pages_are_merged_and_freed() {
        let mut c = RadixCache::new(8, 4);
        let mut ev = Vec::new();
        assert!(c.allocate(4, &mut ev));
        let mut created = Vec::new();
        let a = c.insert(None, 0, &[1, 2], &mut created);
        let b = c.insert(None, 0, &[1, 2], &mut created);
        assert_eq!(b.freed_duplicates, 2);
        assert_eq!(c.lock_ref(1), Some(2));
        c.check_invariants(0).unwrap();
        c.unlock(a.last);
        c.unlock(b.last);
        assert!(c.clear(&mut ev));
        assert_eq!(c.free_pages(), 8);
    }

    #[test]
    fn without_reporting_the_tree_changes_the_same_but_reports_nothing() {
        let (mut a, mut b) = (RadixCache::new(4, 2), RadixCache::new(4, 2));
        b.set_reporting(false);
        for c in [&mut a, &mut b] {
            let (mut ev, mut created) = (Vec::new(), Vec::new());
            assert!(c.allocate(3, &mut ev));
            let ins = c.insert(None, 0, &[1, 2, 3], &mut created);
            c.unlock(ins.last);
            assert!(c.allocate(3, &mut ev), "two unlocked leaves are evicted");
            c.check_invariants(3).unwrap();
            assert_eq!((c.free_pages(), c.tree_pages(), c.match_len(&[1, 2, 3])), (0, 1, 1));
            let reported = c.report;
            assert_eq!((ev.len(), created.len()), if reported { (2, 3) } else { (0, 0) });
        }
    }

    #[test]
    fn a_new_suffix_is_one_node_and_a_partial_match_splits_it() {
        let mut c = RadixCache::new(16, 1);
        let (mut ev, mut created) = (Vec::new(), Vec::new());
        assert!(c.allocate(5, &mut ev));
        let a = c.insert(None, 0, &[1, 2, 3, 4, 5], &mut created);
        assert_eq!((c.node_count(), a.depth), (1, 5));
        c.unlock(a.last);
        // A request sharing three pages: the lock ends inside the run, so it splits there.
        let (n, head) = c.lock_prefix(&[1, 2, 3, 9]);
        assert_eq!((n, c.node_count()), (3, 2));
        assert_eq!((c.lock_ref(3), c.lock_ref(4)), (Some(1), Some(0)));
        assert_eq!(c.evictable_pages(), 2);
        c.check_invariants(0).unwrap();
        assert!(c.allocate(1, &mut ev));
        created.clear();
        let b = c.insert(head, 3, &[1, 2, 3, 9], &mut created);
        assert_eq!((b.depth, created.clone(), c.node_count()), (4, vec![3], 3));
        c.check_invariants(0).unwrap();
        // The handle of the first request (the split tail) still names page 5.
        assert_eq!(c.match_len(&[1, 2, 3, 4, 5]), 5);
        c.unlock(b.last);
        c.check_invariants(0).unwrap();
    }

    #[test]
    fn tail_eviction_takes_part_of_a_run_deepest_first() {
        let mut c = RadixCache::new(8, 1);
        let (mut ev, mut created) = (Vec::new(), Vec::new());
        assert!(c.allocate(6, &mut ev));
        let a = c.insert(None, 0, &[1, 2, 3, 4, 5, 6], &mut created);
        c.unlock(a.last);
        assert!(c.allocate(4, &mut ev), "two pages come off the tail");
        assert_eq!(ev, vec![6, 5]);
        assert_eq!((c.tree_pages(), c.node_count(), c.match_len(&[1, 2, 3, 4, 5, 6])), (4, 1, 4));
        c.check_invariants(4).unwrap();
        c.free(4);
        ev.clear();
        c.evict(10, &mut ev);
        assert_eq!(ev, vec![4, 3, 2, 1]);
        assert_eq!((c.tree_pages(), c.node_count(), c.free_pages()), (0, 0, 8));
        c.check_invariants(0).unwrap();
    }

    #[test]
    fn eviction_follows_node_stamps_across_split_runs() {
        // A's [1..=4] is split at 2 by B's lookup (the head keeps A's stamp); B's insert of
        // its page 7 stamps the head, and a later lookup of [1, 2] stamps it again. A's
        // untouched tail [3, 4] is oldest, then B's 7, then the head.
        let mut c = RadixCache::new(16, 1);
        let (mut ev, mut created) = (Vec::new(), Vec::new());
        assert!(c.allocate(5, &mut ev));
        let a = c.insert(None, 0, &[1, 2, 3, 4], &mut created);
        let (_, head) = c.lock_prefix(&[1, 2]);
        let b = c.insert(head, 2, &[1, 2, 7], &mut created);
        c.unlock(b.last);
        c.unlock(a.last);
        let (_, head) = c.lock_prefix(&[1, 2]);
        c.unlock(head);
        c.check_invariants(0).unwrap();
        c.evict(16, &mut ev);
        assert_eq!(ev, vec![4, 3, 7, 2, 1]);
        c.check_invariants(0).unwrap();
    }

    #[test]
    fn an_insert_that_adds_nothing_stamps_nothing() {
        // A's [1, 2] at t1, then D's [20] at t_d. A finishes with no new complete page: its
        // insert adds nothing, so its run keeps t1 and goes before D's (the reference
        // stamps a path only when it inserts below it).
        let mut c = RadixCache::new(16, 1);
        let (mut ev, mut created) = (Vec::new(), Vec::new());
        assert!(c.allocate(3, &mut ev));
        let a = c.insert(None, 0, &[1, 2], &mut created);
        let d = c.insert(None, 0, &[20], &mut created);
        let a = c.insert(a.last, 2, &[1, 2], &mut created);
        c.unlock(d.last);
        c.unlock(a.last);
        c.evict(1, &mut ev);
        assert_eq!(ev, vec![2]);
        c.check_invariants(0).unwrap();
    }

    #[test]
    fn an_insert_below_a_leaf_restamps_the_whole_node() {
        // A's [1, 2] at t1, D's [20] at t_d, A's decoded page 3 appended at t3 (t1 < t_d < t3):
        // the insert stamps A's path first, so its node is one run stamped t3.
        let mut c = RadixCache::new(16, 1);
        let (mut ev, mut created) = (Vec::new(), Vec::new());
        assert!(c.allocate(4, &mut ev));
        let a = c.insert(None, 0, &[1, 2], &mut created);
        let d = c.insert(None, 0, &[20], &mut created);
        let a = c.insert(a.last, 2, &[1, 2, 3], &mut created);
        assert_eq!(c.node_count(), 2, "page 3 was appended to A's leaf, not given a node");
        assert_eq!(created, vec![0, 1, 0, 2]);
        // A retracted: its page 3 is the only unlocked leaf.
        c.unlock(a.last);
        c.evict(1, &mut ev);
        assert_eq!(ev, vec![3]);
        // D retracted too: A's remaining run keeps t3, newer than D's t_d.
        c.unlock(d.last);
        c.check_invariants(0).unwrap();
        ev.clear();
        c.evict(1, &mut ev);
        assert_eq!(ev, vec![20]);

        // The same, both left after page 3 was appended: D (t_d) goes before A's run (t3).
        let mut c = RadixCache::new(16, 1);
        assert!(c.allocate(4, &mut ev));
        let a = c.insert(None, 0, &[1, 2], &mut created);
        let d = c.insert(None, 0, &[20], &mut created);
        let a = c.insert(a.last, 2, &[1, 2, 3], &mut created);
        c.unlock(a.last);
        c.unlock(d.last);
        ev.clear();
        c.evict(2, &mut ev);
        assert_eq!(ev, vec![20, 3]);
        c.check_invariants(0).unwrap();
    }
}
