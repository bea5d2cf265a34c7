//! `native_host_offload` through the real binary: the combinations the reference refuses
//! (and the parts of its schema mocker does not simulate) exit 2 naming the key; the canonical
//! dump shows the tier with its defaults filled in, as the reference's does.

mod cli;

use cli::{assert_exit_2, mocker};

const SMALL: [&str; 6] = ["--input-tokens", "256", "--output-tokens", "4", "--request-count", "4"];
const HOST: &str = r#""kv_cache_bytes_per_token":1024,"native_host_offload":{"num_host_blocks":64}"#;

fn refused(engine: &str, needles: &[&str]) {
    let mut args = vec!["replay", "--engine-args", engine];
    args.extend_from_slice(&SMALL);
    assert_exit_2(&args, needles);
}

#[test]
fn combinations_the_reference_refuses_exit_2_naming_the_key() {
    let with = |extra: &str| format!("{{{HOST},{extra}}}");
    let key = "engine.native_host_offload";
    refused(&with(r#""backend":"sglang""#), &[key, "only for backend=vllm"]);
    refused(&with(r#""backend":"trtllm""#), &[key, "only for backend=vllm"]);
    refused(&with(r#""enable_prefix_caching":false"#), &[key, "requires enable_prefix_caching=true"]);
    refused(&with(r#""aic_nextn":1"#), &[key, "aic_nextn"]);
    refused(&with(r#""worker_type":"prefill""#), &[key, "worker_type=aggregated"]);
    let no_bytes = r#"{"native_host_offload":{"num_host_blocks":64}}"#;
    refused(no_bytes, &[key, "requires kv_cache_bytes_per_token"]);
    refused(
        r#"{"kv_cache_bytes_per_token":1024}"#,
        &["engine.kv_cache_bytes_per_token", "native_host_offload"],
    );
    let h = |body: &str| format!(r#"{{"kv_cache_bytes_per_token":1024,"native_host_offload":{body}}}"#);
    refused(&h(r#"{"num_host_blocks":0}"#), &["engine.native_host_offload.num_host_blocks", "1..="]);
    refused(&h(r#"{}"#), &["engine.native_host_offload.num_host_blocks", "missing"]);
    refused(
        &h(r#"{"num_host_blocks":8,"d2h_bandwidth_gbps":-1}"#),
        &["native_host_offload.d2h_bandwidth_gbps"],
    );
    refused(
        &h(r#"{"num_host_blocks":8,"scope":"cluster_shared"}"#),
        &["native_host_offload.scope", "cluster_shared"],
    );
    refused(&h(r#"{"num_host_blocks":8,"kv_layout_id":"x"}"#), &["native_host_offload.kv_layout_id"]);
    refused(&h(r#"{"num_host_blocks":8,"foo":1}"#), &["native_host_offload.foo", "unknown field"]);
    // G3 sits below the host tier, so it takes the host tier's restrictions, and its own.
    let g3 = |body: &str| format!(r#"{{{HOST},"g3_offload":{body}}}"#);
    let ok = r#"{"scope":"worker_local","num_g3_blocks":8}"#;
    refused(
        r#"{"g3_offload":{"scope":"worker_local","num_g3_blocks":8}}"#,
        &["engine.g3_offload", "requires native_host_offload"],
    );
    refused(
        &g3(r#"{"scope":"worker_local","num_g3_blocks":0}"#),
        &["g3_offload.num_g3_blocks", "must be positive"],
    );
    refused(
        &g3(r#"{"scope":"dp_rank_local","num_g3_blocks":8}"#),
        &["g3_offload.scope", "worker_local, cluster_shared"],
    );
    refused(&g3(r#"{"num_g3_blocks":8}"#), &["g3_offload.scope", "missing"]);
    refused(&g3(r#"{"scope":"worker_local"}"#), &["g3_offload.num_g3_blocks", "missing"]);
    refused(
        &g3(r#"{"scope":"worker_local","num_g3_blocks":8,"read_bandwidth_gbps":-1}"#),
        &["g3_offload.read_bandwidth_gbps", "finite and non-negative"],
    );
    refused(
        &g3(r#"{"scope":"worker_local","num_g3_blocks":8,"bandwidth":1}"#),
        &["g3_offload.bandwidth", "unknown field"],
    );
    let prefill = format!(r#"{{{HOST},"worker_type":"prefill","g3_offload":{ok}}}"#);
    refused(&prefill, &["engine.g3_offload", "worker_type=aggregated"]);
    let mut dp2 = vec!["replay", "--engine-args"];
    let dp_engine = format!(r#"{{"dp_size":2,"engine":{{{HOST},"g3_offload":{ok}}}}}"#);
    dp2.push(&dp_engine);
    dp2.extend_from_slice(&SMALL);
    assert_exit_2(&dp2, &["engine.g3_offload", "dp_size=1"]);
    // Only offline replay wakes an idle engine when a transfer lands.
    let engine = format!("{{{HOST}}}");
    assert_exit_2(&["serve", "--port", "0", "--engine-args", &engine], &[key, "offline replay"]);
    let mut online = vec!["replay", "--mode", "online", "--engine-args", &engine];
    online.extend_from_slice(&SMALL);
    assert_exit_2(&online, &[key, "offline"]);
}

#[test]
fn a_small_offloaded_replay_runs() {
    let engine = format!(r#"{{"num_gpu_blocks":16,{HOST}}}"#);
    let mut args = vec!["replay", "--engine-args", engine.as_str(), "--shared-prefix-ratio", "0.5"];
    args.extend_from_slice(&["--num-prefix-groups", "2"]);
    args.extend_from_slice(&SMALL);
    let out = mocker(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_small_g3_replay_reports_its_tier() {
    let engine = r#"{"num_gpu_blocks":16,"kv_cache_bytes_per_token":1024,"native_host_offload":{"num_host_blocks":8},
            "g3_offload":{"scope":"worker_local","num_g3_blocks":256}}"#;
    let dir = std::env::temp_dir().join(format!("mocker-g3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let report_arg = report.to_str().unwrap();
    let mut args = vec!["replay", "--engine-args", engine, "--shared-prefix-ratio", "0.5"];
    args.extend_from_slice(&["--num-prefix-groups", "2", "--report-json", report_arg]);
    args.extend_from_slice(&SMALL);
    let out = mocker(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&report).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let g3 = &v["g3_offload"];
    assert!(g3["write"]["submitted_jobs"].as_u64().unwrap() > 0, "{text}");
    assert_eq!(g3["pending_blocks"], 0, "the last writes finish before the report");
}
