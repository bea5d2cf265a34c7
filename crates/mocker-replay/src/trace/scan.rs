//! A size check of long trace lines before they are parsed: a row's arrays and objects are
//! counted while the text is walked, without building them, so a row listing millions of
//! hash ids is refused by name instead of being collected (a parsed JSON number takes 32
//! bytes: a few MB of text became gigabytes) before its bounds are checked.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// Lines shorter than this are not walked: they cannot hold more entries than any bound
/// (two bytes an entry at least), and walking every line would slow loading.
pub(crate) const SCAN_MIN_LINE: usize = 64 * 1024;

/// The first array or object of `line` with more than `max` entries: the top-level key it
/// sits under (`row` for the row itself). Malformed JSON passes: the parser words it.
pub(crate) fn oversized(line: &str, max: usize) -> Option<String> {
    let found = RefCell::new(None);
    let seed = Bounded { max, key: "row", found: &found };
    let mut de = serde_json::Deserializer::from_str(line);
    let _ = seed.deserialize(&mut de);
    found.into_inner()
}

#[derive(Clone, Copy)]
struct Bounded<'k, 'f> {
    max: usize,
    key: &'k str,
    found: &'f RefCell<Option<String>>,
}

impl Bounded<'_, '_> {
    fn refuse<E: serde::de::Error>(&self) -> E {
        *self.found.borrow_mut() = Some(self.key.to_string());
        E::custom("too many entries")
    }
}

impl<'de> DeserializeSeed<'de> for Bounded<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let mut n = 0usize;
        while a.next_element_seed(self)?.is_some() {
            n += 1;
            if n > self.max {
                return Err(self.refuse());
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
        let top = self.key == "row";
        let mut n = 0usize;
        while let Some(key) = a.next_key::<String>()? {
            n += 1;
            if n > self.max {
                return Err(self.refuse());
            }
            // Nested values are reported under their top-level key.
            let key = if top { key.as_str() } else { self.key };
            a.next_value_seed(Bounded { key, ..self })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_top_level_key_of_an_oversized_array() {
        let ids: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        let row = format!("{{\"a\": {{\"hash_ids\": [{}]}}, \"b\": 1}}", ids.join(","));
        assert_eq!(oversized(&row, 50), None);
        assert_eq!(oversized(&row, 49).as_deref(), Some("a"));
        assert_eq!(oversized("[1, 2, 3]", 2).as_deref(), Some("row"));
        assert_eq!(oversized("{oops", 2), None, "malformed rows are left to the parser");
    }
}
