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
//!   that owns the sockets; a full queue drops the batch and counts it.
//!
//! ZMQ crate: [`zeromq`](https://crates.io/crates/zeromq) (zmq.rs), a native Rust ZMTP 3
//! implementation on tokio. It builds with cargo alone (no libzmq, no C++ toolchain, no
//! Debian `-dev` package), interoperates with libzmq peers (pyzmq, vLLM), is the crate
//! Dynamo's KV router itself uses to read vLLM's events, and its PUB drops messages for a
//! slow subscriber (per-subscriber queue of 100 000, vLLM's high-water mark) instead of
//! blocking the sender. The `zmq` bindings would need a system libzmq or a vendored C++ build.

#![warn(missing_docs)]

mod options;
mod publisher;
pub mod wire;
mod worker;

pub use options::{offset_endpoint, PublisherOptions};
pub use publisher::{KvEventPublisher, PublishError, PublisherStats};
pub use worker::REPLAY_END_SEQ;
