//! The reference's hybrid-engine fixture (`tests/fixtures/hybrid_reference.json`, written by
//! `scripts/probe_hybrid_reference.py`, see docs/hybrid-kv.md) as mocker replays it: its
//! cases, their engines and workloads, and the tolerance figures are compared at. Shared by
//! the groups, state-cache and G3 reference tests.

#![allow(dead_code)]

use std::sync::Arc;

use mocker_core::config::LaunchConfig;
use mocker_replay::trace::load::parse_trace;
use mocker_replay::{Load, SyntheticWorkload, TraceFormat, TraceWorkload, Workload};
use serde_json::{json, Value};

pub const FIXTURE: &str = include_str!("../../../../tests/fixtures/hybrid_reference.json");
pub const CHAT: &str = include_str!("../data/hybrid_chat.jsonl");
/// The probe's `gen` of the chat workload the rows above were generated from.
pub const CHAT_GEN: &str = r#"{"seed": 11, "sessions": 40, "rate_per_s": 2.0, "groups": 4, "group_blocks": 8,
    "turns": 3, "first_new": [8, 24], "next_new": [4, 12], "out_range": [16, 64], "delay_ms": 300.0}"#;

pub fn cases() -> Vec<Value> {
    let doc: Value = serde_json::from_str(FIXTURE).expect("fixture parses");
    doc["cases"].as_array().expect("cases").clone()
}

pub fn launch(engine: &Value, dp_size: u64) -> Result<LaunchConfig, String> {
    LaunchConfig::from_value(json!({"engine": engine, "dp_size": dp_size})).map_err(|e| e.to_string())
}

/// A case's engine as mocker takes it: `kv_cache_bytes_per_token` without a state cache
/// (or host tier) does nothing in the reference, and mocker refuses a key that does
/// nothing (see `bytes_per_token_alone_is_refused_not_ignored`), so it is left out.
pub fn mocker_engine(engine: &Value) -> Value {
    let mut e = engine.clone();
    let m = e.as_object_mut().expect("engine object");
    if !m.contains_key("state_cache") && !m.contains_key("native_host_offload") {
        m.remove("kv_cache_bytes_per_token");
    }
    e
}

pub fn synthetic(w: &Value) -> SyntheticWorkload {
    let n = |k: &str| w[k].as_u64().map(|x| x as usize);
    let load = match (w["request_rate"].as_f64(), n("replay_concurrency")) {
        (Some(rate), _) => Load::RequestRate(rate),
        (None, Some(c)) => Load::Concurrency(c),
        (None, None) => panic!("workload without a load: {w}"),
    };
    SyntheticWorkload {
        input_tokens: n("input_tokens").unwrap(),
        output_tokens: n("output_tokens").unwrap(),
        request_count: n("request_count").unwrap(),
        load,
        arrival_seed: w["arrival_seed"].as_u64().unwrap_or(42),
        turns_per_session: n("turns_per_session").unwrap_or(1),
        shared_prefix_ratio: w["shared_prefix_ratio"].as_f64().unwrap_or(0.0),
        num_prefix_groups: n("num_prefix_groups").unwrap_or(0),
        inter_turn_delay_ms: w["inter_turn_delay_ms"].as_f64().unwrap_or(0.0),
        ..Default::default()
    }
}

/// The chat rows with every `input_length` shortened by `trim` (the probe's `write_trace`).
pub fn chat_rows(trim: u64) -> String {
    let mut out = String::new();
    for line in CHAT.lines().filter(|l| !l.trim().is_empty()) {
        let mut row: Value = serde_json::from_str(line).expect("chat row");
        let len = row["input_length"].as_u64().expect("input_length");
        row["input_length"] = json!(len - trim);
        out.push_str(&row.to_string());
        out.push('\n');
    }
    out
}

pub fn workload(w: &Value) -> Workload {
    match w["kind"].as_str() {
        Some("synthetic") => synthetic(w).into(),
        Some("mooncake") => {
            let gen: Value = serde_json::from_str(CHAT_GEN).unwrap();
            assert_eq!(w["gen"], gen, "only the chat workload's rows are stored");
            let rows = chat_rows(w["trim_tokens"].as_u64().unwrap_or(0));
            let block = w["trace_block_size"].as_u64().map(|b| b as usize);
            let trace = parse_trace(&rows, TraceFormat::Mooncake, block).expect("chat trace");
            Workload::Trace(TraceWorkload {
                trace: Arc::new(trace),
                concurrency: None,
                repeat: 1,
                lanes: None,
            })
        }
        other => panic!("workload kind {other:?} is not replayed here"),
    }
}

pub fn close(case: &str, key: &str, got: f64, want: f64) -> Option<String> {
    let ok = (got - want).abs() <= 1e-9 * want.abs().max(1e-9);
    (!ok).then(|| format!("{case} {key}: mocker {got}, reference {want}"))
}
