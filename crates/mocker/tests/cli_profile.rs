//! Measured timing profiles (`--planner-profile-data`, engine args `timing_model` with the
//! `dynamo_profile` provider): replays equal the reference's figures, and every way of
//! naming a bad profile is a usage error that names it.

mod cli;

use std::path::PathBuf;

use cli::{assert_exit_2, report, scratch};
use serde_json::Value;

fn h200() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../profiles/dynamo/h200-llama3.1-8b-fp8-tp1")
}

fn table() -> String {
    h200().join("perf_data.npz").to_string_lossy().into_owned()
}

const ENGINE: &str =
    r#"{"block_size":64,"num_gpu_blocks":16384,"max_num_seqs":256,"max_num_batched_tokens":8192}"#;

/// Asserts (duration, mean TTFT, p99 TTFT, mean ITL) equal the reference's to rounding.
fn assert_figures(s: &Value, want: [f64; 4]) {
    let keys = ["duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms"];
    for (k, w) in keys.iter().zip(want) {
        let got = s[k].as_f64().unwrap();
        assert!((got - w).abs() <= 1e-6 * w.max(1.0), "{k}: {got} vs reference {w}");
    }
}

#[test]
fn the_h200_table_replays_to_the_reference_figures() {
    let dir = scratch("h200");
    let workload = [
        "--input-tokens",
        "3000",
        "--output-tokens",
        "300",
        "--request-count",
        "2000",
        "--concurrency",
        "128",
    ];
    let mut args = workload.to_vec();
    let path = table();
    args.extend(["--engine-args", ENGINE, "--planner-profile-data", &path]);
    let s = report(&dir, "flag", &args);
    // The reference (ai-dynamo-runtime 1.6.1) on the same table and workload.
    assert_figures(&s, [219533.201757, 484.986266, 7147.506661, 45.035413]);

    // The engine-args form is the same model.
    let engine = format!(
        r#"{{"engine": {{"block_size":64,"num_gpu_blocks":16384,"max_num_seqs":256,"max_num_batched_tokens":8192,
            "timing_model": {{"type": "external", "provider": "dynamo_profile", "config": {{"path": {path:?}}}}}}}}}"#
    );
    let mut args = workload.to_vec();
    args.extend(["--engine-args", &engine]);
    assert_figures(&report(&dir, "engine_args", &args), [219533.201757, 484.986266, 7147.506661, 45.035413]);
}

#[test]
fn other_shapes_and_backends_match_the_reference_on_the_table() {
    let dir = scratch("shapes");
    let path = table();
    // Prefix sharing under Poisson arrivals, small KV pool.
    let s = report(
        &dir,
        "prefix",
        &[
            "--input-tokens",
            "2000",
            "--output-tokens",
            "200",
            "--request-count",
            "400",
            "--request-rate",
            "15",
            "--arrival-seed",
            "42",
            "--shared-prefix-ratio",
            "0.5",
            "--num-prefix-groups",
            "8",
            "--engine-args",
            r#"{"block_size":64,"num_gpu_blocks":2000,"max_num_seqs":128,"max_num_batched_tokens":4096}"#,
            "--planner-profile-data",
            &path,
        ],
    );
    assert_figures(&s, [28703.929130, 507.806156, 1772.577811, 31.937472]);
    // SGLang's scheduler on the same table.
    let s = report(
        &dir,
        "sglang",
        &[
            "--input-tokens",
            "1500",
            "--output-tokens",
            "150",
            "--request-count",
            "200",
            "--concurrency",
            "32",
            "--engine-args",
            r#"{"backend":"sglang","num_gpu_blocks":200000,"max_num_seqs":128,"max_num_batched_tokens":8192}"#,
            "--planner-profile-data",
            &path,
        ],
    );
    assert_figures(&s, [15573.981632, 579.134481, 988.828912, 11.954675]);
    // Four round-robin workers with speedup ratios applied after the lookup.
    let s = report(
        &dir,
        "speedup",
        &[
            "--input-tokens",
            "1000",
            "--output-tokens",
            "100",
            "--request-count",
            "400",
            "--concurrency",
            "64",
            "--num-workers",
            "4",
            "--router",
            "round-robin",
            "--engine-args",
            r#"{"block_size":64,"num_gpu_blocks":16384,"speedup_ratio":2.0,"decode_speedup_ratio":1.5}"#,
            "--planner-profile-data",
            &path,
        ],
    );
    assert_figures(&s, [2490.411607, 89.132498, 166.373221, 2.910082]);
}

