//! `mocker replay --agentic-lanes N --execution-model M --weka-nested-timestamp-basis B`
//! end to end: each flag changes the run as the reference's keyword does (durations and
//! arrivals are the reference's, from tests/fixtures/hybrid_reference.json's F cases), the
//! report's `run.agentic` records the projection, and what the reference refuses exits 2
//! naming the flag, in the reference's order.

mod cli;

use std::path::{Path, PathBuf};

use cli::{assert_exit_2, mocker, report, scratch, stderr};
use serde_json::Value;

const ENGINE: &str = r#"{"engine": {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 1024,
    "num_gpu_blocks": 1000, "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}}}"#;

/// Four plays of two requests (the second 100 ms after the first completes), as in F2..F6.
fn plays(dir: &Path) -> PathBuf {
    let mut rows = vec![r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16, "hash_id_scope": "local", "source": {"format": "t", "digest": "t"}}"#.to_string()];
    for p in 0..4 {
        let b = 100 * p;
        rows.push(format!(
            r#"{{"request_id": "p{p}r0", "play_id": "play{p}", "session_id": "s{p}", "model": "source-a", "input_length": 64, "output_length": 8, "hash_ids": [{}, {}, {}, {}], "not_before_ms": {}}}"#,
            b + 1, b + 2, b + 3, b + 4, 10 * p
        ));
        rows.push(format!(
            r#"{{"request_id": "p{p}r1", "play_id": "play{p}", "session_id": "s{p}", "model": "source-b", "input_length": 96, "output_length": 8, "hash_ids": [{}, {}, {}, {}, {}, {}], "not_before_ms": {}, "dependencies": [{{"request_id": "p{p}r0", "trigger": "completion", "delay_ms": 100.0, "relation": "sequence"}}]}}"#,
            b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, 10 * p + 5
        ));
    }
    let path = dir.join("plays.jsonl");
    std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    path
}

