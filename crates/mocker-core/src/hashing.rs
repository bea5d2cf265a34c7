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
    out.reserve(tokens.len() / block_size);
    let mut parent: Option<u64> = None;
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

/// The token the reference generates at output position `k` of request `uuid` when no
/// planned output is given: deterministic, so replays produce identical block hashes.
#[inline]
pub fn deterministic_output_token(uuid: u128, k: u64) -> u32 {
    let mut buf = [0u8; 24];
    buf[..16].copy_from_slice(&uuid.to_be_bytes());
    buf[16..].copy_from_slice(&k.to_le_bytes());
    xxh3_64_with_seed(&buf, 0) as u32
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
    fn deterministic_tokens_match_reference_values() {
        let got: Vec<u32> = (0..4).map(|k| deterministic_output_token(1, k)).collect();
        assert_eq!(got, vec![2515880452, 3600266899, 2716793611, 2249174135]);
        assert_eq!(deterministic_output_token(2, 0), 1927195132);
    }
}
