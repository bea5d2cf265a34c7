//! Cancellation in the core: removing waiting, running and just-finished requests.

use mocker_core::config::{EngineConfig, TimingModelConfig};
use mocker_core::{Engine, EngineOptions, Request};

fn engine() -> Engine {
    let config = EngineConfig {
        num_gpu_blocks: 64,
        block_size: 4,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        timing_model: TimingModelConfig::Fixed { prefill_ms: 10.0, decode_ms: 1.0 },
        ..Default::default()
    };
    Engine::new(EngineOptions { config, ..Default::default() }).unwrap()
}

fn req(uuid: u128, isl: u32, osl: usize) -> Request {
    Request { uuid, tokens: (1..=isl).collect(), max_output_tokens: osl, ..Default::default() }
}

#[test]
fn cancelling_a_waiting_request_removes_it() {
    let mut e = engine();
    let key = e.submit(req(7, 8, 4)).unwrap();
    assert_eq!(e.num_requests(), 1);
    assert!(!e.cancel_key(key, 8), "a key with the wrong uuid never matches");
    assert!(e.cancel(7));
    assert_eq!(e.num_requests(), 0);
    assert!(!e.has_work());
    assert!(!e.cancel(7), "a second cancel finds nothing");
    // The slot is reusable after the next pass.
    e.step(0);
    let again = e.submit(req(9, 8, 1)).unwrap();
    let pass = e.step(0);
    assert_eq!(pass.outputs.len(), 1);
    assert_eq!(pass.outputs[0].key, again);
}

#[test]
fn cancelling_a_running_request_frees_its_blocks_and_pending_output() {
    let mut e = engine();
    e.submit(req(1, 16, 10)).unwrap();
    let mut other = req(2, 16, 10);
    other.tokens.iter_mut().for_each(|t| *t += 1000);
    e.submit(other).unwrap();
    let pass = e.step(0);
    assert_eq!(pass.outputs.len(), 2);
    let active = e.pool().expect("vLLM pool").num_active();
    assert!(active >= 8);
    assert!(e.cancel(1));
    // The in-flight pass no longer carries request 1's token.
    assert!(e.last_pass().all_outputs().all(|o| o.uuid == 2));
    assert_eq!(e.last_pass().all_outputs().count(), 1);
    assert!(e.pool().expect("vLLM pool").num_active() < active);
    assert_eq!(e.metrics().running_requests, 1);
    let mut now = e.last_pass().end_ns;
    while e.has_work() {
        let p = e.step(now);
        assert!(p.all_outputs().all(|o| o.uuid == 2));
        now = p.end_ns;
    }
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 0);
    e.pool().expect("vLLM pool").check_invariants().unwrap();
}

#[test]
fn cancelling_a_request_finished_in_the_last_pass_suppresses_its_terminal() {
    let mut e = engine();
    e.submit(req(3, 8, 1)).unwrap();
    let pass = e.step(0);
    assert!(pass.outputs[0].completed);
    assert_eq!(e.num_requests(), 0);
    assert!(e.cancel(3), "suppressing the pending terminal output counts as applied");
    assert_eq!(e.last_pass().all_outputs().count(), 0);
    assert!(!e.cancel(3));
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 0);
}

// Disaggregated handoff in the core: a held source and a reserved destination.

#[test]
fn a_held_source_keeps_its_kv_until_released() {
    let mut e = engine();
    let key = e.submit_held(req(11, 16, 1)).unwrap();
    let pass = e.step(0);
    assert!(pass.outputs[0].completed);
    assert!(!e.has_work(), "a held source is idle: no effect-free passes");
    assert_eq!(e.num_parked(), 1);
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 4);
    assert!(!e.release_held(key, 12), "uuid guards the key");
    assert!(e.release_held(key, 11));
    assert!(!e.release_held(key, 11));
    assert_eq!((e.pool().expect("vLLM pool").num_active(), e.num_parked()), (0, 0));
    // Cancelling a held source frees it too.
    e.submit_held(req(12, 16, 1)).unwrap();
    let now = e.last_pass().end_ns;
    e.step(now);
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 4);
    assert!(e.cancel(12));
    assert_eq!((e.pool().expect("vLLM pool").num_active(), e.num_parked()), (0, 0));
    e.pool().expect("vLLM pool").check_invariants().unwrap();
}

