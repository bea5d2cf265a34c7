//! Output decided before generation starts: structured output (JSON) and tool-call
//! arguments. The text is built first (from pool words, numbers and JSON punctuation); its
//! tokens are then the tokenizer's own encoding of that text, so a client re-encoding the
//! output gets exactly the ids, and the count, the server reports, whatever merges the
//! tokenizer makes around punctuation. Each token streams as the slice of the text from
//! its start to the next token's start.
//!
//! A plan never holds more than the request's output length: the text is generated under a
//! byte budget ([`BYTES_PER_TOKEN`] per token, at most [`MAX_PLANNED_BYTES`]) and its tokens
//! are cut at `max_tokens`, so a schema asking for billions of items costs what its first
//! `max_tokens` tokens cost. Planning runs on blocking threads, a few at a time
//! ([`plan_choices`]), so the async workers keep answering while a large plan is built.

use std::sync::{Arc, LazyLock};

use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::openai::fields::{Structured, ToolChoice, Tools, AUTO_CALL_PERCENT};
use crate::openai::response::ToolCallHead;
use crate::output::sampler::Sampler;
use crate::output::schema;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// What one choice will write, decided before it is submitted.
#[derive(Debug, Clone, Default)]
pub struct ChoicePlan {
    /// Planned tokens (structured output or tool-call arguments); free text otherwise.
    pub planned: Option<Planned>,
    /// The tool call the planned tokens are the arguments of.
    pub tool_call: Option<ToolCallHead>,
}

/// Bytes of generated text allowed per token of output length: JSON from pool words runs
/// 3 to 6 bytes a token, so the text this budget holds is longer than `max_tokens` tokens
/// unless its tokens are unusually long (then the plan is short and ends as cut).
pub const BYTES_PER_TOKEN: usize = 32;
/// Most text one plan generates, whatever the output length (a window of 32k tokens at
/// [`BYTES_PER_TOKEN`] is 1 MiB).
pub const MAX_PLANNED_BYTES: usize = 4 << 20;

/// Plans that may be built at once: one per core, so large schemas queue for a core rather
/// than for tokio's pool of hundreds of blocking threads.
static PLANNERS: LazyLock<Semaphore> = LazyLock::new(|| {
    Semaphore::new(std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get))
});

/// Plans one choice per sampler (see [`plan_choice`]); when there is JSON to generate, on
/// a blocking thread.
pub async fn plan_choices<S: AsRef<Tokenizer> + Send + Sync + 'static>(
    state: &Arc<S>,
    samplers: &[Sampler],
    structured: Option<&Structured>,
    tools: Option<&Tools>,
    max_tokens: u32,
) -> Result<Vec<ChoicePlan>, ApiError> {
    if structured.is_none() && tools.is_none() {
        return Ok(vec![ChoicePlan::default(); samplers.len()]);
    }
    let permit = PLANNERS.acquire().await.map_err(|_| ApiError::internal("the planner pool is closed"))?;
    // The state, not the tokenizer: cloning a real tokenizer copies its vocabulary.
    let (state, samplers) = (state.clone(), samplers.to_vec());
    let (structured, tools) = (structured.cloned(), tools.cloned());
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        samplers
            .iter()
            .map(|s| plan_choice(state.as_ref().as_ref(), s, structured.as_ref(), tools.as_ref(), max_tokens))
            .collect()
    })
    .await
    .map_err(|e| ApiError::internal(format!("planning the output failed: {e}")))?
}

/// Plans choice `index`: a tool call (when `tools` and the draw say so), else JSON (when
/// `structured`), else free text. `tool_choice: "auto"` calls a tool when the choice's
/// draw falls under [`AUTO_CALL_PERCENT`]; the tool is drawn uniformly unless named.
pub fn plan_choice(
    tokenizer: &Tokenizer,
    sampler: &Sampler,
    structured: Option<&Structured>,
    tools: Option<&Tools>,
    max_tokens: u32,
) -> Result<ChoicePlan, ApiError> {
    let codec = |e: TokenizerError| ApiError::internal(e.to_string());
    let pool = tokenizer.output_vocab();
    let budget = (max_tokens as usize).saturating_mul(BYTES_PER_TOKEN).min(MAX_PLANNED_BYTES);
    let plan = |text: String, done: schema::Generated| {
        Planned::cut(tokenizer, text, done == schema::Generated::Cut, max_tokens as usize).map_err(codec)
    };
    if let Some(tools) = tools {
        let call = match tools.choice {
            ToolChoice::Named(i) => Some(i),
            ToolChoice::Required => Some(sampler.pick(4, 0, tools.functions.len())),
            ToolChoice::Auto => (sampler.pick(3, 0, 100) < AUTO_CALL_PERCENT as usize)
                .then(|| sampler.pick(4, 0, tools.functions.len())),
        };
        if let Some(i) = call {
            let f = &tools.functions[i];
            let mut text = String::new();
            let done = schema::generate(&f.parameters, sampler, pool, budget, &mut text).map_err(|e| {
                ApiError::invalid_field(
                    &format!("tools[{i}]"),
                    format!("tools[{i}].function.parameters: {e}"),
                )
            })?;
            let id = format!("chatcmpl-tool-{}", uuid::Uuid::new_v4().simple());
            return Ok(ChoicePlan {
                planned: Some(plan(text, done)?),
                tool_call: Some(ToolCallHead { id, name: f.name.clone() }),
            });
        }
    }
    let Some(structured) = structured else { return Ok(ChoicePlan::default()) };
    let mut text = String::new();
    let done = match structured {
        Structured::JsonObject => {
            schema::generate_object(sampler, pool, &mut text);
            schema::Generated::Complete
        }
        Structured::Schema(s) => schema::generate(s, sampler, pool, budget, &mut text).map_err(|e| {
            ApiError::invalid_field("response_format", format!("response_format.json_schema.schema: {e}"))
        })?,
    };
    Ok(ChoicePlan { planned: Some(plan(text, done)?), tool_call: None })
}

