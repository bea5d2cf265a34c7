//! The gRPC codec: prost's encoding, with a decoder that refuses what prost would let pass.
//!
//! - A message prost cannot parse is `INVALID_ARGUMENT` (the client's fault), not prost
//!   codec's `INTERNAL`.
//! - Fields this protocol version does not have are `INVALID_ARGUMENT` naming the field
//!   number: prost drops unknown fields silently, and a setting a client believes it sent
//!   but the server never saw is exactly what mocker refuses everywhere else. The wire bytes
//!   are walked against the message's descriptor (from the compiled file descriptors), into
//!   nested messages too.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::OnceLock;

use bytes::Buf;
use prost::Message;
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

use super::pb::ALL_FILE_DESCRIPTOR_SET;

/// prost's codec with [`StrictDecoder`] (the generated server stubs use it).
#[derive(Debug, Clone)]
pub struct StrictCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for StrictCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + prost::Name + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(PhantomData)
    }
}

/// Decodes a request, refusing malformed bytes and unknown fields with `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(PhantomData<U>);

impl<U: Message + prost::Name + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let bytes = buf.copy_to_bytes(buf.remaining());
        let message = U::decode(bytes.clone())
            .map_err(|e| Status::invalid_argument(format!("malformed {} message: {e}", U::NAME)))?;
        check_known_fields(&bytes, &U::full_name()).map_err(Status::invalid_argument)?;
        Ok(Some(message))
    }
}

/// What a message's fields are, by number: the field's name and, for a message-typed field,
/// that message's full name.
#[derive(Debug, Default)]
struct MessageSchema {
    fields: HashMap<u32, (String, Option<String>)>,
}

/// Every message of the vendored files, by full name (`vllm.grpc.engine.SamplingParams`,
/// `sglang.grpc.scheduler.SamplingParams`).
fn schemas() -> &'static HashMap<String, MessageSchema> {
    static SCHEMAS: OnceLock<HashMap<String, MessageSchema>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let set =
            FileDescriptorSet::decode(ALL_FILE_DESCRIPTOR_SET).expect("the build wrote valid descriptors");
        let mut out = HashMap::new();
        for file in &set.file {
            for message in &file.message_type {
                add(&mut out, file.package(), message);
            }
        }
        out
    })
}

