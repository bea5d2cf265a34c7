//! Reading a request body within a size limit and a time limit, as a JSON error otherwise.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;

use crate::error::ApiError;

/// The body, at most `limit` bytes arriving within `timeout`.
pub async fn read(limit: usize, timeout: Duration, request: Request) -> Result<Bytes, ApiError> {
    let request = request.map(|b| axum::body::Body::new(http_body_util::Limited::new(b, limit)));
    let read = tokio::time::timeout(timeout, Bytes::from_request(request, &()));
    let Ok(read) = read.await else {
        return Err(ApiError::body_timeout(timeout));
    };
    read.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else {
            ApiError::bad_request(format!("could not read the request body: {e}"))
        }
    })
}

/// Reads and discards the body, at most `limit` bytes within `timeout`: what a refusal does
/// before answering, so the connection stays reusable without buffering a body (possibly an
/// unauthenticated client's) it will never look at. Gives up silently past either limit
/// (hyper then closes the connection, as it must).
pub async fn drain(limit: usize, timeout: Duration, request: Request) {
    use http_body_util::BodyExt;
    let mut body = request.into_body();
    let mut left = limit;
    let _ = tokio::time::timeout(timeout, async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |d| d.len());
            if n > left {
                return;
            }
            left -= n;
        }
    })
    .await;
}
