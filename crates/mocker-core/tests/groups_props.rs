//! Property tests of KV cache groups (`kv_cache_groups`) over random groups, budgets and
//! workloads: every pass each group's pages are within the byte budget and non-negative
//! (the pool's counters are unsigned: an underflow panics in this debug build), a
//! sliding-window group holds no more than each running request's window plus the pass's
//! new tokens, never more than the full-history group, and once the engine drains every
//! group is empty and every request ended exactly once.

use mocker_core::config::LaunchConfig;
use mocker_core::{Engine, EngineOptions, Request};
use proptest::prelude::*;
use serde_json::json;

const MAX_PASSES: usize = 20_000;
/// Tokens per page of every group (the reference's groups may differ; one size keeps the
/// window bound below simple).
const PAGE: u64 = 16;

#[derive(Debug, Clone)]
struct Spec {
    prompt: usize,
    output: usize,
    /// Pass index before which the request is submitted.
    arrival: usize,
}

fn spec() -> impl Strategy<Value = Spec> {
    let prompt = prop_oneof![3 => 1..64usize, 2 => 1..400usize, 1 => 1..1200usize];
    let arrival = prop_oneof![2 => Just(0usize), 3 => 0..40usize];
    (prompt, 1..60usize, arrival).prop_map(|(prompt, output, arrival)| Spec { prompt, output, arrival })
}

/// The groups: a full-attention one, a sliding window, maybe a convolution state; and
/// the engine's budget, chunking and batch limits.
#[derive(Debug, Clone)]
struct Setup {
    window: u64,
    conv: Option<u64>,
    page_bytes: [u64; 3],
    /// Budget in multiples of the largest request's need (at least one, so nothing is
    /// rejected as never fitting).
    budget_factor: f64,
    max_num_seqs: usize,
    max_num_batched_tokens: usize,
    chunked: bool,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![Just(16u64), Just(64), 1..600u64],
        prop::option::weighted(0.5, 1..8u64),
        [1..8u64, 1..8u64, 1..4u64],
        1.0..6.0f64,
        1..16usize,
        prop_oneof![Just(64usize), Just(256), 32..1500usize],
        prop::bool::weighted(0.8),
    )
        .prop_map(
            |(window, conv, pages, budget_factor, max_num_seqs, max_num_batched_tokens, chunked)| Setup {
                window,
                conv,
                page_bytes: pages.map(|k| k * 1024),
                budget_factor,
                max_num_seqs,
                max_num_batched_tokens,
                chunked,
            },
        )
}

fn launch(s: &Setup, specs: &[Spec]) -> LaunchConfig {
    let page = |name: &str, kind: &str, bytes: u64, window: Option<u64>| {
        json!({"name": name, "kind": kind, "num_layers": 4, "block_size_tokens": PAGE,
               "page_size_bytes": bytes, "sliding_window": window})
    };
    let mut groups = vec![
        page("full", "attention", s.page_bytes[0], None),
        page("swa", "attention", s.page_bytes[1], Some(s.window)),
    ];
    if let Some(w) = s.conv {
        groups.push(page("conv", "convolution", s.page_bytes[2], Some(w)));
    }
    // The largest single request's whole history in every group, as a bound any lease
    // stays under.
    let longest = specs.iter().map(|r| (r.prompt + r.output) as u64).max().unwrap_or(1);
    let per_token_page: u64 = s.page_bytes.iter().sum();
    let need = (longest.div_ceil(PAGE) + 2) * per_token_page;
    let budget = (need as f64 * s.budget_factor) as u64;
    let max_len = longest as usize + 1;
    LaunchConfig::from_value(json!({"engine": {
        "block_size": PAGE, "enable_prefix_caching": false, "kv_cache_capacity_bytes": budget,
        "kv_cache_groups": groups, "max_num_seqs": s.max_num_seqs,
        "max_num_batched_tokens": s.max_num_batched_tokens.max(if s.chunked { 1 } else { max_len }),
        "enable_chunked_prefill": s.chunked, "max_model_len": max_len,
        "timing_model": {"type": "fixed", "prefill_ms": 3.0, "decode_ms": 1.0},
    }}))
    .expect("a valid launch")
}

