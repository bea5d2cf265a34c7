//! `mocker replay --mode online`: the live engines behind the CLI, and its usage errors.

mod cli;

use cli::{assert_exit_2, report, scratch};

const SMALL: &[&str] = &[
    "--request-count",
    "6",
    "--input-tokens",
    "64",
    "--output-tokens",
    "4",
    "--arrival-interval-ms",
    "400",
    "--engine-args",
    r#"{"speedup_ratio": 20}"#,
];

#[test]
fn online_mode_runs_the_live_engines_and_divides_arrivals_by_the_speedup() {
    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--mode", "online", "--arrival-speedup-ratio", "4"]);
    let dir = scratch("speedup");
    let online = report(&dir, "online", &args);
    assert_eq!(online["completed_requests"], 6);
    // Arrivals every 400 / 4 = 100 ms: the last arrives at 500 ms; each request takes a few
    // ms at speedup 20, so the run ends just after 500 ms (not after 2000 ms).
    let d = online["duration_ms"].as_f64().unwrap();
    assert!((500.0..560.0).contains(&d), "duration {d}");
    // The wall clock followed the simulated one.
    assert!(online["wall_time_ms"].as_f64().unwrap() >= 450.0);

    let mut args = SMALL.to_vec();
    args.extend_from_slice(&["--arrival-speedup-ratio", "4"]);
    let offline = report(&dir, "offline", &args);
    let o = offline["duration_ms"].as_f64().unwrap();
    assert!((o - d).abs() / o < 0.05, "offline {o} vs online {d}");
}

#[test]
fn bad_mode_or_speedup_exits_2() {
    for (args, needle) in [
        (&["--mode", "sideways"][..], "--mode"),
        (&["--mode", "online", "--arrival-speedup-ratio", "0"][..], "--arrival-speedup-ratio"),
        (&["--arrival-speedup-ratio", "-2"][..], "--arrival-speedup-ratio"),
        (&["--mode", "online", "--num-workers", "0"][..], "--num-workers"),
        (&["--mode", "online", "--router", "kv"][..], "--router"),
    ] {
        let mut full = vec!["replay", "--request-count", "2"];
        full.extend_from_slice(args);
        assert_exit_2(&full, &[needle]);
    }
}
