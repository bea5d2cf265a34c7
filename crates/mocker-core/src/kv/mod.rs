//! KV-cache management: the vLLM-style paged block pool, its host-memory tier, the byte
//! budget of hybrid cache groups and SGLang's radix prefix cache.

pub mod g3_tier;
pub mod groups;
pub mod host_tier;
mod pool;
mod prefetch;
pub mod radix;

pub use g3_tier::{G3Stats, G3Tier, SharedG3};
pub use groups::{GroupLease, GroupedPool};
pub use host_tier::{HostTier, HostTierOptions};
pub use pool::{BlockId, BlockPool, PrefixMatch, Scope};
pub use prefetch::prefetch;
pub use radix::RadixCache;