fn add(out: &mut HashMap<String, MessageSchema>, scope: &str, message: &DescriptorProto) {
    let name = format!("{scope}.{}", message.name());
    let mut schema = MessageSchema::default();
    for field in &message.field {
        let nested =
            (field.r#type() == Type::Message).then(|| field.type_name().trim_start_matches('.').to_string());
        schema.fields.insert(field.number() as u32, (field.name().to_string(), nested));
    }
    for nested in &message.nested_type {
        add(out, &name, nested);
    }
    out.insert(name, schema);
}

/// Most nested messages walked (the protocol's messages nest a few levels deep).
const MAX_DEPTH: usize = 32;

/// Checks that every field in `bytes` (an encoded `message`) is one the message has.
/// Called after prost parsed the bytes, so they are well formed.
pub fn check_known_fields(bytes: &[u8], message: &str) -> Result<(), String> {
    let short = message.rsplit('.').next().unwrap_or(message);
    walk(bytes, message, short, 0)
}

fn walk(mut buf: &[u8], message: &str, path: &str, depth: usize) -> Result<(), String> {
    let Some(schema) = schemas().get(message) else { return Ok(()) };
    let malformed = || format!("{path}: malformed message");
    while buf.has_remaining() {
        let key = prost::encoding::decode_varint(&mut buf).map_err(|_| malformed())?;
        let number = (key >> 3) as u32;
        let Some((name, nested)) = schema.fields.get(&number) else {
            return Err(format!(
                "{path}: unknown field number {number}: this server's {package} protocol has no such field \
                 (it would be ignored, so it is refused)",
                package = message.rsplit_once('.').map_or("", |(p, _)| p)
            ));
        };
        match key & 7 {
            0 => {
                prost::encoding::decode_varint(&mut buf).map_err(|_| malformed())?;
            }
            1 if buf.len() >= 8 => buf.advance(8),
            5 if buf.len() >= 4 => buf.advance(4),
            2 => {
                let len = prost::encoding::decode_varint(&mut buf).map_err(|_| malformed())?;
                let len = usize::try_from(len).ok().filter(|&l| l <= buf.len()).ok_or_else(malformed)?;
                if let Some(nested) = nested {
                    if depth >= MAX_DEPTH {
                        return Err(format!("{path}: messages nested too deeply"));
                    }
                    walk(&buf[..len], nested, &format!("{path}.{name}"), depth + 1)?;
                }
                buf.advance(len);
            }
            _ => return Err(malformed()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::grpc::pb::{GenerateRequest, SamplingParams, TokenizedInput};

    fn with_extra(mut bytes: Vec<u8>, number: u32) -> Vec<u8> {
        prost::encoding::encode_key(number, prost::encoding::WireType::Varint, &mut bytes);
        prost::encoding::encode_varint(7, &mut bytes);
        bytes
    }

    #[test]
    fn known_fields_pass_and_unknown_ones_are_named_with_their_path() {
        let request = GenerateRequest {
            request_id: "r".into(),
            input: Some(crate::api::grpc::pb::generate_request::Input::Tokenized(TokenizedInput {
                original_text: String::new(),
                input_ids: vec![1, 2, 3],
            })),
            sampling_params: Some(SamplingParams {
                max_tokens: Some(4),
                stop: vec!["x".into()],
                logit_bias: [(5, 1.0)].into(),
                ..Default::default()
            }),
            stream: true,
            ..Default::default()
        };
        let bytes = request.encode_to_vec();
        check_known_fields(&bytes, "vllm.grpc.engine.GenerateRequest").unwrap();
        let err = check_known_fields(&with_extra(bytes.clone(), 99), "vllm.grpc.engine.GenerateRequest")
            .unwrap_err();
        assert!(err.starts_with("GenerateRequest: unknown field number 99"), "{err}");
        // An unknown field inside the nested sampling parameters.
        let params = with_extra(SamplingParams { n: 2, ..Default::default() }.encode_to_vec(), 42);
        let mut outer = Vec::new();
        prost::encoding::encode_key(4, prost::encoding::WireType::LengthDelimited, &mut outer);
        prost::encoding::encode_varint(params.len() as u64, &mut outer);
        outer.extend(&params);
        let err = check_known_fields(&outer, "vllm.grpc.engine.GenerateRequest").unwrap_err();
        assert!(err.starts_with("GenerateRequest.sampling_params: unknown field number 42"), "{err}");
    }

    #[test]
    fn sglang_requests_are_checked_against_their_own_protocol() {
        use crate::api::grpc::pb::sglang::grpc::scheduler as sg;
        let request = sg::GenerateRequest {
            tokenized: Some(sg::TokenizedInput { original_text: String::new(), input_ids: vec![1] }),
            sampling_params: Some(sg::SamplingParams {
                top_p: 1.0,
                stop: vec!["x".into()],
                ..Default::default()
            }),
            timestamp: Some(prost_types::Timestamp { seconds: 1, nanos: 0 }),
            ..Default::default()
        };
        let name = "sglang.grpc.scheduler.GenerateRequest";
        check_known_fields(&request.encode_to_vec(), name).unwrap();
        let err = check_known_fields(&with_extra(request.encode_to_vec(), 30), name).unwrap_err();
        assert!(
            err.contains("unknown field number 30: this server's sglang.grpc.scheduler protocol"),
            "{err}"
        );
    }

    #[test]
    fn map_entries_and_empty_messages_are_walked() {
        let params = SamplingParams { logit_bias: [(1, 2.0), (3, -1.0)].into(), ..Default::default() };
        check_known_fields(&params.encode_to_vec(), "vllm.grpc.engine.SamplingParams").unwrap();
        let err = check_known_fields(&with_extra(Vec::new(), 1), "vllm.grpc.engine.HealthCheckRequest")
            .unwrap_err();
        assert!(err.contains("unknown field number 1"), "{err}");
    }
}
