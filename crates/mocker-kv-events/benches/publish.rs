//! Cost of KV event publication per forward pass at 256 running sequences, as a fraction of
//! the core's pass cost without events.
//!
//! `cargo bench -p mocker-kv-events --bench publish` (without `--bench`, e.g. under
//! `cargo test --benches`, it runs one short round as a smoke test).
//!
//! Workload: 256 distinct prompts of equal length decoding in lockstep at block size 16, so
//! one pass in 16 completes a block for every sequence (a "store pass": 256 one-block
//! `BlockStored` events) and the other 15 produce no event. Two identical engines run side by
//! side, one recording events and one not; every pass is timed on both, and the recording
//! engine's events are handed to a live publisher (PUB + replay bound on loopback, no
//! subscriber). Timed: `Engine::step` with and without recording, `publish` on the engine
//! thread, and the background thread's encoding of a store batch.

use std::hint::black_box;
use std::time::{Duration, Instant};

use mocker_core::config::EngineConfig;
use mocker_core::{Engine, EngineOptions, Request};
use mocker_kv_events::wire::PendingBatch;
use mocker_kv_events::{KvEventPublisher, PublisherOptions};

const SEQS: usize = 256;
const BLOCK: usize = 16;
const PROMPT: usize = 4 * BLOCK + 8;

#[derive(Default)]
struct Acc {
    n: u64,
    total: Duration,
    samples: Vec<u64>,
}

impl Acc {
    fn add(&mut self, d: Duration) {
        self.n += 1;
        self.total += d;
        self.samples.push(d.as_nanos() as u64);
    }
    fn median_ns(&self) -> f64 {
        let mut s = self.samples.clone();
        s.sort_unstable();
        s.get(s.len() / 2).copied().unwrap_or(0) as f64
    }
    fn mean_ns(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.total.as_nanos() as f64 / self.n as f64
        }
    }
}

#[derive(Default)]
struct Results {
    step_off_store: Acc,
    step_off_plain: Acc,
    step_on_store: Acc,
    step_on_plain: Acc,
    publish_store: Acc,
    publish_plain: Acc,
    copy_store: Acc,
    encode_store: Acc,
}

fn engine(record: bool, output_len: usize) -> Engine {
    let config = EngineConfig {
        block_size: BLOCK,
        num_gpu_blocks: SEQS * (PROMPT + output_len) / BLOCK + 2 * SEQS,
        max_num_seqs: SEQS,
        max_num_batched_tokens: SEQS * PROMPT, // one prefill pass keeps all sequences in lockstep
        emit_kv_events: record,
        emit_kv_token_ids: record,
        ..EngineConfig::default()
    };
    let mut e =
        Engine::new(EngineOptions { config, dp_rank: 0, record_kv_events: record, ..Default::default() })
            .expect("engine");
    for i in 0..SEQS {
        let tokens = (0..PROMPT as u32).map(|t| (i * PROMPT) as u32 + t).collect();
        e.submit(Request {
            uuid: i as u128 + 1,
            tokens,
            max_output_tokens: output_len,
            ..Default::default()
        })
        .expect("submit");
    }
    e
}

