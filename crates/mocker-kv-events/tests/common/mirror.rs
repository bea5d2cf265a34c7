//! Our own mirror of vLLM's event types, decoded from msgpack (positional, tag first) with
//! rmp-serde, or from the Python subscriber's JSON (`{"type": ..., field: ...}`).

use std::fmt;

use mocker_core::events::{KvEvent, KvEventData};
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type")]
pub enum DecodedEvent {
    #[serde(rename = "BlockStored")]
    Stored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_id: Option<u64>,
        medium: Option<String>,
        lora_name: Option<String>,
        /// Only whether it is present (we always send nil).
        #[serde(default, deserialize_with = "present")]
        extra_keys: Option<()>,
        group_idx: Option<u32>,
    },
    #[serde(rename = "BlockRemoved")]
    Removed { block_hashes: Vec<u64>, medium: Option<String>, group_idx: Option<u32> },
    #[serde(rename = "AllBlocksCleared")]
    Cleared,
}

impl DecodedEvent {
    /// What the wire must carry for a core event.
    pub fn from_core(e: &KvEvent) -> Self {
        match &e.data {
            KvEventData::Stored { parent_hash, blocks, lora } => DecodedEvent::Stored {
                block_hashes: blocks.iter().map(|b| b.block_hash).collect(),
                parent_block_hash: *parent_hash,
                token_ids: blocks
                    .iter()
                    .flat_map(|b| b.token_ids.clone().expect("token ids recorded"))
                    .collect(),
                block_size: super::scenario::BLOCK_SIZE as u32,
                lora_id: lora.as_ref().map(|l| u64::from(l.id)),
                medium: Some("GPU".into()),
                lora_name: lora.as_ref().map(|l| l.name.to_string()),
                extra_keys: None,
                group_idx: None,
            },
            KvEventData::Removed { block_hashes } => DecodedEvent::Removed {
                block_hashes: block_hashes.clone(),
                medium: Some("GPU".into()),
                group_idx: None,
            },
            KvEventData::Cleared => DecodedEvent::Cleared,
        }
    }
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<()>, D::Error> {
    Ok(Option::<de::IgnoredAny>::deserialize(d)?.map(|_| ()))
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DecodedBatch {
    pub ts: f64,
    pub events: Vec<DecodedEvent>,
    pub dp_rank: Option<u32>,
}

/// Decodes a PUB payload: `[ts, [event...], data_parallel_rank]`.
pub fn decode_payload(payload: &[u8]) -> DecodedBatch {
    let (ts, events, dp_rank): (f64, Vec<Positional>, Option<u32>) =
        rmp_serde::from_slice(payload).expect("payload is a msgpack KVEventBatch array");
    DecodedBatch { ts, events: events.into_iter().map(|p| p.0).collect(), dp_rank }
}

/// An event as vLLM's array_like tagged struct: the class name, then fields in order; no
/// element may be missing and none may follow (we emit no defaulted fields).
struct Positional(DecodedEvent);

impl<'de> Deserialize<'de> for Positional {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        fn next<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(seq: &mut A, what: &str) -> Result<T, A::Error> {
            seq.next_element()?.ok_or_else(|| de::Error::custom(format!("missing field {what}")))
        }
        impl<'de> Visitor<'de> for V {
            type Value = Positional;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a tagged positional KV event array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Positional, A::Error> {
                let tag: String = next(&mut seq, "tag")?;
                let event = match tag.as_str() {
                    "BlockStored" => DecodedEvent::Stored {
                        block_hashes: next(&mut seq, "block_hashes")?,
                        parent_block_hash: next(&mut seq, "parent_block_hash")?,
                        token_ids: next(&mut seq, "token_ids")?,
                        block_size: next(&mut seq, "block_size")?,
                        lora_id: next(&mut seq, "lora_id")?,
                        medium: next(&mut seq, "medium")?,
                        lora_name: next(&mut seq, "lora_name")?,
                        extra_keys: next::<Option<de::IgnoredAny>, _>(&mut seq, "extra_keys")?.map(|_| ()),
                        group_idx: next(&mut seq, "group_idx")?,
                    },
                    "BlockRemoved" => DecodedEvent::Removed {
                        block_hashes: next(&mut seq, "block_hashes")?,
                        medium: next(&mut seq, "medium")?,
                        group_idx: next(&mut seq, "group_idx")?,
                    },
                    "AllBlocksCleared" => DecodedEvent::Cleared,
                    other => return Err(de::Error::custom(format!("unknown event tag {other:?}"))),
                };
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::custom(format!("{tag} has more fields than expected")));
                }
                Ok(Positional(event))
            }
        }
        d.deserialize_seq(V)
    }
}
