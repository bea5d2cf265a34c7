//! Property tests of the vLLM / TRT-LLM scheduler (core spec §3-§4) over random workloads
//! and configurations: budgets and sequence limits hold every pass, every request ends
//! exactly once with exactly its tokens (or is rejected, and only if it can never fit),
//! the engine always drains, the pool stays consistent, and the KV event stream is
//! well-formed and agrees with the pool.

use std::collections::{BTreeMap, BTreeSet};

use mocker_core::config::{Backend, EngineConfig, LaunchConfig, PreemptionMode, TimingModelConfig};
use mocker_core::events::KvEventData;
use mocker_core::{Engine, EngineOptions, Request};
use proptest::prelude::*;

mod common;

use common::lockstep::Lockstep;

/// Upper bound on passes; every workload here drains far below it.
const MAX_PASSES: usize = 20_000;

#[derive(Debug, Clone)]
struct Spec {
    prompt: usize,
    output: usize,
    /// Pass index before which the request is submitted (0 = before the first pass).
    arrival: usize,
    /// Prefix group and how many leading tokens come from it.
    group: Option<(u32, usize)>,
}

fn spec() -> impl Strategy<Value = Spec> {
    // Mostly short prompts, so that most requests fit the small pools and contend for them.
    let prompt = prop_oneof![3 => 1..48usize, 2 => 1..200usize, 1 => 1..600usize];
    let arrival = prop_oneof![2 => Just(0usize), 3 => 0..60usize];
    // A prefix group and how much of it to take (capped at the prompt: whole-prompt repeats).
    let group = prop::option::weighted(0.6, (0..3u32, 0..600usize));
    (prompt, 1..80usize, arrival, group).prop_map(|(prompt, output, arrival, group)| Spec {
        prompt,
        output,
        arrival,
        group: group.map(|(g, n)| (g, n.min(prompt))),
    })
}

fn timing() -> impl Strategy<Value = TimingModelConfig> {
    prop_oneof![
        Just(TimingModelConfig::Polynomial),
        (prop::sample::select(vec![0.0, 0.5, 7.0, 25.0]), prop::sample::select(vec![0.0, 0.3, 3.0]))
            .prop_map(|(prefill_ms, decode_ms)| TimingModelConfig::Fixed { prefill_ms, decode_ms }),
    ]
}

fn config() -> impl Strategy<Value = EngineConfig> {
    (
        prop::sample::select(vec![2usize, 4, 16, 64]),
        4..200usize,
        1..16usize,
        8..512usize,
        prop::bool::weighted(0.75),
        prop::bool::weighted(0.75),
        prop_oneof![Just(PreemptionMode::Lifo), Just(PreemptionMode::Fifo)],
        prop_oneof![Just(Backend::Vllm), Just(Backend::Trtllm)],
        timing(),
    )
        .prop_map(
            |(
                block_size,
                num_gpu_blocks,
                max_num_seqs,
                max_num_batched_tokens,
                enable_chunked_prefill,
                enable_prefix_caching,
                preemption_mode,
                backend,
                timing_model,
            )| EngineConfig {
                backend,
                block_size,
                num_gpu_blocks,
                max_num_seqs,
                max_num_batched_tokens,
                enable_chunked_prefill,
                enable_prefix_caching,
                // TRT-LLM's guaranteed_no_evict never preempts, so the key is vLLM-only.
                preemption_mode: if backend == Backend::Vllm {
                    preemption_mode
                } else {
                    PreemptionMode::Lifo
                },
                timing_model,
                ..EngineConfig::default()
            },
        )
}

fn prompt_tokens(i: usize, s: &Spec) -> Vec<u32> {
    let shared = s.group.map_or(0, |(_, n)| n);
    let mut tokens: Vec<u32> = (0..shared as u32).map(|t| 1_000_000 * (s.group.unwrap().0 + 1) + t).collect();
    tokens.extend((shared as u32..s.prompt as u32).map(|t| 10_000_000 * (i as u32 + 1) + t));
    tokens
}

/// Whether the request can never complete on this engine (and so must be rejected).
fn never_fits(c: &EngineConfig, s: &Spec) -> bool {
    let pool_tokens = c.num_gpu_blocks * c.block_size;
    if !c.enable_chunked_prefill && s.prompt > c.max_num_batched_tokens {
        return true;
    }
    match c.backend {
        // Generation is capped at what the pool can hold, so only a prompt filling the pool
        // (leaving no room for one output token) can never run.
        Backend::Trtllm => s.prompt + 1 > pool_tokens,
        // Peak KV: the prompt plus every output token but the last (never computed).
        _ => (s.prompt + s.output - 1).div_ceil(c.block_size) > c.num_gpu_blocks,
    }
}

