//! Log-probabilities in the two OpenAI shapes, written straight into the JSON a response
//! or a chunk carries. The values come from [`Sampler::logprobs`] (descending, all < 0,
//! the sampled token among the shown ones); the alternatives at the other ranks are pool
//! entries picked from the same key, distinct from each other and from the sampled token.
//! A token costs O(k) and writes into buffers reused for the whole stream.

use super::sampler::Sampler;
use super::vocab::OutputVocab;

/// Which shape, and how many alternatives per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogprobsShape {
    /// Chat: `logprobs.content[]` entries with `token`, `logprob`, `bytes`,
    /// `top_logprobs` (`top_logprobs` alternatives).
    Chat {
        /// `top_logprobs`.
        top: u32,
    },
    /// Completions: `logprobs` with `tokens`, `token_logprobs`, `top_logprobs` (a dict of
    /// `k` entries per token, at least the sampled one), `text_offset`.
    Completion {
        /// `logprobs`.
        top: u32,
    },
}

/// The pool entry shown at `rank` for position `pos`: ranks map onto consecutive entries
/// after a per-position start, and the entry that the sampled token would collide with
/// takes the sampled token's own (unused) rank, so all shown entries are distinct.
fn alternative(
    sampler: &Sampler,
    pos: u32,
    rank: usize,
    sampled: Option<usize>,
    sampled_rank: usize,
    len: usize,
) -> usize {
    let start = sampler.pick(2, u64::from(pos), len);
    let at = |r: usize| (start + r) % len;
    match sampled {
        Some(s) if at(rank) == s => at(sampled_rank),
        _ => at(rank),
    }
}

/// Log-probabilities of one choice so far (or of one chunk's tokens, when streaming).
#[derive(Debug, Clone)]
pub struct LogprobsAcc {
    shape: LogprobsShape,
    /// Chat: the `content` entries, comma-separated. Completions: `tokens`.
    a: Vec<u8>,
    /// Completions: `token_logprobs`.
    b: Vec<u8>,
    /// Completions: `top_logprobs`.
    c: Vec<u8>,
    /// Completions: `text_offset`.
    d: Vec<u8>,
    count: usize,
}

impl LogprobsAcc {
    /// An empty accumulator.
    pub fn new(shape: LogprobsShape) -> Self {
        Self { shape, a: Vec::new(), b: Vec::new(), c: Vec::new(), d: Vec::new(), count: 0 }
    }

    /// Tokens accounted since the last [`clear`](Self::clear).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no token was accounted.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Forgets the tokens (keeps the buffers): the next chunk starts empty.
    pub fn clear(&mut self) {
        self.a.clear();
        self.b.clear();
        self.c.clear();
        self.d.clear();
        self.count = 0;
    }

    /// Accounts output token `pos` with text `text`, pool entry `sampled` (None for a
    /// token outside the pool, e.g. JSON punctuation), starting at byte `offset` of the
    /// choice's text.
    pub fn push(
        &mut self,
        sampler: &Sampler,
        pool: &OutputVocab,
        pos: u32,
        text: &str,
        sampled: Option<usize>,
        offset: usize,
    ) {
        let ranked = sampler.logprobs(pos);
        let sep = |v: &mut Vec<u8>, first: bool| {
            if !first {
                v.push(b',');
            }
        };
        let first = self.count == 0;
        self.count += 1;
        let len = pool.len();
        match self.shape {
            LogprobsShape::Chat { top } => {
                let out = &mut self.a;
                sep(out, first);
                out.extend_from_slice(b"{\"token\":");
                write_str(out, text);
                out.extend_from_slice(b",\"logprob\":");
                write_f32(out, ranked.sampled());
                out.extend_from_slice(b",\"bytes\":");
                write_bytes(out, text);
                out.extend_from_slice(b",\"top_logprobs\":[");
                for (j, (rank, is_sampled)) in ranked.top(top as usize).enumerate() {
                    sep(out, j == 0);
                    let t = if is_sampled {
                        text
                    } else {
                        pool.text(alternative(sampler, pos, rank, sampled, ranked.sampled_rank, len))
                    };
                    out.extend_from_slice(b"{\"token\":");
                    write_str(out, t);
                    out.extend_from_slice(b",\"logprob\":");
                    write_f32(out, ranked.values[rank]);
                    out.extend_from_slice(b",\"bytes\":");
                    write_bytes(out, t);
                    out.push(b'}');
                }
                out.extend_from_slice(b"]}");
            }
            LogprobsShape::Completion { top } => {
                sep(&mut self.a, first);
                write_str(&mut self.a, text);
                sep(&mut self.b, first);
                write_f32(&mut self.b, ranked.sampled());
                sep(&mut self.d, first);
                self.d.extend_from_slice(itoa_buf(offset, &mut [0u8; 20]));
                let out = &mut self.c;
                sep(out, first);
                out.push(b'{');
                // `logprobs: 0` still shows the sampled token, as vLLM's dict does.
                for (j, (rank, is_sampled)) in ranked.top(top.max(1) as usize).enumerate() {
                    sep(out, j == 0);
                    let t = if is_sampled {
                        text
                    } else {
                        pool.text(alternative(sampler, pos, rank, sampled, ranked.sampled_rank, len))
                    };
                    write_str(out, t);
                    out.push(b':');
                    write_f32(out, ranked.values[rank]);
                }
                out.push(b'}');
            }
        }
    }

