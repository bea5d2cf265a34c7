//! `POST /inference/v1/generate`: vLLM's tokens-in/tokens-out route (the disaggregated
//! serving front's). The prompt is token ids, the sampling parameters are vLLM's engine
//! `SamplingParams` object, and the answer is the generated token ids: the request runs the
//! completions path (same engine submission, context checks, stop rules, P/D transfer)
//! with the ids collected, and its output is rewritten into vLLM's `GenerateResponse` /
//! `GenerateStreamResponse` shapes.
//!
//! Each sampling parameter either acts as on `/v1/completions` or is refused by name.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::api::sse::{self, Frame};
use crate::error::ApiError;
use crate::generate::{generate, Prepared};
use crate::openai::fields;
use crate::openai::request::{Generation, PromptInput, DEFAULT_MAX_TOKENS};
use crate::openai::response::Endpoint;
use crate::output::stop::{StopRules, MAX_STOP_STRINGS};
use crate::pd::KvTransfer;
use crate::state::{body, request_id, AppState};

/// Top-level fields of a generate request; anything else is refused by name.
const FIELDS: &[&str] = &[
    "request_id",
    "token_ids",
    "sampling_params",
    "model",
    "stream",
    "stream_options",
    "priority",
    "features",
    "cache_salt",
    "kv_transfer_params",
];

/// `sampling_params` that act as on `/v1/completions`; the knobs that only shape a real
/// model's distribution are validated and, as there, have nothing to shape.
const SAMPLING: &[&str] = &[
    "n",
    "max_tokens",
    "min_tokens",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "include_stop_str_in_output",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "extra_args",
    "logprobs",
    "prompt_logprobs",
    "flat_logprobs",
];

/// Most prompt token ids one request may carry (the body limit bounds it too).
pub const MAX_PROMPT_IDS: usize = 1 << 22;

/// A validated generate request.
#[derive(Debug)]
pub struct Parsed {
    /// What the completions path runs.
    pub generation: Generation,
    /// The prompt ids.
    pub tokens: Vec<u32>,
    /// The body's `request_id`, when given.
    pub request_id: Option<String>,
}

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_field(field, format!("{field}: {message}"))
}

fn number(sp: &Map<String, Value>, name: &str, ok: fn(f64) -> bool, range: &str) -> Result<(), ApiError> {
    let field = format!("sampling_params.{name}");
    match sp.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(v) => match v.as_f64() {
            Some(x) if ok(x) => Ok(()),
            _ => Err(bad(&field, format!("expected a number {range}, got {v}"))),
        },
    }
}

fn flag(sp: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match sp.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(&format!("sampling_params.{name}"), format!("expected a boolean, got {v}"))),
    }
}

fn count(sp: &Map<String, Value>, name: &str, min: u64) -> Result<Option<u32>, ApiError> {
    match sp.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().filter(|&n| n >= min).and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(bad(
                &format!("sampling_params.{name}"),
                format!("expected an integer between {min} and {}, got {v}", u32::MAX),
            )),
        },
    }
}

/// The `kv_transfer_params` a request carries: top level (as the chat and completions
/// routes take them) or in `sampling_params.extra_args` (where vLLM's connector reads
/// them), not both.
fn kv_transfer(top: Option<&Value>, extra: Option<&Value>) -> Result<KvTransfer, ApiError> {
    let top = top.filter(|v| !v.is_null());
    let extra = extra.filter(|v| !v.is_null());
    let params = match (top, extra) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "kv_transfer_params",
                "given both at the top level and in sampling_params.extra_args; send one",
            ))
        }
        (Some(p), None) | (None, Some(p)) => p,
        (None, None) => return Ok(KvTransfer::None),
    };
    KvTransfer::from_request(&json!({ "kv_transfer_params": params }))
}

