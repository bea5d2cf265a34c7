//! `kv_cache_groups` and `kv_cache_capacity_bytes`: hybrid KV caches (full attention beside
//! sliding-window or convolution layers) sharing one byte budget per rank, with the
//! reference's shape, rules and messages (docs/hybrid-kv.md §1).

use serde::Serialize;
use serde_json::Value;

use super::parse::{join, to_string, to_uint, Obj};
use super::{invalid_choice, type_err, Backend, ConfigError, EngineConfig, Result, WorkerType};

/// Largest byte figure the reference accepts (a page or the capacity): 2^53, the largest
/// integer a JSON number carries exactly.
pub const MAX_EXACT_BYTES: u64 = 1 << 53;

const GROUP_KEYS: &str = "name kind num_layers block_size_tokens page_size_bytes sliding_window";

string_enum! {
    /// What a cache group's layers keep; only validation tells the kinds apart.
    CacheGroupKind {
        /// Attention layers: full history, or a sliding window.
        #[default]
        Attention = "attention",
        /// Convolution (or recurrent-state) layers: always a window.
        Convolution = "convolution",
    }
}

/// One cache group: layers that page their KV alike (`kv_cache_groups[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvCacheGroup {
    /// Non-blank, unique within the list.
    pub name: String,
    /// Attention or convolution.
    pub kind: CacheGroupKind,
    /// Layers in the group; informational (a page already covers all of them).
    pub num_layers: u32,
    /// Tokens per page of this group, independent of the engine's `block_size`.
    pub block_size_tokens: u32,
    /// Bytes of one page covering every layer of the group, padding included.
    pub page_size_bytes: u64,
    /// Retained history in tokens (`None`: the full history); required for convolution.
    pub sliding_window: Option<u32>,
}

/// Reads the `kv_cache_groups` list (strict objects, as the reference's serde shape).
pub(super) fn parse_groups(v: &Value, path: &str) -> Result<Vec<KvCacheGroup>> {
    let items = v.as_array().ok_or_else(|| type_err(path, "an array", v))?;
    let group = |(i, item): (usize, &Value)| {
        let o = Obj::new(item, &format!("{path}[{i}]"), GROUP_KEYS)?;
        Ok(KvCacheGroup {
            name: o.must("name", to_string)?,
            kind: o.must("kind", CacheGroupKind::parse)?,
            num_layers: o.must("num_layers", to_uint)?,
            block_size_tokens: o.must("block_size_tokens", to_uint)?,
            page_size_bytes: o.must("page_size_bytes", to_uint)?,
            sliding_window: o.opt("sliding_window", to_uint)?,
        })
    };
    items.iter().enumerate().map(group).collect()
}

impl EngineConfig {
    /// Whether the engine pages its KV by cache groups instead of the linear block pool.
    pub fn has_kv_cache_groups(&self) -> bool {
        !self.kv_cache_groups.is_empty()
    }

    /// The reference's rules for `kv_cache_groups` and `kv_cache_capacity_bytes`, in its
    /// order (the first failure is reported, with its message).
    pub(super) fn validate_kv_cache_groups(&self, p: &str) -> Result<()> {
        let groups_path = join(p, "kv_cache_groups");
        let fail = |msg: &str| Err(ConfigError::new(groups_path.clone(), msg));
        if self.kv_cache_groups.is_empty() {
            if self.kv_cache_capacity_bytes.is_some() {
                let msg = "kv_cache_capacity_bytes requires kv_cache_groups";
                return Err(ConfigError::new(join(p, "kv_cache_capacity_bytes"), msg));
            }
            return Ok(());
        }
        if self.backend != Backend::Vllm || self.worker_type != WorkerType::Aggregated {
            return fail("kv_cache_groups currently require backend=vllm and worker_type=aggregated");
        }
        if self.enable_prefix_caching {
            return fail(
                "kv_cache_groups currently require enable_prefix_caching=false (it defaults to true)",
            );
        }
        if self.native_host_offload.is_some() || self.g3_offload.is_some() {
            return fail("kv_cache_groups currently support only HBM without host or G3 offload");
        }
        if self.aic_nextn.is_some() {
            return fail("kv_cache_groups currently do not support speculative decoding");
        }
        if self.emit_kv_events || self.emit_kv_token_ids {
            return fail("kv_cache_groups currently do not support KV event or token-ID emission");
        }
        if self.kv_cache_bytes_per_token.is_some()
            || self.kv_transfer_bytes_per_token.is_some()
            || self.kv_transfer_bandwidth.is_some()
        {
            return fail("kv_cache_groups cannot use linear cache or KV transfer byte geometry");
        }
        if !self.kv_cache_capacity_bytes.is_some_and(|c| c > 0 && c <= MAX_EXACT_BYTES) {
            let msg = "kv_cache_groups require positive kv_cache_capacity_bytes at most 2^53";
            return Err(ConfigError::new(join(p, "kv_cache_capacity_bytes"), msg));
        }
        let mut names = std::collections::HashSet::new();
        for (i, g) in self.kv_cache_groups.iter().enumerate() {
            let at = format!("{groups_path}[{i}]");
            let bad = g.name.trim().is_empty()
                || g.num_layers == 0
                || g.block_size_tokens == 0
                || g.page_size_bytes == 0
                || g.page_size_bytes > MAX_EXACT_BYTES
                || g.sliding_window == Some(0);
            if bad {
                let msg = "invalid engine config: cache group requires a name, positive \
                           layers/block/page/window, and page_size_bytes <= 2**53";
                return Err(ConfigError::new(at, msg));
            }
            if g.kind == CacheGroupKind::Convolution && g.sliding_window.is_none() {
                let msg = "invalid engine config: convolution cache groups require a sliding_window";
                return Err(ConfigError::new(at, msg));
            }
            if !names.insert(g.name.as_str()) {
                return Err(ConfigError::new(at, format!("duplicate KV cache group name {:?}", g.name)));
            }
        }
        Ok(())
    }
}
