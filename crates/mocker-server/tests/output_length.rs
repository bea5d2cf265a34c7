//! Outputs without a length end where a real model would, at a simulated end-of-sequence
//! drawn from the configured distribution, never past the context; `ignore_eos`, an explicit
//! `max_tokens` and `{"type": "none"}` keep running to the limit. Over real HTTP.

use std::net::SocketAddr;

use serde_json::{json, Value};

mod common;
use common::server;

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new().post(format!("http://{addr}{path}")).json(&body).send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// (completion tokens, finish reason) of a chat request.
async fn chat(addr: SocketAddr, extra: Value) -> (u64, String) {
    let mut body = json!({"messages": [{"role": "user", "content": "tell me a story"}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let (status, v) = post(addr, "/v1/chat/completions", body).await;
    assert_eq!(status, 200, "{v}");
    let reason = v["choices"][0]["finish_reason"].as_str().unwrap().to_string();
    (v["usage"]["completion_tokens"].as_u64().unwrap(), reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_without_max_tokens_ends_at_a_drawn_eos_within_the_default_range() {
    let addr = server(r#"{"speedup_ratio": 1000000}"#).await;
    let mut lengths = Vec::new();
    for seed in 0..24 {
        let (len, reason) = chat(addr, json!({"seed": seed})).await;
        assert!((1..=4096).contains(&len), "seed {seed}: {len} tokens");
        assert_eq!(reason, "stop", "seed {seed}: an output ended by EOS stops");
        lengths.push(len);
    }
    // The same seed draws the same length; different seeds vary.
    assert_eq!(chat(addr, json!({"seed": 3})).await.0, lengths[3]);
    lengths.sort_unstable();
    lengths.dedup();
    assert!(lengths.len() > 12, "lengths barely vary: {lengths:?}");
    // The default pool (16384 blocks of 64) holds far more than the default window.
    let models: Value = reqwest::get(format!("http://{addr}/v1/models")).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 32768);
    let long = json!({"prompt": vec![7; 32768], "max_tokens": 1});
    let (status, v) = post(addr, "/v1/completions", long).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("prompt")), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_distribution_is_configurable_and_honours_min_tokens_and_the_context() {
    let addr = server(
        r#"{"speedup_ratio": 1000000, "max_model_len": 200,
            "output_length_distribution": {"type": "uniform", "min": 5, "max": 9}}"#,
    )
    .await;
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..40 {
        let (len, reason) = chat(addr, json!({"seed": seed})).await;
        assert!((5..=9).contains(&len) && reason == "stop", "seed {seed}: {len} {reason}");
        seen.insert(len);
    }
    assert_eq!(seen.len(), 5, "every length of the range is drawn: {seen:?}");
    // min_tokens holds back the end-of-sequence token.
    assert_eq!(chat(addr, json!({"min_tokens": 30})).await, (30, "stop".to_string()));
    // An explicit length is honoured exactly, as benchmark clients expect.
    assert_eq!(chat(addr, json!({"max_tokens": 40})).await, (40, "length".to_string()));
    // ignore_eos: the model never writes EOS, so the output fills the context.
    let (len, reason) = chat(addr, json!({"ignore_eos": true})).await;
    assert_eq!(reason, "length");
    assert!(len > 150 && len < 200, "{len}");
    // Completions keep vLLM's default of 16 tokens.
    let (status, v) = post(addr, "/v1/completions", json!({"prompt": "once upon"})).await;
    assert_eq!((status, v["usage"]["completion_tokens"].as_u64()), (200, Some(16)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_end_of_sequence_runs_to_the_context_and_a_draw_past_it_is_clipped() {
    let none = server(
        r#"{"speedup_ratio": 1000000, "max_model_len": 120, "output_length_distribution": {"type": "none"}}"#,
    )
    .await;
    let (len, reason) = chat(none, json!({})).await;
    assert_eq!(reason, "length");
    assert!(len > 80 && len < 120, "{len}");
    let long = server(
        r#"{"speedup_ratio": 1000000, "max_model_len": 120,
            "output_length_distribution": {"type": "fixed", "tokens": 5000}}"#,
    )
    .await;
    assert_eq!(chat(long, json!({})).await, (len, "length".to_string()));
    // A small pool is its own context window.
    let small = server(r#"{"speedup_ratio": 1000000, "num_gpu_blocks": 10, "block_size": 16}"#).await;
    let models: Value =
        reqwest::get(format!("http://{small}/v1/models")).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["max_model_len"], 160);
}
