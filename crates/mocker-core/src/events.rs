//! KV-cache events the block manager implies, returned as values for shells to publish.

/// One block made visible by a `Stored` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlock {
    /// Sequence (chained) hash: the block's prefix-cache identity.
    pub block_hash: u64,
    /// Hash of the block's own tokens.
    pub tokens_hash: u64,
    /// The block's tokens, when the engine was asked to carry them.
    pub token_ids: Option<Vec<u32>>,
}

/// What changed in a rank's prefix cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEventData {
    /// A run of consecutive blocks became reusable; `parent_hash` is the block before the
    /// run (`None` at the sequence root).
    Stored {
        /// Sequence hash of the block preceding the run.
        parent_hash: Option<u64>,
        /// The run, root first.
        blocks: Vec<StoredBlock>,
        /// The LoRA adapter whose request computed the blocks (`None`: the base model).
        lora: Option<crate::request::LoraRef>,
    },
    /// The last copies of these blocks were evicted.
    Removed {
        /// Sequence hashes of the evicted blocks.
        block_hashes: Vec<u64>,
    },
    /// Every cached block was dropped (cache reset).
    Cleared,
}

/// A KV event stamped with its per-rank id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEvent {
    /// Per-rank counter, from 0, +1 per event.
    pub event_id: u64,
    /// Data-parallel rank that owns the blocks.
    pub dp_rank: u32,
    /// The change.
    pub data: KvEventData,
}