    /// Appends the `logprobs` value: the object of the tokens accounted.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self.shape {
            LogprobsShape::Chat { .. } => {
                out.extend_from_slice(b"{\"content\":[");
                out.extend_from_slice(&self.a);
                out.extend_from_slice(b"]}");
            }
            LogprobsShape::Completion { .. } => {
                out.extend_from_slice(b"{\"text_offset\":[");
                out.extend_from_slice(&self.d);
                out.extend_from_slice(b"],\"token_logprobs\":[");
                out.extend_from_slice(&self.b);
                out.extend_from_slice(b"],\"tokens\":[");
                out.extend_from_slice(&self.a);
                out.extend_from_slice(b"],\"top_logprobs\":[");
                out.extend_from_slice(&self.c);
                out.extend_from_slice(b"]}");
            }
        }
    }

    /// The `logprobs` value as JSON text for bodies built with serde: written once, never
    /// expanded into a tree (a response's log-probabilities can be most of its bytes).
    pub fn to_raw(&self) -> Box<serde_json::value::RawValue> {
        let mut out = Vec::new();
        self.write(&mut out);
        let text = String::from_utf8(out).expect("log-probabilities are UTF-8");
        serde_json::value::RawValue::from_string(text).expect("log-probabilities are valid JSON")
    }

    /// The `logprobs` value as a JSON tree.
    #[cfg(test)]
    pub fn to_value(&self) -> serde_json::Value {
        let mut out = Vec::new();
        self.write(&mut out);
        serde_json::from_slice(&out).expect("log-probabilities are valid JSON")
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    crate::output::write_json_str(out, s);
}

fn write_f32(out: &mut Vec<u8>, v: f32) {
    serde_json::to_writer(&mut *out, &v).expect("finite floats serialize");
}

fn write_bytes(out: &mut Vec<u8>, s: &str) {
    out.push(b'[');
    for (i, b) in s.bytes().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(itoa_buf(b as usize, &mut [0u8; 20]));
    }
    out.push(b']');
}

/// Decimal digits of `n` in `buf`, without `fmt`.
fn itoa_buf(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[at..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn run(shape: LogprobsShape, tokens: u32) -> Value {
        let pool = OutputVocab::builtin();
        let s = Sampler::seeded(5, &[1, 2], 0);
        let mut acc = LogprobsAcc::new(shape);
        let mut offset = 0;
        for pos in 0..tokens {
            let i = s.token(pos, pool.len());
            acc.push(&s, &pool, pos, pool.text(i), Some(i), offset);
            offset += pool.text(i).len();
        }
        acc.to_value()
    }

    #[test]
    fn chat_entries_are_well_formed_and_include_the_sampled_token() {
        for top in [0u32, 1, 5, 20] {
            let v = run(LogprobsShape::Chat { top }, 200);
            let content = v["content"].as_array().unwrap();
            assert_eq!(content.len(), 200);
            for e in content {
                let lp = e["logprob"].as_f64().unwrap();
                assert!(lp < 0.0);
                let token = e["token"].as_str().unwrap();
                let bytes: Vec<u8> =
                    e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
                assert_eq!(bytes, token.as_bytes());
                let tops = e["top_logprobs"].as_array().unwrap();
                assert_eq!(tops.len(), top as usize);
                let values: Vec<f64> = tops.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
                assert!(values.windows(2).all(|w| w[0] > w[1]), "{values:?}");
                if top > 0 {
                    assert!(
                        tops.iter().any(|t| t["token"] == e["token"] && t["logprob"] == e["logprob"]),
                        "{e}"
                    );
                    let mut texts: Vec<&str> = tops.iter().map(|t| t["token"].as_str().unwrap()).collect();
                    texts.sort();
                    texts.dedup();
                    assert_eq!(texts.len(), top as usize, "alternatives are distinct: {e}");
                }
            }
        }
    }

    #[test]
    fn completion_columns_line_up() {
        let v = run(LogprobsShape::Completion { top: 3 }, 50);
        let tokens = v["tokens"].as_array().unwrap();
        let values = v["token_logprobs"].as_array().unwrap();
        let tops = v["top_logprobs"].as_array().unwrap();
        let offsets = v["text_offset"].as_array().unwrap();
        assert!([values.len(), tops.len(), offsets.len()].iter().all(|&n| n == tokens.len() && n == 50));
        let mut expect = 0;
        for i in 0..50 {
            assert_eq!(offsets[i].as_u64().unwrap(), expect);
            expect += tokens[i].as_str().unwrap().len() as u64;
            let top = tops[i].as_object().unwrap();
            assert_eq!(top.len(), 3);
            assert_eq!(top[tokens[i].as_str().unwrap()], values[i]);
            assert!(top.values().all(|x| x.as_f64().unwrap() < 0.0));
        }
        // Deterministic under the key.
        assert_eq!(v, run(LogprobsShape::Completion { top: 3 }, 50));
        // `logprobs: 0`: each dict holds just the sampled token.
        let v = run(LogprobsShape::Completion { top: 0 }, 20);
        for (t, top) in v["tokens"].as_array().unwrap().iter().zip(v["top_logprobs"].as_array().unwrap()) {
            assert_eq!(top.as_object().unwrap().keys().collect::<Vec<_>>(), [t.as_str().unwrap()]);
        }
    }

    #[test]
    fn a_cleared_accumulator_starts_a_new_chunk() {
        let pool = OutputVocab::builtin();
        let s = Sampler::seeded(1, &[], 0);
        let mut acc = LogprobsAcc::new(LogprobsShape::Chat { top: 2 });
        acc.push(&s, &pool, 0, " a", None, 0);
        acc.clear();
        acc.push(&s, &pool, 1, " b", None, 2);
        let v = acc.to_value();
        assert_eq!(v["content"].as_array().unwrap().len(), 1);
        assert_eq!(v["content"][0]["token"], " b");
    }
}
