//! `mocker replay --report-jsonl`: per-request records carry every field of the
//! reference's record (ai-dynamo-runtime 1.6.1, `capture_per_request=True`) under its
//! names, arrival-sorted, with its values on small deterministic workloads. The pinned
//! figures were read from the reference's records of the same runs.

mod cli;

use std::path::Path;

use cli::{report, scratch};
use serde_json::Value;

/// The reference's 34 per-request fields, in its order (from its actual output).
const REFERENCE_FIELDS: [&str; 34] = [
    "session_id",
    "turn_index",
    "uuid",
    "arrival_time_ms",
    "dispatched_at_ms",
    "first_admit_ms",
    "terminal_time_ms",
    "first_token_ms",
    "last_token_ms",
    "ttft_ms",
    "ttst_ms",
    "e2e_latency_ms",
    "itl_ms",
    "input_length",
    "requested_output_length",
    "output_length",
    "reused_input_tokens",
    "prefill_worker_idx",
    "decode_worker_idx",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "source_released_ms",
    "decode_reused_input_tokens",
    "prefill_route_overlap_tokens",
    "decode_route_overlap_tokens",
    "routing_history",
    "admission_history",
    "admission_count",
    "readmission_count",
    "pressure_record_ordinals",
    "terminal_status",
];

const ROUTING_FIELDS: [&str; 13] = [
    "pool",
    "outcome",
    "queue_entered_at_ms",
    "released_at_ms",
    "queue_wait_ms",
    "logical_worker_id",
    "scheduler_id",
    "dp_rank",
    "reported_overlap_tokens",
    "selected_overlap_blocks",
    "best_available_overlap_blocks",
    "overlap_regret_blocks",
    "placement_replica_id",
];

const ADMISSION_FIELDS: [&str; 6] =
    ["admission_ordinal", "pool_admission_ordinal", "pool", "at_ms", "reused_input_tokens", "is_readmission"];

fn records(dir: &Path, args: &[&str]) -> Vec<Value> {
    let jsonl = dir.join("records.jsonl");
    report(dir, "r", &[args, &["--report-jsonl", jsonl.to_str().unwrap()]].concat());
    let text = std::fs::read_to_string(&jsonl).expect("records written");
    let recs: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    for r in &recs {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        // The reference's fields first and in its order, mocker's own after them.
        assert_eq!(keys[..34], REFERENCE_FIELDS, "{r}");
        for (list, fields) in
            [("routing_history", &ROUTING_FIELDS[..]), ("admission_history", &ADMISSION_FIELDS)]
        {
            for e in r[list].as_array().unwrap() {
                let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
                assert_eq!(keys, fields, "{list}: {e}");
            }
        }
        assert_eq!(
            r["token_times_ms"].as_array().unwrap().len() as u64,
            r["output_length"].as_u64().unwrap()
        );
    }
    let arrivals: Vec<f64> = recs.iter().map(|r| r["arrival_time_ms"].as_f64().unwrap()).collect();
    assert!(arrivals.windows(2).all(|w| w[0] <= w[1]), "arrival-sorted: {arrivals:?}");
    recs
}

fn close(v: &Value, want: f64, what: &str) {
    let got = v.as_f64().unwrap_or_else(|| panic!("{what}: {v} is not a number"));
    assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{what}: {got} vs the reference's {want}");
}

fn pools(list: &Value) -> Vec<(&str, f64)> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| (e["pool"].as_str().unwrap(), e["at_ms"].as_f64().or(e["queue_wait_ms"].as_f64()).unwrap()))
        .collect()
}

