//! Errors as the OpenAI API (and vLLM's server) return them: an HTTP status and a JSON body
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered to a client before any response body was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation naming the offending field.
    pub message: String,
    /// The field at fault, when one is.
    pub param: Option<String>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: u16,
}

impl ApiError {
    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param: None }
    }

    /// 400 about one field.
    pub fn invalid_field(param: &str, message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param: Some(param.to_string()) }
    }

    /// 404: the model asked for is not served here.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            param: Some("model".to_string()),
        }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self { status: StatusCode::UNAUTHORIZED, message: "Unauthorized".to_string(), param: None }
    }

    /// 413: the body exceeds the server's limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds the limit of {limit} bytes"),
            param: None,
        }
    }

    /// 408: the body did not arrive in full within `timeout` (`--body-timeout-seconds`).
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the request body did not arrive within {} s (--body-timeout-seconds)",
                timeout.as_secs_f64()
            ),
            param: None,
        }
    }

    /// 503: the engine is not running (shutting down or failed).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into(), param: None }
    }

    /// 500: a bug or an engine failure.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into(), param: None }
    }

    /// The `type` field, named as the OpenAI Python SDK names its exceptions.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::REQUEST_TIMEOUT
            | StatusCode::URI_TOO_LONG
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        let body = Body {
            error: Detail {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        };
        serde_json::to_string(&body).expect("error bodies serialize")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], self.body()).into_response()
    }
}

/// `error` and each of its causes, `: `-separated: an HTTP client's message alone ("error
/// sending request") hides why (a refused connection, an untrusted certificate).
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::invalid_field("max_tokens", "max_tokens must be at least 1, got 0");
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["param"], "max_tokens");
        assert_eq!(v["error"]["code"], 400);
        assert!(v["error"]["message"].as_str().unwrap().contains("got 0"));
        assert_eq!(ApiError::model_not_found("x").status, StatusCode::NOT_FOUND);
    }
}
