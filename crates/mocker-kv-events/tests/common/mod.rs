//! Shared helpers of the integration tests.
#![allow(dead_code)]

pub mod client;
pub mod mirror;
pub mod scenario;

use std::time::Duration;

use mocker_kv_events::KvEventPublisher;

/// Waits (bounded) until the background thread has sent `n` batches.
pub async fn wait_published(publisher: &KvEventPublisher, n: u64) {
    for _ in 0..2000 {
        if publisher.published_batches() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("publisher sent {} of {n} batches", publisher.published_batches());
}
