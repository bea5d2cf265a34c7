//! KV-cache management: the vLLM-style paged block pool and SGLang's radix prefix cache.

mod pool;
pub mod radix;

pub use pool::{BlockId, BlockPool, PrefixMatch, Scope};
pub use radix::RadixCache;
