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
    for (flag, value) in [
        ("--rate", "0"),
        ("--follow-up", "2"),
        ("--families", "0"),
        ("--prompt-median", "0"),
        ("--burstiness", "0"),
    ] {
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

/// One generated row, as the tests read it back.
struct GenRow {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

fn generate_rows(args: &[&str]) -> Vec<GenRow> {
    let out = mocker(&[&["trace", "generate"], args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            GenRow {
                timestamp: v["timestamp"].as_u64().unwrap(),
                input_length: v["input_length"].as_u64().unwrap(),
                output_length: v["output_length"].as_u64().unwrap(),
                hash_ids: v["hash_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect(),
            }
        })
        .collect()
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64
}

fn assert_near(what: &str, measured: f64, requested: f64, tolerance: f64) {
    let off = (measured - requested).abs() / requested;
    assert!(off <= tolerance, "{what}: measured {measured}, requested {requested} ({:.1}% off)", off * 100.0);
}

/// Over 100k rows the generator delivers what it was asked for: the arrival rate, the
/// share of follow-up turns and the medians of new prompt and output lengths, each within
/// 3%. A follow-up is recognised from the trace alone: its first id past the family prompt
/// was seen before (a first turn's ids past the family prompt are all fresh). That holds
/// when the conversation it extends had a full block past the family prompt (a partial one
/// is re-issued, as its content changed): sigma 0.5 makes a shorter one a 1-in-1,000 event.
#[test]
fn a_generated_trace_has_the_requested_rate_follow_up_share_and_length_medians() {
    let rows = generate_rows(&[
        "--rows",
        "100000",
        "--rate",
        "200",
        "--follow-up",
        "0.35",
        "--prompt-median",
        "2500",
        "--output-median",
        "250",
        "--family-tokens",
        "2048",
        "--sigma",
        "0.5",
        "--seed",
        "11",
    ]);
    assert_eq!(rows.len(), 100_000);
    let span_s = (rows.last().unwrap().timestamp - rows[0].timestamp) as f64 / 1000.0;
    assert_near("arrival rate", (rows.len() - 1) as f64 / span_s, 200.0, 0.03);

    let family_blocks = 2048 / 512;
    let mut seen = std::collections::HashSet::new();
    let (mut follow_ups, mut first_turn_new) = (0usize, Vec::new());
    for (i, r) in rows.iter().enumerate() {
        let past_family = r.hash_ids[family_blocks];
        if i > 0 && seen.contains(&past_family) {
            follow_ups += 1;
        } else {
            first_turn_new.push(r.input_length - 2048);
        }
        seen.extend(r.hash_ids.iter().copied());
    }
    assert_near("follow-up share", follow_ups as f64 / (rows.len() - 1) as f64, 0.35, 0.03);
    assert_near("new prompt median", median(first_turn_new), 2500.0, 0.03);
    assert_near("output median", median(rows.iter().map(|r| r.output_length).collect()), 250.0, 0.03);
}

/// Fraction of the trace's hash ids that some earlier row already used: the block reuse a
/// perfect cache would see.
fn reused_share(rows: &[GenRow]) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let (mut reused, mut total) = (0usize, 0usize);
    for r in rows {
        total += r.hash_ids.len();
        reused += r.hash_ids.iter().filter(|&&h| !seen.insert(h)).count();
    }
    reused as f64 / total as f64
}

/// The share of reused blocks is the one the options imply. With fixed lengths (sigma 0),
/// one family of 8 blocks and 2,560 new tokens (5 blocks) per first turn, 8 of every 13 ids
/// repeat. With every turn a follow-up of the one open conversation, a turn repeats the
/// full blocks of the previous prompt and answer: (1,024 + 1,000 + 512 + 512 new) tokens
/// grow the conversation by 1,512 tokens a turn, and the partial block is re-issued.
#[test]
fn the_share_of_reused_blocks_follows_the_families_and_follow_ups() {
    let fixed = ["--rows", "2000", "--sigma", "0", "--families", "1", "--family-tokens", "4096"];
    let first_turns = generate_rows(&[&fixed[..], &["--follow-up", "0", "--prompt-median", "2560"]].concat());
    assert_near("first turns only", reused_share(&first_turns), 8.0 / 13.0, 0.01);
    assert!(first_turns.iter().all(|r| r.input_length == 4096 + 2560 && r.hash_ids.len() == 13));

    // One conversation that every turn continues: each prompt starts with the previous one.
    let chained = generate_rows(&[
        "--rows",
        "200",
        "--sigma",
        "0",
        "--families",
        "1",
        "--family-tokens",
        "1024",
        "--follow-up",
        "1",
        "--max-open",
        "1",
        "--prompt-median",
        "512",
        "--output-median",
        "1000",
        "--prompt-max",
        "512",
        "--output-max",
        "1000",
    ]);
    for pair in chained.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert_eq!(b.input_length, a.input_length + 1000 + 512, "prompt, answer, new message");
        let full = (a.input_length / 512) as usize;
        assert_eq!(b.hash_ids[..full], a.hash_ids[..full], "the previous prompt's full blocks repeat");
    }
    // All but the new message's and the answer's blocks repeat, so reuse approaches
    // (length - 1,512 new tokens) / length over a long conversation.
    let last = chained.last().unwrap();
    let expected_tail = 1.0 - 1512.0 / last.input_length as f64;
    assert!(reused_share(&chained[150..]) > expected_tail - 0.02, "{}", reused_share(&chained[150..]));
}

/// Peak resident memory of a running process (kB), from /proc.
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The generator streams: writing 400k rows holds no more memory than writing 20k. The
/// probe reads the child's peak RSS while it is still alive, blocked on its output pipe
/// with the last rows unread.
#[test]
fn generation_streams_in_constant_memory() {
    use std::io::{BufRead, BufReader};
    let peak = |rows: usize| {
        let mut child = Command::new(BIN)
            .args(["trace", "generate", "--rows", &rows.to_string(), "--rate", "200"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // Stop reading well before the end: a pipe buffer's worth of rows (~64 KiB) stays
        // unwritten, so the child cannot have exited.
        for _ in 0..rows - 2000 {
            lines.next().unwrap().unwrap();
        }
        let kb = peak_rss_kb(child.id());
        lines.for_each(drop);
        assert!(child.wait().unwrap().success());
        kb
    };
    let (small, large) = (peak(20_000), peak(400_000));
    // Measured: 27.5 MB and 29.6 MB (the open conversations' ids grow a little before their
    // cap holds them); holding the rows would add some 80 MB.
    assert!(large < small + 8192, "peak RSS {large} kB for 400k rows against {small} kB for 20k");
}
