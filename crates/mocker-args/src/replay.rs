//! `mocker replay`'s flags: parsed into the replay they describe (a workload, synthetic or a
//! trace file, over a cluster), run offline or online, and the report files they name.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use mocker_core::output_length::OutputLengthDistribution;
use mocker_replay::report::plot::{PlotData, RenderOptions};
use mocker_replay::report::WorkerCounts;
use mocker_replay::report::{AgenticFacts, RunDescription};
use mocker_replay::router::KvRouterConfig;
use mocker_replay::scaling::{PoolName, ScalingPlan, ScalingPolicy};

use crate::telemetry::TelemetryFile;
use mocker_replay::trace::load::load_trace_with;
use mocker_replay::trace::stream::{scan_for_stream, StreamIf};
use mocker_replay::trace::NestedTimestampBasis;
use mocker_replay::{
    Cluster, Load, Pool, ReplayError, ReplayOptions, ReplayOutcome, RequestRecord, RouterMode, Sla,
    SyntheticWorkload, TraceFormat, TraceWorkload, Workload,
};

use crate::output::{write_atomically, AtomicFile};
use crate::UsageError;

/// Workload, engine, router and report flags (names as in Dynamo's `python -m dynamo.replay`).
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Trace file to replay (a Weka corpus may be a directory); without it a synthetic
    /// workload is generated.
    pub trace: Option<PathBuf>,
    /// Trace format: mooncake, mooncake-delta, agentic-mooncake, weka,
    /// applied-compute-agentic or dynamo.
    #[arg(long, default_value = "mooncake")]
    pub trace_format: String,
    /// Tokens per trace hash id (default 512; the block size a trace states, in an agentic
    /// v2 header, a Weka trace or a Dynamo record, is used when the flag is not given, and
    /// must agree with it when it is).
    #[arg(long)]
    pub trace_block_size: Option<usize>,
    /// Refuse a trace whose rows carry keys its format does not know (exit 2) instead of
    /// warning about them and ignoring them. Needs a trace file.
    #[arg(long)]
    pub strict: bool,
    /// Replay the trace this many times back to back, each copy shifted by the trace's
    /// span (scale tests). Copies share hash ids, so later copies can reuse prefixes.
    #[arg(long, default_value_t = 1)]
    pub trace_repeat: usize,
    /// Agentic traces (agentic-mooncake, weka): closed-loop playback of their plays
    /// (trajectories), this many at a time. Each lane runs one play; when its last request
    /// ends, the lane starts the next play (by `source_play_ordinal`, else play id) with its
    /// authored times rebased to that instant. Without it every play starts at its own time.
    #[arg(long, allow_negative_numbers = true)]
    pub agentic_lanes: Option<i64>,
    /// Agentic traces (agentic-mooncake, weka; required for them, as in the reference): the
    /// target model every source model their rows name is projected onto. The simulated
    /// engine is the one the engine args describe; the report's `run.agentic` records the
    /// projection.
    #[arg(long)]
    pub execution_model: Option<String>,
    /// Weka traces: how the `t` of requests nested under a subagent marker is read:
    /// absolute (on the trace's clock), relative (offset from the marker's `t`) or auto
    /// (relative when any nested request precedes its marker, else absolute; the default).
    #[arg(long, value_name = "auto|absolute|relative")]
    pub weka_nested_timestamp_basis: Option<String>,
    /// Prompt tokens per request (synthetic; default 1000).
    #[arg(long)]
    pub input_tokens: Option<usize>,
    /// Output tokens per request (synthetic; default 100).
    #[arg(long)]
    pub output_tokens: Option<usize>,
    /// Synthetic workloads without --output-tokens: draw each request's output length
    /// (where the simulated model writes end-of-sequence) from this JSON distribution, as
    /// `mocker serve` does for chat requests without max_tokens, e.g. {"type": "lognormal",
    /// "mean": 215, "sigma": 1, "max": 4096}; also engine-args `output_length_distribution`.
    #[arg(long, value_name = "JSON")]
    pub output_length_distribution: Option<String>,
    /// Requests (sessions when --turns-per-session > 1; synthetic; default 1000).
    #[arg(long)]
    pub request_count: Option<usize>,
    /// Closed loop with this many sessions in flight (default 64 when no load flag is given).
    #[arg(long, visible_alias = "replay-concurrency")]
    pub concurrency: Option<usize>,
    /// Open loop: Poisson arrivals at this many requests per second.
    #[arg(long, allow_negative_numbers = true)]
    pub request_rate: Option<f64>,
    /// Open loop: constant gap between arrivals in ms (0 = all at once).
    #[arg(long, allow_negative_numbers = true)]
    pub arrival_interval_ms: Option<f64>,
    /// Seed of Poisson arrivals.
    #[arg(long, default_value_t = 42)]
    pub arrival_seed: u64,
    /// Turns per session; each turn follows the previous one's completion (synthetic).
    #[arg(long)]
    pub turns_per_session: Option<usize>,
    /// Fraction of each prompt shared within its prefix group, in [0, 1].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub shared_prefix_ratio: f64,
    /// Number of prefix groups sessions are drawn into (0 = no sharing).
    #[arg(long, default_value_t = 0)]
    pub num_prefix_groups: usize,
    /// Delay between a turn's completion and the next turn, ms.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub inter_turn_delay_ms: f64,
    /// Simulated aggregated workers (default 1).
    #[arg(long)]
    pub num_workers: Option<usize>,
    /// Disaggregated replay: prefill workers' engine configuration (JSON or @file, with
    /// `worker_type: prefill`); the KV transfer settings are read from it.
    #[arg(long)]
    pub prefill_engine_args: Option<String>,
    /// Disaggregated replay: decode workers' engine configuration (JSON or @file, with
    /// `worker_type: decode`).
    #[arg(long)]
    pub decode_engine_args: Option<String>,
    /// Disaggregated replay: prefill workers (default 1).
    #[arg(long)]
    pub num_prefill_workers: Option<usize>,
    /// Disaggregated replay: decode workers (default 1).
    #[arg(long)]
    pub num_decode_workers: Option<usize>,
    /// Placement: round-robin, or kv (cost-based on a simulated KV index).
    #[arg(long, visible_alias = "router-mode", default_value = "round-robin")]
    pub router: String,
    /// KV router weights and queueing as JSON (e.g. {"overlap_score_weight": 1.0,
    /// "router_temperature": 0, "router_queue_threshold": 2, "router_queue_policy": "wspt"}).
    #[arg(long)]
    pub router_config: Option<String>,
    /// Stop the simulation at this simulated time; unfinished requests are not reported.
    #[arg(long, allow_negative_numbers = true)]
    pub max_sim_time_seconds: Option<f64>,
    /// Goodput SLA: time to first token, ms.
    #[arg(long, allow_negative_numbers = true)]
    pub sla_ttft_ms: Option<f64>,
    /// Goodput SLA: mean inter-token latency, ms.
    #[arg(long, allow_negative_numbers = true)]
    pub sla_itl_ms: Option<f64>,
    /// Goodput SLA: end-to-end latency, ms.
    #[arg(long, allow_negative_numbers = true)]
    pub sla_e2e_ms: Option<f64>,
    /// The KV router's index sees the engines' stored and removed blocks this many simulated
    /// ms late, as behind a slow event bus (the reference's kv_event_lag_ms; --router kv).
    #[arg(long, allow_negative_numbers = true)]
    pub kv_event_lag_ms: Option<f64>,
    /// Scale the pools on a timetable: a JSON file (or @-less path) holding
    /// `[{"at_ms": .., "prefill": .., "decode": ..}]`. From each step's time the pools move
    /// to its counts (an aggregated cluster's pool is "decode"): new workers serve after
    /// their launch's `startup_time`, removed ones (highest ids) drain. Offline only.
    #[arg(long, value_name = "FILE")]
    pub scaling_plan: Option<PathBuf>,
    /// Write telemetry samples here, one JSON object per line (parent directories created):
    /// a baseline, one every --telemetry-interval-ms of simulated time and a final one, each
    /// with the interval's traffic, every live worker's scheduler state, the pools'
    /// preemptions and cache hits, router queues and worker ids. Offline only.
    #[arg(long, value_name = "FILE")]
    pub telemetry_jsonl: Option<PathBuf>,
    /// Simulated ms between telemetry samples (with --telemetry-jsonl; default 1000).
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub telemetry_interval_ms: Option<f64>,
    /// Set by callers that bring their own scaling policy (the Python module): the launch
    /// key `startup_time` then acts, so no warning says it does not.
    #[arg(skip)]
    pub policy_given: bool,
    /// Engine configuration as JSON (flat or {"engine": {...}}) or @file.
    #[arg(long, visible_alias = "extra-engine-args")]
    pub engine_args: Option<String>,
    /// Engine family and timing source.
    #[command(flatten)]
    pub engine: crate::engine_args::EngineFlags,
    /// Write the full JSON report here (a directory gets `mocker_replay_report.json`).
    #[arg(long)]
    pub report_json: Option<PathBuf>,
    /// Write one JSON record per request here, in arrival order: the reference's fields
    /// (session and turn, times, latencies, routing and admission history, handoff times)
    /// plus every token time. Offline mode only.
    #[arg(long)]
    pub report_jsonl: Option<PathBuf>,
    /// Write one JSON record per simulated forward pass here (worker, pool, start and end,
    /// prefill requests and tokens, decode requests and KV tokens, queue, preemptions, KV
    /// blocks in use): the forward-pass metrics a planner reads. Streamed as the replay
    /// runs, so memory stays flat. Offline mode only.
    #[arg(long)]
    pub report_passes: Option<PathBuf>,
    /// Write SVG charts into this directory (created if missing): TTFT and ITL CDFs,
    /// throughput and queue depth over simulated time, per-worker cache hit rate. Offline only.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// offline: simulated clock, as fast as the CPU allows; online: live engines on the
    /// wall clock (arrivals divided by --arrival-speedup-ratio).
    #[arg(long, value_enum, default_value_t = Mode::Offline, visible_alias = "replay-mode")]
    pub mode: Mode,
    /// Divide first-turn arrival times and inter-turn delays by this (finite, > 0).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub arrival_speedup_ratio: f64,
}

