//! Response bodies and streamed chunks, with vLLM's field names and shapes (load clients
//! check `object` exactly and read `usage` from the trailing chunk).

use serde::Serialize;

use crate::output::logprobs::LogprobsAcc;
use crate::output::stop::StopReason;
use crate::output::write_json_str;
use serde_json::value::RawValue;

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
    logprobs: Option<&'a RawValue>,
    finish_reason: Option<&'static str>,
    stop_reason: Option<&'a StopReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<&'a [u32]>,
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
    /// `finish_reason`: `length`, `stop` or `tool_calls`.
    pub reason: &'static str,
    /// `stop_reason`: the stop string or token that ended it.
    pub stop_reason: Option<StopReason>,
}

impl Finish {
    /// The length limit was reached.
    pub const LENGTH: Finish = Finish { reason: "length", stop_reason: None };
    /// The model ended its output (structured output complete).
    pub const EOS: Finish = Finish { reason: "stop", stop_reason: None };
    /// The model ended with a tool call.
    pub const TOOL_CALLS: Finish = Finish { reason: "tool_calls", stop_reason: None };

    /// A stop condition ended the output.
    pub fn stopped(why: StopReason) -> Self {
        Self { reason: "stop", stop_reason: Some(why) }
    }
}

/// A tool call a choice makes: its id and the function's name (the arguments are the
/// choice's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallHead {
    /// `id`, `chatcmpl-tool-…` as vLLM names them.
    pub id: String,
    /// `function.name`.
    pub name: String,
}

#[derive(Serialize)]
struct ChatDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

#[derive(Serialize)]
struct ChatChunkChoice<'a, D: Serialize> {
    index: u32,
    delta: D,
    logprobs: Option<&'a RawValue>,
    finish_reason: Option<&'static str>,
    /// Set on a choice's last chunk only (`null` there when no stop condition ended it),
    /// as vLLM's chat stream carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Option<&'a StopReason>>,
}

#[derive(Serialize)]
struct FunctionOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    arguments: &'a str,
}

#[derive(Serialize)]
struct ToolCallOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionOut<'a>,
}

#[derive(Serialize)]
struct ToolDelta<'a> {
    tool_calls: [ToolCallOut<'a>; 1],
}

#[derive(Serialize)]
struct ChatMessageOut<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: &'a [ToolCallOut<'a>],
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: ChatMessageOut<'a>,
    logprobs: Option<&'a RawValue>,
    finish_reason: &'static str,
    stop_reason: Option<&'a StopReason>,
}

/// One finished choice of a non-streamed response.
#[derive(Debug, Clone)]
pub struct ChoiceBody {
    /// Its text (for a tool call: the arguments).
    pub text: String,
    /// How it ended.
    pub finish: Finish,
    /// Its `logprobs` object, when asked.
    pub logprobs: Option<Box<RawValue>>,
    /// The tool call it makes, if any.
    pub tool_call: Option<ToolCallHead>,
    /// Its generated token ids, when the request collects them (`Generation::token_ids`).
    pub token_ids: Option<Vec<u32>>,
}

