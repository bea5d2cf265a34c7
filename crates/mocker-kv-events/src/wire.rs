//! vLLM's KV-event wire format: a msgpack `KVEventBatch` of tagged positional event arrays.
//!
//! vLLM declares its event structs with msgspec `tag=True, array_like=True` (the layout
//! Dynamo's batch decoder requires), so each event is an array whose first element is the
//! class name, followed by every field in declaration order (msgspec's `omit_defaults` does
//! not shorten arrays). We emit the newest array-like declarations field for field, so our
//! payload is byte for byte what msgspec encodes for the same values:
//!
//! * `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name, extra_keys, group_idx]`;
//! * `["BlockRemoved", block_hashes, medium, group_idx]`;
//! * `["AllBlocksCleared"]`;
//!
//! and the batch is `[ts, events, data_parallel_rank]`. Older subscribers (five-field
//! `BlockStored`, no rank) decode it too: msgspec and Dynamo ignore trailing elements. Block hashes are the core's u64
//! sequence hashes, encoded as msgpack integers (vLLM's `ExternalBlockHash` accepts ints, and
//! Dynamo's decoder reads 64-bit ints); `medium` is `"GPU"`; `lora_id` and `lora_name` name
//! the adapter of a LoRA request's blocks (nil for the base model); `extra_keys` and
//! `group_idx` are nil (no extra hash keys, one KV-cache group).
//!
//! A [`PendingBatch`] is the engine-side copy of one pass's events, flattened into three
//! vectors so that copying a pass costs a handful of allocations whatever its size; the
//! background thread encodes it.

use std::ops::Range;

use mocker_core::events::{KvEvent, KvEventData};
use mocker_core::LoraRef;
use serde::ser::{SerializeSeq, SerializeTuple};
use serde::{Serialize, Serializer};

/// The `medium` vLLM reports for device (GPU) blocks.
pub const MEDIUM_GPU: &str = "GPU";

/// One event of a [`PendingBatch`], pointing into the batch's flat vectors.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PendingEvent {
    Stored { hashes: Range<usize>, parent: Option<u64>, tokens: Range<usize>, lora: Option<LoraRef> },
    Removed { hashes: Range<usize> },
    Cleared,
}

/// One forward pass's events, copied off the engine and waiting to be encoded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PendingBatch {
    /// Wall time (unix seconds) the batch was handed over, as vLLM stamps `ts`.
    ts: f64,
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    events: Vec<PendingEvent>,
}

impl PendingBatch {
    /// Copies `events` into a batch stamped `ts`. A Stored event's token ids are the
    /// concatenated tokens of its blocks; blocks the engine recorded without tokens
    /// (`emit_kv_token_ids` off) contribute none.
    pub fn new(ts: f64, events: &[KvEvent]) -> Self {
        let mut batch = Self::default();
        batch.refill(ts, events);
        batch
    }

    /// Replaces the batch's contents with `events`, reusing its buffers.
    pub fn refill(&mut self, ts: f64, events: &[KvEvent]) {
        self.ts = ts;
        self.hashes.clear();
        self.tokens.clear();
        self.events.clear();
        for e in events {
            let event = match &e.data {
                KvEventData::Stored { parent_hash, blocks, lora } => {
                    let (h0, t0) = (self.hashes.len(), self.tokens.len());
                    for b in blocks {
                        self.hashes.push(b.block_hash);
                        if let Some(t) = &b.token_ids {
                            self.tokens.extend_from_slice(t);
                        }
                    }
                    PendingEvent::Stored {
                        hashes: h0..self.hashes.len(),
                        parent: *parent_hash,
                        tokens: t0..self.tokens.len(),
                        lora: lora.clone(),
                    }
                }
                KvEventData::Removed { block_hashes } => {
                    let h0 = self.hashes.len();
                    self.hashes.extend_from_slice(block_hashes);
                    PendingEvent::Removed { hashes: h0..self.hashes.len() }
                }
                KvEventData::Cleared => PendingEvent::Cleared,
            };
            self.events.push(event);
        }
    }

