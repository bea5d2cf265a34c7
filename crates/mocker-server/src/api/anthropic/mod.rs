//! Anthropic's Messages API as vLLM serves it: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`. As vLLM's adapter does, a request is converted to a
//! chat completions request and runs the chat path (template, engine, stop rules, tool
//! calls), and the chat answer is converted back: a `message` object, or Anthropic's
//! event stream (see [`stream`]). Errors the handler raises have Anthropic's shape
//! `{"type":"error","error":{"type","message"}}`, with vLLM's error type names.
//!
//! Every field either acts or is refused by name.

mod stream;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::api::sse::{self, Frame};
use crate::error::ApiError;
use crate::generate::{generate, Prepared};
use crate::openai::request::{parse_chat, PromptInput};
use crate::openai::response::Endpoint;
use crate::openai::template;
use crate::state::{body, request_id, AppState};

/// Top-level fields of a Messages request; anything else is refused by name.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "tools",
    "tool_choice",
    "kv_transfer_params",
];

/// Fields of a count_tokens request.
const COUNT_FIELDS: &[&str] = &["model", "messages", "system", "tools", "tool_choice"];

/// Keys a content block may carry beside its own (`cache_control` is a prompt-caching hint:
/// vLLM's prefix cache, as mocker's, caches every prompt without it).
const BLOCK_COMMON: &[&str] = &["type", "cache_control"];

/// Most messages (and system blocks) one request may carry.
pub const MAX_MESSAGES: usize = 4096;
/// Most content blocks one message may carry.
pub const MAX_BLOCKS: usize = 4096;

/// An error in Anthropic's shape (the status and message of `e`; `type` as vLLM names it).
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl AnthropicError {
    /// `{"type":"error","error":{"type","message"}}`.
    pub fn body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.0.kind(), "message": self.0.message}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        (status, [(header::CONTENT_TYPE, "application/json")], self.body().to_string()).into_response()
    }
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_field(field, format!("{field}: {message}"))
}

fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("request body: expected a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    }
}

fn refuse_unknown(body: &Map<String, Value>, allowed: &[&str], route: &str) -> Result<(), ApiError> {
    match body.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(unknown) => {
            Err(bad(unknown, format!("unsupported field for {route} (supported: {})", allowed.join(", "))))
        }
        None => Ok(()),
    }
}

fn block_keys(block: &Map<String, Value>, at: &str, own: &[&str]) -> Result<(), ApiError> {
    match block.keys().find(|k| !BLOCK_COMMON.contains(&k.as_str()) && !own.contains(&k.as_str())) {
        Some(k) => Err(bad(&format!("{at}.{k}"), "unsupported in this content block")),
        None => Ok(()),
    }
}

fn text_of(block: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    block_keys(block, at, &["text", "citations"])?;
    if block.get("citations").is_some_and(|c| !c.is_null() && c.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(bad(&format!("{at}.citations"), "citations are not simulated"));
    }
    match block.get("text") {
        Some(Value::String(t)) => Ok(t.clone()),
        other => Err(bad(&format!("{at}.text"), format!("expected a string, got {}", shown(other)))),
    }
}

fn shown(v: Option<&Value>) -> String {
    v.map_or_else(|| "nothing".to_string(), Value::to_string)
}

/// `system`: a string or a list of text blocks, concatenated as vLLM does.
fn system_text(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(blocks)) if blocks.len() <= MAX_BLOCKS => {
            let mut text = String::new();
            for (i, b) in blocks.iter().enumerate() {
                let at = format!("system[{i}]");
                let Some(block) =
                    b.as_object().filter(|o| o.get("type").and_then(Value::as_str) == Some("text"))
                else {
                    return Err(bad(&at, "system blocks must be text blocks"));
                };
                text.push_str(&text_of(block, &at)?);
            }
            Ok(Some(text))
        }
        Some(v) => Err(bad("system", format!("expected a string or a list of text blocks, got {v}"))),
    }
}

