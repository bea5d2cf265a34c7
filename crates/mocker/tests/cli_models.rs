//! `--model`, `--gpu` and `--tensor-parallel-size` through the real binary: unknown names
//! exit 2 listing what exists, the catalogue lists, a sweep over GPUs and TP, and
//! `profiles predict` pricing passes from the architecture.

use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mocker");
const WORKLOAD: [&str; 8] =
    ["--input-tokens", "2000", "--output-tokens", "64", "--request-count", "24", "--request-rate", "4"];

fn mocker(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mocker-cli-models-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn unknown_models_and_gpus_exit_2_listing_the_known_ones() {
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["--model", "acme/NoSuch-7B"],
            &["--model", "acme/NoSuch-7B", "meta-llama/Llama-3.1-8B", "openai/gpt-oss-20b"],
        ),
        (
            &["--model", "meta-llama/Llama-3.1-8B", "--gpu", "v100"],
            &["--gpu", "v100", "h100", "l40s", "mi300x"],
        ),
        (&["--gpu", "h100"], &["--gpu", "--model"]),
        (
            &["--model", "meta-llama/Llama-3.1-8B", "--kv-cache-dtype", "int2"],
            &["--kv-cache-dtype", "fp8_e4m3"],
        ),
        (
            &["--model", "meta-llama/Llama-3.1-8B", "--timing-profile", "h100-llama3.1-8b-vllm-tp1"],
            &["--model", "--timing-profile", "one timing source"],
        ),
    ];
    for (flags, words) in cases {
        for cmd in ["replay", "serve"] {
            let mut args = vec![cmd];
            if cmd == "replay" {
                args.extend_from_slice(&WORKLOAD);
            } else {
                args.extend_from_slice(&["--port", "0"]);
            }
            args.extend_from_slice(flags);
            let out = mocker(&args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
            for w in words {
                assert!(stderr(&out).contains(w), "{args:?}: {w:?} missing from {}", stderr(&out));
            }
        }
    }
}

#[test]
fn the_catalogue_lists_its_models_and_gpus() {
    let models = mocker(&["profiles", "models"]);
    assert!(models.status.success());
    let text = String::from_utf8_lossy(&models.stdout);
    assert!(text.starts_with("model\tarchitecture\t"));
    let mixtral =
        text.lines().find(|l| l.starts_with("mistralai/Mixtral-8x7B-v0.1\t")).expect("Mixtral listed");
    assert!(mixtral.contains("8x top-2") && mixtral.contains("46.7"), "{mixtral}");
    assert!(text.lines().count() > 30);
    let gpus = mocker(&["profiles", "gpus"]);
    let text = String::from_utf8_lossy(&gpus.stdout);
    assert!(text.lines().any(|l| l.starts_with("l40s\t") && l.contains("(measured)")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("l4\t") && l.contains("scaled")), "{text}");
}

