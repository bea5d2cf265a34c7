//! `mocker replay --scaling-plan`: a timetable scales the pools with the start-up and drain
//! rules of the reference's scaling policy (the same run as the reference's `A1` case, whose
//! ticks between the plan's steps change nothing), the report line and chart show the
//! worker counts, and bad plans are usage errors.

mod cli;

use cli::{assert_exit_2, mocker, report, scratch, stdout};
use serde_json::Value;

const ENGINE: &str = r#"{"engine": {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256,
    "max_num_batched_tokens": 8192}, "startup_time": 1.5}"#;

/// The fixture's `A1` case: its summary.
fn a1_summary() -> Value {
    let text = include_str!("../../../tests/fixtures/scaling_reference.json");
    let text = text.replace(":NaN", ":null").replace(":Infinity", ":null");
    let doc: Value = serde_json::from_str(&text).unwrap();
    let case = doc["cases"].as_array().unwrap().iter().find(|c| c["case"] == "A1_agg_round_robin").unwrap();
    case["summary"].clone()
}

fn workload(plan: &str) -> Vec<&str> {
    vec![
        "--input-tokens",
        "512",
        "--output-tokens",
        "256",
        "--request-count",
        "300",
        "--request-rate",
        "20",
        "--engine-args",
        ENGINE,
        "--scaling-plan",
        plan,
    ]
}

#[test]
fn a_plan_scales_the_pool_as_the_reference_policy_does() {
    let dir = scratch("plan");
    let plan = dir.join("plan.json");
    std::fs::write(&plan, r#"[{"at_ms": 2000, "decode": 3}, {"at_ms": 8000, "decode": 1}]"#).unwrap();
    let plan = plan.to_str().unwrap();
    let got = report(&dir, "a1", &workload(plan));
    let want = a1_summary();
    for key in
        ["completed_requests", "duration_ms", "decode_worker_seconds", "mean_itl_ms", "mean_e2e_latency_ms"]
    {
        let (g, w) = (got[key].as_f64().unwrap(), want[key].as_f64().unwrap());
        assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{key}: mocker {g}, reference {w}");
    }
    // Without the plan: one worker all along, half the worker-seconds.
    let fixed: Vec<&str> = workload(plan)[..10].to_vec();
    let fixed = report(&dir, "fixed", &fixed);
    assert!(fixed["decode_worker_seconds"].as_f64().unwrap() < 16.0);

    let charts = dir.join("charts");
    let mut args = vec!["replay"];
    args.extend(workload(plan));
    args.extend(["--plot", charts.to_str().unwrap()]);
    let out = mocker(&args);
    assert!(out.status.success());
    assert!(
        stdout(&out).contains("Active Workers (agg): 1 from 0.00 s, 3 from 3.50 s, 1 from 8.00 s"),
        "{}",
        stdout(&out)
    );
    let svg = std::fs::read_to_string(charts.join("workers_agg.svg")).unwrap();
    assert!(svg.contains("Active workers"));
}

#[test]
fn bad_plans_are_usage_errors() {
    let dir = scratch("bad");
    let base = ["replay", "--request-count", "20", "--request-rate", "20", "--scaling-plan"];
    let missing = dir.join("missing.json");
    let mut args = base.to_vec();
    args.push(missing.to_str().unwrap());
    assert_exit_2(&args, &["--scaling-plan", "cannot read"]);
    for (name, text, needle) in [
        ("empty", "[]", "at least one step"),
        ("nocount", r#"[{"at_ms": 1}]"#, "\"decode\""),
        ("order", r#"[{"at_ms": 5, "decode": 2}, {"at_ms": 1, "decode": 1}]"#, "later"),
        ("field", r#"[{"at_ms": 5, "workers": 2}]"#, "workers"),
    ] {
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, text).unwrap();
        let mut args = base.to_vec();
        args.push(path.to_str().unwrap());
        assert_exit_2(&args, &["--scaling-plan", needle]);
    }
    let ok = dir.join("ok.json");
    std::fs::write(&ok, r#"[{"at_ms": 5, "decode": 2}]"#).unwrap();
    let mut args = base.to_vec();
    args.extend([ok.to_str().unwrap(), "--mode", "online"]);
    assert_exit_2(&args, &["--scaling-plan", "offline"]);
}

#[test]
fn telemetry_is_written_as_jsonl_beside_a_plan() {
    let dir = scratch("telemetry");
    let plan = dir.join("plan.json");
    std::fs::write(&plan, r#"[{"at_ms": 2000, "decode": 3}, {"at_ms": 8000, "decode": 1}]"#).unwrap();
    let samples = dir.join("nested/samples.jsonl");
    let mut args = workload(plan.to_str().unwrap());
    args.extend(["--telemetry-jsonl", samples.to_str().unwrap(), "--telemetry-interval-ms", "1000"]);
    let report = report(&dir, "sampled", &args);
    let lines: Vec<Value> = std::fs::read_to_string(&samples)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The reference's A1 run: a baseline, one sample a second, a final one at the end.
    assert_eq!(lines.len(), 17);
    assert_eq!(lines[0]["kind"], "baseline");
    assert_eq!(lines[16]["kind"], "final");
    assert_eq!(lines[16]["sampled_at_ms"], report["duration_ms"]);
    assert_eq!(lines[3]["starting_decode_ids"], serde_json::json!([1, 2]));
    assert_eq!(lines[9]["draining_decode_ids"], serde_json::json!([1, 2]));
    let completed: u64 = lines.iter().map(|s| s["traffic"]["completed_requests"].as_u64().unwrap()).sum();
    assert_eq!(completed, 300);
}

#[test]
fn telemetry_flags_are_checked() {
    let dir = scratch("telemetry-bad");
    let base = ["replay", "--request-count", "20", "--request-rate", "20"];
    let mut args = base.to_vec();
    args.extend(["--telemetry-interval-ms", "500"]);
    assert_exit_2(&args, &["--telemetry-interval-ms", "--telemetry-jsonl"]);
    let file = dir.join("t.jsonl");
    for bad in ["0", "-1", "inf"] {
        let mut args = base.to_vec();
        args.extend(["--telemetry-jsonl", file.to_str().unwrap(), "--telemetry-interval-ms", bad]);
        assert_exit_2(&args, &["--telemetry-interval-ms", "positive"]);
    }
    let mut args = base.to_vec();
    args.extend(["--telemetry-jsonl", file.to_str().unwrap(), "--mode", "online"]);
    assert_exit_2(&args, &["--telemetry-jsonl", "offline"]);
    let mut args = base.to_vec();
    args.extend(["--telemetry-jsonl", dir.to_str().unwrap()]);
    assert_exit_2(&args, &["telemetry", "directory"]);
}
