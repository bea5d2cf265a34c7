//! `--api-key`: which routes need it and how the key is checked.
//!
//! As vLLM's authentication middleware, every path under `/v1` (and, as its documentation
//! says, `/v2` and `/inference`) needs `Authorization: Bearer KEY` (the scheme is
//! case-insensitive), matched or not, so an unknown `/v1/...` path answers 401 rather than
//! telling what exists. Anthropic's `x-api-key` header is not a key, as in vLLM. Beyond
//! vLLM, routes that change the engine's state (`/reset_prefix_cache`, `/sleep`,
//! `/wake_up`) and the pooling routes that run it (`/rerank`, `/score`, `/pooling`) need
//! it too. `/health`, `/ping`, `/health/ready`, `/version`, `/metrics`, `/tokenize` and
//! `/detokenize` stay open, as in vLLM: they read nothing private and change nothing.

use axum::http::header;
use subtle::ConstantTimeEq;

/// Routes outside `/v1` that change state and so need the key: the P/D side channel's
/// reads and aborts free a held prefill's KV, so they need it too (the servers of a P/D
/// pair share the key, and the P/D front passes the client's on).
const STATE_CHANGING: &[&str] = &[
    "/reset_prefix_cache",
    "/sleep",
    "/wake_up",
    "/mocker/kv_transfer/read",
    "/mocker/kv_transfer/abort",
    "/admin/config",
];

/// The key clients must present. Only its digest is kept: comparing digests of equal length
/// in constant time tells an attacker neither the key's bytes nor its length.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// The key; `None` when empty (an empty key would protect nothing).
    pub fn new(key: &str) -> Option<Self> {
        (!key.is_empty()).then(|| Self { digest: *blake3::hash(key.as_bytes()).as_bytes() })
    }

    /// Whether `given` is the key, in time independent of where they differ.
    pub fn matches(&self, given: &[u8]) -> bool {
        blake3::hash(given).as_bytes().ct_eq(&self.digest).into()
    }

    /// Whether an `Authorization` header value carries the key as a bearer token.
    fn authorizes(&self, value: &[u8]) -> bool {
        let Some(space) = value.iter().position(|&b| b == b' ') else { return false };
        let (scheme, token) = (&value[..space], &value[space + 1..]);
        // Computed whatever the scheme, so a wrong scheme takes as long as a wrong key.
        let key_ok = self.matches(token);
        scheme.eq_ignore_ascii_case(b"bearer") && key_ok
    }
}

/// Path prefixes that need the key: vLLM's middleware guards `/v1`, and its documentation
/// names `/v2` and `/inference` too (the rerank and tokens-in/tokens-out routes).
const PROTECTED_PREFIXES: &[&str] = &["/v1", "/v2", "/inference"];

/// Inference routes outside those prefixes that run the engine (vLLM's pooling routes):
/// guarded too, as anything that spends the engine's time is.
const ENGINE_ROUTES: &[&str] = &["/rerank", "/score", "/pooling"];

/// Whether `path` needs the key.
pub fn is_protected(path: &str) -> bool {
    PROTECTED_PREFIXES.iter().any(|p| path.starts_with(p))
        || STATE_CHANGING.contains(&path)
        || ENGINE_ROUTES.contains(&path)
}

/// Whether `headers` carry `key` as a bearer token (always, on a server without one).
pub fn authorized(key: Option<&ApiKey>, headers: &axum::http::HeaderMap) -> bool {
    key.is_none_or(|key| headers.get(header::AUTHORIZATION).is_some_and(|v| key.authorizes(v.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive_and_the_key_exact() {
        let key = ApiKey::new("s3cret").unwrap();
        assert!(key.authorizes(b"Bearer s3cret"));
        assert!(key.authorizes(b"bearer s3cret"));
        assert!(!key.authorizes(b"Bearer s3cre"));
        assert!(!key.authorizes(b"Bearer s3cret "));
        assert!(!key.authorizes(b"Basic s3cret"));
        assert!(!key.authorizes(b"s3cret"));
        assert!(ApiKey::new("").is_none());
    }

    #[test]
    fn v1_inference_engine_and_state_changing_routes_are_protected() {
        for p in [
            "/v1/completions",
            "/v1/models",
            "/v1/nope",
            "/reset_prefix_cache",
            "/inference/v1/generate",
            "/v2/rerank",
            "/rerank",
            "/score",
            "/pooling",
        ] {
            assert!(is_protected(p), "{p}");
        }
        for p in ["/health", "/metrics", "/version", "/tokenize", "/detokenize"] {
            assert!(!is_protected(p), "{p}");
        }
    }
}
