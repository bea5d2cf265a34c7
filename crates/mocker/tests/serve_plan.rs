//! `mocker serve` output the engine does not sample (issue 23): the thinking span of
//! `dynamo.reasoning` (raw in completions, split into `reasoning_content` in chat, streamed
//! and not) and recorded outputs replayed from `dynamo.response_replay_trace_path`. The real
//! binary on 127.0.0.1 with the fixture's BERT tokenizer ([CLS] = 101, [SEP] = 102 serve as
//! the markers); raw HTTP clients.

mod common;

use std::process::Command;

use common::{http, http_json, Server};
use serde_json::Value;

fn words(s: &str) -> usize {
    s.split_whitespace().count()
}

fn reasoning_server(extra: &[&str]) -> Server {
    let args = r#"{"engine": {}, "dynamo": {"reasoning":
        {"start_thinking_token_id": 101, "end_thinking_token_id": 102, "thinking_ratio": 0.5}}}"#;
    let mut all = vec!["--speedup-ratio", "500", "--engine-args", args];
    all.extend_from_slice(extra);
    Server::start(&all)
}

/// 10 output tokens at ratio 0.5: a 5-token span ([CLS], three thinking tokens, [SEP]) then
/// five answer tokens; usage counts all ten everywhere.
#[test]
fn reasoning_spans_are_raw_in_completions_and_split_in_chat() {
    let server = reasoning_server(&[]);
    let c = http_json(&server.base, "/v1/completions", r#"{"prompt": "hello there", "max_tokens": 10}"#);
    let text = c["choices"][0]["text"].as_str().unwrap();
    assert_eq!(c["usage"]["completion_tokens"], 10);
    let (head, answer) = text.split_once("[SEP]").unwrap_or_else(|| panic!("no end marker: {text:?}"));
    let thinking = head.strip_prefix("[CLS]").unwrap_or_else(|| panic!("no start marker: {text:?}"));
    assert_eq!((words(thinking), words(answer)), (3, 5), "{text:?}");

    let chat = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}"#;
    let b = http_json(&server.base, "/v1/chat/completions", chat);
    let m = &b["choices"][0]["message"];
    let (reasoning, content) = (m["reasoning_content"].as_str().unwrap(), m["content"].as_str().unwrap());
    assert_eq!((words(reasoning), words(content)), (3, 5), "{b}");
    assert!(!format!("{reasoning}{content}").contains('['), "markers leaked: {b}");
    assert_eq!(b["usage"]["completion_tokens"], 10);

    let stream = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": true,
        "stream_options": {"include_usage": true}}"#;
    let (status, body) = http(&server.base, "POST", "/v1/chat/completions", &[], stream);
    assert_eq!(status, 200, "{body}");
    let chunks: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let deltas: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| &c["delta"]).collect();
    let thinking: Vec<&str> = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
    let answer: Vec<&str> =
        deltas.iter().filter_map(|d| d["content"].as_str()).filter(|t| !t.is_empty()).collect();
    assert_eq!((thinking.len(), answer.len()), (3, 5), "{body}");
    assert!(!body.contains("[CLS]") && !body.contains("[SEP]"), "{body}");
    let last = chunks.iter().rev().find(|c| c["choices"].get(0).is_some()).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 10);

    // Two tokens: ⌊2 · 0.5⌋ = 1 is raised to the two markers, leaving no answer.
    let short = r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let b = http_json(&server.base, "/v1/chat/completions", short);
    assert!(b["choices"][0]["message"]["content"].is_null(), "{b}");
    assert_eq!(b["choices"][0]["message"]["reasoning_content"], "");
    assert_eq!(b["usage"]["completion_tokens"], 2);

    // No recorded outputs on this server: a replay annotation is refused by name.
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "x", "max_tokens": 3, "nvext": {"annotations": ["output_replay_id:r1"]}}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("nvext.annotations"), "{body}");
}

fn trace(name: &str, rows: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mocker-serve-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, rows).unwrap();
    path
}

