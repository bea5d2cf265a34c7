//! A `GenerateRequest` into the [`Generation`] the HTTP routes build, with proto3's
//! defaults read as vLLM's servicer reads them (0 / empty / absent = unset: `n` 0 is 1,
//! `max_tokens` absent runs to the context window or the model's end of sequence), and
//! every field mocker does not simulate refused by name with `INVALID_ARGUMENT`.

use serde_json::{json, Value};
use tonic::{Code, Status};

use super::pb::generate_request::Input;
use super::pb::sampling_params::Constraint;
use super::pb::{GenerateRequest, SamplingParams};
use crate::error::ApiError;
use crate::openai::fields;
use crate::openai::request::{Generation, PromptInput};
use crate::output::stop::{check_stop_strings, StopRules};
use crate::pd::KvTransfer;

/// An HTTP-shaped error as a gRPC status (the message already names the field).
pub fn status(e: ApiError) -> Status {
    let code = match e.status.as_u16() {
        400 | 422 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        408 => Code::DeadlineExceeded,
        413 | 429 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        503 => Code::Unavailable,
        _ => Code::Internal,
    };
    Status::new(code, e.message)
}

/// `INVALID_ARGUMENT` naming `field`.
pub fn refuse(field: &str, why: &str) -> Status {
    Status::invalid_argument(format!("{field}: {why}"))
}

/// A converted request: what to generate, and the prompt as given.
#[derive(Debug)]
pub struct Converted {
    /// The output asked for.
    pub generation: Generation,
    /// Token ids, or text the server tokenizes.
    pub prompt: PromptInput,
    /// `truncate_prompt_tokens`: keep this many of the prompt's last tokens (-1: the context
    /// window).
    pub truncate: Option<i32>,
}

/// Validates and converts a `GenerateRequest`; `pd` says whether the server has a KV
/// connector (`--kv-transfer-config`).
pub fn generate_request(request: &GenerateRequest, pd: bool) -> Result<Converted, Status> {
    let prompt = match &request.input {
        Some(Input::Tokenized(t)) if t.input_ids.is_empty() => {
            return Err(refuse("tokenized.input_ids", "the prompt must not be empty"))
        }
        Some(Input::Tokenized(t)) => PromptInput::Ids(t.input_ids.clone()),
        Some(Input::Text(text)) => PromptInput::Text(text.clone()),
        None => return Err(refuse("input", "a prompt is required: set tokenized or text")),
    };
    if request.kv_transfer_params.is_some() {
        return Err(refuse(
            "kv_transfer_params",
            "the deprecated typed (Mooncake host/port) parameters are not simulated; send \
             kv_transfer_params_json (NIXL-style do_remote_decode / do_remote_prefill)",
        ));
    }
    if request.mm_inputs.is_some() {
        return Err(refuse("mm_inputs", "preprocessed multimodal tensors are not simulated"));
    }
    if request.data_parallel_rank.is_some() {
        return Err(refuse(
            "data_parallel_rank",
            "pinning a request to a DP rank is not simulated; mocker sends each request to its \
             least-loaded rank",
        ));
    }
    let params = request.sampling_params.clone().unwrap_or_default();
    let mut generation = sampling(&params)?;
    generation.stream = request.stream;
    if let Some(raw) = &request.kv_transfer_params_json {
        if !pd {
            return Err(refuse(
                "kv_transfer_params_json",
                "this server has no KV connector; start it with --kv-transfer-config \
                 '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'",
            ));
        }
        let value: Value = serde_json::from_str(raw)
            .map_err(|e| refuse("kv_transfer_params_json", &format!("invalid JSON: {e}")))?;
        if !value.is_object() {
            return Err(refuse("kv_transfer_params_json", "expected a JSON object"));
        }
        generation.kv_transfer = KvTransfer::from_request(&json!({ "kv_transfer_params": value }))
            .map_err(|e| Status::invalid_argument(format!("kv_transfer_params_json: {}", e.message)))?;
    }
    Ok(Converted { generation, prompt, truncate: params.truncate_prompt_tokens })
}

