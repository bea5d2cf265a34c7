//! A Rust subscriber of the publisher: SUB for live batches, DEALER for replay.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::timeout;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const WAIT: Duration = Duration::from_secs(20);

pub struct Subscriber {
    sub: SubSocket,
    topic: String,
}

/// One live PUB message.
pub struct Live {
    pub topic: Bytes,
    pub seq: u64,
    pub payload: Bytes,
}

impl Subscriber {
    pub async fn connect(endpoint: &str, topic: &str) -> Self {
        let mut sub = SubSocket::new();
        sub.connect(endpoint).await.expect("SUB connect");
        sub.subscribe(topic).await.expect("SUB subscribe");
        Self { sub, topic: topic.to_string() }
    }

    pub async fn recv(&mut self) -> Live {
        let m =
            timeout(WAIT, self.sub.recv()).await.expect("timed out waiting for a batch").expect("SUB recv");
        let frames = m.into_vec();
        assert_eq!(frames.len(), 3, "PUB messages are [topic, seq, payload]");
        assert_eq!(frames[0], self.topic.as_bytes(), "topic frame");
        let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8-byte big-endian sequence"));
        Live { topic: frames[0].clone(), seq, payload: frames[2].clone() }
    }
}

/// What a replay request returned: `(seq, payload)` pairs, then whether the end marker
/// (`-1` as big-endian i64 with an empty payload) closed it.
pub struct Replay {
    pub entries: Vec<(u64, Bytes)>,
    pub end_marker: bool,
}

pub async fn replay(endpoint: &str, start: u64) -> Replay {
    replay_after(endpoint, Vec::new(), start).await
}

/// Sends the raw `preamble` messages, then a replay request from `start`, on one DEALER;
/// replies come in request order, so what arrives first answers the first request served.
pub async fn replay_after(endpoint: &str, preamble: Vec<Vec<Bytes>>, start: u64) -> Replay {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await.expect("DEALER connect");
    for frames in preamble {
        dealer.send(ZmqMessage::try_from(frames).unwrap()).await.expect("raw request");
    }
    let request =
        ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())]).unwrap();
    dealer.send(request).await.expect("replay request");
    let mut entries = Vec::new();
    loop {
        let m =
            timeout(WAIT, dealer.recv()).await.expect("timed out waiting for replay").expect("DEALER recv");
        let frames = m.into_vec();
        assert_eq!(frames.len(), 3, "replay replies are [empty, seq, payload]");
        assert!(frames[0].is_empty(), "empty delimiter first");
        let seq = i64::from_be_bytes(frames[1][..].try_into().expect("8-byte sequence"));
        if seq == -1 {
            return Replay { entries, end_marker: frames[2].is_empty() };
        }
        entries.push((seq as u64, frames[2].clone()));
    }
}

/// Collects batches `0..n`: live ones as they come, and whatever the subscriber missed
/// before its subscription took effect (or in any gap) through replay. Returns the payloads
/// in sequence order and the sequence numbers received live.
pub async fn collect(sub: &mut Subscriber, replay_endpoint: &str, n: u64) -> (Vec<Bytes>, Vec<u64>) {
    let mut payloads: Vec<Option<Bytes>> = vec![None; n as usize];
    let (mut live_seqs, mut expected) = (Vec::new(), 0);
    while payloads.iter().any(Option::is_none) {
        let live = sub.recv().await;
        live_seqs.push(live.seq);
        if live.seq > expected {
            for (s, p) in replay(replay_endpoint, expected).await.entries {
                if s < live.seq {
                    payloads[s as usize].get_or_insert(p);
                }
            }
        }
        payloads[live.seq as usize] = Some(live.payload);
        expected = expected.max(live.seq + 1);
    }
    (payloads.into_iter().map(Option::unwrap).collect(), live_seqs)
}