/// One Weka trace whose subagent marker is at `marker` s with nested requests at `inner`.
fn weka(dir: &Path, marker: f64, inner: [f64; 2]) -> PathBuf {
    let req = |t: f64, ids: &str| {
        format!(r#"{{"type": "n", "t": {t}, "model": "m2", "in": 64, "out": 8, "hash_ids": [{ids}]}}"#)
    };
    let text = format!(
        r#"{{"id": "trace1", "block_size": 16, "hash_id_scope": "local", "requests": [{{"type": "n", "t": 0.0, "model": "m1", "in": 64, "out": 8, "hash_ids": [1, 2, 3, 4]}}, {{"type": "subagent", "t": {marker}, "agent_id": "a1", "subagent_type": "general", "status": "completed", "requests": [{}, {}]}}, {{"type": "n", "t": 6.0, "model": "m1", "in": 80, "out": 8, "hash_ids": [1, 2, 3, 4, 9]}}]}}"#,
        req(inner[0], "1, 2, 5, 6"),
        req(inner[1], "1, 2, 5, 7")
    );
    let path = dir.join("weka.jsonl");
    std::fs::write(&path, text + "\n").unwrap();
    path
}

fn arrivals(jsonl: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(jsonl).unwrap();
    let mut v: Vec<f64> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["arrival_time_ms"].as_f64().unwrap())
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

#[test]
fn lanes_run_plays_a_lane_at_a_time_as_the_reference_does() {
    let dir = scratch("lanes");
    let trace = plays(&dir);
    let t = trace.to_str().unwrap();
    let base =
        [t, "--trace-format", "agentic-mooncake", "--engine-args", ENGINE, "--execution-model", "target"];
    // F2 and F4: 175 ms with every play at its own time; 536 / 268 / 134 ms with 1 / 2 / 4
    // lanes (one play takes 134 ms: 17 ms, 100 ms, 17 ms).
    let open = report(&dir, "open", &base);
    assert_eq!(open["duration_ms"], 175.0);
    for (lanes, want) in [("1", 536.0), ("2", 268.0), ("4", 134.0), ("9", 134.0)] {
        let jsonl = dir.join(format!("lanes{lanes}.jsonl"));
        let mut args = base.to_vec();
        args.extend_from_slice(&["--agentic-lanes", lanes, "--report-jsonl", jsonl.to_str().unwrap()]);
        let r = report(&dir, &format!("lanes{lanes}"), &args);
        assert_eq!(r["duration_ms"], want, "{lanes} lanes");
        if lanes == "1" {
            // Each play starts when the previous one's last request ends.
            assert_eq!(arrivals(&jsonl), [0.0, 117.0, 134.0, 251.0, 268.0, 385.0, 402.0, 519.0]);
        }
        if lanes == "2" {
            let a = &r["run"]["agentic"];
            assert_eq!(a["lanes"], 2);
            assert_eq!(a["input_format"], "agentic_mooncake");
            assert_eq!(a["qualification"], "functional_only");
            assert_eq!(a["model_projection"]["source_models"], serde_json::json!(["source-a", "source-b"]));
            assert_eq!(a["model_projection"]["target_model"], "target");
        }
    }
    // The reference's measured speedup: delays and authored offsets both scale (336 ms).
    let mut args = base.to_vec();
    args.extend_from_slice(&["--agentic-lanes", "1", "--arrival-speedup-ratio", "2"]);
    assert_eq!(report(&dir, "fast", &args)["duration_ms"], 336.0);
}

#[test]
fn the_weka_nested_timestamp_basis_moves_nested_requests_as_the_reference_does() {
    let dir = scratch("weka_basis");
    let run = |trace: &Path, basis: Option<&str>| {
        let jsonl = dir.join("w.jsonl");
        let mut args = vec![trace.to_str().unwrap(), "--trace-format", "weka", "--engine-args", ENGINE];
        args.extend_from_slice(&["--execution-model", "target", "--report-jsonl", jsonl.to_str().unwrap()]);
        if let Some(b) = basis {
            args.extend_from_slice(&["--weka-nested-timestamp-basis", b]);
        }
        let r = report(&dir, "w", &args);
        (arrivals(&jsonl), r["run"]["agentic"]["weka_nested_timestamp_basis"].clone())
    };
    // F11: a marker at 1 s, nested at 2 s and 3 s.
    let after = weka(&dir, 1.0, [2.0, 3.0]);
    let absolute = vec![0.0, 2017.0, 3034.0, 6051.0];
    assert_eq!(run(&after, None), (absolute.clone(), "absolute".into()));
    assert_eq!(run(&after, Some("auto")), (absolute.clone(), "absolute".into()));
    assert_eq!(run(&after, Some("absolute")), (absolute, "absolute".into()));
    assert_eq!(run(&after, Some("relative")), (vec![0.0, 3017.0, 4034.0, 6051.0], "relative".into()));
    // A marker at 2 s, nested at 0.5 s and 1.5 s: auto reads them as relative; absolute
    // is refused with the reference's sentence.
    let before = weka(&dir, 2.0, [0.5, 1.5]);
    let relative = vec![0.0, 2517.0, 3534.0, 6051.0];
    assert_eq!(run(&before, None), (relative.clone(), "relative".into()));
    assert_eq!(run(&before, Some("relative")), (relative, "relative".into()));
    let b = before.to_str().unwrap();
    assert_exit_2(
        &["replay", b, "--trace-format", "weka", "--execution-model", "t", "--weka-nested-timestamp-basis", "absolute"],
        &[
            "weka.jsonl:1: requests[1].requests[0].t:",
            "Weka source weka.jsonl#000000, trace trace1, subagent a1 inner request 0 at 0.5 precedes its marker \
             at 2 under absolute nested_timestamp_basis",
        ],
    );
}

#[test]
fn what_the_reference_refuses_exits_2_naming_the_flag() {
    let dir = scratch("refusals");
    let trace = plays(&dir);
    let t = trace.to_str().unwrap();
    let ag = ["replay", t, "--trace-format", "agentic-mooncake"];
    let with = |extra: &[&'static str]| -> Vec<&str> { ag.iter().chain(extra).copied().collect() };
    let mooncake = dir.join("m.jsonl");
    std::fs::write(
        &mooncake,
        "{\"timestamp\": 0, \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [1]}\n",
    )
    .unwrap();
    let m = mooncake.to_str().unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        // F1, F3: the target model is required, and not blank (checked first).
        (
            with(&[]),
            vec!["--execution-model: required", "agentic execution requires a configured target model"],
        ),
        (
            with(&["--execution-model", " ", "--agentic-lanes", "0"]),
            vec!["--execution-model: must be non-empty"],
        ),
        // F5, F6: lanes.
        (
            with(&["--execution-model", "t", "--agentic-lanes", "0"]),
            vec!["--agentic-lanes: must be at least 1 (got 0)"],
        ),
        (
            with(&["--execution-model", "t", "--agentic-lanes", "-3"]),
            vec!["--agentic-lanes: must be at least 1 (got -3)"],
        ),
        (
            with(&["--execution-model", "t", "--agentic-lanes", "1", "--concurrency", "2"]),
            vec!["--agentic-lanes: cannot be combined with --concurrency"],
        ),
        (
            with(&["--execution-model", "t", "--agentic-lanes", "1", "--trace-repeat", "2"]),
            vec!["--agentic-lanes", "--trace-repeat"],
        ),
        (
            with(&["--execution-model", "t", "--agentic-lanes", "1", "--mode", "online"]),
            vec!["--agentic-lanes: offline mode only"],
        ),
        // F7, F9, F10: flags for other formats; the basis value is checked before its format.
        (
            vec!["replay", m, "--trace-block-size", "16", "--agentic-lanes", "1"],
            vec!["--agentic-lanes: requires --trace-format agentic-mooncake, weka, or dynamo"],
        ),
        (
            vec!["replay", m, "--trace-block-size", "16", "--weka-nested-timestamp-basis", "absolute"],
            vec!["weka_nested_timestamp_basis requires trace_format='weka'"],
        ),
        (
            vec!["replay", m, "--weka-nested-timestamp-basis", "sometimes", "--agentic-lanes", "0"],
            vec!["--weka-nested-timestamp-basis: must be 'auto', 'absolute', or 'relative', got 'sometimes'"],
        ),
        (
            with(&["--execution-model", "t", "--weka-nested-timestamp-basis", "auto"]),
            vec!["weka_nested_timestamp_basis requires trace_format='weka'"],
        ),
        // A synthetic workload has no trace to apply them to.
        (vec!["replay", "--agentic-lanes", "2"], vec!["--agentic-lanes: applies to trace replay only"]),
        (vec!["replay", "--execution-model", "x"], vec!["--execution-model: applies to trace replay only"]),
    ];
    for (args, needles) in cases {
        assert_exit_2(&args, &needles);
    }
    // A play whose request depends on another play's is refused, as the reference does.
    let crossing = dir.join("crossing.jsonl");
    let text = std::fs::read_to_string(&trace).unwrap().replacen(
        r#""request_id": "p1r0", "trigger""#,
        r#""request_id": "p0r1", "trigger""#,
        1,
    );
    std::fs::write(&crossing, text).unwrap();
    let c = crossing.to_str().unwrap();
    assert_exit_2(
        &[
            "replay",
            c,
            "--trace-format",
            "agentic-mooncake",
            "--execution-model",
            "t",
            "--agentic-lanes",
            "1",
        ],
        &["crossing.jsonl:5: play_id:", "request p1r1 in play play1 depends on request p0r1 in play play0"],
    );
}

#[test]
fn an_execution_model_for_a_trace_without_models_runs_and_says_it_is_unused() {
    // F8: the reference accepts it on a Mooncake trace and it changes nothing.
    let dir = scratch("model_on_mooncake");
    let path = dir.join("m.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 64, \"output_length\": 4, \"hash_ids\": [1, 2, 3, 4]}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let out =
        mocker(&["replay", p, "--trace-block-size", "16", "--engine-args", ENGINE, "--execution-model", "t"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: --execution-model: not used by a mooncake trace"),
        "{}",
        stderr(&out)
    );
    let r = report(
        &dir,
        "m",
        &[p, "--trace-block-size", "16", "--engine-args", ENGINE, "--execution-model", "t"],
    );
    assert_eq!(r["duration_ms"], 13.0);
    assert!(r["run"].get("agentic").is_none());
}
