//! `POST /v1/responses` (the OpenAI Responses API, text in and text out, as vLLM serves it).
//!
//! The request becomes a chat request (`instructions` as the system message, `input` as the
//! messages, `max_output_tokens` as the output length) run by the chat path of
//! [`crate::generate`], so timing, KV, metrics and output text are exactly chat's. Its
//! answer is re-shaped: one `message` output item with one `output_text` part and
//! `usage` as `input_tokens` / `output_tokens` / `total_tokens`; streamed, the chat chunks
//! become the Responses events (`response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
//! ..., `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`, `response.completed`), numbered by `sequence_number`.
//! An output that ended at `max_output_tokens` has `status: "incomplete"` with
//! `incomplete_details.reason: "max_output_tokens"` (the stream still ends with
//! `response.completed`, as vLLM's does). Nothing is stored: `store: true`,
//! `previous_response_id`, tools, and every other field not listed in [`FIELDS`] are
//! refused with a 400 naming them.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::error::ApiError;
use crate::generate::{generate, Prepared};
use crate::openai::request::{parse_chat, PromptInput};
use crate::openai::response::Endpoint;
use crate::openai::template;
use crate::plan::requested_replay_key;
use crate::state::{body as read_body, request_id, AppState};

/// Fields a Responses request may carry; `store` only as `false`.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "stream",
    "temperature",
    "top_p",
    "store",
    "user",
];

/// What the re-shaped answer repeats from the request.
#[derive(Debug, Clone)]
struct Echo {
    id: String,
    message_id: String,
    created_at: u64,
    model: String,
    instructions: Value,
    max_output_tokens: Value,
    temperature: Value,
    top_p: Value,
}

impl Echo {
    /// The `response` object with `status`, `output` and `usage`.
    fn response(&self, status: &str, output: Vec<Value>, usage: Value, finish: Option<&str>) -> Value {
        let incomplete =
            if finish == Some("length") { json!({"reason": "max_output_tokens"}) } else { Value::Null };
        let status = if status == "completed" && !incomplete.is_null() { "incomplete" } else { status };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": false,
            "previous_response_id": null,
            "reasoning": null,
            "store": false,
            "temperature": self.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
            "metadata": {},
        })
    }

    fn part(text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    }

    fn message(&self, status: &str, content: Vec<Value>) -> Value {
        json!({"id": self.message_id, "type": "message", "status": status, "role": "assistant", "content": content})
    }
}

/// Chat's `usage` as the Responses API names it.
fn usage(chat: &Value) -> Value {
    let input = chat["prompt_tokens"].as_u64().unwrap_or(0);
    let output = chat["completion_tokens"].as_u64().unwrap_or(0);
    let cached = chat["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

/// Text of one input message's `content`: a string or a list of text parts.
fn content_text(content: &Value, at: usize) -> Result<String, ApiError> {
    let bad = |what: String| ApiError::invalid_field("input", format!("input[{at}].content: {what}"));
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(bad(format!(
                            "unsupported content part {} (only input_text / output_text parts are simulated)",
                            kind.unwrap_or("without a type")
                        )))
                    }
                }
            }
            Ok(text)
        }
        other => Err(bad(format!("expected a string or a list of content parts, got {other}"))),
    }
}

