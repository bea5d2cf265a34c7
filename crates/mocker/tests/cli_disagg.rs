//! `mocker replay` and `mocker sweep` with disaggregated prefill/decode pools: the real
//! binary's report, and every refusal of a bad combination (exit 2, naming the flag).

mod cli;

use cli::{assert_exit_2, mocker, report, scratch, stderr};

const WORKLOAD: [&str; 8] =
    ["--input-tokens", "1000", "--output-tokens", "4", "--request-count", "1", "--concurrency", "1"];
const PREFILL: &str =
    r#"{"worker_type": "prefill", "kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 64}"#;
const DECODE: &str = r#"{"worker_type": "decode"}"#;

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["replay"];
    a.extend_from_slice(&WORKLOAD);
    a.extend_from_slice(extra);
    a
}

#[test]
fn disaggregated_replay_reports_both_pools() {
    let dir = scratch("disagg");
    let s = report(
        &dir,
        "r",
        &args(&[
            "--prefill-engine-args",
            PREFILL,
            "--decode-engine-args",
            DECODE,
            "--num-decode-workers",
            "2",
        ])[1..],
    );
    // The reference's figure for this request (full-prompt transfer, 2.048 ms).
    assert!((s["mean_ttft_ms"].as_f64().unwrap() - 39.945344).abs() < 1e-6, "{s}");
    let duration_s = s["duration_ms"].as_f64().unwrap() / 1e3;
    assert!((s["prefill_worker_seconds"].as_f64().unwrap() - duration_s).abs() < 1e-9);
    assert!((s["decode_worker_seconds"].as_f64().unwrap() - 2.0 * duration_s).abs() < 1e-9);
    assert_eq!(s["prefill_gpus_per_worker"], 1);
}

#[test]
fn bad_combinations_exit_2_naming_the_flag() {
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--engine-args", "{}", "--prefill-engine-args", PREFILL, "--decode-engine-args", DECODE],
            vec!["--engine-args", "--prefill-engine-args"],
        ),
        (vec!["--prefill-engine-args", PREFILL], vec!["--decode-engine-args"]),
        (vec!["--decode-engine-args", DECODE], vec!["--prefill-engine-args"]),
        (
            vec!["--prefill-engine-args", "{}", "--decode-engine-args", DECODE],
            vec!["prefill_engine_args.worker_type=prefill", "got aggregated"],
        ),
        (
            vec!["--prefill-engine-args", PREFILL, "--decode-engine-args", r#"{"worker_type": "prefill"}"#],
            vec!["decode_engine_args.worker_type=decode"],
        ),
        (
            vec![
                "--prefill-engine-args",
                PREFILL,
                "--decode-engine-args",
                r#"{"worker_type": "decode", "block_size": 32}"#,
            ],
            vec!["block_size", "got 64 and 32"],
        ),
        (
            vec![
                "--prefill-engine-args",
                PREFILL,
                "--decode-engine-args",
                r#"{"worker_type": "decode", "backend": "sglang", "block_size": 64}"#,
            ],
            vec!["--decode-engine-args", "backend", "got vllm and sglang"],
        ),
        (
            vec![
                "--prefill-engine-args",
                PREFILL,
                "--decode-engine-args",
                DECODE,
                "--num-prefill-workers",
                "0",
            ],
            vec!["--num-prefill-workers", "at least 1"],
        ),
        (
            vec!["--prefill-engine-args", PREFILL, "--decode-engine-args", DECODE, "--num-workers", "2"],
            vec!["--num-workers"],
        ),
        (
            vec!["--prefill-engine-args", PREFILL, "--decode-engine-args", DECODE, "--mode", "online"],
            vec!["--mode", "replay_mode='offline'"],
        ),
        (vec!["--num-decode-workers", "2"], vec!["--num-decode-workers", "disaggregated"]),
        (
            vec!["--engine-args", r#"{"worker_type": "prefill"}"#],
            vec!["--engine-args", "aggregated workers", "prefill"],
        ),
        (
            vec!["--engine-args", r#"{"is_decode": true}"#],
            vec!["--engine-args", "aggregated workers", "decode"],
        ),
    ];
    for (extra, needles) in cases {
        assert_exit_2(&args(&extra), &needles);
    }
}

#[test]
fn sweep_searches_prefill_decode_ratios() {
    let dir = scratch("disagg-sweep");
    let csv_path = dir.join("s.csv");
    let mut a = vec!["sweep", "--input-tokens", "1000", "--output-tokens", "4", "--request-count", "8"];
    a.extend_from_slice(&[
        "--prefill-engine-args",
        PREFILL,
        "--decode-engine-args",
        DECODE,
        "--sweep-num-prefill-workers",
        "1,2",
        "--sweep-num-decode-workers",
        "1,3",
        "--output-csv",
        csv_path.to_str().unwrap(),
    ]);
    let out = mocker(&a);
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = std::fs::read_to_string(&csv_path).unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no {name}"));
    let (p, d, done) = (col("num_prefill_workers"), col("num_decode_workers"), col("completed_requests"));
    let rows: Vec<(String, String, String)> = reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            (r[p].to_string(), r[d].to_string(), r[done].to_string())
        })
        .collect();
    let grid: Vec<(&str, &str)> = rows.iter().map(|(p, d, _)| (p.as_str(), d.as_str())).collect();
    assert_eq!(grid, [("1", "1"), ("1", "3"), ("2", "1"), ("2", "3")]);
    assert!(rows.iter().all(|(_, _, c)| c == "8"), "{rows:?}");
    let mut bad = vec!["sweep"];
    bad.extend_from_slice(&WORKLOAD);
    bad.extend_from_slice(&[
        "--prefill-engine-args",
        PREFILL,
        "--decode-engine-args",
        DECODE,
        "--sweep-num-workers",
        "1,2",
    ]);
    assert_exit_2(&bad, &["--sweep-num-workers", "aggregated sweeps only"]);
    let mut bad = vec!["sweep"];
    bad.extend_from_slice(&WORKLOAD);
    bad.extend_from_slice(&["--sweep-num-prefill-workers", "1,2"]);
    assert_exit_2(&bad, &["--sweep-num-prefill-workers", "disaggregated sweeps only"]);
}

#[test]
fn transfer_keys_where_they_do_nothing_are_named_in_a_warning() {
    let decode_with_transfer = r#"{"worker_type": "decode", "kv_transfer_bandwidth": 64}"#;
    let out =
        mocker(&args(&["--prefill-engine-args", PREFILL, "--decode-engine-args", decode_with_transfer]));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--decode-engine-args: kv_transfer_bandwidth not used here"), "{err}");
    let out = mocker(&args(&["--engine-args", r#"{"kv_transfer_timing_mode": "destination_missing"}"#]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("--engine-args: kv_transfer_timing_mode not used here"));
}

/// The reference's replay ignores `startup_time` (workers are up from t=0; measured: 2 s
/// changes no figure) and orders no queue without the KV router: both are named in a warning.
#[test]
fn serve_and_router_only_launch_keys_are_named_in_a_warning() {
    let out = mocker(&args(&["--engine-args", r#"{"engine": {}, "startup_time": 2}"#]));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--engine-args: startup_time not used by this replay"), "{err}");
    let policy = r#"{"engine": {}, "dynamo": {"router_queue_policy": "lcfs"}}"#;
    let out = mocker(&args(&["--engine-args", policy]));
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--engine-args: dynamo.router_queue_policy not used here"), "{err}");
    let out = mocker(&args(&["--engine-args", policy, "--router", "kv"]));
    assert!(!stderr(&out).contains("router_queue_policy"), "{}", stderr(&out));
}
