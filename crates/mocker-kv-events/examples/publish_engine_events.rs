//! Runs requests one after another through a real engine and publishes its KV events, for
//! checking a subscriber by hand (e.g. Dynamo's standalone KV indexer with
//! `tests/python/indexer_check.py`).
//!
//! `publish_engine_events ENDPOINT BLOCK_SIZE NUM_GPU_BLOCKS STEP[,STEP...]` where a STEP is
//! `PROMPT_LEN:OUTPUT_LEN[:PROMPT_ID]` (a request; prompts with the same id share their
//! tokens, the id defaults to the step's position) or `reset` (drop the prefix cache).
//!
//! Binds ENDPOINT, prints `BOUND <endpoint>`, then before each step waits for a line on
//! stdin (so the subscriber can connect, and check between steps), runs it, publishes each
//! pass's events and prints one JSON line `{"sequences": [[token...]...],
//! "cached_leading_blocks": [n...], "batches": B}`: every request so far (prompt + output
//! tokens) and how many of its leading full blocks the engine caches now. Exits on the line
//! after the last step.

use std::io::BufRead;

use mocker_core::config::EngineConfig;
use mocker_core::hashing::sequence_hashes;
use mocker_core::{Engine, EngineOptions, Request};
use mocker_kv_events::{KvEventPublisher, PublisherOptions};

const USAGE: &str = "usage: publish_engine_events ENDPOINT BLOCK_SIZE NUM_GPU_BLOCKS STEP[,STEP...] \
     (STEP: PROMPT_LEN:OUTPUT_LEN[:PROMPT_ID] or reset)";

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("{msg}\n{USAGE}");
    std::process::exit(2)
}

fn num(s: &str, name: &str) -> usize {
    s.parse().unwrap_or_else(|_| fail(format!("{name}: {s:?} is not a non-negative integer")))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 4 {
        fail("expected 4 arguments");
    }
    let (block_size, num_gpu_blocks) = (num(&args[1], "BLOCK_SIZE"), num(&args[2], "NUM_GPU_BLOCKS"));
    let steps: Vec<Option<(usize, usize, usize)>> = args[3]
        .split(',')
        .enumerate()
        .map(|(i, step)| {
            if step == "reset" {
                return None;
            }
            let f: Vec<&str> = step.split(':').collect();
            match f[..] {
                [p, o] => Some((num(p, "PROMPT_LEN"), num(o, "OUTPUT_LEN"), i)),
                [p, o, id] => Some((num(p, "PROMPT_LEN"), num(o, "OUTPUT_LEN"), num(id, "PROMPT_ID"))),
                _ => fail(format!("step {step:?}: expected PROMPT_LEN:OUTPUT_LEN[:PROMPT_ID] or reset")),
            }
        })
        .collect();
    let publisher = KvEventPublisher::start(PublisherOptions {
        endpoint: args[0].clone(),
        block_size,
        ..Default::default()
    })
    .unwrap_or_else(|e| fail(e));
    println!("BOUND {}", publisher.endpoint());
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    let config = EngineConfig {
        block_size,
        num_gpu_blocks,
        emit_kv_events: true,
        emit_kv_token_ids: true,
        ..Default::default()
    };
    let mut engine =
        Engine::new(EngineOptions { config, dp_rank: 0, record_kv_events: true, ..Default::default() })
            .unwrap_or_else(|e| fail(e));
    let (mut now, mut batches, mut sequences) = (0u64, 0u64, Vec::<Vec<u32>>::new());
    for (i, step) in steps.iter().enumerate() {
        line.clear();
        let _ = stdin.read_line(&mut line);
        match *step {
            None => match engine.reset_prefix_cache() {
                Ok(event) => {
                    publisher.publish(&Vec::from_iter(event));
                    batches += 1;
                }
                Err(busy) => fail(format!("reset: {busy:?}")),
            },
            Some((prompt_len, output_len, prompt_id)) => {
                let base = 1000 + 100_000 * prompt_id as u32;
                let mut tokens: Vec<u32> = (0..prompt_len as u32).map(|t| base + t).collect();
                let request = Request {
                    uuid: i as u128 + 1,
                    tokens: tokens.clone(),
                    max_output_tokens: output_len,
                    ..Default::default()
                };
                engine.submit(request).unwrap_or_else(|e| fail(e));
                while engine.has_work() {
                    let pass = engine.step(now);
                    now = pass.end_ns.max(now + 1);
                    tokens.extend(pass.all_outputs().filter_map(|o| o.token_id()));
                    if !pass.kv_events.is_empty() {
                        publisher.publish(&pass.kv_events);
                        batches += 1;
                    }
                }
                sequences.push(tokens);
            }
        }
        let cached: Vec<usize> = sequences
            .iter()
            .map(|s| sequence_hashes(s, block_size).iter().take_while(|h| engine.is_cached(**h)).count())
            .collect();
        println!(
            "{{\"sequences\": {sequences:?}, \"cached_leading_blocks\": {cached:?}, \"batches\": {batches}}}"
        );
    }
    line.clear();
    let _ = stdin.read_line(&mut line);
    let stats = publisher.shutdown();
    eprintln!("published {} batches, dropped {}", stats.published_batches, stats.dropped_batches);
}
