//! Submission, streaming, ids and buffering (§9 properties 3-9, 14, 40 of live.md).

mod common;

use std::num::NonZeroUsize;
use std::time::Duration;

use common::*;
use mocker_live::{LiveEngine, LiveError, LiveOptions, OutputBuffering};
use tokio::time::{timeout, Instant};
use uuid::Uuid;

#[test]
fn start_outside_a_runtime_is_a_clear_error() {
    let e = LiveEngine::start(test_config(), LiveOptions::default()).unwrap_err();
    assert_eq!(e, LiveError::NoRuntime);
    assert!(e.to_string().contains("requires an active Tokio runtime"));
}

// Invalid arguments are refused with the field named; nothing is started.
#[tokio::test]
async fn invalid_engine_arguments_are_refused() {
    let mut config = test_config();
    config.block_size = 0;
    let e = LiveEngine::start(config, LiveOptions::default()).unwrap_err();
    assert!(e.to_string().starts_with("invalid Mocker engine arguments"), "{e}");
    assert!(e.to_string().contains("block_size"), "{e}");
    let e = LiveEngine::start_group(test_config(), Vec::new()).unwrap_err();
    assert!(e.to_string().contains("dp_size"), "{e}");
}

// Property 3: planned tokens stream to their owner, count 0 once the terminal is read.
#[tokio::test(start_paused = true)]
async fn p03_planned_tokens_stream_to_the_owner() {
    let e = LiveEngine::start(fixed_config(10.0, 1.0), LiveOptions::default()).unwrap();
    let id = Uuid::from_u128(0xabc);
    let mut s = e.submit(planned(0xabc, 8, &[41, 42, 43])).await.unwrap();
    assert_eq!(s.id(), id);
    let mut got = Vec::new();
    while let Some(o) = s.recv().await {
        got.push((o.uuid, o.token_id, o.completed, o.sim_time_ns));
        if o.completed {
            assert_eq!(e.active_request_count(), 0);
        }
    }
    assert_eq!(
        got,
        vec![
            (id, Some(41), false, 10_000_000),
            (id, Some(42), false, 11_000_000),
            (id, Some(43), true, 12_000_000)
        ]
    );
    assert!(s.recv().await.is_none());
    e.shutdown().await.unwrap();
}

// The actor sleeps the modelled durations on tokio's clock (speedup already applied once).
#[tokio::test(start_paused = true)]
async fn outputs_arrive_at_modelled_times_divided_once_by_the_speedup() {
    let mut config = fixed_config(100.0, 10.0);
    config.speedup_ratio = 10.0;
    let e = LiveEngine::start(config, LiveOptions::default()).unwrap();
    let t0 = e.started_at();
    let mut s = e.submit(generated(0, 8, 3)).await.unwrap();
    let mut times = Vec::new();
    while let Some(o) = s.recv().await {
        assert!(o.token_id.is_some());
        times.push((o.sim_time_ns, (Instant::now() - t0).as_micros()));
    }
    assert_eq!(times, vec![(10_000_000, 10_000), (11_000_000, 11_000), (12_000_000, 12_000)]);
    e.shutdown().await.unwrap();
}

// Property 4: a duplicate client id is rejected while active; the original is untouched.
#[tokio::test(start_paused = true)]
async fn p04_duplicate_client_id_is_rejected_while_active() {
    let e = LiveEngine::start(test_config(), LiveOptions::default()).unwrap();
    let original = e.submit(generated(7, 8, 100)).await.unwrap();
    let err = e.submit(generated(7, 8, 4)).await.unwrap_err();
    assert!(err.to_string().contains("already active"), "{err}");
    assert_eq!(e.active_request_count(), 1);
    assert!(original.cancel().await.unwrap());
    assert_eq!(e.active_request_count(), 0);
    e.shutdown().await.unwrap();
}

