//! `mocker profiles predict` prices recorded passes as the profile's tables say (context
//! passes by the prefill table, decode by the decode grid, mixed passes by the mixed grid),
//! and `scripts/calibrate.py` runs end to end on the bundled calibration data.

mod cli;

use std::path::{Path, PathBuf};
use std::process::Command;

use cli::{assert_exit_2, mocker, scratch, stderr, stdout, BIN};
use mocker_core::timing::ProfileTable;

const PROFILE: &str = "b300-qwen3-32b-vllm-tp1";
const HEADER: &str = "ctx_tokens,ctx_requests,ctx_kv_tokens,decode_requests,decode_kv_tokens";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn table() -> ProfileTable {
    mocker_profiles::bundled(PROFILE).expect("bundled").expect("loads").table
}

/// Runs `profiles predict` on `rows` (CSV lines under HEADER) and returns
/// (prefill_ms, decode_ms, pass_ms) per row.
fn predict(dir: &Path, rows: &[&str], extra: &[&str]) -> Vec<(f64, f64, f64)> {
    let input = dir.join("passes.csv");
    std::fs::write(&input, format!("{HEADER}\n{}\n", rows.join("\n"))).unwrap();
    let mut args =
        vec!["profiles", "predict", "--timing-profile", PROFILE, "--input", input.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = mocker(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("prefill_ms,decode_ms,pass_ms"));
    lines
        .map(|l| {
            let v: Vec<f64> = l.split(',').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1], v[2])
        })
        .collect()
}

/// Equal up to the nanosecond rounding of simulated pass times.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6
}

#[test]
fn predict_reads_each_pass_kind_from_its_table() {
    let dir = scratch("predict");
    let t = table();
    // Passes recorded at TP1 (calibration/aic-fpm-qwen3-32b-vllm/tp1): a 4096-token prompt,
    // a decode batch of 32, a mixed pass of two fresh chunks, a mixed pass whose three
    // chunks follow earlier chunks (4094 tokens held before the pass).
    let got =
        predict(&dir, &["4096,1,0,0,0", "0,0,0,32,126264", "8190,2,0,2,8193", "8189,3,4094,3,12291"], &[]);
    assert_eq!(got.len(), 4);

    let (p, d, pass) = got[0];
    assert!(close(p, t.prefill_with_prefix_at(4096.0, 0.0)), "{p}");
    assert!(close(p, t.prefill_at(4096.0)), "no prefix: the Dynamo prefill lookup");
    assert_eq!((d, pass), (0.0, p));

    let (p, d, pass) = got[1];
    assert_eq!(p, 0.0);
    assert!(close(d, t.decode_at(126264.0, (126264 / 32) as f64)), "{d}");
    assert_eq!(pass, d);

    // A mixed pass is read whole from the mixed grid at (prefill tokens, decode requests,
    // mean decode context); the decode part is what decoding alone costs.
    let (p, d, pass) = got[2];
    let whole = t.mixed_at(8190.0, 2.0, 4096.0).expect("the profile has a mixed grid");
    assert!(close(pass, whole), "{pass} vs mixed grid {whole}");
    assert!(close(d, t.decode_at(8193.0, 4096.0).max(1.0)), "{d}");
    assert!(close(p, whole - d));
    assert!(whole < t.prefill_at(8190.0) + d, "the mixed grid, not prefill + decode");

    // With chunks behind earlier tokens the shapes are the scheduler's floored means:
    // mean ISL (4094 + 8189) / 3 = 4094, mean prefix 4094 / 3 = 1364, so 3 × 2730 = 8190
    // new tokens; the prefix adds what the prefix table says it adds.
    let (_, _, pass) = got[3];
    let extra = t.prefill_with_prefix_at(8190.0, 1364.0) - t.prefill_with_prefix_at(8190.0, 0.0);
    let expected = t.mixed_at(8190.0, 3.0, 4097.0).unwrap() + extra.max(0.0);
    assert!(close(pass, expected), "{pass} vs {expected}");
}

