//! End-to-end tests of `mocker serve`: the real binary on 127.0.0.1, real clients (Python
//! `openai`, httpx, prometheus_client; see tests/python/serve_client.py). The Python
//! interpreter comes from MOCKER_PYTHON (`.ci/run` sets it up), else `python3`.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, lines_of, python, repo_root, run_client, run_script, Server, KEY};

use mocker_core::config::LaunchConfig;
use mocker_core::{Engine, EngineOptions, Request};

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

/// /metrics parsed by prometheus_client's text parser: vLLM's family set, counters typed
/// with their `_total` samples, complete histograms, `model_name` and `engine` on every
/// series of both DP ranks, values fed by the requests; plus /ping, /health/ready,
/// /v1/models' max_model_len and X-Request-Id (tests/python/serve_metrics.py).
#[test]
fn metrics_are_vllms_exposition_and_request_ids_carry_through() {
    let server = Server::start(&[
        "--block-size",
        "16",
        "--num-gpu-blocks",
        "64",
        "--max-model-len",
        "512",
        "--data-parallel-size",
        "2",
        "--speedup-ratio",
        "20",
    ]);
    let result = run_script("serve_metrics.py", &[&server.base, KEY]);
    assert_eq!(result["ok"], true, "{result}");
}

/// Request fields through the openai SDK (tests/python/serve_fields.py): text that the
/// client's own `tokenizers` re-encodes to exactly the reported ids, seed, stop strings and
/// token ids (the stopped request's KV freed, the stop counted), min_tokens, echo, chat's
/// default output length, logprobs in both shapes, n > 1 sharing the prompt's KV, JSON and
/// JSON-schema output, tool calls, images counted by --image-tokens, and a 400 naming each
/// field mocker does not simulate.
#[test]
fn request_fields_behave_as_in_vllm_or_are_refused_by_name() {
    let server =
        Server::start(&["--max-model-len", "512", "--speedup-ratio", "200", "--image-tokens", "100"]);
    let tokenizer = repo_root().join("tests/fixtures/tokenizers/all-minilm-l6-v2/tokenizer.json");
    let result =
        run_script("serve_fields.py", &[&server.base, KEY, tokenizer.to_str().unwrap(), "512", "100"]);
    assert_eq!(result["ok"], true, "{result}");
}