/// An image block as the chat path's `image_url` part (a URL, or the base64 data as a data URL).
fn image_part(block: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    block_keys(block, at, &["source"])?;
    let source = block.get("source").and_then(Value::as_object);
    let url = match source.and_then(|s| s.get("type")).and_then(Value::as_str) {
        Some("base64") => {
            let s = source.expect("checked");
            let media = s.get("media_type").and_then(Value::as_str).filter(|m| !m.is_empty());
            let data = s.get("data").and_then(Value::as_str).filter(|d| !d.is_empty());
            match (media, data) {
                (Some(m), Some(d)) => format!("data:{m};base64,{d}"),
                _ => return Err(bad(&format!("{at}.source"), "base64 sources need media_type and data")),
            }
        }
        Some("url") => match source.expect("checked").get("url").and_then(Value::as_str) {
            Some(u) if !u.is_empty() => u.to_string(),
            _ => return Err(bad(&format!("{at}.source.url"), "expected a non-empty string")),
        },
        _ => return Err(bad(&format!("{at}.source"), "expected {\"type\": \"base64\" | \"url\", ...}")),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// The chat messages one Anthropic message becomes: its text and images as one message,
/// `tool_use` blocks as the assistant's `tool_calls`, `tool_result` blocks as `tool`
/// messages (as vLLM converts them).
fn convert_message(m: &Value, i: usize, out: &mut Vec<Value>, system: &mut String) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let Some(m) = m.as_object() else { return Err(bad(&at, "expected an object")) };
    if let Some(k) = m.keys().find(|k| !["role", "content"].contains(&k.as_str())) {
        return Err(bad(&format!("{at}.{k}"), "unsupported (a message has role and content)"));
    }
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => r,
        other => {
            return Err(bad(
                &format!("{at}.role"),
                format!("expected \"user\" or \"assistant\", got {}", shown(other.map(|_| &m["role"]))),
            ))
        }
    };
    let blocks: Vec<Value> = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) if b.len() <= MAX_BLOCKS => b.clone(),
        Some(Value::Array(b)) => {
            return Err(bad(
                &format!("{at}.content"),
                format!("at most {MAX_BLOCKS} blocks, got {}", b.len()),
            ))
        }
        other => {
            return Err(bad(
                &format!("{at}.content"),
                format!("expected a string or a list of blocks, got {}", shown(other)),
            ))
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let Some(block) = b.as_object() else { return Err(bad(&at, "expected a content block object")) };
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(json!({"type": "text", "text": text_of(block, &at)?})),
            Some("image") if role != "system" => parts.push(image_part(block, &at)?),
            Some("tool_use") if role == "assistant" => {
                block_keys(block, &at, &["id", "name", "input"])?;
                let (Some(id), Some(name)) =
                    (block.get("id").and_then(Value::as_str), block.get("name").and_then(Value::as_str))
                else {
                    return Err(bad(&at, "tool_use blocks need id and name"));
                };
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
            }
            Some("tool_result") if role == "user" => {
                block_keys(block, &at, &["tool_use_id", "content", "is_error"])?;
                let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
                    return Err(bad(&format!("{at}.tool_use_id"), "expected a string"));
                };
                let content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(inner)) => {
                        let mut text = String::new();
                        for (k, p) in inner.iter().enumerate() {
                            let at = format!("{at}.content[{k}]");
                            match p.as_object() {
                                Some(o) if o.get("type").and_then(Value::as_str) == Some("text") => {
                                    text.push_str(&text_of(o, &at)?)
                                }
                                _ => return Err(bad(&at, "tool results may hold text blocks only")),
                            }
                        }
                        text
                    }
                    Some(v) => {
                        return Err(bad(
                            &format!("{at}.content"),
                            format!("expected a string or text blocks, got {v}"),
                        ))
                    }
                };
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            Some(other) => {
                return Err(bad(
                    &at,
                    format!("content blocks of type {other:?} are not simulated in a {role} message"),
                ))
            }
            None => return Err(bad(&format!("{at}.type"), "expected a string")),
        }
    }
    if role == "system" {
        // As vLLM: system turns inside messages join the system prompt.
        for p in &parts {
            system.push_str(p["text"].as_str().unwrap_or_default());
        }
        return Ok(());
    }
    out.extend(results);
    if !parts.is_empty() || !calls.is_empty() {
        let mut chat = json!({"role": role, "content": parts});
        if !calls.is_empty() {
            chat["tool_calls"] = Value::Array(calls);
        }
        out.push(chat);
    }
    Ok(())
}

