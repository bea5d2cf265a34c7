//! Publisher settings, their checks, and endpoint resolution (wildcards, DP-rank offsets).

use crate::PublishError;

/// Everything needed to start a [`crate::KvEventPublisher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherOptions {
    /// Base PUB endpoint, `tcp://HOST:PORT`; the publisher binds it at `PORT + dp_rank` (as
    /// vLLM offsets per DP rank; port 0 asks for any free port). `*` means all interfaces.
    pub endpoint: String,
    /// Base ROUTER endpoint for replay requests (offset like `endpoint`); `None` disables
    /// replay and its buffer.
    pub replay_endpoint: Option<String>,
    /// Data-parallel rank stamped on every batch.
    pub dp_rank: u32,
    /// The engine's block size, carried by every `BlockStored`; subscribers ignore events
    /// whose block size differs from theirs.
    pub block_size: usize,
    /// First frame of every PUB message (vLLM's default is empty).
    pub topic: String,
    /// Batches waiting for the background thread; when full, new batches are dropped.
    pub queue_capacity: usize,
    /// Published batches kept for replay (vLLM's `buffer_steps`).
    pub replay_buffer_steps: usize,
}

impl Default for PublisherOptions {
    /// vLLM's defaults: `tcp://*:5557`, no replay, rank 0, block size 16, empty topic, queue
    /// and replay sizes of its `max_queue_size` and `buffer_steps`.
    fn default() -> Self {
        Self {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            dp_rank: 0,
            block_size: 16,
            topic: String::new(),
            queue_capacity: 100_000,
            replay_buffer_steps: 10_000,
        }
    }
}

/// Checked options with the endpoints the sockets bind.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub block_size: u32,
}

impl PublisherOptions {
    pub(crate) fn resolve(&self) -> Result<Resolved, PublishError> {
        let invalid =
            |field: &str, message: String| PublishError::InvalidOption { field: field.into(), message };
        let block_size = u32::try_from(self.block_size).ok().filter(|&b| b > 0).ok_or_else(|| {
            invalid("block_size", format!("{} is out of range; expected 1..=2^32-1", self.block_size))
        })?;
        if self.queue_capacity == 0 {
            return Err(invalid("queue_capacity", "0 is out of range; expected at least 1".into()));
        }
        if self.replay_endpoint.is_some() && self.replay_buffer_steps == 0 {
            return Err(invalid(
                "replay_buffer_steps",
                "0 is out of range when replay_endpoint is set; expected at least 1".into(),
            ));
        }
        let endpoint = offset_endpoint(&self.endpoint, self.dp_rank).map_err(|m| invalid("endpoint", m))?;
        let replay_endpoint = match &self.replay_endpoint {
            Some(e) => Some(offset_endpoint(e, self.dp_rank).map_err(|m| invalid("replay_endpoint", m))?),
            None => None,
        };
        Ok(Resolved { endpoint, replay_endpoint, block_size })
    }
}

/// The endpoint a DP rank binds: `tcp://HOST:PORT` becomes `tcp://HOST:(PORT + dp_rank)`
/// (port 0 stays 0: any free port), with `*` rewritten to `0.0.0.0`. Errors say what is wrong.
pub fn offset_endpoint(endpoint: &str, dp_rank: u32) -> Result<String, String> {
    let rest = endpoint
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("{endpoint:?} is not supported; expected tcp://HOST:PORT"))?;
    let (host, port) =
        rest.rsplit_once(':').ok_or_else(|| format!("{endpoint:?} has no port; expected tcp://HOST:PORT"))?;
    if host.is_empty() {
        return Err(format!("{endpoint:?} has no host; expected tcp://HOST:PORT (HOST may be *)"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{endpoint:?} has port {port:?}; expected an integer in 0..=65535"))?;
    let host = if host == "*" { "0.0.0.0" } else { host };
    let port = if port == 0 {
        0
    } else {
        u16::try_from(u32::from(port) + dp_rank)
            .map_err(|_| format!("{endpoint:?} plus dp_rank {dp_rank} exceeds port 65535"))?
    };
    Ok(format!("tcp://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_offset_by_rank_and_wildcards_rewritten() {
        assert_eq!(offset_endpoint("tcp://*:5557", 0).unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(offset_endpoint("tcp://127.0.0.1:5557", 3).unwrap(), "tcp://127.0.0.1:5560");
        assert_eq!(offset_endpoint("tcp://127.0.0.1:0", 3).unwrap(), "tcp://127.0.0.1:0");
        assert_eq!(offset_endpoint("tcp://[::1]:10", 1).unwrap(), "tcp://[::1]:11");
    }

    #[test]
    fn bad_endpoints_are_rejected_with_the_reason() {
        assert!(offset_endpoint("ipc:///tmp/x", 0).unwrap_err().contains("expected tcp://HOST:PORT"));
        assert!(offset_endpoint("tcp://localhost", 0).unwrap_err().contains("no port"));
        assert!(offset_endpoint("tcp://:5", 0).unwrap_err().contains("no host"));
        assert!(offset_endpoint("tcp://h:70000", 0).unwrap_err().contains("0..=65535"));
        assert!(offset_endpoint("tcp://h:65535", 1).unwrap_err().contains("exceeds port 65535"));
    }

    #[test]
    fn option_errors_name_the_field() {
        let field = |o: PublisherOptions| match o.resolve() {
            Err(PublishError::InvalidOption { field, .. }) => field,
            other => panic!("expected an option error, got {other:?}"),
        };
        let base = PublisherOptions { endpoint: "tcp://127.0.0.1:0".into(), ..Default::default() };
        assert_eq!(field(PublisherOptions { block_size: 0, ..base.clone() }), "block_size");
        assert_eq!(field(PublisherOptions { queue_capacity: 0, ..base.clone() }), "queue_capacity");
        assert_eq!(field(PublisherOptions { endpoint: "udp://x:1".into(), ..base.clone() }), "endpoint");
        let replay = PublisherOptions { replay_endpoint: Some("tcp://127.0.0.1:0".into()), ..base.clone() };
        assert_eq!(
            field(PublisherOptions { replay_buffer_steps: 0, ..replay.clone() }),
            "replay_buffer_steps"
        );
        assert_eq!(
            field(PublisherOptions { replay_endpoint: Some("x".into()), ..base.clone() }),
            "replay_endpoint"
        );
        assert!(replay.resolve().is_ok());
    }
}
