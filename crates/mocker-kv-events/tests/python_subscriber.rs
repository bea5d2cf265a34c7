//! End to end with a Python subscriber that declares vLLM's msgspec structs exactly as vLLM
//! does (tests/python/kv_events_subscriber.py): what it decodes must be what the engine did.
//!
//! The interpreter is `$MOCKER_PYTHON` (default `python3`) and needs `pyzmq` and `msgspec`:
//! `pip install -r tests/python/requirements.txt` (`.ci/run` does this). Without them the test
//! fails and says so.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mirror::DecodedBatch;
use common::scenario::{check_batches, run_scenario, BLOCK_SIZE};
use mocker_kv_events::{KvEventPublisher, PublisherOptions};
use serde::Deserialize;

#[derive(Deserialize)]
struct Output {
    topics: Vec<String>,
    live_seqs: Vec<u64>,
    recovered_seqs: Vec<u64>,
    batches: Vec<SeqBatch>,
    legacy_decode_ok: bool,
    reencoded_bytes_identical: bool,
    replay: ReplayOut,
}

#[derive(Deserialize)]
struct SeqBatch {
    seq: u64,
    #[serde(flatten)]
    batch: DecodedBatch,
}

#[derive(Deserialize)]
struct ReplayOut {
    from: u64,
    seqs: Vec<u64>,
    end_marker_payload_empty: bool,
    payloads_match_live: bool,
}

fn python() -> String {
    std::env::var("MOCKER_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/kv_events_subscriber.py")
}

fn require_python_modules(python: &str) {
    let probe = Command::new(python).args(["-c", "import zmq, msgspec"]).output();
    let hint = "install them with `pip install -r tests/python/requirements.txt` (or run `.ci/run`), \
                or point MOCKER_PYTHON at an interpreter that has them";
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "{python} lacks the Python modules pyzmq/msgspec this test needs: {}\n{hint}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!("cannot run Python interpreter {python:?} ({e}); {hint}"),
    }
}

#[test]
fn python_vllm_subscriber_decodes_engine_events() {
    let python = python();
    require_python_modules(&python);
    let dp_rank = 1;
    let scenario = run_scenario(dp_rank);
    let n = scenario.batches.len() as u64;
    let publisher = KvEventPublisher::start(PublisherOptions {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        dp_rank,
        block_size: BLOCK_SIZE,
        topic: String::new(),
        queue_capacity: 1024,
        replay_buffer_steps: 10_000,
    })
    .expect("start");
    let replay_from = n / 2;
    let mut child = Command::new(&python)
        .arg(script())
        .args(["--endpoint", publisher.endpoint()])
        .args(["--replay-endpoint", publisher.replay_endpoint().unwrap()])
        .args(["--expect", &n.to_string(), "--replay-from", &replay_from.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the Python subscriber");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read READY");
    if line.trim() != "READY" {
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).ok();
        panic!("subscriber did not start: {line:?} {err}");
    }
    // Let the subscription reach the PUB side; anything missed is recovered through replay.
    std::thread::sleep(Duration::from_millis(200));
    for batch in &scenario.batches {
        publisher.publish(batch);
    }
    line.clear();
    stdout.read_line(&mut line).expect("read the JSON result");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "Python subscriber did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    assert!(status.success(), "Python subscriber failed: {err}");
    let out: Output = serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad JSON ({e}): {line}"));

    assert_eq!(out.topics, vec![String::new()], "vLLM's default empty topic");
    let first = out.live_seqs[0];
    assert_eq!(out.live_seqs, (first..n).collect::<Vec<_>>(), "live sequence numbers are gap-free");
    assert_eq!(out.recovered_seqs, (0..first).collect::<Vec<_>>(), "the missed head came from replay");
    assert_eq!(out.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), (0..n).collect::<Vec<_>>());
    let decoded: Vec<DecodedBatch> = out.batches.into_iter().map(|b| b.batch).collect();
    check_batches(&scenario, &decoded, dp_rank);
    assert!(out.legacy_decode_ok, "the oldest vLLM struct layout must still decode our batches");
    assert!(out.reencoded_bytes_identical, "msgspec re-encoding vLLM's structs must give our exact bytes");
    assert_eq!(out.replay.from, replay_from);
    assert_eq!(out.replay.seqs, (replay_from..n).collect::<Vec<_>>());
    assert!(out.replay.end_marker_payload_empty && out.replay.payloads_match_live);
    publisher.shutdown();
}
