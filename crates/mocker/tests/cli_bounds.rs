//! Replay flags, trace rows and profiles whose sizes or times used to be taken as given:
//! they allocated tens of gigabytes up front, or saturated the u64 nanosecond clock and
//! reported wrong figures with exit 0. Each is refused with exit 2 naming the flag (or the
//! file, line and field, or the profile's array), at once and in little memory: the binary
//! runs under a 2 GB address-space cap and a 30 s timeout, so an allocation attempt fails
//! fast instead of eating the machine.

mod cli;

use std::process::Command;
use std::time::{Duration, Instant};

use cli::{assert_exit_2, scratch, stderr, BIN};

/// Runs `mocker args` capped at 2 GB of address space and 30 s; asserts exit 2 within 10 s
/// with every needle on stderr.
fn refused_quickly(args: &[&str], needles: &[&str]) {
    let start = Instant::now();
    let out = Command::new("bash")
        .args(["-c", "ulimit -v 2000000 && exec timeout 30 \"$0\" \"$@\"", BIN])
        .args(args)
        .output()
        .expect("run the mocker binary under bash");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: status {} stderr {err}", out.status);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr does not name {n:?}: {err}");
    }
    assert!(start.elapsed() < Duration::from_secs(10), "{args:?} took {:?}", start.elapsed());
}

fn replay(extra: &[&str], needles: &[&str]) {
    let args: Vec<&str> = ["replay"].iter().chain(extra).copied().collect();
    refused_quickly(&args, needles);
}

