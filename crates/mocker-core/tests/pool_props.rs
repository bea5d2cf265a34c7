//! Property tests of the KV block pool (core spec §3) against a small reference model.
//!
//! Random operation sequences drive a `BlockPool` the way schedulers do (simulated requests
//! own block vectors, grow them with or without prefix hits, register their computed blocks
//! under chained hashes, release them), while the test keeps its own model of every block:
//! refcount, registered hash, and the inactive LRU order (under the `lineage` policy also
//! every block's recorded parent and the leaf list). After every operation the pool must agree
//! with the model, and the Stored/Removed stream implied by `register`'s return value and the
//! `evicted` reports must stay consistent with `contains`. Each case picks its policy at random.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use mocker_core::config::EvictionPolicy;
use mocker_core::kv::{BlockId, BlockPool, PrefixMatch};
use proptest::prelude::*;

/// Simulated requests (slots) that may hold blocks at once.
const SLOTS: usize = 6;
/// Prefix families: requests of one family share their chain of block hashes.
const FAMILIES: u64 = 3;
/// Longest chain a request walks.
const CHAIN: usize = 10;

/// The sequence hash of block `idx` of family `family` (distinct across families/positions).
fn chain_hash(family: u64, idx: usize) -> u64 {
    0x1000 * (family + 1) + idx as u64
}

fn chain(family: u64) -> Vec<u64> {
    (0..CHAIN).map(|i| chain_hash(family, i)).collect()
}

/// Hashes whose residency `check` compares: every hash ever stored, plus the small
/// families' chains (mostly never stored in churn runs).
fn watched(model: &Model) -> Vec<u64> {
    let mut hashes: BTreeSet<u64> = model.stored.keys().copied().collect();
    hashes.extend((0..FAMILIES).flat_map(chain));
    hashes.into_iter().collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// Grow request `slot` by `grow` blocks, passing the first `hits` hashes of its chain as
    /// prefix hits (`hits` beyond what is resident makes the call fail); `family` is used
    /// when the slot starts a new request.
    Allocate { slot: usize, family: u64, grow: usize, hits: usize, use_match: bool },
    /// Register the `pick`-th owned block of `slot` under its chain hash.
    Register { slot: usize, pick: usize },
    /// Register every owned block of `slot` (a prefill finishing).
    RegisterAll { slot: usize },
    /// Release all of `slot`'s blocks (finish or preempt).
    Release { slot: usize },
    /// Look up the first `len` hashes of a family.
    Match { family: u64, len: usize },
    /// Cache reset.
    ClearInactive,
}

fn op(families: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SLOTS, 0..families, 1..5usize, 0..=CHAIN, any::<bool>()).prop_map(
            |(slot, family, grow, hits, use_match)| Op::Allocate { slot, family, grow, hits, use_match }
        ),
        3 => (0..SLOTS, 0..CHAIN).prop_map(|(slot, pick)| Op::Register { slot, pick }),
        2 => (0..SLOTS).prop_map(|slot| Op::RegisterAll { slot }),
        3 => (0..SLOTS).prop_map(|slot| Op::Release { slot }),
        2 => (0..families, 0..=CHAIN).prop_map(|(family, len)| Op::Match { family, len }),
        1 => Just(Op::ClearInactive),
    ]
}

/// Operations of a busy engine: requests start with a prefix lookup, compute and
/// register their blocks, finish; over many distinct chains.
fn churn_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // A few hot families (shared prefixes) and a stream of cold ones.
        4 => (0..SLOTS, prop_oneof![0..4u64, 4..1u64 << 20], 1..5usize).prop_map(|(slot, family, grow)| Op::Allocate {
            slot,
            family,
            grow,
            hits: 0,
            use_match: true,
        }),
        3 => (0..SLOTS).prop_map(|slot| Op::RegisterAll { slot }),
        3 => (0..SLOTS).prop_map(|slot| Op::Release { slot }),
        1 => (0..SLOTS, 0..CHAIN).prop_map(|(slot, pick)| Op::Register { slot, pick }),
    ]
}

/// One simulated request holding blocks.
#[derive(Debug, Clone, Default)]
struct Req {
    family: u64,
    owned: Vec<BlockId>,
    /// Parallel to `owned`: whether the block was obtained as a prefix hit.
    via_hit: Vec<bool>,
}

