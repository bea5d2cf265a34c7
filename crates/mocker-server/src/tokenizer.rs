//! Text ↔ token ids for the server: a Hugging Face `tokenizer.json`, or a built-in word
//! tokenizer when none is given (so `mocker serve` needs no files to start).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use xxhash_rust::xxh3::xxh3_64;

use crate::output::vocab::OutputVocab;
use crate::output::words::WORDS;

/// Ids the built-in tokenizer uses: its output words are ids `0..WORDS.len()`, other words
/// hash into the rest of this range, and any id decodes to one word, so its text
/// re-tokenizes to the same count (what client-side token counting needs).
const BUILTIN_VOCAB: u32 = 32_000;

/// Largest tokenizer file read (256 MiB; real `tokenizer.json` files are a few MB, the
/// largest vocabularies under 50 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// How the server turns prompts into tokens and generated tokens into text.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// A real tokenizer loaded from a Hugging Face `tokenizer.json`.
    HuggingFace {
        /// The tokenizer.
        tokenizer: Box<tokenizers::Tokenizer>,
        /// Its vocabulary size with added tokens (computing it copies the vocabulary, so
        /// it is taken once).
        vocab_size: u32,
        /// The tokens output is drawn from, selected once at load.
        output: Arc<OutputVocab>,
    },
    /// Whitespace words to ids: the 2048 output words are ids `0..2048`, other words hash
    /// to the ids above; ids beyond the words decode to `t{id}`.
    Builtin,
}

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The file could not be read or parsed.
    #[error("--tokenizer {path}: {message}")]
    Load {
        /// File given.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Encoding or decoding failed.
    #[error("tokenizer: {0}")]
    Codec(String),
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a file or from a model folder that holds one. Only a
    /// regular file of at most [`MAX_TOKENIZER_BYTES`] is read: a device such as
    /// `/dev/zero` or a pipe would be read forever (or until memory runs out).
    pub fn from_path(path: &Path) -> Result<Self, TokenizerError> {
        use std::io::Read;
        let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
        let load_err = |message: String| TokenizerError::Load { path: file.display().to_string(), message };
        let handle = std::fs::File::open(&file).map_err(|e| load_err(e.to_string()))?;
        // Judged on the open handle, so the file cannot be swapped between check and read.
        let meta = handle.metadata().map_err(|e| load_err(e.to_string()))?;
        if !meta.is_file() {
            return Err(load_err("not a regular file; give a tokenizer.json or a folder holding one".into()));
        }
        if meta.len() > MAX_TOKENIZER_BYTES {
            let msg = format!("{} bytes is larger than the {MAX_TOKENIZER_BYTES}-byte limit", meta.len());
            return Err(load_err(msg));
        }
        // A file that grows while being read still stops at the limit.
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        handle.take(MAX_TOKENIZER_BYTES + 1).read_to_end(&mut bytes).map_err(|e| load_err(e.to_string()))?;
        if bytes.len() as u64 > MAX_TOKENIZER_BYTES {
            return Err(load_err(format!("larger than the {MAX_TOKENIZER_BYTES}-byte limit")));
        }
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| load_err(e.to_string()))?;
        // Some tokenizer files pad every encoding to a fixed length; prompts must not grow.
        tokenizer.with_padding(None);
        tokenizer.with_truncation(None).map_err(|e| TokenizerError::Codec(e.to_string()))?;
        let vocab_size = tokenizer.get_vocab_size(true).max(1) as u32;
        let output = OutputVocab::from_tokenizer(&tokenizer, vocab_size).ok_or_else(|| {
            load_err("fewer than 16 vocabulary entries are whole words that re-tokenize to themselves".into())
        })?;
        Ok(Self::HuggingFace { tokenizer: Box::new(tokenizer), vocab_size, output: Arc::new(output) })
    }

    /// The tokens generated output is made of.
    pub fn output_vocab(&self) -> &OutputVocab {
        static BUILTIN: OnceLock<OutputVocab> = OnceLock::new();
        match self {
            Self::HuggingFace { output, .. } => output,
            Self::Builtin => BUILTIN.get_or_init(OutputVocab::builtin),
        }
    }

    /// Number of ids the tokenizer can decode.
    pub fn vocab_size(&self) -> u32 {
        match self {
            Self::HuggingFace { vocab_size, .. } => *vocab_size,
            Self::Builtin => BUILTIN_VOCAB,
        }
    }

    /// Token ids of `text`, special tokens (BOS and the like) included as vLLM adds them.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Self::HuggingFace { tokenizer, .. } => tokenizer
                .encode_fast(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizerError::Codec(e.to_string())),
            Self::Builtin => Ok(text.split_whitespace().map(builtin_word_id).collect()),
        }
    }

    /// Token ids of `text` (no special tokens), each with the byte offset where its streamed
    /// piece starts: where the previous token's text ended, so whitespace between tokens
    /// leads the next piece (`" word"`, as pool tokens stream) and the pieces tile the text.
    pub fn encode_with_starts(&self, text: &str) -> Result<Vec<(u32, u32)>, TokenizerError> {
        let mut prev_end = 0usize;
        let mut start_of = |end: usize| {
            let mut e = end.clamp(prev_end, text.len());
            while !text.is_char_boundary(e) {
                e -= 1;
            }
            std::mem::replace(&mut prev_end, e) as u32
        };
        match self {
            Self::HuggingFace { tokenizer, .. } => {
                // `encode` (not `encode_fast`, which leaves offsets out) gives byte offsets.
                let e = tokenizer.encode(text, false).map_err(|e| TokenizerError::Codec(e.to_string()))?;
                Ok(e.get_ids()
                    .iter()
                    .zip(e.get_offsets())
                    .map(|(&id, &(_, end))| (id, start_of(end)))
                    .collect())
            }
            Self::Builtin => {
                let base = text.as_ptr() as usize;
                Ok(text
                    .split_whitespace()
                    .map(|w| (builtin_word_id(w), start_of(w.as_ptr() as usize - base + w.len())))
                    .collect())
            }
        }
    }

    /// Text of `ids`. Ids beyond the vocabulary wrap around it: the engine's generated
    /// tokens are full 32-bit values.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        match self {
            Self::HuggingFace { tokenizer, vocab_size, .. } => {
                let ids: Vec<u32> = ids.iter().map(|&id| id % vocab_size).collect();
                tokenizer.decode(&ids, true).map_err(|e| TokenizerError::Codec(e.to_string()))
            }
            Self::Builtin => {
                let mut out = String::new();
                for (i, &id) in ids.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    push_builtin_word(&mut out, id);
                }
                Ok(out)
            }
        }
    }
}