/// Where a replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Discrete-event simulation on a virtual clock.
    Offline,
    /// Live engines on tokio's wall clock.
    Online,
}

impl Mode {
    /// The mode's name as `--mode` spells it (and the report's `run.mode`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Offline => "offline",
            Self::Online => "online",
        }
    }
}

impl ReplayArgs {
    fn router(&self) -> Result<(RouterMode, KvRouterConfig), UsageError> {
        let mode = parse_router("--router", &self.router)?;
        Ok((mode, self.router_config_for(mode)?))
    }

    /// `--router-config` for a point placed by `mode`.
    pub fn router_config_for(&self, mode: RouterMode) -> Result<KvRouterConfig, UsageError> {
        match &self.router_config {
            None => Ok(KvRouterConfig::default()),
            Some(_) if mode != RouterMode::Kv => {
                Err(UsageError("--router-config: applies to --router kv only".into()))
            }
            Some(text) => {
                KvRouterConfig::from_json(text).map_err(|e| UsageError(format!("--router-config: {e}")))
            }
        }
    }

    /// The output-length distribution of a synthetic workload: the flag's, else the engine
    /// args' (`output_length_distribution`, any pool's); refused with, and warned about
    /// beside, whatever already sets the output lengths.
    fn output_lengths(&self, cluster: &Cluster) -> Result<Option<OutputLengthDistribution>, UsageError> {
        let sets_lengths = if self.trace.is_some() {
            Some("a trace gives each request's output length")
        } else if self.output_tokens.is_some() {
            Some("--output-tokens sets every request's output length")
        } else {
            None
        };
        if let Some(text) = &self.output_length_distribution {
            let flag = "--output-length-distribution";
            if let Some(why) = sets_lengths {
                return Err(UsageError(format!(
                    "{flag}: applies to synthetic workloads without --output-tokens; {why}"
                )));
            }
            return OutputLengthDistribution::from_json_str(text, flag)
                .map(Some)
                .map_err(|e| UsageError(e.to_string()));
        }
        let from_args = cluster.pools().find_map(|p| p.launch.output_length_distribution);
        if let (Some(_), Some(why)) = (from_args, sets_lengths) {
            eprintln!(
                "warning: engine args: output_length_distribution not used: {why}; it applies to synthetic \
                 workloads without --output-tokens and to mocker serve"
            );
            return Ok(None);
        }
        Ok(from_args)
    }

