//! Aggregated replay under KV pressure against the reference's figures (ai-dynamo-runtime
//! 1.6.1, vLLM engine 64/200/256/8192, polynomial timing): preempted requests recompute
//! their prompt and output, and that work counts as committed prefill tokens.

use mocker_core::config::LaunchConfig;
use mocker_replay::{run_replay, Cluster, Hooks, Load, ReplayOptions, SyntheticWorkload};

#[test]
fn recomputed_output_counts_as_committed_prefill_work() {
    let launch = LaunchConfig::from_json_str(
        r#"{"block_size": 64, "num_gpu_blocks": 200, "max_num_seqs": 256, "max_num_batched_tokens": 8192}"#,
    )
    .unwrap();
    let options = ReplayOptions {
        cluster: Cluster::aggregated(launch, 2),
        workload: SyntheticWorkload {
            input_tokens: 2000,
            output_tokens: 150,
            request_count: 120,
            load: Load::RequestRate(20.0),
            arrival_seed: 42,
            shared_prefix_ratio: 0.6,
            num_prefix_groups: 2,
            ..Default::default()
        }
        .into(),
        ..Default::default()
    };
    let s = run_replay(&options, Hooks::default()).unwrap().summary.to_json_value();
    for (key, want) in [
        ("duration_ms", 31912.171954),
        ("mean_ttft_ms", 9606.520698),
        ("prefix_cache_reused_ratio", 0.626133),
        ("committed_prefill_tokens", 104486.0),
    ] {
        let got = s[key].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{key}: got {got}, reference {want}");
    }
}
