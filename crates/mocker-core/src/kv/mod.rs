//! Paged KV-cache management for vLLM-style engines.

mod pool;

pub use pool::{BlockId, BlockPool, PrefixMatch};
