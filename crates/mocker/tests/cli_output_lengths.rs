//! Synthetic replays without `--output-tokens` can draw each request's output length from a
//! distribution (`--output-length-distribution`, engine-args `output_length_distribution`),
//! as `mocker serve` does for chat requests without `max_tokens`; anything that already
//! sets the lengths refuses the flag.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mocker");

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli_osl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn mocker(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run the mocker binary")
}

/// Output lengths of every request of a replay, in arrival order.
fn lengths(dir: &Path, name: &str, extra: &[&str]) -> Vec<u64> {
    let records = dir.join(format!("{name}.jsonl"));
    let mut args = vec![
        "replay",
        "--input-tokens",
        "128",
        "--request-count",
        "60",
        "--concurrency",
        "8",
        "--report-jsonl",
    ];
    args.push(records.to_str().unwrap());
    args.extend_from_slice(extra);
    let out = mocker(&args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["output_length"].as_u64().unwrap())
        .collect()
}

#[test]
fn drawn_lengths_stay_in_range_vary_and_repeat_with_the_seed() {
    let dir = scratch("draws");
    let fixed = lengths(&dir, "fixed", &[]);
    assert!(fixed.iter().all(|&n| n == 100), "the default stays 100 tokens: {fixed:?}");
    let dist = r#"{"type": "uniform", "min": 10, "max": 30}"#;
    let a = lengths(&dir, "a", &["--output-length-distribution", dist]);
    assert_eq!(a.len(), 60);
    assert!(a.iter().all(|n| (10..=30).contains(n)), "{a:?}");
    let distinct: std::collections::BTreeSet<_> = a.iter().collect();
    assert!(distinct.len() > 10, "{a:?}");
    assert_eq!(a, lengths(&dir, "b", &["--output-length-distribution", dist]), "same seed, same lengths");
    let other = lengths(&dir, "c", &["--output-length-distribution", dist, "--arrival-seed", "7"]);
    assert_ne!(a, other, "the arrival seed keys the draws");
    // The engine-args key does the same as the flag.
    let engine_args = format!(r#"{{"output_length_distribution": {dist}}}"#);
    assert_eq!(a, lengths(&dir, "d", &["--engine-args", &engine_args]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_flag_is_refused_where_lengths_are_already_set_or_malformed() {
    let dir = scratch("refused");
    let trace = dir.join("t.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let dist = r#"{"type": "fixed", "tokens": 5}"#;
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["--output-tokens", "5", "--output-length-distribution", dist], "--output-tokens"),
        (vec![trace.to_str().unwrap(), "--output-length-distribution", dist], "trace"),
        (vec!["--output-length-distribution", r#"{"type": "gauss"}"#], "--output-length-distribution.type"),
        (vec!["--output-length-distribution", "{"], "invalid JSON"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["replay", "--request-count", "2"];
        args.extend(extra.iter().copied());
        let out = mocker(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--output-length-distribution") && err.contains(needle), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sweep_point_cannot_change_the_shared_workloads_output_lengths() {
    let point = r#"{"output_length_distribution": {"type": "fixed", "tokens": 5}}"#;
    let args = ["sweep", "--request-count", "2", "--sweep-engine-args", "{}", "--sweep-engine-args", point];
    let out = mocker(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--sweep-engine-args (value 2)") && err.contains("output_length_distribution"),
        "{err}"
    );
    // Set for the whole sweep, it applies to every point.
    let base = r#"{"output_length_distribution": {"type": "fixed", "tokens": 5}}"#;
    let out = mocker(&["sweep", "--request-count", "2", "--engine-args", base, "--sweep-engine-args", "{}"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let csv = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let at = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("{name} in {csv}"));
    assert_eq!(row[at("completed_requests")], "2", "{csv}");
}
