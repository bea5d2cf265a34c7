//! Hostile peers on the PUB and replay ports (issue 25): whatever a peer that can reach them
//! sends, the publisher keeps publishing to real subscribers, keeps answering replay, and
//! shuts down promptly. The attackers are raw TCP streams speaking hand-written ZMTP
//! (`hostile/zmtp.rs`), so they send exactly the bytes of the attack and never read unless
//! told to; the victims are ordinary SUB and DEALER clients.

mod common;
#[path = "hostile/zmtp.rs"]
mod zmtp;

use std::net::SocketAddr;
use std::time::Duration;

use common::client::replay;
use common::wait_published;
use mocker_core::events::{KvEvent, KvEventData};
use mocker_kv_events::{KvEventPublisher, PublisherOptions, PublisherStats};
use tokio::time::timeout;
use zeromq::{Socket, SocketRecv, SubSocket};
use zmtp::RawPeer;

const TOPIC: &str = "kv-events";

fn options(replay_buffer_steps: usize) -> PublisherOptions {
    PublisherOptions {
        endpoint: "tcp://127.0.0.1:0".into(),
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        dp_rank: 0,
        block_size: 16,
        topic: TOPIC.into(),
        queue_capacity: 4096,
        replay_buffer_steps,
    }
}

fn addr(endpoint: &str) -> SocketAddr {
    endpoint.strip_prefix("tcp://").expect("tcp endpoint").parse().expect("IP:PORT")
}

/// One pass removing `hashes` blocks: about 9 bytes of payload per hash.
fn batch(id: u64, hashes: usize) -> Vec<KvEvent> {
    let block_hashes = (0..hashes as u64).map(|h| (h + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id).collect();
    vec![KvEvent { event_id: id, dp_rank: 0, data: KvEventData::Removed { block_hashes } }]
}

/// Publishes `count` batches of `hashes` blocks and waits until all are sent (in chunks
/// that fit the queue, so none is dropped).
async fn publish_batches(publisher: &KvEventPublisher, count: u64, hashes: usize) {
    let start = publisher.published_batches();
    for chunk in (0..count).collect::<Vec<_>>().chunks(1000) {
        for i in chunk {
            publisher.publish(&batch(start + i, hashes));
        }
        wait_published(publisher, start + chunk[chunk.len() - 1] + 1).await;
    }
    assert_eq!(publisher.dropped_batches(), 0);
}

/// A SUB that connects now receives a live batch: one small batch is published every
/// 100 ms until one arrives (the first ones may go out before the subscription lands).
async fn a_fresh_subscriber_gets_live_batches(publisher: &KvEventPublisher) {
    let mut sub = SubSocket::new();
    timeout(Duration::from_secs(10), sub.connect(publisher.endpoint()))
        .await
        .expect("SUB connect timed out")
        .expect("SUB connect");
    sub.subscribe(TOPIC).await.expect("SUB subscribe");
    let before = publisher.published_batches();
    for attempt in 0..200u64 {
        publisher.publish(&batch(attempt, 4));
        if let Ok(Ok(m)) = timeout(Duration::from_millis(100), sub.recv()).await {
            let frames = m.into_vec();
            assert_eq!(frames.len(), 3, "PUB messages are [topic, seq, payload]");
            assert_eq!(frames[0], TOPIC.as_bytes());
            let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8-byte sequence"));
            assert!(seq >= before, "live batch {seq} predates the subscriber ({before} sent before)");
            return;
        }
    }
    panic!("a fresh subscriber received no batch in 200 tries (20 s)");
}

/// A fresh DEALER gets the last two batches and the end marker.
async fn replay_still_answers(publisher: &KvEventPublisher) {
    publish_batches(publisher, 2, 4).await;
    let n = publisher.published_batches();
    let r = replay(publisher.replay_endpoint().expect("replay on"), n - 2).await;
    assert_eq!(r.entries.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![n - 2, n - 1]);
    assert!(r.end_marker, "the replay ends with the end marker");
}

/// Owns the publisher under test; if the test fails it leaks it instead of joining its
/// thread, so a publisher stuck by an attack makes the test fail rather than hang.
struct Leaky(Option<KvEventPublisher>);

impl Leaky {
    fn start(options: PublisherOptions) -> Self {
        Self(Some(KvEventPublisher::start(options).expect("start")))
    }

    fn take(mut self) -> KvEventPublisher {
        self.0.take().expect("publisher")
    }
}

impl std::ops::Deref for Leaky {
    type Target = KvEventPublisher;
    fn deref(&self) -> &KvEventPublisher {
        self.0.as_ref().expect("publisher")
    }
}

impl Drop for Leaky {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::mem::forget(self.0.take());
        }
    }
}

