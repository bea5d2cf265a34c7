//! Errors answered below the router, in the same OpenAI-style JSON as every other error.
//!
//! hyper answers requests it cannot parse (400 bad request line or header, 431 headers too
//! large, 414 URI too long) by itself, with an empty body, and offers no hook to change
//! that. [`JsonErrors`] wraps a connection's socket and replaces exactly those responses as
//! they are written: a head with one of those statuses, `content-length: 0` and no
//! `content-type` (the router never answers an error without a JSON body). After such an
//! answer the connection closes; the rest of what the client sent is read and dropped for
//! a moment first, so the close does not reset the connection before the client read the
//! answer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::ApiError;

/// How long a connection closed after an error keeps draining what the client still sends.
const LINGER: Duration = Duration::from_millis(500);
/// Most bytes drained then.
const LINGER_BYTES: usize = 1 << 20;

/// A complete HTTP/1.1 response carrying `error` as JSON, closing the connection.
pub fn raw_response(error: &ApiError) -> Vec<u8> {
    let body = error.body();
    let status = error.status;
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

/// The JSON answer replacing hyper's automatic response `head`, if it is one.
fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let rest = head.strip_prefix(b"HTTP/1.1 4")?;
    let (status, message) = match rest.get(..3)? {
        b"00 " => (
            StatusCode::BAD_REQUEST,
            "malformed HTTP request: the request line or a header could not be parsed",
        ),
        b"31 " => (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "request header fields too large"),
        b"14 " => (StatusCode::URI_TOO_LONG, "request URI too long"),
        _ => return None,
    };
    // The whole write is one bodiless head.
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    if end + 4 != head.len() {
        return None;
    }
    // Each field with its line end, so a value is matched whole.
    let fields = &head[..end + 2];
    let has = |name: &[u8]| fields.windows(name.len()).any(|w| w.eq_ignore_ascii_case(name));
    if !has(b"\r\ncontent-length: 0\r\n") || has(b"\r\ncontent-type:") {
        return None;
    }
    let error = ApiError { status, message: message.to_string(), param: None };
    Some(raw_response(&error))
}

/// A socket whose hyper-made error responses are rewritten as JSON (see the module docs).
pub struct JsonErrors<S> {
    inner: S,
    /// The replacement still to write, and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
    /// Set once a replacement went out: shutting down then lingers.
    linger: Option<Linger>,
}

struct Linger {
    deadline: Pin<Box<tokio::time::Sleep>>,
    drained: usize,
}

impl<S> JsonErrors<S> {
    /// Wraps a connection's socket.
    pub fn new(inner: S) -> Self {
        Self { inner, pending: None, linger: None }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> JsonErrors<S> {
    fn drain_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.pending {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
            if *written == bytes.len() {
                self.pending = None;
                self.linger = Some(Linger { deadline: Box::pin(tokio::time::sleep(LINGER)), drained: 0 });
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Takes over `head` if it is an automatic error response; `Some(len)` is then what to
    /// report as written.
    fn intercept(&mut self, cx: &mut Context<'_>, head: &[u8]) -> Option<Poll<io::Result<usize>>> {
        let reply = replacement(head)?;
        self.pending = Some((reply, 0));
        Some(match self.drain_pending(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            _ => Poll::Ready(Ok(head.len())),
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain_pending(cx))?;
        // Cheap test first: body chunks never start like a status line.
        if buf.starts_with(b"HTTP/1.1 4") {
            if let Some(done) = this.intercept(cx, buf) {
                return done;
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.drain_pending(cx))?;
        let mut nonempty = bufs.iter().filter(|b| !b.is_empty());
        if let (Some(first), None) = (nonempty.next(), nonempty.next()) {
            if first.starts_with(b"HTTP/1.1 4") {
                if let Some(done) = this.intercept(cx, first) {
                    return done;
                }
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain_pending(cx))?;
        ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
        let this = &mut *self;
        if let Some(linger) = &mut this.linger {
            let mut scratch = [0u8; 4096];
            loop {
                if linger.drained >= LINGER_BYTES || linger.deadline.as_mut().poll(cx).is_ready() {
                    break;
                }
                let mut buf = ReadBuf::new(&mut scratch);
                match Pin::new(&mut this.inner).poll_read(cx, &mut buf) {
                    Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                    Poll::Ready(Ok(())) => linger.drained += buf.filled().len(),
                    Poll::Ready(Err(_)) => break,
                    Poll::Pending => return Poll::Pending,
                }
            }
            this.linger = None;
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bodiless_parse_error_heads_are_replaced() {
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let reply = String::from_utf8(replacement(hyper_431).unwrap()).unwrap();
        assert!(reply.starts_with("HTTP/1.1 431 "), "{reply}");
        let body: serde_json::Value = serde_json::from_str(reply.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["error"]["code"], 431);
        for other in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 10\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nbody",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ] {
            assert!(replacement(other).is_none(), "{}", String::from_utf8_lossy(other));
        }
    }
}
