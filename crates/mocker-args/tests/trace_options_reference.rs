//! The reference's remaining trace options (`agentic_lanes`, `execution_model`,
//! `weka_nested_timestamp_basis`) against ai-dynamo-runtime 1.6.1: every `F*` case of
//! `tests/fixtures/hybrid_reference.json` (written by `scripts/probe_hybrid_reference.py`,
//! see docs/hybrid-kv.md §4) run through `mocker replay`'s own flags (`ReplayArgs`, shared
//! by the CLI and the Python module): the figures and per-request arrivals equal the
//! reference's to floating-point rounding, and what it refuses is refused with the
//! substance of its message.

use clap::Parser;
use mocker_args::replay::{ReplayArgs, RunHooks};
use mocker_replay::RequestRecord;
use serde_json::Value;

const FIXTURE: &str = include_str!("../../../tests/fixtures/hybrid_reference.json");

#[derive(Parser)]
#[command(name = "mocker replay")]
struct Command {
    #[command(flatten)]
    args: ReplayArgs,
}

fn cases() -> Vec<Value> {
    let doc: Value = serde_json::from_str(FIXTURE).expect("fixture parses");
    let cases: Vec<Value> = doc["cases"].as_array().expect("cases").clone();
    cases.into_iter().filter(|c| c["case"].as_str().unwrap().starts_with('F')).collect()
}

/// What mocker's message must contain for the reference's (flag names for keywords).
fn substance(reference: &str) -> String {
    let m = reference.trim_start_matches("ValueError: ").trim_start_matches("Exception: ");
    let known = [
        (
            "agentic execution requires a configured target model",
            "agentic execution requires a configured target model",
        ),
        ("execution_model must be non-empty", "--execution-model: must be non-empty"),
        ("agentic_lanes must be at least 1", "--agentic-lanes: must be at least 1"),
        (
            "agentic_lanes cannot be combined with replay_concurrency",
            "--agentic-lanes: cannot be combined with --concurrency",
        ),
        (
            "agentic_lanes requires trace_format='agentic_mooncake', 'weka', or 'dynamo'",
            "--agentic-lanes: requires --trace-format agentic-mooncake, weka, or dynamo",
        ),
        (
            "weka_nested_timestamp_basis requires trace_format='weka'",
            "weka_nested_timestamp_basis requires trace_format='weka'",
        ),
    ];
    if let Some((_, s)) = known.iter().find(|(r, _)| *r == m) {
        return s.to_string();
    }
    if let Some(rest) = m.strip_prefix("weka_nested_timestamp_basis must be ") {
        return format!("--weka-nested-timestamp-basis: must be {rest}");
    }
    // The Weka error is the reference's own sentence (the file has the probe's name).
    m.to_string()
}

/// `mocker replay` for a case: its rows in a file named as the probe named it, its engine
/// args and replay options as flags.
fn command(case: &Value, dir: &std::path::Path) -> Vec<String> {
    let w = &case["workload"];
    // The reference names a Weka source by its file: the probe's was this.
    let path = dir.join("rows_e6ee3f4ea019.jsonl");
    let rows: Vec<String> = w["rows"].as_array().unwrap().iter().map(Value::to_string).collect();
    std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    let mut argv = vec![
        "mocker replay".to_string(),
        format!("--trace-format={}", w["trace_format"].as_str().unwrap()),
        format!("--engine-args={}", serde_json::json!({"engine": case["engine"]})),
    ];
    if let Some(bs) = w["trace_block_size"].as_u64() {
        argv.push(format!("--trace-block-size={bs}"));
    }
    let r = &case["replay"];
    for (key, flag) in [
        ("execution_model", "execution-model"),
        ("agentic_lanes", "agentic-lanes"),
        ("weka_nested_timestamp_basis", "weka-nested-timestamp-basis"),
        ("replay_concurrency", "concurrency"),
    ] {
        match &r[key] {
            Value::Null => {}
            Value::String(s) => argv.push(format!("--{flag}={s}")),
            v => argv.push(format!("--{flag}={v}")),
        }
    }
    argv.push("--".into());
    argv.push(path.display().to_string());
    argv
}

