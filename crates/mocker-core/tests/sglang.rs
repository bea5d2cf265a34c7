//! SGLang backend behaviour, pinned to figures measured on the reference (ai-dynamo-runtime
//! 1.6.1, offline synthetic replay, single worker, polynomial timing).

mod common;

use common::{closed_loop, config, engine, prompt};
use mocker_core::{Engine, EngineOptions};

fn assert_close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() <= tol * want.abs().max(1e-9), "{what}: got {got}, reference {want}");
}

/// Reference case C: default SGLang page size 1 ⇒ a 16384-token pool; 3 retractions.
#[test]
fn tight_default_pool_with_retractions_matches_reference() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang"}}"#));
    let r = closed_loop(&mut e, 100, 16, 100, |i| prompt(i, 1000, 0, 0));
    assert_eq!((r.completed, r.rejected), (100, 0));
    assert_close(r.duration_ms, 25463.360703, 1e-6, "duration");
    assert_close(r.mean_ttft_ms, 539.568434, 1e-6, "mean ttft");
    assert_close(r.mean_itl_ms, 34.725458, 1e-6, "mean itl");
    assert_eq!(e.metrics().num_preemptions_total, 3, "retractions");
    e.check_invariants().unwrap();
}

/// Reference case H: a pool large enough that nothing is retracted.
#[test]
fn roomy_pool_matches_reference() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","num_gpu_blocks":1048576}}"#));
    let r = closed_loop(&mut e, 100, 16, 100, |i| prompt(i, 1000, 0, 0));
    assert_close(r.duration_ms, 6572.123409, 1e-6, "duration");
    assert_close(r.mean_ttft_ms, 242.833427, 1e-6, "mean ttft");
    assert_close(r.mean_itl_ms, 7.352257, 1e-6, "mean itl");
    assert_eq!(e.metrics().num_preemptions_total, 0);
}

/// Reference case G: long outputs on a 32768-token pool.
#[test]
fn long_outputs_pool_matches_reference() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","num_gpu_blocks":32768}}"#));
    let r = closed_loop(&mut e, 64, 32, 500, |i| prompt(i, 2000, 0, 0));
    assert_close(r.duration_ms, 85083.759348, 1e-6, "duration");
    assert_close(r.mean_ttft_ms, 17021.844771, 1e-6, "mean ttft");
    assert_close(r.mean_itl_ms, 35.928875, 1e-6, "mean itl");
    e.check_invariants().unwrap();
}

fn req(uuid: u128, tokens: Vec<u32>, osl: usize) -> mocker_core::Request {
    mocker_core::Request { uuid, tokens, max_output_tokens: osl, ..Default::default() }
}

/// Requests sharing a prefix computed in the same prefill batch: the later insert merges
/// the duplicate pages (freeing the copies) and page bookkeeping stays conserved.
#[test]
fn duplicate_prefixes_in_one_batch_are_merged() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":64}}"#));
    for i in 0..3 {
        e.submit(req(i + 1, prompt(i as usize, 100, 64, 7), 20)).unwrap();
    }
    let mut now = 0;
    let mut passes = 0;
    while e.has_work() {
        let pass = e.step(now);
        now = pass.end_ns;
        e.check_invariants().unwrap();
        let radix = e.radix().unwrap();
        if passes == 0 {
            // 3 × 7 prompt pages were allocated; the first tokens merged 2 × 4 shared pages.
            assert_eq!(radix.free_pages(), 64 - 3 * 7 + 2 * 4, "duplicate copies freed");
        }
        passes += 1;
        assert!(passes < 1000);
    }
    let radix = e.radix().unwrap();
    assert_eq!(radix.evictable_pages(), radix.tree_pages(), "nothing locked after draining");
    assert_eq!(radix.free_pages() + radix.tree_pages(), 64);
}

/// A prompt that can never be admitted (or never finish) in the pool is rejected, not
/// left to stall the queue; requests behind it still run.
#[test]
fn oversize_requests_are_rejected() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":64}}"#));
    e.submit(req(1, prompt(0, 1020, 0, 0), 10)).unwrap();
    e.submit(req(2, prompt(1, 900, 0, 0), 200)).unwrap();
    e.submit(req(3, prompt(2, 100, 0, 0), 5)).unwrap();
    let pass = e.step(0);
    let rejected: Vec<u128> = pass.all_outputs().filter(|o| o.rejected).map(|o| o.uuid).collect();
    assert_eq!(rejected, vec![1, 2]);
    assert!(pass.all_outputs().filter(|o| o.rejected).all(|o| o.completed && o.token_id().is_none()));
    assert_eq!(pass.admissions.len(), 1);
}