#[test]
fn a_sweep_crosses_gpus_and_tensor_parallel_sizes() {
    let dir = scratch("sweep");
    let json_path = dir.join("sweep.json");
    let mut args = vec!["sweep"];
    args.extend_from_slice(&WORKLOAD);
    args.extend_from_slice(&[
        "--engine-args",
        r#"{"model": "Qwen/Qwen3-14B"}"#,
        "--sweep-engine-args",
        r#"{"gpu": "l40s", "tensor_parallel_size": 1}"#,
        "--sweep-engine-args",
        r#"{"gpu": "l40s", "tensor_parallel_size": 2}"#,
        "--sweep-engine-args",
        r#"{"gpu": "h100", "tensor_parallel_size": 1}"#,
        "--output-json",
        json_path.to_str().unwrap(),
    ]);
    let out = mocker(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let ttft: Vec<f64> =
        json["points"].as_array().unwrap().iter().map(|p| p["mean_ttft_ms"].as_f64().unwrap()).collect();
    // Two L40S prefill faster than one; an H100 faster than either.
    assert!(ttft[1] < ttft[0] && ttft[2] < ttft[1], "{ttft:?}");
}

#[test]
fn predict_prices_passes_from_the_architecture() {
    let dir = scratch("predict");
    let input = dir.join("passes.csv");
    std::fs::write(
        &input,
        "ctx_tokens,ctx_requests,ctx_kv_tokens,decode_requests,decode_kv_tokens\n1024,1,0,0,0\n0,0,0,32,65536\n",
    )
    .unwrap();
    let price = |gpu: &str, tp: &str| -> Vec<f64> {
        let out = mocker(&[
            "profiles",
            "predict",
            "--input",
            input.to_str().unwrap(),
            "--model",
            "meta-llama/Llama-3.1-70B",
            "--gpu",
            gpu,
            "--tensor-parallel-size",
            tp,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().skip(1).map(|l| l.rsplit(',').next().unwrap().parse().unwrap()).collect()
    };
    let (h100x4, h100x8, a100x4) = (price("h100", "4"), price("h100", "8"), price("a100", "4"));
    for i in 0..2 {
        assert!(h100x8[i] < h100x4[i] && h100x4[i] < a100x4[i], "{h100x4:?} {h100x8:?} {a100x4:?}");
    }
    // 70 B at TP4 on H100s: one decode step of 32 requests reads ~35 GB of weights per GPU
    // at 3.35 TB/s, about 11 ms plus attention and all-reduces.
    assert!((10.0..30.0).contains(&h100x4[1]), "{h100x4:?}");
}

/// The KV blocks `mocker serve` reports at start with `args`.
fn serve_blocks(args: &[&str]) -> (u64, u64) {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0"])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("KV blocks"))
        .expect("a start line");
    let _ = child.kill();
    let _ = child.wait();
    // "mocker: engine vllm, N KV blocks × B tokens per rank, ..."
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "KV").unwrap();
    (words[at - 1].parse().unwrap(), words[at + 3].parse().unwrap())
}

#[test]
fn serves_engine_flags_size_the_cache_as_their_engine_args_keys_do() {
    // Flags act before the memory is divided into blocks: twice the block size, half the blocks.
    let model = ["--model", "meta-llama/Llama-3.1-8B", "--gpu", "h100"];
    let (b16, s16) = serve_blocks(&[&model[..], &["--block-size", "16"]].concat());
    let (b32, s32) = serve_blocks(&[&model[..], &["--block-size", "32"]].concat());
    assert_eq!((s16, s32), (16, 32));
    assert!(b32 == b16 / 2 || b32 == b16 / 2 + 1, "{b16} blocks of 16, {b32} of 32");
    let (flag, _) =
        serve_blocks(&[&model[..], &["--block-size", "16", "--max-num-batched-tokens", "2048"]].concat());
    assert!(flag > b16, "a smaller batch leaves more memory for KV: {flag} vs {b16}");
    let (given, _) = serve_blocks(&[&model[..], &["--num-gpu-blocks", "777"]].concat());
    assert_eq!(given, 777);
}

/// A model with sliding-window layers pages them as KV cache groups, as vLLM's hybrid KV
/// cache manager: more requests fit than with every layer sized as full attention, the run
/// says so and reports the groups; the KV router (which reads KV events groups do not emit)
/// is refused with the flag that sizes them uniformly.
#[test]
fn sliding_window_models_get_their_hybrid_capacity() {
    let dir = scratch("hybrid");
    let load = [
        "--input-tokens",
        "8000",
        "--output-tokens",
        "300",
        "--request-count",
        "120",
        "--concurrency",
        "120",
    ];
    let run = |extra: &[&str], name: &str| -> (Value, String) {
        let path = dir.join(format!("{name}.json"));
        let mut args = vec!["replay", "--model", "google/gemma-3-27b-it"];
        args.extend(load);
        args.extend(extra);
        args.extend(["--report-json", path.to_str().unwrap()]);
        let out = mocker(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        (serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap(), stderr(&out))
    };
    let (hybrid, note) = run(&[], "hybrid");
    assert!(note.contains("10 full-attention layers and 52 sliding-window layers (window 1024)"), "{note}");
    let (uniform, quiet) = run(&["--disable-hybrid-kv-cache-manager"], "uniform");
    assert!(!quiet.contains("sliding-window"), "{quiet}");
    let kv = |r: &Value| r["run"]["kv_capacity"].clone();
    let groups = kv(&hybrid);
    assert_eq!(groups["kv_cache_groups"][1]["sliding_window"], 1024, "{groups}");
    assert!(kv(&uniform).get("kv_cache_groups").is_none());
    assert!(groups["tokens"].as_u64().unwrap() > 5 * kv(&uniform)["tokens"].as_u64().unwrap());
    // The report says what each group held at its peak; the windows a small share.
    let peaks = hybrid["kv_cache_group_peak_usage"].as_array().expect("per-group peaks").clone();
    assert_eq!(peaks.len(), 2, "{peaks:?}");
    let share = |i: usize| peaks[i]["peak_usage"].as_f64().unwrap();
    assert!(share(0) > 0.5 && share(0) <= 1.0 && share(1) > 0.0 && share(1) < share(0), "{peaks:?}");
    assert!(uniform.get("kv_cache_group_peak_usage").is_none());
    // Under this load the uniform cache holds a few requests at a time; the groups many.
    let rps = |r: &Value| r["request_throughput_rps"].as_f64().unwrap();
    assert!(rps(&hybrid) > 1.5 * rps(&uniform), "{} vs {}", rps(&hybrid), rps(&uniform));
    let mut args = vec!["replay", "--model", "google/gemma-3-27b-it", "--router", "kv"];
    args.extend(load);
    let out = mocker(&args);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--disable-hybrid-kv-cache-manager"), "{}", stderr(&out));
}

/// Qwen3-Next-80B-A3B's `config.json`, read here to compute its state independently.
fn qwen3_next_config() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../mocker-models/data/models/Qwen--Qwen3-Next-80B-A3B-Instruct.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A model with recurrent layers (Qwen3-Next's gated delta net) gets the reference's state
/// cache from its config.json: vLLM's attention block size, the attention layers' bytes a
/// token, each request's state as vLLM's padded pages, all from one memory budget. Sized
/// as if every layer attended (the same config as a Qwen3-MoE), the pool holds a quarter of
/// the tokens. `serve` starts with the blocks offline replay reports.
#[test]
fn recurrent_models_get_their_state_cache_from_config_json() {
    let c = qwen3_next_config();
    let n = |k: &str| c[k].as_u64().unwrap();
    let tp = 4;
    // vLLM's gated_delta_net_state_shape at TP 4, bf16: the convolution keeps kernel-1
    // columns of q, k and v; the temporal state is value heads x key dim x value dim.
    let conv_dim = 2 * n("linear_num_key_heads") * n("linear_key_head_dim")
        + n("linear_num_value_heads") * n("linear_value_head_dim");
    let conv = conv_dim / tp * (n("linear_conv_kernel_dim") - 1);
    let temporal = n("linear_num_value_heads") / tp * n("linear_key_head_dim") * n("linear_value_head_dim");
    let state_layer = (conv + temporal) * 2;
    let layers = n("num_hidden_layers");
    let attention_layers = layers / n("full_attention_interval");
    let recurrent_layers = layers - attention_layers;
    assert_eq!((attention_layers, recurrent_layers, state_layer), (12, 36, 274_432));
    // 2 KV heads over 4 GPUs: one each, replicated.
    let token_layer = 2 * (n("num_key_value_heads") / tp).max(1) * n("head_dim") * 2;
    // vLLM raises the block size to a multiple of 16 whose attention page holds a state.
    let block = 16 * state_layer.div_ceil(16 * token_layer);
    assert_eq!(block, 272);
    let per_token = attention_layers * token_layer;
    let padded = recurrent_layers * block * token_layer;
    let state_blocks = padded.div_ceil(block * per_token);
    assert_eq!((per_token, padded, state_blocks), (12_288, 10_027_008, 3));

    let dir = scratch("recurrent");
    let run = |model: &str, extra: &[&str], name: &str| -> (Value, String) {
        let path = dir.join(format!("{name}.json"));
        let mut args = vec!["replay", "--model", model, "--gpu", "h100", "--tensor-parallel-size", "4"];
        args.extend(WORKLOAD);
        args.extend(extra);
        args.extend(["--report-json", path.to_str().unwrap()]);
        let out = mocker(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        (serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap(), stderr(&out))
    };
    let (report, note) = run("Qwen/Qwen3-Next-80B-A3B-Instruct", &[], "next");
    assert!(
        note.contains("36 gated delta net layers keep 9879552 bytes a request on each GPU (10027008 in vLLM's pages), 3 of the pool's 272-token blocks"),
        "{note}"
    );
    assert!(note.contains("prefix caching off, as vLLM's default for hybrid models"), "{note}");
    let kv = report["run"]["kv_capacity"].clone();
    assert_eq!(
        (kv["block_size"].as_u64(), kv["source"].as_str()),
        (Some(block), Some("model_memory")),
        "{kv}"
    );
    let st = &kv["state_cache"];
    assert_eq!(st["bytes_per_request"], padded, "{kv}");
    assert_eq!(st["blocks_per_request"], state_blocks, "{kv}");
    assert_eq!(st["kv_cache_bytes_per_token"], per_token, "{kv}");
    let blocks = kv["blocks"].as_u64().unwrap();
    assert_eq!(st["max_requests"], blocks / (state_blocks + 1), "{kv}");
    assert_eq!(kv["tokens"], blocks * block);

    // The same model with every layer attending: a Qwen3-MoE of the same widths.
    let dense_dir = dir.join("dense");
    std::fs::create_dir_all(&dense_dir).unwrap();
    let mut dense = c.clone();
    dense["architectures"] = serde_json::json!(["Qwen3MoeForCausalLM"]);
    dense["model_type"] = "qwen3_moe".into();
    std::fs::write(dense_dir.join("config.json"), dense.to_string()).unwrap();
    let (dense_report, dense_note) = run(dense_dir.to_str().unwrap(), &[], "dense");
    assert!(!dense_note.contains("recurrent"), "{dense_note}");
    let dkv = dense_report["run"]["kv_capacity"].clone();
    assert!(dkv.get("state_cache").is_none() && dkv["block_size"] == 16, "{dkv}");
    // One budget (the weights differ by the mixers' projections, about 1 %) split into
    // four times the layers' KV a token.
    let budget = (blocks * block * per_token) as f64;
    let dense_budget = (dkv["blocks"].as_u64().unwrap() * 16 * layers * token_layer) as f64;
    assert!((budget / dense_budget - 1.0).abs() < 0.03, "{budget} vs {dense_budget}");
    let (tokens, dense_tokens) = (kv["tokens"].as_u64().unwrap(), dkv["tokens"].as_u64().unwrap());
    assert!(tokens > 3 * dense_tokens && tokens < 5 * dense_tokens, "{tokens} vs {dense_tokens}");

    // Prefix caching asked for runs in align mode.
    let (_, align) = run(
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        &["--engine-args", r#"{"enable_prefix_caching": true}"#],
        "align",
    );
    assert!(align.contains("prefix caching in align mode (prefix_match_unit = block_size)"), "{align}");

    // serve sizes the same pool and says what a state takes.
    let line = serve_start_line(&[
        "--model",
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        "--gpu",
        "h100",
        "--tensor-parallel-size",
        "4",
    ]);
    assert!(
        line.contains(&format!("{blocks} KV blocks × {block} tokens per rank, shared with a recurrent state of 3 blocks ({padded} bytes) a request")),
        "{line}"
    );
}

/// The first line `mocker serve` writes about its engine.
fn serve_start_line(args: &[&str]) -> String {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0"])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = std::io::BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("KV blocks") || l.starts_with("error"))
        .expect("a start line");
    let _ = child.kill();
    let _ = child.wait();
    line
}

/// Keys that contradict what a recurrent model derives are refused by name (exit 2), and
/// architectures mocker does not know still are.
#[test]
fn recurrent_models_refuse_conflicting_keys_and_unknown_layouts_by_name() {
    let model = ["--model", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--tensor-parallel-size", "4"];
    let state = r#"{"state_cache": {"bytes_per_request": 1000000}, "num_gpu_blocks": 100, "block_size": 272,
        "kv_cache_bytes_per_token": 12288}"#;
    let cases: [(&[&str], &[&str]); 7] = [
        (&["--engine-args", r#"{"block_size": 64}"#], &["block_size", "272"]),
        (&["--engine-args", state], &["state_cache", "9879552", "leave state_cache out"]),
        (
            &["--disable-hybrid-kv-cache-manager"],
            &["--disable-hybrid-kv-cache-manager", "hybrid KV cache manager"],
        ),
        (&["--engine-args", r#"{"backend": "sglang"}"#], &["backend", "vllm"]),
        (
            &["--engine-args", r#"{"enable_prefix_caching": true, "emit_kv_events": true}"#],
            &["emit_kv_events", "align mode"],
        ),
        (&["--engine-args", r#"{"num_gpu_blocks": 3}"#], &["num_gpu_blocks", "3-block recurrent state"]),
        (&["--engine-args", r#"{"worker_type": "prefill"}"#], &["worker_type", "aggregated"]),
    ];
    for (flags, words) in cases {
        let mut args = vec!["replay"];
        args.extend_from_slice(&WORKLOAD);
        args.extend_from_slice(&model);
        args.extend_from_slice(flags);
        let out = mocker(&args);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
        for w in words {
            assert!(stderr(&out).contains(w), "{flags:?}: {w:?} not in {}", stderr(&out));
        }
    }
    // Jamba and Falcon-H1 are Mamba hybrids mocker does not lay out: refused by name.
    let dir = scratch("unknown-hybrid");
    let mut c = qwen3_next_config();
    c["architectures"] = serde_json::json!(["JambaForCausalLM"]);
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    let mut args = vec!["replay"];
    args.extend_from_slice(&WORKLOAD);
    args.extend_from_slice(&["--model", dir.to_str().unwrap()]);
    let out = mocker(&args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("JambaForCausalLM") && stderr(&out).contains("Qwen3NextForCausalLM"),
        "{}",
        stderr(&out)
    );
}