/// What a content frame carries beside its text, when asked.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameExtras<'a> {
    /// The frame's tokens' log-probabilities.
    pub logprobs: Option<&'a LogprobsAcc>,
    /// The frame's token ids.
    pub token_ids: Option<&'a [u32]>,
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

    /// Appends a chat stream's opening frame for choice `index` (role, empty content), as
    /// vLLM sends it.
    pub fn role_frame(&self, out: &mut Vec<u8>, index: u32, mode: UsageMode, usage: Usage) {
        let choice = ChatChunkChoice {
            index,
            delta: ChatDelta { role: Some("assistant"), content: "" },
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
        };
        self.chunk(out, [choice], Self::usage_field(mode, usage))
    }

    /// Appends a chat frame of a streamed tool call: the first carries the call's id, type
    /// and name, every one a piece of the arguments, the last the finish reason.
    #[allow(clippy::too_many_arguments)]
    pub fn tool_frame(
        &self,
        out: &mut Vec<u8>,
        index: u32,
        head: Option<&ToolCallHead>,
        arguments: &str,
        logprobs: Option<&RawValue>,
        last: Option<&Finish>,
        mode: UsageMode,
        usage: Usage,
    ) {
        let call = ToolCallOut {
            index: Some(0),
            id: head.map(|h| h.id.as_str()),
            kind: head.map(|_| "function"),
            function: FunctionOut { name: head.map(|h| h.name.as_str()), arguments },
        };
        let choice = ChatChunkChoice {
            index,
            delta: ToolDelta { tool_calls: [call] },
            logprobs,
            finish_reason: last.map(|f| f.reason),
            stop_reason: last.map(|f| f.stop_reason.as_ref()),
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
        prefix.extend_from_slice(b",\"choices\":[{\"index\":");
        ContentFrames { endpoint: self.endpoint, mode, prefix }
    }

    /// Appends a frame with no choices carrying a disaggregated prefill's
    /// `kv_transfer_params` (the last frame of a streamed prefill, before usage).
    pub fn kv_transfer_frame(&self, out: &mut Vec<u8>, params: &serde_json::Value) {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        let chunk = serde_json::json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "kv_transfer_params": params,
        });
        out.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut *out, &chunk).expect("chunks serialize");
        out.extend_from_slice(b"\n\n");
    }

    /// Appends the trailing usage frame (`choices: []`).
    pub fn usage_frame(&self, out: &mut Vec<u8>, usage: Usage) {
        self.chunk::<[(); 0]>(out, [], UsageField::Value(usage))
    }

    /// The whole non-streamed response.
    pub fn body(&self, choices: &[ChoiceBody], usage: Usage) -> String {
        let (head, tail) = self.body_ends(usage);
        let mut out = head.into_bytes();
        for (i, c) in choices.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            self.write_choice(&mut out, i, c);
        }
        out.extend_from_slice(tail.as_bytes());
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    /// What a non-streamed response holds around its choices: everything up to the
    /// choices array's opening bracket, and from its closing bracket on (the usage).
    /// Together with the choices in between, the bytes equal serializing the whole body.
    pub fn body_ends(&self, usage: Usage) -> (String, String) {
        #[derive(Serialize)]
        struct Body<'a> {
            id: &'a str,
            object: &'static str,
            created: u64,
            model: &'a str,
            choices: [(); 0],
            usage: Usage,
        }
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        };
        let whole = serde_json::to_string(&Body {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices: [],
            usage,
        })
        .expect("bodies serialize");
        const OPEN: &str = "\"choices\":[";
        let at = whole.find(OPEN).expect("the choices key is written") + OPEN.len();
        (whole[..at].to_string(), whole[at..].to_string())
    }

    /// Writes choice `i` of a non-streamed response.
    pub fn write_choice(&self, mut out: impl std::io::Write, i: usize, c: &ChoiceBody) {
        let written = match self.endpoint {
            Endpoint::Completions => serde_json::to_writer(
                &mut out,
                &TextChoice {
                    index: i as u32,
                    text: &c.text,
                    logprobs: c.logprobs.as_deref(),
                    finish_reason: Some(c.finish.reason),
                    stop_reason: c.finish.stop_reason.as_ref(),
                    token_ids: c.token_ids.as_deref(),
                },
            ),
            Endpoint::Chat => {
                let call = c.tool_call.as_ref().map(|h| {
                    [ToolCallOut {
                        index: None,
                        id: Some(&h.id),
                        kind: Some("function"),
                        function: FunctionOut { name: Some(&h.name), arguments: &c.text },
                    }]
                });
                serde_json::to_writer(
                    &mut out,
                    &ChatChoice {
                        index: i as u32,
                        message: ChatMessageOut {
                            role: "assistant",
                            content: if call.is_some() { None } else { Some(&c.text) },
                            tool_calls: call.as_ref().map_or(&[][..], |c| &c[..]),
                        },
                        logprobs: c.logprobs.as_deref(),
                        finish_reason: c.finish.reason,
                        stop_reason: c.finish.stop_reason.as_ref(),
                    },
                )
            }
        };
        written.expect("choices serialize");
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
    /// Appends a content frame of choice `index`; the last one carries how the choice
    /// ended; `extras` the frame's tokens' log-probabilities and ids, when asked.
    pub fn write(
        &self,
        out: &mut Vec<u8>,
        index: u32,
        text: &str,
        last: Option<&Finish>,
        usage: Usage,
        extras: FrameExtras<'_>,
    ) {
        out.extend_from_slice(&self.prefix);
        if index < 10 {
            out.push(b'0' + index as u8);
        } else {
            serde_json::to_writer(&mut *out, &index).expect("integers serialize");
        }
        out.extend_from_slice(match self.endpoint {
            Endpoint::Completions => b",\"text\":".as_slice(),
            Endpoint::Chat => b",\"delta\":{\"content\":".as_slice(),
        });
        write_json_str(out, text);
        out.extend_from_slice(match self.endpoint {
            Endpoint::Completions => b",\"logprobs\":".as_slice(),
            Endpoint::Chat => b"},\"logprobs\":".as_slice(),
        });
        match extras.logprobs {
            Some(acc) => acc.write(out),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"finish_reason\":");
        match last {
            None => out.extend_from_slice(b"null"),
            Some(f) => write_json_str(out, f.reason),
        }
        // Completions chunks always carry `stop_reason`; chat chunks on their last frame.
        if self.endpoint == Endpoint::Completions || last.is_some() {
            out.extend_from_slice(b",\"stop_reason\":");
            match last.and_then(|f| f.stop_reason.as_ref()) {
                None => out.extend_from_slice(b"null"),
                Some(r) => serde_json::to_writer(&mut *out, r).expect("stop reasons serialize"),
            }
        }
        if let Some(ids) = extras.token_ids {
            out.extend_from_slice(b",\"token_ids\":");
            serde_json::to_writer(&mut *out, ids).expect("ids serialize");
        }
        out.extend_from_slice(b"}]");
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
            header(Endpoint::Chat).content_frames(mode).write(
                o,
                0,
                "a",
                Some(&Finish::LENGTH),
                usage,
                FrameExtras::default(),
            )
        });
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["choices"][0]["delta"]["content"], "a");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert!(c["usage"].is_null() && c.as_object().unwrap().contains_key("usage"));
        let t = parse_frame(|o| {
            header(Endpoint::Completions).content_frames(UsageMode::default()).write(
                o,
                12,
                "b",
                None,
                usage,
                FrameExtras::default(),
            )
        });
        assert_eq!(t["object"], "text_completion");
        assert!(t["choices"][0]["finish_reason"].is_null());
        assert_eq!(t["choices"][0]["index"], 12);
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
                            Some(Finish::EOS),
                            Some(Finish::stopped(StopReason::Text("\"x".into()))),
                            Some(Finish::stopped(StopReason::Token(7))),
                        ];
                        for last in &finishes {
                            let mut fast = Vec::new();
                            h.content_frames(mode).write(
                                &mut fast,
                                0,
                                text,
                                last.as_ref(),
                                usage,
                                FrameExtras::default(),
                            );
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
                                        token_ids: None,
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
                                        stop_reason: last.as_ref().map(|_| stop_reason),
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
        let choice = |text: &str, tool_call| ChoiceBody {
            text: text.into(),
            finish: Finish::LENGTH,
            logprobs: None,
            tool_call,
            token_ids: None,
        };
        let b: Value =
            serde_json::from_str(&header(Endpoint::Chat).body(&[choice("hi", None)], Usage::new(10, 2, 4)))
                .unwrap();
        assert_eq!(b["object"], "chat.completion");
        assert_eq!(b["choices"][0]["message"]["content"], "hi");
        assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(b["usage"]["completion_tokens"], 2);
        let head = ToolCallHead { id: "chatcmpl-tool-1".into(), name: "f".into() };
        let b: Value = serde_json::from_str(
            &header(Endpoint::Chat).body(&[choice("x", None), choice("{}", Some(head))], Usage::new(1, 2, 0)),
        )
        .unwrap();
        assert_eq!(b["choices"][1]["index"], 1);
        assert!(b["choices"][1]["message"]["content"].is_null());
        let call = &b["choices"][1]["message"]["tool_calls"][0];
        assert_eq!((call["type"].as_str(), call["function"]["name"].as_str()), (Some("function"), Some("f")));
        assert_eq!(call["function"]["arguments"], "{}");
        assert!(b["choices"][0]["message"].get("tool_calls").is_none());
    }

    #[test]
    fn frames_carry_logprobs_and_tool_call_deltas() {
        use crate::output::logprobs::{LogprobsAcc, LogprobsShape};
        use crate::output::sampler::Sampler;
        use crate::output::vocab::OutputVocab;
        let mut acc = LogprobsAcc::new(LogprobsShape::Chat { top: 2 });
        acc.push(&Sampler::seeded(1, &[], 0), &OutputVocab::builtin(), 0, " a", None, 0);
        let c = parse_frame(|o| {
            header(Endpoint::Chat).content_frames(UsageMode::default()).write(
                o,
                3,
                " a",
                None,
                Usage::new(1, 1, 0),
                FrameExtras { logprobs: Some(&acc), token_ids: Some(&[9, 10]) },
            )
        });
        assert_eq!(c["choices"][0]["logprobs"]["content"][0]["token"], " a");
        assert_eq!(c["choices"][0]["index"], 3);
        assert_eq!(c["choices"][0]["token_ids"], serde_json::json!([9, 10]));
        assert!(c["choices"][0].get("stop_reason").is_none(), "only a last chat frame has stop_reason");
        let head = ToolCallHead { id: "i".into(), name: "f".into() };
        let mode = UsageMode::default();
        let first = parse_frame(|o| {
            header(Endpoint::Chat).tool_frame(o, 0, Some(&head), "{\"", None, None, mode, Usage::new(1, 1, 0))
        });
        let call = &first["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(
            (call["index"].as_u64(), call["id"].as_str(), call["function"]["name"].as_str()),
            (Some(0), Some("i"), Some("f"))
        );
        let last = parse_frame(|o| {
            header(Endpoint::Chat).tool_frame(
                o,
                0,
                None,
                "}",
                None,
                Some(&Finish::TOOL_CALLS),
                mode,
                Usage::new(1, 1, 0),
            )
        });
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
        assert!(last["choices"][0]["delta"]["tool_calls"][0].get("id").is_none());
    }
}