/// Tokens an accepted request yields.
fn expected_tokens(c: &EngineConfig, s: &Spec) -> usize {
    match c.backend {
        Backend::Trtllm => s.output.min(c.num_gpu_blocks * c.block_size - s.prompt),
        _ => s.output,
    }
}

#[derive(Debug, Default)]
struct Seen {
    tokens: usize,
    next_index: u32,
    completed: usize,
    rejected: bool,
    outputs: usize,
    admissions: usize,
}

/// KV events as the event stream describes the cache: hash → live.
#[derive(Debug, Default)]
struct EventView {
    next_id: u64,
    live: BTreeSet<u64>,
    ever_stored: BTreeSet<u64>,
}

impl EventView {
    fn apply(&mut self, pass: &mocker_core::Pass) -> Result<(), TestCaseError> {
        for ev in &pass.kv_events {
            prop_assert_eq!(ev.event_id, self.next_id, "event ids count up by 1 from 0");
            self.next_id += 1;
            match &ev.data {
                KvEventData::Stored { parent_hash, blocks, .. } => {
                    prop_assert!(!blocks.is_empty(), "empty Stored event");
                    if let Some(p) = parent_hash {
                        prop_assert!(self.live.contains(p), "Stored parent {:#x} not cached", p);
                    }
                    for b in blocks {
                        prop_assert!(!self.live.contains(&b.block_hash), "{:#x} stored twice", b.block_hash);
                        self.live.insert(b.block_hash);
                        self.ever_stored.insert(b.block_hash);
                    }
                }
                KvEventData::Removed { block_hashes } => {
                    prop_assert!(!block_hashes.is_empty(), "empty Removed event");
                    for h in block_hashes {
                        prop_assert!(self.live.remove(h), "Removed {:#x} not stored since last removal", h);
                    }
                }
                KvEventData::Cleared => return Err(TestCaseError::fail("the engine never clears its cache")),
            }
        }
        Ok(())
    }
}

