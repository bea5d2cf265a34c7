//! Block identities: the same XXH3 hashes the reference uses, so KV events and prefix
//! hits line up with Dynamo's router and indexer.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every block hash (the reference's `compute_block_hash_for_seq`).
pub const BLOCK_HASH_SEED: u64 = 1337;

/// Hash of one full block's tokens (the "local" or tokens hash).
#[inline]
pub fn local_block_hash(tokens: &[u32]) -> u64 {
    // Tokens are hashed as little-endian u32 bytes; on little-endian hosts that is the
    // in-memory layout, so no copy is needed.
    #[cfg(target_endian = "little")]
    {
        // SAFETY: u32 has no padding and any byte pattern is a valid u8.
        let bytes = unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        };
        xxh3_64_with_seed(bytes, BLOCK_HASH_SEED)
    }
    #[cfg(not(target_endian = "little"))]
    {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&bytes, BLOCK_HASH_SEED)
    }
}

/// Chains a block's local hash onto its parent's sequence hash; the result identifies the
/// block together with everything before it (the prefix-cache key).
#[inline]
pub fn chain_hash(parent_sequence_hash: u64, local_hash: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&parent_sequence_hash.to_le_bytes());
    buf[8..].copy_from_slice(&local_hash.to_le_bytes());
    xxh3_64_with_seed(&buf, BLOCK_HASH_SEED)
}

/// Local hashes of every complete block of `tokens` (a trailing partial block has none),
/// as the reference's `compute_block_hash_for_seq` returns them.
pub fn compute_block_hash_for_seq(tokens: &[u32], block_size: usize) -> Vec<u64> {
    tokens.chunks_exact(block_size).map(local_block_hash).collect()
}

/// Appends the sequence hashes of every complete block of `tokens` to `out`, reusing the
/// previous hash for consecutive identical blocks (common in synthetic traces).
pub fn extend_sequence_hashes(tokens: &[u32], block_size: usize, out: &mut Vec<u64>) {
    extend_hashes(None, tokens, block_size, out, None);
}

/// Block identities of a prompt's complete blocks, computed once by whoever holds the
/// tokens first (a prompt-synthesis thread, a router, the engine at submit).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptHashes {
    /// Sequence hashes: the prefix-cache keys.
    pub sequence: Vec<u64>,
    /// Local (tokens) hashes, which KV events carry beside the sequence hashes.
    pub local: Vec<u64>,
}

impl PromptHashes {
    /// The hashes of every complete `block_size`-token block of `tokens`.
    pub fn of(tokens: &[u32], block_size: usize) -> Self {
        let mut h = Self::default();
        extend_hashes(None, tokens, block_size, &mut h.sequence, Some(&mut h.local));
        h
    }

    /// The hashes of a prompt whose first block chains onto `root` (`None`: the sequence
    /// root, as [`PromptHashes::of`]; a LoRA request's [`lora_hash_root`]).
    pub fn rooted(tokens: &[u32], block_size: usize, root: Option<u64>) -> Self {
        let mut h = Self::default();
        extend_hashes(root, tokens, block_size, &mut h.sequence, Some(&mut h.local));
        h
    }

    /// Only the sequence hashes (`local` left empty), for engines that record no KV
    /// events and so never need the local ones.
    pub fn sequence_only(tokens: &[u32], block_size: usize) -> Self {
        let mut h = Self::default();
        extend_hashes(None, tokens, block_size, &mut h.sequence, None);
        h
    }
}

/// The parent sequence hash of the first block of a request run with LoRA adapter `name`:
/// a block's identity then depends on the adapter as on everything before it.
pub fn lora_hash_root(name: &str) -> u64 {
    // Tagged so that a name's bytes never read as a block of token ids.
    let mut buf = Vec::with_capacity(name.len() + 5);
    buf.extend_from_slice(b"lora\0");
    buf.extend_from_slice(name.as_bytes());
    xxh3_64_with_seed(&buf, BLOCK_HASH_SEED)
}

