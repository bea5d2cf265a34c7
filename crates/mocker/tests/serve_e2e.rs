//! End-to-end tests of `mocker serve`: the real binary on 127.0.0.1, real clients (Python
//! `openai`, httpx, prometheus_client; see tests/python/serve_client.py). The Python
//! interpreter comes from MOCKER_PYTHON (`.ci/run` sets it up), else `python3`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mocker_core::config::LaunchConfig;
use mocker_core::{Engine, EngineOptions, Request};

const KEY: &str = "test-key";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> String {
    let python = std::env::var("MOCKER_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let probe = Command::new(&python).args(["-c", "import openai, httpx, prometheus_client"]).output();
    match probe {
        Ok(o) if o.status.success() => python,
        _ => panic!(
            "{python} lacks openai/httpx/prometheus_client: run .ci/run, or pip install -r \
             tests/python/requirements.txt and set MOCKER_PYTHON"
        ),
    }
}

/// A running `mocker serve`, killed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        let tokenizer = repo_root().join("tests/fixtures/tokenizers/all-minilm-l6-v2");
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
            .arg("--tokenizer")
            .arg(&tokenizer)
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("mocker binary starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("serving model on ").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let base = rx.recv_timeout(Duration::from_secs(30)).expect("server announces its address");
        Self { child, base }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_client(args: &[&str]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(repo_root().join("tests/python/serve_client.py"))
        .args(args)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().expect("a result line")).expect("JSON result")
}

#[test]
fn openai_clients_get_exact_usage_errors_and_metrics() {
    let server = Server::start(&[
        "--block-size",
        "16",
        "--num-gpu-blocks",
        "24",
        "--max-model-len",
        "512",
        "--speedup-ratio",
        "20",
    ]);
    let result = run_client(&["suite", &server.base, KEY]);
    assert_eq!(result["ok"], true, "{result}");
}

/// Pass-end times (ms from submission) of one request on an idle engine, from the core.
fn modelled_arrivals_ms(prompt_len: usize, max_tokens: usize) -> Vec<f64> {
    let config = LaunchConfig::from_json_str("").unwrap().engine;
    let mut engine = Engine::new(EngineOptions { config, ..Default::default() }).unwrap();
    engine
        .submit(Request {
            uuid: 1,
            tokens: vec![11; prompt_len],
            max_output_tokens: max_tokens,
            ..Default::default()
        })
        .unwrap();
    let mut now = 0;
    let mut arrivals = Vec::new();
    while engine.has_work() {
        let pass = engine.step(now);
        now = pass.end_ns;
        arrivals.extend(pass.all_outputs().filter(|o| o.has_token()).map(|_| pass.end_ns as f64 / 1e6));
    }
    arrivals
}

#[test]
fn stream_arrivals_follow_the_modelled_pass_times() {
    let (prompt, tokens) = (2048, 12);
    let server = Server::start(&["--speedup-ratio", "1"]);
    let result = run_client(&["timing", &server.base, KEY, &prompt.to_string(), &tokens.to_string()]);
    let observed: Vec<f64> =
        result["arrivals_s"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() * 1e3).collect();
    let modelled = modelled_arrivals_ms(prompt, tokens);
    assert_eq!(observed.len(), modelled.len());
    // Tokens are never early (the engine sleeps each modelled pass), and at a loose bound
    // never much late: the tight bound is the serve-timing benchmark's job.
    for (i, (o, m)) in observed.iter().zip(&modelled).enumerate() {
        assert!(*o >= m - 1.0, "token {i} arrived at {o:.2} ms, before its modelled {m:.2} ms");
        assert!(*o <= m * 1.5 + 100.0, "token {i} arrived at {o:.2} ms, modelled {m:.2} ms");
    }
}

/// The lines a child prints, as they come.
fn lines_of(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

#[test]
fn sigterm_ends_open_streams_with_a_final_event_and_exits_zero() {
    let mut server = Server::start(&["--speedup-ratio", "1", "--shutdown-grace-seconds", "0.3"]);
    let mut client = Command::new(python())
        .arg(repo_root().join("tests/python/serve_client.py"))
        .args(["hold", &server.base, KEY])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(client.stdout.take().unwrap());
    assert_eq!(lines.recv_timeout(Duration::from_secs(30)).unwrap(), "STARTED");
    let status = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "server still running 10 s after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "exit status {exit}");
    let result: serde_json::Value =
        serde_json::from_str(&lines.recv_timeout(Duration::from_secs(10)).unwrap()).unwrap();
    assert!(client.wait().unwrap().success());
    assert_eq!(result["done"], true, "{result}");
    assert_eq!(result["ended_with_error"], true, "{result}");
}

#[test]
fn bad_flags_exit_2_naming_the_field() {
    for (args, needle) in [
        (&["--num-gpu-blocks", "0"][..], "num_gpu_blocks"),
        (&["--tokenizer", "/nonexistent/tokenizer.json"][..], "--tokenizer"),
        (&["--engine-args", "{\"block_size\": \"x\"}"][..], "block_size"),
        (&["--num-workers", "0"][..], "--num-workers"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--port", "0"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
