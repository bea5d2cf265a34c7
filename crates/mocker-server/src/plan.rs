//! Output the engine does not sample: the thinking span of a reasoning model
//! (`dynamo.reasoning`) and recorded output replayed token for token
//! (`dynamo.response_replay_trace_path`), as the reference's worker emits them.
//!
//! * Thinking: with `thinking_ratio` r and an output length n, the first
//!   `t = clamp(⌊n·r⌋, 2, n)` tokens think (none when n < 2 or ⌊n·r⌋ = 0): token 0 is
//!   `start_thinking_token_id`, token t−1 `end_thinking_token_id`, the tokens between are the
//!   reasoning; the rest is the answer. Completions return it all as raw text; chat splits it
//!   as vLLM's reasoning parsers do (`reasoning_content` holds the text between the markers,
//!   `content` the text after; the markers themselves are dropped).
//! * Replay: a JSONL trace whose rows carry `output_token_ids` (and `output_length`, alias
//!   `output_tokens`, equal to their count). A row's key is its `request_id`, else
//!   `"{session_id}:{turn}"` (the turn counting that session's rows from 0), else
//!   `"line:{i}"` (i counting lines from 0). A request names a row with the annotation
//!   `nvext.annotations: ["output_replay_id:KEY"]` and then generates exactly those tokens
//!   (clipped to the context window), whatever its `max_tokens`.

use std::collections::HashMap;
use std::io::BufRead;

use mocker_core::config::ReasoningConfig;
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::openai::response::{ResponseHeader, Usage, UsageMode};
use crate::tokenizer::Tokenizer;

/// Where a token's text belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The answer.
    Content,
    /// The thinking span's opening marker.
    Open,
    /// Inside the thinking span.
    Thinking,
    /// The thinking span's closing marker.
    Close,
}

/// The configured thinking markers and their texts.
#[derive(Debug, Clone)]
pub struct Reasoning {
    config: ReasoningConfig,
    start_text: String,
    end_text: String,
}

impl Reasoning {
    /// The markers of `config` as `tokenizer` writes them (special tokens kept). The
    /// built-in tokenizer has no special tokens: its markers are written ` <think>` and
    /// ` </think>`, each one space-separated word, hence one token as clients count it.
    pub fn new(config: &ReasoningConfig, tokenizer: &Tokenizer) -> Self {
        let text = |id: u32, fallback: &str| match tokenizer {
            Tokenizer::Builtin => fallback.to_string(),
            _ => tokenizer.special_token_text(id).unwrap_or_else(|| fallback.to_string()),
        };
        Self {
            config: config.clone(),
            start_text: text(config.start_thinking_token_id, " <think>"),
            end_text: text(config.end_thinking_token_id, " </think>"),
        }
    }

    /// Tokens of the thinking span (markers included) of an `osl`-token output.
    pub fn thinking_len(&self, osl: usize) -> usize {
        let t = (osl as f64 * self.config.thinking_ratio).floor() as usize;
        if osl < 2 || t == 0 {
            0
        } else {
            t.clamp(2, osl)
        }
    }
}

/// Recorded outputs by replay key.
#[derive(Debug, Clone, Default)]
pub struct ReplayTable {
    rows: HashMap<String, Vec<u32>>,
}

#[derive(Deserialize)]
struct TraceRow {
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default, alias = "output_tokens")]
    output_length: Option<usize>,
    #[serde(default)]
    output_token_ids: Option<Vec<u32>>,
}

