//! Drop, shutdown, failures and grouped DP (§9 properties 15, 17-20, 32, 49 of live.md).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mocker_core::events::KvEventData;
use mocker_live::{LiveEngine, LiveError, LiveOptions, OutputBuffering};
use tokio::time::timeout;

// Property 15: dropping the engine closes outstanding streams promptly.
#[tokio::test(start_paused = true)]
async fn p15_dropping_the_engine_closes_outstanding_streams() {
    let e = LiveEngine::start(fixed_config(10.0, 10.0), LiveOptions::default()).unwrap();
    let mut s = e.submit(generated(0, 256, 200)).await.unwrap();
    assert!(!s.recv().await.unwrap().rejected);
    assert_eq!(e.metrics().borrow().running_requests, 1);
    drop(e);
    let closed = timeout(Duration::from_secs(1), async { while s.recv().await.is_some() {} }).await;
    assert!(closed.is_ok(), "stream still open 1 s after the engine was dropped");
}

// Property 17 and "nothing survives shutdown": the sinks are dropped when shutdown
// resolves, every stream is closed, the count is 0 and later submits fail clearly.
#[tokio::test(start_paused = true)]
async fn p17_shutdown_resolves_after_the_actor_and_its_sinks_are_gone() {
    let marker = Arc::new(());
    let weak = Arc::downgrade(&marker);
    let m2 = marker.clone();
    let options = LiveOptions {
        kv_events: Some(Box::new(move |_| {
            let _ = &m2;
        })),
        ..Default::default()
    };
    drop(marker);
    let e = LiveEngine::start(test_config(), options).unwrap();
    let mut s = e.submit(generated(0, 64, 200)).await.unwrap();
    assert!(!s.recv().await.unwrap().rejected);
    let (reg, mut prepared) = e.prepare_request(generated(0, 8, 1)).unwrap();
    assert!(weak.upgrade().is_some());
    assert_eq!(e.metrics().borrow().running_requests, 1, "{:?}", *e.metrics().borrow());
    e.shutdown().await.unwrap();
    assert!(weak.upgrade().is_none(), "the KV sink outlived shutdown");
    assert_eq!(e.active_request_count(), 0);
    let m = *e.metrics().borrow();
    assert_eq!((m.running_requests, m.waiting_requests, m.active_blocks), (0, 0, 0), "metrics back to idle");
    assert!(e.metrics().has_changed().is_err(), "the metrics sender (actor) is gone");
    while s.recv().await.is_some() {}
    assert_eq!(e.submit_prepared(reg).await.unwrap_err(), LiveError::NotRunning);
    assert!(prepared.recv().await.is_none());
    let err = e.submit(generated(0, 8, 1)).await.unwrap_err();
    assert!(err.to_string().contains("not running"), "{err}");
    assert_eq!(e.shutdown().await, Ok(()), "idempotent");
    assert!(e.reset_prefix_cache().await.is_err());
}

// Property 18: a dropped admission receiver stops the rank; shutdown reports it, twice.
#[tokio::test(start_paused = true)]
async fn p18_admission_receiver_dropped_is_reported_by_every_shutdown() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let e =
        LiveEngine::start(test_config(), LiveOptions { admissions: Some(tx), ..Default::default() }).unwrap();
    drop(rx);
    let mut s = e.submit(generated(0, 8, 100)).await.unwrap();
    assert!(timeout(Duration::from_secs(1), s.recv()).await.unwrap().is_none());
    let err = e.submit(generated(0, 8, 1)).await.unwrap_err();
    assert!(err.to_string().contains("not running"), "{err}");
    let a = e.shutdown().await.unwrap_err();
    assert!(a.to_string().contains("admission receiver closed"), "{a}");
    let e2 = e.clone();
    assert_eq!(e2.shutdown().await.unwrap_err(), a);
}

