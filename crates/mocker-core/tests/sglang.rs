//! SGLang backend behaviour, pinned to figures measured on the reference (ai-dynamo-runtime
//! 1.6.1, offline synthetic replay, single worker, polynomial timing).

mod common;

use common::{closed_loop, config, engine, prompt};

fn assert_close(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() <= tol * want.abs().max(1e-9), "{what}: got {got}, reference {want}");
}

/// Reference case C: default SGLang page size 1 ⇒ a 16384-token pool; 3 retractions.
#[test]
fn tight_default_pool_with_retractions_matches_reference() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang"}}"#));
    let r = closed_loop(&mut e, 100, 16, 100, |i| prompt(i, 1000, 0, 0));
    assert_eq!((r.completed, r.rejected), (100, 0));
    assert_close(r.duration_ms, 25463.360703, 1e-6, "duration");
    assert_close(r.mean_ttft_ms, 539.568434, 1e-6, "mean ttft");
    assert_close(r.mean_itl_ms, 34.725458, 1e-6, "mean itl");
    assert_eq!(e.metrics().num_preemptions_total, 3, "retractions");
    e.check_invariants().unwrap();
}

/// Reference case H: a pool large enough that nothing is retracted.
#[test]
fn roomy_pool_matches_reference() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","num_gpu_blocks":1048576}}"#));
    let r = closed_loop(&mut e, 100, 16, 100, |i| prompt(i, 1000, 0, 0));
    assert_close(r.duration_ms, 6572.123409, 1e-6, "duration");
    assert_close(r.mean_ttft_ms, 242.833427, 1e-6, "mean ttft");
    assert_close(r.mean_itl_ms, 7.352257, 1e-6, "mean itl");
    assert_eq!(e.metrics().num_preemptions_total, 0);
}

/// Reference case G: long outputs on a 32768-token pool.
#[test]
fn long_outputs_pool_matches_reference() {
    let mut e = engine(config(r#"{"engine":{"backend":"sglang","num_gpu_blocks":32768}}"#));
    let r = closed_loop(&mut e, 64, 32, 500, |i| prompt(i, 2000, 0, 0));
    assert_close(r.duration_ms, 85083.759348, 1e-6, "duration");
    assert_close(r.mean_ttft_ms, 17021.844771, 1e-6, "mean ttft");
    assert_close(r.mean_itl_ms, 35.928875, 1e-6, "mean itl");
    e.check_invariants().unwrap();
}