// Property 5: prepared requests count; dropping the registration frees the id.
#[tokio::test(start_paused = true)]
async fn p05_dropping_a_registration_closes_its_stream_and_frees_the_id() {
    let e = LiveEngine::start(test_config(), LiveOptions::default()).unwrap();
    let (reg, mut stream) = e.prepare_request(planned(9, 8, &[1])).unwrap();
    assert_eq!(reg.id(), Uuid::from_u128(9));
    assert_eq!(e.active_request_count(), 1);
    drop(reg);
    assert!(stream.recv().await.is_none());
    assert_eq!(e.active_request_count(), 0);
    let mut again = e.submit(planned(9, 8, &[5])).await.unwrap();
    assert_eq!(again.recv().await.unwrap().token_id, Some(5));
    // A registration of another engine is refused.
    let other = LiveEngine::start(test_config(), LiveOptions::default()).unwrap();
    let (reg, _s) = other.prepare_request(planned(1, 8, &[1])).unwrap();
    assert_eq!(e.submit_prepared(reg).await.unwrap_err(), LiveError::ForeignRegistration);
    assert_eq!(other.active_request_count(), 0);
    e.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

// Property 6: an empty effective output is refused and registers nothing.
#[tokio::test(start_paused = true)]
async fn p06_empty_effective_output_is_an_error() {
    let e = LiveEngine::start(test_config(), LiveOptions::default()).unwrap();
    for max in [0, 4] {
        let mut r = planned(3, 8, &[]);
        r.max_output_tokens = max;
        let err = e.submit(r).await.unwrap_err();
        assert!(err.to_string().contains("at least one output token"), "{err}");
        assert_eq!(e.active_request_count(), 0);
    }
    let err = e.submit(generated(3, 0, 2)).await.unwrap_err();
    assert!(err.to_string().contains("prompt is empty"), "{err}");
    assert_eq!(e.active_request_count(), 0);
    e.shutdown().await.unwrap();
}

// A request that can never fit yields one rejected terminal.
#[tokio::test(start_paused = true)]
async fn a_request_that_never_fits_is_rejected_in_band() {
    let e = LiveEngine::start(test_config(), LiveOptions::default()).unwrap();
    let mut s = e.submit(generated(0, 600, 4)).await.unwrap();
    let o = s.recv().await.unwrap();
    assert!(o.rejected && o.completed && o.token_id.is_none());
    assert!(s.recv().await.is_none());
    wait_idle(&e).await;
    e.shutdown().await.unwrap();
}

// Property 8: with full-response buffering unread streams never shed.
#[tokio::test(start_paused = true)]
async fn p08_full_response_buffers_whole_responses() {
    let options = LiveOptions { buffering: OutputBuffering::FullResponse, ..Default::default() };
    let e = LiveEngine::start(test_config(), options).unwrap();
    let mut streams = Vec::new();
    for i in 0..4u32 {
        let plan: Vec<u32> = (0..32).map(|k| 1000 * (i + 1) + k).collect();
        streams.push((plan.clone(), e.submit(planned(0, 8, &plan)).await.unwrap()));
    }
    timeout(Duration::from_secs(1), wait_idle(&e)).await.unwrap();
    for (plan, mut s) in streams {
        let mut got = Vec::new();
        while let Some(o) = s.recv().await {
            assert_eq!(o.completed, got.len() == 31);
            got.push(o.token_id.unwrap());
        }
        assert_eq!(got, plan);
    }
    e.shutdown().await.unwrap();
}

// Property 9: a reader that falls behind is cancelled at the same boundary: 2 passes.
#[tokio::test(start_paused = true)]
async fn p09_slow_consumer_is_shed_at_the_same_pass_boundary() {
    let mut options = LiveOptions {
        buffering: OutputBuffering::CancelOnOverflow { capacity: NonZeroUsize::new(1).unwrap() },
        ..Default::default()
    };
    let fpm = fpm_counter(&mut options);
    let e = LiveEngine::start(test_config(), options).unwrap();
    let mut slow = e.submit(planned(0, 8, &[1, 2, 3])).await.unwrap();
    let mut fast = e.submit(planned(0, 8, &[9])).await.unwrap();
    let o = timeout(Duration::from_secs(1), fast.recv()).await.unwrap().unwrap();
    assert_eq!((o.token_id, o.completed), (Some(9), true));
    timeout(Duration::from_secs(3), wait_idle(&e)).await.unwrap();
    assert!(!fast.overflowed());
    assert_eq!(slow.recv().await.unwrap().token_id, Some(1));
    assert!(slow.recv().await.is_none());
    assert!(slow.overflowed(), "the reader can tell shedding from a normal end");
    assert_eq!(e.overflow_cancellations(), 1, "one request shed, the finished one not counted");
    assert_eq!(*fpm.lock().unwrap(), 2);
    assert_eq!(e.metrics().borrow().active_blocks, 0);
    e.shutdown().await.unwrap();
}

// A shedding rank still buffers whole the requests submitted through a full-response
// handle (a server reading a non-streamed response itself): they never overflow.
#[tokio::test(start_paused = true)]
async fn p09b_a_full_response_handle_is_never_shed_on_a_shedding_rank() {
    let options = LiveOptions {
        buffering: OutputBuffering::CancelOnOverflow { capacity: NonZeroUsize::new(1).unwrap() },
        ..Default::default()
    };
    let e = LiveEngine::start(test_config(), options).unwrap();
    let whole = e.with_buffering(OutputBuffering::FullResponse);
    let mut kept = whole.submit(planned(0, 8, &[1, 2, 3])).await.unwrap();
    let mut shed = e.submit(planned(0, 8, &[4, 5, 6])).await.unwrap();
    timeout(Duration::from_secs(3), wait_idle(&e)).await.unwrap();
    let mut got = Vec::new();
    while let Some(o) = kept.recv().await {
        got.push(o.token_id.unwrap());
    }
    assert_eq!(got, [1, 2, 3]);
    assert!(!kept.overflowed());
    while shed.recv().await.is_some() {}
    assert!(shed.overflowed(), "the rank's own policy still sheds");
    assert_eq!(e.overflow_cancellations(), 1);
    e.shutdown().await.unwrap();
}

// Property 40: a closed receiver cancels the request at the first boundary (1 pass).
#[tokio::test(start_paused = true)]
async fn p40_closed_receiver_is_cancelled_at_the_first_boundary() {
    let mut options = LiveOptions::default();
    let fpm = fpm_counter(&mut options);
    let e = LiveEngine::start(test_config(), options).unwrap();
    let stream = e.submit(generated(0, 8, 50)).await.unwrap();
    drop(stream);
    timeout(Duration::from_millis(500), wait_idle(&e)).await.unwrap();
    let m = *e.metrics().borrow();
    assert_eq!((m.active_blocks, m.gpu_cache_usage_perc), (0, 0.0));
    assert!(*fpm.lock().unwrap() <= 1, "no pass after the first boundary");
    e.shutdown().await.unwrap();
}

// Property 14: admissions are forwarded (client id) before the outputs.
#[tokio::test(start_paused = true)]
async fn p14_admissions_are_forwarded_with_client_ids() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let options = LiveOptions { admissions: Some(tx), ..Default::default() };
    let e = LiveEngine::start(fixed_config(10.0, 1.0), options).unwrap();
    let mut s = e.submit(planned(0x55, 8, &[4])).await.unwrap();
    let a = timeout(Duration::from_millis(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(a.uuid, Uuid::from_u128(0x55));
    assert_eq!(a.reused_input_tokens, 0);
    let o = s.recv().await.unwrap();
    assert!(a.observed_at < o.observed_at);
    assert!(o.observed_at <= Instant::now());
    assert!(o.completed);
    e.shutdown().await.unwrap();
}

// Prefix reuse shows in cached_tokens on the first signal only.
#[tokio::test(start_paused = true)]
async fn cached_tokens_report_prefix_reuse_on_the_first_signal() {
    let e = LiveEngine::start(test_config(), LiveOptions::default()).unwrap();
    for expect in [0usize, 16] {
        let mut s = e.submit(generated(0, 17, 3)).await.unwrap();
        let first = s.recv().await.unwrap();
        assert_eq!(first.cached_tokens, Some(expect));
        while let Some(o) = s.recv().await {
            assert_eq!(o.cached_tokens, None);
        }
    }
    e.shutdown().await.unwrap();
}

// The first signal says when the request's first pass started: a request queued behind a
// full batch is scheduled when the batch frees, and its prefill runs from there.
#[tokio::test(start_paused = true)]
async fn the_first_signal_carries_the_start_of_the_admitting_pass() {
    let mut config = fixed_config(100.0, 10.0);
    config.max_num_seqs = 1;
    let e = LiveEngine::start(config, LiveOptions::default()).unwrap();
    let mut a = e.submit(generated(1, 8, 3)).await.unwrap();
    let mut b = e.submit(generated(2, 8, 3)).await.unwrap();
    let mut a_signals = Vec::new();
    while let Some(o) = a.recv().await {
        a_signals.push(o);
    }
    let a_start = a_signals[0].scheduled_ns.expect("first signal is scheduled");
    assert_eq!(a_signals[0].sim_time_ns - a_start, 100_000_000, "prefill from the admitting pass");
    assert!(a_signals[1..].iter().all(|o| o.scheduled_ns.is_none()));
    let a_end = a_signals.last().unwrap().sim_time_ns;
    let b_first = b.recv().await.unwrap();
    assert_eq!(b_first.scheduled_ns, Some(a_end), "b waits for a's slot");
    assert_eq!(b_first.sim_time_ns, a_end + 100_000_000);
    e.shutdown().await.unwrap();
}