#[test]
fn predict_applies_the_engines_speedup_ratios() {
    let dir = scratch("speedup");
    let rows = ["4096,1,0,0,0", "0,0,0,32,126264"];
    let plain = predict(&dir, &rows, &[]);
    let fast = predict(&dir, &rows, &["--engine-args", r#"{"speedup_ratio": 2, "decode_speedup_ratio": 4}"#]);
    assert!(close(fast[0].2, plain[0].2 / 2.0));
    // The engine divides decode time by both ratios.
    assert!(close(fast[1].2, plain[1].2 / 8.0));
}

#[test]
fn predict_refuses_bad_input_naming_the_line_and_column() {
    let dir = scratch("bad");
    let path = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let missing = path("missing.csv", "ctx_tokens,ctx_requests\n1,1\n");
    let out = assert_exit_2(
        &["profiles", "predict", "--timing-profile", PROFILE, "--input", &missing],
        &["missing column ctx_kv_tokens"],
    );
    assert!(stdout(&out).is_empty(), "nothing printed for a bad file");
    let bad = path("bad.csv", &format!("{HEADER}\n1,1,0,0,0\n5,1,0,x,0\n"));
    let out = assert_exit_2(
        &["profiles", "predict", "--timing-profile", PROFILE, "--input", &bad],
        &[":3: decode_requests", "non-negative integer"],
    );
    assert!(stdout(&out).is_empty());
    let orphan = path("orphan.csv", &format!("{HEADER}\n5,0,0,0,0\n"));
    assert_exit_2(&["profiles", "predict", "--input", &orphan], &[":2: ctx_requests"]);
    assert_exit_2(&["profiles", "predict", "--timing-profile", "nope", "--input", &orphan], &["nope"]);
    assert_exit_2(
        &["profiles", "predict", "--engine-type", "sglang", "--input", &orphan],
        &["--engine-type sglang"],
    );
}

fn python() -> String {
    std::env::var("MOCKER_PYTHON").unwrap_or_else(|_| "python3".into())
}

#[test]
fn the_calibration_script_reports_every_metric_on_tp1() {
    let out = Command::new(python())
        .arg(repo().join("scripts/calibrate.py"))
        .args(["--tp", "1", "--mocker", BIN, "--fit-on-tp", "1", "--list-outliers", "--markdown"])
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for section in ["== uncorrected (nothing fitted)", "== corrected: speedup_ratio", "(fitted on TP1)"] {
        assert!(text.contains(section), "{section:?} missing:\n{text}");
    }
    // Each metric, uncorrected and corrected, with its spread.
    for metric in ["context pass", "decode pass", "mixed pass", "request e2e"] {
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("  1  ") && l.contains(metric)).collect();
        assert_eq!(rows.len(), 2, "{metric}: {rows:?}");
        assert!(
            rows.iter().all(|r| r.contains("median") && r.contains("p90") && r.contains("bias")),
            "{rows:?}"
        );
    }
    assert!(
        text.lines().any(|l| l.contains("request e2e") && l.trim_end().ends_with("n=128")),
        "all 128 replayed"
    );
    assert!(text.contains("[in sample]"), "the fitted TP is marked in sample");
    // The collector's two impossible mixed passes (8185 and 8178 prefill tokens at 11.5 and
    // 11.9 ms beside ~409 ms peers) are flagged by the measurement-only rule.
    for ms in ["11.508", "11.901"] {
        assert!(
            text.lines().any(|l| l.starts_with("outlier: 1 mixed sweep") && l.contains(ms)),
            "{ms} ms pass not flagged:\n{text}"
        );
    }
    assert!(text.contains("| TP | context pass | decode pass | mixed pass |"), "markdown table");
}

#[test]
fn the_calibration_script_refuses_a_missing_tp() {
    let out = Command::new(python())
        .arg(repo().join("scripts/calibrate.py"))
        .args(["--tp", "3", "--mocker", BIN])
        .output()
        .expect("run python");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tp 3"));
}

#[test]
fn the_architecture_timing_is_calibrated_against_measured_passes_and_operators() {
    // Qwen3-32B's measured B300 passes at TP 4, priced from the architecture: every pass
    // kind within the accuracy docs/calibration.md reports (nothing fitted).
    let out = Command::new(python())
        .arg(repo().join("scripts/calibrate.py"))
        .args(["--tp", "4", "--mocker", BIN, "--architecture"])
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let mape = |metric: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with("  4  ") && l.contains(metric)).unwrap();
        let cell = line.split_whitespace().find(|w| w.ends_with('%')).unwrap();
        cell.trim_end_matches('%').parse().unwrap()
    };
    for (metric, bound) in [("context pass", 10.0), ("decode pass", 10.0), ("request e2e", 12.0)] {
        assert!(mape(metric) < bound, "{metric}: {} % MAPE\n{text}", mape(metric));
    }
    // Vidur's measured GEMMs on A100 (MIT, calibration/vidur-ops): the four projections of
    // five models at TP 1-8 within 15% pooled.
    let out = Command::new(python())
        .arg(repo().join("scripts/vidur_ops_check.py"))
        .args(["--mocker", BIN, "--max-tokens", "4096"])
        .output()
        .expect("run python");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = text
        .lines()
        .find(|l| l.contains("a100-80gb") && l.contains("4 GEMMs"))
        .unwrap_or_else(|| panic!("no pooled A100 GEMM line:\n{text}"));
    let mape: f64 =
        line.split_whitespace().find(|w| w.ends_with('%')).unwrap().trim_end_matches('%').parse().unwrap();
    assert!(mape < 15.0, "{line}");
}