/// The chat messages of `instructions` and `input`.
fn messages(value: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let mut messages = Vec::new();
    match value.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(other) => {
            return Err(ApiError::invalid_field(
                "instructions",
                format!("instructions: expected a string, got {other}"),
            ))
        }
    }
    match value.get("input") {
        None | Some(Value::Null) => return Err(ApiError::invalid_field("input", "input is required")),
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) if !items.is_empty() => {
            for (at, item) in items.iter().enumerate() {
                let kind = item["type"].as_str().unwrap_or("message");
                let role = item["role"].as_str();
                match (kind, role) {
                    ("message", Some(role @ ("user" | "system" | "developer" | "assistant"))) => {
                        messages.push(json!({"role": role, "content": content_text(&item["content"], at)?}))
                    }
                    ("message", _) => {
                        return Err(ApiError::invalid_field(
                            "input",
                            format!(
                                "input[{at}].role: expected user, system, developer or assistant, got {}",
                                item["role"]
                            ),
                        ))
                    }
                    (other, _) => {
                        return Err(ApiError::invalid_field(
                            "input",
                            format!("input[{at}]: item type {other:?} is not simulated (only messages)"),
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(ApiError::invalid_field(
                "input",
                format!("input: expected a string or a non-empty list of messages, got {other}"),
            ))
        }
    }
    Ok(messages)
}

/// Validates the Responses body and builds the equivalent chat body.
fn to_chat(bytes: &[u8]) -> Result<(Value, Map<String, Value>), ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let Value::Object(object) = value else {
        return Err(ApiError::bad_request("request body: expected a JSON object"));
    };
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid_field(
            unknown,
            format!(
                "{unknown}: not supported by mocker's /v1/responses (supported: {}; nothing is stored, no tools)",
                FIELDS.join(", ")
            ),
        ));
    }
    if !matches!(object.get("store"), None | Some(Value::Null) | Some(Value::Bool(false))) {
        return Err(ApiError::invalid_field("store", "store: responses are not stored; set store to false"));
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(&object)?));
    for (from, to) in [
        ("model", "model"),
        ("max_output_tokens", "max_completion_tokens"),
        ("stream", "stream"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
    ] {
        if let Some(v) = object.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if object.get("stream").and_then(Value::as_bool) == Some(true) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok((Value::Object(chat), object))
}

/// Names the Responses field in an error the chat path raised.
fn renamed(mut e: ApiError) -> ApiError {
    let field = match e.param.as_deref() {
        Some("max_tokens" | "max_completion_tokens") => "max_output_tokens",
        Some("prompt" | "messages") => "input",
        _ => return e,
    };
    e.message = e.message.replace("max_completion_tokens", field).replace("max_tokens", field);
    e.param = Some(field.to_string());
    e
}

/// `POST /v1/responses`.
pub async fn responses(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let id = request_id(&request);
    let bytes = read_body(&state, request).await?;
    let (chat, object) = to_chat(&bytes)?;
    let chat_bytes = serde_json::to_vec(&chat).expect("JSON values serialize");
    let (generation, messages) = parse_chat(&chat_bytes).map_err(renamed)?;
    let stream = generation.stream;
    let prompt = PromptInput::Text(template::render(&messages));
    let replay_key = requested_replay_key(&chat_bytes)?;
    let echo = Echo {
        id: format!("resp_{}", id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())),
        message_id: format!("msg_{}", uuid::Uuid::new_v4().simple()),
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: generation.model.clone().unwrap_or_else(|| state.model_name.clone()),
        instructions: object.get("instructions").cloned().unwrap_or(Value::Null),
        max_output_tokens: object.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        temperature: object.get("temperature").cloned().unwrap_or(json!(1.0)),
        top_p: object.get("top_p").cloned().unwrap_or(json!(1.0)),
    };
    let prepared = Prepared { endpoint: Endpoint::Chat, generation, prompt, request_id: id, replay_key };
    let chat_response = generate(state, prepared, arrived).await.map_err(renamed)?;
    if stream {
        Ok(streamed(echo, chat_response))
    } else {
        full(echo, chat_response).await
    }
}

async fn full(echo: Echo, chat_response: Response) -> Result<Response, ApiError> {
    let bytes = axum::body::to_bytes(chat_response.into_body(), usize::MAX)
        .await
        .map_err(|e| ApiError::internal(format!("reading the chat answer: {e}")))?;
    let chat: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(e.to_string()))?;
    let choice = &chat["choices"][0];
    let text = choice["message"]["content"].as_str().unwrap_or("");
    let output = vec![echo.message("completed", vec![Echo::part(text)])];
    let body = echo.response("completed", output, usage(&chat["usage"]), choice["finish_reason"].as_str());
    Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

/// Turns the chat SSE stream into Responses events.
struct Translator {
    echo: Echo,
    seq: u64,
    text: String,
    finish: Option<String>,
    /// Bytes of a chat frame not yet complete.
    pending: String,
}

impl Translator {
    fn event(&mut self, kind: &str, mut data: Value, out: &mut Vec<u8>) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        out.extend_from_slice(data.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    fn opening(&mut self, out: &mut Vec<u8>) {
        let start = self.echo.response("in_progress", Vec::new(), Value::Null, None);
        self.event("response.created", json!({"response": start}), out);
        self.event("response.in_progress", json!({"response": start}), out);
        let item = self.echo.message("in_progress", Vec::new());
        self.event("response.output_item.added", json!({"output_index": 0, "item": item}), out);
        let part = json!({"type": "output_text", "text": "", "annotations": []});
        let id = self.echo.message_id.clone();
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
            out,
        );
    }

    /// One chat frame (`data: ...`).
    fn chat_frame(&mut self, data: &str, out: &mut Vec<u8>) {
        if data == "[DONE]" {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else { return };
        if let Some(error) = chunk.get("error") {
            let data = json!({
                "code": error["code"].to_string(),
                "message": error["message"],
                "param": error["param"],
            });
            self.event("error", data, out);
            return;
        }
        if let Some(choice) = chunk["choices"].get(0) {
            if let Some(delta) = choice["delta"]["content"].as_str().filter(|d| !d.is_empty()) {
                self.text.push_str(delta);
                let id = self.echo.message_id.clone();
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": delta, "logprobs": []}),
                    out,
                );
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish = Some(reason.to_string());
            }
        }
        if chunk["choices"].as_array().is_some_and(Vec::is_empty) && chunk["usage"].is_object() {
            self.closing(usage(&chunk["usage"]), out);
        }
    }

