//! End-to-end tests of `mocker serve`'s gRPC services (vllm.grpc.engine.VllmEngine on the vllm
//! backend, sglang.grpc.scheduler.SglangScheduler on the sglang backend): the real binary on
//! 127.0.0.1 and grpcio clients with stubs generated in the test from the vendored protos
//! (tests/python/serve_grpc.py, tests/python/serve_grpc_sglang.py).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{run_script, Server, KEY};

fn grpc_line(server: &Server) -> String {
    loop {
        let line =
            server.stderr.recv_timeout(Duration::from_secs(30)).expect("server announces its gRPC port");
        if let Some(at) = line.strip_prefix("mocker: gRPC (").and_then(|l| l.split(") on ").nth(1)) {
            return at.trim().to_string();
        }
    }
}

/// On the HTTP port (HTTP/2 with a gRPC content type): API key, health and reflection,
/// model/server/load info, paced streaming with counts and prefix-cache hits, non-streaming,
/// seeded output and stop token ids, n = 2, text prompts, Abort and client cancellation
/// freeing the KV, Embed, refusals by name, unknown field numbers, malformed and oversized
/// messages; HTTP still answered on the same port.
#[test]
fn grpc_clients_are_served_on_the_http_port() {
    let server = Server::start(&[
        "--block-size",
        "16",
        "--num-gpu-blocks",
        "256",
        "--max-model-len",
        "512",
        "--embedding-dim",
        "32",
        "--speedup-ratio",
        "1",
    ]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let result = run_script("serve_grpc.py", &["suite", &addr, &server.base, KEY]);
    assert_eq!(result["ok"], true, "{result}");
}

/// The sglang backend serves SGLang's scheduler service (and answers vLLM's UNIMPLEMENTED),
/// on the HTTP port and on `--grpc-port`: health and reflection name it, model/server/load
/// info, streaming with cumulative counts, non-streaming with stop token ids and n = 2,
/// Abort freeing the KV (SGLang's metric names), Embed, refusals by name, unknown field numbers.
#[test]
fn sglang_clients_are_served_on_the_sglang_backend() {
    let server = Server::start(&[
        "--engine-type",
        "sglang",
        "--grpc-port",
        "0",
        "--block-size",
        "16",
        "--num-gpu-blocks",
        "256",
        "--max-model-len",
        "512",
        "--embedding-dim",
        "32",
        "--speedup-ratio",
        "1",
    ]);
    let grpc = grpc_line(&server);
    let addr = server.base.trim_start_matches("http://").to_string();
    let result = run_script("serve_grpc_sglang.py", &["suite", &addr, &server.base, KEY, &grpc]);
    assert_eq!(result["ok"], true, "{result}");
}

/// `--grpc-port` adds a gRPC listener; the HTTP port keeps serving gRPC as well.
#[test]
fn a_separate_grpc_port_serves_the_same_engine() {
    let server = Server::start(&["--grpc-port", "0", "--speedup-ratio", "5"]);
    let grpc = grpc_line(&server);
    assert_ne!(grpc, server.base.trim_start_matches("http://"));
    let result = run_script("serve_grpc.py", &["port", &grpc, &server.base, KEY]);
    assert_eq!(result["ok"], true, "{result}");
}

/// While the engine starts (`startup_time`), health reports NOT_SERVING and the RPCs
/// UNAVAILABLE; SERVING once it is up.
#[test]
fn grpc_health_follows_the_simulated_startup() {
    let server = Server::start(&["--engine-args", r#"{"startup_time": 8}"#]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let result = run_script("serve_grpc.py", &["startup", &addr, &server.base, KEY]);
    assert_eq!(result["ok"], true, "{result}");
}

/// `--grpc-port` combinations that cannot work exit 2 naming the flag.
#[test]
fn impossible_grpc_ports_are_refused_by_name() {
    let cases: [&[&str]; 3] = [
        &["--port", "18000", "--grpc-port", "18001", "--num-workers", "2"],
        &["--port", "18000", "--grpc-port", "65535", "--num-workers", "2"],
        &["--grpc-port", "0", "--engine-args", r#"{"backend": "trtllm"}"#],
    ];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--host", "127.0.0.1"])
            .args(args)
            .output()
            .expect("mocker runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("--grpc-port"), "{args:?}: {stderr}");
    }
}
