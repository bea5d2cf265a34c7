//! End-to-end tests of `mocker replay`: the real binary, its table, its JSON report
//! (replay spec §10-§11) and its handling of bad input (exit code 2, field named).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Map, Value};

const BIN: &str = env!("CARGO_BIN_EXE_mocker");

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_replay-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mocker(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run the mocker binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

/// Runs `mocker replay <args> --report-json <dir>/<name>.json`, asserts success, and returns
/// (stdout, report text, parsed report).
fn replay(dir: &Path, name: &str, args: &[&str]) -> (String, String, Map<String, Value>) {
    let path = dir.join(format!("{name}.json"));
    let path_str = path.to_str().unwrap();
    let mut full = vec!["replay"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["--report-json", path_str]);
    let out = mocker(&full);
    assert!(out.status.success(), "mocker {full:?} failed: {}\n{}", out.status, stderr(&out));
    let text = std::fs::read_to_string(&path).expect("report written");
    let report = match serde_json::from_str::<Value>(&text).expect("report is JSON") {
        Value::Object(m) => m,
        other => panic!("report is not an object: {other}"),
    };
    (stdout(&out), text, report)
}

fn num(r: &Map<String, Value>, key: &str) -> f64 {
    r.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("report key {key} missing or not a number"))
}

fn int(r: &Map<String, Value>, key: &str) -> u64 {
    r.get(key).and_then(Value::as_u64).unwrap_or_else(|| panic!("report key {key} missing or not an integer"))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
}

const PERCENTILES: [&str; 7] = ["min", "median", "p75", "p90", "p95", "p99", "max"];

/// Every distribution is internally ordered; ITL percentiles come from a DDSketch with 0.1%
/// relative accuracy (replay spec §10), so they may sit that far outside the exact min/max.
fn check_distributions(r: &Map<String, Value>) {
    for (suffix, sketched) in [
        ("ttft_ms", false),
        ("ttst_ms", false),
        ("tpot_ms", false),
        ("itl_ms", true),
        ("e2e_latency_ms", false),
    ] {
        let v: Vec<f64> = PERCENTILES.iter().map(|p| num(r, &format!("{p}_{suffix}"))).collect();
        let slack = if sketched { 1e-3 } else { 0.0 };
        for w in v[1..6].windows(2) {
            assert!(w[0] <= w[1], "{suffix}: percentiles out of order: {v:?}");
        }
        assert!(v[0] <= v[1] * (1.0 + slack), "{suffix}: min > median: {v:?}");
        assert!(v[5] <= v[6] * (1.0 + slack), "{suffix}: p99 > max: {v:?}");
        assert!(v[0] <= v[6], "{suffix}: min > max");
        let mean = num(r, &format!("mean_{suffix}"));
        assert!(
            mean >= v[0] * (1.0 - 1e-12) && mean <= v[6] * (1.0 + 1e-12),
            "{suffix}: mean {mean} outside [{}, {}]",
            v[0],
            v[6]
        );
        assert!(num(r, &format!("std_{suffix}")) >= 0.0);
    }
    // Per request e2e >= ttft, so every order statistic of e2e dominates ttft's.
    for p in PERCENTILES.iter().chain(&["mean"]) {
        let (e2e, ttft) = (num(r, &format!("{p}_e2e_latency_ms")), num(r, &format!("{p}_ttft_ms")));
        assert!(e2e >= ttft, "{p}: e2e {e2e} < ttft {ttft}");
    }
}

fn assert_sorted_keys(text: &str, r: &Map<String, Value>) {
    // serde_json is built with preserve_order, so the map iterates in file order.
    let keys: Vec<&String> = r.keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "report keys are not sorted in the file");
    assert!(text.starts_with("{\n  \""), "pretty-printed with 2-space indent");
}