fn run(config: EngineConfig, specs: &[Spec], record: bool) -> Result<(), TestCaseError> {
    // The generated configs are valid configs.
    let launch = LaunchConfig { engine: config.clone(), ..LaunchConfig::default() };
    launch.validate().map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut engine =
        Engine::new(EngineOptions { config: config.clone(), record_kv_events: record, ..Default::default() })
            .unwrap();
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].arrival);
    let mut pending = order.into_iter().peekable();
    let mut seen: BTreeMap<u128, Seen> = BTreeMap::new();
    let mut view = EventView::default();
    let mut now = 0u64;
    let mut passes = 0usize;
    let mut tokens_total = 0u64;

    loop {
        // Arrivals due at this pass; an idle engine jumps to the next arrival.
        while let Some(&i) = pending.peek() {
            if specs[i].arrival > passes && engine.has_work() {
                break;
            }
            let s = &specs[i];
            let uuid = i as u128 + 1;
            engine
                .submit(Request {
                    uuid,
                    tokens: prompt_tokens(i, s),
                    max_output_tokens: s.output,
                    output_token_ids: None,
                    block_hashes: None,
                    shareable_blocks: None,
                    prompt_len: None,
                    lora: None,
                })
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            seen.insert(uuid, Seen::default());
            pending.next();
            if specs[i].arrival > passes {
                passes = specs[i].arrival;
            }
        }
        if !engine.has_work() {
            break;
        }
        prop_assert!(passes < MAX_PASSES, "engine did not drain within {} passes", MAX_PASSES);
        let running_before = engine.metrics().running_requests;
        let pass = engine.step(now);
        passes += 1;
        // Running after scheduling (before completions leave) respects max_num_seqs.
        let scheduled_running = running_before + pass.admissions.len() - pass.metrics.num_preempted;
        prop_assert!(
            scheduled_running <= config.max_num_seqs,
            "{} running after scheduling > max_num_seqs {}",
            scheduled_running,
            config.max_num_seqs
        );
        prop_assert_eq!(pass.start_ns, now);
        prop_assert!(pass.end_ns >= pass.start_ns);
        prop_assert!(pass.had_effect(), "effect-free pass {} with work held", passes);
        prop_assert!(
            pass.metrics.scheduled_tokens <= config.max_num_batched_tokens,
            "pass scheduled {} tokens over the budget {}",
            pass.metrics.scheduled_tokens,
            config.max_num_batched_tokens
        );
        if !record || !config.enable_prefix_caching {
            prop_assert!(pass.kv_events.is_empty(), "KV events without recording or prefix caching");
        }
        view.apply(pass)?;
        for a in &pass.admissions {
            let s = seen.get_mut(&a.uuid).expect("admitted request was submitted");
            prop_assert_eq!(s.completed, 0, "admission after completion");
            s.admissions += 1;
            if !config.enable_prefix_caching {
                prop_assert_eq!(a.reused_tokens, 0, "prefix reuse with caching off");
            }
        }
        for o in pass.all_outputs() {
            let s = seen.get_mut(&o.uuid).expect("output for a submitted request");
            prop_assert_eq!(s.completed, 0, "output after the terminal output of {}", o.uuid);
            s.outputs += 1;
            if o.rejected {
                prop_assert!(o.completed && !o.has_token(), "rejection is terminal and tokenless");
                prop_assert_eq!(s.outputs, 1, "rejected after producing outputs");
                prop_assert_eq!(s.admissions, 0, "rejected after admission");
                s.rejected = true;
            }
            if o.has_token() {
                prop_assert_eq!(o.index, s.next_index, "token indices count up from 0");
                prop_assert_eq!(
                    o.cached_tokens.is_some(),
                    s.tokens == 0,
                    "cached_tokens rides the first token only"
                );
                s.next_index += 1;
                s.tokens += 1;
                tokens_total += 1;
            }
            if o.completed {
                s.completed += 1;
            }
        }
        let end_ns = pass.end_ns;
        let m = engine.metrics();
        prop_assert!(
            m.running_requests <= config.max_num_seqs,
            "{} running > max_num_seqs",
            m.running_requests
        );
        prop_assert_eq!(m.generation_tokens_total, tokens_total);
        let pool = engine.pool().expect("vLLM pool");
        pool.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(pool.num_active() + pool.num_inactive() + pool.num_free(), pool.capacity());
        prop_assert_eq!(m.active_blocks, pool.num_active());
        now = end_ns;
    }

    prop_assert!(pending.peek().is_none());
    prop_assert_eq!(engine.num_requests(), 0);
    prop_assert_eq!(
        engine.pool().expect("vLLM pool").num_active(),
        0,
        "blocks still referenced after draining"
    );
    prop_assert_eq!(seen.len(), specs.len());
    for (i, s) in specs.iter().enumerate() {
        let got = &seen[&(i as u128 + 1)];
        prop_assert_eq!(got.completed, 1, "request {} ({:?}) ended {} times", i, s, got.completed);
        let hopeless = never_fits(&config, s);
        prop_assert_eq!(
            got.rejected,
            hopeless,
            "request {} {:?}: rejected={} never_fits={}",
            i,
            s,
            got.rejected,
            hopeless
        );
        if !got.rejected {
            prop_assert_eq!(got.tokens, expected_tokens(&config, s), "request {} {:?} token count", i, s);
            prop_assert!(got.admissions >= 1);
        } else {
            prop_assert_eq!(got.tokens, 0);
        }
    }
    if record && config.enable_prefix_caching {
        // The event stream's view of the cache is the pool's.
        let pool = engine.pool().expect("vLLM pool");
        prop_assert_eq!(pool.num_cached_hashes(), view.live.len(), "cached hashes vs live Stored");
        for h in &view.ever_stored {
            prop_assert_eq!(pool.contains(*h), view.live.contains(h), "contains({:#x}) vs events", h);
        }
    }
    if !config.enable_prefix_caching {
        prop_assert_eq!(
            engine.pool().expect("vLLM pool").num_cached_hashes(),
            0,
            "nothing cached with prefix caching off"
        );
    }
    Ok(())
}

