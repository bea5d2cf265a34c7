//! The simulated model's choices, as pure functions of a per-sequence key and a position:
//! which pool entry is token `p`, and its log-probabilities. A `seed` makes the key a hash
//! of the seed, the prompt and the choice index (same seed and prompt, same text); without
//! one the key is random. Each draw is a couple of multiplications, no state, no allocation.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Most alternatives `top_logprobs` may ask for (vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// Draws for one output sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampler {
    key: u64,
}

/// splitmix64's finaliser: a bijective mix with full avalanche.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Sampler {
    /// The sampler of choice `choice` of a request with `seed` and prompt `prompt`.
    pub fn seeded(seed: u64, prompt: &[u32], choice: u32) -> Self {
        let mut bytes = Vec::with_capacity(prompt.len() * 4);
        for t in prompt {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        let prompt_hash = xxh3_64_with_seed(&bytes, seed);
        Self { key: mix(prompt_hash ^ mix(u64::from(choice).wrapping_add(GOLDEN))) }
    }

    /// A sampler with a fresh random key.
    pub fn random() -> Self {
        Self { key: uuid::Uuid::new_v4().as_u64_pair().0 }
    }

    /// A 64-bit draw for position `pos` in stream `stream` (tokens, logprobs, structure, ...).
    pub fn draw(&self, stream: u64, pos: u64) -> u64 {
        mix(self.key ^ mix(stream.wrapping_mul(GOLDEN) ^ pos.wrapping_mul(0xD6E8_FEB8_6659_FD93)))
    }

    /// An index below `n` (`n > 0`) for position `pos` of `stream`.
    pub fn pick(&self, stream: u64, pos: u64, n: usize) -> usize {
        // Multiply-shift: unbiased enough for simulated text and cheaper than `%`.
        ((u128::from(self.draw(stream, pos)) * n as u128) >> 64) as usize
    }

    /// The pool entry of output token `pos` when the pool has `n` entries.
    pub fn token(&self, pos: u32, n: usize) -> usize {
        self.pick(0, u64::from(pos), n)
    }

    /// Log-probabilities around token `pos`: the ranked values (descending, all < 0) and
    /// the sampled token's rank among them (0 most of the time, 1 otherwise, as a sampler
    /// at temperature 1 would pick).
    pub fn logprobs(&self, pos: u32) -> Ranked {
        let h = self.draw(1, u64::from(pos));
        let mut values = [0f32; MAX_TOP_LOGPROBS as usize + 1];
        let mut v = -0.001 - (h & 0xFFFF) as f32 / 65536.0 * 0.4;
        for (j, slot) in values.iter_mut().enumerate() {
            *slot = v;
            let u = ((h >> (16 + (j % 3) * 16)) & 0xFFFF) as f32 / 65536.0;
            v -= 0.15 + u * 1.2;
        }
        Ranked { values, sampled_rank: usize::from((h >> 60) < 3) }
    }
}

/// Log-probabilities of the most likely tokens at one position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranked {
    /// Descending, rank 0 first.
    pub values: [f32; MAX_TOP_LOGPROBS as usize + 1],
    /// The sampled token's rank.
    pub sampled_rank: usize,
}

impl Ranked {
    /// The sampled token's log-probability.
    pub fn sampled(&self) -> f32 {
        self.values[self.sampled_rank]
    }

    /// The `k` entries shown as top log-probabilities, as (rank, is the sampled token):
    /// the `k` best, except that the sampled token always appears (replacing the last
    /// when it ranks below `k`).
    pub fn top(&self, k: usize) -> impl Iterator<Item = (usize, bool)> + '_ {
        let r = self.sampled_rank;
        (0..k).map(move |j| if j + 1 == k && r >= k { (r, true) } else { (j, j == r) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_draws_repeat_and_differ_by_seed_prompt_and_choice() {
        let a = Sampler::seeded(7, &[1, 2, 3], 0);
        assert_eq!(a, Sampler::seeded(7, &[1, 2, 3], 0));
        for other in [
            Sampler::seeded(8, &[1, 2, 3], 0),
            Sampler::seeded(7, &[1, 2, 4], 0),
            Sampler::seeded(7, &[1, 2, 3], 1),
        ] {
            let same = (0..64).filter(|&p| a.token(p, 1000) == other.token(p, 1000)).count();
            assert!(same < 5, "{same} of 64 tokens equal");
        }
        assert_ne!(Sampler::random(), Sampler::random());
    }

    #[test]
    fn picks_cover_the_pool_evenly() {
        let s = Sampler::seeded(1, &[], 0);
        let mut hits = [0u32; 10];
        for p in 0..10_000 {
            hits[s.token(p, 10)] += 1;
        }
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
    }

    #[test]
    fn logprobs_are_negative_descending_and_include_the_sampled_token() {
        let s = Sampler::seeded(3, &[9], 0);
        let mut second = 0;
        for p in 0..1000 {
            let r = s.logprobs(p);
            assert!(r.values.windows(2).all(|w| w[0] > w[1]) && r.values[0] < 0.0, "{r:?}");
            second += usize::from(r.sampled_rank == 1);
            for k in 1..=5 {
                let top: Vec<_> = r.top(k).collect();
                assert_eq!(top.len(), k);
                assert_eq!(top.iter().filter(|t| t.1).count(), 1, "{top:?}");
                assert!(top.windows(2).all(|w| w[0].0 < w[1].0));
            }
            assert_eq!(r.top(0).count(), 0);
        }
        assert!((100..300).contains(&second), "{second}");
        assert_eq!(s.logprobs(5), Sampler::seeded(3, &[9], 0).logprobs(5));
    }
}
