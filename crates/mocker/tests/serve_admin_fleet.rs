//! `mocker serve`'s runtime control (`GET/POST /admin/config`) and mixed fleets
//! (`--worker-engine-args`), end to end: the real binary on 127.0.0.1 driven by httpx, the
//! openai SDK and prometheus_client (tests/python/serve_admin_fleet.py).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{run_script, Server, KEY};

/// Admin changes act on the next request (speed, API-server latency, failure injection),
/// are refused by name for keys fixed at start, need the API key, and show on /metrics.
#[test]
fn admin_config_changes_the_running_server() {
    let server = Server::start(&["--block-size", "16", "--num-gpu-blocks", "256", "--max-model-len", "512"]);
    let result = run_script("serve_admin_fleet.py", &["admin", &server.base, KEY]);
    assert_eq!(result["ok"], true, "{result}");
}

/// Three workers, two of them with engine args of their own: each reports its own engine on
/// /v1/models, /metrics and /admin/config, and serves.
#[test]
fn a_mixed_fleet_reports_each_workers_engine() {
    let fleet = r#"{"1": {"num_gpu_blocks": 96, "block_size": 32, "max_num_seqs": 7,
                          "model": "Qwen/Qwen3-8B", "gpu": "a100-80gb"},
                    "2": {"backend": "sglang", "num_gpu_blocks": 128}}"#;
    let mut server = Server::start(&[
        "--num-workers",
        "3",
        "--engine-args",
        r#"{"block_size": 16, "num_gpu_blocks": 64}"#,
        "--worker-engine-args",
        fleet,
    ]);
    let mut bases = vec![server.base.clone()];
    while bases.len() < 3 {
        let line = server.stderr.recv_timeout(Duration::from_secs(30)).expect("each worker announces itself");
        if let Some(url) = line.split("serving model on ").nth(1) {
            bases.push(url.trim().to_string());
        }
    }
    let mut args = vec!["fleet", KEY];
    args.extend(bases.iter().map(String::as_str));
    let result = run_script("serve_admin_fleet.py", &args);
    assert_eq!(result["ok"], true, "{result}");
    let cards = result["cards"].as_array().unwrap();
    let engine = |i: usize, k: &str| cards[i]["engine"][k].clone();
    assert_eq!((engine(0, "num_gpu_blocks"), engine(0, "block_size")), (64.into(), 16.into()));
    assert_eq!((engine(1, "num_gpu_blocks"), engine(1, "block_size")), (96.into(), 32.into()));
    assert_eq!(engine(1, "max_num_seqs"), 7);
    assert_eq!((engine(2, "backend"), engine(2, "num_gpu_blocks")), ("sglang".into(), 128.into()));
    assert_eq!(engine(0, "backend"), "vllm");
    assert_eq!((engine(1, "model"), engine(1, "gpu")), ("Qwen/Qwen3-8B".into(), "a100-80gb".into()));
    // gRPC's GetModelInfo names the model each worker is timed as.
    assert_eq!(cards[0]["grpc_model_path"], "mocker-test");
    assert_eq!(cards[1]["grpc_model_path"], "Qwen/Qwen3-8B");
    assert_eq!(cards[1]["grpc_max_context_length"], cards[1]["max_model_len"]);
    drop(server.child.kill());
}

/// A P/D deployment's prefill and decode workers with engines of their own: each reports
/// its own, and the front serves through them.
#[test]
fn a_pd_deployment_mixes_its_workers_engines() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model-name",
            "mocker-test",
            "--api-key",
            KEY,
        ])
        .args(["--prefill-workers", "1", "--decode-workers", "2"])
        .args(["--engine-args", r#"{"block_size": 16, "num_gpu_blocks": 64}"#])
        .args([
            "--worker-engine-args",
            r#"[{"num_gpu_blocks": 200}, {"max_num_seqs": 3}, {"num_gpu_blocks": 300, "speedup_ratio": 4}]"#,
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("mocker starts");
    let lines = common::lines_of(child.stderr.take().unwrap());
    // Workers announce themselves first, the front last.
    let mut workers = Vec::new();
    let front = loop {
        let line = lines.recv_timeout(Duration::from_secs(30)).expect("start-up lines");
        let url = line.rsplit(' ').next().unwrap().to_string();
        if line.starts_with("mocker: prefill worker") || line.starts_with("mocker: decode worker") {
            workers.push(url);
        } else if line.contains("serving model on") {
            break url;
        }
    };
    let _kill = KillOnDrop(child);
    let mut args = vec!["pd", KEY, &front];
    args.extend(workers.iter().map(String::as_str));
    let result = run_script("serve_admin_fleet.py", &args);
    assert_eq!(result["ok"], true, "{result}");
    let blocks: Vec<_> = result["cards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["engine"]["num_gpu_blocks"].clone(), c["engine"]["max_num_seqs"].clone()))
        .collect();
    assert_eq!(blocks[0].0, 200);
    assert_eq!(blocks[1].1, 3);
    assert_eq!(blocks[2].0, 300);
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker key that an engine flag also sets, and lists that do not fit the workers, are
/// refused with exit code 2 naming the flag.
#[test]
fn worker_engine_args_refusals_exit_2_naming_the_flag() {
    for (extra, says) in [
        (
            vec![
                "--num-workers",
                "2",
                "--num-gpu-blocks",
                "64",
                "--worker-engine-args",
                r#"[{}, {"num_gpu_blocks": 8}]"#,
            ],
            "--num-gpu-blocks",
        ),
        (vec!["--num-workers", "2", "--worker-engine-args", r#"[{}]"#], "1 entries"),
        (vec!["--num-workers", "2", "--worker-engine-args", r#"{"5": {}}"#], "worker index"),
        (vec!["--num-workers", "2", "--worker-engine-args", r#"{"1": {"dynamo": {}}}"#], "dynamo"),
        (vec!["--num-workers", "2", "--worker-engine-args", r#"{"1": {"backend": "nope"}}"#], "worker 1"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(&extra)
            .stdin(Stdio::null())
            .output()
            .expect("mocker runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains("--worker-engine-args") && stderr.contains(says), "{extra:?}: {stderr}");
    }
}