/// Runs `specs` on the engines of a [`Lockstep`] (plain, counting steady tokens, opaque
/// output blocks), cancelling request `cancel.1` before pass `cancel.0` on all; every pass
/// must match: times, non-steady outputs, steady count and gap, admissions, KV events,
/// pass and engine metrics, pool state.
fn run_optimised_beside_plain(
    config: EngineConfig,
    specs: &[Spec],
    cancel: (usize, usize),
) -> Result<(), TestCaseError> {
    let mut pair = Lockstep::new(&config);
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].arrival);
    let mut pending = order.into_iter().peekable();
    let (mut now, mut passes) = (0u64, 0usize);
    loop {
        while let Some(&i) = pending.peek() {
            if specs[i].arrival > passes && pair.itemized.has_work() {
                break;
            }
            // Blocks past the group prefix hold tokens of this request only.
            let shareable = specs[i].group.map_or(0, |(_, n)| n) / config.block_size;
            pair.submit(
                Request {
                    uuid: i as u128 + 1,
                    tokens: prompt_tokens(i, &specs[i]),
                    max_output_tokens: specs[i].output,
                    ..Default::default()
                },
                Some(shareable),
            )?;
            pending.next();
            passes = passes.max(specs[i].arrival);
        }
        if passes == cancel.0 {
            pair.cancel(cancel.1 as u128 + 1)?;
        }
        if !pair.has_work()? {
            break;
        }
        prop_assert!(passes < MAX_PASSES, "engine did not drain within {} passes", MAX_PASSES);
        passes += 1;
        now = pair.step(now, passes)?.0;
    }
    prop_assert_eq!(pair.aggregated.num_requests(), 0);
    Ok(())
}

/// Steps `specs` on two counting engines: `single` one pass at a time, `runs` turning
/// every pass it can into a run (`extend_steady_run`), ended by a random limit and cut
/// by random truncations, after which the next arrival is submitted at once, as a
/// discrete-event driver would when a request arrives mid-run. `single` then steps
/// through the run's passes, which must be pure steady passes with the run's ends and
/// gaps, and the engines must agree on everything after every run.
fn run_runs_beside_single(
    config: EngineConfig,
    specs: &[Spec],
    cuts: &[(u64, bool)],
) -> Result<usize, TestCaseError> {
    let build = || {
        Engine::new(EngineOptions {
            config: config.clone(),
            record_kv_events: true,
            aggregate_steady_tokens: true,
            ..Default::default()
        })
        .unwrap()
    };
    let (mut single, mut runs) = (build(), build());
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].arrival);
    let mut pending = order.into_iter().peekable();
    let (mut now, mut passes, mut extra) = (0u64, 0usize, 0usize);
    let submit_next = |single: &mut Engine, runs: &mut Engine, i: usize| -> Result<(), TestCaseError> {
        let request = Request {
            uuid: i as u128 + 1,
            tokens: prompt_tokens(i, &specs[i]),
            max_output_tokens: specs[i].output,
            ..Default::default()
        };
        single.submit(request.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        runs.submit(request).map_err(|e| TestCaseError::fail(e.to_string()))?;
        Ok(())
    };
    let mut early = false;
    loop {
        while let Some(&i) = pending.peek() {
            if specs[i].arrival > passes && runs.has_work() && !early {
                break;
            }
            submit_next(&mut single, &mut runs, i)?;
            pending.next();
            passes = passes.max(specs[i].arrival);
            early = false;
        }
        if !runs.has_work() {
            break;
        }
        prop_assert!(passes < MAX_PASSES, "engine did not drain within {} passes", MAX_PASSES);
        passes += 1;
        let a = single.step(now);
        let (a_end, a_outputs, a_steady, a_admissions, a_events, a_metrics) = (
            a.end_ns,
            a.outputs.clone(),
            a.steady_tokens(),
            a.admissions.clone(),
            a.kv_events.clone(),
            a.metrics,
        );
        let b = runs.step(now);
        prop_assert_eq!(a_end, b.end_ns, "pass {} end", passes);
        prop_assert_eq!(&a_outputs, &b.outputs, "pass {} outputs", passes);
        prop_assert_eq!(a_steady, b.steady_tokens(), "pass {} steady", passes);
        prop_assert_eq!(&a_admissions, &b.admissions, "pass {} admissions", passes);
        prop_assert_eq!(&a_events, &b.kv_events, "pass {} events", passes);
        prop_assert_eq!(a_metrics, b.metrics, "pass {} metrics", passes);
        let (span, cut) = cuts[passes % cuts.len()];
        let limit = if span == 0 { u64::MAX } else { a_end + span };
        if runs.extend_steady_run(limit) > 0 {
            if cut {
                // A request arrives inside the run: passes starting from then must see it.
                let ends = runs.last_pass().run_ends.clone();
                let t = ends[0] + span % (ends[ends.len() - 1] - ends[0] + 1);
                runs.truncate_steady_run(t);
                early = pending.peek().is_some();
                let kept = &runs.last_pass().run_ends;
                // Passes kept past the first start before t; the first dropped one does not.
                prop_assert!(
                    kept.len() < 2 || kept[kept.len() - 2] < t,
                    "a kept pass starts at or after {}",
                    t
                );
                let n = kept.len().max(1);
                prop_assert!(n == ends.len() || ends[n - 1] >= t, "a pass starting before {} was dropped", t);
            }
            let run = runs.last_pass();
            let gaps: Vec<(usize, u64)> = run.steady_runs().collect();
            prop_assert_eq!(gaps.len(), run.run_ends.len().max(1));
            let (ends, metrics) = (run.run_ends.clone(), run.metrics);
            for (k, &end) in ends.iter().enumerate().skip(1) {
                let p = single.step(ends[k - 1]);
                prop_assert_eq!(p.end_ns, end, "run pass {} end", k);
                prop_assert!(p.outputs.is_empty() && p.admissions.is_empty() && p.kv_events.is_empty());
                prop_assert_eq!(p.steady_tokens(), gaps[k], "run pass {} steady tokens", k);
                if k == ends.len() - 1 {
                    prop_assert_eq!(p.metrics, metrics, "metrics of the run's last pass");
                }
                extra += 1;
            }
        }
        now = runs.last_pass().end_ns;
        prop_assert_eq!(single.last_pass().end_ns, now);
        prop_assert_eq!(single.metrics(), runs.metrics(), "engine metrics after pass {}", passes);
        runs.check_invariants().map_err(TestCaseError::fail)?;
    }
    prop_assert_eq!(single.has_work(), false);
    Ok(extra)
}

