//! Publishes mocker's KV-cache events over ZMQ in vLLM's wire format, so KV-aware routers
//! (Dynamo's KV router and standalone indexer, llm-d's KV cache manager) work against mocker
//! unchanged.
//!
//! * PUB socket, multipart `[topic, seq u64 big-endian from 0, payload]`, one message per
//!   forward pass; the payload is a msgpack `KVEventBatch` (see [`wire`]).
//! * Optional ROUTER socket for gap recovery: a request `[start_seq u64 BE]` (from a DEALER
//!   or REQ, so the ROUTER sees `[identity, empty, start_seq]`) is answered with every
//!   buffered batch from `start_seq` on as `[seq, payload]`, then the end marker
//!   `[-1 as i64 BE, empty]`.
//! * [`KvEventPublisher::publish`] never blocks: a bounded queue feeds a background thread
//!   that owns the PUB socket; a full queue drops the batch and counts it. Replay runs on a
//!   thread of its own, so serving a replay never delays live publication.
//!
//! ZMQ implementation: libzmq 4.3 through the [`zmq`](https://crates.io/crates/zmq)
//! bindings, whose build script compiles libzmq from source with the `cc` crate (no system
//! package, no cmake; about 45 s of a clean build on 2 cores). These ports face whatever
//! can reach them, and libzmq is the implementation vLLM and pyzmq run on such networks; the
//! pure-Rust `zeromq` 0.7 crate used before could be killed by one 73-byte frame header (it
//! allocated the declared 2^62 bytes) and deadlocked when a replay peer left mid-reply.
//! What a peer can make the publisher do is bounded:
//!
//! * inbound messages are capped (`ZMQ_MAXMSGSIZE`: 64 KiB on PUB, where peers only send
//!   subscriptions, 4 KiB on the replay socket); a peer announcing more is disconnected
//!   before anything is allocated, and one that does not finish its handshake in 10 s too;
//! * PUB sends never block: each subscriber has a queue of 100 000 messages (vLLM's
//!   high-water mark) and a subscriber whose queue is full misses batches (replay covers
//!   them); queued messages share one copy of each payload;
//! * replay serves every client on its own: a client whose queue in libzmq (128 messages)
//!   is full is skipped until it reads, with at most 8 requests queued per client and 64
//!   clients served at once (further requests are ignored), and a client that takes
//!   nothing for 10 s loses its pending replays (see `replay.rs`).
//!
//! * on TCP, the port is a guard's ([`guard`]), relaying each peer to libzmq on loopback:
//!   an inbound message of more than 4 frames or of more bytes than the caps above (an
//!   endless run of MORE frames, which libzmq would buffer whole) disconnects its peer, at
//!   most 256 peers are connected at once, and a peer more than 32 MiB behind on what
//!   libzmq sends it is disconnected as a slow reader.
//!
//! There is no authentication: keep these ports on trusted networks.

#![warn(missing_docs)]

mod guard;
mod options;
mod publisher;
mod replay;
pub mod wire;
mod worker;

pub use options::{offset_endpoint, PublisherOptions};
pub use publisher::{KvEventPublisher, PublishError, PublisherStats};
pub use replay::REPLAY_END_SEQ;
