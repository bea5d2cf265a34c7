//! `mocker profiles`: the bundled timing profiles, with what each was measured for, and
//! `mocker profiles predict`: the time the configured engine gives recorded passes.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::PathBuf;

use mocker_core::config::{Backend, WorkerType};
use mocker_core::timing::{build_timing_model, pass_ms, scaled_nanos, PassWork};

use crate::engine_args::{launch_config, EngineFlags};
use crate::UsageError;

/// `mocker profiles [predict ...]`.
#[derive(Debug, clap::Args)]
pub struct ProfilesArgs {
    #[command(subcommand)]
    action: Option<ProfilesAction>,
}

#[derive(Debug, clap::Subcommand)]
enum ProfilesAction {
    /// Read forward passes (CSV) and print the time the configured engine's timing model
    /// gives each, priced exactly as the vLLM/TRT-LLM scheduler prices a pass.
    Predict(Box<PredictArgs>),
    /// List the models of the catalogue (for `--model HF_ID`): id, architecture, layers,
    /// hidden size, heads, KV heads, experts, parameters, and the ids that name the same entry.
    Models,
    /// List the GPUs of the catalogue (for `--gpu NAME`): memory, bandwidth, bf16/fp8 peak,
    /// interconnect, and whose measured operator data times them.
    Gpus,
    /// Print what one layer's token-proportional operations cost for a model on a GPU at
    /// some token counts (CSV, ms on one GPU): what `--model`/`--gpu` timing is made of.
    Ops(Box<OpsArgs>),
}

/// `mocker profiles ops`.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    /// Tokens in the pass, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,128,1024,8192")]
    tokens: Vec<u32>,
    /// Engine configuration as JSON (inline or @file), for the launch keys.
    #[arg(long)]
    engine_args: Option<String>,
    #[command(flatten)]
    engine: EngineFlags,
}

/// `mocker profiles predict`.
#[derive(Debug, clap::Args)]
pub struct PredictArgs {
    /// CSV of passes with a header naming `ctx_tokens`, `ctx_requests`, `ctx_kv_tokens`,
    /// `decode_requests`, `decode_kv_tokens` (or Dynamo's forward-pass-metric names
    /// `sum_prefill_tokens`, `num_prefill_requests`, `sum_prefill_kv_tokens`,
    /// `num_decode_requests`, `sum_decode_kv_tokens`); other columns are ignored. `-` or
    /// nothing reads stdin.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Engine configuration as JSON (inline or @file), as for `mocker replay`: the timing
    /// model, `speedup_ratio`, `decode_speedup_ratio`, and (for the polynomial model) the
    /// KV capacity.
    #[arg(long)]
    engine_args: Option<String>,
    #[command(flatten)]
    engine: EngineFlags,
}

/// Runs `mocker profiles` (list) or `mocker profiles predict`.
pub fn run(args: ProfilesArgs) -> Result<(), UsageError> {
    match args.action {
        None => list(),
        Some(ProfilesAction::Predict(p)) => predict(*p),
        Some(ProfilesAction::Models) => list_models(),
        Some(ProfilesAction::Gpus) => list_gpus(),
        Some(ProfilesAction::Ops(a)) => ops(*a),
    }
}

/// Prints a header and one line per bundled profile: name, model, GPU system, backend, TP
/// (tab-separated), then says on stderr how to use one: the list is the measured model ×
/// GPU × backend × TP points, not a grid.
fn list() -> Result<(), UsageError> {
    let mut text = String::from("name\tmodel\tgpu\tbackend\ttp\n");
    for name in mocker_profiles::bundled_names() {
        let profile = mocker_profiles::bundled(name)
            .expect("listed names exist")
            .map_err(|e| UsageError(format!("bundled profile {name}: {e}")))?;
        text += &match profile.meta {
            Some(m) => format!("{name}\t{}\t{}\t{}\ttp{}\n", m.model, m.system, m.backend, m.tp),
            None => format!("{name}\t(Dynamo planner table; no memory facts)\n"),
        };
    }
    print_all(&text)?;
    eprintln!(
        "mocker: predict latency under load with `mocker replay --timing-profile NAME` (or `mocker serve \
         --timing-profile NAME`); `mocker profiles predict` prices recorded forward passes; any other model \
         on any GPU: `--model HF_ID --gpu NAME` (`mocker profiles models`, `mocker profiles gpus`)"
    );
    Ok(())
}

