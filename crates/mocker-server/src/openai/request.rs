//! Request bodies of `/v1/completions` and `/v1/chat/completions`, parsed leniently the way
//! vLLM does (unknown fields ignored, `max_tokens` and `max_completion_tokens` both taken)
//! and validated into one [`Generation`] with errors that name the field.

use crate::output::stop::{check_stop_strings, too_many_stop_strings};
use crate::pd::KvTransfer;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::openai::fields::{self, Structured, Tools};
use crate::output::logprobs::LogprobsShape;
use crate::output::stop::StopRules;

/// Output length when the client sets none (the OpenAI completions default).
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// `stream_options` as vLLM accepts it.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` and empty `choices`.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// vLLM extension: `usage` on every chunk.
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// Fields both endpoints share. Sampling knobs that only shape a real model's distribution
/// (temperature, top_p, penalties, ...) are accepted: the simulated model has no
/// distribution to shape. Fields whose effect mocker does not produce are refused, see
/// [`refuse_unsupported`].
#[derive(Debug, Default, Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    min_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    include_stop_str_in_output: Option<bool>,
}

/// The prompt as the client gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// Text to tokenize.
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
    /// Chat text with images: each image becomes `--image-tokens` ids at its byte offset.
    Multimodal {
        /// The rendered text.
        text: String,
        /// (byte offset in `text`, URL or data URL) of each image, in order.
        images: Vec<(usize, String)>,
    },
}

/// One chat message reduced to what the prompt needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// Text content (parts concatenated).
    pub content: String,
    /// Images, as (byte offset in `content` where the image stands, its URL or data URL).
    pub images: Vec<(usize, String)>,
}

/// What the client asked for, validated, before tokenization.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Model named in the request, if any.
    pub model: Option<String>,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Whether the client set an output length (otherwise the default applies, clipped to
    /// the context window the way vLLM clips it).
    pub max_tokens_given: bool,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Final usage chunk when streaming.
    pub include_usage: bool,
    /// Usage on every chunk when streaming.
    pub continuous_usage: bool,
    /// Whether the tokenizer adds special tokens to a text prompt.
    pub add_special_tokens: bool,
    /// Sampling seed: the same seed and prompt give the same output.
    pub seed: Option<u64>,
    /// `stop`, `stop_token_ids`, `min_tokens`, `include_stop_str_in_output`.
    pub stop: StopRules,
    /// `echo` (completions): the prompt text leads the output text.
    pub echo: bool,
    /// Without an output length, run to the end of the context (chat, as vLLM does)
    /// instead of the completions default of 16.
    pub default_to_context: bool,
    /// `ignore_eos`: the simulated model never writes its end-of-sequence token, so an
    /// output without a length runs to the context instead of ending at a drawn length.
    pub ignore_eos: bool,
    /// `n`: choices generated from the one prompt.
    pub n: u32,
    /// `logprobs` / `top_logprobs`, when asked.
    pub logprobs: Option<LogprobsShape>,
    /// `response_format` other than text.
    pub structured: Option<Structured>,
    /// `tools` that may be called (chat).
    pub tools: Option<Tools>,
    /// `kv_transfer_params`: a disaggregated prefill or decode (see [`crate::pd`]).
    pub kv_transfer: KvTransfer,
    /// Collect each choice's generated token ids into its choice (`token_ids`), as vLLM's
    /// tokens-in/tokens-out route answers; set by that route, never by a completions body.
    pub token_ids: bool,
}

/// The body as a JSON object, and the fields both endpoints share.
fn parse(body: &[u8]) -> Result<(Value, Common), ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(format!(
            "request body: expected a JSON object, got {}",
            kind(&value)
        )));
    }
    let common = serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        ApiError::invalid_field(&path, format!("{path}: {}", e.into_inner()))
    })?;
    Ok((value, common))
}

fn count(field: &str, value: Option<i64>, min: i64) -> Result<Option<u32>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v < min || v > i64::from(u32::MAX) => Err(ApiError::invalid_field(
            field,
            format!("{field} must be between {min} and {}, got {v}", u32::MAX),
        )),
        Some(v) => Ok(Some(v as u32)),
    }
}

