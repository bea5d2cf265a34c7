//! MTP / speculative decoding (`aic_nextn`) against figures measured on the reference
//! (ai-dynamo-runtime 1.6.1 `run_mocker_synthetic_trace_replay`, offline, engine 64/16384/
//! 256/8192 unless noted). The acceptance draws come from the same seeded generator in the
//! same order, so every figure is equal to the reference's, not just close.

use mocker_core::config::LaunchConfig;
use mocker_replay::{run_synthetic, Cluster, Load, Pool, ReplayOptions, RouterMode, SyntheticWorkload};

/// (duration, mean TTFT, mean ITL) in ms.
type Want = (f64, f64, f64);

fn workload(isl: usize, osl: usize, n: usize, k: usize) -> SyntheticWorkload {
    SyntheticWorkload {
        input_tokens: isl,
        output_tokens: osl,
        request_count: n,
        load: Load::Concurrency(k),
        ..Default::default()
    }
}

fn launch(args: &str) -> LaunchConfig {
    LaunchConfig::from_json_str(args).expect("engine args")
}

fn check(options: ReplayOptions, want: Want, what: &str) {
    let s = run_synthetic(&options).expect("replay runs").summary;
    let close = |got: f64, want: f64, key: &str| {
        assert!(
            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{what} {key}: got {got}, reference {want}"
        );
    };
    close(s.duration_ms, want.0, "duration_ms");
    close(s.ttft_ms.mean, want.1, "mean_ttft_ms");
    close(s.itl_ms.mean, want.2, "mean_itl_ms");
}

fn one_worker(args: &str, w: SyntheticWorkload, want: Want) {
    let options = ReplayOptions {
        cluster: Cluster::aggregated(launch(args), 1),
        workload: w.into(),
        ..Default::default()
    };
    check(options, want, args);
}

