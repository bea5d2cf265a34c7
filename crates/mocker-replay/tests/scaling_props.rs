//! Dynamic pools under random scaling plans, aggregated and disaggregated, both routers:
//! every request is served exactly once and completes; no request is routed to a worker
//! before it is ready or after it began draining; every worker's lifecycle is a valid
//! sequence whose removal comes after its last request; and the worker-seconds are the
//! workers' live time.

use std::collections::{HashMap, HashSet};

use mocker_core::config::LaunchConfig;
use mocker_replay::request_log::PoolKind;
use mocker_replay::scaling::{LifecycleOperation, PlanStep, PoolName, ScalingPlan, TransitionKind};
use mocker_replay::{
    run_replay, Cluster, Hooks, Load, Pool, ReplayOptions, RequestRecord, RouterMode, SyntheticWorkload,
};
use proptest::prelude::*;
use serde_json::json;

const REQUESTS: usize = 60;

fn launch(worker_type: &str, startup_s: f64, dp: usize) -> LaunchConfig {
    LaunchConfig::from_value(json!({
        "engine": {"block_size": 16, "num_gpu_blocks": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048,
                   "worker_type": worker_type},
        "startup_time": startup_s,
        "dp_size": dp,
    }))
    .unwrap()
}

/// Per pool and worker: [ready, drain] in ms (drain: infinity while it never drained) and
/// its removal, from the lifecycle (initial workers are ready at 0).
type Windows = HashMap<(PoolName, usize), (f64, f64, Option<f64>)>;

fn windows(initial: &[(PoolName, usize)], ops: &[LifecycleOperation]) -> Result<Windows, String> {
    let mut w: Windows = HashMap::new();
    for &(pool, n) in initial {
        for id in 0..n {
            w.insert((pool, id), (0.0, f64::INFINITY, None));
        }
    }
    let mut seen_starting = HashSet::new();
    for op in ops {
        for t in &op.transitions {
            let key = (op.pool, t.worker_id);
            match t.transition {
                TransitionKind::WorkerStarting => {
                    if !seen_starting.insert(key) || w.contains_key(&key) {
                        return Err(format!("{key:?} started twice"));
                    }
                }
                TransitionKind::WorkerReady => {
                    if w.insert(key, (op.at_ms, f64::INFINITY, None)).is_some() {
                        return Err(format!("{key:?} became ready twice"));
                    }
                }
                TransitionKind::WorkerDraining => {
                    let e = w.get_mut(&key).ok_or(format!("{key:?} drained before it was ready"))?;
                    if e.1.is_finite() {
                        return Err(format!("{key:?} drained twice"));
                    }
                    e.1 = op.at_ms;
                }
                TransitionKind::WorkerRemoved => match w.get_mut(&key) {
                    // A start-up cancelled: it never served.
                    None if seen_starting.contains(&key) => {}
                    None => return Err(format!("{key:?} removed before it existed")),
                    Some(e) if !e.1.is_finite() => return Err(format!("{key:?} removed without draining")),
                    Some(e) => e.2 = Some(op.at_ms),
                },
            }
        }
    }
    Ok(w)
}

fn check(
    records: &[RequestRecord],
    ops: &[LifecycleOperation],
    initial: &[(PoolName, usize)],
    disaggregated: bool,
) -> Result<(), String> {
    let uuids: HashSet<&str> = records.iter().map(|r| r.uuid.as_str()).collect();
    if records.len() != REQUESTS || uuids.len() != REQUESTS {
        return Err(format!("{} records, {} distinct", records.len(), uuids.len()));
    }
    let w = windows(initial, ops)?;
    let mut last_end: HashMap<(PoolName, usize), f64> = HashMap::new();
    for r in records {
        if r.terminal_status != "completed" || r.output_length != r.requested_output_length {
            return Err(format!("{} ended {} with {} tokens", r.uuid, r.terminal_status, r.output_length));
        }
        for entry in &r.routing_history {
            let (pool, at) = match entry.pool {
                PoolKind::Agg => (PoolName::Agg, r.arrival_time_ms),
                PoolKind::Prefill => (PoolName::Prefill, r.arrival_time_ms),
                PoolKind::Decode => (PoolName::Decode, r.handoff.source_held_ms.unwrap_or(r.arrival_time_ms)),
            };
            let key = (pool, entry.logical_worker_id as usize);
            let (ready, drain, _) = w.get(&key).ok_or(format!("{} routed to unknown {key:?}", r.uuid))?;
            if at < *ready || at > *drain {
                return Err(format!("{} routed to {key:?} at {at}, outside [{ready}, {drain}]", r.uuid));
            }
            let end = last_end.entry(key).or_insert(0.0);
            *end = end.max(r.terminal_time_ms);
        }
    }
    for (key, (_, _, removed)) in &w {
        if let (Some(removed), Some(end)) = (removed, last_end.get(key)) {
            // A decode worker holds its request to the end; a prefill worker until handoff.
            if !disaggregated && removed < end {
                return Err(format!("{key:?} removed at {removed} before its last request ended at {end}"));
            }
        }
    }
    Ok(())
}

