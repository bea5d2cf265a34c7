//! Issue 45 item 1: JSON generated from a schema is bounded by the request's output length
//! and built off the async workers. A 264-byte schema nesting `minItems: 100000` used to
//! abort the server on a 2 GiB allocation; two large ones held `/health` for seconds. Over
//! real HTTP on loopback.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

async fn server() -> SocketAddr {
    common::server(r#"{"speedup_ratio": 1000000}"#).await
}

/// Arrays of `min` strings nested `depth` deep.
fn nested(min: u64, depth: usize) -> Value {
    let mut s = json!({"type": "string"});
    for _ in 0..depth {
        s = json!({"type": "array", "items": s, "minItems": min});
    }
    s
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(20))
        .json(body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_schema_answers_max_tokens_cut_at_length() {
    let addr = server().await;
    let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": nested(100_000, 3)}});
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
        "response_format": format});
    let completion = json!({"prompt": "hi", "max_tokens": 50, "response_format": format});
    let tool = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": nested(100_000, 3)}}],
        "tool_choice": "required"});
    for (path, body) in
        [("/v1/chat/completions", &chat), ("/v1/completions", &completion), ("/v1/chat/completions", &tool)]
    {
        let started = Instant::now();
        let (status, v) = post(addr, path, body).await;
        assert_eq!(status, 200, "{v}");
        assert!(started.elapsed() < Duration::from_secs(5), "{path}: {:?}", started.elapsed());
        assert_eq!(v["usage"]["completion_tokens"], 50, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        let message = &v["choices"][0]["message"];
        let text = match (path, message["tool_calls"][0]["function"]["arguments"].as_str()) {
            (_, Some(args)) => args,
            ("/v1/completions", _) => v["choices"][0]["text"].as_str().unwrap(),
            _ => message["content"].as_str().unwrap(),
        };
        assert!(text.starts_with("[[["), "{text}");
        assert!(serde_json::from_str::<Value>(text).unwrap_err().is_eof(), "a JSON prefix: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_large_plans_are_built() {
    let addr = server().await;
    // No max_tokens: the output may fill the 32k window, so each plan is a full budget.
    let body = json!({"messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": nested(2_000, 2)}}});
    // More requests than async workers: planned on the workers, they would hold them all.
    let requests: Vec<_> = (0..4)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let client = reqwest::Client::new();
    for _ in 0..10 {
        let started = Instant::now();
        let resp = client
            .get(format!("http://{addr}/health"))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .expect("/health answers within a second");
        assert_eq!(resp.status(), 200);
        assert!(started.elapsed() < Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for r in requests {
        let (status, v) = r.await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_required_properties_plan_fast_and_too_many_are_refused() {
    let addr = server().await;
    let schema = |n: usize| {
        let names: Vec<String> = (0..n).map(|i| format!("field_{i}")).collect();
        let props: serde_json::Map<String, Value> =
            names.iter().map(|k| (k.clone(), json!({"type": "boolean"}))).collect();
        json!({"type": "object", "properties": props, "required": names})
    };
    let body = |n: usize| {
        json!({"prompt": "hi", "max_tokens": 20,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema(n)}}})
    };
    // 40k: 8e8 name comparisons with a list lookup per property.
    let started = Instant::now();
    let (status, v) = post(addr, "/v1/completions", &body(40_000)).await;
    assert_eq!((status, &v["choices"][0]["finish_reason"]), (200, &json!("length")), "{v}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // The issue's repro: 150k required properties.
    let (status, v) = post(addr, "/v1/completions", &body(150_000)).await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("response_format")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("more than 200000"), "{v}");
}
