//! SGLang's `GenerateRequest` and `EmbedRequest` into what the HTTP routes build, read as
//! SMG's SGLang servicer reads them: the sampling parameters are passed through as sent (the
//! proto warns that proto3's zeros are not SGLang's defaults, so a client sets them all) and
//! checked as SGLang's `SamplingParams.verify` checks them; `max_new_tokens` absent runs to the
//! context window; `n` 0 is 1. Fields mocker does not simulate are refused by name with
//! `INVALID_ARGUMENT`; fields that only shape a real model's distribution (temperature,
//! top-p/k, min-p, penalties) or only the detokenized text (which this token-id protocol
//! never carries) are accepted, as on the HTTP path.

use tonic::Status;

use super::convert::{self, refuse, Sampling};
use super::pb::sglang::grpc::scheduler::sampling_params::Constraint;
use super::pb::sglang::grpc::scheduler::{EmbedRequest, GenerateRequest, SamplingParams};
use crate::openai::request::{Generation, PromptInput};

/// Validates and converts a `GenerateRequest`.
pub fn generate_request(request: &GenerateRequest) -> Result<(Generation, PromptInput), Status> {
    let ids = tokenized(request.tokenized.as_ref().map(|t| &t.input_ids))?;
    if request.mm_inputs.is_some() {
        return Err(refuse("mm_inputs", "multimodal inputs are not simulated"));
    }
    let flags = [
        (request.return_logprob, "return_logprob", "log-probabilities are not simulated over gRPC"),
        (request.return_hidden_states, "return_hidden_states", "hidden states are not simulated"),
        (!request.input_embeds.is_empty(), "input_embeds", "input embeddings are not simulated"),
        (
            !request.custom_logit_processor.is_empty(),
            "custom_logit_processor",
            "custom logit processors are not simulated",
        ),
        (
            !request.lora_id.is_empty(),
            "lora_id",
            "no LoRA adapter is loaded: LoRA is not simulated on the sglang backend",
        ),
        (
            request.data_parallel_rank != 0,
            "data_parallel_rank",
            "pinning a request to a DP rank is not simulated; mocker sends each request to its \
             least-loaded rank",
        ),
        (
            request.require_reasoning,
            "require_reasoning",
            "reasoning tokens are not counted (reasoning_tokens is always 0)",
        ),
    ];
    if let Some((_, field, why)) = flags.iter().find(|(set, ..)| *set) {
        return Err(refuse(field, why));
    }
    if request.disaggregated_params.is_some() {
        return Err(refuse(
            "disaggregated_params",
            "prefill/decode disaggregation is not simulated over gRPC (the HTTP routes have the \
             bootstrap fields)",
        ));
    }
    // logprob_start_len, top_logprobs_num and token_ids_logprob act only with return_logprob
    // (refused above), as in SGLang; timestamp and log_metrics are request metadata.
    let mut generation = sampling(&request.sampling_params.clone().unwrap_or_default())?;
    generation.stream = request.stream;
    Ok((generation, PromptInput::Ids(ids)))
}

/// Validates an `EmbedRequest`; its token ids.
pub fn embed_request(request: &EmbedRequest) -> Result<Vec<u32>, Status> {
    let ids = tokenized(request.tokenized.as_ref().map(|t| &t.input_ids))?;
    if request.mm_inputs.is_some() {
        return Err(refuse("mm_inputs", "multimodal inputs are not simulated"));
    }
    if request.is_cross_encoder || !request.texts.is_empty() {
        let field = if request.is_cross_encoder { "is_cross_encoder" } else { "texts" };
        return Err(refuse(field, "cross-encoder scoring is not simulated"));
    }
    if request.data_parallel_rank != 0 {
        return Err(refuse("data_parallel_rank", "pinning a request to a DP rank is not simulated"));
    }
    // sampling_params is a placeholder SGLang's servicer overrides (max_new_tokens 0), and
    // token_type_ids only feed a real encoder's embedding layer.
    Ok(ids)
}

fn tokenized(ids: Option<&Vec<u32>>) -> Result<Vec<u32>, Status> {
    match ids {
        None => Err(refuse("tokenized", "Tokenized input must be provided")),
        Some(ids) if ids.is_empty() => Err(refuse("tokenized.input_ids", "the prompt must not be empty")),
        Some(ids) => Ok(ids.clone()),
    }
}

