//! Property tests of the SGLang backend: the radix cache under random lock / insert /
//! release / evict sequences (tree invariants, lock refs, eviction never takes a locked
//! page, page accounting conserved), and the scheduler over random workloads and tight
//! pools (budgets held every pass, retraction always recovers, every request ends exactly
//! once with its tokens, KV events agree with the cache).

use std::collections::{BTreeMap, BTreeSet};

use mocker_core::config::{Backend, EngineConfig, SglangSchedulePolicy, TimingModelConfig};
use mocker_core::events::KvEventData;
use mocker_core::kv::RadixCache;
use mocker_core::{Engine, EngineOptions, Request};
use proptest::prelude::*;

mod common;
mod radix_ref;

use common::lockstep::Lockstep;

/// Page identity of page `i` of branch `b` in group `g`: the first `shared` pages of a
/// group are common to all its branches (so a hash always has the same parent).
fn page_hash(g: u64, b: u64, i: u64, shared: u64) -> u64 {
    let b = if i < shared { 0 } else { b + 1 };
    (g << 48) | (b << 24) | (i + 1)
}

#[derive(Debug, Clone)]
enum Op {
    /// Lock the resident prefix of a path and allocate private pages for the rest.
    Start { g: u64, b: u64, len: usize },
    /// Insert holder `h`'s pages into the tree.
    Commit(usize),
    /// Holder `h` computes `k` more pages of its path (a decode completing pages), privately
    /// until its next commit: commits then append to the holder's own leaf.
    Grow(usize, usize),
    /// Free holder `h`'s private pages and unlock its path.
    Release(usize),
    /// Evict up to `n` pages.
    Evict(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3u64, 0..4u64, 1..12usize).prop_map(|(g, b, len)| Op::Start { g, b, len }),
        3 => (0..16usize).prop_map(Op::Commit),
        2 => (0..16usize, 1..4usize).prop_map(|(h, k)| Op::Grow(h, k)),
        2 => (0..16usize).prop_map(Op::Release),
        1 => (0..20usize).prop_map(Op::Evict),
    ]
}

