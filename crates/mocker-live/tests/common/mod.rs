//! Shared helpers of the live tests (the §9 test arguments of live.md).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mocker_core::config::{EngineConfig, TimingModelConfig};
use mocker_core::Request;
use mocker_live::{LiveEngine, LiveOptions};

/// Block 4, 128 GPU blocks, max_num_seqs 8, max_num_batched_tokens 64, speedup 1000.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        block_size: 4,
        num_gpu_blocks: 128,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        speedup_ratio: 1000.0,
        ..Default::default()
    }
}

/// Exact timing: prefill `p` ms, decode `d` ms, speedup 1.
pub fn fixed_config(p: f64, d: f64) -> EngineConfig {
    EngineConfig {
        speedup_ratio: 1.0,
        timing_model: TimingModelConfig::Fixed { prefill_ms: p, decode_ms: d },
        ..test_config()
    }
}

pub fn planned(uuid: u128, prompt: u32, plan: &[u32]) -> Request {
    Request {
        uuid,
        tokens: (1..=prompt).collect(),
        max_output_tokens: plan.len(),
        output_token_ids: Some(plan.to_vec()),
        ..Default::default()
    }
}

pub fn generated(uuid: u128, prompt: u32, osl: usize) -> Request {
    Request { uuid, tokens: (1..=prompt).collect(), max_output_tokens: osl, ..Default::default() }
}

/// Counts forward-pass-metrics publishes.
pub fn fpm_counter(o: &mut LiveOptions) -> Arc<Mutex<usize>> {
    let n = Arc::new(Mutex::new(0usize));
    let c = n.clone();
    o.forward_pass_metrics = Some(Box::new(move |_| *c.lock().unwrap() += 1));
    n
}

/// Waits (1 ms polls, 3 s limit on tokio's clock) until the rank is idle:
/// no active request, nothing running or waiting.
pub async fn wait_idle(e: &LiveEngine) {
    for _ in 0..3000 {
        let m = *e.metrics().borrow();
        if e.active_request_count() == 0 && m.running_requests == 0 && m.waiting_requests == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("engine not idle: {} active, {:?}", e.active_request_count(), *e.metrics().borrow());
}
