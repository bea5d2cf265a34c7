//! Unit tests of the block pool (LRU and lineage policies).
use super::*;

#[test]
fn fresh_allocation_prefers_free_then_evicts_oldest_release() {
    let mut pool = BlockPool::new(4);
    let mut ev = Vec::new();
    let mut a = Vec::new();
    assert!(pool.allocate(&mut a, 2, &[], &mut ev));
    assert!(pool.register(a[0], 10, None));
    assert!(pool.register(a[1], 11, None));
    let mut b = Vec::new();
    assert!(pool.allocate(&mut b, 2, &[], &mut ev));
    pool.register(b[0], 20, None);
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
        pool.register(id, 100 + i as u64, None);
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
    assert!(pool.register(a[0], 7, None));
    assert!(!pool.register(b[0], 7, None), "second copy is not announced");
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

/// Registers `owned` under `hashes` the way the scheduler does: each block's parent is
/// the block before it in the request.
fn register_chain(pool: &mut BlockPool, owned: &[BlockId], hashes: &[u64]) {
    for (i, (&id, &h)) in owned.iter().zip(hashes).enumerate() {
        pool.register(id, h, i.checked_sub(1).map(|j| owned[j]));
    }
}

/// A request computing the chain `hashes` from scratch (or reusing its first `hits`).
fn compute(pool: &mut BlockPool, hashes: &[u64], hits: usize, ev: &mut Vec<u64>) -> Vec<BlockId> {
    let mut owned = Vec::new();
    assert!(pool.allocate(&mut owned, hashes.len(), &hashes[..hits], ev));
    register_chain(pool, &owned, hashes);
    owned
}

/// Evicts one block through `allocate` and returns its hash, checking on the way that a
/// block with cached children goes only when no leaf exists.
fn evict_one(pool: &mut BlockPool, sink: &mut Vec<BlockId>) -> u64 {
    assert_eq!(pool.num_free(), 0);
    let had_leaf = pool.leaf_head != NIL;
    let before: Vec<(u64, bool)> = (0..pool.capacity())
        .map(|i| (pool.blocks[i].hash, pool.lineage.get(i).is_some_and(|n| n.first_child != NIL)))
        .collect();
    let mut ev = Vec::new();
    let n = sink.len();
    assert!(pool.allocate(sink, n + 1, &[], &mut ev));
    let (hash, had_children) = before[sink[n] as usize];
    assert!(!(had_leaf && had_children), "evicted {hash:#x} with cached children while a leaf existed");
    pool.check_invariants().unwrap();
    hash
}

#[test]
fn lineage_evicts_each_requests_leaf_before_any_parent() {
    // Two independent chains released one after the other. LRU eats the first request's
    // chain tail to root; lineage takes both leaves before any parent, which joins the
    // leaf list only when its child goes.
    for (policy, want) in
        [(EvictionPolicy::Lru, [12, 11, 10, 21, 20]), (EvictionPolicy::Lineage, [12, 21, 11, 20, 10])]
    {
        let mut pool = BlockPool::with_policy(5, policy);
        let mut ev = Vec::new();
        let mut a = compute(&mut pool, &[10, 11, 12], 0, &mut ev);
        let mut b = compute(&mut pool, &[20, 21], 0, &mut ev);
        pool.release(&mut a);
        pool.release(&mut b);
        pool.check_invariants().unwrap();
        let mut sink = Vec::new();
        let got: Vec<u64> = (0..5).map(|_| evict_one(&mut pool, &mut sink)).collect();
        assert_eq!(got, want, "{policy}");
    }
}

#[test]
fn lineage_parent_becomes_evictable_after_its_children() {
    // a0 has two cached children (a1, and b1 of a request that reused a0) and outlives a
    // later, unrelated d0; LRU would evict a0 right after its children.
    for (policy, want) in
        [(EvictionPolicy::Lru, [11, 21, 10, 30]), (EvictionPolicy::Lineage, [11, 21, 30, 10])]
    {
        let mut pool = BlockPool::with_policy(4, policy);
        let mut ev = Vec::new();
        let mut a = compute(&mut pool, &[10, 11], 0, &mut ev);
        let mut b = compute(&mut pool, &[10, 21], 1, &mut ev);
        assert_eq!(a[0], b[0], "b reuses a's root");
        pool.release(&mut a);
        pool.release(&mut b);
        let mut d = compute(&mut pool, &[30], 0, &mut ev);
        pool.release(&mut d);
        assert_eq!(pool.num_inactive(), 4);
        let mut sink = Vec::new();
        let got: Vec<u64> = (0..4).map(|_| evict_one(&mut pool, &mut sink)).collect();
        assert_eq!(got, want, "{policy}");
        if policy == EvictionPolicy::Lineage {
            assert!(pool.lineage.iter().all(|n| *n == Lineage::NONE));
        }
    }
}

#[test]
fn lineage_hit_pins_a_leaf_and_release_reinstates_it_at_the_tail() {
    let mut pool = BlockPool::with_policy(3, EvictionPolicy::Lineage);
    let mut ev = Vec::new();
    let mut a = compute(&mut pool, &[10], 0, &mut ev);
    let mut b = compute(&mut pool, &[20], 0, &mut ev);
    pool.release(&mut a);
    pool.release(&mut b);
    // Reusing 10 takes it off the leaf list; releasing it again puts it behind 20.
    let mut c = compute(&mut pool, &[10], 1, &mut ev);
    pool.check_invariants().unwrap();
    pool.release(&mut c);
    let mut d = compute(&mut pool, &[30], 0, &mut ev);
    let mut sink = Vec::new();
    assert_eq!(evict_one(&mut pool, &mut sink), 20);
    assert_eq!(evict_one(&mut pool, &mut sink), 10);
    pool.release(&mut d);
    pool.release(&mut sink);
    pool.clear_inactive(&mut ev);
    assert_eq!(ev, vec![30]);
    assert_eq!(pool.num_free(), 3);
    pool.check_invariants().unwrap();
}

#[test]
fn lineage_falls_back_when_a_cross_copy_hit_holds_the_only_child() {
    // x and y compute the same two blocks concurrently and register in an interleaved
    // order, so x0 and y1 are the primaries. A later hit of both pins x0 and y1: y0 is
    // inactive, but its child y1 is referenced, so it can never become a leaf.
    let mut pool = BlockPool::with_policy(4, EvictionPolicy::Lineage);
    let mut ev = Vec::new();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    assert!(pool.allocate(&mut x, 2, &[], &mut ev));
    assert!(pool.allocate(&mut y, 2, &[], &mut ev));
    assert!(pool.register(x[0], 10, None));
    assert!(!pool.register(y[0], 10, None));
    assert!(pool.register(y[1], 11, Some(y[0])));
    assert!(!pool.register(x[1], 11, Some(x[0])));
    let (x0, y0, y1) = (x[0], y[0], y[1]);
    pool.release(&mut x);
    pool.release(&mut y);
    pool.check_invariants().unwrap();
    let mut d = Vec::new();
    assert!(pool.allocate(&mut d, 2, &[10, 11], &mut ev));
    assert_eq!(d, vec![x0, y1]);
    assert_eq!(pool.num_inactive(), 2, "x1 (a leaf) and y0 (a parent of a referenced block)");
    assert_eq!(pool.leaf_head, pool.leaf_tail);
    pool.check_invariants().unwrap();
    // Both inactive blocks count as evictable, and both are evicted.
    assert!(pool.allocate(&mut d, 4, &[10, 11], &mut ev));
    assert!(ev.is_empty(), "only duplicates went");
    assert!(!d[2..].contains(&x0) && d[2..].contains(&y0));
    assert_eq!(pool.lineage[y1 as usize].parent, NIL, "y1 orphaned");
    pool.check_invariants().unwrap();
    pool.release(&mut d);
    pool.check_invariants().unwrap();
    pool.clear_inactive(&mut ev);
    ev.sort_unstable();
    assert_eq!(ev, vec![10, 11]);
    pool.check_invariants().unwrap();
}

#[test]
fn lineage_check_invariants_verifies_the_leaf_list() {
    let build = || {
        let mut pool = BlockPool::with_policy(4, EvictionPolicy::Lineage);
        let mut ev = Vec::new();
        let mut a = compute(&mut pool, &[10, 11], 0, &mut ev);
        let mut b = compute(&mut pool, &[20], 0, &mut ev);
        pool.release(&mut a);
        pool.release(&mut b);
        pool.check_invariants().unwrap();
        let ids = a_ids(&pool);
        (pool, ids)
    };
    // Block ids by hash: 10 -> 0, 11 -> 1, 20 -> 2; leaves are 1 and 2.
    fn a_ids(pool: &BlockPool) -> [BlockId; 3] {
        let id = |h| pool.resident(h).unwrap();
        [id(10), id(11), id(20)]
    }
    let (mut pool, [root, leaf, other]) = build();
    pool.leaf_unlink(leaf);
    let e = pool.check_invariants().unwrap_err();
    assert!(e.contains("missing from the leaf list"), "{e}");

    let (mut pool, _) = build();
    pool.leaf_push_tail(root);
    let e = pool.check_invariants().unwrap_err();
    assert!(e.contains("not an inactive leaf"), "{e}");

    let (mut pool, _) = build();
    pool.leaf_push_tail(other);
    let e = pool.check_invariants().unwrap_err();
    assert!(e.contains("leaf list broken"), "{e}");

    let (mut pool, _) = build();
    pool.lineage[leaf as usize].parent = NIL;
    let e = pool.check_invariants().unwrap_err();
    assert!(e.contains("child list"), "{e}");

    // Lru keeps no lineage state at all.
    let mut pool = BlockPool::new(2);
    let mut ev = Vec::new();
    let mut a = compute(&mut pool, &[10, 11], 0, &mut ev);
    assert!(pool.lineage.is_empty());
    pool.release(&mut a);
    assert_eq!((pool.leaf_head, pool.lineage.len()), (NIL, 0));
    pool.check_invariants().unwrap();
}

/// A private block is cached in LRU order like any other but cannot be hit and is never
/// reported; once published (its request preempted) it can be hit, and still goes quietly.
#[test]
fn private_blocks_are_invisible_until_published_and_never_reported() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::Lineage] {
        let mut pool = BlockPool::with_policy(3, policy);
        let mut ev = Vec::new();
        let mut a = Vec::new();
        assert!(pool.allocate(&mut a, 3, &[], &mut ev));
        assert!(pool.register_in(a[0], 1, None, Scope::Shared));
        assert!(!pool.register_in(a[1], 2, Some(a[0]), Scope::Private));
        assert!(!pool.register_in(a[2], 3, Some(a[1]), Scope::Private));
        assert_eq!(pool.match_prefix(&[1, 2, 3]).blocks, 1, "private blocks cannot be hit");
        assert_eq!(pool.num_cached_hashes(), 1);
        pool.publish(a[1]);
        assert_eq!(pool.match_prefix(&[1, 2, 3]).blocks, 2, "a published block can");
        pool.check_invariants().unwrap();
        pool.release(&mut a);
        assert_eq!(pool.num_inactive(), 3, "private blocks stay cached until evicted");
        let mut b = Vec::new();
        assert!(pool.allocate(&mut b, 3, &[], &mut ev));
        assert_eq!(ev, vec![1], "{policy:?}: only the shared block's eviction is reported");
        assert_eq!(pool.num_cached_hashes(), 0);
        pool.check_invariants().unwrap();
    }
}

