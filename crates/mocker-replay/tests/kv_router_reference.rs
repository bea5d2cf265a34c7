//! The KV router under heavy load against the reference (ai-dynamo-runtime 1.6.1
//! `run_mocker_synthetic_trace_replay`, offline, `router_mode="kv_router"`). The reference
//! breaks cost ties with an unseeded RNG, so each of its runs is one draw from a
//! distribution; mocker's router seed picks one draw. The comparison is therefore between
//! distributions: the mean over seeds against the mean over reference runs, and the
//! seed-to-seed spread against the run-to-run spread.

use mocker_core::config::LaunchConfig;
use mocker_replay::router::KvRouterConfig;
use mocker_replay::{run_synthetic, Cluster, Load, ReplayOptions, RouterMode, SyntheticWorkload};

const ENGINE: &str =
    r#"{"engine":{"block_size":64,"num_gpu_blocks":16384,"max_num_seqs":256,"max_num_batched_tokens":8192}}"#;

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn stdev(xs: &[f64]) -> f64 {
    let m = mean(xs);
    (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// ISL 2000 / OSL 200, 3000 requests at concurrency 256, half of each prompt shared within
/// 16 groups, 4 workers: the issue's heavy-load workload, shortened. Reference, 20 runs:
/// mean TTFT 218.62 ms (sd 4.28, 210.85..225.09), duration 44.8..45.3 s. Over seeds 1-8
/// mocker's mean must be within 2% of the reference's and its spread at most 3x.
#[test]
fn heavy_load_seed_spread_matches_reference_runs() {
    let (ref_mean, ref_sd) = (218.62, 4.28);
    let mut ttft = Vec::new();
    for seed in 1..=8u64 {
        let workload = SyntheticWorkload {
            input_tokens: 2000,
            output_tokens: 200,
            request_count: 3000,
            load: Load::Concurrency(256),
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 16,
            ..Default::default()
        };
        let options = ReplayOptions {
            cluster: Cluster::aggregated(LaunchConfig::from_json_str(ENGINE).expect("engine args"), 4),
            workload: workload.into(),
            router: RouterMode::Kv,
            router_config: KvRouterConfig { seed, ..Default::default() },
            ..Default::default()
        };
        let s = run_synthetic(&options).expect("replay runs").summary;
        assert!((44_500.0..45_600.0).contains(&s.duration_ms), "seed {seed}: duration {}", s.duration_ms);
        ttft.push(s.ttft_ms.mean);
    }
    let (m, sd) = (mean(&ttft), stdev(&ttft));
    assert!(
        (m - ref_mean).abs() <= 0.02 * ref_mean,
        "mean TTFT over seeds {m} vs reference {ref_mean}: {ttft:?}"
    );
    assert!(sd <= 3.0 * ref_sd, "seed-to-seed sd {sd} vs reference run-to-run sd {ref_sd}: {ttft:?}");
    assert!(sd > 0.0, "seeds must change tie-breaks: {ttft:?}");
}