#[test]
fn replay_sizes_are_bounded_before_anything_is_allocated() {
    replay(
        &["--turns-per-session", "1000000000", "--request-count", "1"],
        &["--turns-per-session", "1..=100000"],
    );
    // Under the turn bound, but 16 Mi prompt tokens a session.
    replay(
        &["--turns-per-session", "100000", "--input-tokens", "1000", "--request-count", "1"],
        &["--turns-per-session", "16777216"],
    );
    replay(&["--num-workers", "100000"], &["--num-workers", "1..=1024"]);
    replay(
        &["--request-count", "18446744073709551615"],
        &["--request-count", "1..=100000000", "(got 18446744073709551615)"],
    );
    replay(
        &["--request-count", "20000000", "--turns-per-session", "10"],
        &["--turns-per-session", "200000000"],
    );
    replay(&["--concurrency", "18446744073709551615"], &["--concurrency", "1..=1000000"]);
    replay(&["--input-tokens", "4294967296"], &["--input-tokens", "1..=16777216"]);
    replay(&["--output-tokens", "4294967296"], &["--output-tokens", "1..=16777216"]);
    refused_quickly(&["sweep", "--sweep-num-workers", "1,100000"], &["--sweep-num-workers", "1..=1024"]);
    refused_quickly(&["sweep", "--jobs", "1000000"], &["--jobs", "1..=1024"]);
    // DP ranks are engines too.
    replay(
        &["--num-workers", "1024", "--engine-args", r#"{"dp_size": 1024}"#],
        &["--num-workers", "1048576 simulated engines", "4096"],
    );
}

#[test]
fn serve_worker_counts_and_embedding_dim_are_bounded() {
    let serve = |extra: &[&str], needles: &[&str]| {
        let args: Vec<&str> = ["serve", "--port", "0"].iter().chain(extra).copied().collect();
        refused_quickly(&args, needles);
    };
    serve(&["--num-workers", "100000"], &["--num-workers", "1..=1024"]);
    serve(
        &["--prefill-workers", "18446744073709551615", "--decode-workers", "1"],
        &["--prefill-workers", "1..=1024"],
    );
    serve(&["--embedding-dim", "1000000000000"], &["--embedding-dim", "1..=65536"]);
}

#[test]
fn synthetic_times_past_the_simulated_clock_exit_2_naming_the_flag() {
    // Each used to saturate the clock: a duration of 18,446,744,073,709.55 ms and a TTFT of
    // 0 with exit 0, or (a wrapped due time) turns run back to back.
    replay(&["--request-rate", "1e-300"], &["--request-rate", "3.6e12 ms (10^6 hours)"]);
    replay(&["--request-rate", "1e-9", "--request-count", "1"], &["--request-rate", "horizon"]);
    replay(&["--arrival-interval-ms", "1e300"], &["--arrival-interval-ms", "[0, 1e10]", "(got 1e300)"]);
    replay(
        &["--arrival-interval-ms", "1e10", "--request-count", "1000"],
        &["--arrival-interval-ms", "1000 arrivals 1e10 ms apart", "horizon"],
    );
    replay(
        &["--inter-turn-delay-ms", "1e300", "--turns-per-session", "2", "--request-count", "2"],
        &["--inter-turn-delay-ms", "[0, 1e10]"],
    );
    replay(
        &[
            "--inter-turn-delay-ms",
            "1e10",
            "--turns-per-session",
            "100",
            "--request-count",
            "100",
            "--concurrency",
            "1",
        ],
        &["--inter-turn-delay-ms", "horizon"],
    );
    replay(
        &["--arrival-interval-ms", "1e6", "--request-count", "1000", "--arrival-speedup-ratio", "1e-6"],
        &["--arrival-speedup-ratio", "use at least 2.778e-4"],
    );
    replay(&["--arrival-speedup-ratio", "1e-300"], &["--arrival-speedup-ratio", "[1e-6, 1e6]"]);
}

#[test]
fn trace_times_past_the_simulated_clock_exit_2_naming_the_flag_or_the_file() {
    let dir = scratch("trace_times");
    let path = dir.join("t.jsonl");
    let p = path.to_str().unwrap();
    // 10^7 ms (under three hours) is fine at ratio 1; a millionth of the speed makes it
    // 10^13 ms.
    let rows = "{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1]}\n\
                {\"timestamp\": 1e7, \"output_length\": 2, \"hash_ids\": [2]}\n";
    std::fs::write(&path, rows).unwrap();
    replay(&[p, "--arrival-speedup-ratio", "1e-6"], &["--arrival-speedup-ratio", "use at least"]);
    replay(&[p, "--trace-repeat", "1000000"], &["--trace-repeat", "1000000 copies", "horizon"]);
    // Timestamps within their own bound (epoch ms up to 1e13) whose span is past it.
    std::fs::write(&path, rows.replace("1e7", "1e13")).unwrap();
    replay(&[p], &["t.jsonl: timestamp:", "1e13 ms", "horizon"]);
    replay(&[p, "--arrival-speedup-ratio", "1e-6"], &["t.jsonl: timestamp:", "1e19 ms", "horizon"]);
}

#[test]
fn trace_rows_too_large_are_refused_before_they_are_collected() {
    let dir = scratch("trace_sizes");
    // 2 million hash ids in one row (14 MB): refused by the size walk, before the ids are
    // collected, under their own key.
    let ids: Vec<String> = (0..2_000_000).map(|i| i.to_string()).collect();
    let row = format!("{{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [{}]}}\n", ids.join(","));
    let path = dir.join("ids.jsonl");
    std::fs::write(&path, row).unwrap();
    let p = path.to_str().unwrap();
    for format in ["mooncake", "mooncake-delta", "agentic-mooncake"] {
        // Agentic traces name their target model (required, as in the reference).
        let model: &[&str] = if format.starts_with("agentic") { &["--execution-model", "m"] } else { &[] };
        let args: Vec<&str> = [p, "--trace-format", format].iter().chain(model).copied().collect();
        replay(&args, &["ids.jsonl:1: hash_ids:", "more than 100000 entries"]);
    }
    // An applied-compute-agentic conversation of 200k turns (1.8 MB): it planned every
    // turn's copy of a growing prompt (5.5 GB).
    let n = 200_000;
    let list = |v: &str| vec![v; n].join(",");
    let line = format!(
        "{{\"num_turns\": {n}, \"input_prompt_length\": 10, \"assistant_response_length\": [{}], \
         \"tool_call_output_length\": [{}], \"tool_call_latency\": [{}], \"final_assistant_response_length\": 1}}\n",
        list("1"),
        list("1"),
        list("0")
    );
    let applied = dir.join("applied.jsonl");
    std::fs::write(&applied, line).unwrap();
    let a = applied.to_str().unwrap();
    let applied_args = ["--trace-format", "applied-compute-agentic", "--concurrency", "4"];
    let args: Vec<&str> = [a].iter().chain(&applied_args).copied().collect();
    replay(&args, &["applied.jsonl:1: assistant_response_length:", "more than 100000 entries"]);
    // Within the turn bound, but its turns' prompts come to 10^9 hash ids.
    let n = 50_000;
    let list = |v: &str| vec![v; n].join(",");
    let line = format!(
        "{{\"num_turns\": {n}, \"input_prompt_length\": 10, \"assistant_response_length\": [{}], \
         \"tool_call_output_length\": [{}], \"tool_call_latency\": [{}], \"final_assistant_response_length\": 1}}\n",
        list("100"),
        list("200"),
        list("0")
    );
    std::fs::write(&applied, line).unwrap();
    replay(&args, &["applied.jsonl:1: num_turns:", "above the limit 16777216 for one session"]);
}

#[test]
fn profiles_with_absurd_times_exit_2_naming_path_and_array() {
    let dir = scratch("profile_times");
    // Dynamo's raw JSON layout, with a prefill TTFT of 1e300: replay reported a duration of
    // 18,446,744,073,709.55 ms and serve answered at once.
    let prefill = r#"{"prefill_isl": [100, 1000, 2000, 4000], "prefill_ttft": [1e300, 1e300, 1e300, 1e300]}"#;
    std::fs::write(dir.join("prefill_raw_data.json"), prefill).unwrap();
    let (kv, ctx) = ([0.1, 0.2, 0.5, 0.9], [100.0, 1000.0, 2000.0]);
    let points: Vec<(f64, f64)> = ctx.iter().flat_map(|&c| kv.iter().map(move |&k| (k, c))).collect();
    let decode = serde_json::json!({
        "x_kv_usage": points.iter().map(|p| p.0).collect::<Vec<_>>(),
        "y_context_length": points.iter().map(|p| p.1).collect::<Vec<_>>(),
        "z_itl": points.iter().map(|(k, c)| 5.0 + 10.0 * k + c / 1000.0).collect::<Vec<_>>(),
        "max_kv_tokens": 100000,
    });
    std::fs::write(dir.join("decode_raw_data.json"), decode.to_string()).unwrap();
    let d = dir.to_str().unwrap();
    let needles = ["--planner-profile-data", d, "prefill_ttft_ms", "outside [-3.6e6, 3.6e6] ms"];
    replay(&["--request-count", "1", "--planner-profile-data", d], &needles);
    assert_exit_2(&["serve", "--port", "0", "--planner-profile-data", d], &needles);
}
