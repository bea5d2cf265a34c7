//! What a disaggregated KV transfer costs (core spec §8): the prefill side's bytes per
//! token over the link's bandwidth, charged for the whole prompt or only for the blocks
//! the destination had to reserve. Shared by offline replay and the live handoff.

use crate::config::{EngineConfig, KvTransferTimingMode};

/// The transfer settings of a prefill (source) engine.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KvTransfer {
    /// Which tokens are charged.
    pub mode: KvTransferTimingMode,
    /// KV bytes per token (`kv_transfer_bytes_per_token`), if configured.
    pub bytes_per_token: Option<f64>,
    /// Link bandwidth in GB/s, decimal (`kv_transfer_bandwidth`), if configured.
    pub bandwidth_gb_s: Option<f64>,
}

impl KvTransfer {
    /// The transfer settings `config` declares.
    pub fn from_config(config: &EngineConfig) -> Self {
        Self {
            mode: config.kv_transfer_timing_mode,
            bytes_per_token: config.kv_transfer_bytes_per_token,
            bandwidth_gb_s: config.kv_transfer_bandwidth,
        }
    }

    /// Delay in ms, `tokens × bytes_per_token / (bandwidth × 1e9) × 1000`: tokens are
    /// `prompt_tokens`, or in `destination_missing` mode the destination's `missing`
    /// tokens when known. `None` (no delay) when a figure is missing or bandwidth ≤ 0.
    pub fn delay_ms(&self, prompt_tokens: usize, missing: Option<usize>) -> Option<f64> {
        let bytes = self.bytes_per_token?;
        let bw = self.bandwidth_gb_s.filter(|b| *b > 0.0)?;
        let tokens = match (self.mode, missing) {
            (KvTransferTimingMode::DestinationMissing, Some(m)) => m,
            _ => prompt_tokens,
        };
        Some(tokens as f64 * bytes / (bw * 1e9) * 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_follows_the_mode_and_needs_both_figures() {
        let mut t =
            KvTransfer { bytes_per_token: Some(131072.0), bandwidth_gb_s: Some(64.0), ..Default::default() };
        // The reference's figures: 1000 tokens take 2.048 ms, 16 missing blocks of 64 take 2.097152.
        assert!((t.delay_ms(1000, Some(1024)).unwrap() - 2.048).abs() < 1e-12);
        t.mode = KvTransferTimingMode::DestinationMissing;
        assert!((t.delay_ms(1000, Some(1024)).unwrap() - 2.097152).abs() < 1e-12);
        assert_eq!(t.delay_ms(1000, None), t.delay_ms(1000, Some(1000)));
        assert_eq!(KvTransfer { bandwidth_gb_s: Some(0.0), ..t }.delay_ms(1000, None), None);
        assert_eq!(KvTransfer { bytes_per_token: None, ..t }.delay_ms(1000, None), None);
    }
}
