//! vLLM's `--kv-transfer-config` and a request's `kv_transfer_params`, as the NIXL
//! connector reads them; SGLang's PD fields (`bootstrap_host`, `bootstrap_port`,
//! `bootstrap_room`).

use serde_json::Value;

use crate::error::ApiError;

/// Which side of a disaggregated pair a server plays (vLLM's `kv_role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvRole {
    /// Prefill and decode requests both (`kv_both`, what vLLM's P/D examples run).
    Both,
    /// Prefill requests only (`kv_producer`).
    Producer,
    /// Decode requests only (`kv_consumer`).
    Consumer,
}

/// `--kv-transfer-config`: the connector and this server's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvTransferConfig {
    /// The role.
    pub role: KvRole,
}

impl KvTransferConfig {
    /// Parses vLLM's JSON (`{"kv_connector": "NixlConnector", "kv_role": ...}`). Keys
    /// vLLM has that change nothing here are named in the error rather than dropped.
    pub fn parse(json: &str) -> Result<Self, String> {
        let flag = "--kv-transfer-config";
        let value: Value = serde_json::from_str(json).map_err(|e| format!("{flag}: malformed JSON: {e}"))?;
        let Value::Object(map) = value else {
            return Err(format!("{flag}: expected a JSON object"));
        };
        for key in map.keys() {
            if !matches!(key.as_str(), "kv_connector" | "kv_role") {
                return Err(format!(
                    "{flag}: key {key:?} is not simulated (mocker reads kv_connector and kv_role)"
                ));
            }
        }
        match map.get("kv_connector").and_then(Value::as_str) {
            Some("NixlConnector") => {}
            Some(other) => {
                return Err(format!(
                    "{flag}: kv_connector {other:?} is not supported; mocker speaks the NixlConnector's \
                     HTTP contract (kv_transfer_params), so use \"NixlConnector\""
                ))
            }
            None => return Err(format!("{flag}: kv_connector is required (\"NixlConnector\")")),
        }
        let role = match map.get("kv_role").and_then(Value::as_str) {
            Some("kv_both") | None => KvRole::Both,
            Some("kv_producer") => KvRole::Producer,
            Some("kv_consumer") => KvRole::Consumer,
            Some(other) => {
                return Err(format!(
                    "{flag}: kv_role {other:?} is not one of kv_both, kv_producer, kv_consumer"
                ))
            }
        };
        Ok(Self { role })
    }
}

/// Where a decode request reads its prompt's KV from (the prefill answer's params).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotePrefill {
    /// The prefill server's engine id.
    pub engine_id: String,
    /// The prefill server's request id, when it sent one.
    pub request_id: Option<String>,
    /// The blocks it holds.
    pub block_ids: Vec<u64>,
    /// Its side channel.
    pub host: String,
    /// Its side channel's port.
    pub port: u16,
}

/// What a request's `kv_transfer_params` ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KvTransfer {
    /// Nothing (absent, or neither flag set).
    #[default]
    None,
    /// Prefill here and hold the KV for a remote decode (`do_remote_decode`).
    Prefill,
    /// Decode here from KV a remote prefill holds (`do_remote_prefill`).
    Decode(RemotePrefill),
    /// SGLang's PD fields: the prefill and the decode server both get the request with
    /// the prefill server's bootstrap address and a room number that pairs them.
    Bootstrap(BootstrapRoom),
}

/// SGLang's PD fields of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapRoom {
    /// The prefill server's bootstrap host.
    pub host: String,
    /// Its bootstrap port.
    pub port: u16,
    /// The room pairing the two requests.
    pub room: u64,
}

const BOOTSTRAP_FIELDS: [&str; 3] = ["bootstrap_host", "bootstrap_port", "bootstrap_room"];

