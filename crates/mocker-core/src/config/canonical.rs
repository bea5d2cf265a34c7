//! The canonical JSON dump: the nested form with every default filled in, keyed and ordered like
//! the reference (field order comes from the struct definitions in `mod.rs`).

use serde::Serialize;
use serde_json::Value;

use super::LaunchConfig;

impl LaunchConfig {
    /// The canonical nested form with every default filled in, keyed like the reference.
    pub fn to_canonical_json(&self) -> Value {
        serde_json::to_value(self).expect("plain data always serialises")
    }
}

/// The reference stores bytes-per-token as an integer; print whole values the same way.
pub(super) fn whole_as_integer<S: serde::Serializer>(
    v: &Option<f64>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match v {
        Some(b) if b.fract() == 0.0 && (0.0..9.0e15).contains(b) => s.serialize_some(&(*b as u64)),
        _ => v.serialize(s),
    }
}
