//! Config tests: every input form, rule and message, end to end through the constructors.

use super::*;
use serde_json::json;

fn parse(s: &str) -> LaunchConfig {
    LaunchConfig::from_json_str(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn err(s: &str) -> ConfigError {
    match LaunchConfig::from_json_str(s) {
        Ok(c) => panic!("{s} unexpectedly parsed: {c:?}"),
        Err(e) => e,
    }
}

/// Each non-blank line is `<expected field> <json that must fail>`.
fn assert_fields(table: &str) -> Vec<ConfigError> {
    let lines = table.lines().map(str::trim).filter(|l| !l.is_empty());
    let check = |line: &str| {
        let (field, json) = line.split_once(' ').unwrap();
        let e = err(json.trim());
        assert_eq!(e.field, field, "{json} -> {e}");
        e
    };
    lines.map(check).collect()
}

#[test]
fn defaults_match_reference_dump() {
    let d = LaunchConfig::default();
    assert_eq!(parse(""), d);
    assert_eq!(parse("{}"), d);
    assert_eq!(parse(r#"{"engine":{}}"#), d);
    assert_eq!(d.engine.total_kv_tokens(), 16384 * 64);
    let text = include_str!("../../tests/data/reference_default_launch.json");
    let reference: Value = serde_json::from_str(text).unwrap();
    // Compare as text too, so key order matches and dumps diff cleanly.
    let ours = d.to_canonical_json();
    assert_eq!(ours.to_string(), reference.to_string());
}

#[test]
fn backend_native_block_size_only_when_omitted() {
    assert_eq!(parse(r#"{"engine":{"backend":"sglang"}}"#).engine.block_size, 1);
    assert_eq!(parse(r#"{"engine":{"backend":"trtllm"}}"#).engine.block_size, 32);
    let c = parse(r#"{"engine":{"backend":"trtllm","block_size":null}}"#);
    assert_eq!(c.engine.block_size, 32);
    let c = parse(r#"{"engine":{"backend":"sglang","block_size":16}}"#);
    assert_eq!(c.engine.block_size, 16);
}

#[test]
fn flat_and_nested_forms_agree() {
    let nested = parse(
        r#"{"engine":{"backend":"sglang","block_size":16,"num_gpu_blocks":100,
           "worker_type":"prefill","aic_nextn":2,"kv_transfer_bytes_per_token":128,
           "sglang":{"schedule_policy":"lpm"}},
           "dp_size":2,"dynamo":{"zmq_kv_events_port":5557,"zmq_replay_port":5558}}"#,
    );
    let flat = parse(
        r#"{"engine_type":"sglang","sglang":{"page_size":16,"schedule_policy":"lpm"},
           "num_gpu_blocks":100,"is_prefill":true,"ais_nextn":2,"kv_bytes_per_token":128,
           "dp_size":2,"zmq_kv_events_port":5557,"dynamo":{"zmq_replay_port":5558}}"#,
    );
    assert_eq!(flat, nested);
    assert!(nested.num_gpu_blocks_is_explicit);
    let c = parse(r#"{"engine":{"num_gpu_blocks":9},"num_gpu_blocks_is_explicit":false}"#);
    assert!(!c.num_gpu_blocks_is_explicit);
    assert_eq!(nested.engine.aic_nextn_accept_rates.as_deref(), Some("0.85,0.3"));
    let canonical = nested.to_canonical_json();
    assert_eq!(canonical["engine"]["kv_transfer_bytes_per_token"], json!(128));
    assert_eq!(LaunchConfig::from_value(canonical).unwrap(), nested);
    let c = parse(r#"{"block_size":0,"engine_type":"trtllm","is_decode":true}"#);
    assert_eq!((c.engine.block_size, c.engine.worker_type), (32, WorkerType::Decode));
    let c = parse(r#"{"block_size":16,"sglang":{"page_size":16}}"#);
    assert_eq!(c.engine.block_size, 16);
}

#[test]
fn flat_form_conflicts() {
    let errors = assert_fields(
        r#"
        is_prefill {"is_prefill":true,"is_decode":true}
        worker_type {"is_prefill":false,"worker_type":"decode"}
        is_prefill {"is_prefill":1}
        engine_type {"backend":"vllm","engine_type":"vllm"}
        ais_nextn {"ais_nextn":2,"aic_nextn":2}
        engine.kv_bytes_per_token {"kv_bytes_per_token":null,"kv_transfer_bytes_per_token":1}
        sglang.page_size {"block_size":32,"sglang":{"page_size":16}}
        zmq_replay_port {"zmq_replay_port":1,"dynamo":{"zmq_replay_port":2}}
        watermark {"watermark":0.01}
        "#,
    );
    assert!(errors[3].message.starts_with("duplicate field"), "{}", errors[3]);
    assert!(errors[8].message.contains("engine_type, ais_nextn"), "{}", errors[8]);
}

#[test]
fn every_validation_rule_names_its_field() {
    assert_fields(
        r#"
        engine.num_gpu_blocks {"engine":{"num_gpu_blocks":0}}
        engine.block_size {"engine":{"block_size":1}}
        engine.block_size {"engine":{"backend":"trtllm","block_size":1}}
        engine.block_size {"engine":{"backend":"sglang","block_size":0}}
        engine.max_model_len {"engine":{"max_model_len":0}}
        engine.max_num_seqs {"engine":{"max_num_seqs":0}}
        engine.max_num_batched_tokens {"engine":{"max_num_batched_tokens":0}}
        engine.prefill_schedule_interval {"engine":{"prefill_schedule_interval":0}}
        engine.prefill_schedule_interval {"engine":{"backend":"trtllm","prefill_schedule_interval":2}}
        engine.prefill_decode_interval {"engine":{"prefill_decode_interval":2}}
        engine.enable_chunked_prefill {"engine":{"backend":"sglang","enable_chunked_prefill":false}}
        engine.eviction_policy {"engine":{"backend":"sglang","eviction_policy":"lineage"}}
        engine.eviction_policy {"engine":{"eviction_policy":"LRU"}}
        engine.speedup_ratio {"engine":{"speedup_ratio":-1}}
        engine.decode_speedup_ratio {"engine":{"decode_speedup_ratio":-0.5}}
        engine.aic_nextn {"engine":{"aic_nextn":0}}
        engine.aic_nextn {"engine":{"aic_nextn":6}}
        engine.aic_nextn {"engine":{"aic_nextn":2,"decode_speedup_ratio":2}}
        engine.aic_nextn_accept_rates {"engine":{"aic_nextn_accept_rates":"0.5"}}
        engine.aic_nextn_accept_rates {"engine":{"aic_nextn":2,"aic_nextn_accept_rates":"0.5,1.5"}}
        engine.aic_nextn_accept_rates {"engine":{"aic_nextn":2,"aic_nextn_accept_rates":"0.5,,0"}}
        engine.emit_kv_token_ids {"engine":{"emit_kv_token_ids":true}}
        engine.kv_transfer_bytes_per_token {"engine":{"kv_transfer_bytes_per_token":0}}
        engine.kv_transfer_bandwidth {"engine":{"kv_transfer_bandwidth":-1}}
        engine.timing_model.prefill_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":-1,"decode_ms":1}}}
        engine.timing_model.decode_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":1,"decode_ms":-1}}}
        engine.timing_model.decode_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":1}}}
        engine.timing_model.type {"engine":{"timing_model":{}}}
        engine.timing_model.type {"engine":{"timing_model":{"type":"bogus"}}}
        engine.timing_model.provider {"engine":{"timing_model":{"type":"external","provider":"foo"}}}
        engine.timing_model.config.path {"engine":{"timing_model":{"type":"external","provider":"dynamo_profile"}}}
        engine.trtllm.capacity_scheduler_policy {"engine":{"trtllm":{"capacity_scheduler_policy":"max_utilization"}}}
        engine.sglang.max_prefill_tokens {"engine":{"backend":"sglang","sglang":{"max_prefill_tokens":0}}}
        engine.sglang.chunked_prefill_size {"engine":{"backend":"sglang","sglang":{"chunked_prefill_size":0}}}
        engine.sglang.chunked_prefill_size {"engine":{"backend":"sglang","block_size":7}}
        engine.sglang.schedule_conservativeness {"engine":{"backend":"sglang","sglang":{"schedule_conservativeness":-1}}}
        dp_size {"engine":{},"dp_size":0}
        tensor_parallel_size {"engine":{},"tensor_parallel_size":0}
        startup_time {"engine":{},"startup_time":-1}
        gpu_memory_utilization {"engine":{},"gpu_memory_utilization":1.5}
        mem_fraction_static {"engine":{},"mem_fraction_static":-0.1}
        free_gpu_memory_fraction {"engine":{},"free_gpu_memory_fraction":2}
        dynamo.handoff_session_timeout_ms {"engine":{},"dynamo":{"handoff_session_timeout_ms":0}}
        dynamo.router_queue_policy {"engine":{},"dynamo":{"router_queue_policy":"xyz"}}
        dynamo.reasoning.thinking_ratio {"dynamo":{"reasoning":{"start_thinking_token_id":1,"end_thinking_token_id":2,"thinking_ratio":1.5}}}
        dynamo.reasoning.end_thinking_token_id {"dynamo":{"reasoning":{"start_thinking_token_id":1,"thinking_ratio":0.5}}}
        "#,
    );
    // SGLang knobs would be inert for other backends, so they are refused there by name.
    let e =
        LaunchConfig::from_json_str(r#"{"engine":{"sglang":{"schedule_conservativeness":2}}}"#).unwrap_err();
    assert_eq!(e.field, "engine.sglang.schedule_conservativeness", "{e}");
    // Keys the reference accepts but mocker cannot act on are refused, not ignored.
    for (field, doc) in [
        ("dynamo.enable_local_indexer", r#"{"dynamo":{"enable_local_indexer":true}}"#),
        ("engine.preemption_mode", r#"{"engine":{"backend":"sglang","preemption_mode":"fifo"}}"#),
        ("engine.prefill_schedule_interval", r#"{"engine":{"prefill_schedule_interval":2}}"#),
    ] {
        let e = LaunchConfig::from_json_str(doc).unwrap_err();
        assert_eq!(e.field, field, "{doc}: {e}");
    }
    parse(r#"{"engine":{"prefill_schedule_interval":2},"dp_size":2}"#);
    // The rendezvous keys act in serve's SGLang prefill/decode workers; each front end
    // refuses or warns on them where they do not apply.
    parse(r#"{"dynamo":{"bootstrap_port":7000,"handoff_session_timeout_ms":5}}"#);
}

#[test]
fn messages_name_value_and_choices() {
    let messages: Vec<String> = assert_fields(
        r#"
        engine.preemption_mode {"engine":{"preemption_mode":"lru"}}
        engine.block_size {"engine":{"block_size":1}}
        engine.block_size {"engine":{"block_size":"64"}}
        engine.timing_model.provider {"engine":{"timing_model":{"type":"external","provider":"foo"}}}
        engine.block_size {"engine":{"block_size":64.0}}
        dynamo.bootstrap_port {"engine":{},"dynamo":{"bootstrap_port":70000}}
        engine.eviction_policy {"eviction_policy":"lfu"}
        engine.eviction_policy {"engine":{"backend":"sglang","eviction_policy":"lineage"}}
        engine_args [1]
        engine_args {not json
        "#,
    )
    .iter()
    .map(ToString::to_string)
    .collect();
    let expected_prefixes = [
        r#"engine.preemption_mode: invalid value "lru"; expected one of: lifo, fifo"#,
        "engine.block_size: must be at least 2 for vllm/trtllm (got 1)",
        r#"engine.block_size: invalid type: expected a non-negative integer, got string "64""#,
        r#"engine.timing_model.provider: unsupported external timing provider "foo"; "#,
        "engine.block_size: invalid type: expected a non-negative integer, got number 64.0",
        "dynamo.bootstrap_port: 70000 is out of range for u16",
        r#"engine.eviction_policy: invalid value "lfu"; expected one of: lru, lineage"#,
        "engine.eviction_policy: lineage is not supported for backend=sglang; expected lru",
    ];
    for (msg, want) in messages.iter().zip(expected_prefixes) {
        assert!(msg.starts_with(want), "{msg}");
    }
}

#[test]
fn unknown_fields_rejected_with_path() {
    let errors = assert_fields(
        r#"
        engine.bogus {"engine":{"bogus":1}}
        bogus {"engine":{},"bogus":1}
        engine.sglang.bogus {"engine":{"sglang":{"bogus":1}}}
        engine.sglang.page_size {"engine":{"sglang":{"page_size":16}}}
        engine.trtllm.x {"engine":{"trtllm":{"x":1}}}
        engine.timing_model.x {"engine":{"timing_model":{"type":"polynomial","x":1}}}
        dynamo.bogus {"engine":{},"dynamo":{"bogus":1}}
        dynamo.reasoning.x {"dynamo":{"reasoning":{"x":1}}}
        engine.engine_type {"engine":{"engine_type":"vllm"}}
        "#,
    );
    let want = "unknown field; expected one of: backend, num_gpu_blocks, block_size,";
    assert!(errors[0].message.starts_with(want), "{}", errors[0]);
}

#[test]
fn explicit_null_for_non_optional_is_an_error() {
    let errors = assert_fields(
        r#"
        engine.num_gpu_blocks {"engine":{"num_gpu_blocks":null}}
        engine.speedup_ratio {"engine":{"speedup_ratio":null}}
        engine.sglang {"engine":{"sglang":null}}
        engine.timing_model {"engine":{"timing_model":null}}
        engine {"engine":null}
        dynamo {"engine":{},"dynamo":null}
        dp_size {"engine":{},"dp_size":null}
        engine.max_num_seqs {"max_num_seqs":null}
        engine.eviction_policy {"engine":{"eviction_policy":null}}
        "#,
    );
    assert!(errors.iter().all(|e| e.message.contains("got null")), "{errors:?}");
    let c = parse(r#"{"engine":{"max_model_len":null,"aic_nextn":null},"dynamo":{"reasoning":null}}"#);
    assert_eq!(c, LaunchConfig::default());
}

#[test]
fn legacy_spellings_and_accept_rate_normalisation() {
    let c = parse(r#"{"engine":{"timing_model":{"type":"default"},"sglang":{"schedule_policy":"fcfs"}}}"#);
    assert_eq!(c.engine.timing_model, TimingModelConfig::Polynomial);
    assert_eq!(c.engine.sglang.schedule_policy, SglangSchedulePolicy::Fifo);
    for (n, raw, want) in [
        (3, None, "0.85,0.3,0"),
        (3, Some("0.9"), "0.9,0,0"),
        (2, Some("0.9,0.5,0.2"), "0.9,0.5"),
        (2, Some(" "), "0.85,0.3"),
        (2, Some("0.50, 1"), "0.5,1"),
    ] {
        let rates = raw.map_or(String::new(), |r| format!(r#","aic_nextn_accept_rates":"{r}""#));
        let c = parse(&format!(r#"{{"engine":{{"aic_nextn":{n}{rates}}}}}"#));
        assert_eq!(c.engine.aic_nextn_accept_rates.as_deref(), Some(want));
        assert_eq!(c.engine.mtp_accept_rates().len(), n);
    }
}

#[test]
fn from_arg_reads_at_file() {
    let name = format!("mocker-config-test-{}.json", std::process::id());
    let path = std::env::temp_dir().join(name);
    std::fs::write(&path, r#"{"block_size":16,"dp_size":2}"#).unwrap();
    let c = LaunchConfig::from_arg(&format!("@{}", path.display()));
    std::fs::remove_file(&path).unwrap();
    let c = c.unwrap();
    assert_eq!((c.engine.block_size, c.dp_size), (16, 2));
    assert_eq!(LaunchConfig::from_arg(r#"{"dp_size":3}"#).unwrap().dp_size, 3);
    let e = LaunchConfig::from_arg("@/nonexistent/mocker/args.json").unwrap_err();
    assert_eq!(e.field, "engine_args");
}

#[test]
fn eviction_policy_in_both_forms_and_omitted_from_canonical_when_lru() {
    let nested = parse(r#"{"engine":{"eviction_policy":"lineage","num_gpu_blocks":64}}"#);
    let flat = parse(r#"{"eviction_policy":"lineage","num_gpu_blocks":64}"#);
    assert_eq!(flat, nested);
    assert_eq!(nested.engine.eviction_policy, EvictionPolicy::Lineage);
    let c = parse(r#"{"engine":{"backend":"trtllm","eviction_policy":"lineage"}}"#);
    assert_eq!(c.engine.eviction_policy, EvictionPolicy::Lineage);
    // Non-default: in the dump, after preemption_mode, and read back unchanged.
    let canonical = nested.to_canonical_json();
    assert_eq!(canonical["engine"]["eviction_policy"], json!("lineage"));
    let keys: Vec<&String> = canonical["engine"].as_object().unwrap().keys().collect();
    let at = keys.iter().position(|k| *k == "eviction_policy").unwrap();
    assert_eq!(keys[at - 1], "preemption_mode");
    assert_eq!(LaunchConfig::from_value(canonical).unwrap(), nested);
    // Default (omitted or explicit): no key, exactly like the reference.
    let explicit = parse(r#"{"engine":{"eviction_policy":"lru"}}"#);
    assert_eq!(explicit, LaunchConfig::default());
    assert_eq!(EngineConfig::default().eviction_policy, EvictionPolicy::Lru);
    for c in [explicit, LaunchConfig::default()] {
        assert!(c.to_canonical_json()["engine"].get("eviction_policy").is_none());
    }
    assert_eq!(EvictionPolicy::ALL.iter().map(|p| p.as_str()).collect::<Vec<_>>(), ["lru", "lineage"]);
}

/// Values the engine cannot hold (u32 block ids and token counts, u64 ns) are refused by
/// name with the allowed range, not truncated or left to panic inside the engine.
#[test]
fn numeric_keys_have_upper_bounds_named_in_the_message() {
    let errors = assert_fields(
        r#"
        engine.block_size {"engine":{"block_size":4294967296}}
        engine.block_size {"engine":{"block_size":4294967297}}
        engine.block_size {"block_size":65537}
        engine.num_gpu_blocks {"engine":{"num_gpu_blocks":1099511627776}}
        engine.max_model_len {"engine":{"max_model_len":1073741825}}
        engine.max_num_seqs {"engine":{"max_num_seqs":1048577}}
        engine.max_num_batched_tokens {"engine":{"max_num_batched_tokens":18446744073709551615}}
        engine.prefill_schedule_interval {"engine":{"prefill_schedule_interval":1048577}}
        engine.prefill_decode_interval {"engine":{"backend":"sglang","prefill_decode_interval":1048577}}
        engine.speedup_ratio {"engine":{"speedup_ratio":1e-300}}
        engine.speedup_ratio {"engine":{"speedup_ratio":1e300}}
        engine.decode_speedup_ratio {"engine":{"decode_speedup_ratio":1e-9}}
        engine.kv_transfer_bytes_per_token {"engine":{"kv_transfer_bytes_per_token":1e300}}
        engine.kv_transfer_bandwidth {"engine":{"kv_transfer_bandwidth":1e-300}}
        engine.timing_model.prefill_ms {"engine":{"timing_model":{"type":"fixed","prefill_ms":1e300,"decode_ms":1}}}
        engine.sglang.max_prefill_tokens {"engine":{"backend":"sglang","sglang":{"max_prefill_tokens":1073741825}}}
        engine.sglang.chunked_prefill_size {"engine":{"backend":"sglang","sglang":{"chunked_prefill_size":2147483648}}}
        engine.sglang.clip_max_new_tokens {"engine":{"backend":"sglang","sglang":{"clip_max_new_tokens":1073741825}}}
        engine.sglang.schedule_conservativeness {"engine":{"backend":"sglang","sglang":{"schedule_conservativeness":1e9}}}
        dp_size {"engine":{},"dp_size":1025}
        tensor_parallel_size {"engine":{},"tensor_parallel_size":4096}
        startup_time {"engine":{},"startup_time":1e20}
        dynamo.handoff_session_timeout_ms {"engine":{},"dynamo":{"handoff_session_timeout_ms":18446744073709551615}}
        "#,
    );
    assert_eq!(errors[0].to_string(), "engine.block_size: must be in 1..=65536 (got 4294967296)");
    assert_eq!(errors[3].to_string(), "engine.num_gpu_blocks: must be in 1..=1073741824 (got 1099511627776)");
    // The bounds themselves are accepted.
    parse(r#"{"engine":{"block_size":65536,"num_gpu_blocks":1073741824,"max_num_seqs":1048576}}"#);
    parse(r#"{"engine":{"speedup_ratio":0,"decode_speedup_ratio":1e6,"kv_transfer_bandwidth":0}}"#);
}

#[test]
fn kv_cache_groups_echo_like_the_reference() {
    let c = parse(
        r#"{"engine":{"enable_prefix_caching":false,"kv_cache_capacity_bytes":100,
           "kv_cache_groups":[{"name":"a","kind":"attention","num_layers":1,"block_size_tokens":16,"page_size_bytes":10}]}}"#,
    );
    let e = &c.to_canonical_json()["engine"];
    let group = json!({"name": "a", "kind": "attention", "num_layers": 1, "block_size_tokens": 16,
                       "page_size_bytes": 10, "sliding_window": null});
    assert_eq!(e["kv_cache_groups"], json!([group]));
    assert_eq!(e["kv_cache_capacity_bytes"], json!(100));
    assert_eq!(LaunchConfig::from_value(c.to_canonical_json()).unwrap().engine, c.engine);
    let plain = LaunchConfig::default().to_canonical_json();
    assert!(
        plain["engine"].get("kv_cache_groups").is_none()
            && plain["engine"].get("kv_cache_capacity_bytes").is_none()
    );
    let e = err(r#"{"engine":{"enable_prefix_caching":false,"kv_cache_groups":null}}"#);
    assert_eq!(e.field, "engine.kv_cache_groups");
}

#[test]
fn state_cache_echoes_and_round_trips_like_the_reference() {
    let c = parse(
        r#"{"engine":{"block_size":16,"num_gpu_blocks":64,"kv_cache_bytes_per_token":64,
           "state_cache":{"bytes_per_request":4096},"prefix_match_unit":4}}"#,
    );
    let e = &c.to_canonical_json()["engine"];
    // The reference's _normalize_mocker_config echoes exactly these.
    assert_eq!(e["state_cache"], json!({"bytes_per_request": 4096}));
    assert_eq!(e["prefix_match_unit"], json!(4));
    assert_eq!(e["kv_cache_bytes_per_token"], json!(64));
    assert_eq!(c.engine.state_blocks(), Some(4));
    assert_eq!(LaunchConfig::from_value(c.to_canonical_json()).unwrap().engine, c.engine);
    let plain = LaunchConfig::default().to_canonical_json();
    assert!(
        plain["engine"].get("state_cache").is_none() && plain["engine"].get("prefix_match_unit").is_none()
    );
    // Null means absent, as in the reference.
    let c = parse(r#"{"engine":{"state_cache":null,"prefix_match_unit":null}}"#);
    assert_eq!(c.engine.state_cache, None);
    // A null geometry key is not explicit.
    let e = err(r#"{"engine":{"block_size":null,"num_gpu_blocks":64,"kv_cache_bytes_per_token":64,
                 "state_cache":{"bytes_per_request":4096}}}"#);
    assert!(e.message.contains("state_cache requires explicit num_gpu_blocks"), "{e}");
    // Rounded up: 1025 bytes in 1024-byte blocks (16 tokens of 64 bytes) take two.
    let c = parse(
        r#"{"engine":{"block_size":16,"num_gpu_blocks":64,"kv_cache_bytes_per_token":64,
           "state_cache":{"bytes_per_request":1025}}}"#,
    );
    assert_eq!(c.engine.state_blocks(), Some(2));
}