/// Runs a case: its summary (the reference's keys) and its per-request records, or the
/// refusal.
fn run(case: &Value) -> Result<(Value, Vec<RequestRecord>), String> {
    let dir = std::env::temp_dir().join(format!(
        "mocker-trace-options-{}-{}",
        std::process::id(),
        case["case"].as_str().unwrap()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let argv = command(case, &dir);
    let cmd = Command::try_parse_from(&argv).map_err(|e| e.to_string())?;
    let options = cmd.args.options().map_err(|e| e.0)?;
    let run = cmd.args.describe(&options);
    let mut records = Vec::new();
    let mut keep = |r: &RequestRecord| records.push(r.clone());
    let hooks = RunHooks { request_ended: Some(&mut keep), ..Default::default() };
    let outcome = cmd.args.execute(&options, &run, hooks).map_err(|e| e.0)?;
    std::fs::remove_dir_all(&dir).ok();
    Ok((outcome.summary.to_json_value(), records))
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-9 * want.abs().max(1e-9)
}

#[test]
fn every_f_case_matches_the_reference() {
    let mut failures = Vec::new();
    let cases = cases();
    assert!(cases.len() >= 19, "only {} F cases", cases.len());
    for case in &cases {
        let name = case["case"].as_str().unwrap();
        let got = run(case);
        if let Some(reference) = case["error"].as_str() {
            match got {
                Ok(_) => failures.push(format!("{name}: mocker ran; the reference refused: {reference}")),
                Err(e) if !e.contains(&substance(reference)) => {
                    failures.push(format!("{name}: mocker said {e:?}; the reference {reference:?}"))
                }
                Err(_) => {}
            }
            continue;
        }
        let (summary, mut records) = match got {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{name}: mocker refused ({e}); the reference ran"));
                continue;
            }
        };
        for (key, want) in case["result"].as_object().unwrap() {
            let g = &summary[key];
            let ok = match (g.as_f64(), want.as_f64()) {
                (Some(g), Some(w)) => close(g, w),
                _ => g == want,
            };
            if !ok {
                failures.push(format!("{name} {key}: mocker {g}, reference {want}"));
            }
        }
        if let Some(want) = case["per_request"].as_array() {
            records.sort_by(|a, b| a.arrival_time_ms.total_cmp(&b.arrival_time_ms));
            let got: Vec<(f64, f64, u32)> = records
                .iter()
                .map(|r| (r.arrival_time_ms, r.ttft_ms.unwrap_or(f64::NAN), r.reused_input_tokens))
                .collect();
            let want: Vec<(f64, f64, u32)> = want
                .iter()
                .map(|r| (r[0].as_f64().unwrap(), r[1].as_f64().unwrap(), r[2].as_u64().unwrap() as u32))
                .collect();
            let same = got.len() == want.len()
                && got.iter().zip(&want).all(|(g, w)| close(g.0, w.0) && close(g.1, w.1) && g.2 == w.2);
            if !same {
                failures.push(format!(
                    "{name} per request (arrival, ttft, reused): mocker {got:?}, reference {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// The report's `run.agentic` records the projection the reference reports for an agentic
/// replay: source models, target, lanes, the Weka basis used.
#[test]
fn the_report_records_the_model_projection_and_lanes() {
    let cases = cases();
    let find = |n: &str| cases.iter().find(|c| c["case"] == n).unwrap().clone();
    let dir = std::env::temp_dir().join(format!("mocker-trace-options-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let describe = |case: &Value| {
        let cmd = Command::try_parse_from(command(case, &dir)).unwrap();
        let options = cmd.args.options().unwrap();
        cmd.args.describe(&options).to_json()
    };
    let run = describe(&find("F4_agentic_lanes2"));
    let a = &run["agentic"];
    assert_eq!(a["input_format"], "agentic_mooncake");
    assert_eq!(a["lanes"], 2);
    assert_eq!(a["qualification"], "functional_only");
    assert_eq!(
        a["model_projection"],
        serde_json::json!({"policy": "project_to_configured_target", "source_models": ["source-a", "source-b"], "target_model": "target"})
    );
    let run = describe(&find("F11_weka_before_marker_omitted"));
    assert_eq!(run["agentic"]["weka_nested_timestamp_basis"], "relative", "auto chose relative");
    assert_eq!(run["agentic"]["lanes"], Value::Null);
    let run = describe(&find("F8_execution_model_on_mooncake"));
    assert!(run.get("agentic").is_none(), "a Mooncake trace has no projection: {run}");
    std::fs::remove_dir_all(&dir).ok();
}
