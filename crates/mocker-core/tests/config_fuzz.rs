//! Engine args fuzzed through the real path: parse, validate, build the engine, run a few
//! requests. Whatever the JSON, the outcome is a config error naming a field, an engine
//! error, or a working engine; never a panic, a hang or a huge allocation.

use mocker_core::config::LaunchConfig;
use mocker_core::{Engine, EngineOptions, Request};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Numbers at and around the boundaries of the engine's internal types (the accepted
/// bounds themselves three times as often as values past them), and now and then a wrong
/// type.
fn number() -> BoxedStrategy<Value> {
    let inside = [1u64, 2, 7, 16, 64, 256, 8192, 65_536, 1 << 20, 1 << 30];
    let outside = [
        0u64,
        65_537,
        (1 << 20) + 1,
        (1 << 30) + 1,
        1 << 31,
        u32::MAX as u64,
        1 << 32,
        (1 << 32) + 1,
        1 << 40,
        u64::MAX,
    ];
    let floats = [-1.0, -0.0, 0.0, 1e-300, 1e-9, 1e-3, 0.5, 1.0, 2.5, 1e6, 1e9, 1e300, f64::MAX];
    prop_oneof![
        9 => proptest::sample::select(inside.to_vec()).prop_map(Value::from),
        3 => proptest::sample::select(outside.to_vec()).prop_map(Value::from),
        4 => proptest::sample::select(floats.to_vec()).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => wrong_type(),
    ]
    .boxed()
}

fn wrong_type() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        Just(json!("64")),
        Just(json!([1])),
        Just(json!({}))
    ]
    .boxed()
}

/// A value for `key`: the right kind mostly, anything now and then.
fn value_for(key: &'static str) -> BoxedStrategy<Value> {
    let choices: &[&str] = match key {
        "preemption_mode" => &["lifo", "fifo"],
        "eviction_policy" => &["lru", "lineage"],
        "enable_prefix_caching" | "enable_chunked_prefill" | "emit_kv_events" => {
            return prop_oneof![8 => any::<bool>().prop_map(Value::from), 1 => wrong_type()].boxed()
        }
        _ => return number(),
    };
    let names: Vec<Value> = choices.iter().map(|c| json!(c)).collect();
    prop_oneof![8 => proptest::sample::select(names), 1 => wrong_type()].boxed()
}

const ENGINE_KEYS: [&str; 18] = [
    "num_gpu_blocks",
    "block_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "prefill_schedule_interval",
    "prefill_decode_interval",
    "speedup_ratio",
    "decode_speedup_ratio",
    "aic_nextn",
    "aic_mtp_seed",
    "kv_transfer_bytes_per_token",
    "kv_transfer_bandwidth",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "emit_kv_events",
    "preemption_mode",
    "eviction_policy",
];
const SGLANG_KEYS: [&str; 4] =
    ["max_prefill_tokens", "chunked_prefill_size", "clip_max_new_tokens", "schedule_conservativeness"];
const LAUNCH_KEYS: [&str; 3] = ["dp_size", "tensor_parallel_size", "startup_time"];

fn subset<const N: usize>(keys: [&'static str; N]) -> impl Strategy<Value = Map<String, Value>> {
    let pair = proptest::sample::select(keys.to_vec()).prop_flat_map(|k| (Just(k), value_for(k)));
    proptest::collection::vec(pair, 0..4)
        .prop_map(|kv| kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn engine_args() -> impl Strategy<Value = Value> {
    let backend = proptest::sample::select(vec!["vllm", "sglang", "trtllm"]);
    let timing = prop_oneof![
        2 => Just(None),
        1 => (number(), number()).prop_map(|(p, d)| Some(json!({"type": "fixed", "prefill_ms": p, "decode_ms": d}))),
    ];
    (backend, subset(ENGINE_KEYS), subset(SGLANG_KEYS), subset(LAUNCH_KEYS), timing).prop_map(
        |(backend, mut engine, sglang, launch, timing)| {
            engine.insert("backend".into(), json!(backend));
            if !sglang.is_empty() {
                engine.insert("sglang".into(), Value::Object(sglang));
            }
            if let Some(t) = timing {
                engine.insert("timing_model".into(), t);
            }
            let mut top = launch;
            top.insert("engine".into(), Value::Object(engine));
            Value::Object(top)
        },
    )
}

/// Builds the engine from `args` and runs three small requests for a bounded number of
/// passes. Returns what happened, for the failure message.
fn exercise(args: &Value) -> String {
    let launch = match LaunchConfig::from_value(args.clone()) {
        Ok(l) => l,
        Err(e) => {
            assert!(!e.field.is_empty() && !e.message.is_empty(), "unnamed error {e:?}");
            return format!("config error {e}");
        }
    };
    let options = EngineOptions { config: launch.engine, record_kv_events: true, ..Default::default() };
    let mut engine = match Engine::new(options) {
        Ok(e) => e,
        Err(e) => return format!("engine error {e}"),
    };
    for i in 0..3u32 {
        let tokens = (0..200 + 50 * i).map(|t| t % 37 + i).collect();
        let request = Request { uuid: u128::from(i) + 1, tokens, max_output_tokens: 8, ..Default::default() };
        if let Err(e) = engine.submit(request) {
            return format!("submit error {e}");
        }
    }
    let mut now = 0;
    for _ in 0..200 {
        if !engine.has_work() {
            break;
        }
        now = engine.step(now).end_ns.max(now);
    }
    engine.check_invariants().expect("engine invariants hold");
    "ran".into()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fuzzed_engine_args_never_panic(args in engine_args()) {
        exercise(&args);
    }
}

/// The values the attack run found, each refused by name and range.
#[test]
fn reported_values_are_refused_by_name() {
    for (args, field) in [
        (json!({"engine": {"block_size": 4294967296u64}}), "engine.block_size"),
        (json!({"engine": {"block_size": 4294967297u64}}), "engine.block_size"),
        (json!({"engine": {"num_gpu_blocks": 1099511627776u64}}), "engine.num_gpu_blocks"),
        (json!({"block_size": 4294967296u64}), "engine.block_size"),
    ] {
        let out = exercise(&args);
        assert!(out.starts_with(&format!("config error {field}: must be in 1..=")), "{args}: {out}");
    }
}