/// Parses a generate body.
pub fn parse(bytes: &[u8]) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let Value::Object(body) = value else {
        return Err(ApiError::bad_request("request body: expected a JSON object"));
    };
    if let Some(unknown) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(
            unknown,
            format!("unsupported field for /inference/v1/generate (supported: {})", FIELDS.join(", ")),
        ));
    }
    let tokens = match body.get("token_ids") {
        None | Some(Value::Null) => return Err(bad("token_ids", "required (a list of prompt token ids)")),
        Some(Value::Array(ids)) if ids.is_empty() => return Err(bad("token_ids", "must not be empty")),
        Some(Value::Array(ids)) if ids.len() > MAX_PROMPT_IDS => {
            return Err(bad("token_ids", format!("at most {MAX_PROMPT_IDS} ids, got {}", ids.len())))
        }
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| {
                v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    bad("token_ids", format!("token ids must be integers in 0..2^32 (no negatives), got {v}"))
                })
            })
            .collect::<Result<Vec<u32>, _>>()?,
        Some(v) => return Err(bad("token_ids", format!("expected a list of token ids, got {v}"))),
    };
    let sp = match body.get("sampling_params") {
        Some(Value::Object(sp)) => sp,
        None | Some(Value::Null) => {
            return Err(bad("sampling_params", "required (an object; {} for defaults)"))
        }
        Some(v) => return Err(bad("sampling_params", format!("expected an object, got {v}"))),
    };
    if let Some(unknown) = sp.keys().find(|k| !SAMPLING.contains(&k.as_str())) {
        return Err(bad(
            &format!("sampling_params.{unknown}"),
            format!("not simulated by mocker (supported: {})", SAMPLING.join(", ")),
        ));
    }
    for (name, why) in [
        ("logprobs", "log-probabilities are not simulated on this route"),
        ("prompt_logprobs", "prompt log-probabilities are not simulated"),
    ] {
        if sp.get(name).is_some_and(|v| !v.is_null()) {
            return Err(bad(&format!("sampling_params.{name}"), why));
        }
    }
    flag(sp, "flat_logprobs")?;
    number(sp, "temperature", |x| x >= 0.0, ">= 0")?;
    number(sp, "top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
    number(sp, "min_p", |x| (0.0..=1.0).contains(&x), "in [0, 1]")?;
    number(sp, "presence_penalty", |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")?;
    number(sp, "frequency_penalty", |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")?;
    number(sp, "repetition_penalty", |x| x > 0.0, "> 0")?;
    match sp.get("top_k") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_i64().is_some_and(|k| k >= -1) => {}
        Some(v) => {
            return Err(bad(
                "sampling_params.top_k",
                format!("expected -1, 0 or a positive integer, got {v}"),
            ))
        }
    }
    for name in ["skip_special_tokens", "spaces_between_special_tokens"] {
        flag(sp, name)?;
    }
    let detokenize = flag(sp, "detokenize")?.unwrap_or(true);
    let strings =
        crate::openai::request::stop_strings("sampling_params.stop", sp.get("stop").unwrap_or(&Value::Null))?;
    if !detokenize && !strings.is_empty() {
        return Err(bad("sampling_params.stop", "stop strings are only supported when detokenize is true"));
    }
    let stop_token_ids = match sp.get("stop_token_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) if ids.len() <= MAX_STOP_STRINGS => ids
            .iter()
            .map(|v| {
                v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                    bad("sampling_params.stop_token_ids", format!("expected token ids, got {v}"))
                })
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(bad(
                "sampling_params.stop_token_ids",
                format!("expected a list of at most {MAX_STOP_STRINGS} token ids, got {v}"),
            ))
        }
    };
    let extra = match sp.get("extra_args") {
        None | Some(Value::Null) => None,
        Some(Value::Object(extra)) => {
            if let Some(other) = extra.keys().find(|k| *k != "kv_transfer_params") {
                return Err(bad(
                    &format!("sampling_params.extra_args.{other}"),
                    "extra_args feed custom logits processors, which are not simulated (only \
                     kv_transfer_params is read)",
                ));
            }
            extra.get("kv_transfer_params")
        }
        Some(v) => return Err(bad("sampling_params.extra_args", format!("expected an object, got {v}"))),
    };
    let max_tokens = count(sp, "max_tokens", 1)?;
    let min_tokens = count(sp, "min_tokens", 0)?.unwrap_or(0);
    if let Some(max) = max_tokens {
        if min_tokens > max {
            return Err(bad(
                "sampling_params.min_tokens",
                format!("min_tokens ({min_tokens}) must be less than or equal to max_tokens ({max})"),
            ));
        }
    }
    let seed = match sp.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64().ok_or_else(|| bad("sampling_params.seed", format!("expected an integer, got {v}")))?
                as u64,
        ),
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad("stream", format!("expected a boolean, got {v}"))),
    };
    let (include_usage, continuous_usage) = match body.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(o)) => {
            if let Some(other) =
                o.keys().find(|k| !["include_usage", "continuous_usage_stats"].contains(&k.as_str()))
            {
                return Err(bad(
                    &format!("stream_options.{other}"),
                    "unsupported (include_usage, continuous_usage_stats)",
                ));
            }
            let get = |k: &str| match o.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(v) => Err(bad(&format!("stream_options.{k}"), format!("expected a boolean, got {v}"))),
            };
            // As vLLM: given options include the usage frame unless they say otherwise.
            (get("include_usage")?.unwrap_or(true), get("continuous_usage_stats")?.unwrap_or(false))
        }
        Some(v) => return Err(bad("stream_options", format!("expected an object, got {v}"))),
    };
    if body.get("features").is_some_and(|v| !v.is_null()) {
        return Err(bad("features", "multimodal features are not simulated; send text-only token ids"));
    }
    if body.get("cache_salt").is_some_and(|v| !v.is_null()) {
        return Err(bad("cache_salt", "prefix-cache salts are not simulated"));
    }
    match body.get("priority") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_i64() == Some(0) => {}
        Some(v) => {
            return Err(bad(
                "priority",
                format!("{v}: priority scheduling is not enabled on this server (only 0)"),
            ))
        }
    }
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => return Err(bad("model", format!("expected a string, got {v}"))),
    };
    let request_id = match body.get("request_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Some(s.clone()),
        Some(v) => {
            return Err(bad(
                "request_id",
                format!("expected a non-empty string of at most 256 bytes, got {v}"),
            ))
        }
    };
    let generation = Generation {
        model,
        max_tokens: max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        max_tokens_given: max_tokens.is_some(),
        stream,
        include_usage,
        continuous_usage,
        add_special_tokens: false,
        seed,
        stop: StopRules {
            strings,
            token_ids: stop_token_ids,
            min_tokens,
            include_stop: flag(sp, "include_stop_str_in_output")?.unwrap_or(false),
        },
        echo: false,
        // Without max_tokens vLLM fills the room the context leaves; the simulated model
        // writes its end-of-sequence where its output-length distribution says.
        default_to_context: true,
        ignore_eos: flag(sp, "ignore_eos")?.unwrap_or(false),
        n: fields::n(sp.get("n").unwrap_or(&Value::Null)).map_err(|e| bad("sampling_params.n", e.message))?,
        logprobs: None,
        structured: None,
        tools: None,
        kv_transfer: kv_transfer(body.get("kv_transfer_params"), extra)?,
        token_ids: true,
    };
    Ok(Parsed { generation, tokens, request_id })
}

