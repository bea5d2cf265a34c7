//! `POST /v1/embeddings` (the OpenAI shape, as vLLM's pooling server answers it).
//!
//! Each input is one prefill-only request through the simulated engine (one output token,
//! which a pooling model does not sample: the answer comes when the prefill pass ends), so
//! the response takes the modelled prefill time and the prompt occupies KV and feeds the
//! prefix cache like any other. The vector is a deterministic function of the input's token
//! ids: unit-norm, `--embedding-dim` long, the same ids always giving the same vector.
//! `dimensions` truncates it and renormalizes (matryoshka embeddings, as vLLM does).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures_util::future::try_join_all;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::{body as read_body, AppState};

/// Fields of an embeddings request; anything else is refused by name.
const FIELDS: &[&str] = &["input", "model", "encoding_format", "dimensions", "user", "add_special_tokens"];

/// Most inputs one request may embed (OpenAI's limit): each is an engine request.
pub const MAX_INPUTS: usize = 2048;

/// One input as the client gave it.
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// A validated embeddings request.
struct Parsed {
    model: Option<String>,
    inputs: Vec<Input>,
    base64: bool,
    dimensions: Option<usize>,
    add_special_tokens: bool,
}

fn ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                ApiError::invalid_field("input", format!("input: token ids must be integers >= 0, got {v}"))
            })
        })
        .collect()
}

fn parse(body: &[u8], max_dim: usize) -> Result<Parsed, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(ApiError::bad_request("request body: expected a JSON object"));
    };
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::invalid_field(
            unknown,
            format!("{unknown}: unsupported field for /v1/embeddings (supported: {})", FIELDS.join(", ")),
        ));
    }
    let shapes = "a string, a list of strings, a list of token ids, or a list of token-id lists";
    let bad = |what: String| ApiError::invalid_field("input", format!("input: {what}; expected {shapes}"));
    if let Some(n) = value["input"].as_array().map(Vec::len).filter(|&n| n > MAX_INPUTS) {
        // Only a list of lists or strings can be many inputs; a long id list is one input.
        if !value["input"].as_array().is_some_and(|a| a.iter().all(Value::is_number)) {
            let msg = format!("input: at most {MAX_INPUTS} inputs in one request (as OpenAI's API), got {n}");
            return Err(ApiError::invalid_field("input", msg));
        }
    }
    let inputs = match &value["input"] {
        Value::Null => return Err(ApiError::invalid_field("input", "input is required")),
        Value::String(s) => vec![Input::Text(s.clone())],
        Value::Array(items) if items.is_empty() => return Err(bad("empty list".into())),
        Value::Array(items) if items.iter().all(Value::is_number) => vec![Input::Ids(ids(items)?)],
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(Input::Text(s.clone())),
                Value::Array(inner) => Ok(Input::Ids(ids(inner)?)),
                other => Err(bad(format!("unexpected element {other}"))),
            })
            .collect::<Result<_, _>>()?,
        other => return Err(bad(format!("got {other}"))),
    };
    let base64 = match &value["encoding_format"] {
        Value::Null => false,
        Value::String(s) if s == "float" => false,
        Value::String(s) if s == "base64" => true,
        other => {
            return Err(ApiError::invalid_field(
                "encoding_format",
                format!("encoding_format must be \"float\" or \"base64\", got {other}"),
            ))
        }
    };
    let dimensions = match &value["dimensions"] {
        Value::Null => None,
        v => match v.as_u64() {
            Some(d) if d >= 1 && d as usize <= max_dim => Some(d as usize),
            _ => {
                return Err(ApiError::invalid_field(
                    "dimensions",
                    format!(
                        "dimensions must be an integer between 1 and {max_dim} (--embedding-dim), got {v}"
                    ),
                ))
            }
        },
    };
    let model = match &value["model"] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => {
            return Err(ApiError::invalid_field("model", format!("model: expected a string, got {other}")))
        }
    };
    let add_special_tokens = match &value["add_special_tokens"] {
        Value::Null => true,
        Value::Bool(b) => *b,
        other => {
            return Err(ApiError::invalid_field(
                "add_special_tokens",
                format!("add_special_tokens: expected a boolean, got {other}"),
            ))
        }
    };
    Ok(Parsed { model, inputs, base64, dimensions, add_special_tokens })
}

