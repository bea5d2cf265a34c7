//! `mocker replay`: flags to a synthetic workload, run offline, print and save the report.

use std::path::{Path, PathBuf};

use clap::Args;
use mocker_core::config::LaunchConfig;
use mocker_replay::report::render_table;
use mocker_replay::{run_synthetic, Load, ReplayOptions, SyntheticWorkload};

use crate::UsageError;

/// Synthetic workload and engine flags (names as in Dynamo's `python -m dynamo.replay`).
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 1000)]
    pub input_tokens: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 100)]
    pub output_tokens: usize,
    /// Requests (sessions when --turns-per-session > 1).
    #[arg(long, default_value_t = 1000)]
    pub request_count: usize,
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
    /// Turns per session; each turn follows the previous one's completion.
    #[arg(long, default_value_t = 1)]
    pub turns_per_session: usize,
    /// Fraction of each prompt shared within its prefix group, in [0, 1].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub shared_prefix_ratio: f64,
    /// Number of prefix groups sessions are drawn into (0 = no sharing).
    #[arg(long, default_value_t = 0)]
    pub num_prefix_groups: usize,
    /// Delay between a turn's completion and the next turn, ms.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub inter_turn_delay_ms: f64,
    /// Simulated workers; requests are placed round-robin.
    #[arg(long, default_value_t = 1)]
    pub num_workers: usize,
    /// Engine configuration as JSON (flat or {"engine": {...}}) or @file.
    #[arg(long, visible_alias = "extra-engine-args")]
    pub engine_args: Option<String>,
    /// Write the full JSON report here (a directory gets `mocker_replay_report.json`).
    #[arg(long)]
    pub report_json: Option<PathBuf>,
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

impl ReplayArgs {
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

    /// The replay these flags describe.
    pub fn options(&self) -> Result<ReplayOptions, UsageError> {
        let launch = match &self.engine_args {
            Some(arg) => {
                LaunchConfig::from_arg(arg).map_err(|e| UsageError(format!("--engine-args: {e}")))?
            }
            None => LaunchConfig::default(),
        };
        let workload = SyntheticWorkload {
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            request_count: self.request_count,
            load: self.load()?,
            arrival_seed: self.arrival_seed,
            turns_per_session: self.turns_per_session,
            shared_prefix_ratio: self.shared_prefix_ratio,
            num_prefix_groups: self.num_prefix_groups,
            inter_turn_delay_ms: self.inter_turn_delay_ms,
        };
        workload
            .validate()
            .map_err(|e| UsageError(format!("--{}: {}", e.field.replace('_', "-"), e.message)))?;
        let r = self.arrival_speedup_ratio;
        if !(r.is_finite() && r > 0.0) {
            return Err(UsageError(format!(
                "--arrival-speedup-ratio: must be a finite number > 0 (got {r})"
            )));
        }
        Ok(ReplayOptions { launch, num_workers: self.num_workers, workload, arrival_speedup_ratio: r })
    }
}

fn report_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("mocker_replay_report.json")
    } else {
        path.to_path_buf()
    }
}

/// Runs `mocker replay`.
pub fn run(args: ReplayArgs) -> Result<(), UsageError> {
    let options = args.options()?;
    let outcome = match args.mode {
        Mode::Offline => run_synthetic(&options).map_err(|e| UsageError(e.to_string()))?,
        Mode::Online => crate::online::run_online(&options).map_err(|e| UsageError(e.to_string()))?,
    };
    let path = args.report_json.as_deref().map(report_path);
    if let Some(p) = &path {
        std::fs::write(p, outcome.summary.to_json_pretty() + "\n")
            .map_err(|e| UsageError(format!("--report-json: cannot write {}: {e}", p.display())))?;
    }
    let shown = path.as_ref().map(|p| p.display().to_string());
    print!("{}", render_table(&outcome.summary, shown.as_deref()));
    Ok(())
}
