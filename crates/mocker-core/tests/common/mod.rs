//! A minimal closed-loop driver over the core engine, for tests that compare whole runs with
//! figures measured on the reference (same workload shape as its synthetic replay).

#![allow(dead_code)]

pub mod lockstep;

use mocker_core::config::{EngineConfig, LaunchConfig};
use mocker_core::{Engine, EngineOptions, Request};

/// Summary of a run, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunStats {
    pub duration_ms: f64,
    pub mean_ttft_ms: f64,
    pub mean_itl_ms: f64,
    pub completed: usize,
    pub rejected: usize,
    pub admissions: usize,
}

/// An engine config from canonical JSON engine args (`{"engine": {...}}`).
pub fn config(json: &str) -> EngineConfig {
    LaunchConfig::from_json_str(json).expect("valid engine args").engine
}

pub fn engine(config: EngineConfig) -> Engine {
    Engine::new(EngineOptions { config, ..Default::default() }).expect("engine builds")
}

/// Unique prompt `i` of `isl` tokens; the first `shared` tokens are common to group `g`.
pub fn prompt(i: usize, isl: usize, shared: usize, group: usize) -> Vec<u32> {
    (0..isl)
        .map(|p| {
            if p < shared {
                (group as u32) << 24 | p as u32
            } else {
                0x4000_0000 | (i as u32) << 12 | (p as u32 & 0xfff)
            }
        })
        .collect()
}

/// Closed loop: `concurrency` requests at t=0, each completion admits the next one at that
/// time. `prompt_of(i)` builds request i's prompt.
pub fn closed_loop(
    engine: &mut Engine,
    n: usize,
    concurrency: usize,
    osl: usize,
    mut prompt_of: impl FnMut(usize) -> Vec<u32>,
) -> RunStats {
    let mut arrival = vec![0u64; n];
    let mut first = vec![None::<u64>; n];
    let mut next = 0;
    let mut submit = |engine: &mut Engine, next: &mut usize, now: u64, arrival: &mut Vec<u64>| {
        let i = *next;
        *next += 1;
        arrival[i] = now;
        engine
            .submit(Request {
                uuid: i as u128 + 1,
                tokens: prompt_of(i),
                max_output_tokens: osl,
                ..Default::default()
            })
            .expect("submit");
    };
    while next < concurrency.min(n) {
        submit(engine, &mut next, 0, &mut arrival);
    }
    let (mut now, mut itl_sum, mut itl_n, mut end) = (0u64, 0u64, 0u64, 0u64);
    let (mut completed, mut rejected, mut admissions) = (0, 0, 0);
    let mut passes = 0u64;
    while engine.has_work() {
        passes += 1;
        assert!(passes < 10_000_000, "run does not terminate");
        let pass = engine.step(now);
        let pass_end = pass.end_ns;
        admissions += pass.admissions.len();
        let mut done = 0;
        for o in pass.all_outputs() {
            let i = (o.uuid - 1) as usize;
            if o.rejected {
                rejected += 1;
                done += 1;
                continue;
            }
            if o.index == 0 {
                first[i] = Some(pass_end);
            } else {
                itl_sum += o.itl_ns;
                itl_n += 1;
            }
            if o.completed {
                completed += 1;
                done += 1;
                end = end.max(pass_end);
            }
        }
        assert!(pass.had_effect(), "effect-free pass at {now}");
        now = pass_end;
        for _ in 0..done {
            if next < n {
                submit(engine, &mut next, now, &mut arrival);
            }
        }
    }
    let ttfts: Vec<f64> =
        first.iter().zip(&arrival).filter_map(|(f, a)| f.map(|f| (f - a) as f64 / 1e6)).collect();
    RunStats {
        duration_ms: end as f64 / 1e6,
        mean_ttft_ms: ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64,
        mean_itl_ms: itl_sum as f64 / 1e6 / itl_n.max(1) as f64,
        completed,
        rejected,
        admissions,
    }
}
