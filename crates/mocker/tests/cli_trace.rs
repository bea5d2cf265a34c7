//! `mocker replay TRACE`: trace replay end to end (a prefix of the public conversation
//! trace, sped up), routers, determinism, and malformed traces (exit 2, file:line: field).

mod cli;

use std::path::{Path, PathBuf};

use cli::{assert_exit_2, report, scratch};
use serde_json::Value;

/// The first `n` rows of the public conversation trace.
fn conversation_prefix(dir: &Path, n: usize) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces/mooncake_conversation_trace.jsonl");
    let text = std::fs::read_to_string(&src).unwrap_or_else(|_| {
        // Where the public traces are not beside the checkout (a CI clone): a trace of the
        // same shape in which 97 prompt groups share 4 blocks each. 97 is prime to the worker
        // count, so round robin scatters a group's requests while a KV router can follow them.
        (0..400)
            .map(|i| {
                let ids: Vec<String> =
                    (0..8)
                        .map(|b| {
                            if b < 4 {
                                (i % 97 * 10 + b).to_string()
                            } else {
                                (1000 + i * 8 + b).to_string()
                            }
                        })
                        .collect();
                format!(
                    "{{\"timestamp\": {}, \"output_length\": 20, \"hash_ids\": [{}]}}",
                    i * 200,
                    ids.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    });
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, text.lines().take(n).collect::<Vec<_>>().join("\n")).unwrap();
    path
}

#[test]
fn kv_router_reuses_more_prefixes_than_round_robin_and_is_deterministic() {
    let dir = scratch("routers");
    let trace = conversation_prefix(&dir, 400);
    let t = trace.to_str().unwrap();
    let base = ["--num-workers", "4", "--arrival-speedup-ratio", "8"];
    let mut rr_args = vec![t];
    rr_args.extend_from_slice(&base);
    let rr = report(&dir, "rr", &rr_args);
    let mut kv_args = rr_args.clone();
    kv_args.extend_from_slice(&["--router", "kv"]);
    let kv = report(&dir, "kv", &kv_args);
    assert_eq!(rr["completed_requests"], 400);
    assert_eq!(kv["completed_requests"], 400);
    let (r, k) = (
        rr["prefix_cache_reused_ratio"].as_f64().unwrap(),
        kv["prefix_cache_reused_ratio"].as_f64().unwrap(),
    );
    assert!(k > r * 1.2, "kv reuse {k} vs round robin {r}");
    // Seeded tie-breaks: the same run twice gives the same simulated figures.
    let again = report(&dir, "kv2", &kv_args);
    for key in ["duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "prefix_cache_reused_ratio"] {
        assert_eq!(kv[key], again[key], "{key}");
    }
    // A different seed may place differently but still completes everything.
    kv_args.extend_from_slice(&[
        "--router-config",
        r#"{"seed": 9, "router_queue_threshold": 1.0, "router_queue_policy": "wspt"}"#,
    ]);
    let queued = report(&dir, "kvq", &kv_args);
    assert_eq!(queued["completed_requests"], 400);
}

#[test]
fn max_sim_time_and_slas_shape_the_report() {
    let dir = scratch("cap");
    let trace = conversation_prefix(&dir, 60);
    let t = trace.to_str().unwrap();
    let full = report(&dir, "full", &[t, "--num-workers", "2"]);
    let capped = report(&dir, "cap", &[t, "--num-workers", "2", "--max-sim-time-seconds", "10"]);
    assert!(capped["num_requests"].as_u64().unwrap() < full["num_requests"].as_u64().unwrap());
    assert!(capped["duration_ms"].as_f64().unwrap() <= 10_000.0);
    let sla = report(&dir, "sla", &[t, "--num-workers", "2", "--sla-ttft-ms", "300", "--sla-itl-ms", "20"]);
    let good = sla["goodput_completed_requests"].as_u64().unwrap();
    assert!(good > 0 && good <= sla["completed_requests"].as_u64().unwrap());
    assert!(full.get("goodput_completed_requests").is_none());
    // A router that learns of cached blocks only after the whole run routes by load alone.
    let shared = [
        "--input-tokens",
        "1024",
        "--output-tokens",
        "32",
        "--request-count",
        "300",
        "--request-rate",
        "30",
        "--shared-prefix-ratio",
        "0.5",
        "--num-prefix-groups",
        "4",
        "--num-workers",
        "4",
        "--router",
        "kv",
    ];
    let kv = report(&dir, "kv", &shared);
    let lagged = report(&dir, "lag", &[&shared[..], &["--kv-event-lag-ms", "1e9"]].concat());
    assert_eq!(lagged["completed_requests"], kv["completed_requests"]);
    let simulated = |r: &serde_json::Value| {
        let mut r = r.clone();
        for key in ["wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"] {
            r.as_object_mut().unwrap().remove(key);
        }
        r
    };
    assert_ne!(simulated(&lagged), simulated(&kv), "the lag changes the kv router's placements");
    // Concurrency mode ignores timestamps: one session at a time.
    let c1 = report(&dir, "c1", &[t, "--concurrency", "1"]);
    assert_eq!(c1["completed_requests"], 60);
}

#[test]
fn malformed_traces_and_bad_flags_exit_2_with_line_and_field() {
    let dir = scratch("bad");
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"output_length\": 3, \"hash_ids\": [1]}\n\n{\"timestamp\": 5, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let b = bad.to_str().unwrap();
    assert_exit_2(&["replay", b], &["bad.jsonl:3:", "output_length"]);
    std::fs::write(
        &bad,
        "{\"timestamp\": 0, \"output_length\": 3, \"hash_ids\": [1], \"input_length\": 9999}\n",
    )
    .unwrap();
    assert_exit_2(&["replay", b], &[":1:", "input_length", "capacity 512"]);
    std::fs::write(&bad, "{\"output_length\": 3, \"hash_ids\": [1]}\n").unwrap();
    assert_exit_2(&["replay", b], &["timestamp", "--concurrency"]);
    assert_exit_2(&["replay", "/nonexistent/trace.jsonl"], &["/nonexistent/trace.jsonl", "cannot read"]);
    let good = conversation_prefix(&dir, 3);
    let g = good.to_str().unwrap();
    assert_exit_2(
        &["replay", g, "--trace-format", "sharegpt"],
        &["--trace-format", "mooncake-delta", "weka"],
    );
    assert_exit_2(&["replay", g, "--router", "random"], &["--router", "round-robin", "kv"]);
    assert_exit_2(
        &["replay", g, "--router", "kv", "--router-config", "{\"tmp\": 1}"],
        &["--router-config", "tmp", "router_temperature"],
    );
    assert_exit_2(&["replay", g, "--router-config", "{}"], &["--router-config", "kv"]);
    assert_exit_2(&["replay", g, "--request-rate", "4"], &["--request-rate", "synthetic"]);
    assert_exit_2(&["replay", g, "--trace-block-size", "0"], &["--trace-block-size"]);
    assert_exit_2(&["replay", g, "--trace-repeat", "0"], &["--trace-repeat"]);
    assert_exit_2(&["replay", g, "--sla-ttft-ms=-1"], &["--sla-ttft-ms"]);
    assert_exit_2(&["replay", g, "--kv-event-lag-ms", "5"], &["--kv-event-lag-ms", "kv router"]);
    assert_exit_2(&["replay", g, "--router", "kv", "--kv-event-lag-ms=-1"], &["--kv-event-lag-ms"]);
    assert_exit_2(&["replay", "--max-sim-time-seconds", "3"], &["--max-sim-time-seconds", "trace"]);
}

#[test]
fn agentic_v2_traces_replay_and_a_bad_header_exits_2_naming_the_field() {
    let dir = scratch("agentic_v2");
    let path = dir.join("v2.jsonl");
    let header = r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64}"#;
    let rows = r#"{"request_id": "a", "output_length": 4, "hash_ids": [1, 2], "not_before_ms": 0}
{"request_id": "b", "output_length": 4, "hash_ids": [3], "not_before_ms": 5}
{"request_id": "c", "output_length": 4, "hash_ids": [1, 2, 4], "not_before_ms": 0, "dependencies": [{"request_id": "a", "delay_ms": 10}, {"request_id": "b", "trigger": "dispatch"}]}"#;
    std::fs::write(&path, format!("{header}\n{rows}\n")).unwrap();
    let p = path.to_str().unwrap();
    let r = report(
        &dir,
        "v2",
        &[p, "--trace-format", "agentic_mooncake", "--execution-model", "m", "--num-workers", "2"],
    );
    assert_eq!(r["completed_requests"], 3);
    assert_exit_2(
        &[
            "replay",
            p,
            "--trace-format",
            "agentic-mooncake",
            "--execution-model",
            "m",
            "--trace-block-size",
            "512",
        ],
        &["v2.jsonl:1:", "block_size", "--trace-block-size"],
    );
    std::fs::write(&path, format!("{}\n{rows}\n", header.replace("\"version\": 2", "\"version\": 7")))
        .unwrap();
    assert_exit_2(
        &["replay", p, "--trace-format", "agentic-mooncake", "--execution-model", "m"],
        &["v2.jsonl:1:", "version", "7"],
    );
    std::fs::write(&path, format!("{}\n{rows}\n", header.replace("dynamo.agentic_mooncake", "acme")))
        .unwrap();
    assert_exit_2(
        &["replay", p, "--trace-format", "agentic-mooncake", "--execution-model", "m"],
        &["v2.jsonl:1:", "schema", "acme"],
    );
}

