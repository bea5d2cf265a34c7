//! Hostile inputs through the real binary: engine args past the engine's types, trace rows
//! with huge or missing values, special files as report targets, a device as tokenizer.
//! Each is refused with exit 2 naming the place, or handled without harm; none may crash,
//! hang or allocate without bound.

mod cli;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli::{assert_exit_2, mocker, scratch, stderr, BIN};

const SMALL: [&str; 6] = ["--input-tokens", "64", "--output-tokens", "4", "--request-count", "4"];

#[test]
fn engine_args_past_the_engines_types_exit_2_naming_key_and_range() {
    for (args, needle) in [
        (r#"{"block_size": 4294967296}"#, "engine.block_size: must be in 1..=65536 (got 4294967296)"),
        (r#"{"block_size": 4294967297}"#, "engine.block_size: must be in 1..=65536"),
        (r#"{"num_gpu_blocks": 1099511627776}"#, "engine.num_gpu_blocks: must be in 1..=1073741824"),
    ] {
        let mut replay = vec!["replay", "--engine-args", args];
        replay.extend_from_slice(&SMALL);
        assert_exit_2(&replay, &[needle]);
        // serve refuses before it binds (it used to start and answer 503 to everything).
        assert_exit_2(&["serve", "--port", "0", "--engine-args", args], &[needle]);
    }
    // A device as an engine-args file would be read forever.
    let refused = ["/dev/zero", "not a regular file"];
    assert_exit_2(&["replay", "--engine-args", "@/dev/zero"], &refused);
    assert_exit_2(&["serve", "--port", "0", "--engine-args", "@/dev/zero"], &refused);
}

#[test]
fn trace_rows_out_of_range_exit_2_naming_file_line_and_field() {
    let dir = scratch("trace_rows");
    let path = dir.join("t.jsonl");
    let p = path.to_str().unwrap();
    let ok = r#"{"timestamp": 0, "output_length": 2, "hash_ids": [1]}"#;
    for (format, row, needles) in [
        (
            "mooncake",
            r#"{"timestamp": 0, "output_length": 0, "hash_ids": [1]}"#,
            ["t.jsonl:2: output_length:", "1..="],
        ),
        (
            "mooncake",
            r#"{"timestamp": 0, "output_length": 2147483648, "hash_ids": [1]}"#,
            ["t.jsonl:2: output_length:", "(got 2147483648)"],
        ),
        (
            "mooncake-delta",
            r#"{"timestamp": 0, "output_length": 2147483648, "hash_ids": [1]}"#,
            ["t.jsonl:2: output_length:", "(got 2147483648)"],
        ),
        (
            "agentic-mooncake",
            r#"{"request_id": "x", "timestamp": 0, "output_length": 0, "hash_ids": [1]}"#,
            ["t.jsonl:2: output_length:", "1..="],
        ),
        (
            "mooncake",
            r#"{"output_length": 2, "hash_ids": [1]}"#,
            ["t.jsonl:2: timestamp: missing", "--concurrency"],
        ),
    ] {
        std::fs::write(&path, format!("{ok}\n{row}\n")).unwrap();
        // Agentic traces name their target model (required, as in the reference).
        let model: &[&str] = if format.starts_with("agentic") { &["--execution-model", "m"] } else { &[] };
        let args: Vec<&str> = ["replay", p, "--trace-format", format].iter().chain(model).copied().collect();
        assert_exit_2(&args, &needles);
    }
    std::fs::write(&path, [ok.as_bytes(), b"\n{\"output_length\": \xff}\n"].concat()).unwrap();
    assert_exit_2(&["replay", p], &["t.jsonl:2: row: invalid UTF-8"]);
}

#[cfg(unix)]
#[test]
fn dev_null_as_report_stays_a_character_device() {
    use std::os::unix::fs::FileTypeExt;
    let mut args = vec!["replay", "--report-json", "/dev/null", "--report-jsonl", "/dev/null"];
    args.extend_from_slice(&SMALL);
    let out = mocker(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
}

#[cfg(unix)]
#[test]
fn a_fifo_report_is_written_in_place_and_no_temporary_file_is_left() {
    let dir = scratch("fifo");
    let fifo = dir.join("report.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    // The reader opens the FIFO as the writer does; it ends at the writer's close.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let mut child = Command::new(BIN)
        .args(["replay", "--report-json", fifo.to_str().unwrap()])
        .args(SMALL)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("replay into a FIFO did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let report: serde_json::Value = serde_json::from_str(&reader.join().unwrap()).unwrap();
    assert_eq!(report["completed_requests"], 4);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn a_failed_report_write_leaves_no_temporary_file() {
    let dir = scratch("failed_write");
    // A directory where the JSONL report should go: the rename over it fails at the end.
    let target = dir.join("requests.jsonl");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("keep"), b"").unwrap();
    let mut args = vec!["replay", "--report-jsonl", target.to_str().unwrap()];
    args.extend_from_slice(&SMALL);
    assert_exit_2(&args, &["--report-jsonl", "requests.jsonl"]);
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["requests.jsonl"], "temporary file left behind");
}

#[cfg(unix)]
#[test]
fn a_device_as_tokenizer_is_refused_at_once() {
    let started = Instant::now();
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0", "--tokenizer", "/dev/zero"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("--tokenizer /dev/zero was still being read after 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("/dev/zero") && err.contains("not a regular file"), "{err}");
}
