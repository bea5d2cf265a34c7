//! `state_cache` and `prefix_match_unit`: a fixed recurrent state per request (Mamba,
//! linear attention) kept in the same block pool as the attention KV, with the reference's
//! shape, rules, order and messages (docs/hybrid-kv.md §2.1).

use serde::Serialize;
use serde_json::{Map, Value};

use super::parse::{join, to_uint, Obj};
use super::{Backend, ConfigError, EngineConfig, KvTransferTimingMode, Result, WorkerType};

/// The per-request recurrent state (`state_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StateCacheConfig {
    /// Bytes of one working state or checkpoint; a positive number. It costs
    /// `ceil(bytes_per_request / (block_size * kv_cache_bytes_per_token))` blocks of
    /// `num_gpu_blocks` (see [`EngineConfig::state_blocks`]).
    pub bytes_per_request: u64,
}

/// Reads `state_cache` (a strict object, as the reference's serde shape).
pub(super) fn parse_state_cache(v: &Value, path: &str) -> Result<StateCacheConfig> {
    let o = Obj::new(v, path, "bytes_per_request")?;
    Ok(StateCacheConfig { bytes_per_request: o.must("bytes_per_request", to_uint)? })
}

/// The reference checks this while reading the engine args, before any other rule: its
/// defaults (`num_gpu_blocks` 16384, the backend's block size) would size a state pool by
/// accident, so the geometry must be written out. A null counts as not given.
pub(super) fn require_explicit_geometry(engine: &Map<String, Value>, path: &str) -> Result<()> {
    let given = |k: &str| engine.get(k).is_some_and(|v| !v.is_null());
    let has_state = given("state_cache");
    if has_state && !(given("num_gpu_blocks") && given("block_size") && given("kv_cache_bytes_per_token")) {
        let msg = "state_cache requires explicit num_gpu_blocks, block_size and kv_cache_bytes_per_token";
        return Err(ConfigError::new(join(path, "state_cache"), msg));
    }
    Ok(())
}

impl EngineConfig {
    /// Blocks one state occupies (`None` without a state cache): its bytes over a block's
    /// bytes, rounded up. Valid configurations only (validation refuses a zero divisor).
    pub fn state_blocks(&self) -> Option<usize> {
        let s = self.state_cache?;
        let per_token = self.kv_cache_bytes_per_token.unwrap_or(1).max(1);
        let block_bytes = (self.block_size as u64).saturating_mul(per_token).max(1);
        Some(usize::try_from(s.bytes_per_request.div_ceil(block_bytes)).unwrap_or(usize::MAX))
    }

    /// The reference's rules for `prefix_match_unit` and `state_cache`, in its order; they
    /// run before every other engine rule, as the reference's do.
    pub(super) fn validate_state_cache(&self, p: &str) -> Result<()> {
        let unit_path = join(p, "prefix_match_unit");
        let state_path = join(p, "state_cache");
        let state_err = |msg: &str| Err(ConfigError::new(state_path.clone(), msg));
        if let Some(unit) = self.prefix_match_unit {
            let bs = self.block_size;
            if unit == 0 || bs == 0 || !bs.is_multiple_of(unit) {
                let msg = "prefix_match_unit must be a positive divisor of block_size";
                return Err(ConfigError::new(unit_path, msg));
            }
            if self.state_cache.is_none() {
                return Err(ConfigError::new(unit_path, "prefix_match_unit currently requires state_cache"));
            }
            if self.emit_kv_events {
                let msg = "prefix_match_unit does not yet support KV event export";
                return Err(ConfigError::new(unit_path, msg));
            }
        }
        let Some(state) = self.state_cache else { return Ok(()) };
        if self.backend != Backend::Vllm {
            return state_err("state_cache is supported only for backend=vllm");
        }
        if self.worker_type != WorkerType::Aggregated {
            return state_err("state_cache is supported only for worker_type=aggregated");
        }
        if self.native_host_offload.is_some() {
            return state_err(
                "state_cache does not support native_host_offload in the G1-only implementation",
            );
        }
        if self.g3_offload.is_some() {
            return state_err("state_cache does not support g3_offload in the G1-only implementation");
        }
        if self.kv_transfer_bytes_per_token.is_some() || self.kv_transfer_bandwidth.is_some() {
            return state_err(
                "state_cache does not support kv_transfer_bytes_per_token or kv_transfer_bandwidth",
            );
        }
        if self.kv_transfer_timing_mode != KvTransferTimingMode::FullPrompt {
            return state_err("state_cache does not support non-default kv_transfer_timing_mode");
        }
        if self.prefix_match_unit.is_some() && self.aic_nextn.is_some() {
            return Err(ConfigError::new(
                unit_path,
                "prefix_match_unit does not support speculative decoding",
            ));
        }
        if state.bytes_per_request == 0 {
            return state_err("state_cache.bytes_per_request must be positive");
        }
        if self.block_size < 2 {
            return state_err("state_cache requires block_size at least two");
        }
        let Some(per_token) = self.kv_cache_bytes_per_token.filter(|&b| b > 0) else {
            return state_err("state_cache requires positive kv_cache_bytes_per_token");
        };
        let blocks = state.bytes_per_request.div_ceil((self.block_size as u64).saturating_mul(per_token));
        if (self.num_gpu_blocks as u64) < blocks.saturating_add(1) {
            return state_err("state_cache capacity must fit one token block and one working state");
        }
        Ok(())
    }
}