/// [`extend_sequence_hashes`] for blocks that follow a block with sequence hash `parent`
/// (`None` at the start of a sequence, so a prompt whose leading blocks were hashed
/// already continues from there), also appending each block's local hash to `locals`.
pub fn extend_hashes(
    parent: Option<u64>,
    tokens: &[u32],
    block_size: usize,
    out: &mut Vec<u64>,
    mut locals: Option<&mut Vec<u64>>,
) {
    out.reserve(tokens.len() / block_size);
    if let Some(l) = locals.as_deref_mut() {
        l.reserve(tokens.len() / block_size);
    }
    let mut parent = parent;
    let mut prev_block: Option<&[u32]> = None;
    let mut prev_local = 0;
    for block in tokens.chunks_exact(block_size) {
        let local = match prev_block {
            Some(p) if p == block => prev_local,
            _ => local_block_hash(block),
        };
        let seq = match parent {
            None => local,
            Some(p) => chain_hash(p, local),
        };
        out.push(seq);
        if let Some(l) = locals.as_deref_mut() {
            l.push(local);
        }
        parent = Some(seq);
        prev_block = Some(block);
        prev_local = local;
    }
}

/// Sequence hashes of every complete block of `tokens`.
pub fn sequence_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut out = Vec::new();
    extend_sequence_hashes(tokens, block_size, &mut out);
    out
}

/// Identities for blocks `blocks` of request `uuid` that no other request can ever hold
/// (offline replay: the unique part of a synthetic prompt, and, where outputs never
/// reappear in prompts, every block of generated tokens), appended to `out`.
///
/// Such a block's content hash equals another's only for the same request at the same
/// index (request ids are unique), so any values distinct per (request, index) are as good
/// as content hashes for cache keys, and a mix per block is far cheaper than hashing a
/// block of tokens. The values are not the reference's: only for keys that stay in the
/// process.
pub fn extend_unique_identities(uuid: u128, blocks: std::ops::Range<u32>, out: &mut Vec<u64>) {
    let seed = identity_seed(uuid);
    out.extend(blocks.map(|b| splitmix64(seed.wrapping_add(u64::from(b)))));
}

/// One identity of [`extend_unique_identities`].
#[inline]
pub fn unique_block_identity(uuid: u128, index: u32) -> u64 {
    splitmix64(identity_seed(uuid).wrapping_add(u64::from(index)))
}

#[inline]
fn identity_seed(uuid: u128) -> u64 {
    splitmix64(splitmix64(uuid as u64) ^ (uuid >> 64) as u64)
}

/// Folds `value` into `acc`: a cheap, order-sensitive mix for identities that stay in the
/// process (as [`extend_unique_identities`]) and are built from what a block holds, so
/// that they are equal exactly when the folded values are (up to 64-bit collisions).
#[inline]
pub fn mix_identity(acc: u64, value: u64) -> u64 {
    splitmix64(acc ^ splitmix64(value))
}

/// SplitMix64's finaliser: a cheap bijective mix of 64 bits.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The token the reference generates at output position `k` of request `uuid` when no
/// planned output is given: deterministic, so replays produce identical block hashes.
#[inline]
pub fn deterministic_output_token(uuid: u128, k: u64) -> u32 {
    OutputTokens::new(uuid).at(k)
}

/// One request's deterministic output tokens ([`deterministic_output_token`]), with the
/// part of the hash that depends only on the request id computed once.
///
/// The token is the low half of XXH3-64 (seed 0) over the 24 bytes `uuid` (big-endian)
/// ++ `k` (little-endian). XXH3 hashes 17..=32 bytes as two 16-byte mixes of input and
/// its default secret plus an avalanche; the first mix covers only the id. Hashing a
/// generated block costs one such token per position, so this halves that loop; the
/// tests check it against the xxhash crate on random inputs.
#[derive(Debug, Clone, Copy)]
pub struct OutputTokens {
    /// Length term plus the first mix (input bytes 0..16).
    base: u64,
    /// Input bytes 8..16 of the second mix, keyed.
    lo_keyed: u64,
}

