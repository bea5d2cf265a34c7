//! Agentic request graphs end to end through the offline driver: joins wait for their last
//! dependency, dispatch triggers follow the upstream's dispatch, `not_before_ms` holds a
//! chain step back, and a failed upstream request fails its dependents.

use std::sync::Arc;

use mocker_core::config::LaunchConfig;
use mocker_replay::trace::load::parse_trace;
use mocker_replay::{
    run_replay, Cluster, Hooks, ReplayOptions, RequestRecord, TraceFormat, TraceWorkload, Workload,
};

const HEADER: &str =
    r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64, "hash_id_scope": "local"}"#;

/// A v2 row of `blocks` fresh 64-token blocks (so the input length identifies the row).
fn row(id: &str, blocks: u64, out: u32, not_before: f64, deps: &str) -> String {
    let ids: Vec<String> = (0..blocks).map(|b| (blocks * 1000 + b).to_string()).collect();
    format!(
        r#"{{"request_id": "{id}", "output_length": {out}, "hash_ids": [{}], "not_before_ms": {not_before}, "dependencies": [{deps}]}}"#,
        ids.join(", ")
    )
}

fn replay(text: &str, num_gpu_blocks: Option<usize>) -> (serde_json::Value, Vec<RequestRecord>) {
    let trace = Arc::new(parse_trace(text, TraceFormat::AgenticMooncake, None).unwrap());
    let mut options = ReplayOptions {
        workload: Workload::Trace(TraceWorkload { trace, concurrency: None, repeat: 1, lanes: None }),
        ..Default::default()
    };
    let mut launch = LaunchConfig::default();
    if let Some(n) = num_gpu_blocks {
        launch.engine.num_gpu_blocks = n;
    }
    options.cluster = Cluster::aggregated(launch, 2);
    let mut records = Vec::new();
    let mut sink = |r: RequestRecord| records.push(r);
    let out = run_replay(&options, Hooks { request_ended: Some(&mut sink), ..Default::default() }).unwrap();
    (serde_json::to_value(&out.summary).unwrap(), records)
}

fn by_input(records: &[RequestRecord], input: u32) -> &RequestRecord {
    records.iter().find(|r| r.input_tokens == input).unwrap_or_else(|| panic!("no record of {input} tokens"))
}

fn end_ms(r: &RequestRecord) -> f64 {
    *r.token_times_ms.last().expect("completed requests have tokens")
}

#[test]
fn joins_wait_for_the_last_dependency_and_dispatch_triggers_follow_dispatch() {
    let text = [
        HEADER.to_string(),
        row("a", 10, 20, 0.0, ""),
        row("b", 9, 60, 10.0, ""),
        row(
            "c",
            8,
            5,
            0.0,
            r#"{"request_id": "a", "trigger": "completion", "delay_ms": 30}, {"request_id": "b", "trigger": "completion", "delay_ms": 5, "relation": "join"}"#,
        ),
        row("d", 7, 5, 0.0, r#"{"request_id": "a", "trigger": "dispatch", "delay_ms": 3}"#),
        row("e", 6, 5, 50_000.0, r#"{"request_id": "c", "delay_ms": 1}"#),
    ]
    .join("\n");
    let (summary, records) = replay(&text, None);
    assert_eq!(summary["completed_requests"], 5);
    let (a, b, c, d, e) = (
        by_input(&records, 640),
        by_input(&records, 576),
        by_input(&records, 512),
        by_input(&records, 448),
        by_input(&records, 384),
    );
    let ready = (end_ms(a) + 30.0).max(end_ms(b) + 5.0);
    assert!(end_ms(b) + 5.0 > end_ms(a) + 30.0, "b (60 tokens) is the join's last dependency");
    assert!((c.arrival_ms - ready).abs() < 1e-6, "join arrival {} vs ready {ready}", c.arrival_ms);
    assert!(c.admission_ms.unwrap() >= ready - 1e-6);
    assert!((d.arrival_ms - (a.arrival_ms + 3.0)).abs() < 1e-6, "dispatch trigger: {}", d.arrival_ms);
    assert!(d.first_token_ms.unwrap() < end_ms(a), "d does not wait for a to complete");
    assert_eq!(e.arrival_ms, 50_000.0, "not_before_ms holds the chain step back");
}

#[test]
fn a_failed_upstream_request_fails_its_dependents() {
    // 20 blocks of 64 tokens: "big" (32 blocks) can never fit and is rejected.
    let text = [
        HEADER.to_string(),
        row("ok", 2, 5, 0.0, ""),
        row("big", 32, 5, 0.0, ""),
        row("after", 3, 5, 0.0, r#"{"request_id": "big"}"#),
        row("join", 4, 5, 0.0, r#"{"request_id": "ok"}, {"request_id": "after"}"#),
        row("free", 5, 5, 0.0, r#"{"request_id": "ok"}, {"request_id": "ok", "trigger": "dispatch"}"#),
    ]
    .join("\n");
    let (summary, records) = replay(&text, Some(20));
    assert_eq!(summary["num_requests"], 5);
    assert_eq!(summary["completed_requests"], 2);
    for input in [2048, 192, 256] {
        assert_eq!(by_input(&records, input).status, "rejected", "{input}");
    }
    assert_eq!(by_input(&records, 320).status, "completed");
}
