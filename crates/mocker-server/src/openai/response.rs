//! Response bodies and streamed chunks, with vLLM's field names and shapes (load clients
//! check `object` exactly and read `usage` from the trailing chunk).

use serde::Serialize;

/// Which endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl Endpoint {
    /// Prefix of response ids, as vLLM names them.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Self::Completions => "cmpl-",
            Self::Chat => "chatcmpl-",
        }
    }
}

/// Token accounting of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Prompt plus generated tokens.
    pub total_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Prefix-cache detail.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the simulated prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    /// Usage after `completion` generated tokens.
    pub fn new(prompt: usize, completion: usize, cached: usize) -> Self {
        Self {
            prompt_tokens: prompt,
            total_tokens: prompt + completion,
            completion_tokens: completion,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: cached },
        }
    }
}

/// The fixed part of every chunk and body of one response.
#[derive(Debug, Clone)]
pub struct ResponseHeader {
    /// Endpoint.
    pub endpoint: Endpoint,
    /// `cmpl-...` / `chatcmpl-...`.
    pub id: String,
    /// Unix seconds at arrival.
    pub created: u64,
    /// Served model name.
    pub model: String,
}

#[derive(Serialize)]
struct Chunk<'a, C: Serialize> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "UsageField::is_omitted")]
    usage: UsageField,
}

/// `usage` of a chunk: absent when the client did not ask, `null` on content chunks when it did.
enum UsageField {
    Omitted,
    Null,
    Value(Usage),
}

impl UsageField {
    fn is_omitted(&self) -> bool {
        matches!(self, Self::Omitted)
    }
}

impl Serialize for UsageField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Value(u) => u.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<()>,
}

#[derive(Serialize)]
struct ChatDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

#[derive(Serialize)]
struct ChatChunkChoice<'a> {
    index: u32,
    delta: ChatDelta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct ChatMessageOut<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: ChatMessageOut<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
    stop_reason: Option<()>,
}

/// Why generation stopped: the simulation never samples EOS, so always the length limit.
pub const FINISH_REASON: &str = "length";

/// How a stream reports usage, from `stream_options`.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageMode {
    /// A trailing chunk with empty `choices` and the final usage.
    pub include_usage: bool,
    /// Usage on every chunk.
    pub continuous: bool,
}

impl ResponseHeader {
    /// Appends one SSE frame `data: {chunk}\n\n` to `out`, serializing in place.
    fn chunk<C: Serialize>(&self, out: &mut Vec<u8>, choices: C, usage: UsageField) {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        let chunk = Chunk { id: &self.id, object, created: self.created, model: &self.model, choices, usage };
        out.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut *out, &chunk).expect("chunks serialize");
        out.extend_from_slice(b"\n\n");
    }

    fn usage_field(mode: UsageMode, usage: Usage) -> UsageField {
        match (mode.include_usage, mode.continuous) {
            (_, true) => UsageField::Value(usage),
            (true, false) => UsageField::Null,
            (false, false) => UsageField::Omitted,
        }
    }

    /// Appends the chat stream's opening frame (role, empty content), as vLLM sends it.
    pub fn role_frame(&self, out: &mut Vec<u8>, mode: UsageMode, usage: Usage) {
        let choice = ChatChunkChoice {
            index: 0,
            delta: ChatDelta { role: Some("assistant"), content: "" },
            logprobs: None,
            finish_reason: None,
        };
        self.chunk(out, [choice], Self::usage_field(mode, usage))
    }

    /// Appends a content frame; `last` carries the finish reason.
    pub fn content_frame(&self, out: &mut Vec<u8>, text: &str, last: bool, mode: UsageMode, usage: Usage) {
        let finish_reason = last.then_some(FINISH_REASON);
        let usage = Self::usage_field(mode, usage);
        match self.endpoint {
            Endpoint::Completions => self.chunk(
                out,
                [TextChoice { index: 0, text, logprobs: None, finish_reason, stop_reason: None }],
                usage,
            ),
            Endpoint::Chat => self.chunk(
                out,
                [ChatChunkChoice {
                    index: 0,
                    delta: ChatDelta { role: None, content: text },
                    logprobs: None,
                    finish_reason,
                }],
                usage,
            ),
        }
    }

    /// Appends the trailing usage frame (`choices: []`).
    pub fn usage_frame(&self, out: &mut Vec<u8>, usage: Usage) {
        self.chunk::<[(); 0]>(out, [], UsageField::Value(usage))
    }

    /// The whole non-streamed response.
    pub fn body(&self, text: &str, usage: Usage) -> String {
        #[derive(Serialize)]
        struct Body<'a, C: Serialize> {
            id: &'a str,
            object: &'static str,
            created: u64,
            model: &'a str,
            choices: C,
            usage: Usage,
        }
        let (id, created, model) = (self.id.as_str(), self.created, self.model.as_str());
        let out = match self.endpoint {
            Endpoint::Completions => serde_json::to_string(&Body {
                id,
                object: "text_completion",
                created,
                model,
                choices: [TextChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: Some(FINISH_REASON),
                    stop_reason: None,
                }],
                usage,
            }),
            Endpoint::Chat => serde_json::to_string(&Body {
                id,
                object: "chat.completion",
                created,
                model,
                choices: [ChatChoice {
                    index: 0,
                    message: ChatMessageOut { role: "assistant", content: text },
                    logprobs: None,
                    finish_reason: FINISH_REASON,
                    stop_reason: None,
                }],
                usage,
            }),
        };
        out.expect("bodies serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn parse_frame(write: impl FnOnce(&mut Vec<u8>)) -> Value {
        let mut out = Vec::new();
        write(&mut out);
        let text = String::from_utf8(out).unwrap();
        let json = text.strip_prefix("data: ").and_then(|t| t.strip_suffix("\n\n")).expect("one SSE frame");
        serde_json::from_str(json).unwrap()
    }

    fn header(endpoint: Endpoint) -> ResponseHeader {
        ResponseHeader { endpoint, id: "x-1".into(), created: 7, model: "m".into() }
    }

    #[test]
    fn chunks_have_the_objects_clients_dispatch_on() {
        let usage = Usage::new(3, 1, 0);
        let mode = UsageMode { include_usage: true, continuous: false };
        let c = parse_frame(|o| header(Endpoint::Chat).content_frame(o, "a", true, mode, usage));
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["choices"][0]["delta"]["content"], "a");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert!(c["usage"].is_null() && c.as_object().unwrap().contains_key("usage"));
        let t = parse_frame(|o| {
            header(Endpoint::Completions).content_frame(o, "b", false, UsageMode::default(), usage)
        });
        assert_eq!(t["object"], "text_completion");
        assert!(t["choices"][0]["finish_reason"].is_null());
        assert!(!t.as_object().unwrap().contains_key("usage"));
        let u = parse_frame(|o| header(Endpoint::Chat).usage_frame(o, usage));
        assert_eq!(u["choices"].as_array().unwrap().len(), 0);
        assert_eq!(u["usage"]["total_tokens"], 4);
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }

    #[test]
    fn bodies_carry_full_usage() {
        let b: Value =
            serde_json::from_str(&header(Endpoint::Chat).body("hi", Usage::new(10, 2, 4))).unwrap();
        assert_eq!(b["object"], "chat.completion");
        assert_eq!(b["choices"][0]["message"]["content"], "hi");
        assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(b["usage"]["completion_tokens"], 2);
    }
}