struct Holder {
    /// Group and branch of the path, for its later pages.
    g: u64,
    b: u64,
    hashes: Vec<u64>,
    last: Option<u32>,
    /// The same path's handle in the per-page reference cache.
    ref_last: Option<u32>,
    depth: usize,
    private: usize,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The compressed cache under random ops, in lockstep with the per-page reference: same
    /// matches, inserts, locks and counts after every op, and every page it evicts is an
    /// unlocked leaf there (its victims are replayed on the reference, whose own order is
    /// per page while the compressed cache stamps whole nodes).
    #[test]
    fn radix_cache_invariants(total in 4..48usize, shared in 0..5u64, ops in prop::collection::vec(op(), 1..120)) {
        let mut c = RadixCache::new(total, 4);
        let mut r = radix_ref::RadixCache::new(total);
        let mut holders: Vec<Holder> = Vec::new();
        let mut evicted = Vec::new();
        let (mut created, mut ref_created) = (Vec::new(), Vec::new());
        for op in ops {
            match op {
                Op::Start { g, b, len } => {
                    let hashes: Vec<u64> = (0..len as u64).map(|i| page_hash(g, b, i, shared)).collect();
                    prop_assert_eq!(c.match_len(&hashes), r.match_len(&hashes));
                    let (n, last) = c.lock_prefix(&hashes);
                    let (rn, ref_last) = r.lock_prefix(&hashes);
                    prop_assert_eq!(n, rn);
                    let (free, evictable) = (c.free_pages(), c.evictable_pages());
                    let ok = c.allocate(len - n, &mut evicted);
                    prop_assert_eq!(ok, r.allocate_exact(len - n, &evicted).map_err(TestCaseError::fail)?);
                    if ok {
                        holders.push(Holder { g, b, hashes, last, ref_last, depth: n, private: len - n });
                    } else {
                        prop_assert!(len - n > free + evictable, "allocation refused although it fits");
                        prop_assert_eq!((c.free_pages(), c.evictable_pages()), (free, evictable), "failed allocation changed the pool");
                        c.unlock(last);
                        r.unlock(ref_last);
                    }
                }
                Op::Commit(h) if h < holders.len() => {
                    let hd = &mut holders[h];
                    let before = c.free_pages();
                    let ins = c.insert(hd.last, hd.depth, &hd.hashes, &mut created);
                    let rins = r.insert(hd.ref_last, hd.depth, &hd.hashes, &mut ref_created);
                    prop_assert_eq!((ins.depth, ins.freed_duplicates), (rins.depth, rins.freed_duplicates));
                    let moved = ins.depth - hd.depth;
                    prop_assert_eq!(c.free_pages() - before, ins.freed_duplicates, "merged copies are freed");
                    prop_assert!(moved <= hd.private);
                    hd.private -= moved;
                    hd.depth = ins.depth;
                    hd.last = ins.last;
                    hd.ref_last = rins.last;
                }
                Op::Grow(h, k) if h < holders.len() => {
                    let ok = c.allocate(k, &mut evicted);
                    prop_assert_eq!(ok, r.allocate_exact(k, &evicted).map_err(TestCaseError::fail)?);
                    if ok {
                        let hd = &mut holders[h];
                        let len = hd.hashes.len() as u64;
                        hd.hashes.extend((len..len + k as u64).map(|i| page_hash(hd.g, hd.b, i, shared)));
                        hd.private += k;
                    }
                }
                Op::Release(h) if h < holders.len() => {
                    let hd = holders.swap_remove(h);
                    c.free(hd.private);
                    c.unlock(hd.last);
                    r.free(hd.private);
                    r.unlock(hd.ref_last);
                }
                Op::Evict(n) => {
                    evicted.clear();
                    let (free, evictable) = (c.free_pages(), c.evictable_pages());
                    c.evict(n, &mut evicted);
                    r.evict_exact(&evicted).map_err(TestCaseError::fail)?;
                    prop_assert_eq!(evicted.len(), n.min(evictable), "evicts what it can, no more");
                    prop_assert_eq!(c.free_pages(), free + evicted.len());
                }
                _ => {}
            }
            prop_assert_eq!(&created, &ref_created);
            prop_assert_eq!(
                (c.free_pages(), c.tree_pages(), c.evictable_pages()),
                (r.free_pages(), r.tree_pages(), r.evictable_pages())
            );
            prop_assert!(c.node_count() <= c.tree_pages());
            // Locked paths are resident and locked: eviction never took one of their pages.
            for hd in &holders {
                for h in &hd.hashes[..hd.depth] {
                    prop_assert!(c.lock_ref(*h).is_some_and(|r| r >= 1), "locked page {:#x} missing or unlocked", h);
                    prop_assert_eq!(c.lock_ref(*h), r.lock_ref(*h), "lock ref of {:#x}", h);
                }
            }
            for h in &evicted {
                prop_assert!(!c.contains(*h));
            }
            evicted.clear();
            created.clear();
            ref_created.clear();
            let private: usize = holders.iter().map(|h| h.private).sum();
            c.check_invariants(private).map_err(TestCaseError::fail)?;
            r.check_invariants(private).map_err(TestCaseError::fail)?;
        }
        for hd in holders.drain(..) {
            c.free(hd.private);
            c.unlock(hd.last);
            r.free(hd.private);
            r.unlock(hd.ref_last);
        }
        c.check_invariants(0).map_err(TestCaseError::fail)?;
        prop_assert_eq!(c.evictable_pages(), c.tree_pages(), "all unlocked at the end");
        prop_assert!(c.clear(&mut evicted));
        r.evict_exact(&evicted).map_err(TestCaseError::fail)?;
        prop_assert_eq!(r.tree_pages(), 0, "clear left pages behind");
        prop_assert_eq!(c.free_pages(), total);
    }
}

#[derive(Debug, Clone)]
struct Spec {
    prompt: usize,
    output: usize,
    arrival: usize,
    group: Option<(u32, usize)>,
}

