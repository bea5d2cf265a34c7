//! Scaling in the loop against the reference (ai-dynamo-runtime 1.6.1): the cases of
//! `tests/fixtures/scaling_reference.json` (written by `scripts/probe_scaling_reference.py`,
//! see docs/scaling.md) replayed with the probe's own policies through mocker's replay API.
//! Deterministic (round-robin) cases must give the reference's summary, every snapshot the
//! policy saw and every lifecycle operation, to floating-point rounding; kv-router cases
//! (the reference breaks ties with an unseeded RNG) the same lifecycle shape.

use mocker_core::config::LaunchConfig;
use mocker_replay::router::KvRouterConfig;
use mocker_replay::scaling::{ClusterSnapshot, PolicyError, ScalingDecision, ScalingPolicy};
use mocker_replay::telemetry::TelemetrySample;
use mocker_replay::{
    run_replay, Cluster, Hooks, Load, Pool, ReplayError, ReplayOptions, ReplayOutcome, RouterMode, Sla,
    SyntheticWorkload,
};
use serde_json::{json, Value};

const FIXTURE: &str = include_str!("../../../tests/fixtures/scaling_reference.json");

fn cases() -> Vec<Value> {
    // Python wrote the error cases' non-finite arguments as bare NaN / Infinity.
    let text = FIXTURE.replace(":NaN", ":\"NaN\"").replace(":Infinity", ":\"Infinity\"");
    let doc: Value = serde_json::from_str(&text).expect("fixture parses");
    doc["cases"].as_array().expect("cases").clone()
}

fn case(name: &str) -> Value {
    cases().into_iter().find(|c| c["case"] == name).unwrap_or_else(|| panic!("no case {name}"))
}

/// The probe's `Timetable`: ticks at `first`, then every `every` ms (until `until`), asking
/// for the last plan step at or before the tick. Records what it saw.
struct Timetable {
    first: f64,
    every: Option<f64>,
    until: Option<f64>,
    plan: Vec<(f64, Option<usize>, Option<usize>)>,
    /// Overrides the next tick (the probe's raw T* policies).
    next: Option<fn(f64) -> Option<f64>>,
    snapshots: Vec<Value>,
}

impl Timetable {
    fn from_case(c: &Value) -> Self {
        let p = &c["policy"];
        let target = |v: &Value| v.as_u64().map(|x| x as usize);
        let plan = p["plan_at_ms_prefill_decode"]
            .as_array()
            .map(|steps| {
                steps.iter().map(|s| (s[0].as_f64().unwrap(), target(&s[1]), target(&s[2]))).collect()
            })
            .unwrap_or_default();
        let first = p["first_tick_ms"].as_f64().unwrap_or(0.0);
        Self {
            first,
            every: p["every_ms"].as_f64(),
            until: p["until_ms"].as_f64(),
            plan,
            next: None,
            snapshots: vec![],
        }
    }
}

impl ScalingPolicy for Timetable {
    fn initial_tick_ms(&mut self) -> Result<f64, PolicyError> {
        Ok(self.first)
    }

    fn on_tick(&mut self, snapshot: &ClusterSnapshot) -> Result<ScalingDecision, PolicyError> {
        self.snapshots.push(serde_json::to_value(snapshot).unwrap());
        let now = snapshot.now_ms;
        let (mut tp, mut td) = (None, None);
        for &(at, p, d) in &self.plan {
            if at <= now {
                (tp, td) = (p, d);
            }
        }
        let mut next = self.every.map(|e| now + e);
        if self.until.is_some_and(|u| now >= u) {
            next = None;
        }
        if let Some(f) = self.next {
            next = f(now);
        }
        Ok(ScalingDecision { target_prefill: tp, target_decode: td, next_tick_ms: next })
    }
}

fn launch(v: &Value) -> LaunchConfig {
    LaunchConfig::from_value(v.clone()).expect("launch config")
}

