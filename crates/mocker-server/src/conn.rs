//! Accepting and running connections: the connection limit (503 JSON beyond it), hyper's
//! HTTP/1 header timeout (which also closes idle keep-alive connections), hyper's automatic
//! errors turned into JSON, and a shutdown that first lets connections finish, then closes
//! them by force. With TLS, each accepted connection's handshake runs first, holding its
//! connection slot and bounded by the header timeout.
//!
//! A connection that opens with the HTTP/2 preface (h2c with prior knowledge, as gRPC
//! clients connect) is served as HTTP/2, anything else as HTTP/1; over TLS the protocol is
//! the one ALPN negotiated. The first bytes must arrive within the header timeout whichever
//! it is. hyper_util's auto builder would pick the protocol the same way, but its sniffing
//! has no timeout (a silent client would hold a connection forever) and it cannot keep the
//! HTTP/1 socket wrapper off HTTP/2 connections.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::raw_errors::{raw_response, JsonErrors};

/// Connections refused with a 503 at once; past this many, extra ones are just closed (an
/// answer costs a task and a socket for up to [`REFUSAL_TIME`]).
const CONCURRENT_REFUSALS: usize = 64;
/// Longest a refused connection is kept to deliver its 503.
const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// What a TLS connection may negotiate by ALPN: the protocols [`serve_connection`] speaks.
pub(crate) const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// The first byte of a TLS handshake record; a connection opening with anything else is not
/// speaking TLS.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Pause after an accept error such as "too many open files", so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Streams one HTTP/2 connection may have open at once (gRPC servers commonly allow 100
/// to a few hundred; each stream is a request holding engine resources).
const H2_MAX_CONCURRENT_STREAMS: u32 = 256;
/// Largest header block an HTTP/2 request may send (as hyper's HTTP/1 limit, about 16 KiB
/// of headers, leaves room for gRPC metadata).
const H2_MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// How often an HTTP/2 connection is pinged, and how long its answer may take: a peer that
/// vanished without closing frees its connection slot after at most twice this.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);
/// The client preface that opens every HTTP/2 connection (RFC 9113, 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How connections are limited.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// The protocol of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// Reads (without consuming) the connection's first bytes until they show whether it opens
/// with the HTTP/2 preface; `None` if the client closed or sent nothing decisive in time.
async fn sniff(stream: &TcpStream, timeout: Duration) -> Option<Protocol> {
    let mut buf = [0u8; H2_PREFACE.len()];
    tokio::time::timeout(timeout, async {
        loop {
            let n = stream.peek(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            if buf[..n] != H2_PREFACE[..n] {
                return Some(Protocol::Http1);
            }
            if n == H2_PREFACE.len() {
                return Some(Protocol::Http2);
            }
            // Part of the preface so far: wait for more (peek returns at once while data is
            // buffered, so give the client a moment).
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .ok()
    .flatten()
}

/// The two protocols' connection settings.
struct Builders {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

/// The open connections: each holds one permit, so "all closed" is "all permits back".
#[derive(Debug, Clone)]
pub(crate) struct Connections {
    permits: Arc<Semaphore>,
    max: u32,
    /// Cancelled when the server stops accepting: connections finish their request, then close.
    pub stop: CancellationToken,
    /// Cancelled when the grace period is over: connections close at once.
    pub force: CancellationToken,
}

impl Connections {
    pub fn new(max_connections: usize) -> Self {
        let max = max_connections.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max: max as u32,
            stop: CancellationToken::new(),
            force: CancellationToken::new(),
        }
    }

    /// Resolves when every connection is closed.
    pub async fn all_closed(&self) {
        let _ = self.permits.acquire_many(self.max).await;
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.max as usize - self.permits.available_permits()
    }
}

/// Accepts until `connections.stop`, then drops the listener. With `tls`, connections are
/// TLS connections.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    connections: Connections,
    tls: Option<TlsAcceptor>,
) {
    let mut http1 = http1::Builder::new();
    http1.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST_BYTES)
        .keep_alive_interval(H2_KEEPALIVE)
        .keep_alive_timeout(H2_KEEPALIVE);
    let builder = Arc::new(Builders { http1, http2 });
    let refusals = Arc::new(Semaphore::new(CONCURRENT_REFUSALS));
    let busy: Arc<[u8]> = raw_response(&ApiError::unavailable(format!(
        "too many connections: the server's limit of {} open connections (--max-connections) is reached; retry later",
        limits.max_connections
    )))
    .into();
    let plain: Arc<[u8]> = raw_response(&ApiError::bad_request(
        "this server speaks HTTPS (TLS, --ssl-certfile): connect with https://",
    ))
    .into();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = connections.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors, or a connection reset before it was accepted.
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Each token is a small frame that must leave at once: Nagle's algorithm would hold
        // it back waiting for the client's delayed ACK.
        let _ = stream.set_nodelay(true);
        match connections.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let (app, builder, c) = (app.clone(), builder.clone(), connections.clone());
                let timeout = limits.header_timeout;
                match &tls {
                    None => {
                        tokio::spawn(async move {
                            let protocol = tokio::select! {
                                biased;
                                _ = c.stop.cancelled() => return,
                                p = sniff(&stream, timeout) => p,
                            };
                            if let Some(protocol) = protocol {
                                serve_connection(stream, protocol, app, builder, c, permit).await;
                            }
                        });
                    }
                    Some(acceptor) => {
                        let (acceptor, plain) = (acceptor.clone(), plain.clone());
                        tokio::spawn(async move {
                            if let Some(stream) = handshake(stream, &acceptor, timeout, &c, &plain).await {
                                // gRPC clients negotiate h2; anything else is HTTP/1.
                                let protocol = match stream.get_ref().1.alpn_protocol() {
                                    Some(b"h2") => Protocol::Http2,
                                    _ => Protocol::Http1,
                                };
                                serve_connection(stream, protocol, app, builder, c, permit).await;
                            }
                        });
                    }
                }
            }
            Err(_) => {
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, busy.clone(), tls.clone(), permit));
                }
            }
        }
    }
}