fn plan_strategy() -> impl Strategy<Value = Vec<(f64, Option<usize>, Option<usize>)>> {
    prop::collection::vec((0u32..40, prop::option::of(1usize..5), prop::option::of(1usize..5)), 1..5)
        .prop_map(|mut steps| {
            steps.sort_by_key(|s| s.0);
            steps.dedup_by_key(|s| s.0);
            steps
                .into_iter()
                .map(|(t, p, d)| (f64::from(t) * 100.0, p, d.or(if p.is_none() { Some(1) } else { None })))
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn random_plans_serve_every_request_once_on_live_workers(
        steps in plan_strategy(),
        disaggregated in any::<bool>(),
        kv in any::<bool>(),
        startup in prop::sample::select(vec![0.0, 0.25]),
        workers in 1usize..3,
        // Data-parallel ranks, aggregated only (as the reference).
        dp in 1usize..3,
    ) {
        let plan = ScalingPlan::new(
            steps.iter().map(|&(at_ms, prefill, decode)| PlanStep { at_ms, prefill, decode }).collect(),
        ).unwrap();
        let (cluster, initial) = if disaggregated {
            (
                Cluster::Disaggregated {
                    prefill: Pool { launch: launch("prefill", startup, 1), workers },
                    decode: Pool { launch: launch("decode", startup, 1), workers },
                },
                vec![(PoolName::Prefill, workers), (PoolName::Decode, workers)],
            )
        } else {
            (Cluster::aggregated(launch("aggregated", startup, dp), workers), vec![(PoolName::Agg, workers)])
        };
        let options = ReplayOptions {
            cluster,
            workload: SyntheticWorkload {
                input_tokens: 300,
                output_tokens: 30,
                request_count: REQUESTS,
                load: Load::RequestRate(30.0),
                shared_prefix_ratio: 0.5,
                num_prefix_groups: 3,
                ..Default::default()
            }
            .into(),
            router: if kv { RouterMode::Kv } else { RouterMode::RoundRobin },
            ..Default::default()
        };
        let mut plan = plan;
        let mut records = Vec::new();
        let mut keep = |r: RequestRecord| records.push(r);
        let hooks = Hooks {
            scaling_policy: Some(&mut plan),
            capture_planner_details: true,
            request_ended: Some(&mut keep),
            ..Default::default()
        };
        let outcome = run_replay(&options, hooks).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(outcome.summary.completed_requests, REQUESTS as u64);
        check(&records, &outcome.lifecycle_operations, &initial, disaggregated).map_err(TestCaseError::fail)?;
        // Worker-seconds: each worker's live time, from its creation to its removal or the end.
        let end = outcome.summary.duration_ms;
        let mut live: HashMap<(PoolName, usize), (f64, Option<f64>)> = HashMap::new();
        for &(pool, n) in &initial {
            for id in 0..n {
                live.insert((pool, id), (0.0, None));
            }
        }
        for op in &outcome.lifecycle_operations {
            for t in &op.transitions {
                let key = (op.pool, t.worker_id);
                match t.transition {
                    TransitionKind::WorkerStarting => { live.insert(key, (op.at_ms, None)); }
                    TransitionKind::WorkerReady => { live.entry(key).or_insert((op.at_ms, None)); }
                    TransitionKind::WorkerRemoved => { live.get_mut(&key).unwrap().1 = Some(op.at_ms); }
                    TransitionKind::WorkerDraining => {}
                }
            }
        }
        let seconds = |pools: &[PoolName]| -> f64 {
            live.iter()
                .filter(|(k, _)| pools.contains(&k.0))
                .map(|(_, &(from, to))| (to.unwrap_or(end) - from) / 1e3)
                .sum()
        };
        let decode = seconds(&[PoolName::Agg, PoolName::Decode]);
        prop_assert!((outcome.summary.decode_worker_seconds - decode).abs() < 1e-6, "{} vs {decode}", outcome.summary.decode_worker_seconds);
        if disaggregated {
            let prefill = seconds(&[PoolName::Prefill]);
            prop_assert!((outcome.summary.prefill_worker_seconds - prefill).abs() < 1e-6);
        }
    }
}