impl BootstrapRoom {
    /// Reads SGLang's PD fields (`None` when all are absent or null; all three or none).
    fn from_request(body: &Value) -> Result<Option<Self>, ApiError> {
        let given: Vec<&str> =
            BOOTSTRAP_FIELDS.into_iter().filter(|k| body.get(*k).is_some_and(|v| !v.is_null())).collect();
        if given.is_empty() {
            return Ok(None);
        }
        if let Some(missing) = BOOTSTRAP_FIELDS.into_iter().find(|k| !given.contains(k)) {
            return Err(ApiError::invalid_field(
                missing,
                format!("{missing}: SGLang's PD requests carry bootstrap_host, bootstrap_port and bootstrap_room together"),
            ));
        }
        let host = match &body["bootstrap_host"] {
            Value::String(h) if !h.is_empty() => {
                crate::pd::check_host("bootstrap_host", h)?;
                h.clone()
            }
            other => {
                return Err(ApiError::invalid_field(
                    "bootstrap_host",
                    format!("bootstrap_host: expected a non-empty string, got {other}"),
                ))
            }
        };
        let port = body["bootstrap_port"].as_u64().and_then(|n| u16::try_from(n).ok()).filter(|&n| n > 0);
        let port = port.ok_or_else(|| {
            ApiError::invalid_field(
                "bootstrap_port",
                format!("bootstrap_port: expected a port number 1-65535, got {}", body["bootstrap_port"]),
            )
        })?;
        let room = body["bootstrap_room"].as_u64().ok_or_else(|| {
            ApiError::invalid_field(
                "bootstrap_room",
                format!("bootstrap_room: expected a non-negative integer, got {}", body["bootstrap_room"]),
            )
        })?;
        Ok(Some(Self { host, port, room }))
    }
}

const FIELD: &str = "kv_transfer_params";

fn bad(message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_field(FIELD, format!("{FIELD}: {message}"))
}

