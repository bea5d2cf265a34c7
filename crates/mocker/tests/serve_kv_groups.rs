//! `mocker serve` with KV cache groups (written out, or from a sliding-window model): the
//! live engine pages requests as offline replay does, and `/metrics` shows each group's
//! bytes and share of the budget under mocker's own names while a request holds them.

mod common;

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