// Property 19 / 32: two ranks share one actor; each gets its own output and FPM.
#[tokio::test(start_paused = true)]
async fn p19_grouped_ranks_each_serve_their_own_requests() {
    let mut o0 = LiveOptions::default();
    let mut o1 = LiveOptions::default();
    let f0 = fpm_counter(&mut o0);
    let f1 = fpm_counter(&mut o1);
    let ranks = LiveEngine::start_group(fixed_config(10.0, 1.0), vec![o0, o1]).unwrap();
    assert_eq!(ranks.len(), 2);
    assert_eq!((ranks[0].dp_rank(), ranks[1].dp_rank()), (0, 1));
    let (a, b) =
        tokio::join!(ranks[0].submit(planned(0, 8, &[101])), ranks[1].submit(planned(0, 16, &[202])));
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    let (oa, ob) = (a.recv().await.unwrap(), b.recv().await.unwrap());
    assert_eq!((oa.token_id, oa.completed), (Some(101), true));
    assert_eq!((ob.token_id, ob.completed), (Some(202), true));
    assert_eq!(oa.sim_time_ns, ob.sim_time_ns, "one pass barrier");
    assert!(a.recv().await.is_none() && b.recv().await.is_none());
    assert_eq!((*f0.lock().unwrap(), *f1.lock().unwrap()), (1, 1));
    assert_eq!(ranks[1].metrics().borrow().dp_rank, 1);
    ranks[0].shutdown().await.unwrap();
    ranks[1].shutdown().await.unwrap();
}