    fn workload(&self, cluster: &Cluster) -> Result<Workload, UsageError> {
        let output_lengths = self.output_lengths(cluster)?;
        let Some(path) = &self.trace else {
            for (given, flag) in [
                (self.agentic_lanes.is_some(), "--agentic-lanes"),
                (self.execution_model.is_some(), "--execution-model"),
                (self.weka_nested_timestamp_basis.is_some(), "--weka-nested-timestamp-basis"),
            ] {
                if given {
                    return Err(UsageError(format!(
                        "{flag}: applies to trace replay only (agentic and Weka traces)"
                    )));
                }
            }
            if self.strict {
                return Err(UsageError(
                    "--strict: checks a trace file's keys; give a trace file (a synthetic workload has none)"
                        .into(),
                ));
            }
            let w = SyntheticWorkload {
                input_tokens: self.input_tokens.unwrap_or(1000),
                output_tokens: self.output_tokens.unwrap_or(100),
                output_lengths,
                request_count: self.request_count.unwrap_or(1000),
                load: self.load()?,
                arrival_seed: self.arrival_seed,
                turns_per_session: self.turns_per_session.unwrap_or(1),
                shared_prefix_ratio: self.shared_prefix_ratio,
                num_prefix_groups: self.num_prefix_groups,
                inter_turn_delay_ms: self.inter_turn_delay_ms,
            };
            w.validate()
                .map_err(|e| UsageError(format!("--{}: {}", e.field.replace('_', "-"), e.message)))?;
            return Ok(Workload::Synthetic(w));
        };
        for (given, flag) in [
            (self.input_tokens.is_some(), "--input-tokens"),
            (self.output_tokens.is_some(), "--output-tokens"),
            (self.request_count.is_some(), "--request-count"),
            (self.turns_per_session.is_some(), "--turns-per-session"),
            (self.request_rate.is_some(), "--request-rate"),
            (self.arrival_interval_ms.is_some(), "--arrival-interval-ms"),
            (self.shared_prefix_ratio != 0.0, "--shared-prefix-ratio"),
            (self.num_prefix_groups != 0, "--num-prefix-groups"),
            (self.inter_turn_delay_ms != 0.0, "--inter-turn-delay-ms"),
        ] {
            if given {
                return Err(UsageError(format!(
                    "{flag}: synthetic workloads only; a trace file sets its own requests (use --concurrency or \
                     --arrival-speedup-ratio to change the load)"
                )));
            }
        }
        let format = TraceFormat::parse(&self.trace_format).ok_or_else(|| {
            UsageError(format!(
                "--trace-format: must be one of {} (got {:?})",
                TraceFormat::NAMES,
                self.trace_format
            ))
        })?;
        if self.trace_block_size == Some(0) {
            return Err(UsageError("--trace-block-size: must be at least 1 (got 0)".into()));
        }
        if self.trace_repeat == 0 {
            return Err(UsageError("--trace-repeat: must be at least 1 (got 0)".into()));
        }
        if self.concurrency == Some(0) {
            return Err(UsageError("--concurrency: must be at least 1 (got 0)".into()));
        }
        let basis = self.trace_options(format)?;
        if format == TraceFormat::AppliedComputeAgentic && self.concurrency.is_none() {
            return Err(UsageError(
                "--concurrency: required with --trace-format applied-compute-agentic (its sessions carry no \
                 timestamps)"
                    .into(),
            ));
        }
        // A trace replayed once, one row per session in release order, is read as the
        // replay reaches its rows: memory then follows what is in flight, not the trace.
        let streamed = if self.trace_repeat == 1 && self.agentic_lanes.is_none() {
            let when = StreamIf { by_timestamp: self.concurrency.is_none() };
            scan_for_stream(path, format, self.trace_block_size, when)
                .map_err(|e| UsageError(e.to_string()))?
        } else {
            None
        };
        let trace = match streamed {
            Some(trace) => trace,
            None => load_trace_with(path, format, self.trace_block_size, basis)
                .map_err(|e| UsageError(e.to_string()))?,
        };
        if format == TraceFormat::Dynamo && self.agentic_lanes.is_some() {
            // mocker reads standard Dynamo traces only (agentic records are refused).
            return Err(UsageError("--agentic-lanes: requires an agentic Dynamo trace".into()));
        }
        let unknown = trace.unknown_keys.lines();
        if self.strict && !unknown.is_empty() {
            // One error line per key, worded as the warnings.
            let lines: Vec<String> = unknown.iter().map(|l| format!("{l}; refused (--strict)")).collect();
            return Err(UsageError(lines.join("\nerror: ")));
        }
        for line in unknown {
            eprintln!("warning: {line}; ignored");
        }
        Ok(Workload::Trace(TraceWorkload {
            trace: Arc::new(trace),
            concurrency: self.concurrency,
            repeat: self.trace_repeat,
            lanes: self.agentic_lanes.map(|n| n as usize),
        }))
    }

