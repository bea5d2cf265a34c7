//! `g3_offload`: a third KV tier (disk or remote storage) below the host tier, with the
//! reference's shape, defaults, rules and messages (docs/hybrid-kv.md §3.1).

use serde::Serialize;
use serde_json::Value;

use super::parse::{join, to_f64, to_string, to_uint, Obj};
use super::{ConfigError, EngineConfig, Result, WorkerType};

/// Accepted keys, in the order the reference's message lists them.
pub(super) const G3_KEYS: &str = "scope num_g3_blocks latency_to_first_byte_ms read_bandwidth_gbps \
    write_bandwidth_gbps shared_read_bandwidth_gbps shared_write_bandwidth_gbps";

/// Who shares a G3 pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum G3Scope {
    /// One pool per worker.
    WorkerLocal,
    /// One pool for every worker of the deployment, which read each other's blocks; its
    /// transfers also share the aggregate `shared_*_bandwidth_gbps` caps.
    ClusterShared,
}

/// The G3 tier (`g3_offload`): blocks the host tier completes are written through to it,
/// and a prefix that misses the GPU and host tiers is promoted from it into the host tier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct G3OffloadConfig {
    /// Who shares a pool.
    pub scope: G3Scope,
    /// Capacity in blocks of the host block size (`block_size * kv_cache_bytes_per_token`).
    pub num_g3_blocks: usize,
    /// Delay before a transfer moves its first byte.
    pub latency_to_first_byte_ms: f64,
    /// Per-worker read bandwidth, decimal GB/s, shared by that worker's reads; 0 is unlimited.
    pub read_bandwidth_gbps: f64,
    /// Per-worker write bandwidth, decimal GB/s; 0 is unlimited.
    pub write_bandwidth_gbps: f64,
    /// Aggregate read cap of a `cluster_shared` pool, GB/s; 0 is unlimited.
    pub shared_read_bandwidth_gbps: f64,
    /// Aggregate write cap of a `cluster_shared` pool, GB/s; 0 is unlimited.
    pub shared_write_bandwidth_gbps: f64,
}

impl G3OffloadConfig {
    /// The reference's defaults for the optional fields.
    fn with(scope: G3Scope, num_g3_blocks: usize) -> Self {
        Self {
            scope,
            num_g3_blocks,
            latency_to_first_byte_ms: 0.1,
            read_bandwidth_gbps: 10.0,
            write_bandwidth_gbps: 10.0,
            shared_read_bandwidth_gbps: 80.0,
            shared_write_bandwidth_gbps: 80.0,
        }
    }
}

/// Reads `g3_offload`, a strict object (the reference's serde shape: `scope` and
/// `num_g3_blocks` required, unknown keys refused).
pub(super) fn parse_g3(v: &Value, path: &str) -> Result<G3OffloadConfig> {
    let o = Obj::new(v, path, G3_KEYS)?;
    let scope = match o.must("scope", to_string)?.as_str() {
        "worker_local" => G3Scope::WorkerLocal,
        "cluster_shared" => G3Scope::ClusterShared,
        other => {
            let msg = format!("unknown variant {other:?}; expected one of: worker_local, cluster_shared");
            return Err(ConfigError::new(join(path, "scope"), msg));
        }
    };
    let mut c = G3OffloadConfig::with(scope, o.must("num_g3_blocks", to_uint)?);
    for (key, field) in [
        ("latency_to_first_byte_ms", &mut c.latency_to_first_byte_ms),
        ("read_bandwidth_gbps", &mut c.read_bandwidth_gbps),
        ("write_bandwidth_gbps", &mut c.write_bandwidth_gbps),
        ("shared_read_bandwidth_gbps", &mut c.shared_read_bandwidth_gbps),
        ("shared_write_bandwidth_gbps", &mut c.shared_write_bandwidth_gbps),
    ] {
        if let Some(x) = o.opt(key, to_f64)? {
            *field = x;
        }
    }
    Ok(c)
}

/// Largest G3 capacity in blocks (as `num_gpu_blocks`: far above any deployment, and the
/// tier's bookkeeping cannot overflow).
const MAX_G3_BLOCKS: usize = 1 << 40;

impl EngineConfig {
    /// The G3 rules, in the reference's order: its own values, then a host tier, then an
    /// aggregated worker. They run after the cache-group rules and before the host tier's.
    pub(super) fn validate_g3(&self, p: &str) -> Result<()> {
        let Some(g) = &self.g3_offload else { return Ok(()) };
        let key = join(p, "g3_offload");
        if g.num_g3_blocks == 0 || g.num_g3_blocks > MAX_G3_BLOCKS {
            let msg = format!(
                "g3_offload.num_g3_blocks must be positive and at most 2^40 (got {})",
                g.num_g3_blocks
            );
            return Err(ConfigError::new(format!("{key}.num_g3_blocks"), msg));
        }
        for (name, x) in [
            ("latency_to_first_byte_ms", g.latency_to_first_byte_ms),
            ("read_bandwidth_gbps", g.read_bandwidth_gbps),
            ("write_bandwidth_gbps", g.write_bandwidth_gbps),
            ("shared_read_bandwidth_gbps", g.shared_read_bandwidth_gbps),
            ("shared_write_bandwidth_gbps", g.shared_write_bandwidth_gbps),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                let msg = format!("g3_offload timing must be finite and non-negative (got {x})");
                return Err(ConfigError::new(format!("{key}.{name}"), msg));
            }
        }
        // Bounds of mocker's own: a latency past an hour or a bandwidth under 1 MB/s would
        // put transfer times beyond the nanosecond clock (the reference only asks finite).
        if g.latency_to_first_byte_ms > 3.6e6 {
            let msg = "must be at most 3.6e6 ms (an hour)";
            return Err(ConfigError::new(format!("{key}.latency_to_first_byte_ms"), msg));
        }
        for (name, x) in [
            ("read_bandwidth_gbps", g.read_bandwidth_gbps),
            ("write_bandwidth_gbps", g.write_bandwidth_gbps),
            ("shared_read_bandwidth_gbps", g.shared_read_bandwidth_gbps),
            ("shared_write_bandwidth_gbps", g.shared_write_bandwidth_gbps),
        ] {
            if x != 0.0 && !(1e-3..=1e6).contains(&x) {
                let msg = format!("must be 0 or in [1e-3, 1e6] (got {x})");
                return Err(ConfigError::new(format!("{key}.{name}"), msg));
            }
        }
        if self.native_host_offload.is_none() {
            return Err(ConfigError::new(key, "g3_offload requires native_host_offload"));
        }
        if self.worker_type != WorkerType::Aggregated {
            let msg =
                format!("g3_offload is supported only for worker_type=aggregated (got {})", self.worker_type);
            return Err(ConfigError::new(key, msg));
        }
        Ok(())
    }
}