impl KvTransfer {
    /// Reads `kv_transfer_params` from a request body (`None` when absent or null).
    pub fn from_request(body: &Value) -> Result<Self, ApiError> {
        let room = BootstrapRoom::from_request(body)?;
        let Some(params) = body.get(FIELD).filter(|v| !v.is_null()) else {
            return Ok(room.map_or(Self::None, Self::Bootstrap));
        };
        if room.is_some() {
            return Err(bad("cannot be combined with SGLang's bootstrap_room (one PD protocol per request)"));
        }
        let Value::Object(p) = params else {
            return Err(bad("expected a JSON object"));
        };
        let flag = |name: &str| match p.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(bad(format!("{name} must be a boolean, got {other}"))),
        };
        let (remote_decode, remote_prefill) = (flag("do_remote_decode")?, flag("do_remote_prefill")?);
        match (remote_decode, remote_prefill) {
            (true, true) => Err(bad("do_remote_decode and do_remote_prefill cannot both be true")),
            (false, false) => Ok(Self::None),
            (true, false) => Ok(Self::Prefill),
            (false, true) => {
                let string = |name: &str| match p.get(name) {
                    Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                    other => Err(bad(format!(
                        "do_remote_prefill needs {name} as a non-empty string, got {}",
                        shown(other)
                    ))),
                };
                let block_ids = match p.get("remote_block_ids") {
                    Some(Value::Array(ids)) => ids
                        .iter()
                        .map(|v| {
                            v.as_u64().ok_or_else(|| {
                                bad(format!(
                                    "remote_block_ids must be a list of non-negative integers, got {v}"
                                ))
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    other => {
                        return Err(bad(format!(
                            "do_remote_prefill needs remote_block_ids as a list of integers, got {}",
                            shown(other)
                        )))
                    }
                };
                let port = match p.get("remote_port") {
                    Some(v) => v.as_u64().and_then(|n| u16::try_from(n).ok()).filter(|&n| n > 0),
                    None => None,
                }
                .ok_or_else(|| {
                    bad(format!(
                        "do_remote_prefill needs remote_port as a port number, got {}",
                        shown(p.get("remote_port"))
                    ))
                })?;
                let request_id = match p.get("remote_request_id") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(s.clone()),
                    Some(other) => {
                        return Err(bad(format!("remote_request_id must be a string, got {other}")))
                    }
                };
                let host = string("remote_host")?;
                crate::pd::check_host("kv_transfer_params.remote_host", &host)?;
                Ok(Self::Decode(RemotePrefill {
                    engine_id: string("remote_engine_id")?,
                    request_id,
                    block_ids,
                    host,
                    port,
                }))
            }
        }
    }
}

fn shown(v: Option<&Value>) -> String {
    v.map_or_else(|| "nothing".to_string(), Value::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(params: Value) -> Result<KvTransfer, ApiError> {
        KvTransfer::from_request(&json!({ "kv_transfer_params": params }))
    }

    #[test]
    fn the_proxys_two_requests_parse() {
        // What vLLM's toy proxy sends to the prefill server.
        let prefill = json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                             "remote_block_ids": null, "remote_host": null, "remote_port": null});
        assert_eq!(parse(prefill).unwrap(), KvTransfer::Prefill);
        let decode = json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "e1",
                            "remote_block_ids": [3, 4], "remote_host": "127.0.0.1", "remote_port": 8100,
                            "tp_size": 1, "remote_request_id": "cmpl-1"});
        let KvTransfer::Decode(r) = parse(decode).unwrap() else { panic!("decode") };
        assert_eq!((r.engine_id.as_str(), r.block_ids.as_slice(), r.port), ("e1", &[3u64, 4][..], 8100));
        assert_eq!(r.request_id.as_deref(), Some("cmpl-1"));
        assert_eq!(KvTransfer::from_request(&json!({})).unwrap(), KvTransfer::None);
        assert_eq!(parse(json!({"do_remote_decode": false})).unwrap(), KvTransfer::None);
    }

    #[test]
    fn malformed_params_name_the_field() {
        let base = json!({"do_remote_prefill": true, "remote_engine_id": "e", "remote_block_ids": [1],
                          "remote_host": "h", "remote_port": 1});
        for (key, value) in [
            ("remote_block_ids", json!("1,2")),
            ("remote_block_ids", json!([1, "2"])),
            ("remote_block_ids", json!([-1])),
            ("remote_engine_id", json!(7)),
            ("remote_port", json!(70000)),
            ("remote_host", json!(null)),
            ("do_remote_decode", json!(true)),
            ("do_remote_prefill", json!("yes")),
        ] {
            let mut p = base.clone();
            p[key] = value;
            let e = parse(p).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(FIELD), "{key}");
            assert_eq!(e.status, 400);
        }
        assert!(parse(json!([1])).is_err());
    }

    #[test]
    fn sglang_pd_fields_parse_all_together() {
        let r = KvTransfer::from_request(
            &json!({"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7}),
        )
        .unwrap();
        assert_eq!(r, KvTransfer::Bootstrap(BootstrapRoom { host: "127.0.0.1".into(), port: 8998, room: 7 }));
        for (body, field) in [
            (json!({"bootstrap_host": "h", "bootstrap_port": 1}), "bootstrap_room"),
            (json!({"bootstrap_host": "", "bootstrap_port": 1, "bootstrap_room": 0}), "bootstrap_host"),
            (json!({"bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 0}), "bootstrap_port"),
            (json!({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": -1}), "bootstrap_room"),
            (json!({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": "1"}), "bootstrap_room"),
            (
                json!({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1,
                       "kv_transfer_params": {"do_remote_decode": true}}),
                FIELD,
            ),
        ] {
            let e = KvTransfer::from_request(&body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn transfer_config_takes_vllms_json() {
        let c = KvTransferConfig::parse(r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#).unwrap();
        assert_eq!(c.role, KvRole::Both);
        assert_eq!(
            KvTransferConfig::parse(r#"{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}"#)
                .unwrap()
                .role,
            KvRole::Consumer
        );
        for bad in [
            r#"{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}"#,
            r#"{"kv_role":"kv_both"}"#,
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_sender"}"#,
            r#"{"kv_connector":"NixlConnector","kv_buffer_size":1e9}"#,
            "[]",
        ] {
            assert!(KvTransferConfig::parse(bad).unwrap_err().starts_with("--kv-transfer-config"), "{bad}");
        }
    }
}