/// One completions choice as a generate choice.
fn choice(c: &Value, streamed: bool) -> Value {
    let mut out = json!({
        "index": c["index"],
        "logprobs": null,
        "finish_reason": c["finish_reason"],
        "token_ids": c.get("token_ids").cloned().unwrap_or_else(|| json!([])),
    });
    if !streamed {
        out["routed_experts"] = Value::Null;
    }
    out
}

/// The completions body rewritten as vLLM's `GenerateResponse`.
fn full_body(completion: &Value, id: &str) -> Value {
    let choices: Vec<Value> = completion["choices"]
        .as_array()
        .map(|cs| cs.iter().map(|c| choice(c, false)).collect())
        .unwrap_or_default();
    json!({
        "request_id": id,
        "choices": choices,
        "prompt_logprobs": null,
        "kv_transfer_params": completion.get("kv_transfer_params").cloned().unwrap_or(Value::Null),
    })
}

/// One completions stream frame rewritten as `GenerateStreamResponse` frames.
fn stream_frame(data: &[u8], id: &str, out: &mut Vec<u8>) {
    let push = |out: &mut Vec<u8>, v: &Value| {
        out.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut *out, v).expect("values serialize");
        out.extend_from_slice(b"\n\n");
    };
    if data == b"[DONE]" {
        out.extend_from_slice(b"data: [DONE]\n\n");
        return;
    }
    let Ok(chunk) = serde_json::from_slice::<Value>(data) else { return };
    if chunk.get("error").is_some() {
        push(out, &chunk);
        return;
    }
    let choices = chunk["choices"].as_array().map(Vec::as_slice).unwrap_or_default();
    let usage = chunk.get("usage").cloned().unwrap_or(Value::Null);
    if choices.is_empty() {
        let mut frame = json!({"request_id": id, "choices": [], "usage": usage});
        if let Some(params) = chunk.get("kv_transfer_params") {
            frame["kv_transfer_params"] = params.clone();
        }
        push(out, &frame);
        return;
    }
    // As vLLM: an output that adds no token (text held back, a cut-short end) sends nothing.
    let choices: Vec<Value> = choices
        .iter()
        .filter(|c| c["token_ids"].as_array().is_some_and(|ids| !ids.is_empty()))
        .map(|c| choice(c, true))
        .collect();
    if !choices.is_empty() {
        push(out, &json!({"request_id": id, "choices": choices, "usage": usage}));
    }
}

