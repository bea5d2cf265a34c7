//! Output decided before generation starts: structured output (JSON) and tool-call
//! arguments. The text is built first (from pool words, numbers and JSON punctuation); its
//! tokens are then the tokenizer's own encoding of that text, so a client re-encoding the
//! output gets exactly the ids, and the count, the server reports, whatever merges the
//! tokenizer makes around punctuation. Each token streams as the slice of the text from
//! its start to the next token's start.

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

/// Plans choice `index`: a tool call (when `tools` and the draw say so), else JSON (when
/// `structured`), else free text. `tool_choice: "auto"` calls a tool when the choice's
/// draw falls under [`AUTO_CALL_PERCENT`]; the tool is drawn uniformly unless named.
pub fn plan_choice(
    tokenizer: &Tokenizer,
    sampler: &Sampler,
    structured: Option<&Structured>,
    tools: Option<&Tools>,
) -> Result<ChoicePlan, ApiError> {
    let codec = |e: TokenizerError| ApiError::internal(e.to_string());
    let pool = tokenizer.output_vocab();
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
            schema::generate(&f.parameters, sampler, pool, &mut text).map_err(|e| {
                ApiError::invalid_field(
                    &format!("tools[{i}]"),
                    format!("tools[{i}].function.parameters: {e}"),
                )
            })?;
            let id = format!("chatcmpl-tool-{}", uuid::Uuid::new_v4().simple());
            return Ok(ChoicePlan {
                planned: Some(Planned::new(tokenizer, text).map_err(codec)?),
                tool_call: Some(ToolCallHead { id, name: f.name.clone() }),
            });
        }
    }
    let Some(structured) = structured else { return Ok(ChoicePlan::default()) };
    let mut text = String::new();
    match structured {
        Structured::JsonObject => schema::generate_object(sampler, pool, &mut text),
        Structured::Schema(s) => schema::generate(s, sampler, pool, &mut text).map_err(|e| {
            ApiError::invalid_field("response_format", format!("response_format.json_schema.schema: {e}"))
        })?,
    }
    Ok(ChoicePlan { planned: Some(Planned::new(tokenizer, text).map_err(codec)?), tool_call: None })
}

/// Text cut into the tokens that encode it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    text: String,
    ids: Vec<u32>,
    /// Token `i` is `text[starts[i]..starts[i + 1]]` (the last runs to the end).
    starts: Vec<u32>,
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
        Ok(Self { text, ids, starts })
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
}