impl Common {
    fn into_generation(self, output_field: &str) -> Result<Generation, ApiError> {
        let max_tokens = count("max_tokens", self.max_tokens, 1)?;
        let max_completion = count("max_completion_tokens", self.max_completion_tokens, 1)?;
        // Chat clients send max_completion_tokens, completion clients max_tokens; the newer
        // field wins when both appear, as in vLLM.
        let given = max_completion.or(max_tokens);
        let min_tokens = count("min_tokens", self.min_tokens, 0)?.unwrap_or(0);
        let max = given.unwrap_or(DEFAULT_MAX_TOKENS);
        if given.is_some() && min_tokens > max {
            return Err(ApiError::invalid_field(
                "min_tokens",
                format!("min_tokens ({min_tokens}) must be less than or equal to {output_field} ({max})"),
            ));
        }
        let options = self.stream_options.unwrap_or_default();
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid_field(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ));
        }
        Ok(Generation {
            model: self.model,
            max_tokens: max,
            max_tokens_given: given.is_some(),
            stream,
            include_usage: options.include_usage.unwrap_or(false),
            continuous_usage: options.continuous_usage_stats.unwrap_or(false),
            add_special_tokens: self.add_special_tokens.unwrap_or(true),
            // Negative seeds are valid in vLLM (any 64-bit integer); their bits key the draws.
            seed: self.seed.map(|s| s as u64),
            stop: StopRules {
                strings: Vec::new(),
                token_ids: self.stop_token_ids.unwrap_or_default(),
                min_tokens,
                include_stop: self.include_stop_str_in_output.unwrap_or(false),
            },
            echo: false,
            default_to_context: false,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            n: 1,
            logprobs: None,
            structured: None,
            tools: None,
            kv_transfer: KvTransfer::None,
            token_ids: false,
        })
    }
}

/// Parses a `/v1/completions` body.
pub fn parse_completion(body: &[u8]) -> Result<(Generation, PromptInput), ApiError> {
    let (value, common) = parse(body)?;
    let prompt = prompt_input(&value["prompt"])?;
    refuse_unsupported(&value, COMPLETION_REFUSED)?;
    let mut generation = common.into_generation("max_tokens")?;
    generation.stop.strings = stop_strings("stop", &value["stop"])?;
    generation.n = fields::n(&value["n"])?;
    generation.logprobs = fields::completion_logprobs(&value["logprobs"])?;
    generation.structured = fields::response_format(&value["response_format"])?;
    generation.kv_transfer = KvTransfer::from_request(&value)?;
    generation.echo = match &value["echo"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        other => {
            return Err(ApiError::invalid_field(
                "echo",
                format!("echo: expected a boolean, got {}", kind(other)),
            ))
        }
    };
    Ok((generation, prompt))
}

/// Parses a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8]) -> Result<(Generation, Vec<ChatMessage>), ApiError> {
    let (value, common) = parse(body)?;
    let messages = chat_messages(&value["messages"])?;
    refuse_unsupported(&value, CHAT_REFUSED)?;
    let mut generation = common.into_generation("max_completion_tokens")?;
    generation.stop.strings = stop_strings("stop", &value["stop"])?;
    generation.n = fields::n(&value["n"])?;
    generation.logprobs = fields::chat_logprobs(&value["logprobs"], &value["top_logprobs"])?;
    generation.structured = fields::response_format(&value["response_format"])?;
    generation.tools = fields::tools(&value["tools"], &value["tool_choice"])?;
    generation.kv_transfer = KvTransfer::from_request(&value)?;
    // The chat template already carries the special tokens.
    generation.add_special_tokens = false;
    generation.default_to_context = true;
    Ok((generation, messages))
}

/// `stop` (named `field` in errors): a string, a list of strings, or null, within the
/// stop-string bounds.
pub(crate) fn stop_strings(field: &str, value: &Value) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::invalid_field(
            field,
            format!("{field}: expected a string or a list of strings, got {value}"),
        )
    };
    let strings: Vec<String> = match value {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => {
            if let Some(why) = too_many_stop_strings(items.len()) {
                return Err(ApiError::invalid_field(field, format!("{field}: {why}")));
            }
            items.iter().map(|v| v.as_str().map(str::to_string).ok_or_else(bad)).collect::<Result<_, _>>()?
        }
        _ => return Err(bad()),
    };
    check_stop_strings(&strings).map_err(|why| ApiError::invalid_field(field, format!("{field}: {why}")))?;
    Ok(strings)
}

/// A field mocker does not simulate, and which of its values are harmless.
struct Refused {
    field: &'static str,
    /// Values that ask for nothing (absent, null, false, empty, the default).
    harmless: fn(&Value) -> bool,
    why: &'static str,
}