/// Blocks a match found are trusted only while they still hold their hashes: once evicted
/// and reused for other content, the allocation looks the hashes up (and misses).
#[test]
fn matched_blocks_are_checked_before_they_are_pinned() {
    let mut pool = BlockPool::new(2);
    let mut ev = Vec::new();
    let mut a = Vec::new();
    assert!(pool.allocate(&mut a, 2, &[], &mut ev));
    pool.register(a[0], 1, None);
    pool.register(a[1], 2, Some(a[0]));
    pool.release(&mut a);
    let mut matched = Vec::new();
    assert_eq!(pool.match_prefix_into(&[1, 2], &mut matched).blocks, 2);
    let mut fresh = Vec::new();
    let mut b = Vec::new();
    assert!(pool.allocate_matched(&mut b, 1, &[1], &matched, &mut ev), "a still valid match");
    assert_eq!(b, vec![matched[0]]);
    pool.release(&mut b);
    // Both blocks evicted and registered again under other hashes.
    assert!(pool.allocate(&mut fresh, 2, &[], &mut ev));
    pool.register(fresh[0], 7, None);
    pool.register(fresh[1], 8, Some(fresh[0]));
    pool.release(&mut fresh);
    let mut c = Vec::new();
    assert!(!pool.allocate_matched(&mut c, 2, &[1, 2], &matched, &mut ev), "stale matches are not hits");
    assert!(c.is_empty());
    pool.check_invariants().unwrap();
}