/// `POST /inference/v1/generate`.
pub async fn generate_tokens(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let header_id = request_id(&request);
    let bytes = body(&state, request).await?;
    let Parsed { generation, tokens, request_id: body_id } = parse(&bytes)?;
    drop(bytes);
    let base = header_id.or(body_id).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let id = format!("generate-tokens-{base}");
    let stream = generation.stream;
    let prepared = Prepared {
        endpoint: Endpoint::Completions,
        generation,
        prompt: PromptInput::Ids(tokens),
        request_id: Some(base),
        replay_key: None,
    };
    let response = generate(state.clone(), prepared, arrived).await?;
    if stream {
        return Ok(sse::reframe(response, move |frame, out| {
            if let Frame::Data(data) = frame {
                stream_frame(data, &id, out);
            }
        }));
    }
    let (parts, body) = response.into_parts();
    let completion: Value = serde_json::from_slice(&sse::whole(Response::new(body), usize::MAX).await?)
        .map_err(|e| ApiError::internal(format!("the generated response is not JSON: {e}")))?;
    Ok(sse::json_like(parts, full_body(&completion, &id).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> Option<String> {
        parse(body.as_bytes()).err().and_then(|e| e.param)
    }

    #[test]
    fn sampling_params_act_as_on_completions() {
        let p = parse(
            br#"{"token_ids":[5,6,7],"sampling_params":{"max_tokens":9,"min_tokens":2,"n":3,"seed":-4,
                 "stop":["x"],"stop_token_ids":[11],"ignore_eos":true,"temperature":0,"top_k":-1,
                 "include_stop_str_in_output":true},"stream":true,"stream_options":{},"request_id":"r1"}"#,
        )
        .unwrap();
        let g = &p.generation;
        assert_eq!(p.tokens, vec![5, 6, 7]);
        assert_eq!((g.max_tokens, g.max_tokens_given, g.n, g.seed), (9, true, 3, Some(-4i64 as u64)));
        assert_eq!(
            (g.stop.strings.clone(), g.stop.token_ids.clone(), g.stop.min_tokens),
            (vec!["x".into()], vec![11], 2)
        );
        assert!(g.stop.include_stop && g.ignore_eos && g.token_ids && g.stream);
        // Given stream_options include the usage frame unless they say otherwise, as vLLM.
        assert!(g.include_usage && !g.continuous_usage);
        assert_eq!(p.request_id.as_deref(), Some("r1"));
        let d = parse(br#"{"token_ids":[1],"sampling_params":{}}"#).unwrap().generation;
        assert!(!d.max_tokens_given && d.default_to_context && !d.include_usage);
    }

    #[test]
    fn refusals_name_the_field() {
        for (body, field) in [
            (r#"{"sampling_params":{}}"#, "token_ids"),
            (r#"{"token_ids":[],"sampling_params":{}}"#, "token_ids"),
            (r#"{"token_ids":[1,-2],"sampling_params":{}}"#, "token_ids"),
            (r#"{"token_ids":[1]}"#, "sampling_params"),
            (r#"{"token_ids":[1],"sampling_params":[]}"#, "sampling_params"),
            (r#"{"token_ids":[1],"sampling_params":{},"prompt":"x"}"#, "prompt"),
            (r#"{"token_ids":[1],"sampling_params":{"logit_bias":{"1":2}}}"#, "sampling_params.logit_bias"),
            (r#"{"token_ids":[1],"sampling_params":{"logprobs":1}}"#, "sampling_params.logprobs"),
            (r#"{"token_ids":[1],"sampling_params":{"max_tokens":0}}"#, "sampling_params.max_tokens"),
            (r#"{"token_ids":[1],"sampling_params":{"n":0}}"#, "sampling_params.n"),
            (r#"{"token_ids":[1],"sampling_params":{"top_p":0}}"#, "sampling_params.top_p"),
            (r#"{"token_ids":[1],"sampling_params":{"temperature":"hot"}}"#, "sampling_params.temperature"),
            (
                r#"{"token_ids":[1],"sampling_params":{"max_tokens":2,"min_tokens":3}}"#,
                "sampling_params.min_tokens",
            ),
            (
                r#"{"token_ids":[1],"sampling_params":{"stop":"x","detokenize":false}}"#,
                "sampling_params.stop",
            ),
            (
                r#"{"token_ids":[1],"sampling_params":{"extra_args":{"foo":1}}}"#,
                "sampling_params.extra_args.foo",
            ),
            (r#"{"token_ids":[1],"sampling_params":{},"priority":3}"#, "priority"),
            (r#"{"token_ids":[1],"sampling_params":{},"cache_salt":"s"}"#, "cache_salt"),
            (r#"{"token_ids":[1],"sampling_params":{},"features":{"mm_hashes":{}}}"#, "features"),
            (r#"{"token_ids":[1],"sampling_params":{},"stream_options":{"x":true}}"#, "stream_options.x"),
            (
                r#"{"token_ids":[1],"sampling_params":{"extra_args":{"kv_transfer_params":{"do_remote_decode":true}}},"kv_transfer_params":{"do_remote_decode":true}}"#,
                "kv_transfer_params",
            ),
        ] {
            assert_eq!(param(body).as_deref(), Some(field), "{body}");
        }
        assert!(parse(b"{nope").unwrap_err().message.contains("malformed JSON"));
    }

    #[test]
    fn kv_transfer_params_are_read_at_the_top_or_in_extra_args() {
        for body in [
            r#"{"token_ids":[1],"sampling_params":{},"kv_transfer_params":{"do_remote_decode":true}}"#,
            r#"{"token_ids":[1],"sampling_params":{"extra_args":{"kv_transfer_params":{"do_remote_decode":true}}}}"#,
        ] {
            assert_eq!(parse(body.as_bytes()).unwrap().generation.kv_transfer, KvTransfer::Prefill, "{body}");
        }
    }

    #[test]
    fn completions_output_becomes_vllm_generate_shapes() {
        let completion = json!({"id": "cmpl-x", "object": "text_completion", "choices": [
            {"index": 0, "text": "ab", "logprobs": null, "finish_reason": "length", "stop_reason": null, "token_ids": [4, 5]}
        ], "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}});
        let body = full_body(&completion, "generate-tokens-r");
        assert_eq!(body["request_id"], "generate-tokens-r");
        assert_eq!(body["choices"][0]["token_ids"], json!([4, 5]));
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert!(body["choices"][0]["routed_experts"].is_null() && body["kv_transfer_params"].is_null());
        assert!(body.get("usage").is_none(), "vLLM's GenerateResponse has no usage");
        let mut out = Vec::new();
        let chunk = br#"{"id":"c","choices":[{"index":1,"text":"","finish_reason":null,"token_ids":[9]}],"usage":null}"#;
        stream_frame(chunk, "g", &mut out);
        let empty = br#"{"id":"c","choices":[{"index":0,"text":"","finish_reason":"stop","token_ids":[]}]}"#;
        stream_frame(empty, "g", &mut out);
        stream_frame(br#"{"id":"c","choices":[],"usage":{"prompt_tokens":1}}"#, "g", &mut out);
        stream_frame(b"[DONE]", "g", &mut out);
        let text = String::from_utf8(out).unwrap();
        let frames: Vec<&str> = text.split("\n\n").filter(|f| !f.is_empty()).collect();
        assert_eq!(frames.len(), 3, "{text}");
        let first: Value = serde_json::from_str(frames[0].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(
            first,
            json!({"request_id": "g", "choices": [{"index": 1, "logprobs": null, "finish_reason": null, "token_ids": [9]}], "usage": null})
        );
        assert!(frames[1].contains(r#""choices":[],"usage":{"prompt_tokens":1}"#));
        assert_eq!(frames[2], "data: [DONE]");
    }
}
