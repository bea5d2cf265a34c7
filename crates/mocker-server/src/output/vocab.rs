//! The tokens the simulated model may emit: vocabulary entries that are whole words with
//! their leading space and that re-tokenize to themselves, alone and next to each other.
//! Output drawn only from them decodes to text a client re-encodes to exactly the ids (and
//! so the count) the server reports, and each token's text is known in advance, so
//! streaming a token costs a table lookup instead of a detokenizer call.

use super::words::WORDS;

/// Most entries kept: plenty of variety, and building the pool at startup stays well under
/// a second even for 150k-entry vocabularies.
pub const MAX_POOL: usize = 4096;

/// Ids checked together when verifying that pool entries round-trip in sequence.
const RUN: usize = 32;

/// Output tokens and their texts.
#[derive(Debug, Clone)]
pub struct OutputVocab {
    ids: Box<[u32]>,
    /// All texts back to back; entry `i` is `text[ends[i-1]..ends[i]]`.
    text: String,
    ends: Box<[u32]>,
}

impl OutputVocab {
    /// The built-in tokenizer's words: id `i` is `WORDS[i]`.
    pub fn builtin() -> Self {
        Self::from_entries(WORDS.iter().enumerate().map(|(i, w)| (i as u32, format!(" {w}"))))
    }

    fn from_entries(entries: impl IntoIterator<Item = (u32, String)>) -> Self {
        let (mut ids, mut text, mut ends) = (Vec::new(), String::new(), Vec::new());
        for (id, t) in entries {
            ids.push(id);
            text.push_str(&t);
            ends.push(text.len() as u32);
        }
        Self { ids: ids.into(), text, ends: ends.into() }
    }

    /// Selects the pool of a Hugging Face tokenizer: each candidate must decode to a word of
    /// ASCII letters, and `" word"` must encode to just its id; then runs of candidates are
    /// re-encoded as one text and entries that merge with or split from a neighbour are
    /// dropped, until every run round-trips. Returns `None` when fewer than 16 entries
    /// qualify (an exotic vocabulary without space-prefixed words).
    pub fn from_tokenizer(tokenizer: &tokenizers::Tokenizer, vocab_size: u32) -> Option<Self> {
        let mut pool: Vec<(u32, String)> = Vec::new();
        for id in 0..vocab_size {
            if pool.len() == MAX_POOL {
                break;
            }
            let Ok(decoded) = tokenizer.decode(&[id], true) else { continue };
            let word = decoded.trim_start_matches(' ');
            let plausible = (2..=12).contains(&word.len()) && word.bytes().all(|b| b.is_ascii_alphabetic());
            if !plausible {
                continue;
            }
            let text = format!(" {word}");
            if encode(tokenizer, &text).as_deref() == Some(&[id][..]) {
                pool.push((id, text));
            }
        }
        // Neighbours: a run that fails is split into its entries' pairs with the next one.
        let mut keep = vec![true; pool.len()];
        for start in (0..pool.len()).step_by(RUN) {
            let run = &pool[start..(start + RUN).min(pool.len())];
            if round_trips(tokenizer, run.iter()) {
                continue;
            }
            for i in 0..run.len().saturating_sub(1) {
                if !round_trips(tokenizer, run[i..i + 2].iter()) {
                    keep[start + i + 1] = false;
                }
            }
        }
        let mut kept = keep.iter();
        pool.retain(|_| *kept.next().expect("one flag per entry"));
        (pool.len() >= 16).then(|| Self::from_entries(pool))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the pool is empty (never, for a built pool).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Token id of entry `i`.
    pub fn id(&self, i: usize) -> u32 {
        self.ids[i]
    }

    /// Text of entry `i`, leading space included.
    pub fn text(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// The entry of token `id`, if it is in the pool (a linear scan: for tests and requests
    /// naming tokens, not the per-token path).
    pub fn position(&self, id: u32) -> Option<usize> {
        self.ids.iter().position(|&x| x == id)
    }
}

fn encode(tokenizer: &tokenizers::Tokenizer, text: &str) -> Option<Vec<u32>> {
    tokenizer.encode_fast(text, false).ok().map(|e| e.get_ids().to_vec())
}

/// Whether the texts of `entries`, concatenated, encode back to their ids.
fn round_trips<'a>(
    tokenizer: &tokenizers::Tokenizer,
    entries: impl Iterator<Item = &'a (u32, String)> + Clone,
) -> bool {
    let text: String = entries.clone().map(|(_, t)| t.as_str()).collect();
    let ids: Vec<u32> = entries.map(|(id, _)| *id).collect();
    encode(tokenizer, &text).is_some_and(|got| got == ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> tokenizers::Tokenizer {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizers/all-minilm-l6-v2/tokenizer.json"
        );
        let mut t = tokenizers::Tokenizer::from_file(path).unwrap();
        // The file pads and truncates every encoding to 128 ids; the server switches that
        // off as well.
        t.with_padding(None);
        t.with_truncation(None).unwrap();
        t
    }

    #[test]
    fn a_real_tokenizer_pool_round_trips_in_any_order() {
        let t = fixture();
        let pool = OutputVocab::from_tokenizer(&t, t.get_vocab_size(true) as u32).unwrap();
        assert!(pool.len() > 1000, "{}", pool.len());
        // A pseudo-random sequence, not the order the pool was verified in.
        let picks: Vec<usize> =
            (0..500u64).map(|i| (i.wrapping_mul(2_654_435_761) % pool.len() as u64) as usize).collect();
        let text: String = picks.iter().map(|&i| pool.text(i)).collect();
        let ids: Vec<u32> = picks.iter().map(|&i| pool.id(i)).collect();
        assert_eq!(encode(&t, &text).unwrap(), ids);
        assert_eq!(t.decode(&ids, true).unwrap(), text.trim_start());
    }

    #[test]
    fn builtin_pool_texts_are_the_words() {
        let pool = OutputVocab::builtin();
        assert_eq!(pool.len(), WORDS.len());
        assert_eq!((pool.id(0), pool.text(0)), (0, " the"));
        assert_eq!(pool.text(pool.len() - 1), format!(" {}", WORDS[WORDS.len() - 1]));
        assert_eq!(pool.position(7), Some(7));
    }
}