    /// Checks the agentic and Weka trace flags for `format`, in the reference's order and
    /// with its words; returns the Weka nested timestamp basis.
    fn trace_options(&self, format: TraceFormat) -> Result<NestedTimestampBasis, UsageError> {
        let agentic = matches!(format, TraceFormat::AgenticMooncake | TraceFormat::Weka);
        match &self.execution_model {
            Some(m) if m.trim().is_empty() => {
                return Err(UsageError("--execution-model: must be non-empty (execution_model must be non-empty)".into()))
            }
            None if agentic => {
                return Err(UsageError(format!(
                    "--execution-model: required with --trace-format {} (agentic execution requires a configured \
                     target model: the model the rows' source models are projected onto)",
                    self.trace_format
                )))
            }
            Some(_) if !agentic => eprintln!(
                "warning: --execution-model: not used by a {} trace; it names the target model of agentic \
                 traces (agentic-mooncake, weka)",
                self.trace_format
            ),
            _ => {}
        }
        let basis = match self.weka_nested_timestamp_basis.as_deref() {
            None => NestedTimestampBasis::Auto,
            Some(name) => {
                let basis = NestedTimestampBasis::parse(name).ok_or_else(|| {
                    UsageError(format!(
                        "--weka-nested-timestamp-basis: must be 'auto', 'absolute', or 'relative', got '{name}'"
                    ))
                })?;
                if format != TraceFormat::Weka {
                    return Err(UsageError(
                        "--weka-nested-timestamp-basis: requires --trace-format weka \
                         (weka_nested_timestamp_basis requires trace_format='weka')"
                            .into(),
                    ));
                }
                basis
            }
        };
        if let Some(lanes) = self.agentic_lanes {
            if lanes < 1 {
                return Err(UsageError(format!("--agentic-lanes: must be at least 1 (got {lanes})")));
            }
            if self.concurrency.is_some() {
                return Err(UsageError(
                    "--agentic-lanes: cannot be combined with --concurrency (replay_concurrency)".into(),
                ));
            }
            if !agentic && format != TraceFormat::Dynamo {
                return Err(UsageError(
                    "--agentic-lanes: requires --trace-format agentic-mooncake, weka, or dynamo (an agentic trace)"
                        .into(),
                ));
            }
            if self.trace_repeat != 1 {
                return Err(UsageError(
                    "--agentic-lanes: replays the trace once (drop --trace-repeat)".into(),
                ));
            }
            if self.mode == Mode::Online {
                return Err(UsageError("--agentic-lanes: offline mode only (--mode offline)".into()));
            }
        }
        Ok(basis)
    }

    fn load(&self) -> Result<Load, UsageError> {
        let given =
            [self.concurrency.is_some(), self.request_rate.is_some(), self.arrival_interval_ms.is_some()];
        match given.iter().filter(|g| **g).count() {
            0 => Ok(Load::Concurrency(64)),
            1 => Ok(if let Some(c) = self.concurrency {
                Load::Concurrency(c)
            } else if let Some(r) = self.request_rate {
                Load::RequestRate(r)
            } else {
                Load::ArrivalIntervalMs(self.arrival_interval_ms.unwrap_or_default())
            }),
            _ => Err(UsageError(
                "--concurrency, --request-rate, --arrival-interval-ms: give exactly one load controller"
                    .into(),
            )),
        }
    }