/// The issue's figures: ISL 1000 / OSL 100, 100 requests, concurrency 16 (base 6606.648915).
#[test]
fn issue_workload_matches_reference() {
    let w = || workload(1000, 100, 100, 16);
    one_worker(r#"{"engine":{"aic_nextn":3}}"#, w(), (4613.344926, 92.930167, 6.214333));
    // Every draft accepted: 4 tokens per forward, and the first forward after a prefill
    // already verifies drafts (TTFT includes the decode, the second token comes with the first).
    one_worker(
        r#"{"engine":{"aic_nextn":3,"aic_nextn_accept_rates":"1,1,1"}}"#,
        w(),
        (3201.36666, 182.228941, 3.123455),
    );
    one_worker(r#"{"engine":{"backend":"trtllm","aic_nextn":3}}"#, w(), (4865.367168, 93.76637, 6.601421));
}

/// Other shapes, rates and seeds: ISL 2000 / OSL 150, 80 requests, concurrency 24.
#[test]
fn other_shapes_and_seeds_match_reference() {
    let w = || workload(2000, 150, 80, 24);
    one_worker(r#"{"engine":{"aic_nextn":2}}"#, w(), (5616.711685, 271.363543, 8.845319));
    one_worker(r#"{"engine":{"aic_nextn":1,"aic_mtp_seed":7}}"#, w(), (5947.870445, 277.740681, 9.359351));
    let five = r#"{"engine":{"aic_nextn":5,"aic_nextn_accept_rates":"0.9,0.7,0.5,0.3,0.1"}}"#;
    one_worker(five, w(), (4986.151545, 274.420417, 7.765156));
}

/// KV pressure (512 blocks, ISL 2000 / OSL 500, 64 requests, concurrency 32): the burst
/// lookahead is reserved before the decode and preempts when it does not fit.
#[test]
fn lookahead_under_kv_pressure_matches_reference() {
    let args = r#"{"engine":{"aic_nextn":3,"num_gpu_blocks":512}}"#;
    one_worker(args, workload(2000, 500, 64, 32), (42286.42344, 8310.529832, 17.940729));
}

/// Each worker draws from its own stream (seed + worker index), whichever the router.
#[test]
fn workers_draw_from_offset_seeds_as_reference() {
    let options = ReplayOptions {
        cluster: Cluster::aggregated(launch(r#"{"engine":{"aic_nextn":3}}"#), 2),
        workload: workload(1000, 100, 100, 16).into(),
        ..Default::default()
    };
    check(options, (3490.672762, 64.630211, 4.698631), "2 workers round robin");
    let options = ReplayOptions {
        cluster: Cluster::aggregated(launch(r#"{"engine":{"aic_nextn":2}}"#), 3),
        workload: workload(2000, 150, 80, 24).into(),
        router: RouterMode::Kv,
        ..Default::default()
    };
    check(options, (3047.840202, 129.742252, 4.663245), "3 workers kv router");
}

/// Disaggregated: prefill workers emit one token, decode workers burst; the decode pool
/// numbers its seeds from 0 like the prefill pool.
#[test]
fn disaggregated_pools_match_reference() {
    let pool = |role: &str| Pool {
        launch: launch(&format!(r#"{{"engine":{{"aic_nextn":2,"worker_type":"{role}"}}}}"#)),
        workers: 2,
    };
    let options = ReplayOptions {
        cluster: Cluster::Disaggregated { prefill: pool("prefill"), decode: pool("decode") },
        workload: workload(1000, 100, 100, 16).into(),
        ..Default::default()
    };
    check(options, (2491.258388, 89.339421, 2.878843), "2P2D");
}

/// SGLang (issue 23's workload, engine `{"backend": "sglang"}`): decode passes verify
/// drafts for every running request in order; prefill forwards emit one token.
#[test]
fn sglang_matches_reference() {
    let w = || workload(1000, 100, 100, 16);
    one_worker(r#"{"engine":{"backend":"sglang"}}"#, w(), (25463.360703, 539.568434, 34.725458));
    one_worker(
        r#"{"engine":{"backend":"sglang","aic_nextn":3}}"#,
        w(),
        (13693.863191, 259.204555, 18.866976),
    );
    one_worker(
        r#"{"engine":{"backend":"sglang","aic_nextn":3,"aic_nextn_accept_rates":"1,1,1"}}"#,
        w(),
        (8105.654019, 325.541251, 9.553985),
    );
    // Two attention-DP ranks draw from seeds 0 and 1.
    one_worker(
        r#"{"engine":{"backend":"sglang","aic_nextn":3},"dp_size":2}"#,
        w(),
        (9758.453686, 51.867428, 14.553852),
    );
    // Page 16, a pool small enough to retract (the lookahead counts the largest burst).
    one_worker(
        r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":1500,"aic_nextn":2,"aic_nextn_accept_rates":"0.8,0.5","aic_mtp_seed":7}}"#,
        workload(2000, 200, 200, 32),
        (68037.440428, 6665.512286, 18.198261),
    );
}

/// SGLang disaggregated (destination first): prefill workers emit one token without
/// drafts, decode workers burst.
#[test]
fn sglang_disaggregated_pools_match_reference() {
    let pool = |role: &str| Pool {
        launch: launch(&format!(
            r#"{{"engine":{{"backend":"sglang","block_size":64,"num_gpu_blocks":16384,"max_num_seqs":256,"max_num_batched_tokens":8192,"aic_nextn":3,"worker_type":"{role}"}}}}"#
        )),
        workers: 2,
    };
    let options = ReplayOptions {
        cluster: Cluster::Disaggregated { prefill: pool("prefill"), decode: pool("decode") },
        workload: workload(4000, 200, 200, 64).into(),
        ..Default::default()
    };
    check(options, (8923.716328, 1775.460123, 3.549545), "SGLang 2P2D");
}

/// With a per-request log every token is itemized: bursts show as tokens sharing their
/// pass end, and the report is the same as without the log.
#[test]
fn per_request_log_sees_bursts_and_the_same_report() {
    let options = ReplayOptions {
        cluster: Cluster::aggregated(launch(r#"{"engine":{"aic_nextn":3}}"#), 1),
        workload: workload(1000, 100, 100, 16).into(),
        ..Default::default()
    };
    let mut records = Vec::new();
    let mut sink = |r: mocker_replay::RequestRecord| records.push(r);
    let hooks = mocker_replay::Hooks { request_ended: Some(&mut sink), ..Default::default() };
    let s = mocker_replay::run_replay(&options, hooks).expect("replay runs").summary;
    assert!((s.duration_ms - 4613.344926).abs() < 1e-6, "duration {}", s.duration_ms);
    assert_eq!(records.len(), 100);
    let tokens: usize = records.iter().map(|r| r.token_times_ms.len()).sum();
    assert_eq!(tokens, 100 * 100, "every output token is logged once");
    let repeated = records.iter().flat_map(|r| r.token_times_ms.windows(2)).filter(|w| w[0] == w[1]).count();
    assert!(repeated > 0, "some tokens share a pass end (a burst)");
}