#[test]
fn reports_are_replaced_whole_and_a_failed_run_keeps_the_old_one() {
    let dir = scratch("atomic");
    let good = conversation_prefix(&dir, 20);
    let g = good.to_str().unwrap();
    let first = report(&dir, "r", &[g, "--num-workers", "2"]);
    let path = dir.join("r.json");
    let before = std::fs::read(&path).unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 0, \"hash_ids\": [1]}\n").unwrap();
    assert_exit_2(
        &["replay", bad.to_str().unwrap(), "--report-json", path.to_str().unwrap()],
        &["output_length"],
    );
    assert_eq!(std::fs::read(&path).unwrap(), before, "a failed run must not touch the report");
    let again = report(&dir, "r", &[g, "--num-workers", "2"]);
    assert_eq!(first["mean_ttft_ms"], again["mean_ttft_ms"]);
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "no temporary file is left behind: {names:?}");
}

/// `--report-jsonl` records, one JSON object per line.
fn request_records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("records written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

#[test]
fn per_request_records_add_up_to_the_report_and_chart() {
    let dir = scratch("jsonl");
    let trace = conversation_prefix(&dir, 150);
    let jsonl = dir.join("requests.jsonl");
    let plots = dir.join("plots");
    let args = [trace.to_str().unwrap(), "--router", "kv", "--num-workers", "4", "--report-jsonl"];
    let r = report(
        &dir,
        "r",
        &[&args[..], &[jsonl.to_str().unwrap(), "--plot", plots.to_str().unwrap()]].concat(),
    );
    let charts = [("ttft_cdf", "<polyline"), ("itl_cdf", "<polyline"), ("throughput", "<polyline")];
    let charts = charts.into_iter().chain([("queue_depth", "<polyline"), ("worker_cache_hit_rate", "<rect")]);
    for (chart, mark) in charts {
        let svg = std::fs::read_to_string(plots.join(format!("{chart}.svg"))).expect("chart written");
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>") && svg.contains(mark),
            "{chart}"
        );
    }
    let recs = request_records(&jsonl);
    assert_eq!(recs.len() as u64, r["num_requests"].as_u64().unwrap());
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {v}"));
    let mut indices: Vec<u64> = recs.iter().map(|v| v["request_index"].as_u64().unwrap()).collect();
    indices.sort_unstable();
    assert!(indices.iter().enumerate().all(|(i, &x)| i as u64 == x), "each request once");
    let (mut ttft, mut gaps, mut gap_sum, mut out, mut input, mut cached) = (0.0, 0u64, 0.0, 0.0, 0.0, 0.0);
    let mut workers = std::collections::BTreeSet::new();
    for v in &recs {
        assert_eq!(v["status"], "completed");
        let times: Vec<f64> =
            v["token_times_ms"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
        assert_eq!(times.len() as f64, f(v, "output_tokens"));
        assert!(f(v, "arrival_ms") <= f(v, "admission_ms") && f(v, "admission_ms") <= f(v, "first_token_ms"));
        assert_eq!(times[0], f(v, "first_token_ms"));
        assert!(times.windows(2).all(|w| w[0] < w[1]), "token times increase: {times:?}");
        ttft += times[0] - f(v, "arrival_ms");
        gaps += times.len() as u64 - 1;
        gap_sum += times[times.len() - 1] - times[0];
        out += f(v, "output_tokens");
        input += f(v, "input_tokens");
        cached += f(v, "cached_tokens");
        workers.insert(v["worker"].as_u64().unwrap());
    }
    let n = recs.len() as f64;
    let rel = |a: f64, b: f64| (a - b).abs() <= 1e-6 * a.abs().max(b.abs());
    assert!(
        rel(ttft / n, r["mean_ttft_ms"].as_f64().unwrap()),
        "mean TTFT {} vs {}",
        ttft / n,
        r["mean_ttft_ms"]
    );
    assert!(rel(gap_sum / gaps as f64, r["mean_itl_ms"].as_f64().unwrap()), "mean ITL");
    assert_eq!(out, r["total_output_tokens"].as_f64().unwrap());
    assert!(rel(cached / input, r["prefix_cache_reused_ratio"].as_f64().unwrap()), "reuse");
    assert!(cached > 0.0, "the KV router reuses prefixes");
    assert!(workers.len() > 1 && workers.iter().all(|&w| w < 4), "workers {workers:?}");

    // A failed run writes no records and leaves no temporary file.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 0, \"hash_ids\": [1]}\n").unwrap();
    let fresh = dir.join("fresh.jsonl");
    assert_exit_2(
        &["replay", bad.to_str().unwrap(), "--report-jsonl", fresh.to_str().unwrap()],
        &["output_length"],
    );
    assert!(!fresh.exists());
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "no temporary file is left behind: {names:?}");
}