#[test]
fn index_grows_and_churns_past_its_initial_size_with_buckets_kept() {
    // The index starts with room for 1024 entries: filling a 6000-block pool makes it grow,
    // and evicting through it three times over leaves tombstones that force rehashes in
    // place. Every primary must still record its bucket and every cached hash be found.
    let chain = |r: u64| -> Vec<u64> {
        // Every third request shares the previous one's first half (hits, then copies).
        let base = if r % 3 == 2 { r - 1 } else { r };
        (0..100).map(|i| if i < 50 { (base << 32) | i } else { (r << 32) | i }).collect()
    };
    for policy in [EvictionPolicy::Lru, EvictionPolicy::Lineage] {
        let mut pool = BlockPool::with_policy(6000, policy);
        let mut ev = Vec::new();
        let mut held: Vec<Vec<BlockId>> = Vec::new();
        for r in 0..180u64 {
            let hashes = chain(r);
            let hits = pool.match_prefix(&hashes).blocks;
            assert_eq!(hits, if r % 3 == 2 { 50 } else { 0 }, "request {r} under {policy:?}");
            held.push(compute(&mut pool, &hashes, hits, &mut ev));
            if r == 29 {
                // Nothing evicted yet: 30 chains, 10 of them sharing half of another.
                assert!(ev.is_empty());
                assert_eq!(pool.num_cached_hashes(), 30 * 100 - 10 * 50);
                pool.check_invariants().unwrap();
            }
            // Requests finish two behind, so each third one hits an active prefix.
            if held.len() > 2 {
                pool.release(&mut held.remove(0));
            }
        }
        held.iter_mut().for_each(|o| pool.release(o));
        pool.check_invariants().unwrap();
        // Every registered block is found through the index, once per distinct hash.
        let mut resident: Vec<u64> = pool.blocks.iter().filter(|b| b.registered).map(|b| b.hash).collect();
        assert!(resident.iter().all(|&h| pool.contains(h)));
        resident.sort_unstable();
        resident.dedup();
        assert_eq!(pool.num_cached_hashes(), resident.len());
        assert!(resident.len() > 5000, "the pool is full of cached blocks");
        if policy == EvictionPolicy::Lru {
            // The last chains were released last: the newest 55 are whole.
            for r in 125..180u64 {
                assert_eq!(pool.match_prefix(&chain(r)).blocks, 100, "chain {r}");
            }
            assert!(!pool.contains(chain(0)[0]), "the oldest chain was evicted");
        }
    }
}