/// A request annotated `output_replay_id:KEY` generates exactly the recorded ids (text =
/// their decoding, usage = their count) whatever its `max_tokens`, clipped to the context;
/// keys are request ids, session turns or line numbers; an unknown key is a 400.
#[test]
fn recorded_outputs_are_replayed_token_for_token() {
    let rows = concat!(
        "{\"request_id\": \"r1\", \"output_length\": 4, \"output_token_ids\": [2023, 2003, 1037, 3231]}\n",
        "{\"session_id\": \"s\", \"output_length\": 7}\n",
        "{\"session_id\": \"s\", \"output_tokens\": 2, \"output_token_ids\": [7592, 2088]}\n",
        "{\"output_length\": 3, \"output_token_ids\": [2204, 2851, 2000]}\n",
    );
    let path = trace("ok.jsonl", rows);
    let args =
        format!(r#"{{"engine": {{}}, "dynamo": {{"response_replay_trace_path": "{}"}}}}"#, path.display());
    let server = Server::start(&["--speedup-ratio", "500", "--max-model-len", "64", "--engine-args", &args]);
    let ask = |key: &str, max_tokens: usize, prompt: &str| {
        http_json(
            &server.base,
            "/v1/completions",
            &format!(
                r#"{{"prompt": {prompt}, "max_tokens": {max_tokens}, "nvext": {{"annotations": ["x:y", "output_replay_id:{key}"]}}}}"#
            ),
        )
    };
    let detok = |ids: &str| {
        http_json(&server.base, "/detokenize", &format!(r#"{{"tokens": {ids}}}"#))["prompt"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for (key, ids, n) in [
        ("r1", "[2023, 2003, 1037, 3231]", 4),
        ("s:1", "[7592, 2088]", 2),
        ("line:3", "[2204, 2851, 2000]", 3),
    ] {
        let c = ask(key, 50, r#""hello""#);
        assert_eq!(c["usage"]["completion_tokens"], n, "{key}: {c}");
        assert_eq!(c["choices"][0]["text"].as_str().unwrap().trim(), detok(ids), "{key}: {c}");
    }
    // max_tokens below the recording does not shorten it (the recording sets the length)...
    assert_eq!(ask("r1", 1, r#""hello""#)["usage"]["completion_tokens"], 4);
    // ...but the context window does: 62 prompt tokens leave room for 2.
    let long: Vec<String> = (0..62).map(|i| (2000 + i).to_string()).collect();
    let c = ask("r1", 1, &format!("[{}]", long.join(",")));
    assert_eq!(c["usage"]["completion_tokens"], 2, "{c}");
    // Chat too, streamed: the deltas spell the recording.
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"messages": [{"role": "user", "content": "hi"}], "stream": true,
            "nvext": {"annotations": ["output_replay_id:r1"]}}"#,
    );
    assert_eq!(status, 200, "{body}");
    let text: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text.trim(), detok("[2023, 2003, 1037, 3231]"));
    let (status, body) = http(
        &server.base,
        "POST",
        "/v1/completions",
        &[],
        r#"{"prompt": "x", "nvext": {"annotations": ["output_replay_id:nope"]}}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("nope") && body.contains("nvext.annotations"), "{body}");
}

/// A trace that is missing or malformed stops `mocker serve` at start (exit 2), naming the
/// path and the line.
#[test]
fn a_bad_replay_trace_exits_2_naming_path_and_line() {
    let bad = trace(
        "bad.jsonl",
        "{\"request_id\": \"a\", \"output_length\": 1, \"output_token_ids\": [1]}\n{oops\n",
    );
    let missing = bad.with_file_name("missing.jsonl");
    for (path, needle) in [(&bad, "bad.jsonl:2: malformed row"), (&missing, "missing.jsonl")] {
        let args = format!(
            r#"{{"engine": {{}}, "dynamo": {{"response_replay_trace_path": "{}"}}}}"#,
            path.display()
        );
        let out = Command::new(env!("CARGO_BIN_EXE_mocker"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "--engine-args", &args])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle) && err.contains("response_replay_trace_path"), "{err}");
    }
}
