//! Dynamo's own KV indexer (`dynamo.indexer` from ai-dynamo-runtime 1.6.1, a real subscriber
//! of vLLM-format ZMQ KV events) against `mocker serve`, driven by
//! tests/python/indexer_check_serve.py: for each prompt, the overlap the indexer reports must
//! equal what the server itself reports cached on a repeat. Run on one aggregated server and
//! on both sides of a disaggregated pair (the prefill side's held then released blocks, the
//! decode side's received ones).
//!
//! The indexer's Python is MOCKER_DYNAMO_PYTHON, which `.ci/run` sets after installing the
//! wheel; when it is unset the tests are skipped with a printed reason.

mod common;

use std::process::Command;

use common::repo_root;

fn check(mode: &[&str], test: &str) {
    let python = match std::env::var("MOCKER_DYNAMO_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            eprintln!(
                "skipping {test}: MOCKER_DYNAMO_PYTHON is not set (.ci/run installs ai-dynamo-runtime)"
            );
            return;
        }
    };
    let out = Command::new(&python)
        .arg(repo_root().join("tests/python/indexer_check_serve.py"))
        .arg(env!("CARGO_BIN_EXE_mocker"))
        .args(mode)
        .output()
        .expect("the indexer check runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let start = stdout.find('{').unwrap_or_else(|| panic!("no JSON: {stdout}\n{stderr}"));
    let result: serde_json::Value =
        serde_json::from_str(&stdout[start..]).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    eprintln!("{test}: {result}");
    let checks = result["checks"].as_array().expect("checks");
    assert!(checks.len() >= 3, "{result}");
    for c in checks {
        assert_eq!(c["server_cached_tokens_on_repeat"], c["indexer_matched_tokens"], "{c}");
    }
    assert!(checks.iter().any(|c| c["indexer_matched_tokens"].as_u64() > Some(0)), "{result}");
    assert_eq!(result["ok"], true, "{result}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
}

#[test]
fn dynamos_indexer_sees_what_an_aggregated_server_caches() {
    check(&[], "dynamos_indexer_sees_what_an_aggregated_server_caches");
}

#[test]
fn dynamos_indexer_sees_what_both_sides_of_a_pd_pair_cache() {
    check(&["--pd"], "dynamos_indexer_sees_what_both_sides_of_a_pd_pair_cache");
}
