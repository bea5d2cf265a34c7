//! A real engine run with a shared prefix, evictions and a cache reset, and a checker that
//! verifies decoded batches against block identities computed independently of the engine.

use std::collections::{HashMap, HashSet};

use mocker_core::config::EngineConfig;
use mocker_core::events::KvEvent;
use mocker_core::hashing::sequence_hashes;
use mocker_core::{Engine, EngineOptions, Request};

use super::mirror::{DecodedBatch, DecodedEvent};

pub const BLOCK_SIZE: usize = 4;

/// What the engine did: one entry per pass that produced events (plus the reset's
/// `Cleared`), and each request's full token sequence (prompt then output).
pub struct Scenario {
    pub batches: Vec<Vec<KvEvent>>,
    pub sequences: Vec<Vec<u32>>,
    /// Number of prompt blocks A and B share.
    pub shared_blocks: usize,
}

fn run_until_idle(engine: &mut Engine, now: &mut u64, batches: &mut Vec<Vec<KvEvent>>, out: &mut Vec<u32>) {
    for _ in 0..10_000 {
        if !engine.has_work() {
            return;
        }
        let pass = engine.step(*now);
        *now = pass.end_ns.max(*now + 1);
        for o in pass.all_outputs() {
            assert!(!o.rejected, "request rejected: the scenario must fit the pool");
            out.extend(o.token_id());
        }
        if !pass.kv_events.is_empty() {
            batches.push(pass.kv_events.clone());
        }
    }
    panic!("engine did not go idle");
}

/// Request A, then B sharing A's first three blocks, then C (unrelated, long enough to evict
/// what A and B left cached), then a prefix-cache reset.
pub fn run_scenario(dp_rank: u32) -> Scenario {
    let config = EngineConfig {
        block_size: BLOCK_SIZE,
        num_gpu_blocks: 10,
        max_num_seqs: 4,
        emit_kv_events: true,
        emit_kv_token_ids: true,
        ..EngineConfig::default()
    };
    let mut engine =
        Engine::new(EngineOptions { config, dp_rank, record_kv_events: true, ..Default::default() })
            .expect("engine");
    let shared: Vec<u32> = (100..112).collect();
    let prompts = [
        [shared.clone(), (200..206).collect()].concat(),
        [shared.clone(), (300..307).collect()].concat(),
        (1000..1030).collect::<Vec<u32>>(),
    ];
    let outputs = [5, 5, 3];
    let (mut batches, mut sequences, mut now) = (Vec::new(), Vec::new(), 0);
    for (i, (prompt, osl)) in prompts.iter().zip(outputs).enumerate() {
        let request = Request {
            uuid: i as u128 + 1,
            tokens: prompt.clone(),
            max_output_tokens: osl,
            ..Default::default()
        };
        engine.submit(request).expect("submit");
        let mut out = Vec::new();
        run_until_idle(&mut engine, &mut now, &mut batches, &mut out);
        assert_eq!(out.len(), osl);
        sequences.push([prompt.clone(), out].concat());
    }
    let cleared = engine.reset_prefix_cache().expect("no block in use").expect("events are recorded");
    batches.push(vec![cleared]);
    Scenario { batches, sequences, shared_blocks: shared.len() / BLOCK_SIZE }
}

/// Checks decoded batches against the engine's own events and against hashes recomputed
/// from the requests' tokens, with the acceptance rules of Dynamo's indexer (a Stored
/// event's parent is null at the root or a block already published and not removed).
pub fn check_batches(scenario: &Scenario, decoded: &[DecodedBatch], dp_rank: u32) {
    assert_eq!(decoded.len(), scenario.batches.len(), "one wire batch per pass with events");
    let chains: Vec<Vec<u64>> = scenario.sequences.iter().map(|s| sequence_hashes(s, BLOCK_SIZE)).collect();
    let mut position = HashMap::new();
    for (r, chain) in chains.iter().enumerate() {
        for (i, h) in chain.iter().enumerate() {
            position.entry(*h).or_insert((r, i));
        }
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let mut live: HashSet<u64> = HashSet::new();
    let (mut stored_runs, mut removed) = (Vec::new(), 0);
    for (batch, core) in decoded.iter().zip(&scenario.batches) {
        assert_eq!(batch.dp_rank, Some(dp_rank));
        assert!((now - 600.0..=now + 1.0).contains(&batch.ts), "ts {} is not wall-clock seconds", batch.ts);
        assert_eq!(batch.events, core.iter().map(DecodedEvent::from_core).collect::<Vec<_>>());
        for event in &batch.events {
            match event {
                DecodedEvent::Stored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                    lora_name,
                    extra_keys,
                    group_idx,
                } => {
                    assert_eq!(
                        (*block_size, *lora_id, medium.as_deref(), lora_name.as_deref()),
                        (BLOCK_SIZE as u32, None, Some("GPU"), None)
                    );
                    assert_eq!((extra_keys, group_idx), (&None, &None));
                    let &(r, i) =
                        position.get(&block_hashes[0]).expect("stored hash is a block of some request");
                    let n = block_hashes.len();
                    assert_eq!(block_hashes[..], chains[r][i..i + n], "hash chain of request {r}");
                    assert_eq!(*parent_block_hash, i.checked_sub(1).map(|p| chains[r][p]));
                    assert_eq!(token_ids[..], scenario.sequences[r][i * BLOCK_SIZE..(i + n) * BLOCK_SIZE]);
                    if let Some(p) = parent_block_hash {
                        assert!(live.contains(p), "parent {p} was never published or was removed");
                    }
                    for h in block_hashes {
                        assert!(live.insert(*h), "block {h} stored twice");
                    }
                    stored_runs.push((r, i, n));
                }
                DecodedEvent::Removed { block_hashes, medium, group_idx } => {
                    assert_eq!(*group_idx, None);
                    assert_eq!(medium.as_deref(), Some("GPU"));
                    for h in block_hashes {
                        assert!(live.remove(h), "removed block {h} was not cached");
                    }
                    removed += block_hashes.len();
                }
                DecodedEvent::Cleared => live.clear(),
            }
        }
    }
    // B reused A's shared prefix: its first Stored run starts right after it.
    let first_b = stored_runs.iter().find(|(r, _, _)| *r == 1).expect("B stored blocks");
    assert_eq!(first_b.1, scenario.shared_blocks, "B must not re-store the shared prefix");
    assert!(removed > 0, "C must evict cached blocks");
    assert_eq!(decoded.last().unwrap().events, vec![DecodedEvent::Cleared]);
}