fn off(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

const COMMON_REFUSED: &[Refused] = &[
    Refused { field: "logit_bias", harmless: off, why: "token biases are not simulated" },
    Refused { field: "prompt_logprobs", harmless: off, why: "prompt log-probabilities are not simulated" },
    Refused { field: "allowed_token_ids", harmless: off, why: "token restrictions are not simulated" },
    Refused { field: "bad_words", harmless: off, why: "token restrictions are not simulated" },
    Refused {
        field: "guided_json",
        harmless: off,
        why: "vLLM's guided fields are not simulated; send response_format",
    },
    Refused {
        field: "guided_regex",
        harmless: off,
        why: "vLLM's guided fields are not simulated; send response_format",
    },
    Refused {
        field: "guided_choice",
        harmless: off,
        why: "vLLM's guided fields are not simulated; send response_format",
    },
    Refused {
        field: "guided_grammar",
        harmless: off,
        why: "vLLM's guided fields are not simulated; send response_format",
    },
    Refused {
        field: "structured_outputs",
        harmless: off,
        why: "vLLM's guided fields are not simulated; send response_format",
    },
];

const COMPLETION_REFUSED: &[Refused] = &[
    Refused { field: "suffix", harmless: off, why: "suffix is not supported (as in vLLM)" },
    Refused {
        field: "best_of",
        harmless: |v| off(v) || v.as_u64() == Some(1),
        why: "best_of > 1 is not supported",
    },
];

const CHAT_REFUSED: &[Refused] = &[
    Refused {
        field: "functions",
        harmless: off,
        why: "the deprecated functions field is not simulated; send tools",
    },
    Refused {
        field: "function_call",
        harmless: |v| off(v) || v.as_str() == Some("none"),
        why: "the deprecated function_call field is not simulated; send tool_choice",
    },
    Refused { field: "echo", harmless: off, why: "chat echo is not simulated" },
    Refused { field: "audio", harmless: off, why: "audio output is not simulated" },
];

/// Refuses (HTTP 400 naming the field) what the request asks for that mocker would
/// otherwise silently not do.
fn refuse_unsupported(value: &Value, endpoint: &[Refused]) -> Result<(), ApiError> {
    for r in COMMON_REFUSED.iter().chain(endpoint) {
        let Some(v) = value.get(r.field) else { continue };
        if (r.harmless)(v) {
            continue;
        }
        return Err(ApiError::invalid_field(r.field, format!("{}: {}", r.field, r.why)));
    }
    Ok(())
}

const PROMPT_SHAPES: &str =
    "a string, a list of one string, a list of token ids, or a list of one token-id list";

/// The prompt of a completions request: one string or one token-id list, possibly wrapped in
/// a one-element list (AIPerf sends `["text"]`, vLLM bench `[[ids]]`).
pub fn prompt_input(value: &Value) -> Result<PromptInput, ApiError> {
    let bad =
        |what: &str| ApiError::invalid_field("prompt", format!("prompt: {what}; expected {PROMPT_SHAPES}"));
    let prompt = match value {
        Value::Null => return Err(ApiError::invalid_field("prompt", "prompt is required")),
        Value::String(s) => PromptInput::Text(s.clone()),
        Value::Array(items) if items.is_empty() => PromptInput::Ids(Vec::new()),
        Value::Array(items) if items.iter().all(Value::is_number) => PromptInput::Ids(token_ids(items)?),
        Value::Array(items) if items.len() == 1 => match &items[0] {
            Value::String(s) => PromptInput::Text(s.clone()),
            Value::Array(ids) => PromptInput::Ids(token_ids(ids)?),
            other => return Err(bad(&format!("unexpected element {other}"))),
        },
        Value::Array(items) => {
            return Err(bad(&format!("{} prompts in one request are not supported", items.len())));
        }
        other => return Err(bad(&format!("got {}", kind(other)))),
    };
    let empty = match &prompt {
        PromptInput::Text(s) | PromptInput::Multimodal { text: s, .. } => s.is_empty(),
        PromptInput::Ids(ids) => ids.is_empty(),
    };
    if empty {
        return Err(ApiError::invalid_field("prompt", "prompt must not be empty"));
    }
    Ok(prompt)
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64().filter(|&id| id <= u64::from(u32::MAX)).map(|id| id as u32).ok_or_else(|| {
                ApiError::invalid_field(
                    "prompt",
                    format!("prompt: token ids must be integers in 0..2^32, got {v}"),
                )
            })
        })
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Chat messages: `content` as a string, as a list of `{"type": "text", "text": ...}` parts,
/// or null (assistant tool calls); extra fields (`name`, ...) ignored.
pub fn chat_messages(value: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let Value::Array(items) = value else {
        return Err(ApiError::invalid_field(
            "messages",
            format!("messages: expected a list, got {}", kind(value)),
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid_field("messages", "messages must not be empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let field = format!("messages[{i}]");
            let Value::Object(map) = m else {
                return Err(ApiError::invalid_field(
                    &field,
                    format!("{field}: expected an object, got {}", kind(m)),
                ));
            };
            let role = match map.get("role") {
                Some(Value::String(r)) => r.clone(),
                _ => return Err(ApiError::invalid_field(&field, format!("{field}.role: expected a string"))),
            };
            let mut images = Vec::new();
            let content = match map.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.iter().enumerate() {
                        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                            (Some("text") | None, Some(t)) => text.push_str(t),
                            (Some("text"), None) => {
                                let at = format!("{field}.content[{j}]");
                                return Err(ApiError::invalid_field(&at, format!("{at}.text: expected a string")));
                            }
                            (Some("image_url"), _) => {
                                let url = part.get("image_url").and_then(|u| u.get("url").or(Some(u))).and_then(Value::as_str);
                                let Some(url) = url.filter(|u| !u.is_empty()) else {
                                    let at = format!("{field}.content[{j}]");
                                    return Err(ApiError::invalid_field(
                                        &at,
                                        format!("{at}.image_url: expected {{\"url\": \"...\"}} with a non-empty URL"),
                                    ));
                                };
                                images.push((text.len(), url.to_string()));
                            }
                            (Some(other), _) => {
                                // Audio, video and other media would need their token counts simulated.
                                let at = format!("{field}.content[{j}]");
                                return Err(ApiError::invalid_field(
                                    &at,
                                    format!("{at}: content parts of type {other:?} are not simulated; send text or image_url parts"),
                                ));
                            }
                            (None, None) => {
                                return Err(ApiError::invalid_field(
                                    &field,
                                    format!("{field}.content[{j}]: expected a part with a \"type\""),
                                ))
                            }
                        }
                    }
                    text
                }
                Some(other) => {
                    return Err(ApiError::invalid_field(
                        &field,
                        format!("{field}.content: expected a string or a list of parts, got {}", kind(other)),
                    ))
                }
            };
            Ok(ChatMessage { role, content, images })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_accepts_every_prompt_shape_clients_send() {
        for (body, want) in [
            (r#"{"prompt":"hi"}"#, PromptInput::Text("hi".into())),
            (r#"{"prompt":["hi"]}"#, PromptInput::Text("hi".into())),
            (r#"{"prompt":[1,2,3]}"#, PromptInput::Ids(vec![1, 2, 3])),
            (r#"{"prompt":[[4,5]]}"#, PromptInput::Ids(vec![4, 5])),
        ] {
            let (_, prompt) = parse_completion(body.as_bytes()).unwrap();
            assert_eq!(prompt, want, "{body}");
        }
    }

    #[test]
    fn max_completion_tokens_wins_and_unknown_fields_are_ignored() {
        let (g, _) = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}],"name":"x"}],
                 "max_tokens":5,"max_completion_tokens":7,"temperature":0.5,"stop":null,"logprobs":false,
                 "stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .unwrap();
        assert_eq!((g.max_tokens, g.stream, g.include_usage), (7, true, true));
        let (g, _) = parse_completion(br#"{"prompt":"x"}"#).unwrap();
        assert_eq!((g.max_tokens, g.max_tokens_given), (DEFAULT_MAX_TOKENS, false));
    }

    #[test]
    fn errors_name_the_field() {
        let cases: [(&[u8], &str); 9] = [
            (br#"{"prompt":"x","max_tokens":0}"#, "max_tokens"),
            (br#"{"prompt":"x","max_tokens":"ten"}"#, "max_tokens"),
            (br#"{"prompt":"x","n":129}"#, "n"),
            (br#"{"prompt":"x","max_tokens":2,"min_tokens":3}"#, "min_tokens"),
            (br#"{"prompt":""}"#, "prompt"),
            (br#"{"prompt":[]}"#, "prompt"),
            (br#"{"prompt":["a","b"]}"#, "prompt"),
            (br#"{"prompt":[-1]}"#, "prompt"),
            (br#"{"max_tokens":3}"#, "prompt"),
        ];
        for (body, field) in cases {
            let err = parse_completion(body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(field), "{}", String::from_utf8_lossy(body));
            assert_eq!(err.status, 400);
        }
        let err = parse_completion(b"{not json").unwrap_err();
        assert!(err.message.contains("malformed JSON"), "{}", err.message);
        let err = parse_chat(br#"{"messages":[]}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        let err = parse_chat(br#"{"messages":[{"content":"x"}]}"#).unwrap_err();
        assert!(err.message.contains("role"), "{}", err.message);
    }
}
