//! What the in-process server tests share.

use std::net::SocketAddr;

use mocker_core::config::LaunchConfig;
use mocker_server::{BoundServer, ServerOptions};

/// A server on a free loopback port with `engine_args`, serving until the test ends.
pub async fn server(engine_args: &str) -> SocketAddr {
    let launch = LaunchConfig::from_json_str(engine_args).unwrap();
    let server = BoundServer::bind(ServerOptions::new("127.0.0.1:0".parse().unwrap(), launch), Vec::new())
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve(std::future::pending()));
    addr
}
