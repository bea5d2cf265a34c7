//! `mocker replay --trace-format weka|applied-compute-agentic|dynamo`: each format
//! replayed beside the reference (ai-dynamo-runtime 1.6.1, `run_mocker_trace_replay` with
//! the same `trace_format`, engine defaults) on the trace files in `tests/traces`; the
//! pinned figures are the reference's. Malformed files exit 2 naming file, line and field.

mod cli;

use std::path::{Path, PathBuf};

use cli::{assert_exit_2, report, scratch};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/traces").join(name)
}

/// The report's headline figures equal the reference's (to its printed precision).
fn assert_reference(r: &Value, want: &[(&str, f64)]) {
    for &(key, w) in want {
        let got = r[key].as_f64().unwrap_or_else(|| panic!("{key} missing"));
        assert!((got - w).abs() <= 1e-9 * w.abs().max(1.0), "{key}: {got} vs the reference's {w}");
    }
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// 30 conversations of 1-5 tool-calling turns (random lengths and latencies), 125
/// requests, concurrency 4 on 2 workers, trace blocks of 512.
#[test]
fn applied_compute_agentic_matches_the_reference() {
    let dir = scratch("applied");
    let jsonl = dir.join("r.jsonl");
    let trace = fixture("applied_compute_agentic.jsonl");
    let args = [trace.to_str().unwrap(), "--trace-format", "applied_compute_agentic", "--concurrency", "4"];
    let r = report(
        &dir,
        "r",
        &[&args[..], &["--num-workers", "2", "--report-jsonl", jsonl.to_str().unwrap()]].concat(),
    );
    assert_reference(
        &r,
        &[
            ("num_requests", 125.0),
            ("completed_requests", 125.0),
            ("duration_ms", 44884.491812),
            ("mean_ttft_ms", 41.224942672),
            ("mean_itl_ms", 6.111883482837527),
            ("prefix_cache_reused_ratio", 0.500464479538454),
        ],
    );
    // Sessions are named and their turns numbered as the reference does.
    let recs = records(&jsonl);
    let first: Vec<&Value> =
        recs.iter().filter(|r| r["session_id"] == "applied_compute_agentic_session_1").collect();
    let turns: Vec<u64> = first.iter().map(|r| r["turn_index"].as_u64().unwrap()).collect();
    assert_eq!(turns, (0..turns.len() as u64).collect::<Vec<_>>());
    assert!(turns.len() >= 2);
    // Without timestamps a concurrency is required.
    assert_exit_2(
        &["replay", trace.to_str().unwrap(), "--trace-format", "applied-compute-agentic"],
        &["--concurrency"],
    );
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"num_turns\": 2, \"input_prompt_length\": 5, \"assistant_response_length\": [1], \
         \"tool_call_output_length\": [1, 2], \"tool_call_latency\": [0, 0], \"final_assistant_response_length\": 1}\n",
    )
    .unwrap();
    let b = bad.to_str().unwrap();
    assert_exit_2(
        &["replay", b, "--trace-format", "applied-compute-agentic", "--concurrency", "1"],
        &[&format!("{b}:1: assistant_response_length"), "num_turns is 2"],
    );
}

/// 60 `request_end` records (some wrapped in `{"event": ...}`, with `request_payload`
/// records between them) whose prompts share prefixes in 5 groups, on 2 workers: arrivals
/// at `request_received_ms`, the embedded block size of 64.
#[test]
fn dynamo_request_traces_match_the_reference() {
    let dir = scratch("dynamo");
    let jsonl = dir.join("r.jsonl");
    let trace = fixture("dynamo_requests.jsonl");
    let t = trace.to_str().unwrap();
    let r = report(
        &dir,
        "r",
        &[t, "--trace-format", "dynamo", "--num-workers", "2", "--report-jsonl", jsonl.to_str().unwrap()],
    );
    assert_reference(
        &r,
        &[
            ("num_requests", 60.0),
            ("completed_requests", 60.0),
            ("duration_ms", 20325.351192),
            ("mean_ttft_ms", 31.293967583333),
            ("mean_itl_ms", 6.004956206832305),
            ("prefix_cache_reused_ratio", 0.37498505321057035),
        ],
    );
    let recs = records(&jsonl);
    assert!(recs.iter().all(|r| r["session_id"].is_null() && r["turn_index"].is_null()));
    // The embedded block size rules; a different explicit one is an error.
    assert_exit_2(
        &["replay", t, "--trace-format", "dynamo", "--trace-block-size", "512"],
        &[&format!("{t}:1: request.replay.trace_block_size"), "--trace-block-size is 512"],
    );
    let bad = dir.join("bad.jsonl");
    let text = std::fs::read_to_string(&trace).unwrap();
    // The second request (line 3: line 2 is a payload record, skipped).
    let second = text.lines().nth(2).unwrap().replace("\"output_tokens\"", "\"out\"");
    let head: Vec<&str> = text.lines().take(2).collect();
    std::fs::write(&bad, format!("{}\n{second}\n", head.join("\n"))).unwrap();
    let b = bad.to_str().unwrap();
    assert_exit_2(
        &["replay", b, "--trace-format", "dynamo"],
        &[&format!("{b}:3: request.output_tokens"), "missing output_tokens"],
    );
}