/// The test's model of the pool.
#[derive(Debug, Clone)]
struct Model {
    refcount: Vec<u32>,
    hash: Vec<Option<u64>>,
    /// Inactive cached blocks, least recently released first.
    lru: VecDeque<BlockId>,
    /// Per hash: Stored (first copy registered) and Removed (last copy evicted) counts.
    stored: BTreeMap<u64, u32>,
    removed: BTreeMap<u64, u32>,
    /// Lineage policy: each cached block's recorded parent (the registering request's
    /// previous block, if cached then; cut when either end is evicted) and the inactive
    /// blocks without cached children, oldest first. Unused under lru.
    lineage: bool,
    parent: Vec<Option<BlockId>>,
    leaves: VecDeque<BlockId>,
}

impl Model {
    fn new(capacity: usize, policy: EvictionPolicy) -> Self {
        Self {
            refcount: vec![0; capacity],
            hash: vec![None; capacity],
            lru: VecDeque::new(),
            stored: BTreeMap::new(),
            removed: BTreeMap::new(),
            lineage: policy == EvictionPolicy::Lineage,
            parent: vec![None; capacity],
            leaves: VecDeque::new(),
        }
    }

    fn is_leaf(&self, id: BlockId) -> bool {
        self.refcount[id as usize] == 0
            && self.hash[id as usize].is_some()
            && !self.parent.contains(&Some(id))
    }

    /// The block the pool must evict next: the LRU head, or under lineage the oldest leaf,
    /// falling back to the LRU head when no inactive block is a leaf.
    fn next_victim(&self) -> Option<BlockId> {
        let leaf = if self.lineage { self.leaves.front() } else { None };
        leaf.or(self.lru.front()).copied()
    }

    fn is_free(&self, id: BlockId) -> bool {
        self.refcount[id as usize] == 0 && self.hash[id as usize].is_none()
    }

    fn num_free(&self) -> usize {
        (0..self.refcount.len() as u32).filter(|&id| self.is_free(id)).count()
    }

    fn num_active(&self) -> usize {
        self.refcount.iter().filter(|&&r| r > 0).count()
    }

    /// Cached copies per hash.
    fn copy_map(&self) -> BTreeMap<u64, usize> {
        let mut m = BTreeMap::new();
        for h in self.hash.iter().flatten() {
            *m.entry(*h).or_default() += 1;
        }
        m
    }

    fn copies(&self, h: u64) -> Vec<BlockId> {
        (0..self.hash.len() as u32).filter(|&id| self.hash[id as usize] == Some(h)).collect()
    }

    fn distinct_hashes(&self) -> usize {
        self.hash.iter().flatten().collect::<BTreeSet<_>>().len()
    }

    /// Drops a block's registration (it was evicted); returns its hash if that was the last
    /// copy, i.e. the hash must be reported as removed.
    fn evict(&mut self, id: BlockId) -> Option<u64> {
        self.lru.retain(|&x| x != id);
        self.leaves.retain(|&x| x != id);
        let h = self.hash[id as usize].take().expect("evicted block was cached");
        let parent = self.parent[id as usize].take();
        for p in &mut self.parent {
            if *p == Some(id) {
                *p = None;
            }
        }
        if let Some(p) = parent.filter(|&p| self.lineage && self.is_leaf(p)) {
            self.leaves.push_back(p);
        }
        if self.copies(h).is_empty() {
            *self.removed.entry(h).or_default() += 1;
            Some(h)
        } else {
            None
        }
    }
}

/// Everything observable about the pool, to show that a failed call changed nothing.
fn snapshot(pool: &BlockPool, model: &Model) -> (usize, usize, usize, usize, Vec<bool>) {
    let contained = watched(model).into_iter().map(|h| pool.contains(h)).collect();
    (pool.num_active(), pool.num_inactive(), pool.num_free(), pool.num_cached_hashes(), contained)
}