fn round(publisher: &KvEventPublisher, output_len: usize, r: &mut Results) {
    let (mut off, mut on) = (engine(false, output_len), engine(true, output_len));
    let (mut now_off, mut now_on, mut firsts) = (0u64, 0u64, 0usize);
    // Warm up: every sequence past its prefill (first token out), then one block boundary.
    while firsts < SEQS {
        now_off = off.step(now_off).end_ns.max(now_off + 1);
        let pass = on.step(now_on);
        now_on = pass.end_ns.max(now_on + 1);
        firsts += pass.outputs.iter().filter(|o| o.index == 0).count();
        publisher.publish(&pass.kv_events);
    }
    let (mut encoded, mut scratch) = (Vec::new(), PendingBatch::default());
    while on.has_work() && off.has_work() {
        let t = Instant::now();
        let end_off = black_box(off.step(now_off)).end_ns;
        let d_off = t.elapsed();
        now_off = end_off.max(now_off + 1);

        let t = Instant::now();
        let pass = black_box(on.step(now_on));
        let d_on = t.elapsed();
        now_on = pass.end_ns.max(now_on + 1);
        let store = pass.kv_events.len() == SEQS && pass.all_outputs().all(|o| !o.completed);
        if !store && !pass.kv_events.is_empty() {
            continue; // completion/eviction tail of the run: not the steady shape measured
        }
        let before = publisher.published_batches();
        let t = Instant::now();
        publisher.publish(&pass.kv_events);
        let d_pub = t.elapsed();
        if store {
            r.step_off_store.add(d_off);
            r.step_on_store.add(d_on);
            r.publish_store.add(d_pub);
            let t = Instant::now();
            scratch.refill(0.0, black_box(&pass.kv_events));
            r.copy_store.add(t.elapsed());
            encoded.clear();
            let t = Instant::now();
            black_box(&scratch).encode(0, BLOCK as u32, &mut encoded);
            r.encode_store.add(t.elapsed());
            // Untimed: let the background thread send it, so every publish sees an empty queue.
            while publisher.published_batches() == before {
                std::thread::yield_now();
            }
        } else {
            r.step_off_plain.add(d_off);
            r.step_on_plain.add(d_on);
            r.publish_plain.add(d_pub);
        }
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, output_len) = if full { (6, 40 * BLOCK) } else { (1, 4 * BLOCK) };
    let publisher = KvEventPublisher::start(PublisherOptions {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        block_size: BLOCK,
        ..Default::default()
    })
    .expect("publisher");
    let mut r = Results::default();
    for _ in 0..rounds {
        round(&publisher, output_len, &mut r);
    }
    let stats = publisher.shutdown();
    assert_eq!(stats.dropped_batches, 0, "the paced bench never fills the queue");

    let off_avg = (r.step_off_store.total + r.step_off_plain.total).as_nanos() as f64
        / (r.step_off_store.n + r.step_off_plain.n) as f64;
    let on_avg = (r.step_on_store.total + r.step_on_plain.total).as_nanos() as f64
        / (r.step_on_store.n + r.step_on_plain.n) as f64;
    let pub_avg = (r.publish_store.total + r.publish_plain.total).as_nanos() as f64
        / (r.publish_store.n + r.publish_plain.n) as f64;
    println!("KV event publication at {SEQS} running sequences, block size {BLOCK} ({rounds} rounds)");
    println!(
        "  passes measured: {} store (256 one-block BlockStored), {} without events",
        r.step_off_store.n, r.step_off_plain.n
    );
    println!(
        "  step, events off:  store pass {:>9.0} ns   plain pass {:>9.0} ns   mean {:>9.0} ns",
        r.step_off_store.mean_ns(),
        r.step_off_plain.mean_ns(),
        off_avg
    );
    println!(
        "  step, events on:   store pass {:>9.0} ns   plain pass {:>9.0} ns   mean {:>9.0} ns",
        r.step_on_store.mean_ns(),
        r.step_on_plain.mean_ns(),
        on_avg
    );
    println!(
        "  publish():         store pass {:>9.0} ns   plain pass {:>9.0} ns   mean {:>9.0} ns",
        r.publish_store.mean_ns(),
        r.publish_plain.mean_ns(),
        pub_avg
    );
    println!(
        "  medians, store pass: step off {:.0} ns, step on {:.0} ns, publish() {:.0} ns, \
         copy into a reused batch (the engine-thread work of publish) {:.0} ns",
        r.step_off_store.median_ns(),
        r.step_on_store.median_ns(),
        r.publish_store.median_ns(),
        r.copy_store.median_ns()
    );
    println!("  encode (background thread), store batch: {:.0} ns", r.encode_store.mean_ns());
    let pct = |x: f64| 100.0 * x;
    println!("  ratios to the pass cost without events:");
    println!(
        "    publish() on a store pass / store pass:       {:.2}%",
        pct(r.publish_store.mean_ns() / r.step_off_store.mean_ns())
    );
    println!("    publish() per pass (mean) / pass (mean):      {:.2}%", pct(pub_avg / off_avg));
    println!("    core event recording per pass (on/off - 1):   {:.2}%", pct(on_avg / off_avg - 1.0));
    println!(
        "    recording + publish() per pass / pass:        {:.2}%",
        pct((on_avg + pub_avg) / off_avg - 1.0)
    );
    println!(
        "    medians: publish() / store pass {:.2}%, event copy / store pass {:.2}%",
        pct(r.publish_store.median_ns() / r.step_off_store.median_ns()),
        pct(r.copy_store.median_ns() / r.step_off_store.median_ns())
    );
    println!(
        "    background encode of a store batch / store pass: {:.2}% (off the engine thread)",
        pct(r.encode_store.mean_ns() / r.step_off_store.mean_ns())
    );
}