/// /v1/embeddings and /v1/responses through the openai SDK and vLLM's sleep mode through
/// httpx (tests/python/serve_endpoints.py): unit-norm deterministic vectors of
/// --embedding-dim with exact prompt_tokens (text, token ids, base64 = float, `dimensions`),
/// Responses bodies and numbered stream events whose usage matches the chat path, 400s
/// naming unsupported fields; a sleep aborts an in-flight stream, answers inference 503,
/// publishes one AllBlocksCleared, drops the prefix cache (no cached tokens after waking),
/// and a partial wake-up leaves the engine asleep. Without --enable-sleep-mode the routes
/// are 404.
#[test]
fn embeddings_responses_and_sleep_mode_behave_as_in_vllm() {
    let server = Server::start(&[
        "--max-model-len",
        "512",
        "--block-size",
        "16",
        "--embedding-dim",
        "64",
        "--enable-sleep-mode",
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let line = loop {
        let line = server.stderr.recv_timeout(Duration::from_secs(10)).expect("publisher announced");
        if line.contains("publishing KV events on") {
            break line;
        }
    };
    let endpoint = line.split("events on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let result = run_script("serve_endpoints.py", &[&server.base, KEY, &endpoint]);
    assert_eq!(result["ok"], true, "{result}");

    let plain = Server::start(&[]);
    for (method, path) in [("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")] {
        let (status, body) = http(&plain.base, method, path, &[], "");
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("--enable-sleep-mode"), "{body}");
    }
}

/// LoRA as vLLM serves it (tests/python/serve_lora.py): adapters from --lora-modules in both
/// of vLLM's forms listed by /v1/models, loaded and unloaded at run time with vLLM's answers,
/// picked by `model`; no prefix sharing across adapters or with the base model; with
/// --max-loras 1 a second adapter's requests wait until the first's finish, as
/// `vllm:lora_requests_info` shows; BlockStored events carry each adapter's id and name.
/// Without --enable-lora the adapter routes are 404 and the LoRA flags are refused.
#[test]
fn lora_adapters_are_loaded_picked_batched_and_published_as_in_vllm() {
    let server = Server::start(&[
        "--block-size",
        "16",
        "--max-model-len",
        "1024",
        "--enable-lora",
        "--max-loras",
        "1",
        "--lora-modules",
        "sql=/adapters/sql",
        r#"{"name": "chat", "path": "/adapters/chat"}"#,
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let line = loop {
        let line = server.stderr.recv_timeout(Duration::from_secs(10)).expect("publisher announced");
        if line.contains("publishing KV events on") {
            break line;
        }
    };
    let endpoint = line.split("events on ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let result = run_script("serve_lora.py", &[&server.base, KEY, &endpoint]);
    assert_eq!(result["ok"], true, "{result}");

    let plain = Server::start(&[]);
    for path in ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"] {
        let (status, body) = http(&plain.base, "POST", path, &[], r#"{"lora_name": "a", "lora_path": "/a"}"#);
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("--enable-lora"), "{body}");
    }
    for (args, named) in [
        (&["--lora-modules", "a=/a"][..], "--lora-modules: needs --enable-lora"),
        (&["--max-loras", "2"][..], "--max-loras: needs --enable-lora"),
        (&["--enable-lora", "--max-loras", "0"][..], "--max-loras: must be at least 1"),
        (&["--enable-lora", "--max-cpu-loras", "4"][..], "--max-cpu-loras"),
        (&["--enable-lora", "--lora-modules", "a"][..], "--lora-modules: expected name=path"),
        (&["--enable-lora", "--lora-modules", "a=/x", "a=/y"][..], "already been loaded"),
        (&["--enable-lora", "--engine-args", r#"{"backend": "sglang"}"#][..], "not sglang"),
    ] {
        assert_serve_refuses(args, named);
    }
}

/// Disaggregated prefill/decode between two server processes with vLLM's NIXL contract,
/// driven with the request flow of vLLM's P/D test proxy (tests/python/serve_pd.py): the
/// prefill answer's kv_transfer_params, the prefill server holding the prompt's blocks until
/// the decode server reads them (its KV usage back to 0 after), the decode TTFT including
/// the prefill side's modelled transfer, the whole prompt counted as cached, the recompute
/// fallback when the KV cannot be read, the abort timeout, a client leaving mid-transfer
/// (both sides' blocks freed), BlockRemoved once the freed prefill blocks are evicted, and
/// 400s for malformed params.
/// Without --kv-transfer-config kv_transfer_params are refused by name.
#[test]
fn disaggregated_prefill_and_decode_servers_hand_off_kv_as_vllm_nixl_does() {
    let config = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_both"}"#;
    let prefill = Server::start(&[
        "--block-size",
        "16",
        "--kv-transfer-config",
        config,
        "--kv-abort-timeout-seconds",
        "2",
        "--num-gpu-blocks",
        "40",
        "--engine-args",
        r#"{"kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 0.05}"#,
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let decode = Server::start(&[
        "--block-size",
        "16",
        "--kv-transfer-config",
        config,
        "--kv-events-endpoint",
        "tcp://127.0.0.1:0",
    ]);
    let events = |server: &Server| loop {
        let line = server.stderr.recv_timeout(Duration::from_secs(10)).expect("publisher announced");
        if let Some(rest) = line.split("events on ").nth(1) {
            break rest.split(' ').next().unwrap().to_string();
        }
    };
    let (prefill_events, decode_events) = (events(&prefill), events(&decode));
    let modelled = format!("{:.3}", modelled_pd_ttft_ms(160, 24));
    let result = run_script(
        "serve_pd.py",
        &[&prefill.base, &decode.base, KEY, &modelled, &prefill_events, &decode_events],
    );
    eprintln!("P/D pair: {result}");
    assert_eq!(result["ok"], true, "{result}");

    let plain = Server::start(&[]);
    let body = r#"{"prompt": "x", "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": true}}"#;
    let (status, text) = http(&plain.base, "POST", "/v1/completions", &[], body);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("--kv-transfer-config"), "{text}");
    for (args, named) in [
        (&["--kv-transfer-config", r#"{"kv_connector": "LMCacheConnectorV1"}"#][..], "not supported"),
        (&["--kv-transfer-config", r#"{"kv_connector": "NixlConnector", "kv_role": "x"}"#][..], "kv_role"),
        (&["--kv-abort-timeout-seconds", "5"][..], "needs --kv-transfer-config"),
    ] {
        assert_serve_refuses(args, named);
    }
}

/// `--prefill-workers 1 --decode-workers 2`: a plain openai client talks to the front, which
/// runs every request as a prefill then a decode (tests/python/serve_pd_front.py): exact
/// token counts for concurrent streamed chats, the prompt counted as cached on the decode
/// side, worker errors passed through, the front's handoff counter and transfer histogram,
/// round-robin over the decode workers, every worker idle with its KV freed at the end.
#[test]
fn a_prefill_decode_deployment_serves_plain_clients_through_its_front() {
    let tokenizer = repo_root().join("tests/fixtures/tokenizers/all-minilm-l6-v2");
    let deployment = Deployment::start(&[
        "--model-name",
        "mocker-test",
        "--api-key",
        KEY,
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--prefill-workers",
        "1",
        "--decode-workers",
        "2",
        "--block-size",
        "16",
        "--speedup-ratio",
        "5",
    ]);
    let (front, prefill, decode) = (&deployment.front, &deployment.prefill, &deployment.decode);
    assert_eq!((prefill.len(), decode.len()), (1, 2));
    let mut args = vec![front.as_str(), KEY, prefill[0].as_str()];
    args.extend(decode.iter().map(String::as_str));
    let result = run_script("serve_pd_front.py", &args);
    drop(deployment);
    assert_eq!(result["ok"], true, "{result}");

    for (args, named) in [
        (&["--prefill-workers", "0", "--decode-workers", "1"][..], "1..=1024 workers"),
        (&["--prefill-workers", "1"][..], "--decode-workers"),
        (&["--prefill-workers", "1", "--decode-workers", "1", "--num-workers", "2"][..], "--num-workers"),
        (
            &["--prefill-workers", "1", "--decode-workers", "1", "--engine-args", r#"{"backend": "sglang"}"#]
                [..],
            "vllm",
        ),
    ] {
        assert_serve_refuses(args, named);
    }
}

/// A `mocker serve --prefill-workers P --decode-workers D` process and the URLs it lists.
struct Deployment {
    child: std::process::Child,
    front: String,
    prefill: Vec<String>,
    decode: Vec<String>,
}

impl Deployment {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("mocker starts");
        let lines = lines_of_stderr(child.stderr.take().unwrap());
        let (mut prefill, mut decode) = (Vec::new(), Vec::new());
        let front = loop {
            let line = lines.recv_timeout(Duration::from_secs(30)).expect("start-up lines");
            let url = || line.rsplit(' ').next().unwrap().to_string();
            if line.starts_with("mocker: prefill worker") {
                prefill.push(url());
            } else if line.starts_with("mocker: decode worker") {
                decode.push(url());
            } else if line.contains("serving model on") {
                break url();
            }
        };
        Self { child, front, prefill, decode }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A counter's value summed over its series in a Prometheus text exposition.
fn counter(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `--pd-router kv`: the front sends a prompt to the prefill worker that has its prefix
/// cached (learned from the workers' KV events), so each of two prompts, sent four times
/// in turn, is computed once and then found whole in one worker's cache; round-robin
/// would have split each prompt's requests over both workers and computed it twice.
#[test]
fn the_kv_pd_router_sends_a_prompt_where_its_prefix_is_cached() {
    let deployment = Deployment::start(&[
        "--prefill-workers",
        "2",
        "--decode-workers",
        "2",
        "--pd-router",
        "kv",
        "--block-size",
        "16",
        "--speedup-ratio",
        "10",
    ]);
    // 65 tokens: four full blocks the cache can give back whole.
    let prompt = |base: u32| (base..base + 65).map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
    for base in [1000, 2000] {
        for _ in 0..4 {
            let body = format!(r#"{{"prompt": [{}], "max_tokens": 2}}"#, prompt(base));
            let (status, answer) = http(&deployment.front, "POST", "/v1/completions", &[], &body);
            assert_eq!(status, 200, "{answer}");
        }
    }
    let metrics: Vec<String> =
        deployment.prefill.iter().map(|w| http(w, "GET", "/metrics", &[], "").1).collect();
    let hits: f64 = metrics.iter().map(|m| counter(m, "vllm:prefix_cache_hits_total")).sum();
    let requests: Vec<f64> = metrics.iter().map(|m| counter(m, "vllm:request_success_total")).collect();
    assert_eq!(hits, 6.0 * 64.0, "three of each prompt's four prefills find its 64 tokens cached");
    assert_eq!(requests.iter().sum::<f64>(), 8.0, "{requests:?}");
    assert!(requests.iter().all(|&n| n == 0.0 || n == 4.0 || n == 8.0), "each prompt stays on one worker");

    let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args([
            "serve",
            "--port",
            "0",
            "--prefill-workers",
            "1",
            "--decode-workers",
            "1",
            "--pd-router",
            "kv",
        ])
        .args(["--engine-args", r#"{"dp_size": 2}"#])
        .stdout(Stdio::null())
        .output()
        .expect("mocker runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--pd-router kv") && stderr.contains("dp_size"), "{stderr}");
}

/// The address a server printed as its SGLang bootstrap server.
fn bootstrap_port_of(server: &Server) -> u16 {
    loop {
        let line = server.stderr.recv_timeout(Duration::from_secs(30)).expect("a bootstrap line");
        if let Some(at) = line.strip_prefix("mocker: SGLang bootstrap server on ") {
            return at.rsplit(':').next().unwrap().trim().parse().unwrap();
        }
    }
}

/// SGLang's PD protocol: the router sends one request, with the prefill server's
/// bootstrap address and a room, to a prefill and a decode server at once. The decode
/// side may come first and waits in the room; the prefill computes one token, its KV is
/// read for the modelled transfer time, and the decode generates the rest with the prompt
/// counted as cached. Either side that waits in vain past the session timeout gives up:
/// the prefill frees its KV (504), the decode computes the prompt itself.
#[test]
fn sglang_prefill_and_decode_servers_meet_in_bootstrap_rooms() {
    // 65 tokens × 131072 B at 0.05 GB/s: 170.4 ms of transfer.
    let prefill = Server::start(&[
        "--block-size",
        "16",
        "--engine-args",
        r#"{"backend": "sglang", "worker_type": "prefill", "bootstrap_port": 0, "handoff_session_timeout_ms": 1500,
            "kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 0.05}"#,
    ]);
    let port = bootstrap_port_of(&prefill);
    let decode = Server::start(&[
        "--block-size",
        "16",
        "--engine-args",
        r#"{"backend": "sglang", "worker_type": "decode", "handoff_session_timeout_ms": 700}"#,
    ]);
    let prompt = (100..165).map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
    let body = |room: u64, port: u16| {
        format!(
            r#"{{"prompt": [{prompt}], "max_tokens": 5, "bootstrap_host": "127.0.0.1", "bootstrap_port": {port},
                "bootstrap_room": {room}}}"#
        )
    };
    let usage = |text: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        v["usage"].clone()
    };

    // Destination first: the decode request waits in room 7 until the prefill arrives.
    let started = Instant::now();
    let decode_base = decode.base.clone();
    let decode_body = body(7, port);
    let decoding = std::thread::spawn(move || {
        let answer = http(&decode_base, "POST", "/v1/completions", &[], &decode_body);
        (answer, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let (status, text) = http(&prefill.base, "POST", "/v1/completions", &[], &body(7, port));
    let prefill_done = started.elapsed();
    assert_eq!(status, 200, "{text}");
    assert_eq!(usage(&text)["completion_tokens"], 1, "the prefill server computes the first token only");
    let ((status, text), decode_done) = decoding.join().unwrap();
    assert_eq!(status, 200, "{text}");
    let u = usage(&text);
    assert_eq!(
        (u["completion_tokens"].as_u64(), u["prompt_tokens_details"]["cached_tokens"].as_u64()),
        (Some(5), Some(65)),
        "{u}"
    );
    // The prefill answers once its KV has been read: after the modelled transfer.
    assert!(prefill_done >= Duration::from_millis(300 + 170), "{prefill_done:?}");
    assert!(decode_done >= prefill_done, "{decode_done:?} {prefill_done:?}");

    // Source first, streamed: the prefill waits in room 11 until the decode reads it.
    let prefill_base = prefill.base.clone();
    let first = body(11, port).replace("[100,", "[98,");
    let then = first.replace(
        "\"max_tokens\": 5",
        "\"max_tokens\": 5, \"stream\": true, \"stream_options\": {\"include_usage\": true}",
    );
    let prefilling = std::thread::spawn(move || http(&prefill_base, "POST", "/v1/completions", &[], &first));
    std::thread::sleep(Duration::from_millis(300));
    let (status, stream) = http(&decode.base, "POST", "/v1/completions", &[], &then);
    assert_eq!(status, 200, "{stream}");
    assert!(stream.contains("\"completion_tokens\":5") && stream.contains("data: [DONE]"), "{stream}");
    assert!(stream.contains("\"cached_tokens\":65"), "{stream}");
    let (status, text) = prefilling.join().unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(usage(&text)["completion_tokens"], 1);

    // A prefill nobody reads frees its KV at the session timeout.
    let (status, text) = http(&prefill.base, "POST", "/v1/completions", &[], &body(8, port));
    assert_eq!(status, 504, "{text}");
    assert!(text.contains("bootstrap room 8"), "{text}");
    // A prefill whose client leaves while it waits in its room frees its KV at once.
    // (SGLang's usage counts the radix tree's cached pages too: the full pages stay cached,
    // the partial one goes, so usage drops below what the held request had.)
    let usage_of = |s: &Server| counter(&http(&s.base, "GET", "/metrics", &[], "").1, "sglang:token_usage");
    let before = usage_of(&prefill);
    let held = {
        use std::io::Write;
        let mut client = std::net::TcpStream::connect(prefill.base.trim_start_matches("http://")).unwrap();
        let b = body(12, port).replace("[100,", "[97,");
        write!(
            client,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let held = usage_of(&prefill);
            if held > before {
                break held;
            }
            assert!(Instant::now() < deadline, "the prefill holds its KV in room 12");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let left = Instant::now();
    while usage_of(&prefill) >= held {
        assert!(
            left.elapsed() < Duration::from_millis(1000),
            "freed when the client left, not at the timeout"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A decode whose prefill never comes computes the prompt itself, and says so, after its
    // own session timeout (700 ms), not the prefill server's (1500 ms).
    // (A prompt the decode server has not cached yet.)
    let fresh = body(9, port).replace("[100,", "[99,");
    let asked = Instant::now();
    let (status, text) = http(&decode.base, "POST", "/v1/completions", &[], &fresh);
    let waited = asked.elapsed();
    assert_eq!(status, 200, "{text}");
    assert!(waited >= Duration::from_millis(700) && waited < Duration::from_millis(1400), "{waited:?}");
    assert_eq!(usage(&text)["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0), 0, "{text}");
    let metrics = http(&decode.base, "GET", "/metrics", &[], "").1;
    assert_eq!(counter(&metrics, "mocker:kv_transfer_recomputes_total"), 1.0);

    // What either server refuses, naming the field.
    let plain = format!(r#"{{"prompt": [{prompt}], "max_tokens": 5}}"#);
    for (base, text, field) in [
        (&prefill.base, plain.clone(), "bootstrap_room"),
        (&decode.base, plain.clone(), "bootstrap_room"),
        (&prefill.base, body(10, port.wrapping_add(1).max(1)), "bootstrap_port"),
        (
            &prefill.base,
            plain.replace(
                "\"max_tokens\": 5",
                "\"max_tokens\": 5, \"kv_transfer_params\": {\"do_remote_decode\": true}",
            ),
            "kv_transfer_params",
        ),
    ] {
        let (status, answer) = http(base, "POST", "/v1/completions", &[], &text);
        assert_eq!(status, 400, "{answer}");
        let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["error"]["param"], field, "{answer}");
    }
    let aggregated = Server::start(&[]);
    let (status, answer) = http(&aggregated.base, "POST", "/v1/completions", &[], &body(1, port));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("bootstrap_room"), "{answer}");

    for (args, named) in [
        (r#"{"bootstrap_port": 7000}"#, "dynamo.bootstrap_port"),
        (
            r#"{"backend": "sglang", "worker_type": "decode", "bootstrap_port": 7000}"#,
            "dynamo.bootstrap_port",
        ),
        (r#"{"handoff_session_timeout_ms": 5000}"#, "dynamo.handoff_session_timeout_ms"),
        (
            r#"{"worker_type": "prefill", "handoff_session_timeout_ms": 5000}"#,
            "dynamo.handoff_session_timeout_ms",
        ),
        (r#"{"backend": "trtllm", "worker_type": "prefill"}"#, "trtllm"),
    ] {
        assert_serve_refuses(&["--engine-args", args], named);
    }
    assert_serve_refuses(
        &[
            "--engine-args",
            r#"{"backend": "sglang", "worker_type": "prefill"}"#,
            "--kv-transfer-config",
            r#"{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}"#,
        ],
        "--kv-transfer-config",
    );
}

/// `mocker serve --port 0 args` exits 2 naming `named` on stderr (within 30 s: a server
/// that starts instead is killed and the test fails, rather than hanging).
fn assert_serve_refuses(args: &[&str], named: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mocker"))
        .args(["serve", "--port", "0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mocker runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?}: mocker serve started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(named), "{args:?}: {stderr}");
}

/// Engine-args `worker_type` (or `is_prefill` / `is_decode`) makes a prefill-only or
/// decode-only server, as the reference's disaggregation modes: a request without the role's
/// kv_transfer_params is a 400 naming them, and a prefill and a decode server so made hand
/// a request over.
#[test]
fn worker_type_makes_prefill_only_and_decode_only_servers() {
    let prefill = Server::start(&["--block-size", "16", "--engine-args", r#"{"worker_type": "prefill"}"#]);
    let decode = Server::start(&["--block-size", "16", "--engine-args", r#"{"is_decode": true}"#]);
    let plain = r#"{"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "max_tokens": 3}"#;
    for (server, needed) in [(&prefill, "do_remote_decode"), (&decode, "do_remote_prefill")] {
        let (status, body) = http(&server.base, "POST", "/v1/completions", &[], plain);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains(needed) && body.contains("kv_transfer_params"), "{body}");
    }
    let first = plain.replace(
        "\"max_tokens\": 3",
        "\"max_tokens\": 1, \"kv_transfer_params\": {\"do_remote_decode\": true}",
    );
    let (status, body) = http(&prefill.base, "POST", "/v1/completions", &[], &first);
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let params = &answer["kv_transfer_params"];
    assert_eq!(params["do_remote_prefill"], true, "{answer}");
    let then =
        plain.replace("\"max_tokens\": 3", &format!("\"max_tokens\": 3, \"kv_transfer_params\": {params}"));
    let (status, body) = http(&decode.base, "POST", "/v1/completions", &[], &then);
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens_details"]["cached_tokens"], 17, "{answer}");
    let (status, body) = http(&decode.base, "POST", "/v1/completions", &[], &first);
    assert_eq!(status, 400, "a decode worker takes no prefill: {body}");

    for (args, named) in [
        (
            &[
                "--engine-args",
                r#"{"worker_type": "prefill"}"#,
                "--kv-transfer-config",
                r#"{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}"#,
            ][..],
            "conflicts",
        ),
        (&["--engine-args", r#"{"worker_type": "decode", "backend": "trtllm"}"#][..], "engine.worker_type"),
    ] {
        assert_serve_refuses(args, named);
    }
}

/// `--kv-transfer-config` roles as vLLM's NixlConnector has them: a request without
/// `kv_transfer_params` runs as on any server (the connector finds no `do_remote_prefill` to
/// load and no `do_remote_decode` to hold), while a `kv_producer` refuses the decode side's
/// params and a `kv_consumer` the prefill side's, each a 400 naming `kv_transfer_params`.
#[test]
fn kv_roles_serve_plain_requests_and_refuse_the_other_sides_params() {
    let config = |role: &str| format!(r#"{{"kv_connector": "NixlConnector", "kv_role": "{role}"}}"#);
    let producer = Server::start(&["--block-size", "16", "--kv-transfer-config", &config("kv_producer")]);
    let consumer = Server::start(&["--block-size", "16", "--kv-transfer-config", &config("kv_consumer")]);
    let plain = r#"{"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "max_tokens": 3}"#;
    for server in [&producer, &consumer] {
        let (status, body) = http(&server.base, "POST", "/v1/completions", &[], plain);
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
    }
    let prefill = plain.replace(
        "\"max_tokens\": 3",
        "\"max_tokens\": 1, \"kv_transfer_params\": {\"do_remote_decode\": true}",
    );
    let (status, body) = http(&consumer.base, "POST", "/v1/completions", &[], &prefill);
    assert_eq!(status, 400, "a kv_consumer takes no prefill: {body}");
    assert!(body.contains("kv_transfer_params.do_remote_decode"), "{body}");
    let (status, body) = http(&producer.base, "POST", "/v1/completions", &[], &prefill);
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let decode = plain.replace(
        "\"max_tokens\": 3",
        &format!("\"max_tokens\": 3, \"kv_transfer_params\": {}", answer["kv_transfer_params"]),
    );
    let (status, body) = http(&producer.base, "POST", "/v1/completions", &[], &decode);
    assert_eq!(status, 400, "a kv_producer takes no decode: {body}");
    assert!(body.contains("kv_transfer_params.do_remote_prefill"), "{body}");
}

/// Issue 45 item 3: held prefills are keyed by a server-made id, so two prefills sharing an
/// `X-Request-Id` (hence a response id) each keep their own handoff: both can be read or
/// aborted, and no block stays held once they are.
#[test]
fn prefills_sharing_an_x_request_id_never_alias() {
    let config = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}"#;
    let server = Server::start(&["--block-size", "16", "--kv-transfer-config", config]);
    let body = r#"{"prompt": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": true}}"#;
    let mut params = Vec::new();
    for _ in 0..2 {
        let (status, answer) =
            http(&server.base, "POST", "/v1/completions", &[("X-Request-Id", "same")], body);
        assert_eq!(status, 200, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["id"], "cmpl-same", "the response id still echoes the header, as vLLM's");
        params.push(answer["kv_transfer_params"].clone());
    }
    assert_ne!(params[0]["remote_request_id"], params[1]["remote_request_id"], "{params:?}");
    for p in &params {
        let abort = serde_json::json!({
            "remote_engine_id": p["remote_engine_id"], "remote_request_id": p["remote_request_id"],
        });
        let (status, text) = http(&server.base, "POST", "/mocker/kv_transfer/abort", &[], &abort.to_string());
        assert_eq!(status, 200, "each prefill is held under its own id: {text}");
    }
    // Nothing is held any more: the prefix cache can be reset.
    let (status, text) = http(&server.base, "POST", "/reset_prefix_cache", &[], "");
    assert_eq!(status, 200, "{text}");
}

/// Issue 45 item 4: a decode server reads KV only from a host that is an address or a name
/// (no port or path smuggled in) on an allowed network (`--kv-peer-allow`, by default
/// loopback and its own address), and refuses before reserving anything. Every address
/// here is loopback: nothing leaves the machine even where a check were missing.
#[test]
fn a_decode_server_reads_only_from_allowed_peers() {
    let consumer = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}"#;
    let open = Server::start(&["--block-size", "16", "--kv-transfer-config", consumer]);
    let narrow = Server::start(&[
        "--block-size",
        "16",
        "--kv-transfer-config",
        consumer,
        "--kv-peer-allow",
        "127.0.0.2/32",
    ]);
    let port = open.base.rsplit(':').next().unwrap().to_string();
    let body = |host: &str| {
        serde_json::json!({
            "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "max_tokens": 2,
            "kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "e", "remote_block_ids": [1, 2],
                                   "remote_host": host, "remote_port": port.parse::<u16>().unwrap()},
        })
        .to_string()
    };
    let injected = format!("127.0.0.1:{port}/injected/path?q=");
    let (status, text) = http(&open.base, "POST", "/v1/completions", &[], &body(&injected));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("remote_host") && text.contains("no port or path"), "{text}");
    let (status, text) = http(&narrow.base, "POST", "/v1/completions", &[], &body("127.0.0.1"));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("remote_host") && text.contains("--kv-peer-allow"), "{text}");
    for server in [&open, &narrow] {
        let (_, metrics) = http(&server.base, "GET", "/metrics", &[], "");
        let usage = metrics.lines().find(|l| l.starts_with("vllm:kv_cache_usage_perc{")).unwrap();
        assert!(usage.ends_with(" 0.0") || usage.ends_with(" 0"), "nothing stays reserved: {usage}");
    }
    assert_serve_refuses(&["--kv-peer-allow", "127.0.0.0/8"], "--kv-peer-allow");
    // A prefill-only server reads from nobody: the flag would change nothing there.
    let producer = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}"#;
    assert_serve_refuses(
        &["--kv-transfer-config", producer, "--kv-peer-allow", "127.0.0.0/8"],
        "kv_producer",
    );
    assert_serve_refuses(
        &["--engine-args", r#"{"worker_type": "prefill"}"#, "--kv-peer-allow", "127.0.0.0/8"],
        "--kv-peer-allow",
    );
    assert_serve_refuses(
        &["--kv-transfer-config", consumer, "--kv-peer-allow", "10.0.0.0/99"],
        "--kv-peer-allow",
    );
}

/// Issue 45 item 5: the side channel's reads and aborts need the API key, and a read whose
/// `missing_tokens` exceeds the prompt, or whose modelled transfer outlasts the abort
/// timeout, is refused with the prefill's KV freed at once (no panic, nothing held).
#[test]
fn the_kv_side_channel_needs_the_key_and_checks_its_arithmetic() {
    let producer = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}"#;
    let server = Server::start(&[
        "--block-size",
        "16",
        "--kv-transfer-config",
        producer,
        "--kv-abort-timeout-seconds",
        "1",
        "--engine-args",
        r#"{"kv_transfer_bytes_per_token": 1000000, "kv_transfer_bandwidth": 0.001}"#,
    ]);
    let bearer = format!("Bearer {KEY}");
    let auth = [("Authorization", bearer.as_str())];
    let body = r#"{"prompt": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": true}}"#;
    let prefill = || {
        let (status, text) = http(&server.base, "POST", "/v1/completions", &auth, body);
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["kv_transfer_params"].clone()
    };
    let read = |p: &serde_json::Value, missing: &str| {
        format!(
            r#"{{"remote_engine_id": {}, "remote_request_id": {}, "remote_block_ids": {}, "missing_tokens": {missing}}}"#,
            p["remote_engine_id"], p["remote_request_id"], p["remote_block_ids"]
        )
    };
    let p = prefill();
    let abort = format!(
        r#"{{"remote_engine_id": {}, "remote_request_id": {}}}"#,
        p["remote_engine_id"], p["remote_request_id"]
    );
    for (path, body) in [("/mocker/kv_transfer/read", read(&p, "1")), ("/mocker/kv_transfer/abort", abort)] {
        let (status, text) = post_without_key(&server.base, path, &body);
        assert_eq!(status, 401, "{path} without the key: {text}");
    }
    let (status, text) =
        http(&server.base, "POST", "/mocker/kv_transfer/read", &auth, &read(&p, "18446744073709551615"));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("missing_tokens"), "{text}");
    // 17 tokens of 1 MB over 1 MB/s is 17 s, past the 1 s abort timeout.
    let p = prefill();
    let (status, text) = http(&server.base, "POST", "/mocker/kv_transfer/read", &auth, &read(&p, "1"));
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("abort timeout"), "{text}");
    let (status, text) = http(&server.base, "POST", "/reset_prefix_cache", &auth, "");
    assert_eq!(status, 200, "both refused reads freed their prefill's KV: {text}");
}

/// A POST without an `Authorization` header (`common::http` always sends the key).
fn post_without_key(base: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(base.trim_start_matches("http://")).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let status = raw.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    (status, raw)
}

fn lines_of_stderr(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// TTFT through an idle P/D pair, from the core: the prefill's pass, the transfer at
/// 131072 bytes per token over 0.05 GB/s, and the decode side's first pass after activation.
fn modelled_pd_ttft_ms(prompt_len: usize, max_tokens: usize) -> f64 {
    let mut config = LaunchConfig::from_json_str("").unwrap().engine;
    config.block_size = 16;
    let request = Request {
        uuid: 1,
        tokens: (1000..1000 + prompt_len as u32).collect(),
        max_output_tokens: 1,
        ..Default::default()
    };
    let mut prefill = Engine::new(EngineOptions { config: config.clone(), ..Default::default() }).unwrap();
    prefill.submit(request.clone()).unwrap();
    let prefill_ms = prefill.step(0).end_ns as f64 / 1e6;
    let mut decode = Engine::new(EngineOptions { config, ..Default::default() }).unwrap();
    let reserved = decode.reserve(Request { max_output_tokens: max_tokens, ..request }).unwrap();
    decode.activate(reserved.key, 1).unwrap();
    let decode_ms = decode.step(0).end_ns as f64 / 1e6;
    let transfer_ms = prompt_len as f64 * 131072.0 / 0.05e9 * 1e3;
    prefill_ms + transfer_ms + decode_ms
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
        (&["--image-tokens", "0"][..], "--image-tokens"),
    ] {
        assert_serve_refuses(args, needle);
    }
}

#[test]
fn frontend_latency_delays_every_first_token() {
    // A one-token completion takes one modelled prefill pass (tens of ms); the API
    // server's modelled time comes before it, so no answer can come back sooner.
    let body = r#"{"model": "mocker-test", "prompt": "hello there", "max_tokens": 1}"#;
    let timed = |server: &Server| {
        let start = Instant::now();
        let (status, text) = http(&server.base, "POST", "/v1/completions", &[], body);
        assert_eq!(status, 200, "{text}");
        start.elapsed()
    };
    let slow = Server::start(&["--speedup-ratio", "1", "--engine-args", r#"{"frontend_latency_ms": 1500}"#]);
    assert!(timed(&slow) >= Duration::from_millis(1500));
    let plain = Server::start(&["--speedup-ratio", "1"]);
    assert!(timed(&plain) < Duration::from_millis(1500), "without the key nothing waits");
    // A model on a GPU serves with the architecture's timing and its KV capacity.
    let modelled =
        Server::start(&["--speedup-ratio", "1", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "l40s"]);
    let start = modelled.stderr.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    timed(&modelled);
    let (status, models) = http(&modelled.base, "GET", "/v1/models", &[], "");
    assert_eq!(status, 200, "{start}");
    assert!(models.contains("\"max_model_len\""), "{models}");
}

#[test]
fn a_silent_prefill_peer_holds_the_decodes_blocks_for_seconds_not_the_abort_timeout() {
    // A peer that accepts the read's connection and never answers: the decode side gives
    // up once no headers came (seconds, not vLLM's 480 s abort timeout), frees its
    // reservation and computes the prompt itself.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let conns: Vec<_> = silent.incoming().take(1).flatten().collect();
        std::thread::sleep(Duration::from_secs(40));
        drop(conns);
    });
    let consumer = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}"#;
    let decode = Server::start(&["--block-size", "16", "--kv-transfer-config", consumer]);
    let body = serde_json::json!({
        "model": "mocker-test", "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], "max_tokens": 2,
        "kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "e", "remote_block_ids": [1, 2],
                               "remote_host": "127.0.0.1", "remote_port": port},
    })
    .to_string();
    let start = Instant::now();
    let (status, text) = http(&decode.base, "POST", "/v1/completions", &[], &body);
    assert_eq!(status, 200, "{text}");
    assert!(start.elapsed() < Duration::from_secs(30), "waited {:?}", start.elapsed());
    let (_, metrics) = http(&decode.base, "GET", "/metrics", &[], "");
    let usage = metrics.lines().find(|l| l.starts_with("vllm:kv_cache_usage_perc{")).unwrap();
    assert!(usage.ends_with(" 0.0") || usage.ends_with(" 0"), "nothing stays reserved: {usage}");
    drop(held);
}

#[test]
fn the_side_channel_needs_the_deployments_secret() {
    let producer = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}"#;
    let prefill = Server::start(&["--kv-transfer-config", producer, "--kv-transfer-secret", "s3cret"]);
    let read = r#"{"remote_engine_id": "not-this-one", "remote_block_ids": [1], "missing_tokens": 16}"#;
    let (status, text) = http(&prefill.base, "POST", "/mocker/kv_transfer/read", &[], read);
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("x-mocker-kv-transfer-secret"), "{text}");
    let (status, _) = http(
        &prefill.base,
        "POST",
        "/mocker/kv_transfer/read",
        &[("x-mocker-kv-transfer-secret", "guess")],
        read,
    );
    assert_eq!(status, 401);
    let abort = r#"{"remote_engine_id": "x", "remote_request_id": "y"}"#;
    let (status, _) = http(&prefill.base, "POST", "/mocker/kv_transfer/abort", &[], abort);
    assert_eq!(status, 401);
    // With the secret the call gets through to the engine-id check.
    let (status, text) = http(
        &prefill.base,
        "POST",
        "/mocker/kv_transfer/read",
        &[("x-mocker-kv-transfer-secret", "s3cret")],
        read,
    );
    assert_eq!(status, 421, "{text}");
    assert_serve_refuses(&["--kv-transfer-secret", "s3cret"], "--kv-transfer-secret");
    assert_serve_refuses(
        &["--kv-transfer-config", producer, "--kv-transfer-secret", ""],
        "--kv-transfer-secret",
    );
}
