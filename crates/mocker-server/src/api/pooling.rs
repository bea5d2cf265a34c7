//! vLLM's pooling routes beside `/v1/embeddings`: rerank (`/rerank`, `/v1/rerank`,
//! `/v2/rerank`), score (`/score`, `/v1/score`) and `/pooling`.
//!
//! As on `/v1/embeddings`, each input is one prefill-only request through the simulated
//! engine, all of a request's sent at once so they batch as vLLM batches them: one per
//! query-document pair for rerank and score (a cross-encoder reads the pair as one
//! prompt: the query's tokens, special tokens included, then the document's), one per
//! input for `/pooling`. Scores are deterministic pseudo-values, not a model's judgement:
//! `(1 + cos) / 2` of the two texts' embedding vectors (see [`embedding`]), so a text
//! scores 1 against itself and the same pair always scores the same.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::future::try_join_all;
use serde_json::{json, Map, Value};

use crate::api::embeddings::{embedding, prefill, MAX_INPUTS};
use crate::error::ApiError;
use crate::state::{body, AppState};

/// Fields every pooling request may carry (vLLM's common pooling fields that act here).
const COMMON: &[&str] = &["model", "user", "request_id", "priority", "truncate_prompt_tokens"];

fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_field(field, format!("{field}: {message}"))
}

fn object(bytes: &[u8], fields: &[&str], route: &str) -> Result<Map<String, Value>, ApiError> {
    let body = match serde_json::from_slice(bytes) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err(ApiError::bad_request("request body: expected a JSON object")),
        Err(e) => return Err(ApiError::bad_request(format!("malformed JSON body: {e}"))),
    };
    if let Some(k) = body.keys().find(|k| !fields.contains(&k.as_str()) && !COMMON.contains(&k.as_str())) {
        let all: Vec<&str> = fields.iter().chain(COMMON).copied().collect();
        return Err(bad(k, format!("unsupported field for {route} (supported: {})", all.join(", "))));
    }
    if body.get("truncate_prompt_tokens").is_some_and(|v| !v.is_null()) {
        return Err(bad("truncate_prompt_tokens", "prompt truncation is not simulated"));
    }
    match body.get("priority") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_i64() == Some(0) => {}
        Some(v) => return Err(bad("priority", format!("{v}: priority scheduling is not enabled (only 0)"))),
    }
    Ok(body)
}

fn check_model(state: &AppState, body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == state.model_name => Ok(()),
        Some(Value::String(m)) => Err(ApiError::model_not_found(m)),
        Some(v) => Err(bad("model", format!("expected a string, got {v}"))),
    }
}

/// A side of a score pair: one string or a list of them (at most [`MAX_INPUTS`]).
fn texts(value: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
    match value {
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) if items.is_empty() => Err(bad(field, "must not be empty")),
        Some(Value::Array(items)) if items.len() > MAX_INPUTS => {
            Err(bad(field, format!("at most {MAX_INPUTS} texts, got {}", items.len())))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(bad(
                    field,
                    format!("expected strings (multimodal inputs are not simulated), got {other}"),
                )),
            })
            .collect(),
        None | Some(Value::Null) => Err(bad(field, "required")),
        Some(v) => Err(bad(field, format!("expected a string or a list of strings, got {v}"))),
    }
}

fn encode(state: &AppState, text: &str, special: bool, field: &str) -> Result<Vec<u32>, ApiError> {
    let ids = state.tokenizer.encode(text, special).map_err(|e| ApiError::internal(e.to_string()))?;
    if ids.is_empty() && special {
        return Err(bad(field, "must not be empty (it tokenizes to no tokens)"));
    }
    Ok(ids)
}

