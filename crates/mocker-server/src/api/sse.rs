//! Re-framing a server-sent-event body: the routes that run a request through the OpenAI
//! path but answer in another protocol's shape (tokens in/out, Anthropic's Messages) map
//! each `data:` frame of the OpenAI stream to frames of their own, as vLLM's own
//! adapters convert the chat stream.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use futures_util::StreamExt;

/// Most bytes one frame of the OpenAI stream may hold before the re-framing gives up on it
/// (a frame is one token's text and bookkeeping; this bounds the buffer, not the stream).
const MAX_FRAME_BYTES: usize = 64 << 20;

/// What a frame mapper sees: one frame's `data:` payload, or the end of the stream.
pub enum Frame<'a> {
    /// The payload of one `data:` frame (`[DONE]` included).
    Data(&'a [u8]),
    /// The OpenAI stream ended (after its `[DONE]`, or cut short).
    End,
}

/// `response` with its SSE body re-framed by `map`, which appends what each frame becomes
/// to its output buffer; headers (status, `text/event-stream`, ids) are kept.
pub fn reframe<F>(response: Response, mut map: F) -> Response
where
    F: FnMut(Frame<'_>, &mut Vec<u8>) + Send + 'static,
{
    let (mut parts, body) = response.into_parts();
    let mut pending: Vec<u8> = Vec::new();
    let mut upstream = body.into_data_stream();
    let mut ended = false;
    let stream = futures_util::stream::poll_fn(move |cx| loop {
        if ended {
            return std::task::Poll::Ready(None);
        }
        let chunk = match upstream.poll_next_unpin(cx) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(chunk) => chunk,
        };
        let mut out = Vec::new();
        match chunk {
            Some(Ok(bytes)) => {
                pending.extend_from_slice(&bytes);
                let mut from = 0;
                while let Some(at) = find(&pending[from..], b"\n\n") {
                    let frame = &pending[from..from + at];
                    if let Some(data) = frame.strip_prefix(b"data: ") {
                        map(Frame::Data(data), &mut out);
                    }
                    from += at + 2;
                }
                pending.drain(..from);
                if pending.len() > MAX_FRAME_BYTES {
                    pending.clear();
                    map(Frame::End, &mut out);
                    ended = true;
                }
            }
            // A body error is the engine stream cut short: the mapper closes its stream.
            Some(Err(_)) | None => {
                map(Frame::End, &mut out);
                ended = true;
            }
        }
        if !out.is_empty() {
            return std::task::Poll::Ready(Some(Ok::<_, Infallible>(Bytes::from(out))));
        }
    });
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    Response::from_parts(parts, Body::from_stream(stream))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The whole body of a non-streamed response (at most `limit` bytes), for routes that
/// rewrite it into their own shape.
pub async fn whole(response: Response, limit: usize) -> Result<Bytes, crate::error::ApiError> {
    axum::body::to_bytes(response.into_body(), limit)
        .await
        .map_err(|e| crate::error::ApiError::internal(format!("reading the generated response: {e}")))
}

/// A JSON body `json` with the status and headers of the response it rewrites (the P/D
/// transfer time, the request id), its length recomputed.
pub fn json_like(mut parts: axum::http::response::Parts, json: String) -> Response {
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Response::from_parts(parts, Body::from(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_split_across_chunks_are_mapped_whole_and_the_end_is_signalled() {
        let parts: Vec<Result<Bytes, Infallible>> = vec![
            Ok(Bytes::from_static(b"data: {\"a\":1}\n\ndata: {\"b\"")),
            Ok(Bytes::from_static(b":2}\n\n")),
            Ok(Bytes::from_static(b"data: [DONE]\n\n")),
        ];
        let response = Response::new(Body::from_stream(futures_util::stream::iter(parts)));
        let mapped = reframe(response, |frame, out| match frame {
            Frame::Data(d) => {
                out.extend_from_slice(b"<");
                out.extend_from_slice(d);
                out.extend_from_slice(b">");
            }
            Frame::End => out.extend_from_slice(b"END"),
        });
        assert_eq!(mapped.headers()[header::CONTENT_TYPE], "text/event-stream");
        let body = axum::body::to_bytes(mapped.into_body(), 1 << 20).await.unwrap();
        assert_eq!(&body[..], b"<{\"a\":1}><{\"b\":2}><[DONE]>END");
    }
}
