//! `mocker serve --kv-events-endpoint`: a Python pyzmq + msgspec subscriber (structs as vLLM
//! declares them) decodes the events of real completions; the hashes, parents and token ids
//! must be the core's, sequence numbers gap-free, evictions followed by Removed, and the
//! replay socket must answer a range with the end marker.

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use common::{python, repo_root, Server, KEY};
use mocker_core::hashing::sequence_hashes;
use serde_json::Value;

const BLOCK: usize = 16;

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn subscriber_sees_the_cores_blocks_gap_free_with_removals_and_replay() {
    let server = Server::start(&[
        "--block-size",
        "16",
        "--num-gpu-blocks",
        "24",
        "--speedup-ratio",
        "50",
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-events-replay-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let line = loop {
        let line = server.stderr.recv_timeout(Duration::from_secs(10)).expect("publisher announced");
        if line.contains("publishing KV events on") {
            break line;
        }
    };
    // "mocker: dp rank 0 publishing KV events on tcp://... (replay tcp://...)"
    let pub_ep = line.split("events on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let replay_ep = line.split("(replay ").nth(1).unwrap().trim_end_matches(')').to_string();
    let probe = Command::new(python()).args(["-c", "import zmq, msgspec"]).status().unwrap();
    assert!(
        probe.success(),
        "pyzmq/msgspec missing: run .ci/run or pip install -r tests/python/requirements.txt"
    );
    let out = Command::new(python())
        .arg(repo_root().join("tests/python/serve_kv_events.py"))
        .args([&server.base, KEY, &pub_ep, &replay_ep])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();

    // Gap-free from 0, whatever arrived live or through replay.
    let batches = r["batches"].as_array().unwrap();
    let seqs: Vec<u64> = batches.iter().map(|b| b["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    let live = ids(&r["live_seqs"]);
    assert!(live.windows(2).all(|w| w[1] == w[0] + 1), "live seqs must be consecutive: {live:?}");
    let last = *seqs.last().unwrap();
    assert_eq!(ids(&r["tail_seqs"]), (last.saturating_sub(2)..=last).collect::<Vec<_>>());
    assert_eq!(r["tail_end_marker"], true);
    assert_eq!(r["tail_same_bytes"], true);

    // Rebuild each stored block's full token prefix from its parent chain: the hashes must be
    // exactly the core's sequence hashes of those tokens.
    let mut prefix_of: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut live_blocks: HashSet<u64> = HashSet::new();
    let (mut stored, mut removed, mut cleared) = (0, 0, 0);
    for b in batches {
        assert_eq!(b["dp_rank"], 0);
        for e in b["events"].as_array().unwrap() {
            match e["type"].as_str().unwrap() {
                "BlockStored" => {
                    assert_eq!(e["block_size"], BLOCK);
                    assert_eq!(e["medium"], "GPU");
                    let mut tokens = match e["parent_block_hash"].as_u64() {
                        None => Vec::new(),
                        Some(p) => {
                            assert!(live_blocks.contains(&p), "parent {p} was not published or was removed");
                            prefix_of[&p].clone()
                        }
                    };
                    let new: Vec<u32> = ids(&e["token_ids"]).into_iter().map(|t| t as u32).collect();
                    let hashes = ids(&e["block_hashes"]);
                    assert_eq!(new.len(), hashes.len() * BLOCK);
                    let first = tokens.len() / BLOCK;
                    tokens.extend(new);
                    let expected = sequence_hashes(&tokens, BLOCK);
                    assert_eq!(&expected[first..], &hashes[..]);
                    for (i, h) in hashes.iter().enumerate() {
                        assert!(live_blocks.insert(*h), "block {h} stored twice while cached");
                        prefix_of.insert(*h, tokens[..(first + i + 1) * BLOCK].to_vec());
                    }
                    stored += hashes.len();
                }
                "BlockRemoved" => {
                    for h in ids(&e["block_hashes"]) {
                        assert!(live_blocks.remove(&h), "removed block {h} was not stored");
                        removed += 1;
                    }
                }
                "AllBlocksCleared" => {
                    live_blocks.clear();
                    cleared += 1;
                }
                other => panic!("unexpected event {other}"),
            }
        }
    }
    assert!(removed > 0, "the pool is too small for all prompts: evictions must be published");
    assert_eq!(cleared, 1, "reset_prefix_cache publishes AllBlocksCleared once");
    assert!(stored > removed);

    // The shared 64-token prefix was stored by the first request and reused by the second.
    let prompts: Vec<Vec<u32>> = r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(p).into_iter().map(|t| t as u32).collect())
        .collect();
    let shared = &sequence_hashes(&prompts[0], BLOCK)[..4];
    assert!(shared.iter().all(|h| prefix_of.contains_key(h)));
    assert_eq!(r["cached_tokens"][1], 64);
}

/// Subscribes to `endpoint` with pyzmq, sends two completions of 40 tokens (two full
/// 16-token blocks each), and returns every event received within a second of quiet, each
/// as msgspec decodes vLLM's positional arrays: `[tag, hashes, parent, token_ids, ...]`.
fn collect_events(server: &Server, endpoint: &str) -> Vec<Value> {
    const SCRIPT: &str = r#"
import json, sys, time
import httpx, msgspec, zmq
base, key, ep = sys.argv[1:4]
sub = zmq.Context().socket(zmq.SUB)
sub.setsockopt(zmq.LINGER, 0)
sub.connect(ep)
sub.setsockopt(zmq.SUBSCRIBE, b"")
time.sleep(0.3)
with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
    for k in range(2):
        r = http.post(f"{base}/v1/completions", json={"prompt": [k * 100 + i for i in range(40)], "max_tokens": 2})
        r.raise_for_status()
events, quiet = [], time.monotonic() + 1.0
while time.monotonic() < quiet:
    if sub.poll(100):
        _t, _seq, payload = sub.recv_multipart()
        events += msgspec.msgpack.decode(payload)[1]
        quiet = time.monotonic() + 0.5
print(json.dumps(events))
"#;
    let out = Command::new(python()).args(["-c", SCRIPT, &server.base, KEY, endpoint]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap()
}

/// A free loopback TCP port (bound, then released for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `emit_kv_token_ids: false` keeps the events but sends `BlockStored` without token ids
/// (an empty list, as vLLM's field stays in place); the hashes are the core's all the same.
#[test]
fn emit_kv_token_ids_false_sends_stored_blocks_without_tokens() {
    let port = free_port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let server = Server::start(&[
        "--block-size",
        "16",
        "--engine-args",
        r#"{"engine": {"emit_kv_events": true, "emit_kv_token_ids": false}}"#,
        "--kv-events-endpoint",
        &endpoint,
    ]);
    let events = collect_events(&server, &endpoint);
    let stored: Vec<&Value> = events.iter().filter(|e| e[0] == "BlockStored").collect();
    assert!(stored.len() >= 2, "{events:?}");
    let mut hashes = HashSet::new();
    for e in &stored {
        assert_eq!(e[3], serde_json::json!([]), "token ids sent: {e}");
        hashes.extend(ids(&e[1]));
    }
    for k in 0..2u32 {
        let prompt: Vec<u32> = (0..40).map(|i| k * 100 + i).collect();
        for h in sequence_hashes(&prompt, BLOCK) {
            assert!(hashes.contains(&h), "block {h} of prompt {k} not stored");
        }
    }
}

/// `emit_kv_events: false` with an endpoint publishes nothing (the publisher is not
/// started); `emit_kv_events: true` without an endpoint exits 2 naming it.
#[test]
fn emit_kv_events_false_publishes_nothing_and_true_needs_an_endpoint() {
    let port = free_port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let server = Server::start(&[
        "--block-size",
        "16",
        "--engine-args",
        r#"{"engine": {"emit_kv_events": false}}"#,
        "--kv-events-endpoint",
        &endpoint,
    ]);
    assert!(collect_events(&server, &endpoint).is_empty());
    while let Ok(line) = server.stderr.recv_timeout(Duration::from_millis(200)) {
        assert!(!line.contains("publishing KV events"), "{line}");
    }

    let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args(["serve", "--port", "0", "--engine-args", r#"{"engine": {"emit_kv_events": true}}"#])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("emit_kv_events") && err.contains("--kv-events-endpoint"), "{err}");
}