/// The pool must agree with the model in every count and in `contains`.
fn check(pool: &BlockPool, model: &Model, reqs: &[Req]) -> Result<(), TestCaseError> {
    pool.check_invariants().map_err(TestCaseError::fail)?;
    prop_assert_eq!(pool.num_active() + pool.num_inactive() + pool.num_free(), pool.capacity());
    prop_assert_eq!(pool.num_active(), model.num_active(), "active blocks");
    prop_assert_eq!(pool.num_inactive(), model.lru.len(), "inactive blocks");
    prop_assert_eq!(pool.num_free(), model.num_free(), "free blocks");
    prop_assert_eq!(pool.num_cached_hashes(), model.distinct_hashes(), "cached hashes");

    // Ownership: a block is owned once per reference, fresh by at most one request, and
    // shared only as a prefix hit of a cached hash; an owned block is never free or in LRU.
    let mut refs = vec![0u32; pool.capacity()];
    let mut fresh_refs = vec![0u32; pool.capacity()];
    for r in reqs {
        for (&id, &hit) in r.owned.iter().zip(&r.via_hit) {
            refs[id as usize] += 1;
            if !hit {
                fresh_refs[id as usize] += 1;
            }
        }
    }
    for id in 0..pool.capacity() {
        prop_assert_eq!(refs[id], model.refcount[id], "refcount of block {}", id);
        prop_assert!(fresh_refs[id] <= 1, "block {} freshly allocated to two owners", id);
        if refs[id] > 1 {
            prop_assert!(model.hash[id].is_some(), "block {} shared but not cached", id);
        }
        if refs[id] > 0 {
            prop_assert!(!model.lru.contains(&(id as u32)), "block {} both in use and evictable", id);
        }
    }

    // The Stored/Removed stream: Removed never runs ahead of Stored, and a hash is resident
    // exactly when its last event is Stored.
    let copies = model.copy_map();
    for h in watched(model) {
        let s = model.stored.get(&h).copied().unwrap_or(0);
        let r = model.removed.get(&h).copied().unwrap_or(0);
        prop_assert!(r <= s && s <= r + 1, "hash {:#x}: {} Stored vs {} Removed", h, s, r);
        prop_assert_eq!(pool.contains(h), s == r + 1, "contains({:#x}) vs event stream", h);
        prop_assert_eq!(pool.contains(h), copies.contains_key(&h));
    }
    Ok(())
}

/// Expected `match_prefix` answer; `active_blocks` is a range when a hash has both active and
/// inactive copies (which copy answers is the pool's choice).
fn expected_match(model: &Model, hashes: &[u64]) -> (usize, usize, usize) {
    let (mut blocks, mut lo, mut hi) = (0, 0, 0);
    for &h in hashes {
        let copies = model.copies(h);
        if copies.is_empty() {
            break;
        }
        blocks += 1;
        let active = copies.iter().filter(|&&id| model.refcount[id as usize] > 0).count();
        if active == copies.len() {
            lo += 1;
        }
        if active > 0 {
            hi += 1;
        }
    }
    (blocks, lo, hi)
}

