//! Response bodies and streamed chunks, with vLLM's field names and shapes (load clients
//! check `object` exactly and read `usage` from the trailing chunk).

use serde::Serialize;

use crate::output::stop::StopReason;

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
    stop_reason: Option<&'a StopReason>,
}

impl Serialize for StopReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Text(t) => s.serialize_str(t),
            Self::Token(id) => s.serialize_u32(*id),
        }
    }
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// `finish_reason`: `length` or `stop`.
    pub reason: &'static str,
    /// `stop_reason`: the stop string or token that ended it.
    pub stop_reason: Option<StopReason>,
}

impl Finish {
    /// The length limit was reached.
    pub const LENGTH: Finish = Finish { reason: "length", stop_reason: None };

    /// A stop condition ended the output.
    pub fn stopped(why: StopReason) -> Self {
        Self { reason: "stop", stop_reason: Some(why) }
    }
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
    stop_reason: Option<&'a StopReason>,
}

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

    /// The content frames of a stream answered in `mode`, with everything that does not
    /// change between them rendered once.
    pub fn content_frames(&self, mode: UsageMode) -> ContentFrames {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        let mut prefix = Vec::with_capacity(128 + self.id.len() + self.model.len());
        prefix.extend_from_slice(b"data: {\"id\":");
        write_json_str(&mut prefix, &self.id);
        prefix.extend_from_slice(b",\"object\":\"");
        prefix.extend_from_slice(object.as_bytes());
        prefix.extend_from_slice(b"\",\"created\":");
        serde_json::to_writer(&mut prefix, &self.created).expect("integers serialize");
        prefix.extend_from_slice(b",\"model\":");
        write_json_str(&mut prefix, &self.model);
        prefix.extend_from_slice(match self.endpoint {
            Endpoint::Completions => b",\"choices\":[{\"index\":0,\"text\":".as_slice(),
            Endpoint::Chat => b",\"choices\":[{\"index\":0,\"delta\":{\"content\":".as_slice(),
        });
        ContentFrames { endpoint: self.endpoint, mode, prefix }
    }

    /// Appends the trailing usage frame (`choices: []`).
    pub fn usage_frame(&self, out: &mut Vec<u8>, usage: Usage) {
        self.chunk::<[(); 0]>(out, [], UsageField::Value(usage))
    }

    /// The whole non-streamed response.
    pub fn body(&self, text: &str, usage: Usage, finish: &Finish) -> String {
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
                    finish_reason: Some(finish.reason),
                    stop_reason: finish.stop_reason.as_ref(),
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
                    finish_reason: finish.reason,
                    stop_reason: finish.stop_reason.as_ref(),
                }],
                usage,
            }),
        };
        out.expect("bodies serialize")
    }
}

/// Writes the content frames of one stream: the frame's fixed head (id, object, created,
/// model) is rendered once per stream, so a token costs only its text and the tail. The
/// bytes are exactly what serializing the whole chunk gives.
#[derive(Debug, Clone)]
pub struct ContentFrames {
    endpoint: Endpoint,
    mode: UsageMode,
    prefix: Vec<u8>,
}

impl ContentFrames {
    /// Appends a content frame; the last one carries how the choice ended.
    pub fn write(&self, out: &mut Vec<u8>, text: &str, last: Option<&Finish>, usage: Usage) {
        out.extend_from_slice(&self.prefix);
        write_json_str(out, text);
        let tail: &[u8] = match (self.endpoint, last) {
            (Endpoint::Completions, None) => {
                b",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]"
            }
            (Endpoint::Completions, Some(Finish { reason: "length", stop_reason: None })) => {
                b",\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]"
            }
            (Endpoint::Completions, Some(f)) => {
                out.extend_from_slice(b",\"logprobs\":null,\"finish_reason\":");
                write_json_str(out, f.reason);
                out.extend_from_slice(b",\"stop_reason\":");
                serde_json::to_writer(&mut *out, &f.stop_reason).expect("stop reasons serialize");
                b"}]"
            }
            (Endpoint::Chat, None) => b"},\"logprobs\":null,\"finish_reason\":null}]",
            (Endpoint::Chat, Some(f)) => {
                out.extend_from_slice(b"},\"logprobs\":null,\"finish_reason\":");
                write_json_str(out, f.reason);
                b"}]"
            }
        };
        out.extend_from_slice(tail);
        match ResponseHeader::usage_field(self.mode, usage) {
            UsageField::Omitted => {}
            UsageField::Null => out.extend_from_slice(b",\"usage\":null"),
            UsageField::Value(u) => {
                out.extend_from_slice(b",\"usage\":");
                serde_json::to_writer(&mut *out, &u).expect("usage serializes");
            }
        }
        out.extend_from_slice(b"}\n\n");
    }
}

