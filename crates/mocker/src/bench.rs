//! `mocker bench`: a fixed suite of replay workloads (the reference's published figures
//! and the core spec's §13 cases), timed. `scripts/bench_vs_reference.py` runs the same
//! suite (read from `mocker bench --list`) on the reference and prints ratios.

use clap::Args;
use mocker_core::config::LaunchConfig;
use mocker_replay::{run_synthetic, Cluster, Load, Pool, ReplayOptions, SyntheticWorkload, Workload};
use serde_json::{json, Value};

use crate::UsageError;

/// Benchmark flags.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Print the suite definition as JSON and exit.
    #[arg(long)]
    pub list: bool,
    /// Print results as JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Instead of the suite, the scale case of issue 44: a generated Mooncake trace of this
    /// many rows (200 req/s, 32 Zipf families, 35% follow-ups, medians of 2,500 new prompt
    /// and 250 output tokens, 512-token blocks) over 64 default vLLM workers with the KV
    /// router; prints wall time and peak RSS.
    #[arg(long, value_name = "ROWS")]
    pub scale: Option<u64>,
    /// Runs per workload (default 3); the fastest wall time is reported.
    #[arg(long, value_name = "N")]
    pub repeat: Option<usize>,
    /// Only workloads whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

struct Case {
    name: &'static str,
    isl: usize,
    osl: usize,
    n: usize,
    load: Load,
    engine: Value,
    shared_prefix_ratio: f64,
    num_prefix_groups: usize,
    /// Launch-level keys beside the engine's (`model`, `gpu`): mocker-only cases, which
    /// `scripts/bench_vs_reference.py` skips.
    launch_keys: Option<Value>,
    /// Disaggregated: (prefill, decode) workers, `engine` on both with their worker type,
    /// the prefill side transferring 128 KiB per token at 64 GB/s.
    pools: Option<(usize, usize)>,
}

/// The prefill side's transfer settings in disaggregated cases (bytes per token is an
/// integer, as the reference parses it).
const TRANSFER: (u64, f64) = (131072, 64.0);