#[test]
fn small_workload_prints_the_table_and_a_consistent_report() {
    let dir = scratch("small");
    let args =
        ["--input-tokens", "300", "--output-tokens", "20", "--request-count", "30", "--concurrency", "4"];
    let (out, text, r) = replay(&dir, "r", &args);
    let path = dir.join("r.json");

    let lines: Vec<&str> = out.lines().collect();
    // mocker's own title, after the header saying what ran and right above the table.
    let title =
        lines.iter().position(|l| *l == "mocker | LLM Metrics").unwrap_or_else(|| panic!("title:\n{out}"));
    assert!(lines[0].starts_with("Run: offline replay, 1 worker,") && title == 3, "header:\n{out}");
    assert!(lines[title + 1].starts_with('┏') && !out.contains("AIPerf"), "title line:\n{out}");
    assert!(lines.contains(&format!("Saved full report to: {}", path.display()).as_str()), "{out}");
    for row in [
        "Time to First Token (ms)",
        "Request Latency (ms)",
        "Inter Token Latency (ms)",
        "Request Count (requests)",
    ] {
        assert!(out.contains(row), "table lacks row {row}:\n{out}");
    }
    let count_row = lines.iter().find(|l| l.contains("Request Count (requests)")).unwrap();
    assert!(count_row.contains(" 30.00 "), "request count row: {count_row}");

    assert_sorted_keys(&text, &r);
    assert_eq!(int(&r, "num_requests"), 30);
    assert_eq!(int(&r, "completed_requests"), 30);
    assert_eq!(int(&r, "total_input_tokens"), 30 * 300);
    assert_eq!(int(&r, "total_output_tokens"), 30 * 20);
    assert_eq!(int(&r, "num_ttft_samples"), 30);
    assert_eq!(int(&r, "num_tpot_samples"), 30);
    assert_eq!(int(&r, "num_e2e_latency_samples"), 30);
    assert_eq!(r["kv_eviction_policy"], "lru");
    check_distributions(&r);

    let duration_ms = num(&r, "duration_ms");
    assert!(duration_ms >= num(&r, "max_e2e_latency_ms"), "duration ends at the last completion");
    let duration_s = duration_ms / 1000.0;
    for (key, value) in [
        ("output_throughput_tok_s", 600.0),
        ("input_throughput_tok_s", 9000.0),
        ("total_throughput_tok_s", 9600.0),
        ("request_throughput_rps", 30.0),
    ] {
        assert!(
            close(num(&r, key), value / duration_s, 1e-9),
            "{key} = {} vs {}",
            num(&r, key),
            value / duration_s
        );
    }
    // Every request has 20 tokens, so its TPOT is (e2e - ttft) / 19; means are linear.
    let tpot = (num(&r, "mean_e2e_latency_ms") - num(&r, "mean_ttft_ms")) / 19.0;
    assert!(close(num(&r, "mean_tpot_ms"), tpot, 1e-9), "mean tpot {} vs {tpot}", num(&r, "mean_tpot_ms"));
    // Distinct prompts: nothing reused, every prompt token computed once.
    assert_eq!(num(&r, "prefix_cache_reused_ratio"), 0.0);
    assert_eq!(int(&r, "committed_prefill_tokens"), 9000);
    assert_eq!(int(&r, "processed_tokens"), 9600);
    assert!(close(num(&r, "decode_worker_seconds"), duration_s, 1e-9));
}

/// The report with its wall-clock-derived lines removed.
fn deterministic_part(text: &str) -> String {
    const VOLATILE: [&str; 3] =
        ["\"wall_time_ms\":", "\"processed_tokens_per_s\":", "\"processed_output_tokens_per_s\":"];
    let kept: Vec<&str> =
        text.lines().filter(|l| !VOLATILE.iter().any(|k| l.trim_start().starts_with(k))).collect();
    assert_eq!(text.lines().count() - kept.len(), 3, "each volatile key appears once");
    kept.join("\n")
}

