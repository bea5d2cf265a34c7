//! Disaggregated handoff at the engine level (§9 properties 23-27, 34, 46 of live.md).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use mocker_core::config::{Backend, EngineConfig, KvTransferTimingMode};
use mocker_core::events::KvEventData;
use mocker_live::{
    handoff_order, HandoffEvent, HandoffId, HandoffOrder, HandoffTransferTiming, LiveEngine, LiveOptions,
};
use tokio::time::timeout;
use uuid::Uuid;

fn transfer_config() -> EngineConfig {
    let mut c = fixed_config(10.0, 1.0);
    c.kv_transfer_bytes_per_token = Some(131072.0);
    c.kv_transfer_bandwidth = Some(64.0);
    c
}

#[test]
fn transfer_delay_follows_the_formula() {
    // core.md §8: isl 1000, 131072 B/token, 64 GB/s -> 2.048 ms; destination_missing with
    // 16 blocks x 64 tokens missing -> 2.097152 ms.
    let t = HandoffTransferTiming {
        mode: KvTransferTimingMode::FullPrompt,
        full_prompt_tokens: 1000,
        kv_bytes_per_token: Some(131072.0),
        bandwidth_gb_s: Some(64.0),
    };
    assert!((t.delay_ms(None).unwrap() - 2.048).abs() < 1e-12);
    assert!((t.delay_ms(Some(1024)).unwrap() - 2.048).abs() < 1e-12, "full_prompt ignores missing");
    let m = HandoffTransferTiming { mode: KvTransferTimingMode::DestinationMissing, ..t };
    assert!((m.delay_ms(Some(1024)).unwrap() - 2.097152).abs() < 1e-12);
    assert_eq!(HandoffTransferTiming { bandwidth_gb_s: Some(0.0), ..t }.delay_ms(None), None);
    assert_eq!(HandoffTransferTiming { kv_bytes_per_token: None, ..t }.delay_ms(None), None);
    assert_eq!(handoff_order(Backend::Vllm).unwrap(), HandoffOrder::SourceFirst);
    assert_eq!(handoff_order(Backend::Sglang).unwrap(), HandoffOrder::DestinationFirst);
    assert!(handoff_order(Backend::Trtllm).unwrap_err().to_string().contains("does not support TRT-LLM"));
}

// Properties 23 / 34 / 46: the happy path on a prefill and a decode engine.
#[tokio::test(start_paused = true)]
async fn p23_handoff_happy_path_source_then_destination() {
    let kv = Arc::new(Mutex::new(Vec::new()));
    let k = kv.clone();
    let decode_options = LiveOptions {
        kv_events: Some(Box::new(move |b| k.lock().unwrap().extend(b.iter().map(|e| e.data.clone())))),
        ..Default::default()
    };
    let mut fpm_opts = LiveOptions::default();
    let prefill_fpm = fpm_counter(&mut fpm_opts);
    let prefill = LiveEngine::start(transfer_config(), fpm_opts).unwrap();
    let decode = LiveEngine::start(transfer_config(), decode_options).unwrap();
    let h = HandoffId(Uuid::from_u128(0x4a4d));

    let (src, mut src_events) = prefill.register_handoff(h).unwrap();
    let dup = prefill.register_handoff(h).unwrap_err();
    assert!(dup.to_string().contains("already has a lifecycle route"), "{dup}");
    let (reg, mut src_stream) = prefill.prepare_request(planned(0, 16, &[500])).unwrap();
    src.submit_prefill(reg).await.unwrap();
    let o = timeout(Duration::from_secs(1), src_stream.recv()).await.unwrap().unwrap();
    assert_eq!((o.token_id, o.completed), (Some(500), true));
    // 16 tokens x 131072 B / 64 GB/s.
    assert!((o.handoff_delay_ms.unwrap() - 16.0 * 131072.0 / 64e9 * 1e3).abs() < 1e-12);
    let ev = timeout(Duration::from_secs(1), src_events.recv()).await.unwrap().unwrap();
    let HandoffEvent::SourceHeld { transfer_timing } = ev else { panic!("{ev:?}") };
    assert_eq!(transfer_timing.full_prompt_tokens, 16);
    // Held: KV stays, the request id is free, and no effect-free passes run meanwhile.
    assert_eq!(prefill.active_request_count(), 0);
    assert_eq!(prefill.metrics().borrow().active_blocks, 4);
    let passes = *prefill_fpm.lock().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*prefill_fpm.lock().unwrap(), passes, "a held source does not spin");

    let (dst, mut dst_events) = decode.register_handoff(h).unwrap();
    let (reg, mut dst_stream) = decode.prepare_request(planned(0, 16, &[501, 502])).unwrap();
    dst.reserve_destination(reg).await.unwrap();
    let ev = timeout(Duration::from_secs(1), dst_events.recv()).await.unwrap().unwrap();
    assert_eq!(ev, HandoffEvent::DestinationReserved { transferable_prompt_tokens: 16 });
    assert_eq!(decode.metrics().borrow().active_blocks, 4);
    assert!(kv.lock().unwrap().is_empty(), "no KV published before activation");
    dst.activate_destination().await.unwrap();
    assert!(matches!(kv.lock().unwrap().first(), Some(KvEventData::Stored { .. })));
    let a = dst_stream.recv().await.unwrap();
    let b = dst_stream.recv().await.unwrap();
    assert_eq!((a.token_id, b.token_id, b.completed), (Some(501), Some(502), true));
    // The destination's first pass is a decode pass (1 ms): no prefill is modelled there.
    assert_eq!(b.sim_time_ns - a.sim_time_ns, 1_000_000);
    assert!(src.release_source().await.unwrap());
    assert!(!src.release_source().await.unwrap(), "released once");
    wait_idle(&prefill).await;
    assert_eq!(prefill.metrics().borrow().active_blocks, 0);
    assert!(dst.activate_destination().await.is_err(), "not reserved any more");
    prefill.shutdown().await.unwrap();
    decode.shutdown().await.unwrap();
    assert!(src_events.recv().await.is_none());
    assert!(dst_events.recv().await.is_none());
}

