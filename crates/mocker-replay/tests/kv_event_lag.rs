//! `kv_event_lag_ms` (the reference's keyword, docs/scaling.md §8): the KV router's index
//! sees stored and removed blocks that much later in simulated time, while the engines'
//! caches and the router's own bookkeeping of live requests stay immediate.

use mocker_core::config::LaunchConfig;
use mocker_replay::{
    run_replay, Cluster, Hooks, Load, ReplayError, ReplayOptions, RouterMode, SyntheticWorkload,
};

/// Four workers, Poisson arrivals, prompts half shared within four groups: routing by
/// cached prefix pays off.
fn options(router: RouterMode, lag: Option<f64>) -> ReplayOptions {
    let engine = r#"{"engine":{"block_size":16,"num_gpu_blocks":4096,"max_num_seqs":64}}"#;
    ReplayOptions {
        cluster: Cluster::aggregated(LaunchConfig::from_json_str(engine).expect("engine args"), 4),
        workload: SyntheticWorkload {
            input_tokens: 1024,
            output_tokens: 32,
            request_count: 300,
            load: Load::RequestRate(30.0),
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 4,
            ..Default::default()
        }
        .into(),
        router,
        kv_event_lag_ms: lag,
        ..Default::default()
    }
}

/// The summary and, per request in arrival order, (arrival ms, overlap blocks the router
/// believed the chosen worker held).
fn run(options: &ReplayOptions) -> (serde_json::Value, Vec<(f64, u32)>) {
    let mut routed = Vec::new();
    let mut sink = |r: mocker_replay::RequestRecord| {
        let overlap = r.routing_history[0].selected_overlap_blocks.unwrap_or(0);
        routed.push((r.arrival_time_ms, overlap));
    };
    let out = run_replay(options, Hooks { request_ended: Some(&mut sink), ..Default::default() })
        .expect("replay runs");
    routed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut summary = out.summary.to_json_value();
    // The simulator's own speed, the only keys that are not deterministic.
    for key in ["wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"] {
        summary.as_object_mut().unwrap().remove(key);
    }
    (summary, routed)
}

#[test]
fn a_zero_lag_changes_nothing() {
    assert_eq!(run(&options(RouterMode::Kv, None)), run(&options(RouterMode::Kv, Some(0.0))));
}

#[test]
fn the_router_routes_blind_until_the_lag_has_passed() {
    let (_, live_routed) = run(&options(RouterMode::Kv, None));
    let hits = |routed: &[(f64, u32)], from: f64, to: f64| {
        routed.iter().filter(|(at, o)| (from..to).contains(at) && *o > 0).count()
    };
    assert!(hits(&live_routed, 0.0, 2000.0) > 10, "{live_routed:?}");

    // A 2 s lag: nothing stored is visible before 2 s, and hits come back after.
    let (_, lagged) = run(&options(RouterMode::Kv, Some(2000.0)));
    assert_eq!(hits(&lagged, 0.0, 2000.0), 0, "{lagged:?}");
    assert!(hits(&lagged, 4000.0, f64::INFINITY) > 10, "{lagged:?}");

    // A lag past the run: the router never sees a block, the engines still reuse their
    // own caches, and waiting events do not make the run longer.
    let (blind, blind_routed) = run(&options(RouterMode::Kv, Some(1e9)));
    assert!(blind_routed.iter().all(|(_, o)| *o == 0), "{blind_routed:?}");
    assert!(blind["prefix_cache_reused_ratio"].as_f64().unwrap() > 0.0, "{blind}");
    let end = |s: &serde_json::Value| s["duration_ms"].as_f64().unwrap();
    assert!(end(&blind) < 300.0 / 30.0 * 1000.0 * 2.0, "{}", end(&blind));
}

#[test]
fn a_lag_is_refused_with_round_robin_or_out_of_range() {
    let refused = |o: ReplayOptions| match run_replay(&o, Hooks::default()) {
        Err(ReplayError::Invalid { field, message }) => format!("{field}: {message}"),
        other => panic!("expected a refusal, got {:?}", other.map(|o| o.summary.to_json_value())),
    };
    let e = refused(options(RouterMode::RoundRobin, Some(5.0)));
    assert!(e.starts_with("kv_event_lag_ms") && e.contains("kv router"), "{e}");
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        assert!(refused(options(RouterMode::Kv, Some(bad))).starts_with("kv_event_lag_ms"), "{bad}");
    }
    // Zero asks for nothing, so round robin takes it.
    assert!(run_replay(&options(RouterMode::RoundRobin, Some(0.0)), Hooks::default()).is_ok());
}