#[test]
fn a_repeated_trace_runs_its_copies_back_to_back() {
    let dir = scratch("repeat");
    let trace = conversation_prefix(&dir, 30);
    let t = trace.to_str().unwrap();
    let once = report(&dir, "once", &[t, "--num-workers", "2"]);
    let thrice = report(&dir, "thrice", &[t, "--num-workers", "2", "--trace-repeat", "3"]);
    let n = |r: &Value| r["num_requests"].as_u64().unwrap();
    assert_eq!(n(&thrice), 3 * n(&once));
    let d = |r: &Value| r["duration_ms"].as_f64().unwrap();
    // Later copies start a span after the previous one (the tail of the last request is
    // paid once): longer by well over a span, shorter than three runs end to end.
    assert!(d(&thrice) > 1.5 * d(&once) && d(&thrice) < 3.0 * d(&once), "{} vs {}", d(&thrice), d(&once));
}

/// The trace fixture `name` of the format tests.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/traces").join(name)
}

/// Runs `mocker <args>`, asserts success and returns its stderr.
fn succeeds(args: &[&str]) -> String {
    let out = cli::mocker(args);
    let err = cli::stderr(&out);
    assert!(out.status.success(), "{args:?}: {err}");
    err
}

/// A Mooncake trace whose rows 2 and 3 misspell `input_length` and row 3 carries a key no
/// format knows.
fn misspelt_trace(dir: &Path) -> PathBuf {
    let path = dir.join("typo.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"output_length\": 3, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 5, \"input_len\": 600, \"output_length\": 3, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 9, \"input_len\": 700, \"note\": \"x\", \"output_length\": 3, \"hash_ids\": [1, 2]}\n",
    )
    .unwrap();
    path
}