/// The unit-norm vector of `tokens`: `dim` values drawn from a generator seeded by the
/// token ids, normalized; `keep` of them when truncated (renormalized).
pub fn embedding(tokens: &[u32], dim: usize, keep: usize) -> Vec<f32> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut state = xxhash_rust::xxh3::xxh3_64(&bytes);
    let mut v: Vec<f32> = (0..dim.min(keep))
        .map(|_| {
            // splitmix64: cheap, well mixed, and the same on every platform.
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect();
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    v
}

/// Runs one input's prefill through the engine; resolves when its pass ends.
pub async fn prefill(state: &AppState, tokens: Vec<u32>) -> Result<(), ApiError> {
    let prompt = tokens.len();
    if let Some(max_len) = state.max_model_len {
        if prompt > max_len {
            return Err(ApiError::invalid_field(
                "input",
                format!(
                    "This model's maximum context length is {max_len} tokens. However, you requested \
                     {prompt} tokens in the input for embedding generation. Please reduce the length of the \
                     input."
                ),
            ));
        }
    }
    let request = mocker_core::Request {
        uuid: uuid::Uuid::new_v4().as_u128(),
        tokens,
        max_output_tokens: 1,
        ..Default::default()
    };
    if !state.frontend_delay.is_zero() {
        tokio::time::sleep(state.frontend_delay).await;
    }
    let (mut live, _) = state.ranks.submit(request, false).await?;
    loop {
        match live.recv().await {
            Some(s) if s.rejected => return Err(state.rejection(prompt + 1)),
            Some(s) if s.completed => return Ok(()),
            Some(_) => {}
            None => {
                return Err(ApiError::unavailable("the engine stopped before the embedding was computed"))
            }
        }
    }
}

/// `POST /v1/embeddings`.
pub async fn embeddings(State(state): State<Arc<AppState>>, request: Request) -> Result<Response, ApiError> {
    let bytes = read_body(&state, request).await?;
    let parsed = parse(&bytes, state.embedding_dim)?;
    if let Some(model) = parsed.model.as_deref() {
        if model != state.model_name {
            return Err(ApiError::model_not_found(model));
        }
    }
    // Tokenizing a request's inputs is request-sized CPU work: off the async workers.
    let tokenizing = Arc::clone(&state);
    let (raw, special) = (parsed.inputs, parsed.add_special_tokens);
    let inputs = tokio::task::spawn_blocking(move || {
        let mut inputs = Vec::with_capacity(raw.len());
        for input in raw {
            let tokens = match input {
                Input::Ids(ids) => ids,
                Input::Text(text) => tokenizing
                    .tokenizer
                    .encode(&text, special)
                    .map_err(|e| ApiError::internal(e.to_string()))?,
            };
            if tokens.is_empty() {
                return Err(ApiError::invalid_field(
                    "input",
                    "input must not be empty (it tokenizes to no tokens)",
                ));
            }
            inputs.push(tokens);
        }
        Ok(inputs)
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing the inputs: {e}")))??;
    // All inputs go to the engine at once, so they are batched as vLLM batches them.
    try_join_all(inputs.iter().map(|tokens| prefill(&state, tokens.clone()))).await?;
    let dim = state.embedding_dim;
    let keep = parsed.dimensions.unwrap_or(dim);
    let mut prompt_tokens = 0;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, tokens)| {
            prompt_tokens += tokens.len();
            let v = embedding(tokens, dim, keep);
            let embedding = if parsed.base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let created =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let body = json!({
        "id": format!("embd-{}", uuid::Uuid::new_v4().simple()),
        "object": "list",
        "created": created,
        "model": state.model_name,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0},
    });
    Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[f32]) -> f64 {
        v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt()
    }

    #[test]
    fn vectors_are_unit_norm_deterministic_and_input_dependent() {
        let a = embedding(&[1, 2, 3], 64, 64);
        assert_eq!(a.len(), 64);
        assert!((norm(&a) - 1.0).abs() < 1e-5);
        assert_eq!(a, embedding(&[1, 2, 3], 64, 64));
        assert_ne!(a, embedding(&[1, 2, 4], 64, 64));
        let short = embedding(&[1, 2, 3], 64, 8);
        assert_eq!(short.len(), 8);
        assert!((norm(&short) - 1.0).abs() < 1e-5);
        // Truncation keeps the direction of the leading components (matryoshka).
        let scale = a[0] / short[0];
        assert!(a[..8].iter().zip(&short).all(|(x, y)| (x / y - scale).abs() < 1e-4));
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused_by_name() {
        let param = |body: &str| parse(body.as_bytes(), 16).err().and_then(|e| e.param);
        assert_eq!(param(r#"{"input":"a","pooling":"mean"}"#).as_deref(), Some("pooling"));
        assert_eq!(param(r#"{"input":"a","encoding_format":"int8"}"#).as_deref(), Some("encoding_format"));
        assert_eq!(param(r#"{"input":"a","dimensions":17}"#).as_deref(), Some("dimensions"));
        assert_eq!(param(r#"{"input":[]}"#).as_deref(), Some("input"));
        assert_eq!(param(r#"{"input":[1,-2]}"#).as_deref(), Some("input"));
        let ok = parse(br#"{"input":[[1,2],[3]],"encoding_format":"base64","dimensions":4}"#, 16).unwrap();
        assert_eq!((ok.inputs.len(), ok.base64, ok.dimensions), (2, true, Some(4)));
    }
}
