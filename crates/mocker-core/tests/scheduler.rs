//! Scheduler behaviour pinned to the reference's exact micro cases (core spec §13).

use std::collections::HashMap;

use mocker_core::config::{EngineConfig, PreemptionMode, TimingModelConfig};
use mocker_core::events::KvEventData;
use mocker_core::{Engine, EngineOptions, Request};

#[derive(Debug, Default, Clone)]
struct Trace {
    first_ns: Option<u64>,
    last_ns: u64,
    tokens: usize,
    admissions: usize,
    rejected: bool,
}

/// Submits every request at t=0 and steps back-to-back until the engine drains.
fn run(config: EngineConfig, requests: &[(usize, usize)]) -> Vec<Trace> {
    let mut engine = Engine::new(EngineOptions { config, ..Default::default() }).unwrap();
    for (i, &(isl, osl)) in requests.iter().enumerate() {
        let tokens = (0..isl as u32).map(|t| t + 1 + 100_000 * i as u32).collect();
        engine
            .submit(Request { uuid: i as u128 + 1, tokens, max_output_tokens: osl, ..Default::default() })
            .unwrap();
    }
    let mut traces: HashMap<u128, Trace> = HashMap::new();
    let mut now = 0;
    let mut passes = 0;
    while engine.has_work() {
        let pass = engine.step(now);
        assert!(pass.had_effect(), "effect-free pass at {now}");
        for a in &pass.admissions {
            traces.entry(a.uuid).or_default().admissions += 1;
        }
        for o in pass.all_outputs() {
            let t = traces.entry(o.uuid).or_default();
            if o.rejected {
                t.rejected = true;
                continue;
            }
            t.first_ns.get_or_insert(pass.end_ns);
            t.last_ns = pass.end_ns;
            t.tokens += 1;
        }
        now = pass.end_ns;
        passes += 1;
        assert!(passes < 1_000_000);
    }
    assert_eq!(engine.pool().expect("vLLM pool").num_active(), 0, "every block released");
    (1..=requests.len() as u128).map(|u| traces.remove(&u).unwrap_or_default()).collect()
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn fixed(prefill_ms: f64, decode_ms: f64) -> TimingModelConfig {
    TimingModelConfig::Fixed { prefill_ms, decode_ms }
}

#[test]
fn single_request_ttft_and_itl_follow_the_polynomial() {
    let t = run(EngineConfig::default(), &[(1000, 2)]);
    assert!((ms(t[0].first_ns.unwrap()) - 32.105859).abs() < 1e-6);
    assert!((ms(t[0].last_ns - t[0].first_ns.unwrap()) - 5.791536).abs() < 1e-6);
    assert_eq!(t[0].tokens, 2);
}

#[test]
fn chunked_prefill_shares_the_budget() {
    let config =
        EngineConfig { max_num_batched_tokens: 150, timing_model: fixed(10.0, 3.0), ..Default::default() };
    let t = run(config, &[(100, 4), (100, 4), (100, 4)]);
    let ttft: Vec<f64> = t.iter().map(|t| ms(t.first_ns.unwrap())).collect();
    let e2e: Vec<f64> = t.iter().map(|t| ms(t.last_ns)).collect();
    assert_eq!(ttft, vec![10.0, 23.0, 36.0]);
    assert_eq!(e2e, vec![39.0, 42.0, 45.0]);
}

fn preemption_case(mode: PreemptionMode) -> Vec<Trace> {
    let config = EngineConfig {
        num_gpu_blocks: 8,
        preemption_mode: mode,
        timing_model: fixed(10.0, 1.0),
        ..Default::default()
    };
    run(config, &[(100, 200); 4])
}

#[test]
fn lifo_preemption_matches_reference() {
    let t = preemption_case(PreemptionMode::Lifo);
    let e2e: Vec<f64> = t.iter().map(|t| ms(t.last_ns)).collect();
    assert_eq!(e2e, vec![209.0, 262.0, 400.0, 486.0]);
    let admissions: Vec<usize> = t.iter().map(|t| t.admissions).collect();
    assert_eq!(admissions, vec![1, 2, 2, 3]);
    assert!(t.iter().all(|t| t.tokens == 200));
}

#[test]
fn fifo_preemption_matches_reference() {
    let t = preemption_case(PreemptionMode::Fifo);
    let e2e: Vec<f64> = t.iter().map(|t| ms(t.last_ns)).collect();
    assert_eq!(e2e, vec![443.0, 486.0, 262.0, 209.0]);
    assert!(t.iter().all(|t| t.tokens == 200));
}

#[test]
fn requests_that_can_never_fit_are_rejected() {
    // Prompt alone exceeds the pool.
    let t = run(EngineConfig { num_gpu_blocks: 10, ..Default::default() }, &[(1000, 10), (100, 2)]);
    assert!(t[0].rejected && t[0].tokens == 0);
    assert_eq!(t[1].tokens, 2);
    // Growth can never fit (the reference loops forever here).
    let t = run(EngineConfig { num_gpu_blocks: 3, ..Default::default() }, &[(100, 100)]);
    assert!(t[0].rejected);
    // Prompt longer than the budget with chunking off.
    let config =
        EngineConfig { enable_chunked_prefill: false, max_num_batched_tokens: 64, ..Default::default() };
    let t = run(config, &[(100, 2), (10, 2)]);
    assert!(t[0].rejected);
    assert_eq!(t[1].tokens, 2);
}

#[test]
fn max_model_len_rejects_long_prompts_and_truncates_generation() {
    let config = EngineConfig { max_model_len: Some(120), ..Default::default() };
    let t = run(config, &[(100, 50), (120, 5)]);
    assert_eq!(t[0].tokens, 20);
    assert!(!t[0].rejected);
    assert!(t[1].rejected);
}

#[test]
fn prefix_cache_reset_clears_only_an_idle_cache() {
    let config = EngineConfig::default();
    let mut engine =
        Engine::new(EngineOptions { config, record_kv_events: true, ..Default::default() }).unwrap();
    let tokens: Vec<u32> = (1..=300).collect();
    let req = |uuid| Request { uuid, tokens: tokens.clone(), max_output_tokens: 3, ..Default::default() };
    engine.submit(req(1)).unwrap();
    let first = engine.step(0);
    assert!(first.kv_events.iter().any(|e| matches!(e.data, KvEventData::Stored { .. })));
    let mut now = first.end_ns;
    let err = engine.reset_prefix_cache().unwrap_err();
    assert!(err.active_blocks > 0, "a running request holds blocks");
    while engine.has_work() {
        now = engine.step(now).end_ns;
    }
    assert!(
        engine.pool().expect("vLLM pool").num_inactive() > 0,
        "finished request leaves its prefix cached"
    );
    let cleared = engine.reset_prefix_cache().unwrap().expect("events are recorded");
    assert_eq!(cleared.data, KvEventData::Cleared);
    assert_eq!(engine.pool().expect("vLLM pool").num_inactive(), 0);
    assert_eq!(engine.pool().expect("vLLM pool").num_free(), engine.pool().expect("vLLM pool").capacity());
    // The same prompt no longer hits the cache.
    engine.submit(req(2)).unwrap();
    assert_eq!(engine.step(now).admissions[0].reused_tokens, 0);
}

/// A request without tokens (`prompt_len`) is taken only where no token is ever read.
#[test]
fn tokenless_requests_need_hashes_and_opaque_output_blocks() {
    use mocker_core::hashing::PromptHashes;
    use mocker_core::{config::Backend, EngineError, SubmitError};
    let config = EngineConfig { block_size: 4, ..Default::default() };
    let engine = |opaque: bool, backend: Backend| {
        let config = EngineConfig { backend, ..config.clone() };
        Engine::new(EngineOptions { config, opaque_output_blocks: opaque, ..Default::default() }).unwrap()
    };
    let tokens: Vec<u32> = (1..=10).collect();
    let tokenless = Request {
        uuid: 7,
        max_output_tokens: 3,
        prompt_len: Some(10),
        block_hashes: Some(PromptHashes::of(&tokens, 4)),
        ..Default::default()
    };
    let missing =
        |r: Result<_, EngineError>| matches!(r, Err(EngineError::Submit(SubmitError::MissingTokens(7))));
    assert!(engine(true, Backend::Vllm).submit(tokenless.clone()).is_ok());
    assert!(missing(engine(false, Backend::Vllm).submit(tokenless.clone())), "outputs hashed by content");
    assert!(missing(engine(true, Backend::Sglang).submit(tokenless.clone())));
    let unhashed = Request { block_hashes: None, ..tokenless.clone() };
    assert!(missing(engine(true, Backend::Vllm).submit(unhashed)));
    let planned = Request { output_token_ids: Some(vec![1, 2]), ..tokenless.clone() };
    assert!(missing(engine(true, Backend::Vllm).submit(planned)));
    let empty = Request { prompt_len: Some(0), ..tokenless };
    assert!(matches!(
        engine(true, Backend::Vllm).submit(empty),
        Err(EngineError::Submit(SubmitError::EmptyPrompt(7)))
    ));
}
