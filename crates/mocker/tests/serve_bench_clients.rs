//! The real benchmark clients against `mocker serve` on 127.0.0.1: NVIDIA aiperf, guidellm and
//! inference-perf, each from its own venv, driven by tests/python/bench_clients.py, which parses
//! their reports and checks the measured numbers: no errors, 40/40 requests, every output
//! 64 tokens as the client itself re-tokenizes it (aiperf without --use-server-token-count),
//! and the server's prompt counts equal to the client's when both use the same tokenizer.
//!
//! The clients are located by MOCKER_AIPERF, MOCKER_GUIDELLM and MOCKER_INFERENCE_PERF (paths to
//! their executables), which `.ci/run` sets after installing them; a test whose variable is
//! unset is skipped with a printed reason, so a plain `cargo test` needs none of them.

mod common;

use std::path::{Path, PathBuf};

use common::{repo_root, run_script, Server, KEY};

/// The client's executable from `var`, or `None` (the test is skipped) when it is unset.
fn client(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(path) if !path.is_empty() => {
            assert!(Path::new(&path).is_file(), "{var}={path} is not a file");
            Some(path)
        }
        _ => {
            eprintln!("skipping {test}: {var} is not set (.ci/run installs the client and sets it)");
            None
        }
    }
}

fn qwen3() -> PathBuf {
    repo_root().join("tests/fixtures/tokenizers/qwen3")
}

fn workdir(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-clients-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn aiperf_on(server_tokenizer: Option<&Path>, name: &str) {
    aiperf_on_server(server_tokenizer, &[], name);
}

fn aiperf_on_server(server_tokenizer: Option<&Path>, extra: &[&str], name: &str) {
    let Some(aiperf) = client("MOCKER_AIPERF", name) else { return };
    let mut args = vec!["--speedup-ratio", "10"];
    args.extend_from_slice(extra);
    let server = Server::start_with_tokenizer(server_tokenizer, &args);
    let dir = workdir(name);
    let same = if server_tokenizer.is_some() { "yes" } else { "no" };
    for endpoint in ["chat", "completions"] {
        let result = run_script(
            "bench_clients.py",
            &[
                "aiperf",
                &aiperf,
                &server.base,
                KEY,
                qwen3().to_str().unwrap(),
                endpoint,
                same,
                dir.to_str().unwrap(),
            ],
        );
        eprintln!("{name}: {result}");
        assert_eq!(result["ok"], true, "{result}");
        assert_eq!(result["osl_avg"], 64.0, "{result}");
    }
}

/// aiperf counting with the Qwen3 tokenizer the server also uses: average OSL equals --osl
/// (within 1%, no OSL-mismatch warning) on chat and completions, and on completions the
/// server's prompt counts equal aiperf's ISL.
#[test]
fn aiperf_measures_the_requested_osl_with_the_servers_qwen3_tokenizer() {
    aiperf_on(Some(&qwen3()), "aiperf_qwen3");
}

/// The same through a disaggregated deployment's front (`--prefill-workers 1
/// --decode-workers 1`): every request is a prefill and a decode with a KV handoff, and
/// aiperf sees a plain server with 0 errors and the requested OSL on both endpoints.
#[test]
fn aiperf_measures_the_requested_osl_through_a_prefill_decode_front() {
    aiperf_on_server(Some(&qwen3()), &["--prefill-workers", "1", "--decode-workers", "1"], "aiperf_pd_front");
}

/// mocker's built-in word tokenizer, aiperf counting with Qwen3's: the output words are
/// single Qwen tokens, so the measured OSL is still --osl on both endpoints.
#[test]
fn aiperf_measures_the_requested_osl_with_the_builtin_tokenizer() {
    aiperf_on(None, "aiperf_builtin");
}

/// guidellm on completions and chat: 40/40 requests succeed, each with 64 output tokens by
/// usage, by stream chunks and by re-tokenizing the text it received; prompt counts 128
/// (completions) or 128 plus a fixed ChatML overhead (chat).
#[test]
fn guidellm_gets_the_requested_lengths() {
    let Some(guidellm) = client("MOCKER_GUIDELLM", "guidellm") else { return };
    let server = Server::start_with_tokenizer(Some(&qwen3()), &["--speedup-ratio", "10"]);
    let dir = workdir("guidellm");
    for endpoint in ["completions", "chat"] {
        let result = run_script(
            "bench_clients.py",
            &[
                "guidellm",
                &guidellm,
                &server.base,
                KEY,
                qwen3().to_str().unwrap(),
                endpoint,
                dir.to_str().unwrap(),
            ],
        );
        eprintln!("guidellm: {result}");
        assert_eq!(result["ok"], true, "{result}");
        assert_eq!(result["successful"], 40, "{result}");
    }
}

/// inference-perf (completions, streamed): 0 failures, client-side output length 64 on every
/// request, no mismatch between its re-tokenized count and usage, prompts of 128 tokens.
#[test]
fn inference_perf_gets_the_requested_lengths() {
    let Some(inference_perf) = client("MOCKER_INFERENCE_PERF", "inference_perf") else { return };
    let server = Server::start_with_tokenizer(Some(&qwen3()), &["--speedup-ratio", "10"]);
    let dir = workdir("inference-perf");
    let result = run_script(
        "bench_clients.py",
        &[
            "inference-perf",
            &inference_perf,
            &server.base,
            KEY,
            qwen3().to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    eprintln!("inference-perf: {result}");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["failures"], 0, "{result}");
}