#[test]
fn unknown_trace_keys_warn_once_per_key_with_line_and_suggestion() {
    let dir = scratch("keys");
    let trace = misspelt_trace(&dir);
    let t = trace.to_str().unwrap();
    let err = succeeds(&["replay", t]);
    let want = format!(
        "warning: {t}:2: unknown key \"input_len\" in trace rows (did you mean \"input_length\"?), also on 1 \
         later line; ignored\n"
    );
    assert!(err.contains(&want), "{err}");
    assert!(err.contains(&format!("warning: {t}:3: unknown key \"note\" in trace rows; ignored\n")), "{err}");
    assert_eq!(err.matches("unknown key").count(), 2, "one line per key: {err}");
    // The same words every run.
    assert_eq!(succeeds(&["replay", t]).lines().filter(|l| l.contains("unknown key")).count(), 2);
    // A trace of known keys only (the public schema, and the extras Dynamo's rows carry)
    // draws no warning.
    let clean = dir.join("clean.jsonl");
    std::fs::write(
        &clean,
        "{\"timestamp\": 0, \"input_tokens\": 700, \"output_tokens\": 3, \"hash_ids\": [1, 2], \"request_id\": \"a\", \"priority\": 1}\n\
         {\"created_time\": 4, \"input_length\": 7, \"output_length\": 3, \"hash_ids\": [1], \"session_id\": \"s\"}\n\
         {\"delay_ms\": 4, \"output_length\": 3, \"hash_ids\": [1], \"session_id\": \"s\", \"policy_class\": \"p\"}\n",
    )
    .unwrap();
    let err = succeeds(&["replay", clean.to_str().unwrap(), "--strict"]);
    assert!(!err.contains("unknown key"), "{err}");
}