    /// The workers these flags describe: aggregated, or prefill and decode pools.
    fn cluster(&self) -> Result<Cluster, UsageError> {
        let positive = |flag: &str, n: Option<usize>| match n {
            Some(0) => Err(UsageError(format!("{flag}: must be at least 1 (got 0)"))),
            _ => Ok(n.unwrap_or(1)),
        };
        let (prefill, decode) = match (&self.prefill_engine_args, &self.decode_engine_args) {
            (None, None) => {
                for (given, flag) in [
                    (self.num_prefill_workers.is_some(), "--num-prefill-workers"),
                    (self.num_decode_workers.is_some(), "--num-decode-workers"),
                ] {
                    if given {
                        return Err(UsageError(format!(
                            "{flag}: applies to disaggregated replay only (give --prefill-engine-args and \
                             --decode-engine-args)"
                        )));
                    }
                }
                let launch = crate::engine_args::launch_config(self.engine_args.as_deref(), &self.engine)?;
                warn_transfer_keys(
                    "--engine-args",
                    &launch,
                    "a disaggregated replay's --prefill-engine-args",
                );
                return Ok(Cluster::aggregated(launch, positive("--num-workers", self.num_workers)?));
            }
            (Some(p), Some(d)) => (p, d),
            (Some(_), None) => {
                return Err(UsageError("--decode-engine-args: required with --prefill-engine-args".into()))
            }
            (None, Some(_)) => {
                return Err(UsageError("--prefill-engine-args: required with --decode-engine-args".into()))
            }
        };
        if self.engine_args.is_some() {
            return Err(UsageError(
                "--engine-args, --prefill-engine-args/--decode-engine-args: give either aggregated engine args \
                 or the two disaggregated ones, not both"
                    .into(),
            ));
        }
        if self.num_workers.is_some() {
            return Err(UsageError(
                "--num-workers: aggregated replay only; a disaggregated replay takes --num-prefill-workers and \
                 --num-decode-workers"
                    .into(),
            ));
        }
        let launch =
            |flag: &str, args: &str| crate::engine_args::launch_config_for(flag, Some(args), &self.engine);
        let decode_launch = launch("--decode-engine-args", decode)?;
        warn_transfer_keys(
            "--decode-engine-args",
            &decode_launch,
            "--prefill-engine-args (the source's settings time the transfer, as in the reference)",
        );
        Ok(Cluster::Disaggregated {
            prefill: Pool {
                launch: launch("--prefill-engine-args", prefill)?,
                workers: positive("--num-prefill-workers", self.num_prefill_workers)?,
            },
            decode: Pool {
                launch: decode_launch,
                workers: positive("--num-decode-workers", self.num_decode_workers)?,
            },
        })
    }

    /// The replay these flags describe.
    pub fn options(&self) -> Result<ReplayOptions, UsageError> {
        let cluster = self.cluster()?;
        self.warn_inactive_launch_keys(&cluster);
        // Its range is checked with the other options, by `options.validate`.
        let r = self.arrival_speedup_ratio;
        for (flag, v) in [
            ("--max-sim-time-seconds", self.max_sim_time_seconds),
            ("--sla-ttft-ms", self.sla_ttft_ms),
            ("--sla-itl-ms", self.sla_itl_ms),
            ("--sla-e2e-ms", self.sla_e2e_ms),
        ] {
            if let Some(x) = v.filter(|x| !(x.is_finite() && *x >= 0.0)) {
                return Err(UsageError(format!("{flag}: must be a finite number >= 0 (got {x})")));
            }
        }
        if self.max_sim_time_seconds.is_some() && self.trace.is_none() {
            return Err(UsageError("--max-sim-time-seconds: applies to trace replay only".into()));
        }
        let (router, router_config) = self.router()?;
        if self.mode == Mode::Online {
            if router != RouterMode::RoundRobin {
                return Err(UsageError(
                    "--router kv: offline mode only (online mode places round-robin)".into(),
                ));
            }
            if self.max_sim_time_seconds.is_some() {
                return Err(UsageError("--max-sim-time-seconds: offline mode only".into()));
            }
        }
        let workload = self.workload(&cluster)?;
        let options = ReplayOptions {
            cluster,
            workload,
            arrival_speedup_ratio: r,
            router,
            router_config,
            max_sim_time_ms: self.max_sim_time_seconds.map(|s| s * 1e3),
            sla: Sla { ttft_ms: self.sla_ttft_ms, itl_ms: self.sla_itl_ms, e2e_ms: self.sla_e2e_ms },
            kv_event_lag_ms: self.kv_event_lag_ms,
        };
        // Worker roles, block sizes and modes are checked before anything runs, under the
        // flags that set them.
        options.validate(self.mode.name()).map_err(|e| UsageError(cluster_error(e, &options.cluster)))?;
        Ok(options)
    }
}

impl ReplayArgs {
    /// Warns on stderr about launch keys the replay accepts but that do nothing here, as in
    /// the reference's offline replay, and says where they apply.
    fn warn_inactive_launch_keys(&self, cluster: &Cluster) {
        let flag = if cluster.decode().is_some() { "--prefill-engine-args" } else { "--engine-args" };
        let scaled = self.scaling_plan.is_some() || self.policy_given;
        for pool in cluster.pools() {
            if pool.launch.startup_time.is_some() && !scaled {
                let flag = if std::ptr::eq(pool, cluster.entry()) { flag } else { "--decode-engine-args" };
                eprintln!(
                    "warning: {flag}: startup_time not used by this replay (its workers are up from the start, \
                     as in the reference's replay); it applies to workers a scaling plan or policy adds, and to serve"
                );
            }
        }
        for pool in cluster.pools() {
            let flag = if std::ptr::eq(pool, cluster.entry()) { flag } else { "--decode-engine-args" };
            let keys = serve_only_keys(&pool.launch);
            if !keys.is_empty() {
                eprintln!(
                    "warning: {flag}: {} not used by replay (no KV events are published, no text is \
                     generated and KV is handed over without a bootstrap rendezvous); they apply to mocker serve",
                    keys.join(", ")
                );
            }
        }
        let kv = parse_router("--router", &self.router).is_ok_and(|m| m == RouterMode::Kv);
        if !kv && cluster.entry().launch.dynamo.router_queue_policy.is_some() {
            eprintln!(
                "warning: {flag}: dynamo.router_queue_policy not used here; it orders the KV router's queue \
                 (--router kv with a router_queue_threshold)"
            );
        }
    }
}