#[test]
fn the_raw_profiler_directory_replays_like_the_reference_converted_table() {
    let dir = scratch("raw");
    let raw = h200().to_string_lossy().into_owned();
    let s = report(
        &dir,
        "raw",
        &[
            "--input-tokens",
            "1200",
            "--output-tokens",
            "100",
            "--request-count",
            "100",
            "--concurrency",
            "16",
            "--engine-args",
            r#"{"block_size":64,"num_gpu_blocks":4096,"max_num_seqs":64,"max_num_batched_tokens":2048}"#,
            "--planner-profile-data",
            &raw,
        ],
    );
    // The reference replaying the table its own launcher converted from this directory.
    assert_figures(&s, REFERENCE_CONVERTED_RAW);
}

/// Reference figures for `the_raw_profiler_directory_replays_like_the_reference_converted_table`.
const REFERENCE_CONVERTED_RAW: [f64; 4] = [7382.95903, 92.951104, 443.957184, 10.257552];

#[test]
fn bad_profiles_exit_2_naming_the_path_and_the_source() {
    let dir = scratch("bad");
    let junk = dir.join("junk.npz");
    std::fs::write(&junk, "not an archive").unwrap();
    let junk = junk.to_string_lossy().into_owned();
    let base = [
        "replay",
        "--input-tokens",
        "100",
        "--output-tokens",
        "2",
        "--request-count",
        "1",
        "--concurrency",
        "1",
    ];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
    let run = |args: Vec<String>, needles: &[&str]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_exit_2(&args, needles);
    };
    run(
        with(&["--planner-profile-data", "/no/such/profile.npz"]),
        &["--planner-profile-data", "/no/such/profile.npz"],
    );
    run(with(&["--planner-profile-data", &junk]), &["--planner-profile-data", &junk, ".npz archive"]);
    let engine = format!(
        r#"{{"timing_model": {{"type": "external", "provider": "dynamo_profile", "config": {{"path": {junk:?}}}}}}}"#
    );
    run(with(&["--engine-args", &engine]), &["--engine-args", &junk]);
    // Two timing sources are refused rather than one silently winning.
    let fixed = r#"{"timing_model": {"type": "fixed", "prefill_ms": 1, "decode_ms": 1}}"#;
    let path = table();
    run(
        with(&["--engine-args", fixed, "--planner-profile-data", &path]),
        &["--planner-profile-data", "timing_model"],
    );
    // Serve refuses a bad profile before it binds anything.
    assert_exit_2(&["serve", "--port", "0", "--planner-profile-data", "/no/such/dir"], &["/no/such/dir"]);
}

#[test]
fn every_bundled_profile_runs_a_small_replay() {
    let out = cli::mocker(&["profiles"]);
    assert!(out.status.success());
    let listing = cli::stdout(&out);
    let mut lines = listing.lines();
    assert_eq!(lines.next(), Some("name\tmodel\tgpu\tbackend\ttp"), "{listing}");
    assert!(cli::stderr(&out).contains("replay --timing-profile NAME"), "how to use a profile");
    let names: Vec<&str> = lines.map(|l| l.split('\t').next().unwrap()).collect();
    assert!(names.len() >= 9, "{listing}");
    for want in ["h100-llama3.1-8b-vllm-tp1", "h200-qwen3-32b-sglang-tp2", "h100-llama3.1-8b-trtllm-tp1"] {
        assert!(names.contains(&want), "{want} missing from {listing}");
    }
    let dir = scratch("bundled");
    let mut ttfts = Vec::new();
    for name in &names {
        let s = report(
            &dir,
            name,
            &[
                "--input-tokens",
                "3000",
                "--output-tokens",
                "20",
                "--request-count",
                "8",
                "--concurrency",
                "4",
                "--timing-profile",
                name,
            ],
        );
        assert_eq!(s["completed_requests"], 8, "{name}: {s}");
        let ttft = s["mean_ttft_ms"].as_f64().unwrap();
        assert!(ttft > 0.0, "{name}");
        ttfts.push(ttft);
    }
    // Different hardware and models time differently.
    ttfts.sort_by(f64::total_cmp);
    ttfts.dedup();
    assert_eq!(ttfts.len(), names.len(), "two profiles gave identical TTFTs");
}