/// The sampling parameters as the HTTP path's [`Generation`].
fn sampling(p: &SamplingParams) -> Result<Generation, Status> {
    if p.prompt_logprobs.is_some() {
        return Err(refuse("sampling_params.prompt_logprobs", "prompt log-probabilities are not simulated"));
    }
    if p.logprobs.is_some() {
        return Err(refuse(
            "sampling_params.logprobs",
            "log-probabilities are not simulated over gRPC (the HTTP routes have them)",
        ));
    }
    if !p.logit_bias.is_empty() {
        return Err(refuse("sampling_params.logit_bias", "token biases are not simulated"));
    }
    let structured = match &p.constraint {
        None => None,
        Some(Constraint::JsonObject(false)) => None,
        Some(Constraint::JsonObject(true)) => Some(fields::Structured::JsonObject),
        Some(Constraint::JsonSchema(schema)) => json_schema("sampling_params.json_schema", schema)?,
        Some(Constraint::Regex(_)) => return Err(refuse("sampling_params.regex", "not simulated")),
        Some(Constraint::Grammar(_)) => return Err(refuse("sampling_params.grammar", "not simulated")),
        Some(Constraint::StructuralTag(_)) => {
            return Err(refuse("sampling_params.structural_tag", "not simulated"))
        }
        Some(Constraint::Choice(_)) => return Err(refuse("sampling_params.choice", "not simulated")),
    };
    generation(Sampling {
        max_tokens: ("sampling_params.max_tokens", p.max_tokens),
        min_tokens: ("sampling_params.min_tokens", p.min_tokens),
        stop: ("sampling_params.stop", &p.stop),
        stop_token_ids: &p.stop_token_ids,
        include_stop: p.include_stop_str_in_output,
        ignore_eos: p.ignore_eos,
        n: p.n,
        seed: p.seed.map(|s| i64::from(s) as u64),
        structured,
    })
}