#[allow(clippy::too_many_arguments)]
fn do_allocate(
    pool: &mut BlockPool,
    model: &mut Model,
    reqs: &mut [Req],
    log: &mut Vec<u64>,
    slot: usize,
    family: u64,
    grow: usize,
    hits: usize,
    use_match: bool,
) -> Result<(), TestCaseError> {
    if reqs[slot].owned.is_empty() {
        reqs[slot].family = family;
    }
    let req_chain = chain(reqs[slot].family);
    let prev = reqs[slot].owned.len();
    let target = (prev + grow).min(CHAIN);
    // Schedulers pass what `match_prefix` found; the test also passes arbitrary prefixes,
    // some of which are not resident (the call must then fail atomically).
    let n_hits = if use_match { pool.match_prefix(&req_chain).blocks } else { hits };
    let hits = &req_chain[..n_hits];

    // Predict the outcome from the model.
    let hit_slice = hits.get(prev..hits.len().min(target)).unwrap_or(&[]);
    let hit_end = prev + hit_slice.len();
    let fresh = target.saturating_sub(hit_end);
    let mut resident = true;
    let (mut inactive_lo, mut inactive_hi) = (0usize, 0usize);
    for &h in hit_slice {
        let copies = model.copies(h);
        if copies.is_empty() {
            resident = false;
            break;
        }
        let inactive = copies.iter().filter(|&&id| model.refcount[id as usize] == 0).count();
        if inactive == copies.len() {
            inactive_lo += 1;
        }
        if inactive > 0 {
            inactive_hi += 1;
        }
    }
    let free_n = model.num_free();
    let shortfall = fresh.saturating_sub(free_n);
    let fits = |inactive_hits: usize| shortfall <= model.lru.len() - inactive_hits;
    let expect: Option<bool> = if target <= prev {
        Some(true)
    } else if !resident {
        Some(false)
    } else if fits(inactive_hi) == fits(inactive_lo) {
        Some(fits(inactive_lo))
    } else {
        None
    };

    let before_snapshot = snapshot(pool, model);
    let before_owned = reqs[slot].owned.clone();
    let log_len = log.len();
    let mut owned = reqs[slot].owned.clone();
    let ok = pool.allocate(&mut owned, target, hits, log);
    if let Some(e) = expect {
        prop_assert_eq!(ok, e, "allocate prev={} target={} hits={:?}", prev, target, hits);
    }
    if !ok {
        prop_assert_eq!(&owned, &before_owned, "failed allocate changed the owned blocks");
        prop_assert_eq!(log.len(), log_len, "failed allocate reported evictions");
        prop_assert_eq!(snapshot(pool, model), before_snapshot, "failed allocate changed the pool");
        return Ok(());
    }
    if target <= prev {
        prop_assert_eq!(&owned, &before_owned);
        prop_assert_eq!(log.len(), log_len);
        return Ok(());
    }
    prop_assert_eq!(owned.len(), target);
    prop_assert_eq!(&owned[..prev], &before_owned[..], "existing blocks kept");

    // Prefix hits: each is a resident copy of its hash and leaves the LRU.
    for (i, &h) in hit_slice.iter().enumerate() {
        let id = owned[prev + i];
        prop_assert_eq!(model.hash[id as usize], Some(h), "hit {} is block {} not cached as {:#x}", i, id, h);
        if model.refcount[id as usize] == 0 {
            model.lru.retain(|&x| x != id);
            model.leaves.retain(|&x| x != id);
        }
        model.refcount[id as usize] += 1;
    }

    // Fresh blocks: free capacity first, then exactly the LRU head (hits already removed);
    // under lineage the oldest leaf each time, a parent joining the leaves as its last child
    // goes.
    let fresh_ids = &owned[hit_end..];
    let distinct: BTreeSet<_> = fresh_ids.iter().collect();
    prop_assert_eq!(distinct.len(), fresh_ids.len(), "a fresh block handed out twice");
    let from_free = fresh_ids.iter().filter(|&&id| model.is_free(id)).count();
    prop_assert_eq!(from_free, fresh.min(free_n), "free capacity is used first");
    let victims: BTreeSet<BlockId> = fresh_ids.iter().copied().filter(|&id| !model.is_free(id)).collect();
    let mut expected_victims = BTreeSet::new();
    let mut expected_removed = Vec::new();
    for _ in 0..shortfall {
        let id = model.next_victim().ok_or_else(|| TestCaseError::fail("allocate evicted too much"))?;
        expected_victims.insert(id);
        expected_removed.extend(model.evict(id));
    }
    prop_assert_eq!(&victims, &expected_victims, "evictions take the LRU head (lineage: oldest leaf)");

    for &id in fresh_ids {
        prop_assert_eq!(model.refcount[id as usize], 0, "fresh block {} already in use", id);
        model.refcount[id as usize] = 1;
    }
    let mut reported = log[log_len..].to_vec();
    for &h in &reported {
        prop_assert!(model.stored.get(&h).copied().unwrap_or(0) > 0, "evicted {:#x} was never stored", h);
        prop_assert!(!pool.contains(h), "evicted {:#x} still resident", h);
    }
    reported.sort_unstable();
    expected_removed.sort_unstable();
    prop_assert_eq!(reported, expected_removed, "evicted hashes = last copies evicted");

    let req = &mut reqs[slot];
    req.via_hit.extend((0..hit_slice.len()).map(|_| true));
    req.via_hit.extend((0..fresh_ids.len()).map(|_| false));
    req.owned = owned;
    Ok(())
}