#[test]
fn a_profiles_memory_facts_size_the_kv_cache() {
    let dir = scratch("capacity");
    let run = |name: &str, engine: &str| {
        report(
            &dir,
            name,
            &[
                "--input-tokens",
                "70000",
                "--output-tokens",
                "2",
                "--request-count",
                "1",
                "--concurrency",
                "1",
                "--timing-profile",
                "b300-qwen3-32b-vllm-tp1",
                "--engine-args",
                engine,
            ],
        )
    };
    // At 0.9 of a B300 the 70k-token prompt fits; at 0.3 the weights leave room for ~60k tokens.
    assert_eq!(run("roomy", r#"{"block_size":16}"#)["completed_requests"], 1);
    assert_eq!(run("tight", r#"{"block_size":16,"gpu_memory_utilization":0.3}"#)["completed_requests"], 0);
    // An explicit block count wins; the profile's TP sets the GPUs each worker counts.
    assert_eq!(run("explicit", r#"{"block_size":16,"num_gpu_blocks":100000}"#)["completed_requests"], 1);
    let tp2 = report(
        &dir,
        "tp2",
        &[
            "--input-tokens",
            "100",
            "--output-tokens",
            "2",
            "--request-count",
            "1",
            "--concurrency",
            "1",
            "--timing-profile",
            "b300-qwen3-32b-vllm-tp2",
        ],
    );
    assert_eq!(tp2["decode_gpus_per_worker"], 2);
}

#[test]
fn memory_keys_and_profile_names_that_cannot_apply_exit_2() {
    let base = [
        "replay",
        "--input-tokens",
        "100",
        "--output-tokens",
        "2",
        "--request-count",
        "1",
        "--concurrency",
        "1",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> { base.iter().chain(extra).copied().collect() };
    assert_exit_2(
        &with(&["--timing-profile", "h900-nothing"]),
        &["--timing-profile", "h100-llama3.1-8b-vllm-tp1"],
    );
    assert_exit_2(
        &with(&["--engine-args", r#"{"gpu_memory_utilization": 0.8}"#]),
        &["gpu_memory_utilization", "num_gpu_blocks"],
    );
    assert_exit_2(
        &with(&[
            "--timing-profile",
            "b300-qwen3-32b-vllm-tp1",
            "--engine-args",
            r#"{"mem_fraction_static": 0.8}"#,
        ]),
        &["mem_fraction_static", "vllm"],
    );
    assert_exit_2(
        &with(&[
            "--timing-profile",
            "b300-qwen3-32b-vllm-tp1",
            "--engine-args",
            r#"{"num_gpu_blocks": 100, "gpu_memory_utilization": 0.8}"#,
        ]),
        &["gpu_memory_utilization", "num_gpu_blocks"],
    );
    assert_exit_2(
        &with(&[
            "--timing-profile",
            "b300-qwen3-32b-vllm-tp1",
            "--engine-args",
            r#"{"tensor_parallel_size": 4}"#,
        ]),
        &["tensor_parallel_size", "TP 1"],
    );
    let path = table();
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--timing-profile", "b300-qwen3-32b-vllm-tp1", "--planner-profile-data", &path])
        .collect();
    assert_exit_2(&args, &["--planner-profile-data", "--timing-profile", "one timing source"]);
}
