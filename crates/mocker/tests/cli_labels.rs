//! `mocker replay` says what ran: the header above the table, the report's `run` object and
//! the plots' subtitles name the timing source, the KV capacity and its origin, the
//! backend, the workers and the router.

mod cli;

use std::path::Path;

use cli::{mocker, scratch, stderr, stdout};
use serde_json::{json, Value};

const WORKLOAD: [&str; 8] =
    ["--input-tokens", "300", "--output-tokens", "20", "--request-count", "12", "--concurrency", "4"];

/// Runs `mocker replay WORKLOAD <extra> --report-json`, returning (stdout, the report).
fn replay(dir: &Path, name: &str, extra: &[&str]) -> (String, Value) {
    let path = dir.join(format!("{name}.json"));
    let mut args = vec!["replay"];
    args.extend_from_slice(&WORKLOAD);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--report-json", path.to_str().unwrap()]);
    let out = mocker(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    (stdout(&out), serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap())
}

/// The header: every line before the table's title.
fn header(out: &str) -> Vec<&str> {
    let lines: Vec<&str> = out.lines().collect();
    let title = lines.iter().position(|l| *l == "mocker | LLM Metrics").unwrap_or_else(|| panic!("{out}"));
    assert!(lines[title + 1].starts_with('┏'), "the table follows its title:\n{out}");
    lines[..title].to_vec()
}

/// Every key a report had before `run` was added stays, with `run` the one addition.
fn assert_reference_keys_kept(r: &Value) {
    let keys = r.as_object().unwrap();
    assert_eq!(keys.len(), 82, "81 summary keys + run: {:?}", keys.keys().collect::<Vec<_>>());
    assert!(keys.contains_key("mean_ttft_ms") && keys.contains_key("kv_eviction_policy"));
}

#[test]
fn default_run_names_the_polynomial_and_the_default_capacity() {
    let dir = scratch("default");
    let (out, r) = replay(&dir, "r", &[]);
    let blocks = r["run"]["kv_capacity"]["blocks"].as_u64().unwrap();
    let tokens = blocks * 64;
    let group = |n: u64| {
        let s = n.to_string();
        let mut g = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i).is_multiple_of(3) {
                g.push(',');
            }
            g.push(c);
        }
        g
    };
    assert_eq!(
        header(&out),
        [
            "Run: offline replay, 1 worker, router round-robin, backend vllm".to_string(),
            "Timing: the reference's polynomial fit (default)".to_string(),
            format!(
                "KV cache per worker: {} blocks × 64 tokens = {} tokens (mocker's default num_gpu_blocks)",
                group(blocks),
                group(tokens)
            ),
        ]
    );
    assert_reference_keys_kept(&r);
    assert_eq!(
        r["run"],
        json!({
            "mode": "offline",
            "backend": "vllm",
            "router": "round-robin",
            "num_workers": 1,
            "timing": {"source": "polynomial", "description": "the reference's polynomial fit (default)"},
            "kv_capacity": {"blocks": blocks, "block_size": 64, "tokens": tokens, "source": "default"},
        })
    );
}

#[test]
fn a_bundled_profile_names_its_model_and_sizes_the_cache_from_memory() {
    let dir = scratch("bundled");
    let args = ["--timing-profile", "h200-qwen3-32b-vllm-tp2", "--num-workers", "2", "--router", "kv"];
    let (out, r) = replay(&dir, "r", &args);
    let h = header(&out);
    assert_eq!(h[0], "Run: offline replay, 2 workers, router kv, backend vllm");
    assert_eq!(
        h[1],
        "Timing: bundled profile h200-qwen3-32b-vllm-tp2 (--timing-profile): Qwen/Qwen3-32B × h200_sxm × vllm × TP 2"
    );
    assert!(h[2].starts_with("KV cache per worker: "), "{}", h[2]);
    assert!(
        h[2].ends_with(" tokens (derived from GPU memory by the profile, gpu_memory_utilization 0.9)"),
        "{}",
        h[2]
    );
    let run = &r["run"];
    assert_eq!(
        run["timing"]["profile"],
        json!({"model": "Qwen/Qwen3-32B", "gpu": "h200_sxm", "backend": "vllm", "tp": 2})
    );
    assert_eq!(
        (run["timing"]["source"].as_str(), run["timing"]["name"].as_str()),
        (Some("bundled_profile"), Some("h200-qwen3-32b-vllm-tp2"))
    );
    let kv = &run["kv_capacity"];
    assert_eq!(kv["source"], "profile_memory");
    assert_eq!(
        (kv["memory_fraction_key"].as_str(), kv["memory_fraction"].as_f64()),
        (Some("gpu_memory_utilization"), Some(0.9))
    );
    let (blocks, size) = (kv["blocks"].as_u64().unwrap(), kv["block_size"].as_u64().unwrap());
    assert_eq!(kv["tokens"].as_u64(), Some(blocks * size));
    assert!(blocks > 1000, "an H200 holds far more than a default pool: {blocks}");
    assert_eq!((run["num_workers"].as_u64(), run["router"].as_str()), (Some(2), Some("kv")));
    assert_reference_keys_kept(&r);
}