/// LRU eviction against a model of the order (a list of inactive block ids, oldest first,
/// a LIFO free list and ids created in order): under random requests over prefix-sharing
/// chains, every fresh block is the one the model names, and a failed allocation is one
/// the model could not supply. Prefix hits pin inactive blocks in the middle of the
/// order, the queue's stale entries.
#[test]
fn lru_eviction_order_matches_a_list_model() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    for capacity in [8usize, 40] {
        let mut rng = StdRng::seed_from_u64(capacity as u64);
        let mut pool = BlockPool::new(capacity);
        let (mut lru, mut free, mut created) = (Vec::<BlockId>::new(), Vec::<BlockId>::new(), 0u32);
        let mut refs: HashMap<BlockId, u32> = HashMap::new();
        let mut registered: HashMap<BlockId, bool> = HashMap::new();
        let mut live: Vec<Vec<BlockId>> = Vec::new();
        let mut ev = Vec::new();
        for step in 0..20_000 {
            if !live.is_empty() && (live.len() > 5 || rng.random_bool(0.45)) {
                let mut blocks = live.swap_remove(rng.random_range(0..live.len()));
                for &id in blocks.iter().rev() {
                    let r = refs.get_mut(&id).unwrap();
                    *r -= 1;
                    if *r == 0 {
                        if registered[&id] {
                            lru.push(id);
                        } else {
                            free.push(id);
                        }
                    }
                }
                pool.release(&mut blocks);
            } else {
                let family = rng.random_range(0..6u64);
                let hashes: Vec<u64> = (0..rng.random_range(1..7u64)).map(|k| family << 8 | k).collect();
                let mut matched = Vec::new();
                let hits = pool.match_prefix_into(&hashes, &mut matched).blocks;
                let fresh = hashes.len() - hits;
                let inactive_hits = matched.iter().filter(|id| refs[id] == 0).count();
                let supply = free.len() + (capacity - created as usize) + lru.len() - inactive_hits;
                let mut owned = Vec::new();
                let ok = pool.allocate_matched(&mut owned, hashes.len(), &hashes[..hits], &matched, &mut ev);
                assert_eq!(ok, fresh <= supply, "capacity {capacity}, step {step}");
                if !ok {
                    continue;
                }
                for &id in &matched {
                    let r = refs.get_mut(&id).unwrap();
                    if *r == 0 {
                        lru.retain(|&x| x != id);
                    }
                    *r += 1;
                }
                for &got in &owned[hits..] {
                    let want = free.pop().unwrap_or_else(|| {
                        if (created as usize) < capacity {
                            created += 1;
                            created - 1
                        } else {
                            lru.remove(0)
                        }
                    });
                    assert_eq!(got, want, "capacity {capacity}, step {step}");
                    refs.insert(got, 1);
                    registered.insert(got, false);
                }
                // The last block stays unregistered now and then (a partial block).
                let computed = if rng.random_bool(0.2) { hashes.len() - 1 } else { hashes.len() };
                for k in hits..computed {
                    pool.register(owned[k], hashes[k], k.checked_sub(1).map(|j| owned[j]));
                    registered.insert(owned[k], true);
                }
                live.push(owned);
            }
            if step % 256 == 0 {
                pool.check_invariants().unwrap();
            }
        }
    }
}