/// Text cut into the tokens that encode it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    text: String,
    ids: Vec<u32>,
    /// Token `i` is `text[starts[i]..starts[i + 1]]` (the last runs to the end).
    starts: Vec<u32>,
    /// The text stops short of its value's end (a budget or the output length cut it):
    /// reaching its last token is running out of length, not the model's end of output.
    cut: bool,
}

impl Planned {
    /// Tokenizes `text` (which must not be empty) into its planned tokens.
    pub fn new(tokenizer: &Tokenizer, text: String) -> Result<Self, TokenizerError> {
        let pieces = tokenizer.encode_with_starts(&text)?;
        let (ids, mut starts): (Vec<u32>, Vec<u32>) = pieces.into_iter().unzip();
        if let Some(first) = starts.first_mut() {
            // Leading whitespace the tokenizer dropped belongs to the first token.
            *first = 0;
        }
        if ids.is_empty() {
            return Err(TokenizerError::Codec(format!("planned output {text:?} encodes to no tokens")));
        }
        Ok(Self { text, ids, starts, cut: false })
    }

    /// Tokenizes `text`, generated whole or `cut` short, keeping at most `max_tokens` tokens.
    pub fn cut(
        tokenizer: &Tokenizer,
        text: String,
        cut: bool,
        max_tokens: usize,
    ) -> Result<Self, TokenizerError> {
        let mut p = Self::new(tokenizer, text)?;
        p.cut = cut;
        if p.ids.len() > max_tokens.max(1) {
            let keep = max_tokens.max(1);
            p.text.truncate(p.starts[keep] as usize);
            p.ids.truncate(keep);
            p.starts.truncate(keep);
            p.cut = true;
        }
        Ok(p)
    }

    /// Whether the text stops short of the value's end (see [`Planned::cut`]).
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no tokens (never for a built plan).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Id and text of token `i`.
    pub fn token(&self, i: usize) -> (u32, &str) {
        let start = self.starts[i] as usize;
        let end = self.starts.get(i + 1).map_or(self.text.len(), |&e| e as usize);
        (self.ids[i], &self.text[start..end])
    }

    /// The whole text.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_pieces_concatenate_to_the_text_and_reencode_to_the_ids() {
        let t = Tokenizer::Builtin;
        let text = r#"{"name": "the cat", "n": 3}"#.to_string();
        let p = Planned::new(&t, text.clone()).unwrap();
        let joined: String = (0..p.len()).map(|i| p.token(i).1).collect();
        assert_eq!(joined, text);
        let ids: Vec<u32> = (0..p.len()).map(|i| p.token(i).0).collect();
        assert_eq!(t.encode(&text, false).unwrap(), ids);
    }

    #[test]
    fn real_tokenizer_pieces_stream_token_by_token() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizers/all-minilm-l6-v2");
        let t = Tokenizer::from_path(std::path::Path::new(path)).unwrap();
        let text = r#"{"city": "springs movement", "days": [1, 2], "ok": true}"#.to_string();
        let p = Planned::new(&t, text.clone()).unwrap();
        let pieces: Vec<&str> = (0..p.len()).map(|i| p.token(i).1).collect();
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|piece| !piece.is_empty()), "{pieces:?}");
        let ids: Vec<u32> = (0..p.len()).map(|i| p.token(i).0).collect();
        assert_eq!(t.encode(&text, false).unwrap(), ids);
    }

    #[test]
    fn a_huge_schema_plans_max_tokens_tokens_and_is_cut() {
        use crate::openai::fields::Structured;
        let mut s = serde_json::json!({"type": "string"});
        for _ in 0..3 {
            s = serde_json::json!({"type": "array", "items": s, "minItems": 100_000});
        }
        let structured = Structured::Schema(std::sync::Arc::new(s));
        let t = Tokenizer::Builtin;
        for max_tokens in [1, 50, 4096] {
            let plan =
                plan_choice(&t, &Sampler::seeded(1, &[1], 0), Some(&structured), None, max_tokens).unwrap();
            let p = plan.planned.unwrap();
            assert_eq!((p.len(), p.is_cut()), (max_tokens as usize, true));
            assert!(p.text().len() <= max_tokens as usize * BYTES_PER_TOKEN);
            let e = serde_json::from_str::<serde_json::Value>(p.text()).unwrap_err();
            assert!(e.is_eof(), "a JSON prefix: {e}");
        }
        // A small value under a large budget is whole, not cut.
        let small = Structured::Schema(std::sync::Arc::new(serde_json::json!({"type": "boolean"})));
        let p =
            plan_choice(&t, &Sampler::seeded(1, &[1], 0), Some(&small), None, 50).unwrap().planned.unwrap();
        assert!(!p.is_cut() && p.len() < 50);
    }
}
