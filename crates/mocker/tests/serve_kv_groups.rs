//! `mocker serve` with KV cache groups (written out, or from a sliding-window model): the
//! live engine pages requests as offline replay does, and `/metrics` shows each group's
//! bytes and share of the budget under mocker's own names while a request holds them.

mod common;

use std::process::Command;

use common::{http, Server};

const GROUPS: &str = r#"{"engine": {"block_size": 16, "enable_prefix_caching": false,
    "kv_cache_capacity_bytes": 1048576,
    "kv_cache_groups": [
        {"name": "full", "kind": "attention", "num_layers": 1, "block_size_tokens": 16, "page_size_bytes": 1024},
        {"name": "swa", "kind": "attention", "num_layers": 1, "block_size_tokens": 16, "page_size_bytes": 1024, "sliding_window": 32}]}}"#;

fn group_gauges(base: &str) -> Vec<(String, f64)> {
    let (status, text) = http(base, "GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    text.lines()
        .filter(|l| l.starts_with("mocker:kv_cache_group_used_bytes{"))
        .map(|l| {
            let group = l.split("group=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
            (group, l.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect()
}

#[test]
fn live_groups_show_per_group_usage_while_a_request_runs() {
    let server = Server::start(&["--engine-args", GROUPS]);
    // Idle: both groups are listed, empty.
    assert_eq!(group_gauges(&server.base), vec![("full".to_string(), 0.0), ("swa".to_string(), 0.0)]);
    // A request of 60 tokens (about 2 s: a pass at full KV usage is slow) holds its pages.
    let base = server.base.clone();
    let body = r#"{"model": "mocker-test", "prompt": "one two three four five six seven eight nine ten eleven twelve",
        "max_tokens": 60, "ignore_eos": true}"#;
    let request = std::thread::spawn(move || http(&base, "POST", "/v1/completions", &[], body));
    let mut seen = Vec::new();
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let g = group_gauges(&server.base);
        if g.iter().all(|(_, b)| *b > 0.0) {
            seen = g;
            break;
        }
    }
    assert!(!seen.is_empty(), "no group ever held bytes");
    // The window keeps at most ceil(32/16) + 1 pages; the full history grows past it.
    let (full, swa) = (seen[0].1, seen[1].1);
    assert!(swa <= 3.0 * 1024.0, "{seen:?}");
    let (status, text) = request.join().unwrap();
    assert_eq!(status, 200, "{text}");
    let after = group_gauges(&server.base);
    assert!(after.iter().all(|(_, b)| *b == 0.0), "{after:?} (full held {full})");
}

/// A sliding-window model serves with the groups and budget offline replay derives for it;
/// with a KV events endpoint (groups publish none) both size every layer as full attention.
#[test]
fn a_sliding_window_model_serves_the_capacity_replay_reports() {
    let dir = std::env::temp_dir().join(format!("mocker-serve-groups-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = ["--model", "google/gemma-3-27b-it"];
    let replay = |extra: &[&str], name: &str| -> serde_json::Value {
        let path = dir.join(format!("{name}.json"));
        let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["replay", "--input-tokens", "100", "--output-tokens", "4", "--request-count", "2"])
            .args(model)
            .args(extra)
            .args(["--report-json", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        report["run"]["kv_capacity"].clone()
    };
    let engine_line =
        |server: &Server| server.start_lines.iter().find(|l| l.contains("engine vllm")).unwrap().clone();
    let groups = replay(&[], "groups");
    let server = Server::start(&model);
    let bytes = groups["kv_cache_capacity_bytes"].as_u64().unwrap();
    assert!(
        engine_line(&server).contains(&format!("KV cache groups sharing {bytes} bytes per rank")),
        "{:?}",
        server.start_lines
    );
    drop(server);
    let uniform = replay(&["--engine-args", r#"{"emit_kv_events": true}"#], "uniform");
    assert!(uniform.get("kv_cache_groups").is_none(), "{uniform}");
    let server = Server::start(&[&model[..], &["--kv-events-endpoint", "tcp://127.0.0.1:0"]].concat());
    let line = engine_line(&server);
    assert!(line.contains(&format!("{} KV blocks × 16 tokens per rank", uniform["blocks"])), "{line}");
    assert!(
        server.start_lines.iter().any(|l| l.contains("cache groups publish no KV events")),
        "{:?}",
        server.start_lines
    );
    let _ = std::fs::remove_dir_all(&dir);
}
