//! What the simulated model writes: the token pool output is drawn from, the keyed sampler
//! behind text and log-probabilities, stop conditions, and JSON generated from schemas.

pub mod logprobs;
pub mod sampler;
pub mod schema;
pub mod stop;
pub mod vocab;
pub mod words;

/// Appends `s` as a JSON string, as serde_json writes it: text that needs no escaping (the
/// common case) is copied as is.
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        serde_json::to_writer(&mut *out, s).expect("strings serialize");
    } else {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}
