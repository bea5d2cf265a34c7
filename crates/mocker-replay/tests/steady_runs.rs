//! Steady runs are invisible: a replay whose workers run many steady passes as one event
//! (truncated when a request arrives mid-run) reports what the same replay stepping every
//! pass reports. Per-request logs turn the runs off, so a replay with a log sink is the
//! pass-by-pass one. Only the floating-point sums behind ITL means may differ, by rounding.

use std::sync::Arc;

use mocker_core::config::{LaunchConfig, TimingModelConfig};
use mocker_replay::trace::load::parse_trace;
use mocker_replay::{
    run_replay, Cluster, Hooks, Load, ReplayOptions, RouterMode, SyntheticWorkload, TraceFormat,
    TraceWorkload, Workload,
};
use serde_json::Value;

/// Engine args with `block_size` and, when given, a pool size and timing model.
fn launch(block_size: usize, blocks: Option<usize>, timing: Option<TimingModelConfig>) -> LaunchConfig {
    let mut launch = LaunchConfig::default();
    launch.engine.block_size = block_size;
    if let Some(n) = blocks {
        launch.engine.num_gpu_blocks = n;
    }
    if let Some(t) = timing {
        launch.engine.timing_model = t;
    }
    launch
}

fn summaries(options: &ReplayOptions) -> (Value, Value) {
    let with_runs = run_replay(options, Hooks::default()).unwrap();
    let mut sink = |_| {};
    let single = run_replay(options, Hooks { request_ended: Some(&mut sink), ..Default::default() }).unwrap();
    (serde_json::to_value(&with_runs.summary).unwrap(), serde_json::to_value(&single.summary).unwrap())
}

fn assert_same(a: &Value, b: &Value, path: &str) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(x.len(), y.len(), "{path}");
            for (k, v) in x {
                if k == "wall_time_ms" || k.starts_with("processed_") {
                    continue;
                }
                assert_same(v, &y[k], &format!("{path}.{k}"));
            }
        }
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-9 * x.abs().max(y.abs()), "{path}: {x} vs {y}");
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

fn check(options: ReplayOptions) {
    let (runs, single) = summaries(&options);
    assert!(runs["completed_requests"].as_u64().unwrap() > 0);
    assert_same(&runs, &single, "summary");
}

#[test]
fn synthetic_arrivals_mid_run_see_the_same_engines() {
    for router in [RouterMode::RoundRobin, RouterMode::Kv] {
        let workload = SyntheticWorkload {
            input_tokens: 700,
            output_tokens: 300,
            request_count: 120,
            load: Load::RequestRate(12.0),
            turns_per_session: 2,
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 3,
            ..Default::default()
        };
        let mut options = ReplayOptions {
            workload: Workload::Synthetic(workload),
            cluster: Cluster::aggregated(launch(16, None, None), 3),
            router,
            ..Default::default()
        };
        check(options.clone());
        // A cap inside the run: runs stop at it, and the pass crossing it is never delivered.
        options.max_sim_time_ms = Some(4_321.0);
        check(options);
    }
}

#[test]
fn trace_arrivals_and_preemption_see_the_same_engines() {
    // Rows arrive 40 ms apart, sharing leading ids in four families, with long outputs, so
    // arrivals land inside runs on every worker.
    let rows: Vec<String> = (0..60u64)
        .map(|i| {
            let family = i % 4;
            let ids: Vec<String> = (0..6u64)
                .map(|b| if b < 3 { family * 100 + b } else { 10_000 + i * 10 + b }.to_string())
                .collect();
            format!(
                r#"{{"timestamp": {}, "input_length": {}, "output_length": {}, "hash_ids": [{}]}}"#,
                i * 40,
                5 * 64 + (i % 7) * 9,
                150 + (i % 5) * 40,
                ids.join(", ")
            )
        })
        .collect();
    let trace = Arc::new(parse_trace(&rows.join("\n"), TraceFormat::Mooncake, Some(64)).unwrap());
    // Fixed pass times put pass ends on the arrivals' 40 ms grid and on each other, so
    // arrivals meet runs ending at that very time and workers finish passes together.
    let fixed = TimingModelConfig::Fixed { prefill_ms: 20.0, decode_ms: 10.0 };
    for (router, blocks, timing) in [
        (RouterMode::Kv, 2_000, TimingModelConfig::Polynomial),
        (RouterMode::RoundRobin, 40, TimingModelConfig::Polynomial),
        (RouterMode::Kv, 2_000, fixed.clone()),
        (RouterMode::RoundRobin, 2_000, fixed),
    ] {
        let options = ReplayOptions {
            workload: Workload::Trace(TraceWorkload {
                trace: trace.clone(),
                concurrency: None,
                repeat: 1,
                lanes: None,
            }),
            // 40 blocks of 16 tokens: requests preempt each other.
            cluster: Cluster::aggregated(launch(16, Some(blocks), Some(timing)), 4),
            router,
            ..Default::default()
        };
        check(options);
    }
}
