//! Cancellation: by id, via the stream, by drop, mid-pass (§9 properties 10, 12, 13, 31, 33, 35, 36, 44, 48).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mocker_live::{LiveEngine, LiveOptions};
use tokio::time::{timeout, Instant};
use uuid::Uuid;

// Property 35: during a long pass a second submit stays unacked while a cancellation on
// the cancellation lane is acknowledged at once (well within 500 ms; 0 on paused time).
#[tokio::test(start_paused = true)]
async fn p35_cancellation_is_acked_mid_pass_while_submits_wait_for_the_boundary() {
    let e = LiveEngine::start(fixed_config(10_000.0, 1.0), LiveOptions::default()).unwrap();
    let mut a = e.submit(generated(1, 256, 4)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await; // the 10 s pass is in flight
    let e2 = e.clone();
    let b = tokio::spawn(async move { e2.submit(generated(2, 8, 1)).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!b.is_finished(), "an ordinary submit is deferred to the pass boundary");
    assert_eq!(e.active_request_count(), 2, "the deferred submit already holds its route");
    let t = Instant::now();
    assert!(e.cancel(Uuid::from_u128(1)).await.unwrap());
    assert!(t.elapsed() < Duration::from_millis(500));
    assert!(a.recv().await.is_none(), "the cancelled stream closes without its token");
    assert!(!b.is_finished());
    let mut b = b.await.unwrap().unwrap();
    // Acked at the boundary of the 10 s pass, not earlier.
    assert!(e.started_at().elapsed() >= Duration::from_secs(10));
    assert!(b.recv().await.unwrap().completed);
    wait_idle(&e).await;
    e.shutdown().await.unwrap();
}

// Property 36 / 48: a mid-pass cancel is acked before the pass's FPM; occupancy drops at
// once; the pass still ends at its modelled time and other output waits for it.
#[tokio::test(start_paused = true)]
async fn p36_mid_pass_cancel_acks_before_fpm_and_frees_kv_at_once() {
    let log = Arc::new(Mutex::new(Vec::<&'static str>::new()));
    let l = log.clone();
    let options = LiveOptions {
        forward_pass_metrics: Some(Box::new(move |_| l.lock().unwrap().push("fpm"))),
        ..Default::default()
    };
    let e = LiveEngine::start(fixed_config(100.0, 100.0), options).unwrap();
    let mut other_prompt = planned(2, 12, &[7]);
    other_prompt.tokens.iter_mut().for_each(|t| *t += 500);
    // Submitted together, so both are admitted by the first pass.
    let (victim, other) = tokio::join!(e.submit(generated(1, 12, 50)), e.submit(other_prompt));
    let (_victim, mut other) = (victim.unwrap(), other.unwrap());
    tokio::time::sleep(Duration::from_millis(30)).await;
    let t = Instant::now();
    assert!(e.cancel(Uuid::from_u128(1)).await.unwrap());
    log.lock().unwrap().push("ack");
    assert!(t.elapsed() < Duration::from_millis(50));
    // The core computes a pass eagerly: the other request already finished in it, so the
    // cancellation leaves nothing running and no block in use, published at once.
    let m = *e.metrics().borrow();
    assert_eq!((m.running_requests, m.waiting_requests, m.active_blocks), (0, 0, 0));
    let o = other.recv().await.unwrap();
    assert_eq!(o.sim_time_ns, 100_000_000, "unrelated output only at the modelled pass end");
    assert_eq!(*log.lock().unwrap(), vec!["ack", "fpm"]);
    e.shutdown().await.unwrap();
}

// Cancelling by id: unknown id, waiting request, finished request, stream cancel.
#[tokio::test(start_paused = true)]
async fn cancel_by_id_covers_unknown_waiting_and_finished_requests() {
    let mut config = fixed_config(10.0, 1.0);
    config.max_num_seqs = 1;
    let e = LiveEngine::start(config, LiveOptions::default()).unwrap();
    assert!(!e.cancel(Uuid::from_u128(99)).await.unwrap());
    let mut running = e.submit(generated(1, 8, 5)).await.unwrap();
    // Applied at the first boundary; max_num_seqs 1 keeps it waiting.
    let mut waiting = e.submit(generated(2, 8, 5)).await.unwrap();
    assert_eq!(e.metrics().borrow().waiting_requests, 1);
    assert!(e.cancel(Uuid::from_u128(2)).await.unwrap());
    assert!(waiting.recv().await.is_none());
    assert_eq!(e.metrics().borrow().waiting_requests, 0);
    let mut n = 0;
    while let Some(o) = running.recv().await {
        n += 1;
        assert_eq!(o.completed, n == 5);
    }
    assert!(!e.cancel(Uuid::from_u128(1)).await.unwrap(), "nothing left to cancel");
    let s = e.submit(generated(3, 8, 5)).await.unwrap();
    assert!(s.cancel().await.unwrap());
    wait_idle(&e).await;
    e.shutdown().await.unwrap();
}

// Property 10: dropping an active request cleans up; the id is reusable.
#[tokio::test(start_paused = true)]
async fn p10_dropping_an_active_request_cleans_up_and_frees_the_id() {
    let mut config = test_config();
    config.speedup_ratio = 0.1;
    let e = LiveEngine::start(config, LiveOptions::default()).unwrap();
    let mut s = e.submit(generated(5, 8, 100)).await.unwrap();
    assert!(!s.recv().await.unwrap().rejected);
    assert_eq!(e.metrics().borrow().running_requests, 1);
    drop(s);
    timeout(Duration::from_secs(3), wait_idle(&e)).await.unwrap();
    assert_eq!(e.metrics().borrow().active_blocks, 0);
    let mut again = e.submit(planned(5, 8, &[77])).await.unwrap();
    assert_eq!(again.recv().await.unwrap().token_id, Some(77));
    e.shutdown().await.unwrap();
}

// Property 12: submits queued during a pass are applied together at its boundary and
// admitted by the same next pass (modelled time does not advance between them).
#[tokio::test(start_paused = true)]
async fn p12_concurrent_submits_share_one_boundary() {
    let e = LiveEngine::start(fixed_config(100.0, 10.0), LiveOptions::default()).unwrap();
    let _first = e.submit(generated(1, 8, 3)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut tasks = Vec::new();
    for i in 0..6u128 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move { e.submit(generated(10 + i, 8, 1)).await }));
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(e.active_request_count(), 7);
    assert!(tasks.iter().all(|t| !t.is_finished()));
    let mut ends = Vec::new();
    for t in tasks {
        let mut s = t.await.unwrap().unwrap();
        ends.push(s.recv().await.unwrap().sim_time_ns);
    }
    // All six were admitted by the pass that starts at the 100 ms boundary.
    assert!(ends.iter().all(|&t| t == ends[0]), "{ends:?}");
    assert_eq!(ends[0], 210_000_000);
    e.shutdown().await.unwrap();
}

// Property 13: aborting a caller whose submit is deferred leaves the engine consistent.
#[tokio::test(start_paused = true)]
async fn p13_aborted_deferred_submit_leaves_the_engine_consistent() {
    let e = LiveEngine::start(fixed_config(100.0, 10.0), LiveOptions::default()).unwrap();
    let first = e.submit(generated(1, 8, 50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let e2 = e.clone();
    let t = tokio::spawn(async move {
        let s = e2.submit(generated(2, 8, 50)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(s);
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(e.active_request_count(), 2);
    t.abort();
    assert!(t.await.unwrap_err().is_cancelled());
    assert!(first.cancel().await.unwrap());
    timeout(Duration::from_secs(3), wait_idle(&e)).await.unwrap();
    e.shutdown().await.unwrap();
}

// Properties 31 / 43 / 45: cancelling a request whose terminal output is pending in the
// in-flight pass suppresses that output and counts as applied.
#[tokio::test(start_paused = true)]
async fn p31_cancel_of_a_pending_terminal_suppresses_it_and_counts_as_applied() {
    let e = LiveEngine::start(fixed_config(100.0, 1.0), LiveOptions::default()).unwrap();
    let mut s = e.submit(planned(8, 8, &[42])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The core already computed the pass: the request finished in it, output not yet sent.
    assert_eq!(e.metrics().borrow().running_requests, 0);
    assert!(e.cancel(Uuid::from_u128(8)).await.unwrap());
    assert!(s.recv().await.is_none(), "the suppressed token is never delivered");
    assert_eq!(e.active_request_count(), 0);
    e.shutdown().await.unwrap();
}

// Property 44: when a queued cancellation and an overdue pass deadline are both ready, the
// cancellation is applied first, so the pending terminal is suppressed rather than sent.
#[tokio::test(start_paused = true)]
async fn p44_queued_cancel_beats_an_overdue_deadline() {
    let e = LiveEngine::start(fixed_config(100.0, 1.0), LiveOptions::default()).unwrap();
    let mut s = e.submit(planned(9, 8, &[42])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await; // the 100 ms pass is in flight
                                                         // Jump past the deadline without letting the actor run: its timer and the
                                                         // cancellation below are ready together when it next wakes.
    tokio::time::advance(Duration::from_millis(150)).await;
    assert!(e.cancel(Uuid::from_u128(9)).await.unwrap(), "applied, not a no-op on a finished request");
    assert!(s.recv().await.is_none(), "the terminal of the cancelled pass is never delivered");
    assert_eq!(e.active_request_count(), 0);
    e.shutdown().await.unwrap();
}

// Property 33: requests queued together all appear in the first output batch.
#[tokio::test(start_paused = true)]
async fn p33_requests_queued_together_share_the_first_batch() {
    let e = LiveEngine::start(fixed_config(10.0, 1.0), LiveOptions::default()).unwrap();
    let (a, b, c, d) = tokio::join!(
        e.submit(planned(0, 8, &[1])),
        e.submit(planned(0, 9, &[2])),
        e.submit(planned(0, 10, &[3])),
        e.submit(planned(0, 11, &[4]))
    );
    let mut times = Vec::new();
    for s in [a, b, c, d] {
        let o = s.unwrap().recv().await.unwrap();
        times.push((o.sim_time_ns, o.observed_at));
    }
    assert!(times.iter().all(|t| *t == times[0]), "{times:?}");
    assert_eq!(times[0].0, 10_000_000);
    e.shutdown().await.unwrap();
}
