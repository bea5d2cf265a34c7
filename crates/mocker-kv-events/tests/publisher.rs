//! The publisher over real loopback sockets, fed by a real engine.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::client::{collect, replay, Subscriber};
use common::mirror::{decode_payload, DecodedBatch};
use common::scenario::{check_batches, run_scenario, BLOCK_SIZE};
use common::wait_published;
use mocker_kv_events::{KvEventPublisher, PublishError, PublisherOptions};

fn options(dp_rank: u32, replay_buffer_steps: usize) -> PublisherOptions {
    PublisherOptions {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        dp_rank,
        block_size: BLOCK_SIZE,
        topic: "kv-events".into(),
        queue_capacity: 1024,
        replay_buffer_steps,
    }
}

fn decode_all(payloads: &[Bytes]) -> Vec<DecodedBatch> {
    payloads.iter().map(|p| decode_payload(p)).collect()
}

#[tokio::test]
async fn engine_events_arrive_gap_free_and_match_recomputed_hashes() {
    let scenario = run_scenario(3);
    let publisher = KvEventPublisher::start(options(3, 10_000)).expect("start");
    let replay_ep = publisher.replay_endpoint().expect("replay on").to_string();
    let mut sub = Subscriber::connect(publisher.endpoint(), "kv-events").await;
    // Let the subscription reach the PUB side; batches missed anyway are recovered below.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for batch in &scenario.batches {
        publisher.publish(batch);
        publisher.publish(&[]); // a pass without events publishes nothing
    }
    let n = scenario.batches.len() as u64;
    let (payloads, live_seqs) = collect(&mut sub, &replay_ep, n).await;
    let first = live_seqs[0];
    assert_eq!(live_seqs, (first..n).collect::<Vec<_>>(), "live sequence numbers are gap-free");
    check_batches(&scenario, &decode_all(&payloads), 3);
    let stats = publisher.shutdown();
    assert_eq!((stats.published_batches, stats.dropped_batches), (n, 0));
}

#[tokio::test]
async fn a_late_subscriber_recovers_the_missed_head_through_replay() {
    let scenario = run_scenario(0);
    let n = scenario.batches.len() as u64;
    let half = n / 2;
    let publisher = KvEventPublisher::start(options(0, 10_000)).expect("start");
    for batch in &scenario.batches[..half as usize] {
        publisher.publish(batch);
    }
    wait_published(&publisher, half).await;
    // Joins after the first half went out: PUB never delivers those to it.
    let mut sub = Subscriber::connect(publisher.endpoint(), "kv-events").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    for batch in &scenario.batches[half as usize..] {
        publisher.publish(batch);
    }
    let (payloads, live_seqs) = collect(&mut sub, publisher.replay_endpoint().unwrap(), n).await;
    assert!(live_seqs[0] >= half, "batch {} was sent before the subscriber joined", live_seqs[0]);
    assert_eq!(live_seqs, (live_seqs[0]..n).collect::<Vec<_>>());
    check_batches(&scenario, &decode_all(&payloads), 0);
}

#[tokio::test]
async fn replay_serves_the_buffered_range_then_the_end_marker() {
    let scenario = run_scenario(0);
    let n = scenario.batches.len() as u64;
    assert!(n >= 6, "scenario too small for this test: {n} batches");
    let keep = 4;
    let publisher = KvEventPublisher::start(options(0, keep as usize)).expect("start");
    for batch in &scenario.batches {
        publisher.publish(batch);
    }
    wait_published(&publisher, n).await;
    let ep = publisher.replay_endpoint().unwrap().to_string();

    // Only the last `keep` batches are buffered; they come back in order, then the marker.
    let all = replay(&ep, 0).await;
    assert!(all.end_marker);
    let seqs: Vec<u64> = all.entries.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (n - keep..n).collect::<Vec<_>>());
    let tail = replay(&ep, n - 2).await;
    assert_eq!(tail.entries.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![n - 2, n - 1]);
    assert_eq!(tail.entries[..], all.entries[keep as usize - 2..], "same bytes on every replay");
    for (seq, payload) in &all.entries {
        let decoded = decode_payload(payload);
        let core = &scenario.batches[*seq as usize];
        assert_eq!(
            decoded.events,
            core.iter().map(common::mirror::DecodedEvent::from_core).collect::<Vec<_>>()
        );
    }
    // Beyond the newest batch: nothing but the end marker.
    let none = replay(&ep, n + 5).await;
    assert!(none.entries.is_empty() && none.end_marker);
}

#[tokio::test]
async fn malformed_replay_requests_are_ignored() {
    let publisher = KvEventPublisher::start(options(0, 100)).expect("start");
    let scenario = run_scenario(0);
    for batch in &scenario.batches[..3] {
        publisher.publish(batch);
    }
    wait_published(&publisher, 3).await;
    let ep = publisher.replay_endpoint().unwrap().to_string();
    // No delimiter (two frames at the ROUTER), then a 3-byte sequence: both ignored, so
    // the first reply answers the well-formed request sent after them.
    let preamble =
        vec![vec![Bytes::from_static(&[0; 8])], vec![Bytes::new(), Bytes::from_static(&[0, 0, 1])]];
    let r = common::client::replay_after(&ep, preamble, 1).await;
    assert_eq!(r.entries.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 2]);
    assert!(r.end_marker);
}

#[test]
fn a_full_queue_drops_and_counts_every_batch() {
    let scenario = run_scenario(0);
    let options = PublisherOptions { queue_capacity: 1, replay_endpoint: None, ..options(0, 1) };
    let publisher = KvEventPublisher::start(options).expect("start");
    let calls = 2000u64;
    for i in 0..calls {
        publisher.publish(&scenario.batches[i as usize % scenario.batches.len()]);
    }
    let stats = publisher.shutdown();
    assert!(stats.published_batches >= 1);
    assert_eq!(stats.published_batches + stats.dropped_batches, calls, "every batch sent or counted");
}

#[test]
fn bind_failures_name_the_endpoint() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("tcp://{}", taken.local_addr().unwrap());
    let err = KvEventPublisher::start(PublisherOptions { endpoint: endpoint.clone(), ..options(0, 1) })
        .unwrap_err();
    match err {
        PublishError::Bind { endpoint: e, .. } => assert_eq!(e, endpoint),
        other => panic!("expected a bind error, got {other:?}"),
    }
    let replay_err = KvEventPublisher::start(PublisherOptions {
        replay_endpoint: Some(endpoint.clone()),
        ..options(0, 1)
    })
    .unwrap_err();
    assert!(matches!(replay_err, PublishError::Bind { endpoint: e, .. } if e == endpoint));
    let bad = KvEventPublisher::start(PublisherOptions { block_size: 0, ..options(0, 1) }).unwrap_err();
    assert!(matches!(bad, PublishError::InvalidOption { ref field, .. } if field == "block_size"), "{bad}");
}

#[test]
fn dropping_the_publisher_releases_its_ports() {
    let publisher = KvEventPublisher::start(options(0, 1)).expect("start");
    let (pub_ep, replay_ep) =
        (publisher.endpoint().to_string(), publisher.replay_endpoint().unwrap().to_string());
    drop(publisher);
    let again = KvEventPublisher::start(PublisherOptions {
        endpoint: pub_ep.clone(),
        replay_endpoint: Some(replay_ep.clone()),
        ..options(0, 1)
    })
    .expect("ports are free again after drop");
    assert_eq!((again.endpoint(), again.replay_endpoint()), (pub_ep.as_str(), Some(replay_ep.as_str())));
}