    /// Number of events in the batch.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the batch has no event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Appends the msgpack `KVEventBatch` to `out`.
    pub fn encode(&self, dp_rank: u32, block_size: u32, out: &mut Vec<u8>) {
        let wire = BatchWire { batch: self, dp_rank, block_size };
        wire.serialize(&mut rmp_serde::Serializer::new(out))
            .expect("msgpack encoding into a Vec cannot fail for these types");
    }
}

/// Encodes one pass's events as vLLM's msgpack `KVEventBatch` (the PUB payload).
pub fn encode_batch(ts: f64, events: &[KvEvent], dp_rank: u32, block_size: u32) -> Vec<u8> {
    let mut out = Vec::new();
    PendingBatch::new(ts, events).encode(dp_rank, block_size, &mut out);
    out
}

struct BatchWire<'a> {
    batch: &'a PendingBatch,
    dp_rank: u32,
    block_size: u32,
}

impl Serialize for BatchWire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.batch.ts)?;
        t.serialize_element(&EventsWire(self))?;
        t.serialize_element(&self.dp_rank)?;
        t.end()
    }
}

struct EventsWire<'a>(&'a BatchWire<'a>);

impl Serialize for EventsWire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let b = self.0.batch;
        let mut seq = s.serialize_seq(Some(b.events.len()))?;
        for e in &b.events {
            match e {
                PendingEvent::Stored { hashes, parent, tokens, lora } => {
                    seq.serialize_element(&(
                        "BlockStored",
                        &b.hashes[hashes.clone()],
                        parent,
                        &b.tokens[tokens.clone()],
                        self.0.block_size,
                        lora.as_ref().map(|l| u64::from(l.id)),
                        MEDIUM_GPU,
                        lora.as_ref().map(|l| &*l.name),
                        None::<()>,  // extra_keys
                        None::<u32>, // group_idx
                    ))?;
                }
                PendingEvent::Removed { hashes } => {
                    seq.serialize_element(&(
                        "BlockRemoved",
                        &b.hashes[hashes.clone()],
                        MEDIUM_GPU,
                        None::<u32>,
                    ))?;
                }
                PendingEvent::Cleared => seq.serialize_element(&("AllBlocksCleared",))?,
            }
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mocker_core::events::StoredBlock;

    fn ev(data: KvEventData) -> KvEvent {
        KvEvent { event_id: 0, dp_rank: 0, data }
    }

    /// msgpack str header + bytes for a short string.
    fn fixstr(s: &str) -> Vec<u8> {
        let mut v = vec![0xa0 | s.len() as u8];
        v.extend_from_slice(s.as_bytes());
        v
    }

    #[test]
    fn cleared_batch_bytes_follow_msgpack_spec() {
        let got = encode_batch(1.5, &[ev(KvEventData::Cleared)], 2, 16);
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&1.5f64.to_be_bytes());
        want.extend_from_slice(&[0x91, 0x91]);
        want.extend(fixstr("AllBlocksCleared"));
        want.push(0x02);
        assert_eq!(got, want);
    }

    #[test]
    fn stored_and_removed_bytes_follow_vllm_field_order() {
        let blocks = vec![
            StoredBlock { block_hash: u64::MAX, tokens_hash: 9, token_ids: Some(vec![1, 2]) },
            StoredBlock { block_hash: 5, tokens_hash: 9, token_ids: Some(vec![300, 4]) },
        ];
        let events = [
            ev(KvEventData::Stored { parent_hash: Some(7), blocks, lora: None }),
            ev(KvEventData::Removed { block_hashes: vec![5] }),
        ];
        let got = encode_batch(0.0, &events, 0, 2);
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&0.0f64.to_be_bytes());
        want.push(0x92); // two events
        want.push(0x9a); // BlockStored: tag + 9 fields
        want.extend(fixstr("BlockStored"));
        want.extend([0x92, 0xcf]); // hashes: [u64::MAX, 5]
        want.extend(u64::MAX.to_be_bytes());
        want.push(0x05);
        want.push(0x07); // parent
        want.extend([0x94, 0x01, 0x02, 0xcd, 0x01, 0x2c, 0x04]); // token ids, 300 as uint16
        want.push(0x02); // block_size
        want.push(0xc0); // lora_id nil
        want.extend(fixstr("GPU"));
        want.extend([0xc0, 0xc0, 0xc0]); // lora_name, extra_keys, group_idx: nil
        want.push(0x94); // BlockRemoved: tag + 3 fields
        want.extend(fixstr("BlockRemoved"));
        want.extend([0x91, 0x05]);
        want.extend(fixstr("GPU"));
        want.push(0xc0); // group_idx nil
        want.push(0x00); // dp rank
        assert_eq!(got, want);
    }

    #[test]
    fn a_lora_block_carries_the_adapter_id_and_name() {
        let blocks = vec![StoredBlock { block_hash: 1, tokens_hash: 0, token_ids: None }];
        let lora = Some(mocker_core::LoraRef { id: 3, name: "sql".into() });
        let got = encode_batch(0.0, &[ev(KvEventData::Stored { parent_hash: None, blocks, lora })], 0, 64);
        // ... block_size 64, lora_id 3, "GPU", lora_name "sql", extra_keys nil, group_idx nil
        let mut tail = vec![0x40, 0x03];
        tail.extend(fixstr("GPU"));
        tail.extend(fixstr("sql"));
        tail.extend([0xc0, 0xc0, 0x00]);
        assert!(got.ends_with(&tail), "{got:02x?}");
    }

    #[test]
    fn root_parent_is_nil_and_missing_tokens_give_empty_list() {
        let blocks = vec![StoredBlock { block_hash: 1, tokens_hash: 0, token_ids: None }];
        let got =
            encode_batch(0.0, &[ev(KvEventData::Stored { parent_hash: None, blocks, lora: None })], 3, 64);
        let tail = [0x91, 0x01, 0xc0, 0x90, 0x40, 0xc0];
        let at = 1 + 9 + 1 + 1 + 12; // batch hdr, ts, events hdr, event hdr, tag
        assert_eq!(&got[at..at + tail.len()], &tail);
        assert_eq!(*got.last().unwrap(), 0x03);
    }

    #[test]
    fn flattening_keeps_each_event_in_its_own_range() {
        let b = |h: u64, t: u32| StoredBlock { block_hash: h, tokens_hash: 0, token_ids: Some(vec![t, t]) };
        let events = [
            ev(KvEventData::Stored { parent_hash: None, blocks: vec![b(1, 10), b(2, 20)], lora: None }),
            ev(KvEventData::Removed { block_hashes: vec![8, 9] }),
            ev(KvEventData::Stored { parent_hash: Some(2), blocks: vec![b(3, 30)], lora: None }),
        ];
        // Refilling a used batch leaves nothing of its previous contents.
        let mut p = PendingBatch::new(1.0, &[ev(KvEventData::Removed { block_hashes: vec![4; 9] })]);
        p.refill(0.0, &events);
        assert_eq!(p.ts, 0.0);
        assert_eq!(p.hashes, vec![1, 2, 8, 9, 3]);
        assert_eq!(p.tokens, vec![10, 10, 20, 20, 30, 30]);
        assert_eq!(
            p.events,
            vec![
                PendingEvent::Stored { hashes: 0..2, parent: None, tokens: 0..4, lora: None },
                PendingEvent::Removed { hashes: 2..4 },
                PendingEvent::Stored { hashes: 4..5, parent: Some(2), tokens: 4..6, lora: None },
            ]
        );
    }
}