// Property 24: dropping a reserved destination's stream frees its blocks.
#[tokio::test(start_paused = true)]
async fn p24_dropping_a_reserved_destination_frees_its_blocks() {
    let e = LiveEngine::start(transfer_config(), LiveOptions::default()).unwrap();
    let (dst, _events) = e.register_handoff(HandoffId(Uuid::from_u128(1))).unwrap();
    let (reg, stream) = e.prepare_request(planned(0, 16, &[1, 2])).unwrap();
    dst.reserve_destination(reg).await.unwrap();
    assert_eq!(e.metrics().borrow().active_blocks, 4);
    drop(stream);
    timeout(Duration::from_secs(1), wait_idle(&e)).await.unwrap();
    for _ in 0..100 {
        if e.metrics().borrow().active_blocks == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(e.metrics().borrow().active_blocks, 0);
    assert!(!dst.cancel_destination().await.unwrap(), "Noop afterwards is fine");
    e.shutdown().await.unwrap();
}

// Property 25: a control of an earlier registration is refused; the new one works.
#[tokio::test(start_paused = true)]
async fn p25_stale_handoff_control_is_refused() {
    let e = LiveEngine::start(transfer_config(), LiveOptions::default()).unwrap();
    let h = HandoffId(Uuid::from_u128(2));
    let (old, old_events) = e.register_handoff(h).unwrap();
    drop(old_events);
    let (new, new_events) = e.register_handoff(h).unwrap();
    let (reg, mut stream) = e.prepare_request(planned(0, 16, &[9])).unwrap();
    new.reserve_destination(reg).await.unwrap();
    drop(new_events);
    let err = old.cancel_destination().await.unwrap_err();
    assert!(err.to_string().contains("earlier registration"), "{err}");
    let (reg2, _s2) = e.prepare_request(planned(0, 16, &[9])).unwrap();
    let err = new.submit_prefill(reg2).await.unwrap_err();
    assert!(err.to_string().contains("no longer registered"), "{err}");
    new.activate_destination().await.unwrap();
    let o = stream.recv().await.unwrap();
    assert_eq!((o.token_id, o.completed), (Some(9), true));
    e.shutdown().await.unwrap();
}

// Property 26: a late cancellation of an old destination never touches its replacement.
#[tokio::test(start_paused = true)]
async fn p26_late_cancel_of_a_reused_handoff_id_spares_the_replacement() {
    let e = LiveEngine::start(transfer_config(), LiveOptions::default()).unwrap();
    let h = HandoffId(Uuid::from_u128(3));
    let (c1, ev1) = e.register_handoff(h).unwrap();
    let (reg, mut old_stream) = e.prepare_request(planned(0, 16, &[1])).unwrap();
    c1.reserve_destination(reg).await.unwrap();
    c1.activate_destination().await.unwrap();
    assert!(old_stream.recv().await.unwrap().completed);
    drop(ev1);
    let (c2, _ev2) = e.register_handoff(h).unwrap();
    let (reg, mut new_stream) = e.prepare_request(planned(0, 16, &[2])).unwrap();
    c2.reserve_destination(reg).await.unwrap();
    drop(old_stream);
    let err = c1.cancel_destination().await.unwrap_err();
    assert!(err.to_string().contains("earlier registration"), "{err}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(e.active_request_count(), 1);
    c2.activate_destination().await.unwrap();
    assert_eq!(new_stream.recv().await.unwrap().token_id, Some(2));
    e.shutdown().await.unwrap();
}

// Property 27: a retained control never keeps the engine alive.
#[tokio::test(start_paused = true)]
async fn p27_retained_control_after_engine_drop() {
    let e = LiveEngine::start(transfer_config(), LiveOptions::default()).unwrap();
    let (c, mut events) = e.register_handoff(HandoffId(Uuid::from_u128(4))).unwrap();
    drop(e);
    assert!(timeout(Duration::from_secs(1), events.recv()).await.unwrap().is_none());
    let err = c.cancel_destination().await.unwrap_err();
    assert!(err.to_string().contains("engine no longer exists"), "{err}");
}

// Cancelling a source while it is held frees it; cancel_source is then a Noop.
#[tokio::test(start_paused = true)]
async fn cancel_source_frees_a_held_source() {
    let e = LiveEngine::start(transfer_config(), LiveOptions::default()).unwrap();
    let (src, mut events) = e.register_handoff(HandoffId(Uuid::from_u128(5))).unwrap();
    let (reg, mut s) = e.prepare_request(planned(0, 16, &[3])).unwrap();
    src.submit_prefill(reg).await.unwrap();
    assert!(s.recv().await.unwrap().completed);
    assert!(matches!(events.recv().await, Some(HandoffEvent::SourceHeld { .. })));
    assert_eq!(e.metrics().borrow().active_blocks, 4);
    assert!(src.cancel_source().await.unwrap());
    assert_eq!(e.metrics().borrow().active_blocks, 0);
    assert!(!src.cancel_source().await.unwrap());
    e.shutdown().await.unwrap();
}