fn run(s: &Setup, specs: &[Spec]) -> Result<(), TestCaseError> {
    let launch = launch(s, specs);
    let config = launch.engine.clone();
    let capacity = config.kv_cache_capacity_bytes.expect("groups have a budget");
    let mut engine = Engine::new(EngineOptions { config: config.clone(), ..Default::default() }).unwrap();
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].arrival);
    let mut pending = order.into_iter().peekable();
    let mut ended = vec![0usize; specs.len()];
    let (mut now, mut passes) = (0u64, 0usize);
    loop {
        while let Some(&i) = pending.peek() {
            if specs[i].arrival > passes && engine.has_work() {
                break;
            }
            let r = &specs[i];
            engine
                .submit(Request {
                    uuid: i as u128 + 1,
                    tokens: (0..r.prompt as u32).map(|k| 100_000 * (i as u32 + 1) + k).collect(),
                    max_output_tokens: r.output,
                    output_token_ids: None,
                    block_hashes: None,
                    shareable_blocks: None,
                    prompt_len: None,
                    lora: None,
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            pending.next();
            passes = passes.max(r.arrival);
        }
        if !engine.has_work() {
            if pending.peek().is_none() {
                break;
            }
            continue;
        }
        prop_assert!(passes < MAX_PASSES, "engine did not drain");
        let pass = engine.step(now);
        now = pass.end_ns;
        passes += 1;
        for o in pass.all_outputs() {
            if o.completed {
                ended[o.uuid as usize - 1] += 1;
            }
        }
        prop_assert!(engine.fault().is_none(), "{:?}", engine.fault());
        let usage = engine.kv_group_usage();
        let total: u64 = usage.iter().map(|&(_, bytes)| bytes).sum();
        prop_assert!(total <= capacity, "{total} bytes held of {capacity}");
        prop_assert_eq!(engine.metrics().kv_cache_used_bytes, Some(total));
        let (full_pages, swa_pages) = (usage[0].0, usage[1].0);
        prop_assert!(swa_pages <= full_pages, "window {swa_pages} pages, full history {full_pages}");
        // Each running request holds at most its window plus what this pass computed (at
        // most the token budget over all of them), rounded out to pages at both ends.
        let running = engine.metrics().running_requests as u64;
        let bound = (config.max_num_batched_tokens as u64 + running * s.window).div_ceil(PAGE) + 2 * running;
        prop_assert!(
            swa_pages <= bound,
            "window group holds {swa_pages} pages for {running} requests (bound {bound})"
        );
        if let Some(w) = s.conv {
            let conv_bound =
                (config.max_num_batched_tokens as u64 + running * w).div_ceil(PAGE) + 2 * running;
            prop_assert!(usage[2].0 <= conv_bound);
        }
    }
    for (i, &n) in ended.iter().enumerate() {
        prop_assert_eq!(n, 1, "request {} ({:?}) ended {} times", i, specs[i], n);
    }
    prop_assert_eq!(engine.num_requests(), 0);
    prop_assert!(
        engine.kv_group_usage().iter().all(|&(pages, bytes)| pages == 0 && bytes == 0),
        "groups not empty"
    );
    prop_assert_eq!(engine.metrics().kv_cache_used_bytes, Some(0));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Group accounting stays within the budget and the windows every pass and ends empty.
    #[test]
    fn group_accounting_holds_windows_and_ends_empty(
        setup in setup(),
        specs in prop::collection::vec(spec(), 1..20),
    ) {
        run(&setup, &specs)?;
    }
}

/// One long request with a short window: its window group never holds more than the
/// window and a page either side once it decodes.
#[test]
fn a_long_request_keeps_only_its_window() {
    let s = Setup {
        window: 64,
        conv: Some(4),
        page_bytes: [1024, 1024, 1024],
        budget_factor: 1.0,
        max_num_seqs: 4,
        max_num_batched_tokens: 256,
        chunked: true,
    };
    run(&s, &[Spec { prompt: 1000, output: 200, arrival: 0 }]).unwrap();
}
