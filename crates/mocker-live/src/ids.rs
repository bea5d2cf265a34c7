//! Deterministic request ids and output tokens, bit-exact with the reference (live.md §3.7).

use uuid::Uuid;

/// A request id derived from `(seed, request_id)`: BLAKE3 of the little-endian seed then the
/// UTF-8 id, first 16 bytes, with the RFC 4122 version-4 and variant bits set.
pub fn stable_request_uuid(seed: u64, request_id: &str) -> Uuid {
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(request_id.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&h.finalize().as_bytes()[..16]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    Uuid::from_bytes(b)
}

/// `count` planned output tokens for `(seed, request_id)`, each in `1000..=31999`: position
/// `p` hashes seed, id and `p` (all little-endian) and maps the first 4 digest bytes.
pub fn deterministic_output_tokens(seed: u64, request_id: &str, count: usize) -> Vec<u32> {
    (0..count as u64)
        .map(|p| {
            let mut h = blake3::Hasher::new();
            h.update(&seed.to_le_bytes());
            h.update(request_id.as_bytes());
            h.update(&p.to_le_bytes());
            let d = h.finalize();
            let x = u32::from_le_bytes(d.as_bytes()[..4].try_into().expect("4 bytes"));
            1000 + x % 31000
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // §9 property 28: stable, distinct per id, and the bit layout of the reference.
    #[test]
    fn determinism_of_ids_and_tokens() {
        let a = stable_request_uuid(42, "request-1");
        assert_eq!(a, stable_request_uuid(42, "request-1"));
        assert_ne!(a, stable_request_uuid(42, "request-2"));
        assert_ne!(a, stable_request_uuid(43, "request-1"));
        assert_eq!(a.get_version_num(), 4);
        assert_eq!(a.get_variant(), uuid::Variant::RFC4122);
        // Independent recomputation of the digest layout.
        let mut input = 42u64.to_le_bytes().to_vec();
        input.extend_from_slice(b"request-1");
        let d = blake3::hash(&input);
        assert_eq!(&a.as_bytes()[..6], &d.as_bytes()[..6]);
        assert_eq!(a.as_bytes()[7], d.as_bytes()[7]);
        assert_eq!(&a.as_bytes()[9..], &d.as_bytes()[9..16]);

        let t = deterministic_output_tokens(42, "request-1", 3);
        assert_eq!(t, deterministic_output_tokens(42, "request-1", 3));
        assert_eq!(t.len(), 3);
        assert!(t.iter().all(|x| (1000..=31999).contains(x)));
        assert_eq!(&deterministic_output_tokens(42, "request-1", 5)[..3], &t[..]);
        let mut input = 42u64.to_le_bytes().to_vec();
        input.extend_from_slice(b"request-1");
        input.extend_from_slice(&1u64.to_le_bytes());
        let d = blake3::hash(&input);
        let x = u32::from_le_bytes(d.as_bytes()[..4].try_into().unwrap());
        assert_eq!(t[1], 1000 + x % 31000);
    }
}