/// max_model_len: prompts at the limit are rejected; generation stops at the limit.
#[test]
fn max_model_len_rejects_and_truncates() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","max_model_len":120}}"#));
    e.submit(req(1, prompt(0, 120, 0, 0), 10)).unwrap();
    e.submit(req(2, prompt(1, 100, 0, 0), 50)).unwrap();
    let (mut now, mut tokens, mut rejected) = (0, 0, 0);
    while e.has_work() {
        let pass = e.step(now);
        now = pass.end_ns;
        tokens += pass.all_outputs().filter(|o| o.has_token()).count();
        rejected += pass.all_outputs().filter(|o| o.rejected).count();
    }
    assert_eq!((tokens, rejected), (20, 1));
}

/// Cancelling running, chunked and waiting requests frees their KV; others proceed.
#[test]
fn cancel_frees_kv_in_every_state() {
    let args = r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":512,
        "sglang":{"chunked_prefill_size":256}}}"#;
    let mut e = engine(config(args));
    e.submit(req(1, prompt(0, 200, 0, 0), 50)).unwrap();
    e.submit(req(2, prompt(1, 400, 0, 0), 50)).unwrap();
    e.submit(req(3, prompt(2, 300, 0, 0), 50)).unwrap();
    let pass = e.step(0);
    // Request 1 fits whole; request 2 gets a partial 48-token chunk (256 - 208 rounded).
    assert_eq!(pass.admissions.len(), 2);
    assert_eq!(pass.metrics.sum_prefill_tokens, 200 + 48);
    let now = pass.end_ns;
    assert!(e.cancel(2), "chunked request cancelled");
    assert!(e.cancel(3), "waiting request cancelled");
    assert!(e.cancel(1), "running request cancelled");
    assert!(!e.cancel(1), "already gone");
    e.check_invariants().unwrap();
    assert!(!e.has_work());
    let r = e.radix().unwrap();
    assert_eq!(r.free_pages() + r.evictable_pages(), 512, "no page held");
    assert_eq!(e.step(now).admissions.len(), 0);
}

/// KV events carry the same hash-chained page identities as the vLLM backend: Stored runs
/// chain onto their parent, generated pages are stored as they complete, and evicted pages
/// are Removed (leaves first).
#[test]
fn kv_events_use_chained_page_hashes() {
    use mocker_core::events::KvEventData;
    use mocker_core::hashing::{local_block_hash, sequence_hashes};
    let cfg = config(r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":12}}"#);
    let mut e =
        Engine::new(EngineOptions { config: cfg, record_kv_events: true, ..Default::default() }).unwrap();
    let p1 = prompt(0, 70, 0, 0);
    e.submit(req(1, p1.clone(), 30)).unwrap();
    let (mut now, mut stored, mut removed, mut next_id) = (0, Vec::new(), Vec::new(), 0);
    let mut drain =
        |e: &mut Engine, now: &mut u64, stored: &mut Vec<(Option<u64>, u64, u64)>, removed: &mut Vec<u64>| {
            while e.has_work() {
                let pass = e.step(*now);
                *now = pass.end_ns;
                for ev in &pass.kv_events {
                    assert_eq!(ev.event_id, next_id);
                    next_id += 1;
                    match &ev.data {
                        KvEventData::Stored { parent_hash, blocks, .. } => {
                            let mut parent = *parent_hash;
                            for b in blocks {
                                stored.push((parent, b.block_hash, b.tokens_hash));
                                parent = Some(b.block_hash);
                            }
                        }
                        KvEventData::Removed { block_hashes } => removed.extend(block_hashes),
                        KvEventData::Cleared => panic!("never cleared here"),
                    }
                }
            }
        };
    drain(&mut e, &mut now, &mut stored, &mut removed);
    // 70 prompt + 30 generated tokens, the last one materialized too: 100 tokens = 6 pages.
    let mut full = p1.clone();
    full.extend((0..30).map(|k| mocker_core::hashing::deterministic_output_token(1, k)));
    let want = sequence_hashes(&full, 16);
    assert_eq!(stored.iter().map(|s| s.1).collect::<Vec<_>>(), want);
    for (i, s) in stored.iter().enumerate() {
        assert_eq!(s.0, i.checked_sub(1).map(|j| want[j]), "parent of page {i}");
        assert_eq!(s.2, local_block_hash(&full[i * 16..(i + 1) * 16]), "tokens hash of page {i}");
    }
    assert!(removed.is_empty());
    // A second request needing 10 of the 12 pages evicts the first request's leaves first.
    e.submit(req(2, prompt(1, 150, 0, 0), 5)).unwrap();
    drain(&mut e, &mut now, &mut stored, &mut removed);
    assert_eq!(&removed[..], &[want[5], want[4], want[3], want[2]][..], "leaf-first eviction");
    e.check_invariants().unwrap();
}