fn do_register(pool: &mut BlockPool, model: &mut Model, req: &Req, idx: usize) -> Result<(), TestCaseError> {
    let id = req.owned[idx];
    let h = chain_hash(req.family, idx);
    let was_resident = pool.contains(h);
    let parent = idx.checked_sub(1).map(|i| req.owned[i]);
    let visible = pool.register(id, h, parent);
    match model.hash[id as usize] {
        Some(existing) => {
            // Already cached (a prefix hit, or registered before): nothing changes.
            prop_assert!(!visible, "re-registering block {} announced it again", id);
            prop_assert_eq!(existing, h);
        }
        None => {
            prop_assert_eq!(visible, !was_resident, "register returns true exactly for the first copy");
            model.hash[id as usize] = Some(h);
            // The pool records the parent only if it is cached; it then stops being a leaf.
            if let Some(p) = parent.filter(|&p| model.lineage && model.hash[p as usize].is_some()) {
                model.leaves.retain(|&x| x != p);
                model.parent[id as usize] = Some(p);
            }
            if visible {
                *model.stored.entry(h).or_default() += 1;
            }
        }
    }
    prop_assert!(pool.contains(h));
    Ok(())
}

fn do_release(pool: &mut BlockPool, model: &mut Model, req: &mut Req) {
    let mut owned = std::mem::take(&mut req.owned);
    for &id in owned.iter().rev() {
        let rc = &mut model.refcount[id as usize];
        *rc -= 1;
        if *rc == 0 && model.hash[id as usize].is_some() {
            model.lru.push_back(id);
            if model.lineage && model.is_leaf(id) {
                model.leaves.push_back(id);
            }
        }
    }
    pool.release(&mut owned);
    assert!(owned.is_empty(), "release empties the owned vector");
    req.via_hit.clear();
}

fn do_clear(pool: &mut BlockPool, model: &mut Model, log: &mut Vec<u64>) -> Result<(), TestCaseError> {
    let log_len = log.len();
    pool.clear_inactive(log);
    let mut expected = Vec::new();
    while let Some(id) = model.next_victim() {
        expected.extend(model.evict(id));
    }
    let mut reported = log[log_len..].to_vec();
    for &h in &reported {
        prop_assert!(!pool.contains(h));
    }
    reported.sort_unstable();
    expected.sort_unstable();
    prop_assert_eq!(reported, expected);
    prop_assert_eq!(pool.num_inactive(), 0);
    Ok(())
}

fn policy(lineage: bool) -> EvictionPolicy {
    if lineage {
        EvictionPolicy::Lineage
    } else {
        EvictionPolicy::Lru
    }
}