/// The keys of `launch` that only a server acts on (KV-event publishing, output content,
/// SGLang's bootstrap rendezvous).
fn serve_only_keys(launch: &mocker_core::config::LaunchConfig) -> Vec<&'static str> {
    let (e, rt) = (&launch.engine, &launch.dynamo);
    [
        ("emit_kv_events", e.emit_kv_events),
        ("emit_kv_token_ids", e.emit_kv_token_ids),
        ("dynamo.zmq_kv_events_port", rt.zmq_kv_events_port.is_some()),
        ("dynamo.zmq_replay_port", rt.zmq_replay_port.is_some()),
        ("dynamo.reasoning", rt.reasoning.is_some()),
        ("dynamo.response_replay_trace_path", rt.response_replay_trace_path.is_some()),
        ("dynamo.bootstrap_port", rt.bootstrap_port.is_some()),
        (
            "dynamo.handoff_session_timeout_ms",
            rt.handoff_session_timeout_ms
                != mocker_core::config::RuntimeConfig::default().handoff_session_timeout_ms,
        ),
    ]
    .into_iter()
    .filter(|(_, set)| *set)
    .map(|(key, _)| key)
    .collect()
}

/// Warns on stderr that `flag`'s KV transfer keys do nothing here, and where they apply.
pub fn warn_transfer_keys(flag: &str, launch: &mocker_core::config::LaunchConfig, applies: &str) {
    let e = &launch.engine;
    let mut keys = Vec::new();
    // With a model, the size is the model's own KV per token (mocker_models sets it).
    if e.kv_transfer_bytes_per_token.is_some() && launch.hardware.model.is_none() {
        keys.push("kv_transfer_bytes_per_token");
    }
    if e.kv_transfer_bandwidth.is_some() {
        keys.push("kv_transfer_bandwidth");
    }
    if e.kv_transfer_timing_mode != mocker_core::config::KvTransferTimingMode::FullPrompt {
        keys.push("kv_transfer_timing_mode");
    }
    if !keys.is_empty() {
        eprintln!("warning: {flag}: {} not used here; they apply in {applies}", keys.join(", "));
    }
}

/// Names the flags behind a cluster validation error (the replay crate names its fields).
fn cluster_error(e: ReplayError, cluster: &Cluster) -> String {
    let flags = match cluster {
        Cluster::Aggregated(_) => "--engine-args",
        Cluster::Disaggregated { .. } => "--prefill-engine-args/--decode-engine-args",
    };
    match e {
        ReplayError::Invalid {
            field: "worker_type" | "block_size" | "backend" | "dp_size" | "frontend_latency_ms",
            ..
        } => {
            format!("{flags}: {e}")
        }
        ReplayError::Invalid { field: "mode", message } => format!("--mode: {message}"),
        ReplayError::Invalid { field: "router", message } => format!("--router: {message}"),
        ReplayError::Invalid { field: "max_sim_time", message } => {
            format!("--max-sim-time-seconds: {message}")
        }
        // The trace's own span: the message names the file and field.
        ReplayError::Invalid { field: "trace", message } => message,
        ReplayError::Invalid { field: "repeat", message } => format!("--trace-repeat: {message}"),
        // Fields the replay crate names as the flags that set them.
        ReplayError::Invalid {
            field:
                field @ ("num_workers"
                | "num_prefill_workers"
                | "num_decode_workers"
                | "arrival_speedup_ratio"
                | "trace_repeat"
                | "request_count"
                | "concurrency"
                | "request_rate"
                | "arrival_interval_ms"
                | "inter_turn_delay_ms"
                | "turns_per_session"
                | "sla_ttft_ms"
                | "sla_itl_ms"
                | "sla_e2e_ms"
                | "kv_event_lag_ms"),
            message,
        } => format!("--{}: {message}", field.replace('_', "-")),
        ReplayError::Workload(e) => format!("--{}: {}", e.field.replace('_', "-"), e.message),
        e => e.to_string(),
    }
}

/// A `--router` value (`round-robin` or `kv`, `_` for `-` accepted); errors name `flag`.
pub fn parse_router(flag: &str, name: &str) -> Result<RouterMode, UsageError> {
    match name.trim().replace('_', "-").as_str() {
        "round-robin" => Ok(RouterMode::RoundRobin),
        "kv" | "kv-router" => Ok(RouterMode::Kv),
        other => Err(UsageError(format!("{flag}: must be round-robin or kv (got {other:?})"))),
    }
}

/// Callbacks a replay reports through while it runs, besides the files its flags name.
#[derive(Default)]
pub struct RunHooks<'a> {
    /// Called now and then with (requests finished, total requests, simulated ms); offline only.
    pub progress: Option<&'a mut dyn FnMut(usize, usize, f64)>,
    /// Called with each request's record as it ends, in the `--report-jsonl` order; offline only.
    pub request_ended: Option<&'a mut dyn FnMut(&RequestRecord)>,
    /// Scales the pools on simulated-time ticks (instead of `--scaling-plan`); offline only.
    pub scaling_policy: Option<&'a mut dyn mocker_replay::scaling::ScalingPolicy>,
    /// With a policy: record every worker's lifecycle in the outcome (the reference's
    /// `capture_planner_details`, default true there).
    pub capture_planner_details: bool,
    /// Receives telemetry samples (besides `--telemetry-jsonl`), every
    /// `--telemetry-interval-ms`; offline only.
    pub telemetry: Option<mocker_replay::telemetry::TelemetrySink<'a>>,
}