fn spec() -> impl Strategy<Value = Spec> {
    let prompt = prop_oneof![3 => 1..48usize, 2 => 1..200usize, 1 => 1..600usize];
    let arrival = prop_oneof![2 => Just(0usize), 3 => 0..60usize];
    let group = prop::option::weighted(0.6, (0..3u32, 0..600usize));
    (prompt, 1..80usize, arrival, group).prop_map(|(prompt, output, arrival, group)| Spec {
        prompt,
        output,
        arrival,
        group: group.map(|(g, n)| (g, n.min(prompt))),
    })
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        prop::sample::select(vec![1usize, 2, 4, 16, 64]),
        8..160usize,
        1..16usize,
        prop::bool::weighted(0.8),
        prop_oneof![Just(SglangSchedulePolicy::Fifo), Just(SglangSchedulePolicy::Lpm)],
        (1..8usize, 1..8usize, prop::sample::select(vec![1usize, 8, 64, 4096])),
        prop::sample::select(vec![0.0, 0.3, 1.0, 2.5]),
        prop_oneof![
            Just(TimingModelConfig::Polynomial),
            Just(TimingModelConfig::Fixed { prefill_ms: 5.0, decode_ms: 1.0 })
        ],
    )
        .prop_map(
            |(page, blocks, seqs, caching, policy, (chunk_pages, prefill_pages, clip), cons, timing)| {
                let mut c = EngineConfig {
                    backend: Backend::Sglang,
                    block_size: page,
                    num_gpu_blocks: blocks,
                    ..Default::default()
                };
                c.max_num_seqs = seqs;
                c.enable_prefix_caching = caching;
                c.sglang.schedule_policy = policy;
                c.sglang.chunked_prefill_size = chunk_pages * page * 4;
                c.sglang.max_prefill_tokens = prefill_pages * page * 4;
                c.sglang.clip_max_new_tokens = clip;
                c.sglang.schedule_conservativeness = cons;
                c.timing_model = timing;
                c
            },
        )
}

