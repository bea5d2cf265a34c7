//! End-to-end tests of `mocker sweep`: the real binary, its CSV and JSON rows (grid order,
//! equal to `mocker replay` for the same point) and its handling of bad input (exit 2).

mod cli;

use cli::{mocker, scratch, stderr};
use serde_json::Value;

const WORKLOAD: [&str; 8] =
    ["--input-tokens", "64", "--output-tokens", "8", "--request-count", "20", "--concurrency", "4"];

const ENGINE_A: &str = r#"{"block_size": 16}"#;
const ENGINE_B: &str = r#"{"block_size": 32, "max_num_seqs": 2}"#;

#[test]
fn grid_rows_in_order_and_equal_to_replay() {
    let dir = scratch("grid");
    let csv_path = dir.join("sweep.csv");
    let json_path = dir.join("sweep.json");
    let mut args = vec!["sweep"];
    args.extend_from_slice(&WORKLOAD);
    args.extend_from_slice(&[
        "--sweep-engine-args",
        ENGINE_A,
        "--sweep-engine-args",
        ENGINE_B,
        "--sweep-num-workers",
        "1,2",
        "--jobs",
        "2",
        "--output-csv",
        csv_path.to_str().unwrap(),
        "--output-json",
        json_path.to_str().unwrap(),
    ]);
    let out = mocker(&args);
    assert!(out.status.success(), "mocker {args:?} failed: {}\n{}", out.status, stderr(&out));

    let csv = std::fs::read_to_string(&csv_path).expect("CSV written");
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().clone();
    let col =
        |name: &str| header.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}"));
    for name in [
        "point",
        "engine_args",
        "num_workers",
        "router",
        "completed_requests",
        "duration_ms",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2e_latency_ms",
        "output_throughput_tok_s",
        "request_throughput_rps",
        "prefix_cache_reused_ratio",
        "wall_ms",
    ] {
        col(name);
    }
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    let expected = [(ENGINE_A, "1"), (ENGINE_A, "2"), (ENGINE_B, "1"), (ENGINE_B, "2")];
    for (i, (row, (engine, workers))) in rows.iter().zip(expected).enumerate() {
        assert_eq!(&row[col("point")], i.to_string().as_str());
        assert_eq!(&row[col("engine_args")], engine);
        assert_eq!(&row[col("num_workers")], workers);
        assert_eq!(&row[col("router")], "round-robin");
        assert_eq!(&row[col("completed_requests")], "20");
    }

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("JSON written")).unwrap();
    let points = json["points"].as_array().expect("points array");
    assert_eq!(points.len(), 4);
    for (i, p) in points.iter().enumerate() {
        assert_eq!(p["point"], i);
        let csv_duration: f64 = rows[i][col("duration_ms")].parse().unwrap();
        assert_eq!(p["duration_ms"].as_f64().unwrap(), csv_duration, "CSV and JSON agree");
    }

    // Point 3 (ENGINE_B, 2 workers) against a plain replay of the same configuration.
    let report_path = dir.join("replay.json");
    let mut replay = vec!["replay"];
    replay.extend_from_slice(&WORKLOAD);
    replay.extend_from_slice(&[
        "--engine-args",
        ENGINE_B,
        "--num-workers",
        "2",
        "--report-json",
        report_path.to_str().unwrap(),
    ]);
    let out = mocker(&replay);
    assert!(out.status.success(), "mocker {replay:?} failed: {}", stderr(&out));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    for key in ["duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "output_throughput_tok_s"] {
        assert_eq!(points[3][key], report[key], "{key}: sweep point 3 vs replay");
        let csv_value: f64 = rows[3][col(key)].parse().unwrap();
        assert_eq!(csv_value, report[key].as_f64().unwrap(), "{key}: CSV round-trips exactly");
    }
}

#[test]
fn sweep_engine_args_are_laid_over_the_base_engine_args() {
    let dir = scratch("merge");
    let json_path = dir.join("sweep.json");
    let mut args = vec!["sweep"];
    args.extend_from_slice(&WORKLOAD);
    // ENGINE_B split in two: the base gives block_size, the grid point max_num_seqs, and a
    // second point overrides the base's block_size.
    args.extend_from_slice(&[
        "--engine-args",
        r#"{"block_size": 32, "max_num_seqs": 8}"#,
        "--sweep-engine-args",
        r#"{"max_num_seqs": 2}"#,
        "--sweep-engine-args",
        r#"{"block_size": 16, "max_num_seqs": 256}"#,
        "--output-json",
        json_path.to_str().unwrap(),
    ]);
    let out = mocker(&args);
    assert!(out.status.success(), "mocker {args:?} failed: {}\n{}", out.status, stderr(&out));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let points = json["points"].as_array().expect("points array");
    assert_eq!(points.len(), 2);
    assert_eq!(points[0]["engine_args"], r#"{"max_num_seqs": 2}"#, "rows name the grid value");
    for (point, full) in [(0, ENGINE_B), (1, ENGINE_A)] {
        let report_path = dir.join(format!("replay{point}.json"));
        let mut replay = vec!["replay"];
        replay.extend_from_slice(&WORKLOAD);
        replay.extend_from_slice(&["--engine-args", full, "--report-json", report_path.to_str().unwrap()]);
        let out = mocker(&replay);
        assert!(out.status.success(), "mocker {replay:?} failed: {}", stderr(&out));
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
        for key in ["duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms"] {
            assert_eq!(points[point][key], report[key], "{key}: point {point} vs replay of {full}");
        }
    }
    // The two merged configurations differ, so the merge is what the rows show.
    assert_ne!(points[0]["duration_ms"], points[1]["duration_ms"]);
}

#[test]
fn bad_worker_list_exits_2_and_writes_nothing() {
    let dir = scratch("bad");
    let csv_path = dir.join("sweep.csv");
    let cases: [(&[&str], &[&str]); 4] = [
        (&["--sweep-num-workers", "0,x"], &["--sweep-num-workers"]),
        (&["--sweep-router", "round-robin,random"], &["--sweep-router", "round-robin or kv"]),
        (
            &["--sweep-engine-args", ENGINE_A, "--sweep-engine-args", r#"{"no_such_knob": 1}"#],
            &["--sweep-engine-args (value 2)", "no_such_knob"],
        ),
        (
            &["--engine-args", r#"{"engine": {"block_size": 16}}"#, "--sweep-engine-args", ENGINE_A],
            &["--sweep-engine-args (value 1)", "same form"],
        ),
    ];
    for (flags, needles) in cases {
        let mut args = vec!["sweep"];
        args.extend_from_slice(&WORKLOAD);
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--output-csv", csv_path.to_str().unwrap()]);
        let out = mocker(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(needles.iter().all(|n| err.contains(n)), "{flags:?}: {err}");
        assert!(!csv_path.exists(), "nothing written on bad input");
    }
}