impl ReplayTable {
    /// Reads a trace; errors name the path and the line (1-based).
    pub fn from_path(path: &str) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("cannot open {path:?}: {e}"))?;
        let mut rows = HashMap::new();
        let mut turns: HashMap<String, usize> = HashMap::new();
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let at = |msg: String| format!("{path}:{}: {msg}", i + 1);
            let line = line.map_err(|e| at(format!("cannot read: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let row: TraceRow = serde_json::from_str(&line).map_err(|e| at(format!("malformed row: {e}")))?;
            let turn = row.session_id.as_ref().map_or(0, |s| {
                let n = turns.entry(s.clone()).or_default();
                *n += 1;
                *n - 1
            });
            let Some(ids) = row.output_token_ids else { continue };
            let Some(len) = row.output_length else {
                return Err(at("has output_token_ids but no output_length".into()));
            };
            if len != ids.len() {
                return Err(at(format!(
                    "output_length {len} does not match the {} output_token_ids",
                    ids.len()
                )));
            }
            let key = replay_key(row.request_id.as_deref(), row.session_id.as_deref(), turn, i);
            if rows.insert(key.clone(), ids).is_some() {
                return Err(at(format!("duplicates output_replay_id key {key:?}")));
            }
        }
        Ok(Self { rows })
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row carries output.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The recorded output of `key`.
    pub fn get(&self, key: &str) -> Option<&[u32]> {
        self.rows.get(key).map(Vec::as_slice)
    }
}

fn replay_key(request_id: Option<&str>, session_id: Option<&str>, turn: usize, line: usize) -> String {
    let given = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(str::to_string);
    if let Some(id) = given(request_id) {
        return id;
    }
    if let Some(session) = given(session_id) {
        return format!("{session}:{turn}");
    }
    format!("line:{line}")
}

/// The annotation naming a recorded output.
const REPLAY_ANNOTATION: &str = "output_replay_id:";

/// The replay key a request body names in `nvext.annotations`, if any. Bodies that do not
/// mention it are not parsed again.
pub fn requested_replay_key(body: &[u8]) -> Result<Option<String>, ApiError> {
    let needle = REPLAY_ANNOTATION.as_bytes();
    if !body.windows(needle.len()).any(|w| w == needle) {
        return Ok(None);
    }
    #[derive(Deserialize)]
    struct Body {
        #[serde(default)]
        nvext: Option<NvExt>,
    }
    #[derive(Deserialize)]
    struct NvExt {
        #[serde(default)]
        annotations: Vec<String>,
    }
    let parsed: Body = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid_field(
            "nvext.annotations",
            format!("nvext.annotations: expected a list of strings ({e})"),
        )
    })?;
    Ok(parsed
        .nvext
        .into_iter()
        .flat_map(|n| n.annotations)
        .find_map(|a| a.strip_prefix(REPLAY_ANNOTATION).map(str::to_string)))
}

/// The recorded tokens of one request and their texts.
#[derive(Debug, Clone)]
pub struct Replayed {
    ids: Vec<u32>,
    text: String,
    ends: Vec<usize>,
}

impl Replayed {
    /// `ids` with each token's text: what decoding it adds to the tokens before it (a few
    /// tokens of context suffice for word-boundary spaces and merged bytes).
    pub fn new(ids: &[u32], tokenizer: &Tokenizer) -> Result<Self, ApiError> {
        const CONTEXT: usize = 4;
        let codec = |e: crate::tokenizer::TokenizerError| ApiError::internal(e.to_string());
        let (mut text, mut ends) = (String::new(), Vec::with_capacity(ids.len()));
        for k in 0..ids.len() {
            let from = k.saturating_sub(CONTEXT);
            let before = tokenizer.decode(&ids[from..k]).map_err(codec)?;
            let with = tokenizer.decode(&ids[from..=k]).map_err(codec)?;
            match with.strip_prefix(before.as_str()) {
                Some(piece) => text.push_str(piece),
                None => text.push_str(&tokenizer.decode(&ids[k..=k]).map_err(codec)?),
            }
            ends.push(text.len());
        }
        Ok(Self { ids: ids.to_vec(), text, ends })
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The token ids.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn token(&self, k: usize) -> Option<(u32, &str)> {
        let start = if k == 0 { 0 } else { *self.ends.get(k - 1)? };
        Some((*self.ids.get(k)?, &self.text[start..*self.ends.get(k)?]))
    }
}

/// What one request emits besides sampled tokens.
#[derive(Debug, Clone, Default)]
pub struct RequestPlan {
    /// Length of the thinking span (0: none).
    pub thinking: usize,
    /// Recorded tokens replayed instead of sampling.
    pub replay: Option<Replayed>,
    /// Chat: thinking text goes to `reasoning_content`, the markers are dropped.
    pub split: bool,
    /// Where the simulated model writes its end-of-sequence token (the output length drawn
    /// for a request that set none); the output then ends with `finish_reason: "stop"`.
    pub eos_at: Option<usize>,
}

impl RequestPlan {
    /// Whether the plan changes nothing.
    pub fn is_plain(&self) -> bool {
        self.thinking == 0 && self.replay.is_none()
    }