/// Appends `s` as a JSON string, as serde_json writes it: text that needs no escaping (the
/// common case) is copied as is.
fn write_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        serde_json::to_writer(&mut *out, s).expect("strings serialize");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
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
        let c = parse_frame(|o| {
            header(Endpoint::Chat).content_frames(mode).write(o, "a", Some(&Finish::LENGTH), usage)
        });
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["choices"][0]["delta"]["content"], "a");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert!(c["usage"].is_null() && c.as_object().unwrap().contains_key("usage"));
        let t = parse_frame(|o| {
            header(Endpoint::Completions).content_frames(UsageMode::default()).write(o, "b", None, usage)
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
    fn prerendered_content_frames_are_the_serialized_chunks_byte_for_byte() {
        let usage = Usage::new(5, 2, 1);
        let modes = [(false, false), (true, false), (false, true), (true, true)]
            .map(|(include_usage, continuous)| UsageMode { include_usage, continuous });
        let odd = ResponseHeader {
            endpoint: Endpoint::Chat,
            id: "id \"q\" \\".into(),
            created: 1_764_700_000,
            model: "m\u{1}\u{e9}".into(),
        };
        for endpoint in [Endpoint::Completions, Endpoint::Chat] {
            for h in [header(endpoint), ResponseHeader { endpoint, ..odd.clone() }] {
                for mode in modes {
                    for text in ["", " t123", "a\"b\\c\nd\u{7}", "\u{fffd}\u{1f600}"] {
                        let finishes = [
                            None,
                            Some(Finish::LENGTH),
                            Some(Finish::stopped(StopReason::Text("\"x".into()))),
                            Some(Finish::stopped(StopReason::Token(7))),
                        ];
                        for last in &finishes {
                            let mut fast = Vec::new();
                            h.content_frames(mode).write(&mut fast, text, last.as_ref(), usage);
                            let mut reference = Vec::new();
                            let finish_reason = last.as_ref().map(|f| f.reason);
                            let stop_reason = last.as_ref().and_then(|f| f.stop_reason.as_ref());
                            let field = ResponseHeader::usage_field(mode, usage);
                            match endpoint {
                                Endpoint::Completions => h.chunk(
                                    &mut reference,
                                    [TextChoice {
                                        index: 0,
                                        text,
                                        logprobs: None,
                                        finish_reason,
                                        stop_reason,
                                    }],
                                    field,
                                ),
                                Endpoint::Chat => h.chunk(
                                    &mut reference,
                                    [ChatChunkChoice {
                                        index: 0,
                                        delta: ChatDelta { role: None, content: text },
                                        logprobs: None,
                                        finish_reason,
                                    }],
                                    field,
                                ),
                            }
                            assert_eq!(
                                String::from_utf8(fast).unwrap(),
                                String::from_utf8(reference).unwrap(),
                                "{endpoint:?} {mode:?} {text:?} last={last:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bodies_carry_full_usage() {
        let b: Value =
            serde_json::from_str(&header(Endpoint::Chat).body("hi", Usage::new(10, 2, 4), &Finish::LENGTH))
                .unwrap();
        assert_eq!(b["object"], "chat.completion");
        assert_eq!(b["choices"][0]["message"]["content"], "hi");
        assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(b["usage"]["completion_tokens"], 2);
    }
}
