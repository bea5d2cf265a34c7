//! Later turns of different sessions due at the same instant start in the sessions' file
//! order, as the reference (ai-dynamo-runtime 1.6.1) releases them: its driver keeps due
//! turns in one heap ordered by (due time, session index, turn), so the order their previous
//! turns completed in does not matter. The figures below are the reference's for this trace
//! (`run_mocker_trace_replay`, `trace_block_size=512`, `capture_per_request=True`).

use std::sync::Arc;

use mocker_core::config::LaunchConfig;
use mocker_replay::trace::load::parse_trace;
use mocker_replay::{run_replay, Cluster, Hooks, ReplayOptions, TraceFormat, TraceWorkload, Workload};

/// Session `b` (later in the file) arrives first, so it runs ahead of `a`; one more output
/// token makes both first turns end in the same pass (56.88 ms), and both second turns are
/// due 100 ms later. The batch budget (1024) holds one 1000-token prompt: the one released
/// first gets its first token a pass earlier.
const TRACE: &str = r#"{"session_id": "a", "timestamp": 10, "hash_ids": [1], "input_length": 16, "output_length": 4}
{"session_id": "a", "delay": 100, "hash_ids": [1, 2], "input_length": 1000, "output_length": 2}
{"session_id": "b", "timestamp": 0, "hash_ids": [10], "input_length": 16, "output_length": 5}
{"session_id": "b", "delay": 100, "hash_ids": [10, 11], "input_length": 1000, "output_length": 2}"#;

#[test]
fn turns_due_together_start_in_session_order() {
    let engine = r#"{"engine": {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 1024,
        "num_gpu_blocks": 1000, "enable_prefix_caching": false}}"#;
    let trace = parse_trace(TRACE, TraceFormat::Mooncake, Some(512)).expect("trace");
    let options = ReplayOptions {
        cluster: Cluster::aggregated(LaunchConfig::from_json_str(engine).expect("engine args"), 1),
        workload: Workload::Trace(TraceWorkload {
            trace: Arc::new(trace),
            concurrency: None,
            repeat: 1,
            lanes: None,
        }),
        ..Default::default()
    };
    let mut records = Vec::new();
    let mut sink = |r: mocker_replay::RequestRecord| records.push(r);
    let out =
        run_replay(&options, Hooks { request_ended: Some(&mut sink), ..Default::default() }).expect("replay");
    let close = |got: f64, want: f64| (got - want).abs() <= 1e-9 * want.abs().max(1.0);
    // (session, turn, arrival, first token, last token), the reference's.
    let want = [
        ("b", 0, 0.0, 16.744463, 56.880563),
        ("a", 0, 10.0, 39.286283, 56.880563),
        ("a", 1, 156.880563, 189.371275, 230.111019),
        ("b", 1, 156.880563, 230.111019, 239.129272),
    ];
    for (session, turn, arrival, first, last) in want {
        let r = records
            .iter()
            .find(|r| r.session_id.as_deref() == Some(session) && r.turn_index == Some(turn))
            .unwrap_or_else(|| panic!("no record of {session} turn {turn}"));
        let got = (r.arrival_time_ms, r.first_token_ms.unwrap(), r.last_token_ms.unwrap());
        assert!(
            close(got.0, arrival) && close(got.1, first) && close(got.2, last),
            "{session} turn {turn}: mocker {got:?}, reference {:?}",
            (arrival, first, last)
        );
    }
    let s = out.summary;
    assert!(close(s.duration_ms, 239.129272), "duration {}", s.duration_ms);
    assert!(close(s.ttft_ms.mean, 37.9379785), "mean TTFT {}", s.ttft_ms.mean);
    assert!(close(s.e2e_latency_ms.mean, 64.81007275), "mean E2E {}", s.e2e_latency_ms.mean);
}