impl ReplayArgs {
    /// What the run `options` sets up (timing, KV capacity, pools, router), as the report's
    /// `run` object and the table's header describe it.
    pub fn describe(&self, options: &ReplayOptions) -> RunDescription {
        let mut run = crate::run_facts::describe(&crate::run_facts::DescribeOptions {
            replay: options,
            engine: &self.engine,
            mode: self.mode.name(),
        });
        // An agentic trace's source models are projected onto --execution-model (required
        // for them), as the reference's report records it.
        if let (Workload::Trace(t), Some(target)) = (&options.workload, &self.execution_model) {
            if matches!(t.trace.format, TraceFormat::AgenticMooncake | TraceFormat::Weka) {
                run.agentic = Some(AgenticFacts {
                    input_format: if t.trace.format == TraceFormat::Weka {
                        "weka"
                    } else {
                        "agentic_mooncake"
                    }
                    .into(),
                    lanes: t.lanes,
                    source_models: t.trace.source_models(),
                    target_model: target.trim().to_string(),
                    weka_nested_timestamp_basis: t.trace.nested_timestamp_basis.map(str::to_string),
                });
            }
        }
        run
    }

    /// Where `--report-json` writes (a directory gets `mocker_replay_report.json`).
    pub fn report_path(&self) -> Option<PathBuf> {
        self.report_json.as_deref().map(|path| match path.is_dir() {
            true => path.join("mocker_replay_report.json"),
            false => path.to_path_buf(),
        })
    }

    /// Runs `options` (from [`ReplayArgs::options`]) offline or online as `--mode` says, and
    /// writes the files the flags name: `--report-jsonl`, `--report-passes` and `--plot`
    /// (offline only) during and after the run, then `--report-json` (described by `run`).
    pub fn execute(
        &self,
        options: &ReplayOptions,
        run: &RunDescription,
        hooks: RunHooks<'_>,
    ) -> Result<ReplayOutcome, UsageError> {
        let sampled = self.telemetry_jsonl.is_some() || hooks.telemetry.is_some();
        if let Some(ms) = self.telemetry_interval_ms {
            if !sampled {
                return Err(UsageError(
                    "--telemetry-interval-ms: applies only with a telemetry sink (--telemetry-jsonl)".into(),
                ));
            }
            mocker_replay::telemetry::check_interval(ms)
                .map_err(|m| UsageError(format!("--telemetry-interval-ms: {m}")))?;
        }
        if self.mode == Mode::Online && sampled {
            return Err(UsageError(
                "--telemetry-jsonl: only offline replays (--mode offline) sample telemetry".into(),
            ));
        }
        if self.mode == Mode::Online && (self.scaling_plan.is_some() || hooks.scaling_policy.is_some()) {
            return Err(UsageError(
                "--scaling-plan: only offline replays (--mode offline) scale their pools".into(),
            ));
        }
        let plan = match &self.scaling_plan {
            Some(path) if hooks.scaling_policy.is_none() => Some(read_scaling_plan(path)?),
            _ => None,
        };
        let outcome = match self.mode {
            Mode::Offline => run_offline(
                options,
                self.report_jsonl.as_deref(),
                self.report_passes.as_deref(),
                self.plot.as_deref().map(|dir| (dir, run)),
                hooks,
                plan,
                Telemetry {
                    file: self.telemetry_jsonl.as_deref().map(TelemetryFile::new),
                    interval_ms: self.telemetry_interval_ms.unwrap_or(1000.0),
                },
            )?,
            Mode::Online
                if self.report_jsonl.is_some() || self.report_passes.is_some() || self.plot.is_some() =>
            {
                return Err(UsageError(
                    "--report-jsonl, --report-passes, --plot: only offline replays (--mode offline) write them"
                        .into(),
                ))
            }
            Mode::Online => crate::online::run_online(options).map_err(|e| UsageError(e.to_string()))?,
        };
        if let Some(p) = self.report_path() {
            write_atomically(&p, (run.report_json_pretty(&outcome.summary) + "\n").as_bytes())
                .map_err(|e| UsageError(format!("--report-json: cannot write {}: {e}", p.display())))?;
        }
        Ok(outcome)
    }
}

/// A scaled run's active workers over time (`None` when its pools never changed, or its
/// lifecycle was not recorded).
pub fn worker_counts(options: &ReplayOptions, outcome: &ReplayOutcome) -> Option<WorkerCounts> {
    if outcome.lifecycle_operations.is_empty() {
        return None;
    }
    let initial = match options.cluster.decode() {
        Some(decode) => {
            vec![(PoolName::Prefill, options.cluster.entry().workers), (PoolName::Decode, decode.workers)]
        }
        None => vec![(PoolName::Agg, options.cluster.entry().workers)],
    };
    Some(WorkerCounts::from_operations(&initial, &outcome.lifecycle_operations))
}

/// Telemetry's file sink and interval, for `run_offline`.
struct Telemetry {
    file: Option<TelemetryFile>,
    interval_ms: f64,
}

/// Reads `--scaling-plan`'s file.
fn read_scaling_plan(path: &Path) -> Result<ScalingPlan, UsageError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError(format!("--scaling-plan: cannot read {}: {e}", path.display())))?;
    ScalingPlan::from_json(&text).map_err(|e| UsageError(format!("--scaling-plan {}: {e}", path.display())))
}

