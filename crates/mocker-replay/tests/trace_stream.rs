//! A streamed trace (rows read as the replay reaches them, `trace::stream`) replays exactly
//! as the same trace loaded whole, and only traces whose release order is their file's
//! are streamed.

mod replay_capture;
use replay_capture::capture;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mocker_core::config::LaunchConfig;
use mocker_replay::trace::generator::{GeneratorOptions, TraceGenerator};
use mocker_replay::trace::load::load_trace;
use mocker_replay::trace::stream::{scan_for_stream, StreamIf};
use mocker_replay::{
    run_replay, Cluster, Hooks, ReplayOptions, RouterMode, TraceFormat, TraceWorkload, Workload,
};

/// A file under the system's temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("mocker-stream-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write trace");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn generated(rows: u64) -> String {
    let options = GeneratorOptions {
        rows,
        rate: 40.0,
        prompt_median: 900.0,
        output_median: 40.0,
        ..Default::default()
    };
    let mut out = Vec::new();
    for row in TraceGenerator::new(options).expect("generator") {
        out.write_all(row.to_json().as_bytes()).unwrap();
        out.write_all(b"\n").unwrap();
    }
    String::from_utf8(out).unwrap()
}

/// `trace` replayed once, by timestamp or (with `concurrency`) in a closed loop.
fn once(trace: mocker_replay::trace::Trace, concurrency: Option<usize>) -> Workload {
    Workload::Trace(TraceWorkload { trace: Arc::new(trace), concurrency, repeat: 1, lanes: None })
}

/// The summary and every per-request record of a replay of `trace`.
fn replay(
    trace: mocker_replay::trace::Trace,
    concurrency: Option<usize>,
    router: RouterMode,
) -> (String, Vec<String>) {
    let engine = r#"{"engine": {"block_size": 16, "num_gpu_blocks": 600, "max_num_seqs": 16}}"#;
    let options = ReplayOptions {
        cluster: Cluster::aggregated(LaunchConfig::from_json_str(engine).expect("engine args"), 4),
        workload: once(trace, concurrency),
        router,
        ..Default::default()
    };
    capture(&options)
}

#[test]
fn a_streamed_trace_replays_as_the_loaded_one() {
    let file = TempFile::new("same.jsonl", &generated(1500));
    for (concurrency, router) in [(None, RouterMode::Kv), (Some(24), RouterMode::RoundRobin)] {
        let when = StreamIf { by_timestamp: concurrency.is_none() };
        let streamed = scan_for_stream(file.path(), TraceFormat::Mooncake, Some(512), when)
            .expect("scan")
            .expect("a generated trace streams");
        assert!(streamed.sessions.is_empty(), "a streamed trace holds no rows");
        assert_eq!(streamed.num_turns(), 1500);
        let loaded = load_trace(file.path(), TraceFormat::Mooncake, Some(512)).expect("load");
        assert_eq!(streamed.prompt_tokens(), loaded.prompt_tokens());
        let (want, want_records) = replay(loaded, concurrency, router);
        let (got, got_records) = replay(streamed, concurrency, router);
        assert_eq!(got, want, "summary ({concurrency:?}, {router:?})");
        assert_eq!(got_records.len(), 1500);
        assert!(got_records == want_records, "per-request records ({concurrency:?}, {router:?})");
    }
}

#[test]
fn only_traces_released_in_file_order_stream() {
    let by_time = StreamIf { by_timestamp: true };
    let in_order = StreamIf { by_timestamp: false };
    let scan = |text: &str, format: TraceFormat, when: StreamIf| {
        let file = TempFile::new("scan.jsonl", text);
        scan_for_stream(file.path(), format, Some(512), when).map(|t| t.is_some())
    };
    let sorted = "{\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1]}\n\n\
                  {\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 2]}\n";
    assert_eq!(scan(sorted, TraceFormat::Mooncake, by_time), Ok(true));
    assert_eq!(scan(sorted, TraceFormat::MooncakeDelta, by_time), Ok(false), "delta prompts carry history");
    let unsorted = "{\"timestamp\": 5, \"output_length\": 2, \"hash_ids\": [1]}\n\
                    {\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 2]}\n";
    assert_eq!(scan(unsorted, TraceFormat::Mooncake, by_time), Ok(false), "released out of file order");
    assert_eq!(scan(unsorted, TraceFormat::Mooncake, in_order), Ok(true), "a closed loop keeps file order");
    let untimed = "{\"timestamp\": 5, \"output_length\": 2, \"hash_ids\": [1]}\n\
                   {\"output_length\": 2, \"hash_ids\": [1, 2]}\n";
    assert_eq!(scan(untimed, TraceFormat::Mooncake, by_time), Ok(false));
    assert_eq!(scan(untimed, TraceFormat::Mooncake, in_order), Ok(true));
    let sessions = "{\"session_id\": \"a\", \"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1]}\n\
                    {\"session_id\": \"a\", \"delay\": 3, \"output_length\": 2, \"hash_ids\": [1, 2]}\n";
    assert_eq!(scan(sessions, TraceFormat::Mooncake, by_time), Ok(false), "multi-turn sessions are loaded");
    assert_eq!(scan("\n", TraceFormat::Mooncake, by_time), Ok(false), "an empty trace is a load's to refuse");
    // Ids are used as they are, so they must be small and dense enough to count.
    let sparse = "{\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [99999999999]}\n";
    assert_eq!(scan(sparse, TraceFormat::Mooncake, by_time), Ok(false), "ids past u32 are loaded");
    let scattered = "{\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 4000000000]}\n";
    assert_eq!(
        scan(scattered, TraceFormat::Mooncake, by_time),
        Ok(false),
        "a use count per id value would not pay"
    );
    // A bad row is refused in a load's words.
    let bad = "{\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1]}\n{\"timestamp\": 2, \"hash_ids\": [1]}\n";
    let file = TempFile::new("bad.jsonl", bad);
    let scanned = scan_for_stream(file.path(), TraceFormat::Mooncake, Some(512), by_time).unwrap_err();
    let loaded = load_trace(file.path(), TraceFormat::Mooncake, Some(512)).unwrap_err();
    assert_eq!(scanned.to_string(), loaded.to_string());
}

#[test]
fn a_trace_that_changes_under_its_replay_fails_it() {
    let text = generated(200);
    let when = StreamIf { by_timestamp: true };
    // Gone before the replay: nothing is replayed, and the replay says why.
    let file = TempFile::new("gone.jsonl", &text);
    let trace = scan_for_stream(file.path(), TraceFormat::Mooncake, Some(512), when).unwrap().unwrap();
    drop(file);
    let options = |trace| ReplayOptions { workload: once(trace, None), ..Default::default() };
    let e = run_replay(&options(trace), Hooks::default()).unwrap_err();
    assert!(e.to_string().contains("cannot read it again"), "{e}");
    // Cut short, or rewritten, after the first pass: the replay fails.
    let half: String = text.lines().take(100).map(|l| format!("{l}\n")).collect();
    let keyed = half.replace("\"hash_ids\"", "\"session_id\": 1, \"hash_ids\"");
    for (changed, why) in
        [(half, "ended after 100 of its 200 rows"), (keyed, "no longer a request of its own")]
    {
        let file = TempFile::new("cut.jsonl", &text);
        let trace = scan_for_stream(file.path(), TraceFormat::Mooncake, Some(512), when).unwrap().unwrap();
        std::fs::write(file.path(), changed).unwrap();
        let e = run_replay(&options(trace), Hooks::default()).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
}
