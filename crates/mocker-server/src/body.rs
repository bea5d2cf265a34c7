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
