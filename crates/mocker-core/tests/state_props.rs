//! Property tests of the state cache (`state_cache`, default and align mode) over random
//! workloads and pools, with cancellations: every pass the pool's bookkeeping holds (its
//! blocks are exactly active + inactive + free, none leaked or counted twice, aliases
//! point at cached blocks), what is active never exceeds the pool, every request ends
//! exactly once, and once the engine drains no block is referenced: every working state,
//! preserved checkpoint and block held for a pass's copy was given back.

use mocker_core::config::{EngineConfig, LaunchConfig, StateCacheConfig, TimingModelConfig};
use mocker_core::{Engine, EngineOptions, Request};
use proptest::prelude::*;

const MAX_PASSES: usize = 20_000;

#[derive(Debug, Clone)]
struct Spec {
    prompt: usize,
    output: usize,
    /// Pass index before which the request is submitted.
    arrival: usize,
    /// Prefix group and how many leading tokens come from it.
    group: Option<(u32, usize)>,
    /// Pass index at which it is cancelled, if it is.
    cancel: Option<usize>,
}

fn spec() -> impl Strategy<Value = Spec> {
    let prompt = prop_oneof![3 => 1..48usize, 2 => 1..200usize, 1 => 1..500usize];
    let arrival = prop_oneof![2 => Just(0usize), 3 => 0..60usize];
    let group = prop::option::weighted(0.6, (0..3u32, 0..500usize));
    let cancel = prop::option::weighted(0.15, 0..120usize);
    (prompt, 1..60usize, arrival, group, cancel).prop_map(|(prompt, output, arrival, group, cancel)| Spec {
        prompt,
        output,
        arrival,
        group: group.map(|(g, n)| (g, n.min(prompt))),
        cancel,
    })
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        prop::sample::select(vec![2usize, 4, 8, 16]),
        // Blocks per state 1..=8 (bytes / (block_size * 16 bytes per token)).
        1..=8u64,
        6..160usize,
        1..12usize,
        4..300usize,
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.85),
        // prefix_match_unit as a divisor index (0: none).
        0..4usize,
    )
        .prop_map(|(block_size, state_blocks, extra, max_num_seqs, budget, chunked, caching, unit)| {
            let divisors: Vec<usize> = (1..=block_size).filter(|d| block_size % d == 0).collect();
            let prefix_match_unit = (unit > 0).then(|| divisors[(unit - 1) % divisors.len()]);
            EngineConfig {
                block_size,
                num_gpu_blocks: state_blocks as usize + 1 + extra,
                max_num_seqs,
                max_num_batched_tokens: budget,
                enable_chunked_prefill: chunked,
                enable_prefix_caching: caching,
                kv_cache_bytes_per_token: Some(16),
                state_cache: Some(StateCacheConfig {
                    bytes_per_request: state_blocks * block_size as u64 * 16,
                }),
                prefix_match_unit,
                timing_model: TimingModelConfig::Fixed { prefill_ms: 3.0, decode_ms: 1.0 },
                ..EngineConfig::default()
            }
        })
}

fn tokens(i: usize, s: &Spec) -> Vec<u32> {
    let shared = s.group.map_or(0, |(_, n)| n);
    let mut t: Vec<u32> = (0..shared as u32).map(|k| 1_000_000 * (s.group.unwrap().0 + 1) + k).collect();
    t.extend((shared as u32..s.prompt as u32).map(|k| 10_000_000 * (i as u32 + 1) + k));
    t
}

fn run(config: EngineConfig, specs: &[Spec]) -> Result<(), TestCaseError> {
    let launch = LaunchConfig { engine: config.clone(), ..LaunchConfig::default() };
    launch.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut engine = Engine::new(EngineOptions { config: config.clone(), ..Default::default() }).unwrap();
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].arrival);
    let mut pending = order.into_iter().peekable();
    let mut ended = vec![0usize; specs.len()];
    let mut submitted = vec![false; specs.len()];
    let (mut now, mut passes) = (0u64, 0usize);
    loop {
        while let Some(&i) = pending.peek() {
            if specs[i].arrival > passes && engine.has_work() {
                break;
            }
            let s = &specs[i];
            engine
                .submit(Request {
                    uuid: i as u128 + 1,
                    tokens: tokens(i, s),
                    max_output_tokens: s.output,
                    output_token_ids: None,
                    block_hashes: None,
                    shareable_blocks: None,
                    prompt_len: None,
                    lora: None,
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            submitted[i] = true;
            pending.next();
            passes = passes.max(s.arrival);
        }
        for (i, s) in specs.iter().enumerate() {
            if submitted[i] && ended[i] == 0 && s.cancel == Some(passes) && engine.cancel(i as u128 + 1) {
                ended[i] += 1;
            }
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
        let pool = engine.pool().expect("vLLM pool");
        pool.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(pool.num_active() + pool.num_inactive() + pool.num_free(), pool.capacity());
        prop_assert!(pool.num_active() <= config.num_gpu_blocks);
        prop_assert_eq!(engine.metrics().active_blocks, pool.num_active());
    }
    for (i, &n) in ended.iter().enumerate() {
        prop_assert_eq!(n, 1, "request {} ({:?}) ended {} times", i, specs[i], n);
    }
    prop_assert_eq!(engine.num_requests(), 0);
    let pool = engine.pool().expect("vLLM pool");
    prop_assert_eq!(pool.num_active(), 0, "blocks still referenced after draining");
    pool.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    /// State and token blocks are accounted for every pass and all given back at the end.
    #[test]
    fn state_accounting_holds_and_ends_empty(
        config in config(),
        specs in prop::collection::vec(spec(), 1..24),
    ) {
        run(config, &specs)?;
    }
}

/// The align-mode request of the D14 fixture case (a partial tail, working states moving
/// at every block) gives every block back.
#[test]
fn one_request_gives_every_block_back() {
    let config = EngineConfig {
        block_size: 16,
        num_gpu_blocks: 64,
        kv_cache_bytes_per_token: Some(1024),
        state_cache: Some(StateCacheConfig { bytes_per_request: 65536 }),
        prefix_match_unit: Some(4),
        timing_model: TimingModelConfig::Fixed { prefill_ms: 10.0, decode_ms: 1.0 },
        ..EngineConfig::default()
    };
    run(config, &[Spec { prompt: 103, output: 40, arrival: 0, group: None, cancel: None }]).unwrap();
}