/// A TLS connection's handshake, within the header timeout: a client that never completes
/// it holds its slot no longer than one that never sends a request head. A client speaking
/// plain HTTP to the TLS port is answered a JSON 400 saying so.
async fn handshake(
    stream: TcpStream,
    acceptor: &TlsAcceptor,
    timeout: Duration,
    connections: &Connections,
    plain: &[u8],
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let work = async {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await.ok()? == 0 {
            return None;
        }
        if first[0] != TLS_HANDSHAKE_RECORD {
            let _ = tokio::time::timeout(REFUSAL_TIME, answer(stream, plain)).await;
            return None;
        }
        acceptor.accept(stream).await.ok()
    };
    tokio::select! {
        biased;
        _ = connections.stop.cancelled() => None,
        done = tokio::time::timeout(timeout, work) => done.ok().flatten(),
    }
}

async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    protocol: Protocol,
    app: Router,
    builder: Arc<Builders>,
    connections: Connections,
    permit: OwnedSemaphorePermit,
) {
    match protocol {
        Protocol::Http1 => serve_http1(stream, app, builder, connections, permit).await,
        Protocol::Http2 => serve_http2(stream, app, builder, connections, permit).await,
    }
}

async fn serve_http1<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    app: Router,
    builder: Arc<Builders>,
    connections: Connections,
    _permit: OwnedSemaphorePermit,
) {
    let io = TokioIo::new(JsonErrors::new(stream));
    // On shutdown: finish the request in progress (an idle connection closes at once).
    drive(builder.http1.serve_connection(io, TowerToHyperService::new(app)), &connections).await;
}

/// An HTTP/2 connection: graceful shutdown sends GOAWAY and lets open streams finish.
async fn serve_http2<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    app: Router,
    builder: Arc<Builders>,
    connections: Connections,
    _permit: OwnedSemaphorePermit,
) {
    let conn = builder.http2.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    drive(conn, &connections).await;
}

/// Runs a connection until it ends; once the server stops, shuts it down gracefully, and
/// drops it when the grace period is over.
async fn drive<C: GracefulConnection>(conn: C, connections: &Connections) {
    tokio::pin!(conn);
    tokio::select! {
        biased;
        _ = connections.force.cancelled() => return,
        _ = connections.stop.cancelled() => {}
        _ = conn.as_mut() => return,
    }
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        biased;
        _ = connections.force.cancelled() => {}
        _ = conn => {}
    }
}

/// Answers 503 without reading the request (after the TLS handshake, with TLS), all within
/// [`REFUSAL_TIME`].
async fn refuse(
    stream: TcpStream,
    reply: Arc<[u8]>,
    tls: Option<TlsAcceptor>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        match tls {
            None => answer(stream, &reply).await,
            Some(acceptor) => answer(acceptor.accept(stream).await?, &reply).await,
        }
    })
    .await;
}

/// Writes `reply`, then reads what the client sent until it closes (so closing does not
/// reset the connection before the answer is read). The caller bounds the time.
async fn answer(mut stream: impl AsyncRead + AsyncWrite + Unpin, reply: &[u8]) -> std::io::Result<()> {
    stream.write_all(reply).await?;
    stream.shutdown().await?;
    let mut scratch = [0u8; 4096];
    while stream.read(&mut scratch).await? > 0 {}
    Ok(())
}