/// Three Mooncake rows, one session-less and a two-turn session that reuses the first
/// row's prefix: sessions, turns, times and reuse as the reference records them.
#[test]
fn trace_records_match_the_reference() {
    let dir = scratch("trace");
    let trace = dir.join("t.jsonl");
    std::fs::write(
        &trace,
        r#"{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1,2]}
{"timestamp": 10, "input_length": 1024, "output_length": 4, "hash_ids": [1,2], "session_id": "s"}
{"timestamp": 300, "input_length": 1536, "output_length": 3, "hash_ids": [1,2,3], "session_id": "s"}
"#,
    )
    .unwrap();
    let recs = records(&dir, &[trace.to_str().unwrap(), "--engine-args", r#"{"block_size": 64}"#]);
    assert_eq!(recs.len(), 3);
    // (session, turn, arrival, first admit, first token, terminal, ttst, itl, reused)
    let want = [
        ("request_1", 0, 0.0, 0.0, 27.336117, 72.993114, 28.170036, 11.41424925, 0),
        ("s", 0, 10.0, 27.336117, 55.506153, 72.993114, 5.828884, 5.828987, 640),
        ("s", 1, 362.993114, 362.993114, 387.378818, 399.017094, 5.819112, 5.819138, 1024),
    ];
    for (r, w) in recs.iter().zip(want) {
        assert_eq!((r["session_id"].as_str().unwrap(), r["turn_index"].as_u64().unwrap()), (w.0, w.1));
        close(&r["arrival_time_ms"], w.2, "arrival_time_ms");
        close(&r["first_admit_ms"], w.3, "first_admit_ms");
        close(&r["first_token_ms"], w.4, "first_token_ms");
        close(&r["terminal_time_ms"], w.5, "terminal_time_ms");
        close(&r["ttst_ms"], w.6, "ttst_ms");
        close(&r["itl_ms"], w.7, "itl_ms");
        assert_eq!(r["reused_input_tokens"], w.8);
        assert_eq!(r["dispatched_at_ms"], Value::Null);
        assert_eq!(
            (r["prefill_worker_idx"].clone(), r["decode_worker_idx"].clone()),
            (Value::Null, 0.into())
        );
        assert_eq!(r["source_held_ms"], Value::Null);
        assert_eq!(pools(&r["admission_history"]), vec![("agg", w.3)]);
        assert_eq!(r["routing_history"][0]["outcome"], "immediate");
        assert_eq!(
            r["routing_history"][0]["selected_overlap_blocks"],
            Value::Null,
            "round robin has no overlap"
        );
        assert_eq!((r["admission_count"].as_u64(), r["readmission_count"].as_u64()), (Some(1), Some(0)));
        assert_eq!(r["terminal_status"], "completed");
    }
}

/// 1 prefill + 1 decode worker, ISL 3000 / OSL 5, 4 requests at concurrency 2: each
/// record has a prefill and a decode routing and admission, and the handoff times.
#[test]
fn disaggregated_records_match_the_reference() {
    let dir = scratch("disagg");
    let recs = records(
        &dir,
        &[
            "--input-tokens",
            "3000",
            "--output-tokens",
            "5",
            "--request-count",
            "4",
            "--concurrency",
            "2",
            "--prefill-engine-args",
            r#"{"block_size": 64, "worker_type": "prefill"}"#,
            "--decode-engine-args",
            r#"{"block_size": 64, "worker_type": "decode"}"#,
        ],
    );
    assert_eq!(recs.len(), 4);
    // (arrival, held = decode admission, first token, terminal)
    let waves = [(0.0, 122.75802, 128.806225, 153.000069), (153.000069, 275.758089, 281.806294, 306.000138)];
    for (i, r) in recs.iter().enumerate() {
        let (arrival, held, first, end) = waves[i / 2];
        close(&r["arrival_time_ms"], arrival, "arrival_time_ms");
        close(&r["first_admit_ms"], arrival, "first_admit_ms");
        close(&r["prefill_admit_ms"], arrival, "prefill_admit_ms");
        for k in ["source_held_ms", "destination_reserved_ms", "destination_activated_ms", "decode_admit_ms"]
        {
            close(&r[k], held, k);
        }
        close(&r["source_released_ms"], held, "source_released_ms");
        close(&r["first_token_ms"], first, "first_token_ms");
        close(&r["terminal_time_ms"], end, "terminal_time_ms");
        close(&r["itl_ms"], 6.048461, "itl_ms");
        assert_eq!((r["prefill_worker_idx"].as_u64(), r["decode_worker_idx"].as_u64()), (Some(0), Some(0)));
        assert_eq!(r["decode_reused_input_tokens"], 0);
        assert_eq!(
            (r["prefill_route_overlap_tokens"].as_u64(), r["decode_route_overlap_tokens"].as_u64()),
            (Some(0), Some(0))
        );
        let routes: Vec<&str> =
            r["routing_history"].as_array().unwrap().iter().map(|e| e["pool"].as_str().unwrap()).collect();
        assert_eq!(routes, ["prefill", "decode"]);
        let adm = &r["admission_history"];
        let names: Vec<&str> = pools(adm).into_iter().map(|p| p.0).collect();
        assert_eq!(names, ["prefill", "decode"]);
        close(&adm[0]["at_ms"], arrival, "prefill admission");
        close(&adm[1]["at_ms"], held, "decode admission");
        assert_eq!(
            (adm[1]["admission_ordinal"].as_u64(), adm[1]["pool_admission_ordinal"].as_u64()),
            (Some(1), Some(0))
        );
        assert_eq!(adm[1]["is_readmission"], false);
        assert_eq!((r["admission_count"].as_u64(), r["readmission_count"].as_u64()), (Some(2), Some(0)));
    }
}

/// KV router with a queue (threshold 0.1), 2 workers of 2 sequences, 6 requests of
/// 2000 tokens at once: the last four wait in the router queue, as in the reference.
#[test]
fn queued_routing_matches_the_reference() {
    let dir = scratch("queued");
    let recs = records(
        &dir,
        &[
            "--input-tokens",
            "2000",
            "--output-tokens",
            "5",
            "--request-count",
            "6",
            "--concurrency",
            "6",
            "--engine-args",
            r#"{"block_size": 64, "max_num_seqs": 2, "max_num_batched_tokens": 2048}"#,
            "--num-workers",
            "2",
            "--router",
            "kv",
            "--router-config",
            r#"{"router_queue_threshold": 0.1}"#,
        ],
    );
    // (outcome, queue wait = release, first admission, terminal)
    let want = [
        ("immediate", 0.0, 0.0, 120.785307),
        ("immediate", 0.0, 0.0, 120.785307),
        ("queued", 48.552296, 48.552296, 175.180731),
        ("queued", 48.552296, 48.552296, 175.180731),
        ("queued", 102.947566, 120.785307, 198.552935),
        ("queued", 102.947566, 120.785307, 198.552935),
    ];
    let mut workers = Vec::new();
    for (r, w) in recs.iter().zip(want) {
        let route = &r["routing_history"][0];
        assert_eq!(route["outcome"], w.0);
        close(&route["queue_wait_ms"], w.1, "queue_wait_ms");
        if w.0 == "queued" {
            close(&route["queue_entered_at_ms"], 0.0, "queue_entered_at_ms");
            close(&route["released_at_ms"], w.1, "released_at_ms");
        } else {
            assert_eq!(route["released_at_ms"], Value::Null);
        }
        for k in ["selected_overlap_blocks", "best_available_overlap_blocks", "overlap_regret_blocks"] {
            assert_eq!(route[k], 0, "{k}");
        }
        close(&r["first_admit_ms"], w.2, "first_admit_ms");
        close(&r["terminal_time_ms"], w.3, "terminal_time_ms");
        assert_eq!(route["logical_worker_id"], r["decode_worker_idx"]);
        workers.push(r["decode_worker_idx"].as_u64().unwrap());
    }
    // Each wave puts one request on each worker (which one is a tie the reference breaks
    // at random).
    for wave in workers.chunks(2) {
        assert_eq!(wave.iter().sum::<u64>(), 1, "{workers:?}");
    }
}

/// 4 requests of 300 + 400 tokens on 20 blocks of 64: decode growth preempts three of
/// them, and each re-admission is recorded (with the prefix it found cached) as the
/// reference records it.
#[test]
fn readmissions_after_preemption_match_the_reference() {
    let dir = scratch("preempt");
    let recs = records(
        &dir,
        &[
            "--input-tokens",
            "300",
            "--output-tokens",
            "400",
            "--request-count",
            "4",
            "--concurrency",
            "4",
            "--engine-args",
            r#"{"block_size": 64, "num_gpu_blocks": 20}"#,
        ],
    );
    // (terminal, re-admission time and reuse)
    let want = [
        (12627.462245, None),
        (14595.60597, Some((12627.462245, 576))),
        (22831.963705, Some((12627.462245, 0))),
        (26060.216743, Some((14595.60597, 0))),
    ];
    for (r, (end, again)) in recs.iter().zip(want) {
        close(&r["terminal_time_ms"], end, "terminal_time_ms");
        let adm = r["admission_history"].as_array().unwrap();
        close(&adm[0]["at_ms"], 0.0, "first admission");
        assert_eq!(adm[0]["is_readmission"], false);
        match again {
            None => assert_eq!((adm.len(), r["readmission_count"].as_u64()), (1, Some(0))),
            Some((at, reused)) => {
                assert_eq!((adm.len(), r["readmission_count"].as_u64()), (2, Some(1)));
                close(&adm[1]["at_ms"], at, "re-admission");
                assert_eq!(adm[1]["reused_input_tokens"], reused);
                assert_eq!(adm[1]["is_readmission"], true);
                assert_eq!(
                    (adm[1]["admission_ordinal"].as_u64(), adm[1]["pool_admission_ordinal"].as_u64()),
                    (Some(1), Some(1))
                );
            }
        }
        // The record's reuse is the best admission's, as the report counts it.
        assert_eq!(r["reused_input_tokens"], again.map_or(0, |a| a.1));
    }
}

/// Synthetic workloads with sessions (several turns, or prefix groups) label each record
/// `session_{i}` and its turn, as the reference does; flat ones leave both out.
#[test]
fn synthetic_sessions_are_labelled_as_the_reference_labels_them() {
    let dir = scratch("synthetic-sessions");
    let base =
        ["--input-tokens", "1000", "--output-tokens", "10", "--request-count", "6", "--concurrency", "2"];
    // (extra flags, the first labels in arrival order)
    type Labels<'a> = Vec<(Option<&'a str>, Option<u64>)>;
    let cases: [(&[&str], Labels); 3] = [
        (
            &["--turns-per-session", "2"],
            vec![
                (Some("session_0"), Some(0)),
                (Some("session_1"), Some(0)),
                (Some("session_0"), Some(1)),
                (Some("session_1"), Some(1)),
            ],
        ),
        (
            &["--shared-prefix-ratio", "0.5", "--num-prefix-groups", "2"],
            vec![(Some("session_0"), Some(0)), (Some("session_1"), Some(0)), (Some("session_2"), Some(0))],
        ),
        (&[], vec![(None, None), (None, None), (None, None)]),
    ];
    for (extra, want) in cases {
        let recs = records(&dir, &[&base[..], extra].concat());
        let got: Vec<_> = recs
            .iter()
            .map(|r| (r["session_id"].as_str(), r["turn_index"].as_u64()))
            .take(want.len())
            .collect();
        assert_eq!(got, want, "{extra:?}");
    }
}