fn tokens(i: usize, s: &Spec) -> Vec<u32> {
    (0..s.prompt)
        .map(|p| match s.group {
            Some((g, n)) if p < n => 1 + g * 10_000 + p as u32,
            _ => 1_000_000 + (i as u32) * 1000 + p as u32,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn scheduler_holds_budgets_and_drains(config in config(), specs in prop::collection::vec(spec(), 1..24)) {
        let total_tokens = config.num_gpu_blocks * config.block_size;
        let page = config.block_size;
        let (max_seqs, chunk, max_prefill) =
            (config.max_num_seqs, config.sglang.chunked_prefill_size, config.sglang.max_prefill_tokens);
        // The scheduler clamps the chunk budget to whole pages within max_prefill_tokens.
        let chunk = chunk.min(max_prefill / page * page).max(page);
        let max_prefill = max_prefill.max(chunk);
        let caching = config.enable_prefix_caching;
        let mut e = Engine::new(EngineOptions { config, record_kv_events: true, ..Default::default() }).unwrap();
        let mut tokens_seen: BTreeMap<u128, usize> = BTreeMap::new();
        let mut ended: BTreeSet<u128> = BTreeSet::new();
        let mut live_hashes: BTreeSet<u64> = BTreeSet::new();
        let mut next_event = 0u64;
        let mut now = 0u64;
        let mut pass_no = 0usize;
        let mut submitted = 0;
        loop {
            for (i, s) in specs.iter().enumerate().filter(|(_, s)| s.arrival == pass_no) {
                e.submit(Request { uuid: i as u128 + 1, tokens: tokens(i, s), max_output_tokens: s.output, ..Default::default() }).unwrap();
                submitted += 1;
            }
            if !e.has_work() {
                if submitted == specs.len() { break; }
                pass_no += 1;
                continue;
            }
            let pass = e.step(now);
            let m = pass.metrics;
            prop_assert!(m.sum_prefill_tokens <= chunk && m.sum_prefill_tokens <= max_prefill, "prefill budget: {:?}", m);
            prop_assert!(m.num_prefill_requests == 0 || m.num_decode_requests == 0, "no mixed batches");
            prop_assert!(pass.had_effect(), "effect-free pass {} (engine stuck)", pass_no);
            for o in pass.all_outputs() {
                prop_assert!(!ended.contains(&o.uuid), "output after the end of {}", o.uuid);
                if o.has_token() {
                    let n = tokens_seen.entry(o.uuid).or_default();
                    prop_assert_eq!(o.index as usize, *n, "token index");
                    *n += 1;
                }
                if o.completed {
                    ended.insert(o.uuid);
                    let s = &specs[(o.uuid - 1) as usize];
                    if o.rejected {
                        let need = s.prompt.div_ceil(page) * page;
                        prop_assert!(need + s.output >= total_tokens || (s.prompt + s.output).div_ceil(page) * page > total_tokens,
                            "rejected a request that fits: {:?}", s);
                    } else {
                        prop_assert_eq!(tokens_seen.get(&o.uuid).copied().unwrap_or(0), s.output);
                    }
                }
            }
            for ev in &pass.kv_events {
                prop_assert_eq!(ev.event_id, next_event);
                next_event += 1;
                match &ev.data {
                    KvEventData::Stored { blocks, .. } => {
                        for b in blocks {
                            prop_assert!(live_hashes.insert(b.block_hash), "stored twice: {:#x}", b.block_hash);
                        }
                    }
                    KvEventData::Removed { block_hashes } => {
                        for h in block_hashes {
                            prop_assert!(live_hashes.remove(h), "removed unknown {:#x}", h);
                        }
                    }
                    KvEventData::Cleared => live_hashes.clear(),
                }
            }
            now = pass.end_ns;
            prop_assert!(e.metrics().running_requests <= max_seqs);
            e.check_invariants().map_err(TestCaseError::fail)?;
            for h in &live_hashes {
                prop_assert!(e.is_cached(*h), "event stream says {:#x} is cached", h);
            }
            pass_no += 1;
            prop_assert!(pass_no < 50_000, "does not drain");
        }
        prop_assert_eq!(ended.len(), specs.len(), "every request ended once");
        prop_assert!(caching || live_hashes.is_empty());
        let r = e.radix().unwrap();
        prop_assert_eq!(r.free_pages() + r.tree_pages(), r.total_pages(), "all private pages returned");
        prop_assert_eq!(r.evictable_pages(), r.tree_pages(), "nothing locked after draining");
        prop_assert_eq!(r.tree_pages(), live_hashes.len(), "events describe the tree");
    }
}

/// Runs `specs` on the SGLang engines of a [`Lockstep`] (plain, counting steady tokens,
/// opaque output blocks), cancelling request `cancel.1` before pass `cancel.0` on all;
/// every pass must match: times, non-steady outputs, steady count and gap, admissions,
/// KV events, pass and engine metrics, invariants. Returns the steady tokens counted.
fn run_optimised_beside_plain(
    config: EngineConfig,
    specs: &[Spec],
    cancel: (usize, usize),
) -> Result<usize, TestCaseError> {
    let mut pair = Lockstep::new(&config);
    let (mut now, mut pass_no, mut submitted) = (0u64, 0usize, 0usize);
    let mut counted = 0usize;
    loop {
        for (i, s) in specs.iter().enumerate().filter(|(_, s)| s.arrival == pass_no) {
            let request = Request {
                uuid: i as u128 + 1,
                tokens: tokens(i, s),
                max_output_tokens: s.output,
                ..Default::default()
            };
            pair.submit(request, None)?;
            submitted += 1;
        }
        if pass_no == cancel.0 {
            pair.cancel(cancel.1 as u128 + 1)?;
        }
        if !pair.has_work()? {
            if submitted == specs.len() {
                break;
            }
            pass_no += 1;
            continue;
        }
        let (end, steady) = pair.step(now, pass_no)?;
        counted += steady;
        now = end;
        pass_no += 1;
        prop_assert!(pass_no < 50_000, "does not drain");
    }
    prop_assert_eq!(pair.aggregated.num_requests(), 0);
    Ok(counted)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Counting steady tokens and opaque identities for generated blocks are optimisations
    /// only: the engine steps exactly as the plain one, including under retraction, chunked
    /// prefill, lpm and cancels.
    #[test]
    fn counted_steady_tokens_and_opaque_output_blocks_step_like_the_plain_engine(
        config in config(),
        // Any page size 1..=64 (not only powers of two), and half the pools small.
        page in prop_oneof![Just(None), (1..=64usize).prop_map(Some)],
        small in any::<bool>(),
        specs in prop::collection::vec(spec(), 1..32),
        cancel in (0..300usize, 0..32usize),
    ) {
        let mut config = config;
        if let Some(p) = page {
            let pages = config.sglang.chunked_prefill_size / config.block_size;
            config.sglang.chunked_prefill_size = pages * p;
            config.sglang.max_prefill_tokens = config.sglang.max_prefill_tokens / config.block_size * p;
            config.block_size = p;
        }
        if !small {
            config.num_gpu_blocks *= 8;
        }
        run_optimised_beside_plain(config, &specs, cancel)?;
    }
}

/// The lockstep property above is only meaningful if steady runs occur in it.
#[test]
fn lockstep_cases_count_steady_tokens() {
    let mut config =
        EngineConfig { backend: Backend::Sglang, block_size: 16, num_gpu_blocks: 400, ..Default::default() };
    config.max_num_seqs = 8;
    let specs: Vec<Spec> =
        (0..8).map(|i| Spec { prompt: 40 + i * 7, output: 60, arrival: i, group: None }).collect();
    let counted = run_optimised_beside_plain(config, &specs, (usize::MAX, 0)).unwrap();
    assert!(counted > 0, "no steady run counted");
}