fn run_ops(capacity: usize, policy: EvictionPolicy, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut pool = BlockPool::with_policy(capacity, policy);
    let mut model = Model::new(capacity, policy);
    let mut reqs = vec![Req::default(); SLOTS];
    let mut log = Vec::new();
    check(&pool, &model, &reqs)?;
    for op in ops {
        match *op {
            Op::Allocate { slot, family, grow, hits, use_match } => {
                do_allocate(&mut pool, &mut model, &mut reqs, &mut log, slot, family, grow, hits, use_match)?
            }
            Op::Register { slot, pick } => {
                let req = &reqs[slot];
                if !req.owned.is_empty() {
                    do_register(&mut pool, &mut model, req, pick % req.owned.len())?;
                }
            }
            Op::RegisterAll { slot } => {
                for idx in 0..reqs[slot].owned.len() {
                    do_register(&mut pool, &mut model, &reqs[slot], idx)?;
                }
            }
            Op::Release { slot } => do_release(&mut pool, &mut model, &mut reqs[slot]),
            Op::Match { family, len } => {
                let hashes = &chain(family)[..len];
                let m = pool.match_prefix(hashes);
                let (blocks, lo, hi) = expected_match(&model, hashes);
                prop_assert_eq!(m.blocks, blocks, "match_prefix blocks of {:?}", hashes);
                prop_assert!(
                    (lo..=hi).contains(&m.active_blocks),
                    "match_prefix active {} not in {}..={}",
                    m.active_blocks,
                    lo,
                    hi
                );
            }
            Op::ClearInactive => do_clear(&mut pool, &mut model, &mut log)?,
        }
        check(&pool, &model, &reqs)?;
    }

    // Eventually: once every request is done and the cache is reset, every Stored hash has
    // been matched by exactly one Removed and the whole pool is free again.
    for req in &mut reqs {
        do_release(&mut pool, &mut model, req);
    }
    check(&pool, &model, &reqs)?;
    do_clear(&mut pool, &mut model, &mut log)?;
    check(&pool, &model, &reqs)?;
    prop_assert_eq!(&model.stored, &model.removed, "every Stored matched by a Removed");
    prop_assert_eq!(pool.num_free(), capacity);
    prop_assert_eq!(pool.num_cached_hashes(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_its_model(
        capacity in 1..24usize,
        lineage in any::<bool>(),
        ops in prop::collection::vec(op(FAMILIES), 1..120),
    ) {
        run_ops(capacity, policy(lineage), &ops)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    /// Long runs over many distinct hashes: the pool's bookkeeping of evicted hashes must not
    /// drift however many come and go.
    #[test]
    fn pool_matches_its_model_under_churn(
        capacity in 1..10usize,
        lineage in any::<bool>(),
        ops in prop::collection::vec(churn_op(), 1500..2500),
    ) {
        run_ops(capacity, policy(lineage), &ops)?;
    }
}

#[test]
fn thousands_of_evicted_hashes_leave_no_trace() {
    // Each round computes a fresh 3-block chain on a 3-block pool, evicting the previous
    // round's chain, after reusing its root as a prefix hit half of the time.
    let mut pool = BlockPool::new(3);
    let mut ev = Vec::new();
    let mut prev_chain: Vec<u64> = Vec::new();
    let mut stored = 0usize;
    for round in 0..4000u64 {
        let reuse = round % 2 == 1 && !prev_chain.is_empty();
        let mut chain: Vec<u64> = (0..3).map(|i| (round + 1) << 8 | i).collect();
        let hits: &[u64] = if reuse { &prev_chain[..1] } else { &[] };
        if reuse {
            chain[0] = prev_chain[0];
        }
        assert_eq!(pool.match_prefix(hits).blocks, hits.len(), "round {round}");
        let mut owned = Vec::new();
        let before = ev.len();
        assert!(pool.allocate(&mut owned, 3, hits, &mut ev), "round {round}");
        for (i, &id) in owned.iter().enumerate() {
            if pool.register(id, chain[i], i.checked_sub(1).map(|j| owned[j])) {
                stored += 1;
            }
        }
        pool.release(&mut owned);
        pool.check_invariants().unwrap();
        for h in &ev[before..] {
            assert!(!pool.contains(*h), "round {round}: evicted {h:#x} still resident");
            assert!(!chain.contains(h));
        }
        for &h in &chain {
            assert!(pool.contains(h), "round {round}: {h:#x} just computed");
        }
        for h in prev_chain.iter().filter(|h| !chain.contains(h)) {
            assert!(!pool.contains(*h), "round {round}: previous round's {h:#x} still resident");
            assert_eq!(pool.match_prefix(&[*h]).blocks, 0);
        }
        assert_eq!(pool.num_cached_hashes(), 3);
        assert_eq!(stored - ev.len(), 3, "round {round}: Stored minus Removed = resident");
        prev_chain = chain;
    }
    let mut no_hits = Vec::new();
    pool.clear_inactive(&mut ev);
    assert_eq!(stored, ev.len(), "every Stored eventually Removed");
    assert_eq!(pool.num_cached_hashes(), 0);
    assert!(pool.allocate(&mut no_hits, 3, &[], &mut ev));
    assert_eq!(stored, ev.len());
}

#[test]
fn duplicate_copies_make_match_and_hits_follow_the_resident_copy() {
    // Two requests compute the same block concurrently; the hash stays resident until the
    // last copy goes, and a later request can hit it in between.
    let mut pool = BlockPool::new(3);
    let mut ev = Vec::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    assert!(pool.allocate(&mut a, 1, &[], &mut ev));
    assert!(pool.allocate(&mut b, 1, &[], &mut ev));
    assert!(pool.register(a[0], 5, None));
    assert!(!pool.register(b[0], 5, None));
    pool.release(&mut a);
    assert_eq!(pool.match_prefix(&[5]).blocks, 1);
    // Evict a's copy (the only inactive one) with a fresh allocation of 2 (1 free + 1 evicted).
    let mut c = Vec::new();
    assert!(pool.allocate(&mut c, 2, &[], &mut ev));
    assert!(ev.is_empty(), "b still holds a copy of 5");
    assert_eq!(pool.match_prefix(&[5]), PrefixMatch { blocks: 1, active_blocks: 1 });
    let mut d = Vec::new();
    assert!(pool.allocate(&mut d, 1, &[5], &mut ev));
    assert_eq!(d, b, "the hit reuses the remaining copy");
    pool.check_invariants().unwrap();
}