    /// Where output token `k` belongs.
    pub fn phase(&self, k: usize) -> Phase {
        let t = self.thinking;
        if t == 0 || k >= t {
            Phase::Content
        } else if k == 0 {
            Phase::Open
        } else if k + 1 == t {
            Phase::Close
        } else {
            Phase::Thinking
        }
    }

    /// Token `k` when the plan fixes it (a marker or a replayed token): its id and text.
    pub fn token<'a>(&'a self, k: usize, reasoning: Option<&'a Reasoning>) -> Option<(u32, &'a str)> {
        if let Some(replay) = &self.replay {
            return replay.token(k);
        }
        let r = reasoning?;
        match self.phase(k) {
            Phase::Open => Some((r.config.start_thinking_token_id, r.start_text.as_str())),
            Phase::Close => Some((r.config.end_thinking_token_id, r.end_text.as_str())),
            _ => None,
        }
    }
}

/// Appends a chat chunk carrying reasoning text (`delta.reasoning_content`), as vLLM streams
/// a reasoning parser's output.
pub fn reasoning_frame(
    header: &ResponseHeader,
    out: &mut Vec<u8>,
    index: u32,
    text: &str,
    mode: UsageMode,
    usage: Usage,
) {
    #[derive(Serialize)]
    struct Delta<'a> {
        reasoning_content: &'a str,
    }
    #[derive(Serialize)]
    struct Choice<'a> {
        index: u32,
        delta: Delta<'a>,
        logprobs: Option<()>,
        finish_reason: Option<()>,
    }
    #[derive(Serialize)]
    struct Chunk<'a> {
        id: &'a str,
        object: &'static str,
        created: u64,
        model: &'a str,
        choices: [Choice<'a>; 1],
        #[serde(skip_serializing_if = "Option::is_none")]
        usage: Option<Option<Usage>>,
    }
    let usage = match (mode.include_usage, mode.continuous) {
        (_, true) => Some(Some(usage)),
        (true, false) => Some(None),
        (false, false) => None,
    };
    let chunk = Chunk {
        id: &header.id,
        object: "chat.completion.chunk",
        created: header.created,
        model: &header.model,
        choices: [Choice {
            index,
            delta: Delta { reasoning_content: text },
            logprobs: None,
            finish_reason: None,
        }],
        usage,
    };
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, &chunk).expect("chunks serialize");
    out.extend_from_slice(b"\n\n");
}

