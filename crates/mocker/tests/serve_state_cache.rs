//! `mocker serve` with a state cache (written out in the engine args, or from a model with
//! recurrent layers): the live engine holds each request's state in the same blocks as
//! offline replay, and publishes exactly the KV events the core gives offline for the same
//! requests (token blocks only; a state is never announced).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{http, python, repo_root, Server, KEY};
use mocker_core::config::LaunchConfig;
use mocker_core::engine::{Engine, EngineOptions};
use mocker_core::events::KvEventData;
use mocker_core::request::Request;
use serde_json::Value;

/// 32 blocks of 16 tokens at 1 KiB a token; a state of 64 KiB is 4 of them.
const STATE: &str = r#"{"engine": {"block_size": 16, "num_gpu_blocks": 32, "kv_cache_bytes_per_token": 1024,
    "state_cache": {"bytes_per_request": 65536}}}"#;

/// The stderr line that says what the engine is.
fn engine_line(server: &Server) -> String {
    server.start_lines.iter().find(|l| l.contains("KV blocks")).expect("an engine line").clone()
}

fn gauge(base: &str, name: &str) -> f64 {
    let (status, text) = http(base, "GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    let line = text.lines().find(|l| l.starts_with(&format!("{name}{{"))).unwrap_or_else(|| panic!("{name}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// (type, parent, hashes) of each stored or removed event, in order.
type Events = Vec<(String, Option<u64>, Vec<u64>)>;

fn served_events(r: &Value) -> Events {
    let mut out = Vec::new();
    for b in r["batches"].as_array().unwrap() {
        for e in b["events"].as_array().unwrap() {
            let hashes = |k: &str| e[k].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect();
            match e["type"].as_str().unwrap() {
                "BlockStored" => {
                    out.push(("stored".into(), e["parent_block_hash"].as_u64(), hashes("block_hashes")))
                }
                "BlockRemoved" => out.push(("removed".into(), None, hashes("block_hashes"))),
                _ => {}
            }
        }
    }
    out
}

/// The same prompts through the core offline, one after another as the client sends them:
/// the events and each request's reused tokens.
fn offline(prompts: &[Vec<u32>]) -> (Events, Vec<u64>) {
    let config = LaunchConfig::from_json_str(STATE).unwrap().engine;
    let mut e = Engine::new(EngineOptions { config, record_kv_events: true, ..Default::default() }).unwrap();
    let (mut events, mut cached, mut now) = (Vec::new(), Vec::new(), 0);
    for (i, p) in prompts.iter().enumerate() {
        e.submit(Request {
            uuid: i as u128 + 1,
            tokens: p.clone(),
            max_output_tokens: 3,
            ..Default::default()
        })
        .unwrap();
        while e.has_work() {
            let pass = e.step(now);
            now = pass.end_ns;
            cached.extend(pass.admissions.iter().map(|a| u64::from(a.reused_tokens)));
            for ev in &pass.kv_events {
                match &ev.data {
                    KvEventData::Stored { parent_hash, blocks, .. } => events.push((
                        "stored".into(),
                        *parent_hash,
                        blocks.iter().map(|b| b.block_hash).collect(),
                    )),
                    KvEventData::Removed { block_hashes } => {
                        events.push(("removed".into(), None, block_hashes.clone()))
                    }
                    _ => {}
                }
            }
        }
    }
    (events, cached)
}

#[test]
fn live_state_cache_publishes_the_offline_events_and_holds_states_in_the_blocks() {
    let server = Server::start(&[
        "--engine-args",
        STATE,
        "--speedup-ratio",
        "50",
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
        "--kv-events-replay-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let line = engine_line(&server);
    assert!(
        line.contains("32 KV blocks × 16 tokens per rank, shared with a recurrent state of 4 blocks (65536 bytes) a request"),
        "{line}"
    );
    let line = loop {
        let line = server.stderr.recv_timeout(Duration::from_secs(10)).expect("publisher announced");
        if line.contains("publishing KV events on") {
            break line;
        }
    };
    let pub_ep = line.split("events on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let replay_ep = line.split("(replay ").nth(1).unwrap().trim_end_matches(')').to_string();
    let out = Command::new(python())
        .arg(repo_root().join("tests/python/serve_kv_events.py"))
        .args([&server.base, KEY, &pub_ep, &replay_ep])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect())
        .collect();
    let (events, cached) = offline(&prompts);
    let served = served_events(&r);
    // The prompts overflow the pool (states included), so blocks are evicted too.
    assert!(served.iter().any(|e| e.0 == "removed"), "{served:?}");
    assert_eq!(served, events, "served events differ from offline");
    let served_cached: Vec<u64> =
        r["cached_tokens"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(served_cached, cached);
}

#[test]
fn a_running_request_holds_its_state_blocks() {
    let server = Server::start(&["--engine-args", STATE]);
    assert_eq!(gauge(&server.base, "vllm:kv_cache_usage_perc"), 0.0);
    let base = server.base.clone();
    let body = r#"{"model": "mocker-test", "prompt": "one two three four five", "max_tokens": 80, "ignore_eos": true}"#;
    let request = std::thread::spawn(move || http(&base, "POST", "/v1/completions", &[], body));
    let mut peak: f64 = 0.0;
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(10));
        peak = peak.max(gauge(&server.base, "vllm:kv_cache_usage_perc"));
        if request.is_finished() {
            break;
        }
    }
    let (status, text) = request.join().unwrap();
    assert_eq!(status, 200, "{text}");
    // At least one token block and the 4-block state of 32.
    assert!(peak >= 5.0 / 32.0 - 1e-9, "peak usage {peak}");
}

/// A model with recurrent layers serves with the state cache offline replay derives for
/// it, and says so.
#[test]
fn a_recurrent_model_serves_with_its_state_cache() {
    let server =
        Server::start(&["--model", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--tensor-parallel-size", "4"]);
    let line = engine_line(&server);
    assert!(
        line.contains(
            "× 272 tokens per rank, shared with a recurrent state of 3 blocks (10027008 bytes) a request"
        ),
        "{line}"
    );
    let body = r#"{"model": "mocker-test", "prompt": "one two three", "max_tokens": 5, "ignore_eos": true}"#;
    let (status, text) = http(&server.base, "POST", "/v1/completions", &[], body);
    assert_eq!(status, 200, "{text}");
    let (_, info) = http(&server.base, "GET", "/metrics", &[], "");
    assert!(info.contains("block_size=\"272\""), "{info}");
    drop(server);
    // The flag asks for prefix caching as the key would: align mode.
    let model = ["--model", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--tensor-parallel-size", "4"];
    let server = Server::start(&[&model[..], &["--enable-prefix-caching"]].concat());
    assert!(
        server.start_lines.iter().any(|l| l.contains("prefix caching in align mode")),
        "{:?}",
        server.start_lines
    );
    drop(server);
    // A KV events endpoint turns emission on, which align mode cannot give: refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args([
            "serve",
            "--port",
            "0",
            "--enable-prefix-caching",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:0",
        ])
        .args(model)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("emit_kv_events"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A handoff would move the tokens' KV and not the state: P/D serving with a state cache is
/// refused by name, as the reference refuses P/D worker types with one.
#[test]
fn disaggregated_serving_with_a_state_cache_is_refused_by_name() {
    let pd = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}"#;
    let model = ["--model", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--tensor-parallel-size", "4"];
    for (args, flag) in [
        (vec!["--engine-args", STATE, "--kv-transfer-config", pd], "--kv-transfer-config"),
        ([&model[..], &["--prefill-workers", "1", "--decode-workers", "1"]].concat(), "--prefill-workers"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--port", "0"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains("aggregated workers only"), "{err}");
    }
}