/// Anthropic tools and tool_choice as chat `tools` / `tool_choice`.
fn convert_tools(tools: Option<&Value>, choice: Option<&Value>) -> Result<(Value, Value), ApiError> {
    let tools = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let at = format!("tools[{i}]");
                let Some(t) = t.as_object() else { return Err(bad(&at, "expected an object")) };
                if let Some(k) = t.keys().find(|k| {
                    !["name", "description", "input_schema", "type", "cache_control"].contains(&k.as_str())
                }) {
                    return Err(bad(&format!("{at}.{k}"), "unsupported in a tool"));
                }
                if t.get("type").is_some_and(|ty| !ty.is_null() && ty.as_str() != Some("custom")) {
                    return Err(bad(
                        &format!("{at}.type"),
                        "server tools are not simulated; send custom tools",
                    ));
                }
                let Some(name) = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
                    return Err(bad(&format!("{at}.name"), "expected a non-empty string"));
                };
                let mut schema = t.get("input_schema").cloned().unwrap_or_else(|| json!({}));
                if let Some(o) = schema.as_object_mut() {
                    o.entry("type").or_insert_with(|| json!("object"));
                }
                let mut function = json!({"name": name, "parameters": schema});
                if let Some(d) = t.get("description") {
                    function["description"] = d.clone();
                }
                Ok(json!({"type": "function", "function": function}))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(bad("tools", format!("expected a list, got {v}"))),
    };
    let choice = match choice {
        None | Some(Value::Null) => Value::Null,
        Some(c) => {
            if let Some(k) = c.as_object().and_then(|o| {
                o.keys().find(|k| !["type", "name", "disable_parallel_tool_use"].contains(&k.as_str()))
            }) {
                return Err(bad(&format!("tool_choice.{k}"), "unsupported"));
            }
            match (c.get("type").and_then(Value::as_str), c.get("name").and_then(Value::as_str)) {
                (Some("auto"), _) => json!("auto"),
                (Some("any"), _) => json!("required"),
                (Some("none"), _) => json!("none"),
                (Some("tool"), Some(name)) => json!({"type": "function", "function": {"name": name}}),
                (Some("tool"), None) => return Err(bad("tool_choice.name", "a tool choice names its tool")),
                _ => {
                    return Err(bad("tool_choice", format!("type must be auto, any, tool or none, got {c}")))
                }
            }
        }
    };
    Ok((Value::Array(tools), choice))
}

/// The chat messages (system first) of a Messages or count_tokens body.
fn chat_messages(body: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let mut system = system_text(body.get("system"))?.unwrap_or_default();
    let list = match body.get("messages") {
        Some(Value::Array(list)) if list.is_empty() => return Err(bad("messages", "must not be empty")),
        Some(Value::Array(list)) if list.len() > MAX_MESSAGES => {
            return Err(bad("messages", format!("at most {MAX_MESSAGES} messages, got {}", list.len())))
        }
        Some(Value::Array(list)) => list,
        other => return Err(bad("messages", format!("required: a list of messages, got {}", shown(other)))),
    };
    let mut turns = Vec::with_capacity(list.len() + 1);
    for (i, m) in list.iter().enumerate() {
        convert_message(m, i, &mut turns, &mut system)?;
    }
    if !system.is_empty() {
        turns.insert(0, json!({"role": "system", "content": system}));
    }
    Ok(turns)
}

fn model(body: &Map<String, Value>) -> Result<String, ApiError> {
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        other => Err(bad("model", format!("required: a non-empty string, got {}", shown(other)))),
    }
}

