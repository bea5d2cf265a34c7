//! `mocker sweep`: one offline replay per point of a parameter grid (engine args × worker
//! counts × routers, or prefill × decode worker counts × routers for a disaggregated
//! cluster), run in parallel, one summary row per point as CSV and/or JSON.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use mocker_replay::limits::MAX_WORKERS;
use mocker_replay::{Cluster, ReplayOptions, RouterMode};
use rayon::prelude::*;
use serde_json::{Map, Value};

use crate::output::write_atomically;
use crate::replay::{parse_router, Mode, ReplayArgs};
use crate::UsageError;

/// Workload flags of `mocker replay` plus the grid axes and outputs.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The base replay; each point overrides its engine args, worker count and router.
    #[command(flatten)]
    pub base: ReplayArgs,
    /// Engine args of one grid value (JSON or @file, as --engine-args); repeat for more.
    /// Each is laid over --engine-args when both are given (its keys win). Default: the
    /// base --engine-args.
    #[arg(long = "sweep-engine-args", value_name = "JSON|@FILE")]
    pub sweep_engine_args: Vec<String>,
    /// Comma list of worker counts, e.g. 1,2,4 (default: the base --num-workers).
    #[arg(long, value_name = "N,N,...")]
    pub sweep_num_workers: Option<String>,
    /// Disaggregated sweeps: comma list of prefill worker counts (default: the base
    /// --num-prefill-workers).
    #[arg(long, value_name = "N,N,...")]
    pub sweep_num_prefill_workers: Option<String>,
    /// Disaggregated sweeps: comma list of decode worker counts (default: the base
    /// --num-decode-workers).
    #[arg(long, value_name = "N,N,...")]
    pub sweep_num_decode_workers: Option<String>,
    /// Comma list of routers: round-robin, kv (default: the base --router); --router-config
    /// applies to the kv points.
    #[arg(long, value_name = "ROUTER,...")]
    pub sweep_router: Option<String>,
    /// Write the rows here as CSV (header + one row per point).
    #[arg(long)]
    pub output_csv: Option<PathBuf>,
    /// Write the rows here as JSON ({"points": [...]}).
    #[arg(long)]
    pub output_json: Option<PathBuf>,
    /// Points run at once (default: all cores).
    #[arg(long)]
    pub jobs: Option<usize>,
}

/// One grid point: its coordinates and the replay they describe.
struct Point {
    engine_args: String,
    /// Worker counts: (aggregated) or (prefill, decode).
    workers: Workers,
    router: &'static str,
    options: ReplayOptions,
}

/// A point's worker counts.
#[derive(Debug, Clone, Copy)]
enum Workers {
    Aggregated(usize),
    Disaggregated(usize, usize),
}

/// Summary keys copied into each row, named as in the `--report-json` summary.
const SUMMARY_KEYS: [&str; 12] = [
    "num_requests",
    "completed_requests",
    "duration_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "output_throughput_tok_s",
    "request_throughput_rps",
    "prefix_cache_reused_ratio",
];

/// Goodput keys, present when some SLA is set.
const GOODPUT_KEYS: [&str; 3] =
    ["goodput_completed_requests", "goodput_request_throughput_rps", "goodput_output_throughput_tok_s"];

fn router_name(mode: RouterMode) -> &'static str {
    match mode {
        RouterMode::RoundRobin => "round-robin",
        RouterMode::Kv => "kv",
    }
}

/// Most parallel sweep points (`--jobs`).
const MAX_JOBS: usize = 1024;

/// Parses `flag`'s comma list of worker counts (each in 1..=[`MAX_WORKERS`]).
fn parse_workers(flag: &str, text: &str) -> Result<Vec<usize>, UsageError> {
    let bad = |item: &str| {
        UsageError(format!(
            "{flag}: must be a comma list of integers in 1..={MAX_WORKERS}, e.g. 1,2,4 (got {item:?} in {text:?})"
        ))
    };
    text.split(',')
        .map(|item| match item.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_WORKERS).contains(&n) => Ok(n),
            _ => Err(bad(item)),
        })
        .collect()
}