/// SGLang's `SamplingParams.verify` ranges for the knobs that only shape a distribution.
fn check_ranges(p: &SamplingParams) -> Result<(), Status> {
    let penalty = |x: f32| (-2.0..=2.0).contains(&x);
    let checks = [
        (p.temperature >= 0.0, "temperature", "must be non-negative", p.temperature),
        (p.top_p > 0.0 && p.top_p <= 1.0, "top_p", "must be in (0, 1]", p.top_p),
        (p.top_k == -1 || p.top_k >= 1, "top_k", "must be -1 (disable) or at least 1", p.top_k as f32),
        ((0.0..=1.0).contains(&p.min_p), "min_p", "must be in [0, 1]", p.min_p),
        (penalty(p.frequency_penalty), "frequency_penalty", "must be in [-2, 2]", p.frequency_penalty),
        (penalty(p.presence_penalty), "presence_penalty", "must be in [-2, 2]", p.presence_penalty),
        (
            p.repetition_penalty > 0.0 && p.repetition_penalty <= 2.0,
            "repetition_penalty",
            "must be in (0, 2]",
            p.repetition_penalty,
        ),
    ];
    match checks.iter().find(|(ok, ..)| !ok) {
        // proto3 sends 0 for an unset number: the message says so, as the proto's own warning does.
        Some((_, field, why, value)) => Err(refuse(
            &format!("sampling_params.{field}"),
            &format!("{why}, got {value} (SGLang reads every field as sent: set them all)"),
        )),
        None => Ok(()),
    }
}