/// Prints the model catalogue, one tab-separated line per entry under a header.
fn list_models() -> Result<(), UsageError> {
    let mut text =
        String::from("model\tarchitecture\tlayers\thidden\theads\tkv_heads\texperts\tparams_b\taliases\n");
    for e in mocker_models::models() {
        let m = e.arch().map_err(|err| UsageError(err.to_string()))?;
        let experts = m.moe.as_ref().map_or("-".to_string(), |x| format!("{}x top-{}", x.experts, x.top_k));
        writeln!(
            text,
            "{}\t{}\t{}\t{}\t{}\t{}\t{experts}\t{:.1}\t{}",
            e.id,
            m.architecture,
            m.num_layers,
            m.hidden_size,
            m.num_heads,
            m.num_kv_heads,
            m.parameters() / 1e9,
            e.aliases.join(",")
        )
        .expect("writing to a String");
    }
    print_all(&text)?;
    eprintln!(
        "mocker: time any of these (or a directory with a config.json) on a GPU with `--model ID --gpu NAME \
         --tensor-parallel-size N`; `mocker profiles gpus` lists the GPUs"
    );
    Ok(())
}

/// Prints the GPU catalogue, one tab-separated line per GPU under a header.
fn list_gpus() -> Result<(), UsageError> {
    let mut text = String::from(
        "gpu\tdescription\tmemory_gb\tbandwidth_tb_s\tbf16_tflops\tfp8_tflops\tinterconnect\ttimed_by\n",
    );
    for g in mocker_models::gpus() {
        let tflops = |k: &str| g.flops.get(k).map_or("-".to_string(), |f| format!("{:.0}", f / 1e12));
        let timed_by = match (&g.aic_system, &g.proxy) {
            (Some(s), _) if mocker_models::catalogue::op_systems().contains(&s.as_str()) => {
                format!("{s} (measured)")
            }
            (_, Some(p)) => format!("{p} (scaled by the roofline)"),
            _ => "-".into(),
        };
        writeln!(
            text,
            "{}\t{}\t{:.0}\t{:.2}\t{}\t{}\t{} {:.0} GB/s\t{timed_by}",
            g.name,
            g.description,
            g.memory_bytes / 1e9,
            g.memory_bandwidth / 1e12,
            tflops("bf16"),
            tflops("fp8"),
            g.interconnect.kind,
            g.interconnect.bandwidth / 1e9,
        )
        .expect("writing to a String");
    }
    print_all(&text)
}

/// Prints each layer operation's time at each token count.
fn ops(args: OpsArgs) -> Result<(), UsageError> {
    if args.engine.model.is_none() {
        return Err(UsageError(
            "--model: required (a catalogue id or a directory with a config.json)".into(),
        ));
    }
    if args.tokens.contains(&0) {
        return Err(UsageError("--tokens: every count must be at least 1".into()));
    }
    let launch = launch_config(args.engine_args.as_deref(), &args.engine)?;
    let tokens: Vec<f64> = args.tokens.iter().map(|&t| f64::from(t)).collect();
    let rows = mocker_models::layer_operations(&launch, &tokens).map_err(|e| UsageError(e.to_string()))?;
    // A hybrid's recurrent layers replace the attention projections with their mixer: a
    // column of their own, only for such models (the others' CSV is as it was).
    let recurrent = rows.iter().any(|o| o.recurrent > 0.0);
    let mut text = String::from(
        "tokens,qkv_proj_ms,o_proj_ms,mlp_gate_up_ms,mlp_down_ms,moe_ms,elementwise_ms,activation_ms,allreduce_ms",
    );
    text.push_str(if recurrent { ",recurrent_mixer_ms\n" } else { "\n" });
    for (t, o) in args.tokens.iter().zip(rows) {
        write!(
            text,
            "{t},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}",
            o.qkv_proj, o.o_proj, o.mlp_gate_up, o.mlp_down, o.moe, o.elementwise, o.activation, o.allreduce
        )
        .expect("writing to a String");
        if recurrent {
            write!(text, ",{:.6}", o.recurrent).expect("writing to a String");
        }
        text.push('\n');
    }
    print_all(&text)
}