/// The offline replay, streaming per-request records to `jsonl` and `hooks`, per-pass
/// records to `passes`, and charting the requests into `plot`'s directory (subtitled with
/// its run).
fn run_offline(
    options: &ReplayOptions,
    jsonl: Option<&Path>,
    passes: Option<&Path>,
    plot: Option<(&Path, &RunDescription)>,
    hooks: RunHooks<'_>,
    mut plan: Option<ScalingPlan>,
    telemetry: Telemetry,
) -> Result<ReplayOutcome, UsageError> {
    let (plot, run) = (plot.map(|p| p.0), plot.map(|p| p.1));
    let plot_error = |p: &Path, e: &dyn std::fmt::Display| {
        UsageError(format!("--plot: cannot write into {}: {e}", p.display()))
    };
    if let Some(dir) = plot {
        std::fs::create_dir_all(dir).map_err(|e| plot_error(dir, &e))?;
    }
    let mut charts = plot.map(|_| PlotData::new());
    let jsonl_error = |p: &Path, e: &dyn std::fmt::Display| {
        UsageError(format!("--report-jsonl: cannot write {}: {e}", p.display()))
    };
    let mut file = match jsonl {
        Some(p) => Some(AtomicFile::create(p).map_err(|e| jsonl_error(p, &e))?),
        None => None,
    };
    let RunHooks {
        mut progress,
        request_ended: mut on_record,
        mut scaling_policy,
        capture_planner_details,
        telemetry: mut on_sample,
    } = hooks;
    let Telemetry { file: mut telemetry_file, interval_ms } = telemetry;
    let sampled = telemetry_file.is_some() || on_sample.is_some();
    let mut sample = |s: &mocker_replay::telemetry::TelemetrySample| {
        if let Some(f) = telemetry_file.as_mut() {
            f.write(s)?;
        }
        match on_sample.as_mut() {
            Some(sink) => sink(s),
            None => Ok(()),
        }
    };
    // A plan's run always records the lifecycle (the report shows the worker counts).
    let capture_planner_details = capture_planner_details || plan.is_some();
    // Reborrowed, as `progress` below: the driver's hooks share one lifetime.
    let scaling_policy: Option<&mut dyn ScalingPolicy> = match (scaling_policy.as_mut(), plan.as_mut()) {
        (Some(p), _) => Some(&mut **p),
        (None, Some(p)) => Some(p),
        (None, None) => None,
    };
    let wants_records = jsonl.is_some() || plot.is_some() || on_record.is_some();
    // The first write error is kept and reported after the run; the run itself goes on.
    let mut write_error: Option<std::io::Error> = None;
    let mut write_record = |r: mocker_replay::RequestRecord| {
        if let Some(c) = charts.as_mut() {
            c.add(&r);
        }
        if let Some(f) = on_record.as_mut() {
            f(&r);
        }
        if let (Some(f), None) = (file.as_mut(), &write_error) {
            let w = f.writer();
            if let Err(e) = serde_json::to_writer(&mut *w, &r)
                .map_err(std::io::Error::from)
                .and_then(|()| w.write_all(b"\n"))
            {
                write_error = Some(e);
            }
        }
    };
    let passes_error = |p: &Path, e: &dyn std::fmt::Display| {
        UsageError(format!("--report-passes: cannot write {}: {e}", p.display()))
    };
    let mut passes_file = match passes {
        Some(p) => Some(AtomicFile::create(p).map_err(|e| passes_error(p, &e))?),
        None => None,
    };
    let mut passes_write_error: Option<std::io::Error> = None;
    let mut write_pass = |r: mocker_replay::PassRecord| {
        if let (Some(f), None) = (passes_file.as_mut(), &passes_write_error) {
            let w = f.writer();
            if let Err(e) = serde_json::to_writer(&mut *w, &r)
                .map_err(std::io::Error::from)
                .and_then(|()| w.write_all(b"\n"))
            {
                passes_write_error = Some(e);
            }
        }
    };
    let hooks = mocker_replay::Hooks {
        // Reborrowed: the driver's hooks share one lifetime, the run's locals'.
        progress: match progress.as_mut() {
            Some(p) => Some(&mut **p),
            None => None,
        },
        request_ended: if wants_records { Some(&mut write_record) } else { None },
        pass_ended: if passes.is_some() { Some(&mut write_pass) } else { None },
        scaling_policy,
        capture_planner_details,
        telemetry: if sampled { Some(&mut sample) } else { None },
        telemetry_interval_ms: interval_ms,
    };
    let outcome = mocker_replay::run_replay(options, hooks).map_err(|e| UsageError(e.to_string()))?;
    if let Some(f) = telemetry_file {
        f.finish().map_err(|e| UsageError(format!("--telemetry-jsonl: {e}")))?;
    }
    if let (Some(f), Some(p)) = (file, jsonl) {
        match write_error {
            Some(e) => return Err(jsonl_error(p, &e)),
            None => f.commit().map_err(|e| jsonl_error(p, &e))?,
        }
    }
    if let (Some(f), Some(p)) = (passes_file, passes) {
        match passes_write_error {
            Some(e) => return Err(passes_error(p, &e)),
            None => f.commit().map_err(|e| passes_error(p, &e))?,
        }
    }
    let counts = worker_counts(options, &outcome);
    if let (Some(c), Some(dir), Some(run)) = (charts, plot, run) {
        let subtitle = run.subtitle();
        let o = RenderOptions {
            worker_tokens: &outcome.worker_tokens,
            subtitle: &subtitle,
            // The per-worker figures are the entry pool's: its prefill pool when disaggregated.
            worker_pool: options.cluster.decode().is_some().then_some("prefill"),
            worker_counts: counts.as_ref().map(|c| (c, outcome.summary.duration_ms)),
        };
        for (name, svg) in c.render(&o).map_err(|e| plot_error(dir, &e))? {
            write_atomically(&dir.join(name), svg.as_bytes()).map_err(|e| plot_error(dir, &e))?;
        }
    }
    Ok(outcome)
}
