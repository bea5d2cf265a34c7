//! `mocker serve` against hostile or broken clients (issue 25, items 7-12): the real binary
//! on 127.0.0.1, raw TCP clients that stall, never read, or send malformed HTTP. Every wait
//! is bounded; each test takes a few seconds.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{Server, KEY};

/// `host:port` of a server's base URL.
fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_string()
}

fn connect(server: &Server) -> TcpStream {
    let s = TcpStream::connect(addr(server)).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// One parsed response.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts an OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`.
    fn assert_openai_error(&self, status: u16) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header("content-type"), Some("application/json"), "{self:?}");
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
        assert!(e.get("param").is_some(), "{v}");
        assert_eq!(e["code"], status, "{v}");
    }
}

/// Reads one response (head, then a content-length body or everything up to the close).
fn read_response(stream: &mut TcpStream) -> Response {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = stream.read(&mut chunk).expect("reads a response");
        assert!(n > 0, "connection closed before a response head: {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let len = headers.iter().find(|(n, _)| n == "content-length").map(|(_, v)| v.parse::<usize>().unwrap());
    loop {
        if len.is_some_and(|l| body.len() >= l) {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    if let Some(l) = len {
        body.truncate(l);
    }
    Response { status, headers, body }
}

/// Sends `raw` on a fresh connection and reads the answer.
fn exchange(server: &Server, raw: &[u8]) -> Response {
    let mut s = connect(server);
    s.write_all(raw).expect("sends");
    read_response(&mut s)
}

fn get(server: &Server, path: &str, auth: Option<&str>) -> Response {
    let auth = auth.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    exchange(server, format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes())
}

fn post(server: &Server, path: &str, auth: Option<&str>, body: &str) -> Response {
    let auth = auth.map(|k| format!("Authorization: Bearer {k}\r\n")).unwrap_or_default();
    exchange(
        server,
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

/// Starts a streamed completion on a connection that is then never read.
fn stuck_stream(server: &Server, max_tokens: usize) -> TcpStream {
    let mut s = connect(server);
    let body = format!(r#"{{"prompt": [1, 2, 3, 4], "max_tokens": {max_tokens}, "stream": true}}"#);
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// Scrapes `/metrics`: sum of every series of `name` (all engines).
fn metric(server: &Server, name: &str) -> Option<f64> {
    let r = get(server, "/metrics", None);
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    let values: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn signal(server: &Server, name: &str) {
    let ok = Command::new("kill").args([&format!("-{name}"), &server.pid().to_string()]).status().unwrap();
    assert!(ok.success());
}

/// Waits for the process to exit, at most `limit`; `None` if it is still running.
fn wait_exit(server: &mut Server, limit: Duration) -> Option<(ExitStatus, Duration)> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(s) = server.child.try_wait().unwrap() {
            return Some((s, start.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Waits until the server's stderr shows a line containing `needle`.
fn wait_stderr(server: &Server, needle: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match server.stderr.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// A valid completion still succeeds.
fn assert_serves(server: &Server) {
    let r = post(server, "/v1/completions", Some(KEY), r#"{"prompt": [5, 6, 7], "max_tokens": 4}"#);
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["usage"]["completion_tokens"], 4);
}

// Item 7: one never-reading stream, one half-sent head, one half-sent body: SIGTERM still
// ends the process within the grace period plus one second, in order (exit 0, no watchdog).
#[test]
fn sigterm_with_stuck_clients_exits_within_the_grace_period() {
    let mut server = Server::start(&[
        "--speedup-ratio",
        "1000000",
        "--block-size",
        "64",
        "--num-gpu-blocks",
        "20000",
        "--shutdown-grace-seconds",
        "2",
        // The stuck stream's million tokens need a context past the default 32768.
        "--max-model-len",
        "1100000",
    ]);
    let _stream = stuck_stream(&server, 1_000_000);
    let mut head = connect(&server);
    head.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le").unwrap();
    let mut body = connect(&server);
    body.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n{{\"prompt\""
        )
        .as_bytes(),
    )
    .unwrap();
    // Let the stream fill the socket buffers and the other two reach their handlers.
    std::thread::sleep(Duration::from_millis(500));
    signal(&server, "TERM");
    let (status, took) = wait_exit(&mut server, Duration::from_secs(10)).expect("exits after SIGTERM");
    assert!(took < Duration::from_secs(3), "took {took:?} with a 2 s grace period");
    assert!(status.success(), "{status}");
    let rest: Vec<String> = server.stderr.try_iter().collect();
    assert!(!rest.iter().any(|l| l.contains("error")), "{rest:?}");
}

// Item 7: a second SIGTERM ends the process at once, whatever the grace period.
#[test]
fn a_second_signal_exits_at_once() {
    let mut server = Server::start(&[
        "--speedup-ratio",
        "1",
        "--shutdown-grace-seconds",
        "60",
        "--max-model-len",
        "200000",
    ]);
    let _stream = stuck_stream(&server, 100_000);
    std::thread::sleep(Duration::from_millis(200));
    signal(&server, "TERM");
    assert!(wait_stderr(&server, "shutting down", Duration::from_secs(5)), "first signal handled");
    assert!(wait_exit(&mut server, Duration::from_millis(300)).is_none(), "graceful: still running");
    signal(&server, "TERM");
    let (status, took) =
        wait_exit(&mut server, Duration::from_secs(5)).expect("exits after a second SIGTERM");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert_eq!(status.code(), Some(128 + 15), "{status}");
}

// Item 8: ten streams of a million tokens that are never read: the server sheds them once
// their buffers are full, counts them, frees their KV, keeps its memory small and serves on.
#[test]
fn never_reading_clients_are_shed_with_bounded_memory() {
    let server = Server::start(&[
        "--speedup-ratio",
        "1000000",
        "--block-size",
        "64",
        "--num-gpu-blocks",
        "20000",
        "--max-model-len",
        "1100000",
    ]);
    let pid = server.pid();
    let before = rss_kb(pid);
    let streams: Vec<TcpStream> = (0..10).map(|_| stuck_stream(&server, 1_000_000)).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = before;
    let (mut shed, mut running, mut kv) = (None, None, None);
    while Instant::now() < deadline {
        peak = peak.max(rss_kb(pid));
        assert!(peak < 200 * 1024, "RSS {peak} kB (started at {before} kB)");
        // Ten full stream buffers are under 10 MB; unbounded buffering grows past this
        // within seconds (even in a debug build).
        assert!(peak < before + 64 * 1024, "RSS grew from {before} kB to {peak} kB");
        shed = metric(&server, "mocker:stream_overflow_cancellations_total");
        running = metric(&server, "vllm:num_requests_running");
        kv = metric(&server, "vllm:kv_cache_usage_perc");
        if shed == Some(10.0) && running == Some(0.0) && kv == Some(0.0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = rss_kb(pid);
    eprintln!("RSS before {before} kB, peak {peak} kB, after {after} kB; shed {shed:?}");
    assert_eq!(shed, Some(10.0), "all ten never-reading streams are cancelled and counted");
    assert_eq!((running, kv), (Some(0.0), Some(0.0)), "their requests are gone and their KV freed");
    assert_serves(&server);
    drop(streams);
}

/// The open-file limit of this process.
fn fd_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(1024)
}

// Item 9: 500 connections that send half a head are closed within the header timeout, and
// normal requests succeed meanwhile.
#[test]
fn slowloris_heads_are_closed_within_the_header_timeout() {
    let server = Server::start(&["--header-timeout-seconds", "1"]);
    // Both ends of each connection count against limits; stay well within them.
    let count = 500.min(fd_limit().saturating_sub(200) / 2);
    let opened = Instant::now();
    let mut slow: Vec<TcpStream> = (0..count)
        .map(|_| {
            let mut s = connect(&server);
            s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
            s
        })
        .collect();
    for _ in 0..5 {
        assert_serves(&server);
    }
    let mut closed = 0;
    for s in &mut slow {
        let left = (opened + Duration::from_secs(4)).saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            _ => {}
        }
    }
    let took = opened.elapsed();
    eprintln!("{count} slowloris connections: {closed} closed by the server in {took:?}");
    assert_eq!(closed, count, "every half-sent head is dropped");
    assert_serves(&server);
}

// Item 9: a body that never completes is answered 408 (JSON) after the body timeout.
#[test]
fn slow_bodies_get_a_408_after_the_body_timeout() {
    let server = Server::start(&["--body-timeout-seconds", "1"]);
    let count = 100;
    let start = Instant::now();
    let mut slow: Vec<TcpStream> = (0..count)
        .map(|_| {
            let mut s = connect(&server);
            s.write_all(
                format!(
                    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n{{"
                )
                .as_bytes(),
            )
            .unwrap();
            s
        })
        .collect();
    assert_serves(&server);
    for s in &mut slow {
        read_response(s).assert_openai_error(408);
    }
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
}

// Item 9: past --max-connections a new connection gets a 503 JSON answer.
#[test]
fn connections_past_the_limit_get_a_503() {
    let server = Server::start(&["--max-connections", "8", "--header-timeout-seconds", "30"]);
    let idle: Vec<TcpStream> = (0..8).map(|_| connect(&server)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let r = get(&server, "/health", None);
    r.assert_openai_error(503);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("--max-connections"));
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = get(&server, "/health", None);
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "slots are freed when connections close");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Items 10 and 11: the state-changing route needs the key; the key is compared exactly.
#[test]
fn api_key_protects_v1_and_state_changing_routes() {
    let server = Server::start(&[]);
    for key in [None, Some("wrong"), Some("test-ke"), Some("test-key-")] {
        post(&server, "/reset_prefix_cache", key, "").assert_openai_error(401);
        get(&server, "/v1/models", key).assert_openai_error(401);
        get(&server, "/v1/nope", key).assert_openai_error(401);
    }
    assert_eq!(post(&server, "/reset_prefix_cache", Some(KEY), "").status, 200);
    assert_eq!(get(&server, "/v1/models", Some(KEY)).status, 200);
    // Open, as in vLLM: health, version, metrics, tokenizer routes.
    for path in ["/health", "/version", "/metrics"] {
        assert_eq!(get(&server, path, None).status, 200, "{path}");
    }
    assert_eq!(post(&server, "/tokenize", None, r#"{"prompt": "hello"}"#).status, 200);
    assert_eq!(post(&server, "/detokenize", None, r#"{"tokens": [100]}"#).status, 200);
}

/// A refusal (here the 401 for a missing key) keeps the connection when the body arrives
/// after the head, as clients send them in separate writes: the server reads the body, then
/// answers, and the next request on that connection is served. Before, the answer went out
/// at once and hyper closed the connection with the body unread, so a client reusing it saw
/// "server disconnected".
#[test]
fn a_refused_request_with_a_late_body_keeps_its_connection() {
    let server = Server::start(&[]);
    let mut s = connect(&server);
    let body = r#"{"model": "m", "prompt": "hello", "max_tokens": 1}"#;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.write_all(body.as_bytes()).unwrap();
    read_response(&mut s).assert_openai_error(401);
    s.write_all(
        format!("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(read_response(&mut s).status, 200, "the connection still serves");
}

#[test]
fn an_empty_api_key_is_refused_at_start() {
    for (args, env) in [(&["--api-key", ""][..], None), (&[][..], Some(""))] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mocker"));
        cmd.args(["serve", "--port", "0"]).args(args);
        if let Some(v) = env {
            cmd.env("MOCKER_API_KEY", v);
        }
        let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mocker serve started with an empty key ({args:?}, env {env:?})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("--api-key"), "{stderr}");
    }
}

// Item 12: what hyper and the router answer by themselves is OpenAI-style JSON too.
#[test]
fn malformed_http_gets_openai_style_json_errors() {
    let server = Server::start(&[]);
    exchange(&server, b"GARBAGE\r\n\r\n").assert_openai_error(400);
    exchange(&server, b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n").assert_openai_error(400);
    let huge = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(600_000));
    exchange(&server, huge.as_bytes()).assert_openai_error(431);
    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    exchange(&server, format!("GET /health HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes())
        .assert_openai_error(431);
    let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "a".repeat(70_000));
    exchange(&server, long.as_bytes()).assert_openai_error(414);
    get(&server, "/v1/completions", Some(KEY)).assert_openai_error(405);
    post(&server, "/health", None, "").assert_openai_error(405);
    get(&server, "/no/such/route", None).assert_openai_error(404);
    // The server still answers normally afterwards.
    assert_serves(&server);
}

// Issue 45 item 6: the P/D front guards its port as the workers do: a half-sent head is
// closed within the header timeout, a half-sent body is answered 408 within the body
// timeout, and past its connection limit (half the process's) a connection gets a 503.
#[test]
fn the_pd_front_has_the_workers_connection_protections() {
    let server = Server::start(&[
        "--prefill-workers",
        "1",
        "--decode-workers",
        "1",
        "--header-timeout-seconds",
        "1",
        "--body-timeout-seconds",
        "1",
        "--max-connections",
        "8",
    ]);
    // The front passes the decode worker's body through, chunked.
    let serves = || {
        let r = post(&server, "/v1/completions", Some(KEY), r#"{"prompt": [5, 6, 7], "max_tokens": 4}"#);
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert!(r.status == 200 && text.contains("\"completion_tokens\":4"), "{} {text}", r.status);
    };
    serves();
    let started = Instant::now();
    let mut head = connect(&server);
    head.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le").unwrap();
    let mut body = connect(&server);
    body.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n{{\"prompt\""
        )
        .as_bytes(),
    )
    .unwrap();
    let mut answer = String::new();
    let _ = body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "half a body: {answer}");
    let mut rest = Vec::new();
    let closed = head.read_to_end(&mut rest).is_ok();
    assert!(
        closed && started.elapsed() < Duration::from_secs(5),
        "half a head closed after {:?}",
        started.elapsed()
    );
    // The front holds 4 (8 / 2); the fifth is refused at once.
    let idle: Vec<TcpStream> = (0..4).map(|_| connect(&server)).collect();
    // On a loaded machine the front may not have taken all four yet: a probe it accepts is
    // dropped and another tried, until one is refused (never, with a larger limit).
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        let mut fifth = connect(&server);
        fifth.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut answer = String::new();
        let _ = fifth.read_to_string(&mut answer);
        if !answer.is_empty() || Instant::now() > deadline {
            break answer;
        }
        // Let the dropped probe's slot free, so it is not what refuses the next one.
        drop(fifth);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(refused.starts_with("HTTP/1.1 503"), "past the limit: {refused}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(100));
    serves();
}

/// Issue 45 items 2, 8 and 11: requests whose response or whose per-token work would be
/// unbounded are refused by name; a response the server reads whole is never shed.
#[test]
fn output_size_stop_strings_and_embedding_batches_are_bounded() {
    let server = Server::start(&["--speedup-ratio", "1000000", "--max-logprobs", "5"]);
    let refused = |path: &str, body: String, param: &str, words: &str| {
        let r = post(&server, path, Some(KEY), &body);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
        let e = r.json();
        assert_eq!(e["error"]["param"], param, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(words), "{e}");
    };
    let chat = |extra: &str| {
        format!(r#"{{"model": "mocker-test", "messages": [{{"role": "user", "content": "hi"}}], {extra}}}"#)
    };
    refused(
        "/v1/chat/completions",
        chat(r#""logprobs": true, "top_logprobs": 6"#),
        "top_logprobs",
        "max allowed: 5",
    );
    refused(
        "/v1/completions",
        r#"{"model": "mocker-test", "prompt": "hi", "logprobs": 6}"#.into(),
        "logprobs",
        "max allowed: 5",
    );
    refused(
        "/v1/chat/completions",
        chat(r#""n": 128, "max_tokens": 6000, "logprobs": true, "top_logprobs": 5"#),
        "top_logprobs",
        "log-probability entries",
    );
    let many: Vec<String> = (0..1025).map(|i| format!("\"s{i}\"")).collect();
    refused(
        "/v1/chat/completions",
        chat(&format!(r#""stop": [{}]"#, many.join(","))),
        "stop",
        "at most 1024",
    );
    refused(
        "/v1/chat/completions",
        chat(&format!(r#""stop": "{}""#, "x".repeat(4097))),
        "stop",
        "4096 bytes",
    );
    let wide: Vec<String> = (0..17).map(|i| format!("\"{}{i}\"", "y".repeat(4000))).collect();
    refused("/v1/chat/completions", chat(&format!(r#""stop": [{}]"#, wide.join(","))), "stop", "together");
    let inputs: Vec<String> = (0..2049).map(|i| format!("\"text {i}\"")).collect();
    refused(
        "/v1/embeddings",
        format!(r#"{{"model": "mocker-test", "input": [{}]}}"#, inputs.join(",")),
        "input",
        "at most 2048",
    );
    // Within the bounds: a thousand stop strings scan linearly and the request completes.
    let ok: Vec<String> = (0..1000).map(|i| format!("\"never-said-{i}\"")).collect();
    let r = post(
        &server,
        "/v1/chat/completions",
        Some(KEY),
        &chat(&format!(r#""max_tokens": 300, "stop": [{}]"#, ok.join(","))),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["usage"]["completion_tokens"], 300);
}

#[test]
fn a_non_streamed_response_is_never_shed_as_a_slow_reader() {
    // A one-token stream buffer and a near-instant engine: the server, building five
    // alternatives a token, reads slower than tokens come. Streamed, that would shed.
    let server = Server::start(&["--speedup-ratio", "1000000", "--stream-buffer-tokens", "1"]);
    for _ in 0..3 {
        let body = r#"{"model": "mocker-test", "prompt": "hi", "max_tokens": 3000, "logprobs": 5, "ignore_eos": true}"#;
        let r = post(&server, "/v1/completions", Some(KEY), body);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body[..r.body.len().min(400)]));
        assert_eq!(r.json()["usage"]["completion_tokens"], 3000);
    }
}