/// Every row format checks its keys, nested objects under their path.
#[test]
fn every_trace_format_warns_about_its_unknown_keys() {
    let dir = scratch("formats");
    let edit = |name: &str, from: &str, to: &str| {
        let text = std::fs::read_to_string(fixture(name)).unwrap();
        assert!(text.contains(from), "{name}: {from}");
        let path = dir.join(name);
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        path
    };
    let dynamo =
        edit("dynamo_requests.jsonl", "\"input_length\": 1169", "\"input_length\": 1169, \"input_len\": 3");
    let err = succeeds(&["replay", dynamo.to_str().unwrap(), "--trace-format", "dynamo"]);
    assert!(
        err.contains(":1: unknown key \"request.replay.input_len\" in trace rows (did you mean \"request.replay.input_length\"?)"),
        "{err}"
    );
    let weka = edit("weka_plays.jsonl", "\"api_time\": 0.4", "\"api_time\": 0.4, \"api_tme\": 1");
    let err =
        succeeds(&["replay", weka.to_str().unwrap(), "--trace-format", "weka", "--execution-model", "m"]);
    assert!(
        err.contains(
            ":1: unknown key \"requests[].api_tme\" in trace rows (did you mean \"requests[].api_time\"?)"
        ),
        "{err}"
    );
    let applied =
        edit("applied_compute_agentic.jsonl", "\"num_turns\"", "\"tool_latency\": 1, \"num_turns\"");
    let err = succeeds(&[
        "replay",
        applied.to_str().unwrap(),
        "--trace-format",
        "applied-compute-agentic",
        "--concurrency",
        "2",
    ]);
    assert!(err.contains(":1: unknown key \"tool_latency\" in trace rows"), "{err}");
    let agentic = dir.join("v2.jsonl");
    std::fs::write(
        &agentic,
        "{\"schema\": \"dynamo.agentic_mooncake\", \"version\": 2, \"block_size\": 64, \"source\": {}}\n\
         {\"request_id\": \"a\", \"output_length\": 2, \"hash_ids\": [1], \"not_before_ms\": 0}\n\
         {\"request_id\": \"b\", \"output_length\": 2, \"hash_ids\": [1], \"timestamp\": 5, \
         \"dependencies\": [{\"request_id\": \"a\", \"trigger\": \"completion\", \"delay\": 5}]}\n",
    )
    .unwrap();
    let err = succeeds(&[
        "replay",
        agentic.to_str().unwrap(),
        "--trace-format",
        "agentic-mooncake",
        "--execution-model",
        "m",
    ]);
    // v2 rows read no timestamp, and a dependency's delay is delay_ms.
    assert!(err.contains(":3: unknown key \"timestamp\" in trace rows; ignored"), "{err}");
    assert!(
        err.contains(
            ":3: unknown key \"dependencies.delay\" in trace rows (did you mean \"dependencies.delay_ms\"?)"
        ),
        "{err}"
    );
    // Plain Mooncake rows of the agentic schema are something else: they say so.
    let legacy = dir.join("legacy.jsonl");
    std::fs::write(
        &legacy,
        "{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1], \"wait_for\": []}\n",
    )
    .unwrap();
    let err = succeeds(&["replay", legacy.to_str().unwrap()]);
    assert!(err.contains(":1: unknown key \"wait_for\" in trace rows; ignored"), "{err}");
    assert!(!succeeds(&[
        "replay",
        legacy.to_str().unwrap(),
        "--trace-format",
        "agentic-mooncake",
        "--execution-model",
        "m"
    ])
    .contains("unknown key"));
}

