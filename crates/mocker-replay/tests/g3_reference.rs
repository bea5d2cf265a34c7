//! `g3_offload` against the reference (ai-dynamo-runtime 1.6.1): the E cases of
//! `tests/fixtures/hybrid_reference.json` (written by `scripts/probe_hybrid_reference.py`,
//! see docs/hybrid-kv.md §3) replayed through mocker's replay API give the reference's
//! headline figures and its `g3_offload` report to 1e-9, and the G3 refusal cases are
//! refused with the substance of the reference's message (the ones it accepts run as its
//! 2-request replay did).
//!
//! The "deep" Mooncake workload is the probe's `mooncake_rows()` for its `gen`, stored in
//! `tests/data/hybrid_deep.jsonl`; "sessions" is the reference's synthetic generator;
//! the E13 cases carry their rows in the fixture.

use std::sync::Arc;

use mocker_core::config::LaunchConfig;
use mocker_replay::trace::load::parse_trace;
use mocker_replay::{
    run_synthetic, Cluster, Load, ReplayOptions, SyntheticWorkload, TraceFormat, TraceWorkload, Workload,
};
use serde_json::{json, Value};

mod hybrid_fixture;

use hybrid_fixture::{cases, launch, mocker_engine, synthetic};

const DEEP: &str = include_str!("data/hybrid_deep.jsonl");
/// The probe's `gen` of the deep workload the rows above were generated from.
const DEEP_GEN: &str = r#"{"seed": 5, "sessions": 60, "rate_per_s": 4.0, "groups": 16, "group_blocks": 24,
    "turns": 1, "first_new": [2, 6], "next_new": [0, 0], "out_range": [8, 32], "delay_ms": 0.0}"#;

fn trace(rows: &str, block: Option<usize>) -> Workload {
    let trace = parse_trace(rows, TraceFormat::Mooncake, block).expect("trace parses");
    Workload::Trace(TraceWorkload { trace: Arc::new(trace), concurrency: None, repeat: 1, lanes: None })
}

fn workload(w: &Value) -> Workload {
    let block = w["trace_block_size"].as_u64().map(|b| b as usize);
    match w["kind"].as_str() {
        Some("synthetic") => synthetic(w).into(),
        Some("mooncake") => {
            let gen: Value = serde_json::from_str(DEEP_GEN).unwrap();
            assert_eq!(w["gen"], gen, "only the deep workload's rows are stored");
            trace(DEEP, block)
        }
        Some("rows") => {
            let rows: String = w["rows"].as_array().unwrap().iter().map(|r| format!("{r}\n")).collect();
            trace(&rows, block)
        }
        other => panic!("workload kind {other:?} is not replayed here"),
    }
}

/// Figures that cannot meet 1e-9, and why. A G3 read of 24 blocks at 10 GB/s takes
/// 0.0393216 ms, 39_321.6 ns: the reference's clock (f64 ms) takes the completion up at
/// that fraction of a nanosecond, mocker's (u64 ns) at the nearest nanosecond, so each
/// restore lands up to half a nanosecond off. Relative to a 10 ms TTFT (E13) or a 48 ms
/// mean (E9/E10, 44 restores) that exceeds 1e-9, and the thrashing `Y` cases chain 1024
/// such reads. Every other figure of these cases, their G3 reports included, is checked to
/// 1e-9; these are held to half a nanosecond per read on the path (the third field).
const SUB_NANOSECOND: &[(&str, &str, f64)] = &[
    ("E9_g3_2workers_shared_deep", "mean_ttft_ms", 1.0),
    ("E10_g3_2workers_local_deep", "mean_ttft_ms", 1.0),
    ("E13_restore_g3_lat0.0_bw10.0", "mean_ttft_ms", 1.0),
    ("E13_restore_g3_lat0.0_bw10.0", "p99_ttft_ms", 1.0),
    ("E13_restore_g3_lat0.0_bw10.0", "mean_e2e_latency_ms", 1.0),
    ("E13_restore_g3_lat0.1_bw10.0", "mean_ttft_ms", 1.0),
    ("E13_restore_g3_lat0.1_bw10.0", "p99_ttft_ms", 1.0),
    ("E13_restore_g3_lat0.1_bw10.0", "mean_e2e_latency_ms", 1.0),
    ("E13_restore_g3_lat5.0_bw10.0", "mean_ttft_ms", 1.0),
    ("E13_restore_g3_lat5.0_bw10.0", "p99_ttft_ms", 1.0),
    ("E13_restore_g3_lat5.0_bw10.0", "mean_e2e_latency_ms", 1.0),
    ("Y1_bypass_host16", "duration_ms", 1024.0),
    ("Y1_bypass_host16", "mean_ttft_ms", 1024.0),
    ("Y1_bypass_host16", "p99_ttft_ms", 1024.0),
    ("Y1_bypass_host16", "mean_e2e_latency_ms", 1024.0),
    ("Y2_bypass_host20", "duration_ms", 1024.0),
    ("Y2_bypass_host20", "mean_ttft_ms", 1024.0),
    ("Y2_bypass_host20", "p99_ttft_ms", 1024.0),
    ("Y2_bypass_host20", "mean_e2e_latency_ms", 1024.0),
];

