//! `mocker trace generate` through the real binary: a trace that replays, with prefix reuse
//! from its families and follow-ups, the same for the same seed, bad options refused.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_mocker");

fn mocker(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Replays `trace` over 4 workers with the KV router: (completed requests, prefix reuse).
fn replay(trace: &std::path::Path, report: &std::path::Path) -> (u64, f64) {
    let out = mocker(&[
        "replay",
        trace.to_str().unwrap(),
        "--trace-block-size",
        "512",
        "--num-workers",
        "4",
        "--router",
        "kv",
        "--report-json",
        report.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    (r["completed_requests"].as_u64().unwrap(), r["prefix_cache_reused_ratio"].as_f64().unwrap())
}

#[test]
fn a_generated_trace_replays_with_prefix_reuse_and_is_reproducible() {
    let dir = std::env::temp_dir().join(format!("mocker-trace-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    let file = path.to_str().unwrap();
    let out = mocker(&["trace", "generate", "--rows", "3000", "--rate", "20", "--seed", "7", "-o", file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3000);
    let again = mocker(&["trace", "generate", "--rows", "3000", "--rate", "20", "--seed", "7"]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), text, "same seed, same trace (file or stdout)");
    let report = dir.join("report.json");
    let (completed, reuse) = replay(&path, &report);
    assert_eq!(completed, 3000);
    assert!(reuse > 0.1, "families and follow-ups share prefixes: {reuse}");
    // Without families' popularity or follow-ups, far less is shared.
    let flat = dir.join("flat.jsonl");
    let out = mocker(&[
        "trace",
        "generate",
        "--rows",
        "3000",
        "--rate",
        "20",
        "--families",
        "100000",
        "--zipf",
        "0",
        "--follow-up",
        "0",
        "-o",
        flat.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let (_, flat_reuse) = replay(&flat, &report);
    assert!(flat_reuse < reuse / 2.0, "{flat_reuse} against {reuse}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_generator_options_exit_2_naming_the_flag() {
    for (flag, value) in
        [("--rate", "0"), ("--follow-up", "2"), ("--families", "0"), ("--prompt-median", "0")]
    {
        let out = mocker(&["trace", "generate", flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(flag),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_scale_bench_replays_a_generated_trace_over_64_workers() {
    let out = mocker(&["bench", "--scale", "2000", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "scale-2000-64w-kv");
    assert_eq!(v["completed_requests"], 2000);
    assert!(v["peak_rss_mb"].as_f64().unwrap() > 1.0 && v["wall_time_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["prefix_cache_reused_ratio"].as_f64().unwrap() > 0.1, "{v}");
    let refused = mocker(&["bench", "--scale", "2000", "--filter", "ref"]);
    assert_eq!(refused.status.code(), Some(2));
}