#[test]
fn strict_refuses_unknown_trace_keys_in_replay_and_sweep() {
    let dir = scratch("strict");
    let trace = misspelt_trace(&dir);
    let t = trace.to_str().unwrap();
    let want = format!(
        "error: {t}:2: unknown key \"input_len\" in trace rows (did you mean \"input_length\"?), also on 1 later \
         line; refused (--strict)"
    );
    let out = assert_exit_2(&["replay", t, "--strict"], &[&want, &format!("{t}:3: unknown key \"note\"")]);
    assert!(!cli::stderr(&out).contains("warning"), "{}", cli::stderr(&out));
    assert_exit_2(&["sweep", t, "--strict", "--sweep-num-workers", "1,2"], &[&want]);
    // Without --strict the sweep runs, warning once (not once per point).
    let csv = dir.join("sweep.csv");
    let err = succeeds(&["sweep", t, "--sweep-num-workers", "1,2", "--output-csv", csv.to_str().unwrap()]);
    assert_eq!(err.matches("unknown key \"input_len\"").count(), 1, "{err}");
    // A synthetic workload has no keys to check: --strict would change nothing.
    assert_exit_2(&["replay", "--strict"], &["--strict", "trace file"]);
    assert_exit_2(&["sweep", "--strict", "--sweep-num-workers", "1"], &["--strict", "trace file"]);
}

#[test]
fn a_missing_field_names_the_misspelt_key_that_was_probably_meant() {
    let dir = scratch("meant");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 0, \"output_len\": 3, \"hash_ids\": [1]}\n").unwrap();
    let b = bad.to_str().unwrap();
    assert_exit_2(
        &["replay", b],
        &[&format!(
            "{b}:1: output_length: trace line 1 is missing output_length (the row has unknown key \"output_len\": \
             did you mean \"output_length\"?)"
        )],
    );
    // An alias counts: output_token is near output_tokens, which is output_length.
    std::fs::write(&bad, "{\"timestamp\": 0, \"output_token\": 3, \"hash_ids\": [1]}\n").unwrap();
    assert_exit_2(&["replay", b], &["missing output_length (the row has unknown key \"output_token\""]);
    // Nested: a Dynamo record's request.
    let text = std::fs::read_to_string(fixture("dynamo_requests.jsonl")).unwrap();
    std::fs::write(&bad, text.replacen("\"output_tokens\"", "\"output_token\"", 1)).unwrap();
    assert_exit_2(
        &["replay", b, "--trace-format", "dynamo"],
        &[
            ":1: request.output_tokens:",
            "unknown key \"request.output_token\": did you mean \"request.output_tokens\"?",
        ],
    );
}

#[test]
fn file_errors_without_a_line_name_the_file_only() {
    let dir = scratch("files");
    let d = dir.to_str().unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["replay", "/nonexistent/trace.jsonl"], "error: /nonexistent/trace.jsonl: cannot read: ".into()),
        (vec!["replay", d], format!("error: {d}: not a regular file")),
        (
            vec!["replay", "/nonexistent/corpus", "--trace-format", "weka", "--execution-model", "m"],
            "error: /nonexistent/corpus: cannot read: ".into(),
        ),
        (
            vec!["replay", d, "--trace-format", "weka", "--execution-model", "m"],
            format!("error: {d}: contains no .json or .jsonl files"),
        ),
    ];
    for (args, want) in cases {
        let out = assert_exit_2(&args, &[&want]);
        let err = cli::stderr(&out);
        assert!(!err.contains(":0:") && !err.contains("line 0"), "{args:?}: {err}");
    }
    #[cfg(unix)]
    assert_exit_2(&["replay", "/dev/null"], &["error: /dev/null: not a regular file"]);
    let empty = dir.join("none.jsonl");
    std::fs::write(
        &empty,
        "{\"schema\": \"dynamo.request.trace.v1\", \"event_type\": \"request_payload\"}\n",
    )
    .unwrap();
    let e = empty.to_str().unwrap();
    assert_exit_2(
        &["replay", e, "--trace-format", "dynamo"],
        &[&format!("error: {e}: contains no request_end records")],
    );
}