/// A non-streamed chat body with each choice's reasoning split out: `message.reasoning_content` set,
/// `content` null when the answer is empty (as vLLM returns it).
pub fn with_reasoning(body: String, reasoning: &[&str]) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&body) else { return body };
    for (i, text) in reasoning.iter().enumerate() {
        let Some(message) = v.pointer_mut(&format!("/choices/{i}/message")).and_then(|m| m.as_object_mut())
        else {
            continue;
        };
        if message.get("content").and_then(|c| c.as_str()) == Some("") {
            message.insert("content".into(), serde_json::Value::Null);
        }
        message.insert("reasoning_content".into(), (*text).into());
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reasoning(ratio: f64) -> Reasoning {
        let config =
            ReasoningConfig { start_thinking_token_id: 7, end_thinking_token_id: 8, thinking_ratio: ratio };
        Reasoning::new(&config, &Tokenizer::Builtin)
    }

    #[test]
    fn thinking_length_follows_the_reference_rule() {
        let r = reasoning(0.6);
        assert_eq!(r.thinking_len(10), 6);
        assert_eq!(r.thinking_len(1), 0);
        assert_eq!(r.thinking_len(2), 2, "⌊1.2⌋ = 1 is raised to the two markers");
        assert_eq!(reasoning(0.05).thinking_len(10), 0);
        assert_eq!(reasoning(1.0).thinking_len(5), 5);
        let plan = RequestPlan { thinking: 4, replay: None, split: true, eos_at: None };
        let phases: Vec<_> = (0..6).map(|k| plan.phase(k)).collect();
        use Phase::*;
        assert_eq!(phases, [Open, Thinking, Thinking, Close, Content, Content]);
        let r = reasoning(0.5);
        assert_eq!(plan.token(0, Some(&r)), Some((7, " <think>")));
        assert_eq!(plan.token(3, Some(&r)), Some((8, " </think>")));
        assert_eq!(plan.token(1, Some(&r)), None);
    }

    #[test]
    fn replay_rows_are_keyed_as_the_reference_keys_them_and_bad_rows_name_their_line() {
        let dir = std::env::temp_dir().join(format!("mocker-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.jsonl");
        std::fs::write(
            &path,
            concat!(
                "{\"request_id\": \"r1\", \"output_length\": 2, \"output_token_ids\": [5, 6]}\n",
                "{\"session_id\": \"s\", \"output_length\": 1}\n",
                "\n",
                "{\"session_id\": \"s\", \"output_tokens\": 1, \"output_token_ids\": [9]}\n",
                "{\"output_length\": 1, \"output_token_ids\": [3]}\n",
            ),
        )
        .unwrap();
        let t = ReplayTable::from_path(path.to_str().unwrap()).unwrap();
        assert_eq!(t.get("r1"), Some(&[5, 6][..]));
        assert_eq!(t.get("s:1"), Some(&[9][..]));
        assert_eq!(t.get("line:4"), Some(&[3][..]));
        assert_eq!(t.len(), 3);
        for (bad, needle) in [
            ("{\"output_token_ids\": [1]}", ":1: has output_token_ids but no output_length"),
            ("{}\n{\"output_length\": 2, \"output_token_ids\": [1]}", ":2: output_length 2"),
            ("{\"request_id\": \"a\", \"output_length\": 0, \"output_token_ids\": []}\n{\"request_id\": \"a\", \"output_length\": 0, \"output_token_ids\": []}", ":2: duplicates"),
            ("not json", ":1: malformed row"),
            ("{\"output_length\": 1, \"output_token_ids\": [-1]}", ":1: malformed row"),
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = ReplayTable::from_path(path.to_str().unwrap()).unwrap_err();
            assert!(e.contains(needle) && e.contains("t.jsonl"), "{bad}: {e}");
        }
        assert!(ReplayTable::from_path("/nonexistent/x.jsonl").unwrap_err().contains("/nonexistent/x.jsonl"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replayed_texts_concatenate_to_the_decoded_output() {
        let t = Tokenizer::Builtin;
        let ids = [3u32, 40, 41, 900];
        let r = Replayed::new(&ids, &t).unwrap();
        let joined: String = (0..ids.len()).map(|k| r.token(k).unwrap().1).collect();
        assert_eq!(joined, t.decode(&ids).unwrap());
        assert_eq!(r.token(1).unwrap().0, 40);
    }

    #[test]
    fn replay_keys_come_from_the_annotation_only() {
        let k =
            requested_replay_key(br#"{"prompt":"x","nvext":{"annotations":["a:b","output_replay_id:r1"]}}"#);
        assert_eq!(k.unwrap().as_deref(), Some("r1"));
        assert_eq!(requested_replay_key(br#"{"prompt":"x"}"#).unwrap(), None);
        assert!(requested_replay_key(br#"{"nvext":{"annotations":"output_replay_id:r1"}}"#).is_err());
    }
}