fn options(c: &Value) -> ReplayOptions {
    let w = &c["workload"];
    let n = |k: &str| w[k].as_u64().map(|x| x as usize);
    let load = match (w["request_rate"].as_f64(), w["arrival_interval_ms"].as_f64()) {
        (Some(rate), _) => Load::RequestRate(rate),
        (None, Some(gap)) => Load::ArrivalIntervalMs(gap),
        _ => panic!("workload without a load: {w}"),
    };
    let workload = SyntheticWorkload {
        input_tokens: n("input_tokens").unwrap(),
        output_tokens: n("output_tokens").unwrap(),
        request_count: n("request_count").unwrap(),
        load,
        arrival_seed: w["arrival_seed"].as_u64().unwrap_or(42),
        ..Default::default()
    };
    let r = &c["replay"];
    let default_launch = json!({"engine": {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256,
        "max_num_batched_tokens": 8192}});
    let cluster = match r.get("prefill_engine_args") {
        Some(p) => Cluster::Disaggregated {
            prefill: Pool {
                launch: launch(p),
                workers: r["num_prefill_workers"].as_u64().unwrap_or(1) as usize,
            },
            decode: Pool {
                launch: launch(&r["decode_engine_args"]),
                workers: r["num_decode_workers"].as_u64().unwrap_or(1) as usize,
            },
        },
        None => Cluster::aggregated(
            launch(r.get("extra_engine_args").unwrap_or(&default_launch)),
            r["num_workers"].as_u64().unwrap_or(1) as usize,
        ),
    };
    let mut router_config = KvRouterConfig::default();
    if c["case"] == "S6_zero_kv_router_queue" {
        router_config.router_queue_threshold = Some(0.5);
    }
    ReplayOptions {
        cluster,
        workload: workload.into(),
        router: if r["router_mode"] == "kv_router" { RouterMode::Kv } else { RouterMode::RoundRobin },
        router_config,
        sla: Sla { ttft_ms: r["sla_ttft_ms"].as_f64(), itl_ms: r["sla_itl_ms"].as_f64(), e2e_ms: None },
        ..Default::default()
    }
}

fn run(c: &Value, policy: &mut Timetable) -> Result<ReplayOutcome, ReplayError> {
    run_sampled(c, Some(policy), None).map(|(o, _)| o)
}

/// Runs case `c` with `policy` (if any) and telemetry every `interval` ms (if any); returns
/// the outcome and the samples as JSON.
fn run_sampled(
    c: &Value,
    policy: Option<&mut Timetable>,
    interval: Option<f64>,
) -> Result<(ReplayOutcome, Vec<Value>), ReplayError> {
    let capture = c["replay"]["capture_planner_details"].as_bool().unwrap_or(true);
    let mut samples = Vec::new();
    let mut keep = |s: &TelemetrySample| {
        samples.push(serde_json::to_value(s).unwrap());
        Ok(())
    };
    let hooks = Hooks {
        scaling_policy: policy.map(|p| p as &mut dyn ScalingPolicy),
        capture_planner_details: capture,
        telemetry: match interval {
            Some(_) => Some(&mut keep),
            None => None,
        },
        telemetry_interval_ms: interval.unwrap_or(1000.0),
        ..Default::default()
    };
    let outcome = run_replay(&options(c), hooks)?;
    Ok((outcome, samples))
}

/// Differences between `got` and `want` as paths: floats to 1e-9 relative, or 2e-6 ms
/// absolute (mocker's clock counts whole nanoseconds, the reference's float ms: a Poisson
/// arrival time differs by up to half a nanosecond, and a latency from it by up to one).
fn diff(path: &str, got: &Value, want: &Value, out: &mut Vec<String>) {
    match (got, want) {
        (Value::Number(g), Value::Number(w)) => {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            if (g - w).abs() > (1e-9 * w.abs().max(1.0)).max(2e-6) {
                out.push(format!("{path}: mocker {g}, reference {w}"));
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                diff(&format!("{path}[{i}]"), g, w, out);
            }
        }
        (Value::Object(g), Value::Object(w)) => {
            let (gk, wk): (Vec<_>, Vec<_>) = (g.keys().collect(), w.keys().collect());
            if gk != wk {
                out.push(format!("{path}: keys {gk:?}, reference {wk:?}"));
            }
            for (k, wv) in w {
                if let Some(gv) = g.get(k) {
                    diff(&format!("{path}.{k}"), gv, wv, out);
                }
            }
        }
        _ if got == want => {}
        _ => out.push(format!("{path}: mocker {got}, reference {want}")),
    }
}

/// The reference's summary keys mocker's summary shares, compared.
fn summary_diff(name: &str, got: &ReplayOutcome, want: &Value, out: &mut Vec<String>) {
    let got = serde_json::to_value(&got.summary).unwrap();
    for (k, w) in want.as_object().unwrap() {
        if let Some(g) = got.get(k) {
            diff(&format!("{name}.summary.{k}"), g, w, out);
        }
    }
}

