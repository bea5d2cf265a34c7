//! Live-engine benchmarks (figures, not pass/fail):
//! 1. sustained submit -> last-token throughput of 10k concurrent short requests with a
//!    zero-cost timing model (the actor, lanes and streams are all that is measured);
//! 2. cancellation acknowledgement latency while a long modelled pass is in flight.
//!
//! Run: `cargo bench -p mocker-live --bench live`.

use std::time::{Duration, Instant};

use mocker_core::config::{EngineConfig, TimingModelConfig};
use mocker_core::Request;
use mocker_live::{LiveEngine, LiveOptions};
use uuid::Uuid;

fn config(prefill_ms: f64) -> EngineConfig {
    EngineConfig {
        block_size: 16,
        num_gpu_blocks: 40_000,
        max_num_seqs: 20_000,
        max_num_batched_tokens: 400_000,
        timing_model: TimingModelConfig::Fixed { prefill_ms, decode_ms: 0.0 },
        ..Default::default()
    }
}

fn request(i: u32, prompt: u32, osl: usize) -> Request {
    Request {
        tokens: (0..prompt).map(|t| 1 + t + 100 * i).collect(),
        max_output_tokens: osl,
        ..Default::default()
    }
}

async fn throughput(n: u32, osl: usize) -> (Duration, usize) {
    let e = LiveEngine::start(config(0.0), LiveOptions::default()).unwrap();
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(n as usize);
    for i in 0..n {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = e.submit(request(i, 16, osl)).await.unwrap();
            let mut k = 0;
            while let Some(o) = s.recv().await {
                k += usize::from(o.token_id.is_some());
            }
            k
        }));
    }
    let mut tokens = 0;
    for t in tasks {
        tokens += t.await.unwrap();
    }
    let dt = t.elapsed();
    e.shutdown().await.unwrap();
    (dt, tokens)
}

async fn cancel_latency(n: u32) -> Vec<Duration> {
    // A 60 s modelled pass holds all n requests; cancel them one by one mid-pass (the
    // shutdown then ends the pass early).
    let e = LiveEngine::start(config(60_000.0), LiveOptions::default()).unwrap();
    let mut regs = Vec::new();
    let mut streams = Vec::new();
    for i in 0..n {
        let mut r = request(i, 64, 4);
        r.uuid = u128::from(i) + 1;
        let (reg, s) = e.prepare_request(r).unwrap();
        regs.push(reg);
        streams.push(s);
    }
    let acks: Vec<_> = regs.into_iter().map(|r| e.submit_prepared(r)).collect();
    for a in futures_util::future::join_all(acks).await {
        a.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut lat = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = Instant::now();
        assert!(e.cancel(Uuid::from_u128(u128::from(i) + 1)).await.unwrap());
        lat.push(t.elapsed());
    }
    drop(streams);
    e.shutdown().await.unwrap();
    lat.sort();
    lat
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let _ = throughput(1000, 8).await; // warm-up
        for _ in 0..3 {
            let (dt, tokens) = throughput(10_000, 8).await;
            println!(
                "throughput: 10000 concurrent requests x 8 tokens in {:.1} ms: {:.0} req/s, {:.0} tokens/s",
                dt.as_secs_f64() * 1e3,
                10_000.0 / dt.as_secs_f64(),
                tokens as f64 / dt.as_secs_f64()
            );
        }
    });
    // Current-thread runtime, so that every submission is queued before the pass starts.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let lat = cancel_latency(200).await;
        let pct = |p: f64| lat[((lat.len() - 1) as f64 * p).round() as usize];
        println!(
            "cancel ack during a 60 s modelled pass (200 cancels): median {:?}, p99 {:?}, max {:?}",
            pct(0.5),
            pct(0.99),
            lat[lat.len() - 1]
        );
    });
}