/// XXH3's default secret, bytes 0..32 as little-endian words (the format's constants).
const XXH3_SECRET: [u64; 4] =
    [0xbe4b_a423_396c_feb8, 0x1cad_21f7_2c81_017c, 0xdb97_9083_e96d_d4de, 0x1f67_b3b7_a4a4_4072];
/// XXH64/XXH3 prime 1, which scales the input length.
const XXH_PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;

#[inline(always)]
fn mul128_fold64(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl OutputTokens {
    /// The tokens of request `uuid`.
    #[inline]
    pub fn new(uuid: u128) -> Self {
        // Little-endian reads of the big-endian id bytes.
        let hi = ((uuid >> 64) as u64).swap_bytes();
        let lo = (uuid as u64).swap_bytes();
        let base = 24u64
            .wrapping_mul(XXH_PRIME64_1)
            .wrapping_add(mul128_fold64(hi ^ XXH3_SECRET[0], lo ^ XXH3_SECRET[1]));
        Self { base, lo_keyed: lo ^ XXH3_SECRET[2] }
    }

    /// The token at output position `k`.
    #[inline]
    pub fn at(&self, k: u64) -> u32 {
        let mut h = self.base.wrapping_add(mul128_fold64(self.lo_keyed, k ^ XXH3_SECRET[3]));
        h ^= h >> 37;
        h = h.wrapping_mul(0x1656_6791_9E37_79F9);
        h ^= h >> 32;
        h as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_hashes_match_reference_values() {
        let tokens: Vec<u32> = (1..=10).collect();
        assert_eq!(compute_block_hash_for_seq(&tokens, 4), vec![14643705804678351452, 16777012769546811212]);
        assert_eq!(sequence_hashes(&tokens, 4), vec![14643705804678351452, 4945711292740353085]);
    }

    #[test]
    fn prompt_hashes_pair_each_sequence_hash_with_its_local_hash() {
        let tokens: Vec<u32> = (0..64 * 3 + 5).map(|t| t % 70).collect();
        let h = PromptHashes::of(&tokens, 64);
        assert_eq!(h.sequence, sequence_hashes(&tokens, 64));
        assert_eq!(h.local, compute_block_hash_for_seq(&tokens, 64));
    }

    #[test]
    fn identical_block_shortcut_gives_same_hashes() {
        let tokens = vec![7u32; 64 * 5 + 3];
        let fast = sequence_hashes(&tokens, 64);
        let mut slow = Vec::new();
        let mut parent = None;
        for b in tokens.chunks_exact(64) {
            let l = local_block_hash(b);
            let s = parent.map_or(l, |p| chain_hash(p, l));
            slow.push(s);
            parent = Some(s);
        }
        assert_eq!(fast, slow);
        assert_eq!(fast.len(), 5);
        // Position-aware: equal blocks at different depths have different identities.
        assert_ne!(fast[0], fast[1]);
    }

    #[test]
    fn output_tokens_equal_xxh3_of_id_and_position() {
        // splitmix64 stream: ids with every byte pattern, positions small and huge.
        let mut z = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        for case in 0..2000u64 {
            let uuid = (u128::from(next()) << 64) | u128::from(next());
            let uuid = if case < 4 { case as u128 } else { uuid };
            let tokens = OutputTokens::new(uuid);
            for k in [0, 1, case, next(), u64::MAX] {
                let mut buf = [0u8; 24];
                buf[..16].copy_from_slice(&uuid.to_be_bytes());
                buf[16..].copy_from_slice(&k.to_le_bytes());
                assert_eq!(tokens.at(k), xxh3_64_with_seed(&buf, 0) as u32, "uuid {uuid:#x} k {k}");
            }
        }
    }

    #[test]
    fn deterministic_tokens_match_reference_values() {
        let got: Vec<u32> = (0..4).map(|k| deterministic_output_token(1, k)).collect();
        assert_eq!(got, vec![2515880452, 3600266899, 2716793611, 2249174135]);
        assert_eq!(deterministic_output_token(2, 0), 1927195132);
    }
}