/// The compact lifecycle form of the probe's S* cases.
fn compact_ops(outcome: &ReplayOutcome) -> Value {
    let ops = serde_json::to_value(&outcome.lifecycle_operations).unwrap();
    Value::Array(
        ops.as_array()
            .unwrap()
            .iter()
            .map(|op| {
                let transitions: Vec<Value> = op["transitions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| {
                        json!([
                            t["worker_id"],
                            t["transition"],
                            t["prior_state"],
                            t.get("reason").cloned().unwrap_or(Value::Null),
                            t.get("origin_operation_ordinal").cloned().unwrap_or(Value::Null)
                        ])
                    })
                    .collect();
                json!({"operation_ordinal": op["operation_ordinal"], "at_ms": op["at_ms"], "pool": op["pool"],
                    "cause": op["cause"], "planner_tick_ordinal": op["planner_tick_ordinal"],
                    "origin_operation_ordinal": op["origin_operation_ordinal"], "transitions": transitions,
                    "state_after_batch": op["state_after_batch"],
                    "released": op["topology_released_request_uuids"].as_array().unwrap().len()})
            })
            .collect(),
    )
}

#[test]
fn aggregated_round_robin_scaling_matches_the_reference_tick_by_tick() {
    let c = case("A1_agg_round_robin");
    let mut policy = Timetable::from_case(&c);
    let outcome = run(&c, &mut policy).expect("A1 runs");
    let mut out = Vec::new();
    summary_diff("A1", &outcome, &c["summary"], &mut out);
    diff("A1.snapshots", &Value::Array(policy.snapshots.clone()), &c["snapshots"], &mut out);
    let ops = serde_json::to_value(&outcome.lifecycle_operations).unwrap();
    diff("A1.lifecycle_operations", &ops, &c["lifecycle_operations"], &mut out);
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

#[test]
fn disaggregated_round_robin_scaling_matches_the_reference_tick_by_tick() {
    let c = case("A3_disagg_round_robin");
    let mut policy = Timetable::from_case(&c);
    let outcome = run(&c, &mut policy).expect("A3 runs");
    let mut out = Vec::new();
    summary_diff("A3", &outcome, &c["summary"], &mut out);
    diff("A3.snapshots", &Value::Array(policy.snapshots.clone()), &c["snapshots"], &mut out);
    let ops = serde_json::to_value(&outcome.lifecycle_operations).unwrap();
    diff("A3.lifecycle_operations", &ops, &c["lifecycle_operations"], &mut out);
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

#[test]
fn small_cases_match_the_reference() {
    let mut out = Vec::new();
    let mut checked = 0;
    for c in cases() {
        let name = c["case"].as_str().unwrap().to_string();
        let is_small = name.starts_with('S') || name.starts_with('T');
        if !is_small {
            continue;
        }
        let mut policy = Timetable::from_case(&c);
        if let Some(first) = c["policy"]["initial_tick_ms"].as_str() {
            policy.first = first.parse().unwrap();
            policy.next = Some(match name.as_str() {
                "T1_next_tick_none" => |_| None,
                "T2_next_tick_not_after_now" => Some,
                _ => |now| Some(now + 1000.0),
            });
        }
        checked += 1;
        let result = run(&c, &mut policy);
        match (&result, c.get("error")) {
            (Err(e), Some(want)) => {
                let want = want["message"].as_str().unwrap();
                // A dead end is worded as mocker words it; its substance is the count.
                let substance = |m: &str| m.find("dead end").map_or(m.to_string(), |i| m[i..].to_string());
                if substance(&e.to_string()) != substance(want) {
                    out.push(format!("{name}: error {e}, reference {want}"));
                }
                continue;
            }
            (Err(e), None) => {
                out.push(format!("{name}: failed: {e}"));
                continue;
            }
            (Ok(_), Some(want)) => {
                out.push(format!("{name}: ran, reference failed with {want}"));
                continue;
            }
            (Ok(_), None) => {}
        }
        let outcome = result.unwrap();
        summary_diff(&name, &outcome, &c["summary"], &mut out);
        if let Some(want) = c.get("lifecycle") {
            let (mut got, mut want) = (compact_ops(&outcome), want.clone());
            if c["deterministic"] == false {
                // kv_router ties decide which drained worker empties first, and when.
                for ops in [&mut got, &mut want] {
                    for op in ops.as_array_mut().unwrap() {
                        if op["cause"] == "drain_settlement" {
                            let op = op.as_object_mut().unwrap();
                            for key in ["at_ms", "transitions", "state_after_batch"] {
                                op.remove(key);
                            }
                        }
                    }
                }
            }
            diff(&format!("{name}.lifecycle"), &got, &want, &mut out);
        }
        if let Some(ticks) = c["ticks"].as_array() {
            if ticks.len() != policy.snapshots.len() {
                out.push(format!("{name}: {} ticks, reference {}", policy.snapshots.len(), ticks.len()));
            }
            for (t, s) in ticks.iter().zip(&policy.snapshots) {
                for (k, v) in t.as_object().unwrap() {
                    let got = match k.as_str() {
                        "traffic_duration_s" => s["traffic"]["duration_s"].clone(),
                        "traffic_num_req" => s["traffic"]["num_req"].clone(),
                        "traffic_shape_count" => s["traffic"]["shape_count"].clone(),
                        "prefill" | "decode" => json!([
                            s[format!("active_{k}_ids")],
                            s[format!("starting_{k}_ids")],
                            s[format!("draining_{k}_ids")]
                        ]),
                        "prefill_fpm_workers" | "decode_fpm_workers" => {
                            let pool = &k[..k.find('_').unwrap()];
                            let e = s[format!("{pool}_fpm_snapshots")].as_array().unwrap();
                            Value::Array(e.iter().map(|x| x["worker_id"].clone()).collect())
                        }
                        _ => s[k].clone(),
                    };
                    diff(&format!("{name}.ticks[{}].{k}", t["now_ms"]), &got, v, &mut out);
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} cases ran");
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

#[test]
fn an_idle_worker_publishes_zero_metrics_once_a_second() {
    let c = case("F1_idle_fpm");
    let mut policy = Timetable {
        first: 0.0,
        every: Some(500.0),
        until: None,
        plan: vec![],
        next: None,
        snapshots: vec![],
    };
    let outcome = run(&c, &mut policy).expect("F1 runs");
    let mut out = Vec::new();
    summary_diff("F1", &outcome, &c["summary"], &mut out);
    let got: Vec<Value> = policy
        .snapshots
        .iter()
        .map(|s| json!({"now_ms": s["now_ms"], "decode_fpm_snapshots": s["decode_fpm_snapshots"]}))
        .collect();
    diff("F1.fpm", &Value::Array(got), &c["fpm"], &mut out);
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

/// Whether `got` is within `rel` of `want`, else the difference.
fn near(path: &str, got: f64, want: f64, rel: f64) -> Option<String> {
    ((got - want).abs() > rel * want.abs())
        .then(|| format!("{path}: mocker {got}, reference {want} (> {rel})"))
}

/// kv_router runs vary from run to run in the reference (it breaks ties with an unseeded
/// RNG): the same decisions must happen at the same ticks, with the same workers, and the
/// figures stay within that spread (measured: under 1% for the means).
#[test]
fn kv_router_scaling_stays_within_the_reference_spread() {
    let mut out = Vec::new();
    for name in ["A2_agg_kv_router", "A4_disagg_kv_router"] {
        let c = case(name);
        let mut policy = Timetable::from_case(&c);
        let outcome = run(&c, &mut policy).expect(name);
        let got = serde_json::to_value(&outcome.summary).unwrap();
        let want = &c["summary"];
        assert_eq!(got["completed_requests"], want["completed_requests"], "{name}");
        for (key, rel) in [
            ("duration_ms", 0.005),
            ("mean_ttft_ms", 0.03),
            ("mean_itl_ms", 0.01),
            ("mean_e2e_latency_ms", 0.01),
            ("decode_worker_seconds", 0.02),
            ("prefill_worker_seconds", 0.02),
            ("goodput_completed_requests", 0.05),
        ] {
            out.extend(near(
                &format!("{name}.{key}"),
                got[key].as_f64().unwrap(),
                want[key].as_f64().unwrap(),
                rel,
            ));
        }
        let ops = serde_json::to_value(&outcome.lifecycle_operations).unwrap();
        let (ops, want_ops) = (ops.as_array().unwrap(), c["lifecycle_operations"].as_array().unwrap());
        assert_eq!(ops.len(), want_ops.len(), "{name}: lifecycle operations");
        for (i, (g, w)) in ops.iter().zip(want_ops).enumerate() {
            for key in ["pool", "cause", "planner_tick_ordinal", "origin_operation_ordinal"] {
                if g[key] != w[key] {
                    out.push(format!(
                        "{name}.lifecycle_operations[{i}].{key}: mocker {}, reference {}",
                        g[key], w[key]
                    ));
                }
            }
            // Drained workers leave when their last request ends: that time varies.
            let rel = if w["cause"] == "drain_settlement" { 0.02 } else { 1e-9 };
            out.extend(near(
                &format!("{name}.ops[{i}].at_ms"),
                g["at_ms"].as_f64().unwrap(),
                w["at_ms"].as_f64().unwrap(),
                rel,
            ));
            if w["cause"] != "drain_settlement" && g["state_after_batch"] != w["state_after_batch"] {
                out.push(format!(
                    "{name}.ops[{i}]: state {}, reference {}",
                    g["state_after_batch"], w["state_after_batch"]
                ));
            }
        }
        let want_snaps = c["snapshots"].as_array().unwrap();
        assert_eq!(policy.snapshots.len(), want_snaps.len(), "{name}: ticks");
        for (g, w) in policy.snapshots.iter().zip(want_snaps) {
            for pool in ["prefill", "decode"] {
                for state in ["active", "starting", "draining"] {
                    let key = format!("{state}_{pool}_ids");
                    if g[&key] != w[&key] {
                        out.push(format!(
                            "{name} tick {}: {key} {}, reference {}",
                            w["now_ms"], g[&key], w[&key]
                        ));
                    }
                }
            }
        }
    }
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

/// Telemetry beside a policy: every sample of the reference's `A1` and `A3` runs (baseline,
/// periodic, final; traffic, gauges of starting and draining workers, ids).
#[test]
fn telemetry_samples_match_the_reference() {
    let mut out = Vec::new();
    for name in ["A1_agg_round_robin", "A3_disagg_round_robin"] {
        let c = case(name);
        let mut policy = Timetable::from_case(&c);
        let interval = c["replay"]["telemetry_sample_interval_ms"].as_f64();
        let (outcome, samples) = run_sampled(&c, Some(&mut policy), interval).expect(name);
        summary_diff(name, &outcome, &c["summary"], &mut out);
        diff(&format!("{name}.telemetry"), &Value::Array(samples), &c["telemetry"]["samples"], &mut out);
    }
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

/// Interval counters without a policy: preemptions (a 200-block cache), SGLang's cache
/// counters, vLLM's zeros; and sampling changes no figure of the run.
#[test]
fn telemetry_counters_match_the_reference() {
    let mut out = Vec::new();
    for (name, engine, interval) in [
        (
            "M1_preemptions",
            json!({"block_size": 64, "num_gpu_blocks": 200, "max_num_seqs": 256, "max_num_batched_tokens": 8192}),
            500.0,
        ),
        (
            "M2_sglang_cache_hits",
            json!({"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "backend": "sglang"}),
            500.0,
        ),
        (
            "M3_vllm_cache_hits",
            json!({"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192}),
            500.0,
        ),
    ] {
        let mut c = case(name);
        c["replay"] = json!({"extra_engine_args": {"engine": engine}, "num_workers": 1});
        let w = c["workload"].clone();
        let mut opts = options(&c);
        if let mocker_replay::Workload::Synthetic(s) = &mut opts.workload {
            s.shared_prefix_ratio = w["shared_prefix_ratio"].as_f64().unwrap_or(0.0);
            s.num_prefix_groups = w["num_prefix_groups"].as_u64().unwrap_or(0) as usize;
        }
        let mut samples = Vec::new();
        let mut keep = |s: &TelemetrySample| {
            samples.push(serde_json::to_value(s).unwrap());
            Ok(())
        };
        let hooks =
            Hooks { telemetry: Some(&mut keep), telemetry_interval_ms: interval, ..Default::default() };
        let outcome = run_replay(&opts, hooks).expect(name);
        summary_diff(name, &outcome, &c["summary"], &mut out);
        let plain = run_replay(&opts, Hooks::default()).expect(name);
        let (a, b) =
            (serde_json::to_value(&outcome.summary).unwrap(), serde_json::to_value(&plain.summary).unwrap());
        for key in
            ["duration_ms", "mean_ttft_ms", "mean_itl_ms", "decode_worker_seconds", "completed_requests"]
        {
            if a[key] != b[key] {
                out.push(format!("{name}: sampling changed {key}: {} vs {}", a[key], b[key]));
            }
        }
        match c.get("interval_metrics") {
            Some(want) => {
                let got: Vec<Value> = samples
                    .iter()
                    .map(|s| json!([s["kind"], s["sampled_at_ms"], s["decode_interval_metrics"]]))
                    .collect();
                diff(&format!("{name}.interval_metrics"), &Value::Array(got), want, &mut out);
            }
            None => diff(
                &format!("{name}.telemetry"),
                &Value::Array(samples),
                &c["telemetry"]["samples"],
                &mut out,
            ),
        }
    }
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

/// The KV-event lag cases through telemetry: placements per second are the reference's
/// exactly; the router's hit rate per second is blind for as long as the lag (the reference's
/// zeros exactly), and otherwise within its run-to-run spread (kv_router ties).
#[test]
fn kv_event_lag_shows_in_the_router_hit_rate_as_in_the_reference() {
    let mut out = Vec::new();
    for name in ["L_lag_None", "L_lag_0.0", "L_lag_200.0", "L_lag_2000.0", "L_lag_10000000.0"] {
        let mut c = case(name);
        c["replay"]["extra_engine_args"] = json!({"engine": {"block_size": 64, "num_gpu_blocks": 16384,
            "max_num_seqs": 256, "max_num_batched_tokens": 8192}});
        let w = c["workload"].clone();
        let mut opts = options(&c);
        if let mocker_replay::Workload::Synthetic(s) = &mut opts.workload {
            s.shared_prefix_ratio = w["shared_prefix_ratio"].as_f64().unwrap();
            s.num_prefix_groups = w["num_prefix_groups"].as_u64().unwrap() as usize;
        }
        opts.kv_event_lag_ms = c["replay"]["kv_event_lag_ms"].as_f64();
        let mut samples = Vec::new();
        let mut keep = |s: &TelemetrySample| {
            samples.push(serde_json::to_value(s).unwrap());
            Ok(())
        };
        let hooks = Hooks { telemetry: Some(&mut keep), telemetry_interval_ms: 1000.0, ..Default::default() };
        run_replay(&opts, hooks).expect(name);
        let want = c["router_kv_hit_rate_per_second"].as_array().unwrap();
        assert_eq!(samples.len(), want.len(), "{name}: samples");
        for (s, w) in samples.iter().zip(want) {
            let (rate, count) = (
                s["traffic"]["avg_router_kv_hit_rate"].as_f64().unwrap(),
                &s["traffic"]["router_kv_hit_rate_count"],
            );
            let (want_rate, want_count) = (w[1].as_f64().unwrap(), &w[2]);
            if count != want_count {
                out.push(format!("{name} at {}: {count} placements, reference {want_count}", w[0]));
            }
            let ok = if want_rate == 0.0 { rate == 0.0 } else { (rate - want_rate).abs() <= 0.2 };
            if !ok {
                out.push(format!("{name} at {}: hit rate {rate}, reference {want_rate}", w[0]));
            }
        }
    }
    assert!(out.is_empty(), "{} differences:\n{}", out.len(), out.join("\n"));
}

/// With speculative decoding a decode forward accepts several tokens: the traffic's
/// accept length is their mean (1 without it), over the same forwards.
#[test]
fn traffic_accept_length_counts_speculative_tokens() {
    let mut lengths = Vec::new();
    for engine in [
        json!({"block_size": 64, "num_gpu_blocks": 16384}),
        json!({"block_size": 64, "num_gpu_blocks": 16384, "aic_nextn": 3}),
    ] {
        let mut c = case("M4_callback_jsonl_capture");
        c["replay"] = json!({"extra_engine_args": {"engine": engine}, "num_workers": 1});
        let mut samples = Vec::new();
        let mut keep = |s: &TelemetrySample| {
            samples.push(serde_json::to_value(s).unwrap());
            Ok(())
        };
        let hooks = Hooks { telemetry: Some(&mut keep), telemetry_interval_ms: 500.0, ..Default::default() };
        run_replay(&options(&c), hooks).unwrap();
        let (tokens, forwards) = samples.iter().fold((0.0, 0.0), |(t, f), s| {
            let n = s["traffic"]["accept_length_forward_count"].as_f64().unwrap();
            (t + n * s["traffic"]["avg_accept_length"].as_f64().unwrap_or(0.0), f + n)
        });
        lengths.push(tokens / forwards);
    }
    assert_eq!(lengths[0], 1.0);
    assert!(lengths[1] > 1.5 && lengths[1] <= 4.0, "{lengths:?}");
}
