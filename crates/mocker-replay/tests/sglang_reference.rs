//! Offline replays on the SGLang backend against figures measured on the reference
//! (ai-dynamo-runtime 1.6.1 `run_mocker_synthetic_trace_replay`, one worker, offline).

use mocker_core::config::LaunchConfig;
use mocker_replay::{run_synthetic, Cluster, Load, ReplayOptions, SyntheticWorkload};

struct Want {
    duration_ms: f64,
    mean_ttft_ms: f64,
    mean_itl_ms: f64,
    reused_ratio: f64,
}

fn check(engine_args: &str, workload: SyntheticWorkload, want: Want) {
    let launch = LaunchConfig::from_json_str(engine_args).expect("engine args");
    let out = run_synthetic(&ReplayOptions {
        cluster: Cluster::aggregated(launch, 1),
        workload: workload.into(),
        ..Default::default()
    })
    .expect("replay runs");
    let s = out.summary;
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{what}: got {got}, reference {want}");
    };
    close(s.duration_ms, want.duration_ms, "duration_ms");
    close(s.ttft_ms.mean, want.mean_ttft_ms, "mean_ttft_ms");
    close(s.itl_ms.mean, want.mean_itl_ms, "mean_itl_ms");
    close(s.prefix_cache_reused_ratio, want.reused_ratio, "prefix_cache_reused_ratio");
}

const PAGE64: &str = r#"{"engine":{"backend":"sglang","block_size":64,"num_gpu_blocks":16384,
    "max_num_seqs":256,"max_num_batched_tokens":8192}}"#;

fn shared(n: usize, k: usize) -> SyntheticWorkload {
    SyntheticWorkload {
        request_count: n,
        load: Load::Concurrency(k),
        shared_prefix_ratio: 0.5,
        num_prefix_groups: 4,
        ..Default::default()
    }
}

/// The issue's target workload: ISL 1000 / OSL 100, 1000 requests, concurrency 64.
#[test]
fn issue_workload_matches_reference() {
    let w = SyntheticWorkload { load: Load::Concurrency(64), ..Default::default() };
    let want = Want {
        duration_ms: 34899.321889,
        mean_ttft_ms: 732.213143,
        mean_itl_ms: 14.776503,
        reused_ratio: 0.0,
    };
    check(PAGE64, w, want);
}

/// Half of every prompt shared within 4 groups, 64-token pages: radix hits of 8 pages.
#[test]
fn shared_prefix_workload_matches_reference() {
    let want = Want {
        duration_ms: 24418.425679,
        mean_ttft_ms: 401.454470,
        mean_itl_ms: 11.444014,
        reused_ratio: 0.507904,
    };
    check(PAGE64, shared(1000, 64), want);
}

/// A tight default pool (page 1, 16384 tokens) with shared prefixes: retraction, eviction
/// and in-batch duplicate prefixes, in fifo order.
#[test]
fn tight_shared_fifo_matches_reference() {
    let want = Want {
        duration_ms: 31799.703417,
        mean_ttft_ms: 1320.935914,
        mean_itl_ms: 34.691838,
        reused_ratio: 0.4825,
    };
    check(r#"{"engine":{"backend":"sglang"}}"#, shared(200, 32), want);
}

/// The same under longest-prefix-match ordering.
#[test]
fn tight_shared_lpm_matches_reference() {
    let want = Want {
        duration_ms: 31779.269564,
        mean_ttft_ms: 1318.611109,
        mean_itl_ms: 34.682297,
        reused_ratio: 0.48834,
    };
    check(r#"{"engine":{"backend":"sglang","sglang":{"schedule_policy":"lpm"}}}"#, shared(200, 32), want);
}
