//! `mocker replay --report-passes`: one record per simulated forward pass, steady runs
//! expanded, consistent with the report it ran beside.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mocker");

fn scratch(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("passes-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a replay with `args`; returns the pass records and the JSON report.
fn replay(name: &str, args: &[&str]) -> (Vec<Value>, Value) {
    let dir = scratch(name);
    let (passes, report) = (dir.join("passes.jsonl"), dir.join("report.json"));
    let out = Command::new(BIN)
        .arg("replay")
        .args(args)
        .arg("--report-passes")
        .arg(&passes)
        .arg("--report-json")
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let records =
        std::fs::read_to_string(&passes).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let report = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (records, report)
}

fn sum(records: &[Value], key: &str, pool: Option<&str>) -> u64 {
    records.iter().filter(|r| pool.is_none_or(|p| r["pool"] == p)).map(|r| r[key].as_u64().unwrap()).sum()
}

/// Each worker's passes follow one another without overlap, and the last ends the run.
fn check_timeline(records: &[Value], report: &Value) {
    let workers = records.iter().map(|r| r["worker"].as_u64().unwrap()).max().unwrap();
    for w in 0..=workers {
        let mut last_end = 0.0;
        for r in records.iter().filter(|r| r["worker"] == w) {
            let (start, end) = (r["start_ms"].as_f64().unwrap(), r["end_ms"].as_f64().unwrap());
            assert!(start >= last_end - 1e-9 && end >= start, "worker {w}: {r}");
            last_end = end;
        }
    }
    let last = records.iter().map(|r| r["end_ms"].as_f64().unwrap()).fold(0.0, f64::max);
    assert!((last - report["duration_ms"].as_f64().unwrap()).abs() < 1e-6, "{last} vs {report}");
}

#[test]
fn every_pass_is_recorded_and_adds_up_to_the_report() {
    // Five closed-loop waves of 4 requests: one prefill pass and 39 decode passes each
    // (most of them inside steady runs, which must come out one record per pass).
    let args = [
        "--input-tokens",
        "300",
        "--output-tokens",
        "40",
        "--request-count",
        "20",
        "--concurrency",
        "4",
        "--engine-args",
        r#"{"block_size": 16, "num_gpu_blocks": 200}"#,
    ];
    let (records, report) = replay("agg", &args);
    assert_eq!(records.len(), 5 * 40);
    assert_eq!(sum(&records, "prefill_tokens", None), report["committed_prefill_tokens"].as_u64().unwrap());
    // Every output token is a request's first (from its prefill pass) or one decode.
    let outputs = report["total_output_tokens"].as_u64().unwrap();
    assert_eq!(
        sum(&records, "num_decode_requests", None) + report["completed_requests"].as_u64().unwrap(),
        outputs
    );
    // Within a wave each decode pass attends to one more token per request.
    let decode: Vec<u64> = records[1..40].iter().map(|r| r["decode_kv_tokens"].as_u64().unwrap()).collect();
    assert!(decode.windows(2).all(|w| w[1] == w[0] + 4), "{decode:?}");
    assert!(records.iter().all(|r| r["pool"] == "agg" && r["kv_blocks_total"] == 200));
    check_timeline(&records, &report);

    // The other backends' schedulers (and SGLang's steady runs) record the same way.
    for engine in
        [r#"{"backend": "sglang", "num_gpu_blocks": 3000}"#, r#"{"backend": "trtllm", "block_size": 16}"#]
    {
        let (records, report) = replay("backend", &[&args[..8], &["--engine-args", engine]].concat());
        assert_eq!(records.len(), 5 * 40, "{engine}");
        assert_eq!(
            sum(&records, "prefill_tokens", None),
            report["committed_prefill_tokens"].as_u64().unwrap()
        );
        let completed = report["completed_requests"].as_u64().unwrap();
        assert_eq!(sum(&records, "num_decode_requests", None) + completed, outputs, "{engine}");
        check_timeline(&records, &report);
    }

    // A pool too small for the batch preempts, and the records say so.
    let tight = [&args[..8], &["--engine-args", r#"{"block_size": 16, "num_gpu_blocks": 80}"#]].concat();
    let (records, report) = replay("tight", &tight);
    assert!(sum(&records, "num_preempted", None) > 0);
    assert!(records.iter().all(|r| r["kv_blocks_used"].as_u64().unwrap() <= 80));
    check_timeline(&records, &report);
}

#[test]
fn disaggregated_passes_name_their_pool() {
    let (records, report) = replay(
        "disagg",
        &[
            "--input-tokens",
            "300",
            "--output-tokens",
            "20",
            "--request-count",
            "12",
            "--concurrency",
            "4",
            "--prefill-engine-args",
            r#"{"worker_type": "prefill", "block_size": 16}"#,
            "--decode-engine-args",
            r#"{"worker_type": "decode", "block_size": 16}"#,
        ],
    );
    // Prompts are computed only on the prefill pool; the decode pool only decodes.
    assert_eq!(sum(&records, "prefill_tokens", Some("decode")), 0);
    assert_eq!(sum(&records, "prefill_tokens", Some("prefill")), 12 * 300);
    assert_eq!(sum(&records, "num_decode_requests", Some("prefill")), 0);
    assert!(sum(&records, "num_decode_requests", Some("decode")) > 0);
    check_timeline(&records, &report);
}

#[test]
fn online_replay_and_sweep_refuse_it() {
    for args in [
        &["replay", "--mode", "online", "--report-passes", "/tmp/never.jsonl"][..],
        &["sweep", "--report-passes", "/tmp/never.jsonl", "--concurrency", "2", "--sweep-num-workers", "1,2"]
            [..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.starts_with("error: --report") && stderr.contains("--report-passes"),
            "{args:?}: {stderr}"
        );
    }
}