/// A Messages body as the chat completions body it runs as, and whether it streams.
pub fn to_chat(bytes: &[u8]) -> Result<(Value, bool), ApiError> {
    let body = object(bytes)?;
    refuse_unknown(&body, FIELDS, "/v1/messages")?;
    let model = model(&body)?;
    let max_tokens = match body.get("max_tokens") {
        Some(v) => match v.as_u64().filter(|&n| n >= 1 && n <= u64::from(u32::MAX)) {
            Some(n) => n,
            None => return Err(bad("max_tokens", format!("must be a positive integer, got {v}"))),
        },
        None => return Err(bad("max_tokens", "required")),
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad("stream", format!("expected a boolean, got {v}"))),
    };
    let stop = match body.get("stop_sequences") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Array(s)) if s.iter().all(Value::is_string) => Value::Array(s.clone()),
        Some(v) => return Err(bad("stop_sequences", format!("expected a list of strings, got {v}"))),
    };
    for (name, ok, range) in [
        ("temperature", (|x| (0.0..=2.0).contains(&x)) as fn(f64) -> bool, "in [0, 2]"),
        ("top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]"),
        ("top_k", |x| x >= 0.0 && x.fract() == 0.0, "a non-negative integer"),
    ] {
        if let Some(v) = body.get(name).filter(|v| !v.is_null()) {
            if !v.as_f64().is_some_and(ok) {
                return Err(bad(name, format!("expected {range}, got {v}")));
            }
        }
    }
    match body.get("metadata") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(v) => return Err(bad("metadata", format!("expected an object, got {v}"))),
    }
    let (tools, tool_choice) = convert_tools(body.get("tools"), body.get("tool_choice"))?;
    let mut chat = json!({
        "model": model,
        "messages": chat_messages(&body)?,
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if stream {
        // As vLLM: usage on every chunk feeds message_start and message_delta.
        chat["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    }
    for (key, value) in [("stop", stop), ("tools", tools), ("tool_choice", tool_choice)] {
        if !value.is_null() && value.as_array().is_none_or(|a| !a.is_empty()) {
            chat[key] = value;
        }
    }
    if let Some(p) = body.get("kv_transfer_params") {
        chat["kv_transfer_params"] = p.clone();
    }
    Ok((chat, stream))
}

/// `stop_reason` and `stop_sequence` of a chat choice's `finish_reason` and `stop_reason`.
pub fn stop_reason(finish: &Value, stop: &Value) -> (Value, Value) {
    match (finish.as_str(), stop) {
        (Some("stop"), Value::String(s)) => (json!("stop_sequence"), json!(s)),
        (Some("stop"), _) => (json!("end_turn"), Value::Null),
        (Some("length"), _) => (json!("max_tokens"), Value::Null),
        (Some("tool_calls"), _) => (json!("tool_use"), Value::Null),
        _ => (Value::Null, Value::Null),
    }
}

/// A chat completion as a Messages `message`.
fn message(chat: &Value) -> Value {
    let choice = &chat["choices"][0];
    let msg = &choice["message"];
    let mut content = Vec::new();
    if let Some(text) = msg["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in msg["tool_calls"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let args = call["function"]["arguments"].as_str().unwrap_or("{}");
        content.push(json!({
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({})),
        }));
    }
    let (reason, sequence) = stop_reason(&choice["finish_reason"], &choice["stop_reason"]);
    let mut out = json!({
        "id": chat["id"],
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": chat["model"],
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": chat["usage"]["prompt_tokens"],
            "output_tokens": chat["usage"]["completion_tokens"],
        },
    });
    if let Some(p) = chat.get("kv_transfer_params").filter(|p| !p.is_null()) {
        out["kv_transfer_params"] = p.clone();
    }
    out
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, AnthropicError> {
    let arrived = Instant::now();
    let request_id = request_id(&request);
    let bytes = body(&state, request).await?;
    let (chat, stream) = to_chat(&bytes)?;
    drop(bytes);
    let chat_bytes = serde_json::to_vec(&chat).expect("values serialize");
    // The chat path's limits on `stop` are limits on `stop_sequences` here.
    let (generation, messages) = parse_chat(&chat_bytes).map_err(|mut e| {
        if e.param.as_deref() == Some("stop") {
            e.param = Some("stop_sequences".into());
            e.message = e.message.replacen("stop:", "stop_sequences:", 1);
        }
        e
    })?;
    let prepared = Prepared {
        endpoint: Endpoint::Chat,
        generation,
        prompt: template::prompt(&messages),
        request_id,
        replay_key: None,
    };
    let response = generate(state, prepared, arrived).await?;
    if stream {
        let mut events = stream::Events::default();
        return Ok(sse::reframe(response, move |frame, out| match frame {
            Frame::Data(data) => events.frame(data, out),
            Frame::End => events.end(out),
        }));
    }
    let (parts, body) = response.into_parts();
    let chat: Value = serde_json::from_slice(&sse::whole(Response::new(body), usize::MAX).await?)
        .map_err(|e| ApiError::internal(format!("the generated response is not JSON: {e}")))?;
    Ok(sse::json_like(parts, message(&chat).to_string()))
}

/// `POST /v1/messages/count_tokens`: the prompt tokens the request's messages make, as
/// `/v1/messages` counts them in `usage.input_tokens`.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, AnthropicError> {
    let bytes = body(&state, request).await?;
    let body = object(&bytes)?;
    refuse_unknown(&body, COUNT_FIELDS, "/v1/messages/count_tokens")?;
    let name = model(&body)?;
    state.resolve_model(Some(&name))?;
    convert_tools(body.get("tools"), body.get("tool_choice"))?;
    let chat = json!({"model": name, "messages": chat_messages(&body)?});
    let (_, messages) = parse_chat(&serde_json::to_vec(&chat).expect("values serialize"))?;
    let tokens = match template::prompt(&messages) {
        PromptInput::Multimodal { text, images } => {
            crate::generate::multimodal_tokens(&state, &text, &images, false)?
        }
        PromptInput::Text(text) => {
            state.tokenizer.encode(&text, false).map_err(|e| ApiError::internal(e.to_string()))?
        }
        PromptInput::Ids(ids) => ids,
    };
    let n = tokens.len();
    Ok((
        StatusCode::OK,
        axum::Json(json!({"input_tokens": n, "context_management": {"original_input_tokens": n}})),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> Option<String> {
        to_chat(body.as_bytes()).err().and_then(|e| e.param)
    }

    #[test]
    fn a_messages_request_becomes_the_chat_request_vllm_runs() {
        let (chat, stream) = to_chat(
            br#"{"model":"m","max_tokens":5,"stream":true,"stop_sequences":["END"],"temperature":0.2,"top_k":3,
                 "system":[{"type":"text","text":"be "},{"type":"text","text":"brief","cache_control":{"type":"ephemeral"}}],
                 "messages":[{"role":"user","content":[{"type":"text","text":"hi"},
                              {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]},
                             {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
                             {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"42"}]}],
                 "tools":[{"name":"f","input_schema":{"properties":{}}}],"tool_choice":{"type":"tool","name":"f"}}"#,
        )
        .unwrap();
        assert!(stream);
        assert_eq!(chat["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(chat["messages"][1]["content"][1]["image_url"]["url"], "data:image/png;base64,AAAA");
        assert_eq!(chat["messages"][2]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(chat["messages"][3], json!({"role": "tool", "tool_call_id": "t1", "content": "42"}));
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["stream_options"], json!({"include_usage": true, "continuous_usage_stats": true}));
        assert_eq!(chat["tools"][0]["function"]["parameters"]["type"], "object");
        assert_eq!(chat["tool_choice"], json!({"type": "function", "function": {"name": "f"}}));
        let (generation, messages) = parse_chat(&serde_json::to_vec(&chat).unwrap()).unwrap();
        assert_eq!((generation.max_tokens, generation.stop.strings.clone()), (5, vec!["END".to_string()]));
        assert_eq!(messages[1].images.len(), 1);
    }

    #[test]
    fn unsupported_and_malformed_fields_are_refused_by_name() {
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        for (body, field) in [
            (format!(r#"{{"model":"m",{m}}}"#), "max_tokens"),
            (format!(r#"{{"model":"m","max_tokens":0,{m}}}"#), "max_tokens"),
            (format!(r#"{{"max_tokens":1,{m}}}"#), "model"),
            (format!(r#"{{"model":"m","max_tokens":1,{m},"thinking":{{"type":"enabled"}}}}"#), "thinking"),
            (format!(r#"{{"model":"m","max_tokens":1,{m},"service_tier":"auto"}}"#), "service_tier"),
            (format!(r#"{{"model":"m","max_tokens":1,{m},"stop_sequences":"x"}}"#), "stop_sequences"),
            (format!(r#"{{"model":"m","max_tokens":1,{m},"temperature":3}}"#), "temperature"),
            (format!(r#"{{"model":"m","max_tokens":1,{m},"tool_choice":{{"type":"tool"}}}}"#), "tool_choice.name"),
            (format!(r#"{{"model":"m","max_tokens":1,{m},"tools":[{{"name":"f","type":"web_search_20250305"}}]}}"#), "tools[0].type"),
            (r#"{"model":"m","max_tokens":1,"messages":[]}"#.into(), "messages"),
            (r#"{"model":"m","max_tokens":1,"messages":[{"role":"bot","content":"x"}]}"#.into(), "messages[0].role"),
            (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}"#.into(),
                "messages[0].content[0]",
            ),
            (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"a","citations":[{}]}]}]}"#.into(),
                "messages[0].content[0].citations",
            ),
            (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file"}}]}]}"#.into(),
                "messages[0].content[0].source",
            ),
        ] {
            assert_eq!(param(&body).as_deref(), Some(field), "{body}");
        }
        assert!(to_chat(b"[1]").is_err() && to_chat(b"{").unwrap_err().message.contains("malformed JSON"));
    }

    #[test]
    fn chat_completions_become_messages_with_anthropic_stop_reasons() {
        let chat = json!({"id": "chatcmpl-1", "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop", "stop_reason": "END"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
        let m = message(&chat);
        assert_eq!(m["type"], "message");
        assert_eq!(m["content"], json!([{"type": "text", "text": "ok"}]));
        assert_eq!(
            (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
            (Some("stop_sequence"), Some("END"))
        );
        assert_eq!(m["usage"], json!({"input_tokens": 3, "output_tokens": 1}));
        assert_eq!(stop_reason(&json!("length"), &Value::Null).0, "max_tokens");
        assert_eq!(stop_reason(&json!("stop"), &json!(7)).0, "end_turn");
        let e = AnthropicError(ApiError::invalid_field("max_tokens", "max_tokens: required")).body();
        assert_eq!(
            e,
            json!({"type": "error", "error": {"type": "BadRequestError", "message": "max_tokens: required"}})
        );
    }
}