    fn closing(&mut self, usage: Value, out: &mut Vec<u8>) {
        let id = self.echo.message_id.clone();
        let text = std::mem::take(&mut self.text);
        self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
            out,
        );
        let part = Echo::part(&text);
        self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
            out,
        );
        let item = self.echo.message("completed", vec![part]);
        self.event("response.output_item.done", json!({"output_index": 0, "item": item}), out);
        let response = self.echo.response("completed", vec![item], usage, self.finish.as_deref());
        self.event("response.completed", json!({"response": response}), out);
    }

    /// A chunk of the chat body; frames may in principle span chunks.
    fn chunk(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        self.pending.push_str(&String::from_utf8_lossy(bytes));
        while let Some(end) = self.pending.find("\n\n") {
            let frame: String = self.pending.drain(..end + 2).collect();
            if let Some(data) = frame.trim_end().strip_prefix("data: ") {
                self.chat_frame(data, out);
            }
        }
    }
}

fn streamed(echo: Echo, chat_response: Response) -> Response {
    let mut translator =
        Translator { echo, seq: 0, text: String::new(), finish: None, pending: String::new() };
    let mut opening = Vec::new();
    translator.opening(&mut opening);
    let chat = chat_response.into_body().into_data_stream();
    let events = chat.scan(translator, |t, chunk| {
        let mut out = Vec::new();
        if let Ok(bytes) = chunk {
            t.chunk(&bytes, &mut out);
        }
        futures_util::future::ready(Some(Ok::<_, std::convert::Infallible>(Bytes::from(out))))
    });
    let body =
        futures_util::stream::once(futures_util::future::ready(Ok(Bytes::from(opening)))).chain(events);
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        for field in ["tools", "previous_response_id", "reasoning", "text", "include", "background"] {
            let body = format!(r#"{{"input":"hi","{field}":null}}"#);
            assert_eq!(to_chat(body.as_bytes()).unwrap_err().param.as_deref(), Some(field));
        }
        let e = to_chat(br#"{"input":"hi","store":true}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("store"));
        let e = to_chat(br#"{"input":[{"type":"function_call_output","output":"x"}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
    }

    #[test]
    fn instructions_and_input_become_chat_messages() {
        let (chat, _) = to_chat(
            br#"{"instructions":"be brief","max_output_tokens":7,"stream":true,
                 "input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(chat["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(chat["messages"][1], json!({"role": "user", "content": "ab"}));
        assert_eq!(chat["max_completion_tokens"], 7);
        assert_eq!(chat["stream_options"]["include_usage"], true);
    }

    #[test]
    fn chat_frames_become_numbered_response_events() {
        let echo = Echo {
            id: "resp_x".into(),
            message_id: "msg_x".into(),
            created_at: 0,
            model: "m".into(),
            instructions: Value::Null,
            max_output_tokens: json!(2),
            temperature: json!(1.0),
            top_p: json!(1.0),
        };
        let mut t = Translator { echo, seq: 0, text: String::new(), finish: None, pending: String::new() };
        let mut out = Vec::new();
        t.opening(&mut out);
        // A frame split across two body chunks is still read whole.
        t.chunk(
            br#"data: {"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":null}]}"#,
            &mut out,
        );
        t.chunk(b"\n\n", &mut out);
        t.chunk(
            br#"data: {"choices":[{"index":0,"delta":{"content":" b"},"finish_reason":"length"}]}"#,
            &mut out,
        );
        t.chunk(b"\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n", &mut out);
        let text = String::from_utf8(out).unwrap();
        let events: Vec<Value> = text
            .split("\n\n")
            .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"response.created"));
        assert_eq!(kinds.last(), Some(&"response.completed"));
        assert_eq!(kinds.iter().filter(|k| **k == "response.output_text.delta").count(), 2);
        assert!(events.iter().enumerate().all(|(i, e)| e["sequence_number"] == i as u64));
        let done = events.iter().find(|e| e["type"] == "response.output_text.done").unwrap();
        assert_eq!(done["text"], " a b");
        let last = &events.last().unwrap()["response"];
        assert_eq!(last["usage"]["total_tokens"], 5);
        assert_eq!(last["status"], "incomplete");
        assert_eq!(last["output"][0]["content"][0]["text"], " a b");
    }
}