/// Scores the pairs (one engine request each); returns the scores and the prompt tokens.
async fn score_pairs(
    state: &AppState,
    pairs: &[(&str, &str)],
    field: &str,
) -> Result<(Vec<f64>, usize), ApiError> {
    let dim = state.embedding_dim;
    let mut prompts = Vec::with_capacity(pairs.len());
    let mut scores = Vec::with_capacity(pairs.len());
    for (query, doc) in pairs {
        let q = encode(state, query, true, field)?;
        let d = encode(state, doc, false, field)?;
        let (a, b) = (embedding(&encode(state, query, false, field)?, dim, dim), embedding(&d, dim, dim));
        let cos: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
        scores.push(((1.0 + cos) / 2.0).clamp(0.0, 1.0));
        prompts.push([q, d].concat());
    }
    let tokens = prompts.iter().map(Vec::len).sum();
    try_join_all(prompts.into_iter().map(|p| prefill(state, p, field))).await?;
    Ok((scores, tokens))
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn score_id(request: &Request) -> String {
    format!(
        "score-{}",
        crate::state::request_id(request).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())
    )
}

/// `POST /rerank` (and `/v1/rerank`, `/v2/rerank`): the documents by relevance to the query.
pub async fn rerank(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let id = score_id(&request);
    let bytes = body(&state, request).await?;
    let body = object(&bytes, &["query", "documents", "top_n"], "rerank")?;
    check_model(&state, &body)?;
    let query = match body.get("query") {
        Some(Value::String(q)) => q.clone(),
        other => {
            return Err(bad("query", format!("expected a string, got {}", other.unwrap_or(&Value::Null))))
        }
    };
    let documents = texts(body.get("documents"), "documents")?;
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => 0,
        Some(v) => {
            v.as_u64().ok_or_else(|| bad("top_n", format!("expected a non-negative integer, got {v}")))?
                as usize
        }
    };
    let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query.as_str(), d.as_str())).collect();
    let (scores, tokens) = score_pairs(&state, &pairs, "documents").await?;
    let mut results: Vec<(usize, f64)> = scores.into_iter().enumerate().collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if top_n > 0 {
        results.truncate(top_n);
    }
    let results: Vec<Value> = results
        .into_iter()
        .map(|(i, s)| json!({"index": i, "document": {"text": documents[i], "multi_modal": null}, "relevance_score": s}))
        .collect();
    let usage = json!({"prompt_tokens": tokens, "total_tokens": tokens});
    Ok(axum::Json(json!({"id": id, "model": state.model_name, "usage": usage, "results": results}))
        .into_response())
}

/// The two sides of a score request, under whichever of vLLM's names it uses.
fn score_sides(body: &Map<String, Value>) -> Result<(Vec<String>, Vec<String>, &'static str), ApiError> {
    for (left, right) in
        [("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2")]
    {
        if body.contains_key(left) || body.contains_key(right) {
            return Ok((texts(body.get(left), left)?, texts(body.get(right), right)?, right));
        }
    }
    Err(bad("queries", "required: queries and documents (or items, data_1/data_2, text_1/text_2)"))
}

/// `POST /score` (and `/v1/score`): a score per pair, 1×N or N×N.
pub async fn score(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let id = score_id(&request);
    let bytes = body(&state, request).await?;
    let fields = ["queries", "documents", "items", "data_1", "data_2", "text_1", "text_2"];
    let body = object(&bytes, &fields, "score")?;
    check_model(&state, &body)?;
    let (left, right, field) = score_sides(&body)?;
    let pairs: Vec<(&str, &str)> = match (left.len(), right.len()) {
        (1, _) => right.iter().map(|r| (left[0].as_str(), r.as_str())).collect(),
        (n, m) if n == m => left.iter().zip(&right).map(|(l, r)| (l.as_str(), r.as_str())).collect(),
        (n, m) => return Err(bad(field, format!("{n} queries need 1 or {n} documents, got {m}"))),
    };
    let (scores, tokens) = score_pairs(&state, &pairs, field).await?;
    let data: Vec<Value> =
        scores.iter().enumerate().map(|(i, s)| json!({"index": i, "object": "score", "score": s})).collect();
    let usage = json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": null});
    let out = json!({"id": id, "object": "list", "created": now(), "model": state.model_name, "data": data, "usage": usage});
    Ok(axum::Json(out).into_response())
}

