//! Online replay (`mocker replay --mode online`) against offline replay of the same
//! workload: the live path and the offline path are one engine.

use mocker_args::online;
use mocker_core::config::LaunchConfig;
use mocker_replay::report::Summary;
use mocker_replay::{run_synthetic, Cluster, Load, ReplayOptions, SyntheticWorkload};

fn options(isl: usize, osl: usize, n: usize, load: Load, speedup: f64) -> ReplayOptions {
    let mut launch = LaunchConfig::default();
    launch.engine.speedup_ratio = speedup;
    ReplayOptions {
        cluster: Cluster::aggregated(launch, 1),
        workload: SyntheticWorkload {
            input_tokens: isl,
            output_tokens: osl,
            request_count: n,
            load,
            ..Default::default()
        }
        .into(),
        ..Default::default()
    }
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

fn assert_close(online: &Summary, offline: &Summary, tol: f64) {
    assert_eq!(online.num_requests, offline.num_requests);
    assert_eq!(online.completed_requests, offline.completed_requests);
    assert_eq!(online.total_output_tokens, offline.total_output_tokens);
    assert_eq!(online.total_input_tokens, offline.total_input_tokens);
    for (name, a, b) in [
        ("mean_ttft_ms", online.ttft_ms.mean, offline.ttft_ms.mean),
        ("mean_itl_ms", online.itl_ms.mean, offline.itl_ms.mean),
        ("mean_e2e_ms", online.e2e_latency_ms.mean, offline.e2e_latency_ms.mean),
        ("duration_ms", online.duration_ms, offline.duration_ms),
    ] {
        assert!(rel(a, b) <= tol, "{name}: online {a} vs offline {b} (tolerance {tol})");
    }
}

// On tokio's paused clock the online replay reproduces the offline report: the same
// passes run at the same modelled times (clients react before the next boundary).
#[tokio::test(start_paused = true)]
async fn online_matches_offline_exactly_on_paused_time() {
    let opts = options(1000, 100, 200, Load::Concurrency(16), 10.0);
    let offline = run_synthetic(&opts).unwrap().summary;
    let online = online::replay_online(&opts).await.unwrap().summary;
    assert_close(&online, &offline, 1e-9);
    assert_eq!(online.committed_prefill_tokens, offline.committed_prefill_tokens);
}

// Open-loop arrivals (idle starts follow tokio's clock, which ticks in whole ms).
#[tokio::test(start_paused = true)]
async fn online_matches_offline_on_open_loop_arrivals() {
    let opts = options(256, 20, 40, Load::ArrivalIntervalMs(5.0), 1.0);
    let offline = run_synthetic(&opts).unwrap().summary;
    let online = online::replay_online(&opts).await.unwrap().summary;
    assert_close(&online, &offline, 0.02);
}

// On the real wall clock at a high speedup (a small workload, a loose tolerance: the
// machine's scheduling jitter may move a submission past a pass boundary).
#[test]
fn online_on_the_wall_clock_agrees_with_offline() {
    let opts = options(1000, 32, 48, Load::Concurrency(8), 10.0);
    let offline = run_synthetic(&opts).unwrap().summary;
    let online = online::run_online(&opts).unwrap().summary;
    assert_close(&online, &offline, 0.15);
    assert!(online.wall_time_ms > 0.0);
}

#[test]
fn online_refuses_what_offline_refuses() {
    let mut opts = options(16, 4, 2, Load::Concurrency(1), 1.0);
    opts.cluster = Cluster::aggregated(LaunchConfig::default(), 0);
    let e = online::run_online(&opts).unwrap_err();
    assert!(e.to_string().contains("num_workers"), "{e}");
    let opts = options(16, 4, 2, Load::Concurrency(0), 1.0);
    assert!(online::run_online(&opts).unwrap_err().to_string().contains("concurrency"));
}

// The acceptance workload on the real wall clock: ISL 1000 / OSL 100, 200
// requests, concurrency 16, speedup 10: mean TTFT and mean ITL within 2% of offline.
// Ignored by default: on the wall clock its margin depends on the machine's load (run with
// `cargo test --release -p mocker-args --test online_replay -- --ignored`).
#[test]
#[ignore]
fn online_acceptance_workload_within_two_percent_on_the_wall_clock() {
    let opts = options(1000, 100, 200, Load::Concurrency(16), 10.0);
    let offline = run_synthetic(&opts).unwrap().summary;
    let online = online::run_online(&opts).unwrap().summary;
    eprintln!(
        "ttft online {} offline {}; itl online {} offline {}; wall {} ms",
        online.ttft_ms.mean,
        offline.ttft_ms.mean,
        online.itl_ms.mean,
        offline.itl_ms.mean,
        online.wall_time_ms
    );
    assert!(rel(online.ttft_ms.mean, offline.ttft_ms.mean) <= 0.02);
    assert!(rel(online.itl_ms.mean, offline.itl_ms.mean) <= 0.02);
}