#[test]
fn reports_are_deterministic_apart_from_wall_time() {
    let dir = scratch("determinism");
    // Poisson arrivals, shared prefixes and a small pool (preemption, eviction).
    let args = [
        "--input-tokens",
        "200",
        "--output-tokens",
        "30",
        "--request-count",
        "40",
        "--request-rate",
        "200",
        "--shared-prefix-ratio",
        "0.5",
        "--num-prefix-groups",
        "3",
        "--num-workers",
        "2",
        "--engine-args",
        r#"{"block_size": 16, "num_gpu_blocks": 40, "max_num_batched_tokens": 256}"#,
    ];
    let (out1, a, _) = replay(&dir, "a", &args);
    let (out2, b, _) = replay(&dir, "b", &args);
    assert_eq!(deterministic_part(&a), deterministic_part(&b));
    let table = |s: &str| -> String {
        s.lines()
            .filter(|l| !l.starts_with("Wall Time") && !l.starts_with("Saved full report"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(table(&out1), table(&out2));
    // And the seed matters: another arrival seed gives another run.
    let mut other = args.to_vec();
    other.extend_from_slice(&["--arrival-seed", "7"]);
    let (_, c, _) = replay(&dir, "c", &other);
    assert_ne!(deterministic_part(&a), deterministic_part(&c));
}

#[test]
fn shared_prefixes_are_reused_only_with_prefix_groups() {
    let dir = scratch("prefix");
    let base =
        ["--input-tokens", "300", "--output-tokens", "5", "--request-count", "12", "--concurrency", "1"];
    let with_groups: Vec<&str> =
        base.iter().copied().chain(["--shared-prefix-ratio", "0.5", "--num-prefix-groups", "2"]).collect();
    let without: Vec<&str> = base.iter().copied().chain(["--shared-prefix-ratio", "0.5"]).collect();
    let (out, _, shared) = replay(&dir, "shared", &with_groups);
    let (_, _, alone) = replay(&dir, "alone", &without);

    let ratio = num(&shared, "prefix_cache_reused_ratio");
    assert!(ratio > 0.0 && ratio < 1.0, "reused ratio {ratio} with prefix groups");
    assert_eq!(num(&alone, "prefix_cache_reused_ratio"), 0.0);
    assert_eq!(num(&alone, "first_admission_prefix_cache_reused_ratio"), 0.0);
    for r in [&shared, &alone] {
        assert_eq!(int(r, "completed_requests"), 12);
        // One request at a time: no preemption, so reuse is decided at first admission and
        // every prompt token is either reused or computed exactly once.
        let input = int(r, "total_input_tokens") as f64;
        let reused = num(r, "prefix_cache_reused_ratio") * input;
        assert_eq!(num(r, "first_admission_prefix_cache_reused_ratio"), num(r, "prefix_cache_reused_ratio"));
        assert!((int(r, "committed_prefill_tokens") as f64 + reused - input).abs() < 1e-6);
    }
    // Reuse makes prefills shorter.
    assert!(num(&shared, "mean_ttft_ms") < num(&alone, "mean_ttft_ms"));
    assert!(out.contains("Prefix Cache Reused Ratio: "), "{out}");
}

#[test]
fn open_loop_loads_and_multiple_workers_complete_every_request() {
    let dir = scratch("loads");
    let common = ["--input-tokens", "100", "--output-tokens", "10", "--request-count", "25"];
    let run = |name: &str, extra: &[&str]| {
        let args: Vec<&str> = common.iter().chain(extra).copied().collect();
        let (_, _, r) = replay(&dir, name, &args);
        assert_eq!(int(&r, "num_requests"), 25, "{name}");
        assert_eq!(int(&r, "completed_requests"), 25, "{name}");
        assert_eq!(int(&r, "total_output_tokens"), 250, "{name}");
        check_distributions(&r);
        r
    };
    let poisson = run("poisson", &["--request-rate", "50"]);
    assert!(num(&poisson, "duration_ms") >= num(&poisson, "max_e2e_latency_ms"));

    // Arrivals every 10 ms: the last one arrives at 240 ms and still needs its latency.
    let interval = run("interval", &["--arrival-interval-ms", "10"]);
    let d = num(&interval, "duration_ms");
    assert!(d >= 240.0 + num(&interval, "min_e2e_latency_ms"), "duration {d}");
    // Simultaneous arrivals share one long prefill pass; spaced ones mostly prefill alone.
    let burst = run("burst", &["--arrival-interval-ms", "0"]);
    assert!(num(&burst, "max_ttft_ms") > num(&interval, "max_ttft_ms"), "simultaneous arrivals queue");

    let workers = run("workers", &["--concurrency", "6", "--num-workers", "3"]);
    let duration_s = num(&workers, "duration_ms") / 1000.0;
    assert!(close(num(&workers, "decode_worker_seconds"), 3.0 * duration_s, 1e-9), "3 workers provisioned");
}

/// Asserts a usage error: exit code 2, the message names `needles`, and nothing panicked.
fn assert_usage_error(args: &[&str], needles: &[&str]) {
    let mut full = vec!["replay", "--request-count", "2"];
    full.extend_from_slice(args);
    let out = mocker(&full);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "mocker {full:?}: status {} stderr {err}", out.status);
    assert!(!err.contains("panicked"), "mocker {full:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "mocker {full:?}: stderr does not name {n:?}: {err}");
    }
    assert!(stdout(&out).is_empty(), "no table on error");
}

#[test]
fn bad_workload_flags_exit_2_naming_the_flag() {
    assert_usage_error(&["--concurrency", "4", "--request-rate", "5"], &["--concurrency", "--request-rate"]);
    assert_usage_error(
        &["--request-rate", "5", "--arrival-interval-ms", "5"],
        &["--request-rate", "--arrival-interval-ms"],
    );
    assert_usage_error(&["--output-tokens", "0"], &["--output-tokens"]);
    assert_usage_error(&["--input-tokens", "0"], &["--input-tokens"]);
    assert_usage_error(&["--request-rate=-1"], &["--request-rate"]);
    assert_usage_error(&["--request-rate", "0"], &["--request-rate"]);
    assert_usage_error(&["--arrival-interval-ms=-3"], &["--arrival-interval-ms"]);
    assert_usage_error(&["--concurrency", "0"], &["--concurrency"]);
    assert_usage_error(&["--shared-prefix-ratio", "2"], &["--shared-prefix-ratio"]);
    assert_usage_error(&["--shared-prefix-ratio=-0.5"], &["--shared-prefix-ratio"]);
    assert_usage_error(&["--inter-turn-delay-ms=-1"], &["--inter-turn-delay-ms"]);
    assert_usage_error(&["--num-workers", "0"], &["num", "workers"]);
    // clap's own errors: unknown flag, non-numeric value.
    assert_usage_error(&["--frobnicate"], &["--frobnicate"]);
    assert_usage_error(&["--output-tokens", "many"], &["--output-tokens"]);
}

#[test]
fn negative_values_after_a_space_name_the_flag() {
    assert_usage_error(&["--request-rate", "-1"], &["--request-rate"]);
    assert_usage_error(&["--arrival-interval-ms", "-3"], &["--arrival-interval-ms"]);
    assert_usage_error(&["--shared-prefix-ratio", "-0.5"], &["--shared-prefix-ratio"]);
    assert_usage_error(&["--inter-turn-delay-ms", "-1"], &["--inter-turn-delay-ms"]);
}

#[test]
fn bad_engine_args_exit_2_naming_the_field() {
    assert_usage_error(&["--engine-args", r#"{"bogus": 1}"#], &["--engine-args", "bogus", "block_size"]);
    assert_usage_error(&["--engine-args", r#"{"num_gpu_blocks": 0}"#], &["num_gpu_blocks"]);
    assert_usage_error(
        &["--engine-args", r#"{"preemption_mode": "lru"}"#],
        &["preemption_mode", "lru", "lifo", "fifo"],
    );
    assert_usage_error(&["--engine-args", r#"{"engine": {"max_num_seqs": -2}}"#], &["max_num_seqs"]);
    assert_usage_error(
        &["--engine-args", "@/nonexistent/engine.json"],
        &["--engine-args", "/nonexistent/engine.json"],
    );
    assert_usage_error(&["--engine-args", "{not json"], &["--engine-args", "JSON"]);
    assert_usage_error(&["--engine-args", "[1, 2]"], &["--engine-args", "object"]);

    // A file argument is read, and its errors are reported the same way.
    let dir = scratch("engine-file");
    let file = dir.join("engine.json");
    std::fs::write(&file, r#"{"backend": "tpu"}"#).unwrap();
    let arg = format!("@{}", file.display());
    assert_usage_error(&["--engine-args", &arg], &["backend", "tpu", "vllm"]);
    std::fs::write(&file, r#"{"num_gpu_blocks": 64, "block_size": 16}"#).unwrap();
    let (_, _, r) = replay(
        &dir,
        "ok",
        &["--request-count", "3", "--input-tokens", "50", "--output-tokens", "4", "--engine-args", &arg],
    );
    assert_eq!(int(&r, "completed_requests"), 3);
}

#[test]
fn engine_type_flag_selects_the_backend_with_its_own_defaults() {
    let dir = scratch("engine-type");
    // Enough concurrency that the backends' admission rules give different first tokens.
    let load =
        ["--input-tokens", "1000", "--output-tokens", "20", "--request-count", "128", "--concurrency", "64"];
    let with_flag = [&load[..], &["--engine-type", "sglang"]].concat();
    let (_, _, flag) = replay(&dir, "flag", &with_flag);
    let with_json = [&load[..], &["--engine-args", r#"{"engine": {"backend": "sglang"}}"#]].concat();
    let (_, _, json) = replay(&dir, "json", &with_json);
    let (_, _, vllm) = replay(&dir, "vllm", &load);
    for key in ["duration_ms", "mean_ttft_ms", "mean_itl_ms"] {
        assert_eq!(flag[key], json[key], "{key}: the flag and the engine-args key are one setting");
    }
    assert_ne!(flag["mean_ttft_ms"], vllm["mean_ttft_ms"], "sglang schedules differently from vllm");
    assert_usage_error(
        &["--engine-type", "vllm", "--engine-args", r#"{"backend": "sglang"}"#],
        &["--engine-type", "backend"],
    );
    assert_usage_error(&["--engine-type", "tgi"], &["--engine-type", "sglang", "trtllm"]);
}
