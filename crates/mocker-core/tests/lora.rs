//! LoRA adapters in the vLLM core: the `max_loras` batch limit, adapter-scoped prefix
//! caching and the adapter carried by KV events.

use std::sync::Arc;

use mocker_core::config::{Backend, EngineConfig, TimingModelConfig};
use mocker_core::events::KvEventData;
use mocker_core::hashing::PromptHashes;
use mocker_core::{Engine, EngineError, EngineOptions, LoraRef, Request, SubmitError};

fn config() -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: 256,
        block_size: 4,
        max_num_seqs: 16,
        max_num_batched_tokens: 256,
        timing_model: TimingModelConfig::Fixed { prefill_ms: 10.0, decode_ms: 1.0 },
        ..Default::default()
    }
}

fn engine(max_loras: usize) -> Engine {
    Engine::new(EngineOptions { config: config(), max_loras, record_kv_events: true, ..Default::default() })
        .unwrap()
}

fn lora(id: u32, name: &str) -> Option<LoraRef> {
    Some(LoraRef { id, name: Arc::from(name) })
}

fn req(uuid: u128, lora: Option<LoraRef>) -> Request {
    Request { uuid, tokens: (1..=16).collect(), max_output_tokens: 4, lora, ..Default::default() }
}

/// Uuids admitted in each pass until the engine is idle.
fn admissions(e: &mut Engine) -> Vec<Vec<u128>> {
    let mut now = 0;
    let mut out = Vec::new();
    while e.has_work() {
        let pass = e.step(now);
        out.push(pass.admissions.iter().map(|a| a.uuid).collect());
        now = pass.end_ns;
    }
    out
}

#[test]
fn at_most_max_loras_adapters_share_a_batch_and_others_are_passed_over_in_order() {
    let mut e = engine(1);
    e.submit(req(1, lora(1, "a"))).unwrap();
    e.submit(req(2, lora(2, "b"))).unwrap();
    e.submit(req(3, lora(1, "a"))).unwrap();
    e.submit(req(4, None)).unwrap();
    e.submit(req(5, lora(3, "c"))).unwrap();
    let passes = admissions(&mut e);
    // Adapter "a" takes the one slot; "b" and "c" wait while base-model requests join.
    assert_eq!(passes[0], vec![1, 3, 4]);
    let later: Vec<&Vec<u128>> = passes[1..].iter().filter(|p| !p.is_empty()).collect();
    // Once "a" is done, "b" (first in line) runs; "c" only after it.
    assert_eq!(later, vec![&vec![2], &vec![5]]);

    // With two slots, "a" and "b" run together and "c" still waits.
    let mut e = engine(2);
    for (uuid, l) in [(1, lora(1, "a")), (2, lora(2, "b")), (3, lora(3, "c"))] {
        e.submit(req(uuid, l)).unwrap();
    }
    let passes = admissions(&mut e);
    assert_eq!(passes[0], vec![1, 2]);
    assert!(passes[1..].iter().any(|p| p == &vec![3]));
}

#[test]
fn waiting_and_running_adapters_are_reported() {
    let mut e = engine(1);
    e.submit(req(1, lora(1, "a"))).unwrap();
    e.submit(req(2, lora(2, "b"))).unwrap();
    e.submit(req(3, lora(1, "a"))).unwrap();
    let a = e.lora_activity();
    assert!(a.running.is_empty());
    assert_eq!(a.waiting, vec![Arc::from("a"), Arc::from("b")]);
    e.step(0);
    let a = e.lora_activity();
    assert_eq!(a.running, vec![Arc::<str>::from("a")]);
    assert_eq!(a.waiting, vec![Arc::<str>::from("b")]);
    assert!(engine(0).lora_activity().running.is_empty());
}

#[test]
fn adapters_never_share_cached_blocks_with_each_other_or_the_base_model() {
    let mut e = engine(4);
    let mut now = 0;
    // Same prompt three times, one after the other: base, adapter a, adapter a again.
    let mut cached = Vec::new();
    for (uuid, l) in [(1, None), (2, lora(1, "a")), (3, lora(1, "a")), (4, lora(2, "b"))] {
        e.submit(req(uuid, l)).unwrap();
        while e.has_work() {
            let pass = e.step(now);
            now = pass.end_ns;
            cached.extend(pass.admissions.iter().map(|a| (a.uuid, a.reused_tokens)));
        }
    }
    // Only the second request of adapter "a" reuses blocks (all full prompt blocks but
    // the last token's, as vLLM recomputes one token).
    assert_eq!(cached, vec![(1, 0), (2, 0), (3, 12), (4, 0)]);
}

#[test]
fn stored_events_carry_the_adapter_and_adapter_rooted_hashes() {
    let mut e = engine(1);
    e.submit(req(1, lora(7, "sql"))).unwrap();
    let pass = e.step(0);
    let stored: Vec<_> = pass
        .kv_events
        .iter()
        .filter_map(|ev| match &ev.data {
            KvEventData::Stored { parent_hash, blocks, lora } => Some((parent_hash, blocks, lora)),
            _ => None,
        })
        .collect();
    assert_eq!(stored.len(), 1);
    let (parent, blocks, l) = stored[0];
    assert_eq!(*parent, None, "the first block has no parent block in the event");
    assert_eq!(l, &lora(7, "sql"));
    let tokens: Vec<u32> = (1..=16).collect();
    let root = LoraRef { id: 7, name: Arc::from("sql") }.hash_root();
    let want = PromptHashes::rooted(&tokens, 4, Some(root));
    let got: Vec<u64> = blocks.iter().map(|b| b.block_hash).collect();
    assert_eq!(got, want.sequence);
    assert_ne!(got, PromptHashes::of(&tokens, 4).sequence);
    // Local (tokens) hashes do not depend on the adapter.
    let locals: Vec<u64> = blocks.iter().map(|b| b.tokens_hash).collect();
    assert_eq!(locals, PromptHashes::of(&tokens, 4).local);
}

#[test]
fn adapters_are_refused_where_they_are_not_modelled() {
    let mut e = engine(0);
    assert_eq!(e.submit(req(9, lora(1, "a"))), Err(EngineError::Submit(SubmitError::LoraDisabled(9))));
    let sglang = EngineConfig { backend: Backend::Sglang, ..config() };
    let err = Engine::new(EngineOptions { config: sglang.clone(), max_loras: 1, ..Default::default() });
    assert_eq!(err.err(), Some(EngineError::LoraUnsupported));
    let mut e = Engine::new(EngineOptions { config: sglang, ..Default::default() }).unwrap();
    assert!(matches!(e.submit(req(9, lora(1, "a"))), Err(EngineError::Submit(SubmitError::LoraDisabled(9)))));
}