// Property 20: dropping one rank retires only its requests.
#[tokio::test(start_paused = true)]
async fn p20_dropping_one_rank_retires_only_its_requests() {
    let mut ranks =
        LiveEngine::start_group(fixed_config(10.0, 1.0), vec![Default::default(), Default::default()])
            .unwrap();
    let r1 = ranks.pop().unwrap();
    let r0 = ranks.pop().unwrap();
    let mut a = r0.submit(generated(0, 8, 50)).await.unwrap();
    let mut b = r1.submit(generated(0, 8, 50)).await.unwrap();
    let m1 = r1.metrics();
    assert!(!b.recv().await.unwrap().rejected);
    assert_eq!(m1.borrow().running_requests, 1);
    drop(r1);
    assert!(timeout(Duration::from_secs(1), async { while b.recv().await.is_some() {} }).await.is_ok());
    timeout(Duration::from_secs(1), async {
        while m1.borrow().running_requests + m1.borrow().waiting_requests > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap();
    let mut n = 0;
    while let Some(o) = a.recv().await {
        n += 1;
        assert_eq!(o.completed, n == 50);
    }
    assert_eq!(n, 50, "rank 0 finished undisturbed");
    let mut c = r0.submit(planned(0, 8, &[5])).await.unwrap();
    assert_eq!(c.recv().await.unwrap().token_id, Some(5));
    r0.shutdown().await.unwrap();
}

// Property 49: a zero-duration engine still lets an external shutdown finish.
#[tokio::test]
async fn p49_zero_duration_engine_yields_to_shutdown() {
    let e = LiveEngine::start(fixed_config(0.0, 0.0), LiveOptions::default()).unwrap();
    let _s = e.submit(generated(0, 8, 1_000_000)).await.unwrap();
    tokio::task::yield_now().await;
    let r = tokio::time::timeout(Duration::from_secs(1), e.shutdown()).await;
    assert_eq!(r.expect("shutdown within 1 s"), Ok(()));
}

// reset_prefix_cache: refused while blocks are in use, then emits Cleared to the sink.
#[tokio::test(start_paused = true)]
async fn reset_prefix_cache_emits_cleared_through_the_sink() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let options = LiveOptions {
        kv_events: Some(Box::new(move |batch| {
            ev.lock().unwrap().extend(batch.iter().map(|e| e.data.clone()))
        })),
        ..Default::default()
    };
    let e = LiveEngine::start(fixed_config(10.0, 1.0), options).unwrap();
    let s = e.submit(generated(0, 16, 100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let busy = e.reset_prefix_cache().await.unwrap_err();
    assert!(busy.to_string().contains("blocks are in use"), "{busy}");
    assert!(s.cancel().await.unwrap());
    e.reset_prefix_cache().await.unwrap();
    let got = events.lock().unwrap().clone();
    assert!(matches!(got.first(), Some(KvEventData::Stored { .. })), "{got:?}");
    assert_eq!(got.last(), Some(&KvEventData::Cleared));
    assert_eq!(e.metrics().borrow().inactive_blocks, 0);
    e.shutdown().await.unwrap();
}

// abort_all_and_reset (vLLM's sleep): in-flight requests end early, their KV is freed and
// the prefix cache dropped with one Cleared event, even though blocks were in use.
#[tokio::test(start_paused = true)]
async fn abort_all_and_reset_ends_streams_and_clears_the_cache() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let options = LiveOptions {
        kv_events: Some(Box::new(move |batch| {
            ev.lock().unwrap().extend(batch.iter().map(|e| e.data.clone()))
        })),
        buffering: OutputBuffering::FullResponse,
        ..Default::default()
    };
    let e = LiveEngine::start(fixed_config(10.0, 1.0), options).unwrap();
    let mut a = e.submit(generated(0, 16, 100)).await.unwrap();
    let mut b = e.submit(generated(0, 32, 100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(25)).await;
    assert_eq!(e.abort_all_and_reset().await.unwrap(), 2);
    for s in [&mut a, &mut b] {
        let mut last = None;
        while let Some(sig) = s.recv().await {
            last = Some(sig);
        }
        assert!(!last.is_some_and(|s| s.completed), "an aborted stream never completes");
    }
    assert_eq!(e.active_request_count(), 0);
    let got = events.lock().unwrap().clone();
    assert_eq!(got.iter().filter(|e| matches!(e, KvEventData::Cleared)).count(), 1, "{got:?}");
    assert_eq!(got.last(), Some(&KvEventData::Cleared));
    let m = *e.metrics().borrow();
    assert_eq!((m.active_blocks, m.inactive_blocks), (0, 0), "{m:?}");
    assert_eq!(e.abort_all_and_reset().await.unwrap(), 0, "idempotent on an idle engine");
    e.shutdown().await.unwrap();
}

// Property 42: two ranks, 100 ms fixed pass: nothing at 99 ms, both at 100 ms.
#[tokio::test(start_paused = true)]
async fn p42_grouped_pass_completes_for_both_ranks_at_the_modelled_end() {
    let ranks =
        LiveEngine::start_group(fixed_config(100.0, 1.0), vec![Default::default(), Default::default()])
            .unwrap();
    let t0 = ranks[0].started_at();
    let (a, b) = tokio::join!(ranks[0].submit(planned(0, 8, &[1])), ranks[1].submit(planned(0, 8, &[2])));
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    tokio::time::sleep_until(t0 + Duration::from_millis(99)).await;
    assert!(timeout(Duration::ZERO, a.recv()).await.is_err());
    assert!(timeout(Duration::ZERO, b.recv()).await.is_err());
    let (oa, ob) = (a.recv().await.unwrap(), b.recv().await.unwrap());
    assert_eq!((oa.sim_time_ns, ob.sim_time_ns), (100_000_000, 100_000_000));
    assert_eq!(oa.observed_at, ob.observed_at, "one boundary for the group");
    ranks[1].shutdown().await.unwrap();
    ranks[0].shutdown().await.unwrap();
}

// §8: a failed actor (here: a panicking sink) closes every stream promptly; later
// submissions fail clearly and shutdown reports the task failure.
#[tokio::test(start_paused = true)]
async fn a_failed_actor_closes_streams_and_is_reported() {
    let options = LiveOptions {
        forward_pass_metrics: Some(Box::new(|_| panic!("injected sink failure"))),
        ..Default::default()
    };
    let e = LiveEngine::start(fixed_config(10.0, 1.0), options).unwrap();
    let mut s = e.submit(generated(0, 8, 5)).await.unwrap();
    assert!(timeout(Duration::from_secs(1), s.recv()).await.unwrap().is_none());
    assert_eq!(e.active_request_count(), 0);
    let err = e.submit(generated(0, 8, 1)).await.unwrap_err();
    assert!(err.to_string().contains("not running"), "{err}");
    let err = e.shutdown().await.unwrap_err();
    assert!(err.to_string().contains("scheduler task failed"), "{err}");
    assert_eq!(e.shutdown().await.unwrap_err(), err);
}

// Property 47: an idle sibling crossing a shared boundary reports the group's duration.
#[tokio::test(start_paused = true)]
async fn p47_idle_sibling_reports_the_group_pass_duration() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let (l0, l1) = (log.clone(), log.clone());
    let o0 = LiveOptions {
        forward_pass_metrics: Some(Box::new(move |m| l0.lock().unwrap().push((0, m.wall_time_secs)))),
        ..Default::default()
    };
    let o1 = LiveOptions {
        forward_pass_metrics: Some(Box::new(move |m| l1.lock().unwrap().push((1, m.wall_time_secs)))),
        ..Default::default()
    };
    let ranks = LiveEngine::start_group(fixed_config(100.0, 1.0), vec![o0, o1]).unwrap();
    let mut s = ranks[0].submit(planned(0, 8, &[1])).await.unwrap();
    assert!(s.recv().await.unwrap().completed);
    let got = log.lock().unwrap().clone();
    assert_eq!(got, vec![(0, 0.1), (1, 0.1)]);
    ranks[0].shutdown().await.unwrap();
}