#[test]
fn a_reserved_destination_decodes_after_activation() {
    let config = EngineConfig {
        num_gpu_blocks: 64,
        block_size: 4,
        max_num_batched_tokens: 64,
        timing_model: TimingModelConfig::Fixed { prefill_ms: 10.0, decode_ms: 1.0 },
        ..Default::default()
    };
    let mut e = Engine::new(EngineOptions { config, record_kv_events: true, ..Default::default() }).unwrap();
    let r = e.reserve(req(21, 16, 2)).unwrap();
    assert_eq!(r.transferable_prompt_tokens, 16);
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 4);
    assert!(!e.has_work(), "reserved, not scheduled");
    assert!(e.activate(r.key, 22).is_none());
    let events = e.activate(r.key, 21).unwrap();
    assert_eq!(events.len(), 1, "one Stored run for the 4 prompt blocks");
    assert!(e.activate(r.key, 21).is_none(), "activates once");
    let pass = e.step(0);
    // The first pass is a decode pass (prompt KV is present): 1 ms, token 0.
    assert_eq!(pass.end_ns, 1_000_000);
    assert_eq!((pass.outputs[0].index, pass.outputs[0].cached_tokens), (0, Some(0)));
    assert_eq!(pass.metrics.num_decode_requests, 1);
    assert_eq!(pass.metrics.sum_prefill_tokens, 0);
    let end = pass.end_ns;
    let pass = e.step(end);
    assert!(pass.outputs[0].completed);
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 0);
    // A second reservation of the same prompt reuses the resident blocks.
    let r2 = e.reserve(req(23, 16, 1)).unwrap();
    assert_eq!((r2.transferable_prompt_tokens, r2.cached_tokens), (0, 16));
    assert!(e.cancel(23));
    assert_eq!(e.pool().expect("vLLM pool").num_active(), 0);
    // A reservation that cannot fit fails cleanly.
    let err = e.reserve(req(24, 400, 1)).unwrap_err();
    assert!(err.to_string().contains("cannot reserve"), "{err}");
    assert_eq!(e.num_parked(), 0);
    e.pool().expect("vLLM pool").check_invariants().unwrap();
}

/// Activated destinations wait in order for room in the batch (`max_num_seqs`); while
/// the shell says destinations wait for a reservation, only activated ones are admitted
/// (a preempted or fresh request waits); each finish or preemption moves the capacity
/// generation.
#[test]
fn activated_destinations_wait_for_batch_room_in_order() {
    let config = EngineConfig {
        num_gpu_blocks: 64,
        block_size: 4,
        max_num_seqs: 1,
        max_num_batched_tokens: 64,
        worker_type: mocker_core::config::WorkerType::Decode,
        timing_model: TimingModelConfig::Fixed { prefill_ms: 10.0, decode_ms: 1.0 },
        ..Default::default()
    };
    let mut e = Engine::new(EngineOptions { config, ..Default::default() }).unwrap();
    let fresh = e.submit(req(30, 8, 1)).unwrap();
    let a = e.reserve(req(31, 8, 1)).unwrap();
    let b = e.reserve(req(32, 8, 1)).unwrap();
    // Activated in the opposite order: they still join in submission order.
    e.activate(b.key, 32).unwrap();
    e.activate(a.key, 31).unwrap();
    e.set_destinations_pending(true);
    let generation = e.capacity_generation();
    let admitted = |p: &mocker_core::Pass| p.admissions.iter().map(|a| a.uuid).collect::<Vec<_>>();
    let pass = e.step(0);
    // One sequence fits the batch: the first destination by submission order.
    assert_eq!(admitted(pass), [31]);
    assert!(pass.outputs.iter().any(|o| o.uuid == 31 && o.completed));
    let end = pass.end_ns;
    assert!(e.capacity_generation() > generation, "a finish gives capacity back");
    let pass = e.step(end);
    assert_eq!(admitted(pass), [32], "the fresh request waits while destinations do");
    let end = pass.end_ns;
    e.set_destinations_pending(false);
    let pass = e.step(end);
    assert_eq!(pass.admissions.iter().map(|a| a.key).collect::<Vec<_>>(), [fresh]);
}