#[test]
fn explicit_num_gpu_blocks_is_reported_as_given() {
    let dir = scratch("explicit");
    let args = ["--engine-args", r#"{"num_gpu_blocks": 5000, "block_size": 32}"#, "--engine-type", "sglang"];
    let (out, r) = replay(&dir, "r", &args);
    let h = header(&out);
    assert_eq!(h[0], "Run: offline replay, 1 worker, router round-robin, backend sglang");
    assert_eq!(
        h[2],
        "KV cache per worker: 5,000 blocks × 32 tokens = 160,000 tokens (num_gpu_blocks from engine args)"
    );
    assert_eq!(
        r["run"]["kv_capacity"],
        json!({"blocks": 5000, "block_size": 32, "tokens": 160000, "source": "engine_args"})
    );
    assert_eq!(r["run"]["backend"], "sglang");
}

#[test]
fn a_fixed_timing_model_and_a_profile_file_are_named() {
    let dir = scratch("fixed");
    let fixed = r#"{"timing_model": {"type": "fixed", "prefill_ms": 20, "decode_ms": 10}}"#;
    let (out, r) = replay(&dir, "fixed", &["--engine-args", fixed]);
    assert_eq!(header(&out)[1], "Timing: fixed, 20 ms per prefill pass, 10 ms per decode pass");
    assert_eq!(
        (r["run"]["timing"]["prefill_ms"].as_f64(), r["run"]["timing"]["decode_ms"].as_f64()),
        (Some(20.0), Some(10.0))
    );
    let table = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../profiles/dynamo/h200-llama3.1-8b-fp8-tp1/perf_data.npz");
    let table = table.to_str().unwrap();
    let (out, r) = replay(&dir, "file", &["--planner-profile-data", table]);
    assert_eq!(header(&out)[1], format!("Timing: Dynamo profile {table} (--planner-profile-data)"));
    assert_eq!(r["run"]["timing"]["given_by"], "--planner-profile-data");
    assert!(r["run"]["timing"].get("profile").is_none(), "Dynamo's tables state no model");
}

#[test]
fn disaggregated_runs_name_both_pools_in_header_report_and_plots() {
    let dir = scratch("disagg");
    let plots = dir.join("plots");
    let args = [
        "--prefill-engine-args",
        r#"{"worker_type": "prefill", "num_gpu_blocks": 4000}"#,
        "--decode-engine-args",
        r#"{"worker_type": "decode"}"#,
        "--num-prefill-workers",
        "2",
        "--num-decode-workers",
        "3",
        "--plot",
        plots.to_str().unwrap(),
    ];
    let (out, r) = replay(&dir, "r", &args);
    let h = header(&out);
    assert_eq!(
        h[0],
        "Run: offline replay, disaggregated, 2 prefill + 3 decode workers, router round-robin, backend vllm"
    );
    assert_eq!(h[1], "Timing: the reference's polynomial fit (default)");
    assert!(
        h[2].starts_with(
            "KV cache per prefill worker: 4,000 blocks × 64 tokens = 256,000 tokens (num_gpu_blocks"
        ),
        "{}",
        h[2]
    );
    assert!(
        h[3].starts_with("KV cache per decode worker: ")
            && h[3].ends_with("(mocker's default num_gpu_blocks)"),
        "{}",
        h[3]
    );
    let run = &r["run"];
    assert_eq!((run["num_prefill_workers"].as_u64(), run["num_decode_workers"].as_u64()), (Some(2), Some(3)));
    assert_eq!(run["prefill_kv_capacity"]["blocks"], 4000);
    assert_eq!(run["decode_timing"]["source"], "polynomial");
    assert!(run.get("num_workers").is_none());
    let hits = std::fs::read_to_string(plots.join("worker_cache_hit_rate.svg")).unwrap();
    for want in [">\nprefill 0\n<", ">\nprefill 1\n<", "per prefill worker", "2 prefill + 3 decode workers"] {
        assert!(hits.contains(want), "cache-hit chart lacks {want}");
    }
}

#[test]
fn every_plot_names_the_run_and_the_itl_axis_stops_at_the_p99() {
    let dir = scratch("plots");
    let plots = dir.join("plots");
    let (_, _) =
        replay(&dir, "r", &["--num-workers", "2", "--router", "kv", "--plot", plots.to_str().unwrap()]);
    let subtitle = "2 workers, router kv, vllm, timing: polynomial (reference fit)";
    for chart in ["ttft_cdf", "itl_cdf", "throughput", "queue_depth", "worker_cache_hit_rate"] {
        let svg = std::fs::read_to_string(plots.join(format!("{chart}.svg"))).unwrap();
        assert!(svg.contains(subtitle), "{chart} lacks the run's subtitle");
    }
    let itl = std::fs::read_to_string(plots.join("itl_cdf.svg")).unwrap();
    assert!(itl.contains("inter-token latency (ms), clipped at p99 = "), "ITL axis not clipped");
}

#[test]
fn online_mode_prints_the_same_header() {
    let dir = scratch("online");
    let (out, r) = replay(&dir, "r", &["--mode", "online", "--engine-args", r#"{"speedup_ratio": 50}"#]);
    assert_eq!(header(&out)[0], "Run: online replay, 1 worker, router round-robin, backend vllm");
    assert_eq!(r["run"]["mode"], "online");
}