fn suite() -> Vec<Case> {
    let c = |name, isl, osl, n, load, engine| Case {
        name,
        isl,
        osl,
        n,
        load,
        engine,
        shared_prefix_ratio: 0.0,
        num_prefix_groups: 0,
        launch_keys: None,
        pools: None,
    };
    vec![
        c("ref-1k-100-c64", 1000, 100, 1000, Load::Concurrency(64), json!({})),
        c("ref-8k-1k-c64", 8000, 1000, 1000, Load::Concurrency(64), json!({})),
        c("ref-1k-100-poisson20", 1000, 100, 2000, Load::RequestRate(20.0), json!({})),
        c("ref-2k-200-100k-c64", 2000, 200, 100_000, Load::Concurrency(64), json!({})),
        c("A-1k-100-c16", 1000, 100, 100, Load::Concurrency(16), json!({})),
        c("B-preemption-512blocks", 2000, 500, 64, Load::Concurrency(32), json!({"num_gpu_blocks": 512})),
        c("E-trtllm", 1000, 100, 100, Load::Concurrency(16), json!({"backend": "trtllm"})),
        Case {
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 4,
            ..c("F-prefix-groups", 2048, 64, 64, Load::Concurrency(8), json!({}))
        },
        c(
            "T-trtllm-1024blocks",
            2000,
            500,
            64,
            Load::Concurrency(32),
            json!({"backend": "trtllm", "num_gpu_blocks": 1024}),
        ),
        c("D-poisson20-512-128", 512, 128, 200, Load::RequestRate(20.0), json!({})),
        Case {
            pools: Some((2, 2)),
            ..c("P-disagg-2p2d-4k-200", 4000, 200, 2000, Load::Concurrency(64), json!({}))
        },
        // The H200 profile's workload, timed by the table and by the polynomial: the
        // lookup must not make a pass measurably slower.
        c(
            "H-table-3k-300-c128",
            3000,
            300,
            2000,
            Load::Concurrency(128),
            json!({"timing_model": h200_table()}),
        ),
        c("H-poly-3k-300-c128", 3000, 300, 2000, Load::Concurrency(128), json!({})),
        // The same workload and KV cache timed from the architecture (the curves' lookups
        // against the table's).
        Case {
            launch_keys: Some(json!({"model": "meta-llama/Llama-3.1-8B", "gpu": "h200"})),
            ..c(
                "H-arch-3k-300-c128",
                3000,
                300,
                2000,
                Load::Concurrency(128),
                json!({"num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192}),
            )
        },
        // KV cache groups (issue 42 §3): one full-attention group, then beside it a
        // sliding window, then a convolution state too; the same bytes per token of history.
        c("G1-groups-full-2k-200-20k", 2000, 200, 20_000, Load::Concurrency(64), groups(&[("full", None)])),
        c(
            "G2-groups-full-swa-2k-200-20k",
            2000,
            200,
            20_000,
            Load::Concurrency(64),
            groups(&[("full", None), ("swa", Some(("attention", 512)))]),
        ),
        c(
            "G3-groups-full-swa-conv-2k-200-20k",
            2000,
            200,
            20_000,
            Load::Concurrency(64),
            groups(&[("full", None), ("swa", Some(("attention", 512))), ("conv", Some(("convolution", 4)))]),
        ),
        // SGLang's radix cache at its two common page sizes (issue 23's speed targets).
        c(
            "S-sglang-page64-1k-100-50k",
            1000,
            100,
            50_000,
            Load::Concurrency(64),
            json!({"backend": "sglang", "block_size": 64}),
        ),
        c(
            "S-sglang-page1-1k-100-10k",
            1000,
            100,
            10_000,
            Load::Concurrency(64),
            json!({"backend": "sglang", "block_size": 1}),
        ),
    ]
}

/// Engine args with these cache groups (name, and kind and window unless full attention):
/// 16-token pages of 64 KiB, a budget of 16 GiB, prefix caching off (as groups need).
fn groups(spec: &[(&str, Option<(&str, u32)>)]) -> Value {
    let groups: Vec<Value> = spec
        .iter()
        .map(|(name, kind)| match kind {
            None => json!({"name": name, "kind": "attention", "num_layers": 16, "block_size_tokens": 16,
                "page_size_bytes": 65536}),
            Some((kind, window)) => {
                json!({"name": name, "kind": kind, "num_layers": 16, "block_size_tokens": 16,
                "page_size_bytes": 65536, "sliding_window": window})
            }
        })
        .collect();
    json!({"block_size": 16, "enable_prefix_caching": false, "kv_cache_capacity_bytes": 17_179_869_184u64,
        "kv_cache_groups": groups})
}

/// The Dynamo H200 profile, named as the reference takes it; the path is relative to the
/// repository root, where `mocker bench` and `scripts/bench_vs_reference.py` run.
fn h200_table() -> Value {
    json!({"type": "external", "provider": "dynamo_profile",
           "config": {"path": "profiles/dynamo/h200-llama3.1-8b-fp8-tp1/perf_data.npz"}})
}

fn load_json(load: Load) -> Value {
    match load {
        Load::Concurrency(c) => json!({"replay_concurrency": c}),
        Load::RequestRate(r) => json!({"request_rate": r}),
        Load::ArrivalIntervalMs(i) => json!({"arrival_interval_ms": i}),
    }
}

fn case_json(c: &Case) -> Value {
    json!({
        "name": c.name, "input_tokens": c.isl, "output_tokens": c.osl, "request_count": c.n,
        "load": load_json(c.load), "engine": c.engine,
        "shared_prefix_ratio": c.shared_prefix_ratio, "num_prefix_groups": c.num_prefix_groups,
        "launch": c.launch_keys,
        "pools": c.pools.map(|(p, d)| json!({
            "num_prefill_workers": p, "num_decode_workers": d,
            "kv_transfer_bytes_per_token": TRANSFER.0, "kv_transfer_bandwidth": TRANSFER.1,
        })),
    })
}

/// The scale case: generates the trace to a temporary file, replays it, prints a line.
fn scale(rows: u64, json_out: bool) -> Result<(), UsageError> {
    use mocker_replay::trace::generator::{GeneratorOptions, TraceGenerator};
    use std::io::Write;
    let generator = TraceGenerator::new(GeneratorOptions { rows, rate: 200.0, ..Default::default() })
        .map_err(|e| UsageError(format!("--scale: {e}")))?;
    let path = std::env::temp_dir().join(format!("mocker-bench-scale-{}.jsonl", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path)?);
        for row in generator {
            out.write_all(row.to_json().as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.flush()
    };
    write().map_err(|e| UsageError(format!("--scale: writing {}: {e}", path.display())))?;
    let started = std::time::Instant::now();
    // Streamed as `mocker replay` streams it: the rows are read again as the replay
    // reaches them, so the file goes only after the run.
    let format = mocker_replay::trace::TraceFormat::Mooncake;
    let when = mocker_replay::trace::stream::StreamIf { by_timestamp: true };
    let trace = match mocker_replay::trace::stream::scan_for_stream(&path, format, Some(512), when) {
        Ok(Some(trace)) => Ok(trace),
        Ok(None) => mocker_replay::trace::load::load_trace(&path, format, Some(512)),
        Err(e) => Err(e),
    };
    let trace = trace.map_err(|e| {
        let _ = std::fs::remove_file(&path);
        UsageError(format!("--scale: {e}"))
    })?;
    let options = ReplayOptions {
        cluster: Cluster::aggregated(LaunchConfig::default(), 64),
        workload: Workload::Trace(mocker_replay::TraceWorkload {
            trace: std::sync::Arc::new(trace),
            concurrency: None,
            repeat: 1,
            lanes: None,
        }),
        router: mocker_replay::RouterMode::Kv,
        ..Default::default()
    };
    let out = mocker_replay::run_replay(&options, mocker_replay::Hooks::default());
    let _ = std::fs::remove_file(&path);
    let out = out.map_err(|e| UsageError(format!("--scale: {e}")))?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    // Peak resident memory of the whole process (VmHWM), as `time -v` reports it.
    let peak_mb = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(f64::NAN, |kb| kb / 1024.0);
    let s = &out.summary;
    if json_out {
        let mut v = s.to_json_value();
        v["name"] = json!(format!("scale-{rows}-64w-kv"));
        v["wall_time_ms"] = json!(wall_ms);
        v["peak_rss_mb"] = json!(peak_mb);
        println!("{v}");
    } else {
        println!(
            "scale-{rows}-64w-kv: {} requests, wall {:.0} ms (load and replay), peak RSS {:.0} MB, mean TTFT {:.1} ms, \
             reuse {:.3}",
            s.completed_requests, wall_ms, peak_mb, s.ttft_ms.mean, s.prefix_cache_reused_ratio
        );
    }
    Ok(())
}

/// Runs `mocker bench`.
pub fn run(args: BenchArgs) -> Result<(), UsageError> {
    if let Some(rows) = args.scale {
        if args.list || args.filter.is_some() || args.repeat.is_some() {
            return Err(UsageError(
                "--scale: runs the scale case alone, once (no --list, --filter or --repeat)".into(),
            ));
        }
        return scale(rows, args.json);
    }
    let cases: Vec<Case> =
        suite().into_iter().filter(|c| args.filter.as_deref().is_none_or(|f| c.name.contains(f))).collect();
    if args.list {
        println!("{}", Value::Array(cases.iter().map(case_json).collect()));
        return Ok(());
    }
    if !args.json {
        println!(
            "{:<26} {:>10} {:>12} {:>11} {:>11} {:>9} {:>7}",
            "workload", "wall ms", "sim s", "mean TTFT", "p99 TTFT", "mean ITL", "reuse"
        );
    }
    let mut walls: Vec<(&str, f64)> = Vec::new();
    for c in &cases {
        let launch = |extra: Value| {
            let mut engine = c.engine.clone();
            engine
                .as_object_mut()
                .expect("engine args are an object")
                .extend(extra.as_object().cloned().unwrap());
            let mut doc = json!({ "engine": engine });
            if let Some(Value::Object(keys)) = &c.launch_keys {
                doc.as_object_mut().expect("an object").extend(keys.clone());
            }
            let mut launch = LaunchConfig::from_value(doc).map_err(|e| UsageError(e.to_string()))?;
            let modelled = mocker_models::resolve_launch(&mut launch)
                .map_err(|e| UsageError(format!("{}: {e}", c.name)))?
                .is_some();
            if !modelled {
                mocker_profiles::resolve_launch(&mut launch).map_err(|e| {
                    UsageError(format!("{}: {e} (run mocker bench from the repository root)", c.name))
                })?;
            }
            Ok::<_, UsageError>(launch)
        };
        let cluster = match c.pools {
            None => Cluster::aggregated(launch(json!({}))?, 1),
            Some((p, d)) => Cluster::Disaggregated {
                prefill: Pool {
                    launch: launch(json!({"worker_type": "prefill",
                        "kv_transfer_bytes_per_token": TRANSFER.0, "kv_transfer_bandwidth": TRANSFER.1}))?,
                    workers: p,
                },
                decode: Pool { launch: launch(json!({"worker_type": "decode"}))?, workers: d },
            },
        };
        let options = ReplayOptions {
            cluster,
            workload: Workload::Synthetic(SyntheticWorkload {
                input_tokens: c.isl,
                output_tokens: c.osl,
                request_count: c.n,
                load: c.load,
                shared_prefix_ratio: c.shared_prefix_ratio,
                num_prefix_groups: c.num_prefix_groups,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut best = f64::INFINITY;
        let mut summary = None;
        for _ in 0..args.repeat.unwrap_or(3).max(1) {
            let out = run_synthetic(&options).map_err(|e| UsageError(format!("{}: {e}", c.name)))?;
            best = best.min(out.summary.wall_time_ms);
            summary = Some(out.summary);
        }
        let s = summary.expect("at least one run");
        walls.push((c.name, best));
        if args.json {
            let mut v = s.to_json_value();
            v["name"] = json!(c.name);
            v["wall_time_ms"] = json!(best);
            println!("{v}");
        } else {
            println!(
                "{:<26} {:>10.2} {:>12.3} {:>11.3} {:>11.3} {:>9.4} {:>7.4}",
                c.name,
                best,
                s.duration_ms / 1000.0,
                s.ttft_ms.mean,
                s.ttft_ms.p99,
                s.itl_ms.mean,
                s.prefix_cache_reused_ratio
            );
        }
    }
    if !args.json {
        print_group_ratios(&walls);
    }
    Ok(())
}

/// Issue 42 §3's bar: two or three KV cache groups cost at most 1.3x the wall time of the
/// same workload with one group.
fn print_group_ratios(walls: &[(&str, f64)]) {
    let Some(&(_, one)) = walls.iter().find(|(n, _)| n.starts_with("G1-groups")) else { return };
    for &(name, wall) in walls.iter().filter(|(n, _)| n.starts_with('G') && !n.starts_with("G1-")) {
        println!("{name}: {:.2}x the one-group wall time (bar: <= 1.3x)", wall / one);
    }
}