/// `POST /pooling`: the pooled (sentence) embedding of each input, `task` `embed`.
pub async fn pooling(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let bytes = body(&state, request).await?;
    let fields = ["input", "task", "encoding_format", "dimensions", "normalize", "add_special_tokens"];
    let body = object(&bytes, &fields, "/pooling")?;
    check_model(&state, &body)?;
    match body.get("task") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "embed" => {}
        Some(v) => return Err(bad("task", format!("only \"embed\" is simulated, got {v}"))),
    }
    if body.get("normalize").is_some_and(|v| !v.is_null() && *v != json!(true)) {
        return Err(bad("normalize", "only normalized (unit-norm) vectors are simulated"));
    }
    let base64 = match body.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(v) => return Err(bad("encoding_format", format!("\"float\" or \"base64\", got {v}"))),
    };
    let dim = state.embedding_dim;
    let keep = match body.get("dimensions") {
        None | Some(Value::Null) => dim,
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 && d as usize <= dim => d as usize,
            _ => {
                return Err(bad(
                    "dimensions",
                    format!("an integer between 1 and {dim} (--embedding-dim), got {v}"),
                ))
            }
        },
    };
    let special = match body.get("add_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad("add_special_tokens", format!("expected a boolean, got {v}"))),
    };
    let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad("input", format!("token ids must be integers >= 0, got {v}")))
            })
            .collect()
    };
    let inputs: Vec<Vec<u32>> = match body.get("input") {
        Some(Value::String(s)) => vec![encode(&state, s, special, "input")?],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("input", "must not be empty")),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![ids(items)?],
        Some(Value::Array(items)) if items.len() > MAX_INPUTS => {
            return Err(bad("input", format!("at most {MAX_INPUTS} inputs, got {}", items.len())))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => encode(&state, s, special, "input"),
                Value::Array(inner) => ids(inner),
                other => Err(bad("input", format!("unexpected element {other}"))),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(bad(
                "input",
                format!(
                    "required: a string, strings, token ids or token-id lists, got {}",
                    other.unwrap_or(&Value::Null)
                ),
            ))
        }
    };
    if inputs.iter().any(Vec::is_empty) {
        return Err(bad("input", "must not be empty (it tokenizes to no tokens)"));
    }
    try_join_all(inputs.iter().map(|t| prefill(&state, t.clone(), "input"))).await?;
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, t)| {
            let v = embedding(t, dim, keep);
            let data = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"index": index, "object": "pooling", "data": data})
        })
        .collect();
    let usage = json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": null});
    let id = format!("pool-{}", uuid::Uuid::new_v4().simple());
    let out = json!({"id": id, "object": "list", "created": now(), "model": state.model_name, "data": data, "usage": usage});
    Ok(axum::Json(out).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_refused_by_name() {
        let param = |b: &str| {
            object(b.as_bytes(), &["query", "documents", "top_n"], "rerank").err().and_then(|e| e.param)
        };
        assert_eq!(
            param(r#"{"query":"q","documents":["d"],"return_documents":true}"#).as_deref(),
            Some("return_documents")
        );
        assert_eq!(
            param(r#"{"query":"q","truncate_prompt_tokens":3}"#).as_deref(),
            Some("truncate_prompt_tokens")
        );
        assert_eq!(param(r#"{"query":"q","priority":2}"#).as_deref(), Some("priority"));
        assert!(object(b"{", &[], "x").unwrap_err().message.contains("malformed JSON"));
        assert_eq!(texts(Some(&json!([])), "documents").unwrap_err().param.as_deref(), Some("documents"));
        assert_eq!(
            texts(Some(&json!([{"content": []}])), "documents").unwrap_err().param.as_deref(),
            Some("documents")
        );
        let many = Value::Array(vec![json!("x"); MAX_INPUTS + 1]);
        assert!(texts(Some(&many), "items").unwrap_err().message.contains("at most"));
        let sides = score_sides(json!({"text_1": "a", "text_2": ["b", "c"]}).as_object().unwrap()).unwrap();
        assert_eq!((sides.0.len(), sides.1.len(), sides.2), (1, 2, "text_2"));
        assert_eq!(score_sides(&Map::new()).unwrap_err().param.as_deref(), Some("queries"));
    }
}