/// The sampling parameters both protocols have, with their field names (which differ).
#[derive(Debug)]
pub struct Sampling<'a> {
    /// Most new tokens; absent runs to the model's end of sequence or the context window.
    pub max_tokens: (&'static str, Option<u32>),
    /// Fewest new tokens before a stop may end the output.
    pub min_tokens: (&'static str, u32),
    /// Stop strings.
    pub stop: (&'static str, &'a [String]),
    /// Stop token ids.
    pub stop_token_ids: &'a [u32],
    /// Keep the matched stop string in the output.
    pub include_stop: bool,
    /// Go on past the end-of-sequence token.
    pub ignore_eos: bool,
    /// Choices (0 is 1).
    pub n: u32,
    /// The sampling seed.
    pub seed: Option<u64>,
    /// A structured-output constraint.
    pub structured: Option<fields::Structured>,
}

/// The HTTP path's [`Generation`] from the parameters both protocols have.
pub fn generation(p: Sampling<'_>) -> Result<Generation, Status> {
    let (max_field, max_tokens) = p.max_tokens;
    let (min_field, min_tokens) = p.min_tokens;
    if max_tokens == Some(0) {
        return Err(refuse(max_field, "must be at least 1, got 0"));
    }
    if let Some(max) = max_tokens.filter(|&max| min_tokens > max) {
        return Err(refuse(
            min_field,
            &format!("{min_tokens} must be less than or equal to {max_field} ({max})"),
        ));
    }
    Ok(Generation {
        model: None,
        max_tokens: max_tokens.unwrap_or(u32::MAX),
        max_tokens_given: max_tokens.is_some(),
        stream: false,
        include_usage: false,
        continuous_usage: false,
        // Both servers tokenize a text prompt with the tokenizer's special tokens.
        add_special_tokens: true,
        seed: p.seed,
        stop: StopRules {
            strings: stop_strings(p.stop.0, p.stop.1)?,
            token_ids: p.stop_token_ids.to_vec(),
            min_tokens,
            include_stop: p.include_stop,
        },
        echo: false,
        // Without a token limit both servicers pass None: the output runs to the model's
        // end of sequence or the context window.
        default_to_context: true,
        ignore_eos: p.ignore_eos,
        n: choices(p.n)?,
        logprobs: None,
        // The gRPC stream carries token ids itself (from the engine's outputs).
        token_ids: false,
        structured: p.structured,
        tools: None,
        kv_transfer: KvTransfer::None,
    })
}

/// A JSON-schema constraint (`field` holds the schema as a JSON string) as the HTTP path's
/// `response_format`.
pub fn json_schema(field: &str, schema: &str) -> Result<Option<fields::Structured>, Status> {
    let schema: Value =
        serde_json::from_str(schema).map_err(|e| refuse(field, &format!("invalid JSON: {e}")))?;
    let format = json!({"type": "json_schema", "json_schema": {"name": "grpc", "schema": schema}});
    fields::response_format(&format).map_err(|e| Status::invalid_argument(format!("{field}: {}", e.message)))
}

/// `sampling_params.n`, 0 (proto3's default) read as 1, within the HTTP path's limits.
pub fn choices(n: u32) -> Result<u32, Status> {
    let n = if n == 0 { 1 } else { n };
    fields::n(&json!(n)).map_err(|e| Status::invalid_argument(format!("sampling_params.{}", e.message)))
}

/// Stop strings within the HTTP path's limits.
pub fn stop_strings(field: &str, stop: &[String]) -> Result<Vec<String>, Status> {
    check_stop_strings(stop).map_err(|why| refuse(field, &why))?;
    Ok(stop.to_vec())
}

/// `truncate_prompt_tokens` as vLLM applies it: keep the last `k` tokens; -1 keeps the
/// context window's worth.
pub fn truncate(mut tokens: Vec<u32>, k: Option<i32>, max_model_len: usize) -> Result<Vec<u32>, Status> {
    let field = "sampling_params.truncate_prompt_tokens";
    let keep = match k {
        None => return Ok(tokens),
        Some(-1) => max_model_len,
        Some(k) if k >= 1 => k as usize,
        Some(k) => return Err(refuse(field, &format!("must be -1 or at least 1, got {k}"))),
    };
    if keep > max_model_len {
        return Err(refuse(
            field,
            &format!(
                "{keep} is greater than max_model_len ({max_model_len}); select a smaller truncation size"
            ),
        ));
    }
    if tokens.len() > keep {
        tokens.drain(..tokens.len() - keep);
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::grpc::pb::{ChoiceConstraint, KvTransferParams, TokenizedInput};

    fn request(params: SamplingParams) -> GenerateRequest {
        GenerateRequest {
            request_id: "r".into(),
            input: Some(Input::Tokenized(TokenizedInput {
                original_text: String::new(),
                input_ids: vec![1, 2],
            })),
            sampling_params: Some(params),
            ..Default::default()
        }
    }

    fn refused(r: &GenerateRequest) -> String {
        let e = generate_request(r, false).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        e.message().to_string()
    }

    #[test]
    fn proto3_defaults_mean_unset() {
        let c = generate_request(&request(SamplingParams::default()), false).unwrap();
        let g = c.generation;
        assert_eq!((g.n, g.max_tokens_given, g.default_to_context, g.seed), (1, false, true, None));
        assert!(!g.stop.is_active() && g.structured.is_none() && g.kv_transfer == KvTransfer::None);
        assert_eq!(c.prompt, PromptInput::Ids(vec![1, 2]));
        // No sampling parameters at all reads the same.
        let bare = GenerateRequest { sampling_params: None, ..request(SamplingParams::default()) };
        assert_eq!(generate_request(&bare, false).unwrap().generation, g);
    }

    #[test]
    fn set_fields_act_as_in_the_http_path() {
        let p = SamplingParams {
            max_tokens: Some(7),
            min_tokens: 2,
            stop: vec!["end".into()],
            stop_token_ids: vec![9],
            ignore_eos: true,
            n: 3,
            seed: Some(-5),
            include_stop_str_in_output: true,
            temperature: Some(0.0),
            constraint: Some(Constraint::JsonObject(true)),
            ..Default::default()
        };
        let mut r = request(p);
        r.stream = true;
        let g = generate_request(&r, false).unwrap().generation;
        assert_eq!((g.max_tokens, g.max_tokens_given, g.n, g.stream, g.ignore_eos), (7, true, 3, true, true));
        assert_eq!(g.seed, Some(-5i64 as u64));
        assert_eq!(
            g.stop,
            StopRules { strings: vec!["end".into()], token_ids: vec![9], min_tokens: 2, include_stop: true }
        );
        assert_eq!(g.structured, Some(fields::Structured::JsonObject));
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { logprobs: Some(1), ..Default::default() }, "sampling_params.logprobs"),
            (
                SamplingParams { prompt_logprobs: Some(0), ..Default::default() },
                "sampling_params.prompt_logprobs",
            ),
            (
                SamplingParams { logit_bias: [(1, 5.0)].into(), ..Default::default() },
                "sampling_params.logit_bias",
            ),
            (
                SamplingParams { constraint: Some(Constraint::Regex("a".into())), ..Default::default() },
                "sampling_params.regex",
            ),
            (
                SamplingParams {
                    constraint: Some(Constraint::Choice(ChoiceConstraint { choices: vec!["a".into()] })),
                    ..Default::default()
                },
                "sampling_params.choice",
            ),
            (SamplingParams { max_tokens: Some(0), ..Default::default() }, "sampling_params.max_tokens"),
            (
                SamplingParams { max_tokens: Some(2), min_tokens: 3, ..Default::default() },
                "sampling_params.min_tokens",
            ),
            (SamplingParams { n: 1000, ..Default::default() }, "sampling_params.n"),
        ];
        for (p, field) in cases {
            let msg = refused(&request(p));
            assert!(msg.starts_with(field), "{field}: {msg}");
        }
        let mut r = request(SamplingParams::default());
        r.data_parallel_rank = Some(0);
        assert!(refused(&r).starts_with("data_parallel_rank"));
        let mut r = request(SamplingParams::default());
        r.kv_transfer_params = Some(KvTransferParams { remote_host: "h".into(), remote_port: 1 });
        assert!(refused(&r).starts_with("kv_transfer_params:"));
        let mut r = request(SamplingParams::default());
        r.kv_transfer_params_json = Some(r#"{"do_remote_decode":true}"#.into());
        assert!(refused(&r).starts_with("kv_transfer_params_json"));
        r.input = None;
        assert!(refused(&r).starts_with("input"));
    }

    #[test]
    fn kv_transfer_params_json_reads_as_the_http_field_with_a_connector() {
        let mut r = request(SamplingParams::default());
        r.kv_transfer_params_json = Some(r#"{"do_remote_decode":true}"#.into());
        assert_eq!(generate_request(&r, true).unwrap().generation.kv_transfer, KvTransfer::Prefill);
        r.kv_transfer_params_json = Some("[1]".into());
        assert_eq!(generate_request(&r, true).unwrap_err().code(), Code::InvalidArgument);
        r.kv_transfer_params_json = Some(r#"{"do_remote_prefill":true}"#.into());
        let e = generate_request(&r, true).unwrap_err();
        assert!(e.message().starts_with("kv_transfer_params_json"), "{}", e.message());
    }

    #[test]
    fn truncation_keeps_the_last_tokens() {
        assert_eq!(truncate(vec![1, 2, 3, 4], Some(2), 10).unwrap(), vec![3, 4]);
        assert_eq!(truncate(vec![1, 2, 3], Some(-1), 2).unwrap(), vec![2, 3]);
        assert_eq!(truncate(vec![1, 2], None, 1).unwrap(), vec![1, 2]);
        assert_eq!(truncate(vec![1], Some(0), 10).unwrap_err().code(), Code::InvalidArgument);
        assert_eq!(truncate(vec![1], Some(11), 10).unwrap_err().code(), Code::InvalidArgument);
    }
}
