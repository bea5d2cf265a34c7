//! Failure injection for gateway and client tests: a configured share of inference requests
//! answered with an OpenAI-style error instead of running (`--failure-injection-rate`,
//! `--failure-types`), and any request answered with the status its `X-Return-Error` header
//! names. Off by default; the draw is a counter hashed with a seed, so a seeded run injects
//! the same failures into the same request positions every time.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One kind of injected failure, named as `--failure-types` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureType {
    /// 429, OpenAI's `rate_limit_exceeded`.
    RateLimit,
    /// 401, `invalid_api_key`.
    InvalidApiKey,
    /// 400, `context_length_exceeded` (param `messages`).
    ContextLength,
    /// 500, `server_error`.
    ServerError,
    /// 400, `invalid_request_error`.
    InvalidRequest,
    /// 404, `model_not_found` (param `model`).
    ModelNotFound,
}

impl FailureType {
    /// Every type, in `--failure-types` order (the default set).
    pub const ALL: [FailureType; 6] = [
        Self::RateLimit,
        Self::InvalidApiKey,
        Self::ContextLength,
        Self::ServerError,
        Self::InvalidRequest,
        Self::ModelNotFound,
    ];

    /// The `--failure-types` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::RateLimit => "rate_limit",
            Self::InvalidApiKey => "invalid_api_key",
            Self::ContextLength => "context_length",
            Self::ServerError => "server_error",
            Self::InvalidRequest => "invalid_request",
            Self::ModelNotFound => "model_not_found",
        }
    }

    /// Parses a `--failure-types` name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    fn error(self, model: &str) -> InjectedError {
        let (status, kind, code, param, message) = match self {
            Self::RateLimit => (
                StatusCode::TOO_MANY_REQUESTS,
                "requests",
                "rate_limit_exceeded",
                None,
                format!("Rate limit reached for {model} on requests per min (RPM) (injected failure)."),
            ),
            Self::InvalidApiKey => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
                None,
                "Incorrect API key provided (injected failure).".to_string(),
            ),
            Self::ContextLength => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "context_length_exceeded",
                Some("messages"),
                "This model's maximum context length was exceeded by your messages (injected failure)."
                    .to_string(),
            ),
            Self::ServerError => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "server_error",
                None,
                "The server had an error while processing your request (injected failure).".to_string(),
            ),
            Self::InvalidRequest => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request_error",
                Some("model"),
                "Invalid request: missing required parameter 'model' (injected failure).".to_string(),
            ),
            Self::ModelNotFound => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                Some("model"),
                format!("The model `{model}-nonexistent` does not exist (injected failure)."),
            ),
        };
        InjectedError { status, kind, code: Some(code.to_string()), param, message }
    }
}

/// `--failure-injection-*` as the server takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureInjectionOptions {
    /// Percentage of inference requests failed, 0 to 100 (0 = off).
    pub rate_percent: f64,
    /// Kinds drawn from, uniformly; all kinds when empty.
    pub types: Vec<FailureType>,
    /// Seed of the draw; a random one when `None`.
    pub seed: Option<u64>,
}

impl Default for FailureInjectionOptions {
    fn default() -> Self {
        Self { rate_percent: 0.0, types: Vec::new(), seed: None }
    }
}

/// The running injector: request `n` (counted from 0 in arrival order) fails when the hash
/// of `(seed, n)` falls under the rate.
#[derive(Debug)]
pub struct FailureInjector {
    threshold: u64,
    types: Vec<FailureType>,
    seed: u64,
    next: AtomicU64,
}

impl FailureInjector {
    /// The injector for `options`, or `None` when the rate is 0.
    pub fn new(options: &FailureInjectionOptions) -> Option<Self> {
        if options.rate_percent <= 0.0 {
            return None;
        }
        let share = (options.rate_percent / 100.0).clamp(0.0, 1.0);
        // u64::MAX as f64 rounds up to 2^64; saturate so a 100% rate fails every request.
        let threshold = if share >= 1.0 { u64::MAX } else { (share * u64::MAX as f64) as u64 };
        let types = if options.types.is_empty() { FailureType::ALL.to_vec() } else { options.types.clone() };
        let seed = options.seed.unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
        Some(Self { threshold, types, seed, next: AtomicU64::new(0) })
    }

