//! End-to-end tests of `mocker serve`'s protocols beside OpenAI's: Anthropic's Messages API
//! through the `anthropic` SDK, vLLM's tokens-in/tokens-out `/inference/v1/generate` and its
//! pooling routes through httpx (tests/python/serve_protocols.py), and a disaggregated
//! prefill/decode handoff through `/inference/v1/generate`.

mod common;

use common::{http, http_json, run_script, Server, KEY};

/// The anthropic SDK streamed and not, stop sequences, tools, images, exact usage (equal to
/// /tokenize and count_tokens), Anthropic-shaped 4xx; generate's token ids in and out,
/// streamed and not, stop_token_ids acting, refusals by name; sleep mode and injected
/// failures on the new routes; the server serving on after every bad request.
#[test]
fn anthropic_generate_and_pooling_clients_get_vllms_shapes() {
    let server = Server::start(&[
        "--max-model-len",
        "512",
        "--image-tokens",
        "100",
        "--speedup-ratio",
        "200",
        "--enable-sleep-mode",
    ]);
    let result = run_script("serve_protocols.py", &[&server.base, KEY]);
    eprintln!("protocols: {result}");
    assert_eq!(result["ok"], true, "{result}");
}

/// A prefill server answers a generate request carrying `do_remote_decode` with the
/// `kv_transfer_params` a decode server's generate request then reads the prompt's KV with:
/// the decode side counts the prompt as cached and generates the rest.
#[test]
fn generate_requests_hand_off_kv_between_prefill_and_decode_servers() {
    let config = r#"{"kv_connector": "NixlConnector", "kv_role": "kv_both"}"#;
    let prefill = Server::start(&["--block-size", "16", "--kv-transfer-config", config]);
    let decode = Server::start(&["--block-size", "16", "--kv-transfer-config", config]);
    let ids: Vec<u32> = (1..=64).collect();
    let ids = serde_json::to_string(&ids).unwrap();
    let first = http_json(
        &prefill.base,
        "/inference/v1/generate",
        &format!(
            r#"{{"token_ids": {ids}, "sampling_params": {{"max_tokens": 1, "extra_args": {{"kv_transfer_params": {{"do_remote_decode": true}}}}}}}}"#
        ),
    );
    assert_eq!(first["choices"][0]["token_ids"].as_array().unwrap().len(), 1, "{first}");
    let params = &first["kv_transfer_params"];
    assert_eq!(params["do_remote_prefill"], true, "{first}");
    let body = format!(
        r#"{{"token_ids": {ids}, "sampling_params": {{"max_tokens": 4}}, "kv_transfer_params": {params}, "stream": true, "stream_options": {{"include_usage": true}}}}"#
    );
    let (status, text) = http(&decode.base, "POST", "/inference/v1/generate", &[], &body);
    assert_eq!(status, 200, "{text}");
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find(|f| f["choices"].as_array().is_some_and(Vec::is_empty) && f["usage"].is_object())
        .unwrap_or_else(|| panic!("a usage frame: {text}"));
    assert_eq!(usage["usage"]["completion_tokens"], 4, "{usage}");
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 64, "{usage}");
    // A plain server has no connector: the params are refused by name.
    let plain = Server::start(&[]);
    let (status, text) = http(
        &plain.base,
        "POST",
        "/inference/v1/generate",
        &[],
        r#"{"token_ids": [1, 2], "sampling_params": {}, "kv_transfer_params": {"do_remote_decode": true}}"#,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("kv_transfer_params"), "{text}");
}