fn close(case: &str, key: &str, got: f64, want: f64) -> Option<String> {
    let ok = if let Some((_, _, reads)) = SUB_NANOSECOND.iter().find(|(c, k, _)| (*c, *k) == (case, key)) {
        (got - want).abs() <= 0.5e-6 * reads
    } else {
        (got - want).abs() <= 1e-9 * want.abs().max(1e-9)
    };
    (!ok).then(|| format!("{case} {key}: mocker {got}, reference {want}"))
}

fn options(name: &str, case: &Value) -> ReplayOptions {
    let replay = &case["replay"];
    let workers = replay["num_workers"].as_u64().unwrap_or(1) as usize;
    ReplayOptions {
        cluster: Cluster::aggregated(launch(&mocker_engine(&case["engine"]), 1).expect(name), workers),
        workload: workload(&case["workload"]),
        router: match replay["router_mode"].as_str() {
            Some("kv_router") => mocker_replay::RouterMode::Kv,
            _ => mocker_replay::RouterMode::RoundRobin,
        },
        ..Default::default()
    }
}

/// The mismatches of one case's figures against the reference's.
fn compare(name: &str, case: &Value) -> Vec<String> {
    let want = &case["result"];
    let s = run_synthetic(&options(name, case)).unwrap_or_else(|e| panic!("{name}: {e}")).summary;
    let exact = |key: &str, got: u64| {
        let want = want[key].as_u64().unwrap();
        (got != want).then(|| format!("{name} {key}: mocker {got}, reference {want}"))
    };
    let f = |key: &str| want[key].as_f64().unwrap();
    let mut out: Vec<String> = [
        exact("num_requests", s.num_requests),
        exact("completed_requests", s.completed_requests),
        exact("committed_prefill_tokens", s.committed_prefill_tokens),
        exact("total_output_tokens", s.total_output_tokens),
        close(name, "duration_ms", s.duration_ms, f("duration_ms")),
        close(name, "mean_ttft_ms", s.ttft_ms.mean, f("mean_ttft_ms")),
        close(name, "p99_ttft_ms", s.ttft_ms.p99, f("p99_ttft_ms")),
        close(name, "mean_itl_ms", s.itl_ms.mean, f("mean_itl_ms")),
        close(name, "mean_e2e_latency_ms", s.e2e_latency_ms.mean, f("mean_e2e_latency_ms")),
        close(name, "prefix_cache_reused_ratio", s.prefix_cache_reused_ratio, f("prefix_cache_reused_ratio")),
        close(
            name,
            "first_admission_prefix_cache_reused_ratio",
            s.first_admission_prefix_cache_reused_ratio,
            f("first_admission_prefix_cache_reused_ratio"),
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let got = s.g3_offload.as_ref().map(|g| serde_json::to_value(g).unwrap());
    match (got, want.get("g3_offload")) {
        (None, None) => {}
        (Some(got), Some(want)) => compare_object(name, "g3_offload", &got, want, &mut out),
        (got, want) => out.push(format!("{name} g3_offload: mocker {got:?}, reference {want:?}")),
    }
    out
}

/// Same keys in the same order; integers equal, floats to 1e-9.
fn compare_object(name: &str, path: &str, got: &Value, want: &Value, out: &mut Vec<String>) {
    let (g, w) = (got.as_object().unwrap(), want.as_object().unwrap());
    let (gk, wk): (Vec<_>, Vec<_>) = (g.keys().collect(), w.keys().collect());
    if gk != wk {
        out.push(format!("{name} {path} keys: mocker {gk:?}, reference {wk:?}"));
        return;
    }
    for (k, wv) in w {
        let gv = &g[k];
        let at = format!("{path}.{k}");
        if wv.is_object() {
            compare_object(name, &at, gv, wv, out);
        } else if wv.is_u64() {
            if gv != wv {
                out.push(format!("{name} {at}: mocker {gv}, reference {wv}"));
            }
        } else if let Some(m) = close(name, &at, gv.as_f64().unwrap(), wv.as_f64().unwrap()) {
            out.push(m);
        }
    }
}

fn check_cases(filter: impl Fn(&str) -> bool) {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases() {
        let name = case["case"].as_str().unwrap();
        if !name.starts_with('E') || !filter(name) {
            continue;
        }
        failures.extend(compare(name, &case));
        checked += 1;
    }
    assert!(checked > 0, "no cases found");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// One worker under load (`deep`, `sessions`): G1 alone, G1 + host, and G3 with its
/// default, slow, tiny, shared and instant settings.
#[test]
fn single_worker_cases_match_the_reference() {
    check_cases(|n| !n.starts_with("E13") && !n.contains("2workers"));
}

/// Two workers, round robin, with one shared pool or one pool each.
#[test]
fn two_worker_cases_match_the_reference() {
    check_cases(|n| n.contains("2workers"));
}

/// One prefix flushed from G1 and G2 and read back from G3 (`E13_*`).
#[test]
fn restore_cases_match_the_reference() {
    check_cases(|n| n.starts_with("E13"));
}

/// Where mocker's wording of a shape error differs from serde's, the part that must appear.
fn substance(case: &str, reference: &str) -> String {
    let shape = [
        ("refusal_g3_missing_scope", "g3_offload.scope: missing required field"),
        ("refusal_g3_missing_num_g3_blocks", "g3_offload.num_g3_blocks: missing required field"),
        (
            "refusal_g3_scope_dp_rank_local",
            "g3_offload.scope: unknown variant \"dp_rank_local\"; expected one of: worker_local, cluster_shared",
        ),
        (
            "refusal_g3_unknown_field",
            "g3_offload.bandwidth: unknown field; expected one of: scope, num_g3_blocks, \
             latency_to_first_byte_ms, read_bandwidth_gbps, write_bandwidth_gbps, \
             shared_read_bandwidth_gbps, shared_write_bandwidth_gbps",
        ),
    ];
    if let Some((_, s)) = shape.iter().find(|(c, _)| *c == case) {
        return s.to_string();
    }
    let m = reference.trim_start_matches("ValueError: ");
    m.trim_start_matches("invalid engine launch config: engine: ").to_string()
}

/// The two-request replay the probe runs on an accepted engine.
fn two_requests(engine: LaunchConfig, workers: usize, kv_router: bool) -> Result<u64, String> {
    let options = ReplayOptions {
        cluster: Cluster::aggregated(engine, workers),
        workload: SyntheticWorkload {
            input_tokens: 64,
            output_tokens: 4,
            request_count: 2,
            load: Load::Concurrency(2),
            ..Default::default()
        }
        .into(),
        router: if kv_router { mocker_replay::RouterMode::Kv } else { mocker_replay::RouterMode::RoundRobin },
        ..Default::default()
    };
    run_synthetic(&options).map(|o| o.summary.completed_requests).map_err(|e| e.to_string())
}

#[test]
fn g3_refusals_match_the_reference() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases() {
        let name = case["case"].as_str().unwrap();
        if !(name.starts_with("refusal_g3") || name == "refusal_state_g3") {
            continue;
        }
        checked += 1;
        let replay = &case["replay"];
        let normalize = case["normalize"].as_str().unwrap();
        let result = case["replay_result"].as_str().unwrap_or("");
        let dp = replay["dp_size"].as_u64().unwrap_or(1);
        let parsed = launch(&case["engine"], dp);
        // Mocker refuses at parse time what the reference refuses only at replay time.
        let refused_at_replay = replay["dp_size"].is_u64()
            || replay["disagg"].as_bool() == Some(true)
            || replay["replay_mode"].is_string();
        if normalize != "ok" || replay["dp_size"].is_u64() {
            let want = if normalize != "ok" {
                substance(name, normalize)
            } else {
                result.trim_start_matches("Exception: invalid replay spec: ").to_string()
            };
            match parsed {
                Ok(_) => {
                    failures.push(format!("{name}: accepted; the reference refuses: {normalize} {result}"))
                }
                Err(e) if !e.contains(&want) => failures.push(format!("{name}: {e:?} lacks {want:?}")),
                Err(_) => {}
            }
            continue;
        }
        let engine = match parsed {
            Ok(engine) => engine,
            Err(e) => {
                failures.push(format!("{name}: refused ({e}); the reference accepts it"));
                continue;
            }
        };
        if refused_at_replay {
            // Disaggregated and online replays: checked by `g3_needs_an_aggregated_offline_replay`.
            continue;
        }
        let workers = replay["num_workers"].as_u64().unwrap_or(1) as usize;
        let kv = replay["router_mode"].as_str() == Some("kv_router");
        match two_requests(engine, workers, kv) {
            Ok(n) if result == format!("ok: completed {n} of 2") => {}
            got => failures.push(format!("{name}: mocker {got:?}, reference {result}")),
        }
    }
    assert!(checked >= 16, "only {checked} refusal cases found");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// Debug aid: prints per-request (arrival, ttft, e2e) of the case named by env G3_CASE.
#[test]
#[ignore]
fn dump_case() {
    let want = std::env::var("G3_CASE").unwrap_or_default();
    for case in cases() {
        let name = case["case"].as_str().unwrap();
        if name != want {
            continue;
        }
        let mut rows = Vec::new();
        let mut on_end =
            |r: mocker_replay::RequestRecord| rows.push((r.arrival_time_ms, r.ttft_ms, r.e2e_latency_ms));
        let mut on_pass = |p: mocker_replay::PassRecord| {
            println!(
                "PASS {:.6} {:.6} pf={} pft={} dec={} q={}",
                p.start_ms,
                p.end_ms,
                p.num_prefill_requests,
                p.prefill_tokens,
                p.num_decode_requests,
                p.num_queued_requests
            )
        };
        let hooks = mocker_replay::Hooks {
            request_ended: Some(&mut on_end),
            pass_ended: Some(&mut on_pass),
            ..Default::default()
        };
        mocker_replay::run_replay(&options(name, &case), hooks).unwrap();
        rows.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        for r in rows {
            println!("ROW {:.6} {:?} {:?}", r.0, r.1, r.2);
        }
    }
}

/// The reference runs G3 only in an aggregated offline replay: online replay fails
/// (`constructing attention-DP rank 0`, for want of the offline deployment's G3 registry)
/// and prefill/decode workers are refused. Mocker refuses both naming `g3_offload`.
#[test]
fn g3_needs_an_aggregated_offline_replay() {
    let case = cases().into_iter().find(|c| c["case"] == "refusal_g3_online").expect("online case");
    let engine = launch(&case["engine"], 1).expect("accepted");
    let options = ReplayOptions { cluster: Cluster::aggregated(engine, 1), ..Default::default() };
    let e = options.validate("online").expect_err("online replay refused").to_string();
    assert!(e.contains("g3_offload") && e.contains("offline"), "{e}");
    for role in ["prefill", "decode"] {
        let mut engine = case["engine"].clone();
        engine["worker_type"] = json!(role);
        let e = launch(&engine, 1).expect_err("refused");
        assert!(e.contains("g3_offload is supported only for worker_type=aggregated"), "{e}");
    }
}

const EXTRA: &str = include_str!("../../../tests/fixtures/g3_extra_reference.json");

/// The cases of `g3_extra_reference.json` (written by `scripts/probe_g3_extra.py`) on the
/// deep workload: three workers under a binding `cluster_shared` cap, small `worker_local`
/// pools with a 2 ms first byte (evictions), and a host tier no store cohort fits; and two
/// prefixes larger than the host tier whose promotion thrashes until the 1024-round bound
/// (`Y1`, `Y2`: `bypassed_restores` 1). With
/// the KV router (`X1`, `X5`, and `X6` without G3) mocker's figures differ: the reference's
/// router also scores blocks in the host tier and in G3 (`host_pinned_blocks`,
/// `disk_blocks`), which mocker's host tier does not publish, so the router places
/// requests differently; those run to completion here and are not compared.
#[test]
fn extra_cases_match_the_reference() {
    let doc: Value = serde_json::from_str(EXTRA).expect("fixture parses");
    let gen: Value = serde_json::from_str(DEEP_GEN).unwrap();
    let mut failures = Vec::new();
    for (name, case) in doc["cases"].as_object().expect("cases") {
        let mut case = case.clone();
        if case["workload"].is_null() {
            case["workload"] = json!({"kind": "mooncake", "trace_block_size": 16, "gen": gen});
        }
        if case["replay"]["router_mode"] == "kv_router" {
            let s = run_synthetic(&options(name, &case)).unwrap_or_else(|e| panic!("{name}: {e}")).summary;
            assert_eq!(s.completed_requests, 60, "{name}");
            continue;
        }
        failures.extend(compare(name, &case));
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