impl Tokenizer {
    /// The text of token `id` with special tokens kept (`<think>`, say); `None` for the
    /// built-in tokenizer, which has none, or an id the vocabulary lacks.
    pub fn special_token_text(&self, id: u32) -> Option<String> {
        match self {
            Self::HuggingFace { tokenizer, vocab_size, .. } if id < *vocab_size => {
                tokenizer.decode(&[id], false).ok().filter(|t| !t.is_empty())
            }
            _ => None,
        }
    }
}

fn builtin_word_id(word: &str) -> u32 {
    static IDS: OnceLock<HashMap<&'static str, u32>> = OnceLock::new();
    let ids = IDS.get_or_init(|| WORDS.iter().enumerate().map(|(i, &w)| (w, i as u32)).collect());
    match ids.get(word) {
        Some(&id) => id,
        None => {
            let others = u64::from(BUILTIN_VOCAB) - WORDS.len() as u64;
            WORDS.len() as u32 + (xxh3_64(word.as_bytes()) % others) as u32
        }
    }
}

/// Appends the word of `id` (after wrapping it into the vocabulary): an output word, else
/// `t{id}`, without going through `fmt`.
fn push_builtin_word(out: &mut String, id: u32) {
    let mut n = id % BUILTIN_VOCAB;
    if let Some(word) = WORDS.get(n as usize) {
        out.push_str(word);
        return;
    }
    let mut digits = [0u8; 5];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push('t');
    out.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_text_retokenizes_to_the_same_ids() {
        let t = Tokenizer::Builtin;
        let ids = [5u32, 2047, 0, 7];
        let text = t.decode(&ids).unwrap();
        assert_eq!(t.encode(&text, true).unwrap(), ids);
        let pool = t.output_vocab();
        let streamed: String = ids.iter().map(|&i| pool.text(i as usize)).collect();
        assert_eq!(streamed.trim_start(), text);
        // Ids past the words (prompt words hashed there) still decode to one word each.
        let far = t.decode(&[3000, 10, 32_000]).unwrap();
        assert_eq!(far, format!("t3000 {} {}", WORDS[10], WORDS[0]));
        assert_eq!(t.encode(&far, true).unwrap().len(), 3);
    }

    #[test]
    fn builtin_encodes_words_deterministically() {
        let t = Tokenizer::Builtin;
        let a = t.encode("the cat sat on the mat", true).unwrap();
        assert_eq!(a.len(), 6);
        assert_eq!(a[0], a[4]);
        assert_ne!(a[0], a[1]);
        assert!(a.iter().all(|&id| id < BUILTIN_VOCAB));
    }
}