#[test]
fn runs_cover_many_passes_of_a_steady_workload() {
    let config = EngineConfig { block_size: 64, num_gpu_blocks: 1000, ..Default::default() };
    let specs: Vec<Spec> =
        (0..6).map(|i| Spec { prompt: 100 + i, output: 300, arrival: 0, group: None }).collect();
    let extra = run_runs_beside_single(config, &specs, &[(0, false)]).unwrap();
    assert!(extra > 200, "only {extra} passes ran inside runs");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, failure_persistence: None, ..ProptestConfig::default() })]

    /// Counting steady tokens and opaque identities for generated blocks are optimisations
    /// only: the engine steps exactly as the plain one, including under preemption,
    /// chunking, budget starvation and cancels.
    #[test]
    fn counted_steady_tokens_and_opaque_output_blocks_step_like_the_plain_engine(
        config in config().prop_map(|c| EngineConfig {
            // Half the cases under pressure (preemption, starvation), half roomy (long runs).
            num_gpu_blocks: if c.num_gpu_blocks % 2 == 0 { 4 + c.num_gpu_blocks % 24 } else { c.num_gpu_blocks * 8 },
            // A third with fewer tokens per pass than sequences, so decodes starve.
            max_num_batched_tokens: if c.max_num_batched_tokens % 3 == 0 { 2 + c.max_num_seqs / 2 } else { c.max_num_batched_tokens },
            ..c
        }),
        specs in prop::collection::vec(spec(), 1..40),
        cancel in (0..400usize, 0..40usize),
    ) {
        run_optimised_beside_plain(config, &specs, cancel)?;
    }

    /// Runs of steady passes, limited and truncated at random, are the passes a one-pass
    /// engine steps, and leave the engine where that one is.
    #[test]
    fn steady_runs_step_like_single_passes(
        config in config(),
        specs in prop::collection::vec(spec(), 1..30),
        cuts in prop::collection::vec((prop_oneof![Just(0u64), 1..200_000_000u64], any::<bool>()), 1..8),
    ) {
        run_runs_beside_single(config, &specs, &cuts)?;
    }

    #[test]
    fn random_workloads_drain_correctly(
        config in config(),
        specs in prop::collection::vec(spec(), 1..40),
        record in any::<bool>(),
    ) {
        run(config, &specs, record)?;
    }

    /// Tight pools and budgets: preemption, rejection and chunking on every case.
    #[test]
    fn tight_pools_recover_from_preemption(
        config in config().prop_map(|c| EngineConfig {
            num_gpu_blocks: 4 + c.num_gpu_blocks % 24,
            block_size: c.block_size.min(16),
            ..c
        }),
        specs in prop::collection::vec(spec(), 2..24),
    ) {
        run(config, &specs, true)?;
    }
}