/// Shuts the publisher down on another thread and fails if that takes longer than `limit`.
fn shutdown_within(publisher: KvEventPublisher, limit: Duration) -> PublisherStats {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(publisher.shutdown());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("the publisher did not shut down within {limit:?}"))
}

/// Bytes that are not ZMTP at all (a fixed pseudo-random stream).
fn garbage(len: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn a_giant_frame_header_on_either_port_does_not_take_the_publisher_down() {
    let publisher = Leaky::start(options(100));
    publish_batches(&publisher, 3, 4).await;
    let ports = [addr(publisher.endpoint()), addr(publisher.replay_endpoint().unwrap())];
    // Issue 25's 73 bytes: a valid greeting, then a command frame declaring 2^62 bytes.
    let mut attackers: Vec<RawPeer> = ports.iter().map(|a| RawPeer::connect(*a)).collect();
    for attacker in &mut attackers {
        attacker.write(&zmtp::giant_frame_attack());
    }
    // The same after a completed handshake, as a SUB and as a DEALER.
    for (a, kind) in ports.iter().zip(["SUB", "DEALER"]) {
        let mut peer = RawPeer::handshake(*a, kind);
        peer.write(&[0x02, 0x40, 0, 0, 0, 0, 0, 0, 0]);
        attackers.push(peer);
    }
    // Give the server time to read them all (it used to abort right here).
    tokio::time::sleep(Duration::from_millis(300)).await;

    a_fresh_subscriber_gets_live_batches(&publisher).await;
    replay_still_answers(&publisher).await;
    shutdown_within(publisher.take(), Duration::from_secs(10));
    drop(attackers);
}

#[tokio::test]
async fn replay_socket_abuse_leaves_events_replay_and_shutdown_working() {
    let publisher = Leaky::start(options(1000));
    // 1000 batches of about 900 bytes: 200 full replays are 200,000 messages (0.2 GB).
    publish_batches(&publisher, 1000, 100).await;
    let replay_addr = addr(publisher.replay_endpoint().unwrap());
    let pub_addr = addr(publisher.endpoint());

    // Malformed DEALER messages: no delimiter, short and long sequences, a non-empty
    // delimiter, extra frames; then an unknown command.
    let mut malformed = RawPeer::handshake(replay_addr, "DEALER");
    malformed.send(&[&[0; 8]]);
    malformed.send(&[b"", &[0, 0, 1]]);
    malformed.send(&[b"", &[0; 9]]);
    malformed.send(&[b"x", &[0; 8]]);
    malformed.send(&[b"", &[0; 8], b"extra"]);
    malformed.send(&[b"", b"", b"", b"", b"", b"", b"", b""]);
    malformed.write(&zmtp::frame(b"\x05HELLO", false, true));

    // Two DEALERs that ask for everything 200 times and never read; the second then sends
    // garbage on the same connection, so the server drops it in the middle of its replies.
    let mut hog = RawPeer::handshake(replay_addr, "DEALER");
    let mut hog2 = RawPeer::handshake(replay_addr, "DEALER");
    for _ in 0..200 {
        assert!(hog.send_replay_request(0), "the replay socket stopped reading requests");
        assert!(hog2.send_replay_request(0), "the replay socket stopped reading requests");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    hog2.write(&garbage(4096));
    drop(hog2);
    // Peers that come and go while replies are pending.
    for _ in 0..20 {
        let mut churn = RawPeer::handshake(replay_addr, "DEALER");
        churn.send_replay_request(0);
    }

    // Raw garbage on both ports, before and after a greeting, then hang up.
    for a in [replay_addr, pub_addr] {
        let mut g = RawPeer::connect(a);
        g.write(&garbage(4096));
        let mut g2 = RawPeer::connect(a);
        g2.write(&zmtp::greeting()[..30]);
        let mut g3 = RawPeer::connect(a);
        g3.write(&zmtp::greeting());
        g3.write(&garbage(4096));
    }
    drop(malformed);
    tokio::time::sleep(Duration::from_millis(200)).await;

    a_fresh_subscriber_gets_live_batches(&publisher).await;
    replay_still_answers(&publisher).await;
    let stats = shutdown_within(publisher.take(), Duration::from_secs(10));
    assert_eq!(stats.dropped_batches, 0);
    drop(hog);
}

#[tokio::test]
async fn a_client_that_never_reads_its_replay_delays_no_one_else() {
    let publisher = Leaky::start(options(5000));
    let n = 5000;
    publish_batches(&publisher, n, 100).await;
    let replay_ep = publisher.replay_endpoint().unwrap().to_string();

    // 30 full replays of 5000 batches of about 900 bytes: 150,000 messages (135 MB), far
    // more than the socket buffers and queues between the publisher and a client.
    let mut slow = RawPeer::handshake(addr(&replay_ep), "DEALER");
    for _ in 0..30 {
        assert!(slow.send_replay_request(0));
    }
    // Let the publisher fill everything between it and the slow client.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Another client's replay is answered meanwhile.
    let r = replay(&replay_ep, n - 3).await;
    assert_eq!(r.entries.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![n - 3, n - 2, n - 1]);
    assert!(r.end_marker);

    // Once the slow client reads (within the 10 s a stalled client is kept), it gets its
    // whole first replay, in order, nothing dropped.
    let seqs = slow.recv_replay();
    assert_eq!(seqs, (0..n).collect::<Vec<_>>(), "the slow client's replay is complete");
    a_fresh_subscriber_gets_live_batches(&publisher).await;
    shutdown_within(publisher.take(), Duration::from_secs(10));
}

/// Issue 45 item 7: a peer that sends endless empty frames with MORE set (a message that
/// never completes, which libzmq would buffer whole) is disconnected after a few frames on
/// either port, and both ports keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_multipart_frames_disconnect_their_peer_on_either_port() {
    let publisher = Leaky::start(options(64));
    publish_batches(&publisher, 10, 4).await;
    for (endpoint, kind) in [
        (publisher.endpoint().to_string(), "SUB"),
        (publisher.replay_endpoint().unwrap().to_string(), "DEALER"),
    ] {
        let mut peer = RawPeer::handshake(addr(&endpoint), kind);
        let empty_more = zmtp::frame(b"", true, false);
        // A million frames would be 64 MB in libzmq; the guard cuts the peer off long before.
        let sent = (0..1_000_000).take_while(|_| peer.write(&empty_more)).count();
        assert!(sent < 1_000_000, "{kind} port still reading after {sent} frames");
    }
    let r = replay(publisher.replay_endpoint().unwrap(), 7).await;
    assert_eq!(r.entries.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![7, 8, 9]);
    a_fresh_subscriber_gets_live_batches(&publisher).await;
    shutdown_within(publisher.take(), Duration::from_secs(10));
}

/// A subscriber that never reads is disconnected once 32 MiB wait for it, instead of being
/// queued up to the 100,000-message high-water mark whatever the messages weigh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_never_reads_is_cut_off_past_its_byte_budget() {
    let publisher = Leaky::start(options(16));
    let mut sleeper = RawPeer::handshake(addr(publisher.endpoint()), "SUB");
    // Subscribe to everything (ZMTP 3.0 subscription message: 0x01 + prefix).
    assert!(sleeper.send(&[&[1u8]]));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // 12,000 batches of ~3.6 KB: about 43 MB, more than the 32 MiB budget.
    publish_batches(&publisher, 12_000, 400).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Reading now drains what was queued before the cut, then ends: the guard closed it.
    sleeper.stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match std::io::Read::read(&mut sleeper.stream, &mut buf) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => panic!("the slow subscriber was not disconnected ({total} bytes read): {e}"),
        }
    }
    assert!(total < 40 << 20, "{total} bytes were queued for it");
    a_fresh_subscriber_gets_live_batches(&publisher).await;
    shutdown_within(publisher.take(), Duration::from_secs(10));
}
