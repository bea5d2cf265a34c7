//! Shared harness of the `mocker serve` end-to-end tests: start the real binary on
//! 127.0.0.1, find the Python interpreter with the client libraries, run a client script.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const KEY: &str = "test-key";

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn python() -> String {
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
pub struct Server {
    pub child: Child,
    pub base: String,
    /// Lines the server printed to stderr after its address.
    pub stderr: mpsc::Receiver<String>,
    /// Lines it printed before its address (what the engine is).
    pub start_lines: Vec<String>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Self {
        let tokenizer = repo_root().join("tests/fixtures/tokenizers/all-minilm-l6-v2");
        Self::start_with_tokenizer(Some(&tokenizer), extra)
    }

    /// As [`Server::start`], with `tokenizer` (a folder or `tokenizer.json`) instead of the
    /// small WordPiece fixture, or with none: mocker's built-in word tokenizer.
    pub fn start_with_tokenizer(tokenizer: Option<&std::path::Path>, extra: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mocker"));
        command.args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--model-name",
            "mocker-test",
            "--api-key",
            KEY,
        ]);
        if let Some(tokenizer) = tokenizer {
            command.arg("--tokenizer").arg(tokenizer);
        }
        let mut child = command
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("mocker binary starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut start_lines = Vec::new();
        let base = loop {
            let line = rx.recv_timeout(Duration::from_secs(30)).expect("server announces its address");
            if let Some(url) = line.split("serving model on ").nth(1) {
                break url.trim().to_string();
            }
            start_lines.push(line);
        };
        Self { child, base, stderr: rx, start_lines }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn run_client(args: &[&str]) -> serde_json::Value {
    run_script("serve_client.py", args)
}

/// Runs tests/python/`script` with `args`; its last stdout line is the JSON result.
pub fn run_script(script: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(repo_root().join("tests/python").join(script))
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

/// The lines a child prints, as they come.
pub fn lines_of(stdout: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// One HTTP/1.1 exchange on a fresh connection to `base` (`http://host:port`), closed
/// after the answer: the status and the body (chunked bodies are returned raw).
pub fn http(base: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    (status, body.to_string())
}

/// The JSON body of a 200 from [`http`].
pub fn http_json(base: &str, path: &str, body: &str) -> serde_json::Value {
    let (status, text) = http(base, "POST", path, &[], body);
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}