impl SweepArgs {
    /// Every grid point, engine args outer, workers, router inner; all checked up front.
    fn points(&self) -> Result<Vec<Point>, UsageError> {
        let b = &self.base;
        if b.mode != Mode::Offline {
            return Err(UsageError("--mode: sweep runs offline only".into()));
        }
        if b.report_json.is_some()
            || b.report_jsonl.is_some()
            || b.report_passes.is_some()
            || b.plot.is_some()
        {
            return Err(UsageError(
                "--report-json, --report-jsonl, --report-passes, --plot: not used by sweep (use --output-json / \
                 --output-csv)"
                    .into(),
            ));
        }
        // Each job is a thread running a whole replay.
        if let Some(j) = self.jobs.filter(|j| !(1..=MAX_JOBS).contains(j)) {
            return Err(UsageError(format!("--jobs: must be in 1..={MAX_JOBS} (got {j})")));
        }
        let base = b.options()?;
        let (grid, engine_args) = match &base.cluster {
            Cluster::Aggregated(pool) => {
                for (given, flag) in [
                    (self.sweep_num_prefill_workers.is_some(), "--sweep-num-prefill-workers"),
                    (self.sweep_num_decode_workers.is_some(), "--sweep-num-decode-workers"),
                ] {
                    if given {
                        return Err(UsageError(format!(
                            "{flag}: disaggregated sweeps only (give --prefill-engine-args and --decode-engine-args)"
                        )));
                    }
                }
                let workers = match &self.sweep_num_workers {
                    Some(text) => parse_workers("--sweep-num-workers", text)?,
                    None => vec![pool.workers],
                };
                (workers.into_iter().map(Workers::Aggregated).collect::<Vec<_>>(), self.engine_args(pool)?)
            }
            Cluster::Disaggregated { prefill, decode } => {
                for (given, flag) in [
                    (self.sweep_num_workers.is_some(), "--sweep-num-workers"),
                    (!self.sweep_engine_args.is_empty(), "--sweep-engine-args"),
                ] {
                    if given {
                        return Err(UsageError(format!(
                            "{flag}: aggregated sweeps only; a disaggregated sweep varies \
                             --sweep-num-prefill-workers and --sweep-num-decode-workers"
                        )));
                    }
                }
                let counts = |flag: &str, text: &Option<String>, base: usize| match text {
                    Some(text) => parse_workers(flag, text),
                    None => Ok(vec![base]),
                };
                let ps =
                    counts("--sweep-num-prefill-workers", &self.sweep_num_prefill_workers, prefill.workers)?;
                let ds =
                    counts("--sweep-num-decode-workers", &self.sweep_num_decode_workers, decode.workers)?;
                let grid =
                    ps.iter().flat_map(|&p| ds.iter().map(move |&d| Workers::Disaggregated(p, d))).collect();
                let text = format!(
                    "prefill: {}, decode: {}",
                    b.prefill_engine_args.as_deref().unwrap_or_default(),
                    b.decode_engine_args.as_deref().unwrap_or_default()
                );
                (grid, vec![(text, None)])
            }
        };
        let routers = match &self.sweep_router {
            Some(text) => {
                text.split(',').map(|r| parse_router("--sweep-router", r)).collect::<Result<Vec<_>, _>>()?
            }
            None => vec![base.router],
        };
        // --router-config tunes the kv points; round-robin points ignore it.
        let configs = routers
            .iter()
            .map(|&mode| match mode {
                RouterMode::Kv => b.router_config_for(mode),
                RouterMode::RoundRobin => Ok(Default::default()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut points = Vec::new();
        for (text, launch) in &engine_args {
            for &workers in &grid {
                for (&router, &router_config) in routers.iter().zip(&configs) {
                    let mut cluster = base.cluster.clone();
                    match (&mut cluster, workers) {
                        (Cluster::Aggregated(pool), Workers::Aggregated(n)) => {
                            pool.workers = n;
                            if let Some(l) = launch {
                                pool.launch = l.clone();
                            }
                        }
                        (Cluster::Disaggregated { prefill, decode }, Workers::Disaggregated(p, d)) => {
                            prefill.workers = p;
                            decode.workers = d;
                        }
                        _ => unreachable!("the grid follows the base cluster"),
                    }
                    let options = ReplayOptions { cluster, router, router_config, ..base.clone() };
                    options.validate("offline").map_err(|e| {
                        UsageError(format!(
                            "point {} (engine args {text}, {}, {}): {e}",
                            points.len(),
                            workers.describe(),
                            router_name(router)
                        ))
                    })?;
                    points.push(Point {
                        engine_args: text.clone(),
                        workers,
                        router: router_name(router),
                        options,
                    });
                }
            }
        }
        Ok(points)
    }

    /// The engine-args axis of an aggregated sweep: (text, engine config) per value, or
    /// the base's alone.
    fn engine_args(
        &self,
        pool: &mocker_replay::Pool,
    ) -> Result<Vec<(String, Option<mocker_core::config::LaunchConfig>)>, UsageError> {
        let b = &self.base;
        if self.sweep_engine_args.is_empty() {
            return Ok(vec![(
                b.engine_args.clone().unwrap_or_else(|| "{}".into()),
                Some(pool.launch.clone()),
            )]);
        }
        self.sweep_engine_args
            .iter()
            .enumerate()
            .map(|(i, arg)| {
                let flag = format!("--sweep-engine-args (value {})", i + 1);
                let merged = match &b.engine_args {
                    Some(base) => crate::engine_args::merge_engine_args("--engine-args", base, &flag, arg)?,
                    None => arg.clone(),
                };
                let launch = crate::engine_args::launch_config_for(&flag, Some(&merged), &b.engine)?;
                // Every point replays the base's workload, whose output lengths are drawn
                // before the grid: a point cannot change them.
                if launch.output_length_distribution != pool.launch.output_length_distribution {
                    return Err(UsageError(format!(
                        "{flag}: output_length_distribution shapes the workload every point shares; set it in \
                         --engine-args or with --output-length-distribution"
                    )));
                }
                Ok((arg.clone(), Some(launch)))
            })
            .collect()
    }
}

impl Workers {
    fn describe(self) -> String {
        match self {
            Self::Aggregated(n) => format!("{n} workers"),
            Self::Disaggregated(p, d) => format!("{p} prefill + {d} decode workers"),
        }
    }
}

/// Runs one point and returns its row (key order fixed).
fn run_point(index: usize, point: &Point, goodput: bool) -> Result<Map<String, Value>, UsageError> {
    let start = Instant::now();
    let outcome = mocker_replay::run_synthetic(&point.options)
        .map_err(|e| UsageError(format!("point {index}: {e}")))?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let summary = match outcome.summary.to_json_value() {
        Value::Object(m) => m,
        _ => unreachable!("summary serializes to an object"),
    };
    let mut row = Map::new();
    row.insert("point".into(), Value::from(index));
    row.insert("engine_args".into(), Value::from(point.engine_args.clone()));
    match point.workers {
        Workers::Aggregated(n) => {
            row.insert("num_workers".into(), Value::from(n));
        }
        Workers::Disaggregated(p, d) => {
            row.insert("num_prefill_workers".into(), Value::from(p));
            row.insert("num_decode_workers".into(), Value::from(d));
        }
    }
    row.insert("router".into(), Value::from(point.router));
    let goodput_keys: &[&str] = if goodput { &GOODPUT_KEYS } else { &[] };
    for key in SUMMARY_KEYS.iter().chain(goodput_keys) {
        row.insert((*key).into(), summary.get(*key).cloned().unwrap_or(Value::Null));
    }
    row.insert("wall_ms".into(), Value::from(wall_ms));
    Ok(row)
}

fn to_csv(rows: &[Map<String, Value>]) -> Result<Vec<u8>, UsageError> {
    let err = |e: csv::Error| UsageError(format!("--output-csv: {e}"));
    let mut w = csv::Writer::from_writer(Vec::new());
    if let Some(first) = rows.first() {
        w.write_record(first.keys()).map_err(err)?;
    }
    for row in rows {
        w.write_record(row.values().map(|v| match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }))
        .map_err(err)?;
    }
    w.into_inner().map_err(|e| UsageError(format!("--output-csv: {e}")))
}

/// Runs `mocker sweep`.
pub fn run(mut args: SweepArgs) -> Result<(), UsageError> {
    if args.base.trace.is_some() {
        // Trace replays touch their tables sparsely, as in `mocker replay`.
        crate::avoid_huge_pages();
    }
    if let Some(list) = &args.sweep_router {
        // The grid sets every point's router; a kv base lets --router-config through to
        // the kv points instead of failing the base's round-robin check.
        if list.split(',').any(|r| matches!(parse_router("--sweep-router", r), Ok(RouterMode::Kv))) {
            args.base.router = "kv".into();
        }
    }
    let points = args.points()?;
    let sla = &points[0].options.sla;
    let goodput = sla.ttft_ms.is_some() || sla.itl_ms.is_some() || sla.e2e_ms.is_some();
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(jobs) = args.jobs {
        pool = pool.num_threads(jobs);
    }
    let pool = pool.build().map_err(|e| UsageError(format!("--jobs: {e}")))?;
    // `collect` on an indexed parallel iterator keeps grid order whatever finishes first.
    let rows: Vec<Map<String, Value>> = pool.install(|| {
        points.par_iter().enumerate().map(|(i, p)| run_point(i, p, goodput)).collect::<Result<_, _>>()
    })?;
    let csv = to_csv(&rows)?;
    let json = serde_json::to_string_pretty(&serde_json::json!({ "points": rows }))
        .expect("rows serialize to JSON")
        + "\n";
    if let Some(p) = &args.output_csv {
        write_atomically(p, &csv)
            .map_err(|e| UsageError(format!("--output-csv: cannot write {}: {e}", p.display())))?;
    }
    if let Some(p) = &args.output_json {
        write_atomically(p, json.as_bytes())
            .map_err(|e| UsageError(format!("--output-json: cannot write {}: {e}", p.display())))?;
    }
    if args.output_csv.is_none() && args.output_json.is_none() {
        print!("{}", String::from_utf8(csv).expect("CSV is UTF-8"));
    } else {
        let written: Vec<String> = [&args.output_csv, &args.output_json]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        println!("{} points written to {}", rows.len(), written.join(" and "));
    }
    Ok(())
}