    /// Draws for the next request: the failure to answer it with, if any.
    pub fn draw(&self) -> Option<FailureType> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let x = splitmix64(self.seed ^ splitmix64(n));
        if x >= self.threshold && self.threshold != u64::MAX {
            return None;
        }
        let pick = splitmix64(x) % self.types.len() as u64;
        Some(self.types[pick as usize])
    }

    /// The response of an injected failure.
    pub fn response(kind: FailureType, model: &str) -> Response {
        kind.error(model).into_response()
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The header a client sets to get a given error status back.
pub const RETURN_ERROR_HEADER: &str = "x-return-error";

/// The error asked for by `X-Return-Error: STATUS`, or a 400 naming the header when its value
/// is not a status from 400 to 599. `None` without the header.
pub fn requested_error(headers: &HeaderMap, model: &str) -> Option<Response> {
    let value = headers.get(RETURN_ERROR_HEADER)?;
    let status = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .filter(|s| s.is_client_error() || s.is_server_error());
    let Some(status) = status else {
        let shown = String::from_utf8_lossy(value.as_bytes()).into_owned();
        return Some(
            InjectedError {
                status: StatusCode::BAD_REQUEST,
                kind: "invalid_request_error",
                code: None,
                param: None,
                message: format!("X-Return-Error: must be an HTTP status from 400 to 599, got {shown:?}"),
            }
            .into_response(),
        );
    };
    let by_kind = match status.as_u16() {
        429 => Some(FailureType::RateLimit),
        401 => Some(FailureType::InvalidApiKey),
        404 => Some(FailureType::ModelNotFound),
        500 => Some(FailureType::ServerError),
        400 => Some(FailureType::InvalidRequest),
        _ => None,
    };
    let error = match by_kind {
        Some(kind) => kind.error(model),
        None => InjectedError {
            status,
            kind: if status.is_server_error() { "server_error" } else { "invalid_request_error" },
            code: None,
            param: None,
            message: format!(
                "{} {} (requested by X-Return-Error)",
                status.as_u16(),
                status.canonical_reason().unwrap_or("error")
            ),
        },
    };
    Some(error.into_response())
}

/// An OpenAI API error body: `{"error": {"message", "type", "param", "code"}}`, `code` being
/// OpenAI's string code (`rate_limit_exceeded`, ...).
#[derive(Debug)]
struct InjectedError {
    status: StatusCode,
    kind: &'static str,
    code: Option<String>,
    param: Option<&'static str>,
    message: String,
}

impl IntoResponse for InjectedError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body<'a> {
            error: Detail<'a>,
        }
        #[derive(Serialize)]
        struct Detail<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: Option<&'a str>,
        }
        let body = Body {
            error: Detail {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code.as_deref(),
            },
        };
        let json = serde_json::to_string(&body).expect("error bodies serialize");
        (self.status, [(axum::http::header::CONTENT_TYPE, "application/json")], json).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(rate: f64, seed: u64, n: usize) -> f64 {
        let inj = FailureInjector::new(&FailureInjectionOptions {
            rate_percent: rate,
            types: vec![],
            seed: Some(seed),
        })
        .unwrap();
        (0..n).filter(|_| inj.draw().is_some()).count() as f64 / n as f64
    }

    #[test]
    fn the_drawn_share_follows_the_rate_and_the_seed_repeats_it() {
        for rate in [1.0, 25.0, 50.0, 90.0] {
            let got = share(rate, 7, 20_000) * 100.0;
            assert!((got - rate).abs() < 1.5, "rate {rate}: {got}");
        }
        assert_eq!(share(100.0, 3, 1000), 1.0);
        let a: Vec<_> = {
            let o = FailureInjectionOptions { rate_percent: 30.0, types: vec![], seed: Some(9) };
            let i = FailureInjector::new(&o).unwrap();
            (0..200).map(|_| i.draw()).collect()
        };
        let o = FailureInjectionOptions { rate_percent: 30.0, types: vec![], seed: Some(9) };
        let i = FailureInjector::new(&o).unwrap();
        assert_eq!(a, (0..200).map(|_| i.draw()).collect::<Vec<_>>());
        assert!(FailureInjector::new(&FailureInjectionOptions::default()).is_none());
    }

    #[test]
    fn every_type_round_trips_its_name_and_draws_only_configured_types() {
        for t in FailureType::ALL {
            assert_eq!(FailureType::parse(t.name()), Some(t));
        }
        assert_eq!(FailureType::parse("nope"), None);
        let o = FailureInjectionOptions {
            rate_percent: 100.0,
            types: vec![FailureType::RateLimit, FailureType::ModelNotFound],
            seed: Some(1),
        };
        let i = FailureInjector::new(&o).unwrap();
        let drawn: std::collections::HashSet<_> = (0..100).map(|_| i.draw().unwrap()).collect();
        assert_eq!(drawn.len(), 2);
    }
}