/// Writes `text` to stdout; a reader that stopped early (`| head`) is not an error.
fn print_all(text: &str) -> Result<(), UsageError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(UsageError(format!("stdout: {e}"))),
        _ => Ok(()),
    }
}

/// The input columns, each with its forward-pass-metric alias.
const COLUMNS: [(&str, &str); 5] = [
    ("ctx_tokens", "sum_prefill_tokens"),
    ("ctx_requests", "num_prefill_requests"),
    ("ctx_kv_tokens", "sum_prefill_kv_tokens"),
    ("decode_requests", "num_decode_requests"),
    ("decode_kv_tokens", "sum_decode_kv_tokens"),
];

/// Prints `prefill_ms,decode_ms,pass_ms` per input pass: each part scaled by its speedup
/// ratio and rounded to whole nanoseconds, and their sum, as the simulated pass lasts.
fn predict(args: PredictArgs) -> Result<(), UsageError> {
    let launch = launch_config(args.engine_args.as_deref(), &args.engine)?;
    let engine = &launch.engine;
    if engine.backend == Backend::Sglang {
        return Err(UsageError(
            "--engine-type sglang: predict prices vLLM/TRT-LLM passes (SGLang never mixes prefill and decode)"
                .into(),
        ));
    }
    if engine.worker_type != WorkerType::Aggregated {
        return Err(UsageError(format!(
            "--engine-args worker_type {}: predict prices aggregated passes only",
            engine.worker_type
        )));
    }
    let timing = build_timing_model(engine).map_err(|e| UsageError(format!("--engine-args: {e}")))?;
    let total_kv_tokens = engine.num_gpu_blocks * engine.block_size;
    // Decode time is divided by both ratios, as the scheduler divides it.
    let decode_ratio = engine.speedup_ratio * engine.decode_speedup_ratio;

    let (label, text) = read_input(args.input.as_ref())?;
    let mut rdr = csv::ReaderBuilder::new().from_reader(text.as_bytes());
    let header = rdr.headers().map_err(|e| UsageError(format!("{label}: header: {e}")))?.clone();
    let mut index = [0usize; 5];
    for (slot, (name, alias)) in index.iter_mut().zip(COLUMNS) {
        *slot = header
            .iter()
            .position(|h| h == name || h == alias)
            .ok_or_else(|| UsageError(format!("{label}: header: missing column {name} (or {alias})")))?;
    }
    // Nothing is printed unless every row is valid.
    let mut out = String::from("prefill_ms,decode_ms,pass_ms\n");
    for (i, record) in rdr.records().enumerate() {
        let line = i + 2;
        let record = record.map_err(|e| UsageError(format!("{label}:{line}: {e}")))?;
        let mut v = [0usize; 5];
        for (k, &col) in index.iter().enumerate() {
            let field = record.get(col).unwrap_or("").trim();
            v[k] = field.parse().map_err(|_| {
                UsageError(format!(
                    "{label}:{line}: {}: must be a non-negative integer (got {field:?})",
                    COLUMNS[k].0
                ))
            })?;
        }
        let work = PassWork {
            prefill_tokens: v[0],
            prefill_requests: v[1],
            prefill_prefix_tokens: v[2],
            decode_requests: v[3],
            decode_kv_tokens: v[4],
        };
        if work.prefill_tokens > 0 && work.prefill_requests == 0 {
            return Err(UsageError(format!(
                "{label}:{line}: ctx_requests: must be at least 1 when ctx_tokens > 0"
            )));
        }
        let (p, d) = pass_ms(timing.as_ref(), &work, total_kv_tokens);
        let (p_ns, d_ns) = (scaled_nanos(p, engine.speedup_ratio), scaled_nanos(d, decode_ratio));
        let ms = |ns: u64| ns as f64 / 1e6;
        let _ = writeln!(out, "{},{},{}", ms(p_ns), ms(d_ns), ms(p_ns + d_ns));
    }
    print_all(&out)
}

/// The input's name for messages and its text.
fn read_input(path: Option<&PathBuf>) -> Result<(String, String), UsageError> {
    match path.filter(|p| p.as_os_str() != "-") {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| UsageError(format!("--input: cannot read {}: {e}", p.display())))?;
            Ok((p.display().to_string(), text))
        }
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| UsageError(format!("stdin: cannot read: {e}")))?;
            Ok(("stdin".into(), text))
        }
    }
}