/// Hits that pin and re-release the same cached blocks pile up stale queue entries until
/// they outnumber the live ones and are dropped at once: the order stays the release order.
#[test]
fn stale_queue_entries_are_dropped_without_changing_the_order() {
    let mut pool = BlockPool::new(4);
    let mut ev = Vec::new();
    let mut a = compute(&mut pool, &[1, 2], 0, &mut ev);
    pool.release(&mut a); // order: 2, 1
    let mut b = compute(&mut pool, &[9], 0, &mut ev);
    pool.release(&mut b); // order: 2, 1, 9
    for _ in 0..3_000 {
        let mut owned = Vec::new();
        assert!(pool.allocate(&mut owned, 1, &[2], &mut ev));
        pool.release(&mut owned); // 2 moves to the tail: 1, 9, 2
    }
    assert!(pool.lru.len() < 2_000, "stale entries were dropped ({} queued)", pool.lru.len());
    pool.check_invariants().unwrap();
    let mut c = Vec::new();
    assert!(pool.allocate(&mut c, 4, &[], &mut ev));
    assert_eq!(ev, vec![1, 9, 2]);
}

/// Queue positions wrap around (after four billion releases): the order and the stale
/// entries' staleness survive it, through a compaction too.
#[test]
fn lru_order_survives_positions_wrapping() {
    let mut pool = BlockPool::new(4);
    pool.lru_front_pos = u32::MAX - 2;
    let mut ev = Vec::new();
    let mut a = compute(&mut pool, &[1, 2], 0, &mut ev);
    pool.release(&mut a); // order: 2, 1
    let mut b = compute(&mut pool, &[9], 0, &mut ev);
    pool.release(&mut b); // order: 2, 1, 9 (positions MAX - 2, MAX - 1, MAX)
    for _ in 0..1_500 {
        let mut hit = Vec::new();
        assert!(pool.allocate(&mut hit, 1, &[2], &mut ev)); // 2's entry goes stale
        pool.release(&mut hit); // past the wrap, then compacted: 1, 9, 2
    }
    assert!(pool.lru.len() < 1_500, "stale entries were dropped ({} queued)", pool.lru.len());
    pool.check_invariants().unwrap();
    let mut c = Vec::new();
    assert!(pool.allocate(&mut c, 4, &[], &mut ev));
    assert_eq!(ev, vec![1, 9, 2]);
}