/// Two Weka plays: one conversation with a system preamble, a growing main stream, a fork
/// whose edited prefix is spliced back, a parallel worker stream, a blocking subagent (its
/// nested times relative to its marker) joined by the next parent request, a background
/// subagent and a request without hash ids; and one of two interleaved conversations.
#[test]
fn weka_corpora_match_the_reference() {
    let dir = scratch("weka");
    let trace = fixture("weka_plays.jsonl");
    let t = trace.to_str().unwrap();
    let r = report(&dir, "both", &[t, "--trace-format", "weka", "--execution-model", "m"]);
    assert_reference(
        &r,
        &[
            ("num_requests", 22.0),
            ("completed_requests", 22.0),
            ("duration_ms", 11657.371067),
            ("mean_ttft_ms", 21.883534772727),
            ("mean_itl_ms", 5.96282602264151),
            ("prefix_cache_reused_ratio", 0.592988824147483),
        ],
    );
    // The first play alone, as a `.json` file inside a corpus directory, on 2 workers.
    let corpus = dir.join("corpus");
    std::fs::create_dir_all(corpus.join("sub")).unwrap();
    let first = std::fs::read_to_string(&trace).unwrap().lines().next().unwrap().to_string();
    std::fs::write(corpus.join("sub/play.json"), &first).unwrap();
    std::fs::write(corpus.join("notes.txt"), "not a trace").unwrap();
    let jsonl = dir.join("r.jsonl");
    let c = corpus.to_str().unwrap();
    let args = [
        c,
        "--trace-format",
        "weka",
        "--execution-model",
        "m",
        "--num-workers",
        "2",
        "--report-jsonl",
        jsonl.to_str().unwrap(),
    ];
    let r = report(&dir, "one", &args);
    assert_reference(
        &r,
        &[
            ("num_requests", 14.0),
            ("duration_ms", 11662.309252),
            ("mean_ttft_ms", 22.020010428571),
            ("mean_itl_ms", 5.775531627853879),
            ("prefix_cache_reused_ratio", 0.3840783833435395),
        ],
    );
    // Agentic records carry their dispatch time and their stream as the session.
    let recs = records(&jsonl);
    assert!(recs.iter().all(|r| r["dispatched_at_ms"] == r["arrival_time_ms"] && r["turn_index"].is_null()));
    let sessions: std::collections::BTreeSet<&str> =
        recs.iter().map(|r| r["session_id"].as_str().unwrap()).collect();
    assert_eq!(sessions.len(), 4, "main, worker and two subagent streams: {sessions:?}");

    // Malformed corpora: file, line (the trace object's) and field.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, format!("{first}\n{}\n", first.replace("\"local\"", "\"global\""))).unwrap();
    let b = bad.to_str().unwrap();
    assert_exit_2(
        &["replay", b, "--trace-format", "weka", "--execution-model", "m"],
        &[&format!("{b}:2: hash_id_scope"), "local"],
    );
    std::fs::write(&bad, first.replacen("\"in\": 200", "\"in\": 0", 1)).unwrap();
    assert_exit_2(
        &["replay", b, "--trace-format", "weka", "--execution-model", "m"],
        &[&format!("{b}:1: requests[0].in"), "1..="],
    );
    assert_exit_2(
        &["replay", t, "--trace-format", "weka", "--execution-model", "m", "--trace-block-size", "512"],
        &[&format!("{t}:1: block_size"), "--trace-block-size is 512"],
    );
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert_exit_2(
        &["replay", empty.to_str().unwrap(), "--trace-format", "weka", "--execution-model", "m"],
        &["no .json or .jsonl"],
    );
}