/// The sampling parameters as the HTTP path's [`Generation`].
fn sampling(p: &SamplingParams) -> Result<Generation, Status> {
    check_ranges(p)?;
    let structured = match &p.constraint {
        None => None,
        Some(Constraint::JsonSchema(schema)) => convert::json_schema("sampling_params.json_schema", schema)?,
        Some(Constraint::Regex(_)) => return Err(refuse("sampling_params.regex", "not simulated")),
        Some(Constraint::EbnfGrammar(_)) => {
            return Err(refuse("sampling_params.ebnf_grammar", "not simulated"))
        }
        Some(Constraint::StructuralTag(_)) => {
            return Err(refuse("sampling_params.structural_tag", "not simulated"))
        }
    };
    if !p.logit_bias.is_empty() {
        return Err(refuse("sampling_params.logit_bias", "token biases are not simulated"));
    }
    if p.custom_params.is_some() {
        return Err(refuse(
            "sampling_params.custom_params",
            "custom logit-processor parameters are not simulated",
        ));
    }
    if let Some(k) = p.stream_interval.filter(|&k| k != 1) {
        return Err(refuse(
            "sampling_params.stream_interval",
            &format!("only 1 (a chunk per token) is simulated, got {k}"),
        ));
    }
    // skip_special_tokens and spaces_between_special_tokens shape detokenized text only.
    convert::generation(Sampling {
        max_tokens: ("sampling_params.max_new_tokens", p.max_new_tokens),
        min_tokens: ("sampling_params.min_new_tokens", p.min_new_tokens),
        stop: ("sampling_params.stop", &p.stop),
        stop_token_ids: &p.stop_token_ids,
        // SGLang trims a matched stop string from the output unless no_stop_trim.
        include_stop: p.no_stop_trim,
        ignore_eos: p.ignore_eos,
        n: p.n,
        // SGLang's SamplingParams has no seed (its sampling_seed is not in this protocol).
        seed: None,
        structured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::grpc::pb::sglang::grpc::scheduler::{DisaggregatedParams, TokenizedInput};
    use crate::openai::fields::Structured;
    use crate::output::stop::StopRules;
    use tonic::Code;

    /// What SMG's router sends for an OpenAI request with no sampling knobs.
    fn params() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            repetition_penalty: 1.0,
            ..Default::default()
        }
    }

    fn request(p: SamplingParams) -> GenerateRequest {
        GenerateRequest {
            request_id: "r".into(),
            tokenized: Some(TokenizedInput { original_text: "hi".into(), input_ids: vec![1, 2] }),
            sampling_params: Some(p),
            ..Default::default()
        }
    }

    fn refused(r: &GenerateRequest) -> String {
        let e = generate_request(r).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        e.message().to_string()
    }

    #[test]
    fn unset_limits_run_to_the_context_window() {
        let (g, prompt) = generate_request(&request(params())).unwrap();
        assert_eq!(prompt, PromptInput::Ids(vec![1, 2]));
        assert_eq!((g.n, g.max_tokens_given, g.default_to_context, g.stream), (1, false, true, false));
        assert!(!g.stop.is_active() && g.structured.is_none() && g.seed.is_none());
    }

    #[test]
    fn set_fields_act_as_in_the_http_path() {
        let p = SamplingParams {
            max_new_tokens: Some(7),
            min_new_tokens: 2,
            stop: vec!["end".into()],
            stop_token_ids: vec![9],
            ignore_eos: true,
            no_stop_trim: true,
            n: 3,
            temperature: 0.0,
            stream_interval: Some(1),
            skip_special_tokens: true,
            constraint: Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into())),
            ..params()
        };
        let mut r = request(p);
        r.stream = true;
        let (g, _) = generate_request(&r).unwrap();
        assert_eq!((g.max_tokens, g.max_tokens_given, g.n, g.stream, g.ignore_eos), (7, true, 3, true, true));
        assert_eq!(
            g.stop,
            StopRules { strings: vec!["end".into()], token_ids: vec![9], min_tokens: 2, include_stop: true }
        );
        assert!(matches!(g.structured, Some(Structured::Schema(_))), "{:?}", g.structured);
    }

    #[test]
    fn unsupported_fields_and_bad_ranges_are_refused_by_name() {
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams::default(), "sampling_params.top_p"),
            (SamplingParams { top_k: 0, ..params() }, "sampling_params.top_k"),
            (SamplingParams { temperature: -1.0, ..params() }, "sampling_params.temperature"),
            (SamplingParams { presence_penalty: 3.0, ..params() }, "sampling_params.presence_penalty"),
            (SamplingParams { max_new_tokens: Some(0), ..params() }, "sampling_params.max_new_tokens"),
            (
                SamplingParams { max_new_tokens: Some(2), min_new_tokens: 3, ..params() },
                "sampling_params.min_new_tokens",
            ),
            (
                SamplingParams { logit_bias: [("5".into(), 1.0)].into(), ..params() },
                "sampling_params.logit_bias",
            ),
            (SamplingParams { stream_interval: Some(4), ..params() }, "sampling_params.stream_interval"),
            (
                SamplingParams { constraint: Some(Constraint::Regex("a".into())), ..params() },
                "sampling_params.regex",
            ),
            (
                SamplingParams { constraint: Some(Constraint::EbnfGrammar("a".into())), ..params() },
                "sampling_params.ebnf_grammar",
            ),
            (
                SamplingParams { custom_params: Some(prost_types::Struct::default()), ..params() },
                "sampling_params.custom_params",
            ),
            (SamplingParams { n: 1000, ..params() }, "sampling_params.n"),
        ];
        for (p, field) in cases {
            let msg = refused(&request(p));
            assert!(msg.starts_with(field), "{field}: {msg}");
        }
        type Set = fn(&mut GenerateRequest);
        let requests: Vec<(Set, &str)> = vec![
            (|r| r.return_logprob = true, "return_logprob"),
            (|r| r.return_hidden_states = true, "return_hidden_states"),
            (|r| r.lora_id = "a".into(), "lora_id"),
            (|r| r.data_parallel_rank = 1, "data_parallel_rank"),
            (|r| r.require_reasoning = true, "require_reasoning"),
            (|r| r.input_embeds = vec![0.5], "input_embeds"),
            (|r| r.custom_logit_processor = "x".into(), "custom_logit_processor"),
            (|r| r.disaggregated_params = Some(DisaggregatedParams::default()), "disaggregated_params"),
            (|r| r.tokenized = None, "tokenized"),
            (|r| r.tokenized = Some(TokenizedInput::default()), "tokenized.input_ids"),
        ];
        for (set, field) in requests {
            let mut r = request(params());
            set(&mut r);
            let msg = refused(&r);
            assert!(msg.starts_with(&format!("{field}:")), "{field}: {msg}");
        }
    }

    #[test]
    fn embed_requests_need_tokens_and_refuse_cross_encoding() {
        let r = EmbedRequest {
            tokenized: Some(TokenizedInput { original_text: String::new(), input_ids: vec![4, 5] }),
            sampling_params: Some(SamplingParams::default()),
            token_type_ids: vec![0, 0],
            ..Default::default()
        };
        assert_eq!(embed_request(&r).unwrap(), vec![4, 5]);
        let cross = EmbedRequest { is_cross_encoder: true, ..r.clone() };
        assert!(embed_request(&cross).unwrap_err().message().starts_with("is_cross_encoder"));
        let none = EmbedRequest { tokenized: None, ..r };
        assert!(embed_request(&none).unwrap_err().message().starts_with("tokenized"));
    }
}
