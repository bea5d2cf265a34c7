//! `mocker serve` for gateway tests (issues 23 and 24): the simulated engine startup
//! (`startup_time`), injected failures (`--failure-injection-*`) and `X-Return-Error`. The
//! real binary on 127.0.0.1, raw HTTP clients; every wait is bounded.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{http, Server};
use serde_json::Value;

const COMPLETION: &str = r#"{"prompt": [1, 2, 3, 4], "max_tokens": 1}"#;

fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let e = v["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    e
}

/// Until `startup_time` has passed every probe (`/health`, `/ping`, `/health/ready`) and every
/// request answers 503 with an OpenAI-style body, `/metrics` still answers; then all serve.
#[test]
fn nothing_is_served_until_the_simulated_startup_is_over() {
    let server = Server::start(&["--engine-args", r#"{"engine": {}, "startup_time": 3}"#]);
    let started = Instant::now();
    for probe in ["/health", "/ping", "/health/ready"] {
        let (status, body) = http(&server.base, "GET", probe, &[], "");
        assert_eq!(status, 503, "{probe}: {body}");
        assert!(error_of(&body)["message"].as_str().unwrap().contains("starting up"), "{body}");
    }
    let (status, body) = http(&server.base, "POST", "/v1/completions", &[], COMPLETION);
    assert_eq!(status, 503, "{body}");
    assert_eq!(error_of(&body)["code"], 503);
    assert_eq!(http(&server.base, "GET", "/v1/models", &[], "").0, 503);
    assert_eq!(http(&server.base, "GET", "/metrics", &[], "").0, 200);
    let ready = loop {
        if http(&server.base, "GET", "/health", &[], "").0 == 200 {
            break started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never became healthy");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Measured from after the address was announced, so a little under the configured 3 s.
    assert!(ready >= Duration::from_millis(2000), "healthy after only {ready:?}");
    assert_eq!(http(&server.base, "GET", "/ping", &[], "").0, 200);
    assert_eq!(http(&server.base, "GET", "/health/ready", &[], "").0, 200);
    let (status, body) = http(&server.base, "POST", "/v1/completions", &[], COMPLETION);
    assert_eq!(status, 200, "{body}");
}

/// A seeded 25% rate over 400 requests fails 20–30% of them, only with the configured
/// kinds, each with its status, OpenAI `type` and `code`; the rest complete.
#[test]
fn injected_failures_follow_the_rate_and_the_configured_kinds() {
    let server = Server::start(&[
        "--speedup-ratio",
        "1000",
        "--failure-injection-rate",
        "25",
        "--failure-types",
        "rate_limit,model_not_found",
        "--failure-injection-seed",
        "11",
    ]);
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for i in 0..400 {
        let path = if i % 2 == 0 { "/v1/completions" } else { "/v1/chat/completions" };
        let body = if i % 2 == 0 {
            COMPLETION.to_string()
        } else {
            r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}"#.to_string()
        };
        let (status, text) = http(&server.base, "POST", path, &[], &body);
        *by_status.entry(status).or_default() += 1;
        match status {
            200 => {}
            429 => {
                let e = error_of(&text);
                assert_eq!(
                    (e["type"].as_str(), e["code"].as_str()),
                    (Some("requests"), Some("rate_limit_exceeded"))
                );
            }
            404 => {
                let e = error_of(&text);
                assert_eq!(e["code"], "model_not_found", "{text}");
                assert_eq!(e["param"], "model", "{text}");
            }
            other => panic!("unexpected {other}: {text}"),
        }
    }
    let failed = 400 - by_status.get(&200).copied().unwrap_or(0);
    let pct = failed as f64 / 4.0;
    assert!((20.0..=30.0).contains(&pct), "{pct}% failed: {by_status:?}");
    assert!(by_status.get(&429).is_some_and(|&n| n > 10) && by_status.get(&404).is_some_and(|&n| n > 10));
    // Non-inference routes are never failed.
    for _ in 0..20 {
        assert_eq!(http(&server.base, "GET", "/v1/models", &[], "").0, 200);
    }
}

/// `X-Return-Error: STATUS` answers that status with an OpenAI-style body (the injected
/// kinds' bodies for their statuses), whether or not injection is on; a bad value is a 400
/// naming the header.
#[test]
fn x_return_error_answers_the_status_asked_for() {
    let server = Server::start(&["--speedup-ratio", "1000"]);
    let cases = [
        (429, "requests", Some("rate_limit_exceeded")),
        (401, "invalid_request_error", Some("invalid_api_key")),
        (400, "invalid_request_error", Some("invalid_request_error")),
        (404, "invalid_request_error", Some("model_not_found")),
        (500, "server_error", Some("server_error")),
        (503, "server_error", None),
        (418, "invalid_request_error", None),
    ];
    for (status, kind, code) in cases {
        let value = status.to_string();
        let (got, body) =
            http(&server.base, "POST", "/v1/completions", &[("X-Return-Error", &value)], COMPLETION);
        assert_eq!(got, status, "{body}");
        let e = error_of(&body);
        assert_eq!(e["type"], kind, "{body}");
        assert_eq!(e["code"].as_str(), code, "{body}");
    }
    let (got, body) = http(&server.base, "POST", "/v1/chat/completions", &[("X-Return-Error", "200")], "{}");
    assert_eq!(got, 400, "{body}");
    assert!(error_of(&body)["message"].as_str().unwrap().contains("X-Return-Error"), "{body}");
    let (got, body) = http(&server.base, "POST", "/v1/completions", &[], COMPLETION);
    assert_eq!(got, 200, "{body}");
}

fn serve_exit(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn bad_failure_injection_flags_exit_2_naming_the_flag() {
    for (args, needle) in [
        (&["--failure-injection-rate", "101"][..], "--failure-injection-rate"),
        (&["--failure-injection-rate", "NaN"][..], "--failure-injection-rate"),
        (&["--failure-injection-rate", "5", "--failure-types", "rate_limit,bogus"][..], "bogus"),
        (&["--failure-types", "rate_limit"][..], "--failure-types: needs --failure-injection-rate"),
        (&["--failure-injection-seed", "3"][..], "--failure-injection-seed: needs"),
    ] {
        let (code, err) = serve_exit(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
