//! `mocker sweep`'s grid as a library: the base replay's flags plus the grid axes (engine
//! args × worker counts × routers, or prefill × decode worker counts × routers for a
//! disaggregated cluster) expanded into one checked replay per point, and a point run into
//! its summary row. The CLI writes the rows as CSV and JSON; the Python module
//! (`mocker.sweep`) returns them as a table, running the points here or one per Ray task.
//! Either way a row is made by the same code, so the same point gives the same row.

use std::time::Instant;

use clap::Args;
use mocker_core::config::LaunchConfig;
use mocker_replay::limits::MAX_WORKERS;
use mocker_replay::{Cluster, Pool, ReplayOptions, RouterMode};
use rayon::prelude::*;
use serde_json::{Map, Value};

use crate::replay::{parse_router, Mode, ReplayArgs};
use crate::UsageError;

/// One summary row: the point's coordinates, the summary's figures and its wall time, in a
/// fixed key order.
pub type Row = Map<String, Value>;

/// Workload flags of `mocker replay` plus the grid axes. `--jobs` is each front end's own
/// flag (the CLI lists it after its output flags), passed to [`SweepArgs::sweep`].
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
}

/// One grid point: its coordinates and the replay they describe.
pub struct Point {
    /// The engine args value of the point as given (the grid value, or the base's), or
    /// both pools' engine args of a disaggregated sweep.
    pub engine_args: String,
    /// Worker counts: (aggregated) or (prefill, decode).
    pub workers: Workers,
    /// The router's name: `round-robin` or `kv`.
    pub router: &'static str,
    /// The replay the point runs (checked).
    pub options: ReplayOptions,
}

/// A point's worker counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    /// One pool of this many workers.
    Aggregated(usize),
    /// This many prefill and this many decode workers.
    Disaggregated(usize, usize),
}

/// Every point of a sweep, checked, in grid order (engine args outer, workers, router
/// inner), ready to run.
pub struct Sweep {
    /// The points in grid order; a point's index is its row's `point`.
    pub points: Vec<Point>,
    /// Whether some SLA is set, so rows carry the goodput keys.
    goodput: bool,
    /// Points run at once by [`Sweep::run`] (`--jobs`; None: all cores).
    jobs: Option<usize>,
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
    /// Expands the grid: every point's replay, checked up front (reading the base's trace
    /// once; the points share it), to be run `jobs` at once (`--jobs`; None: one per core).
    /// A `kv` value in `--sweep-router` makes the base's router kv, so `--router-config`
    /// reaches the kv points instead of failing the base's round-robin check.
    pub fn sweep(&mut self, jobs: Option<usize>) -> Result<Sweep, UsageError> {
        if let Some(list) = &self.sweep_router {
            if list.split(',').any(|r| matches!(parse_router("--sweep-router", r), Ok(RouterMode::Kv))) {
                self.base.router = "kv".into();
            }
        }
        let points = self.points(jobs)?;
        let sla = &points[0].options.sla;
        let goodput = sla.ttft_ms.is_some() || sla.itl_ms.is_some() || sla.e2e_ms.is_some();
        Ok(Sweep { points, goodput, jobs })
    }

    /// Every grid point, engine args outer, workers, router inner; all checked up front.
    fn points(&self, jobs: Option<usize>) -> Result<Vec<Point>, UsageError> {
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
        // A point's pools are fixed for its whole run: the plan would be accepted and ignored.
        if b.scaling_plan.is_some() {
            return Err(UsageError(
                "--scaling-plan: not used by sweep (each point's pools are fixed; vary them with \
                 --sweep-num-workers, or replay a plan with mocker replay)"
                    .into(),
            ));
        }
        // A row is a point's summary: per-run telemetry would be accepted and ignored.
        if b.telemetry_jsonl.is_some() || b.telemetry_interval_ms.is_some() {
            return Err(UsageError(
                "--telemetry-jsonl, --telemetry-interval-ms: not used by sweep (a row is a point's summary; \
                 sample a point's telemetry with mocker replay)"
                    .into(),
            ));
        }
        // Each job is a thread running a whole replay.
        if let Some(j) = jobs.filter(|j| !(1..=MAX_JOBS).contains(j)) {
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
    fn engine_args(&self, pool: &Pool) -> Result<Vec<(String, Option<LaunchConfig>)>, UsageError> {
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

impl Sweep {
    /// Runs point `index` (in grid order) and returns its row: `point`, `engine_args`, the
    /// worker counts (`num_workers`, or `num_prefill_workers` and `num_decode_workers`),
    /// `router`, the summary's figures (and goodput's, when an SLA is set) and `wall_ms`,
    /// the point's own wall time (the one figure two runs of a point do not share).
    pub fn run_point(&self, index: usize) -> Result<Row, UsageError> {
        let Some(point) = self.points.get(index) else {
            return Err(UsageError(format!(
                "point {index}: the sweep has {} points (0..{})",
                self.points.len(),
                self.points.len()
            )));
        };
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
        let goodput_keys: &[&str] = if self.goodput { &GOODPUT_KEYS } else { &[] };
        for key in SUMMARY_KEYS.iter().chain(goodput_keys) {
            row.insert((*key).into(), summary.get(*key).cloned().unwrap_or(Value::Null));
        }
        row.insert("wall_ms".into(), Value::from(wall_ms));
        Ok(row)
    }

    /// Runs every point, `--jobs` at once (default: one per core), and returns the rows in
    /// grid order whatever finishes first; the first failing point's error otherwise.
    pub fn run(&self) -> Result<Vec<Row>, UsageError> {
        let mut pool = rayon::ThreadPoolBuilder::new();
        if let Some(jobs) = self.jobs {
            pool = pool.num_threads(jobs);
        }
        let pool = pool.build().map_err(|e| UsageError(format!("--jobs: {e}")))?;
        // `collect` on an indexed parallel iterator keeps grid order whatever finishes first.
        pool.install(|| (0..self.points.len()).into_par_iter().map(|i| self.run_point(i)).collect())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: SweepArgs,
        #[arg(long)]
        jobs: Option<usize>,
    }

    fn sweep(flags: &[&str]) -> Result<Sweep, UsageError> {
        let argv = ["sweep", "--input-tokens", "64", "--output-tokens", "4", "--request-count", "6"];
        let mut command = Command::try_parse_from(argv.iter().chain(flags)).expect("flags parse");
        command.args.sweep(command.jobs)
    }

    fn coordinates(s: &Sweep) -> Vec<(String, Workers, &'static str)> {
        s.points.iter().map(|p| (p.engine_args.clone(), p.workers, p.router)).collect()
    }

    #[test]
    fn grid_order_is_engine_args_then_workers_then_router() {
        let s = sweep(&[
            "--sweep-engine-args",
            r#"{"block_size": 16}"#,
            "--sweep-engine-args",
            r#"{"block_size": 32}"#,
            "--sweep-num-workers",
            "1, 3",
            "--sweep-router",
            "round-robin,kv",
        ])
        .unwrap();
        let mut want = Vec::new();
        for e in [r#"{"block_size": 16}"#, r#"{"block_size": 32}"#] {
            for n in [1, 3] {
                for r in ["round-robin", "kv"] {
                    want.push((e.to_string(), Workers::Aggregated(n), r));
                }
            }
        }
        assert_eq!(coordinates(&s), want);
        // Each point's replay carries its coordinates.
        let p = &s.points[7];
        assert_eq!(p.options.router, RouterMode::Kv);
        assert_eq!(p.options.cluster.entry().workers, 3);
        assert_eq!(p.options.cluster.entry().launch.engine.block_size, 32);
    }

    #[test]
    fn disaggregated_grid_is_prefill_then_decode_counts() {
        let s = sweep(&[
            "--prefill-engine-args",
            r#"{"worker_type": "prefill"}"#,
            "--decode-engine-args",
            r#"{"worker_type": "decode"}"#,
            "--sweep-num-prefill-workers",
            "1,2",
            "--sweep-num-decode-workers",
            "3,4",
        ])
        .unwrap();
        let workers: Vec<Workers> = s.points.iter().map(|p| p.workers).collect();
        assert_eq!(
            workers,
            [(1, 3), (1, 4), (2, 3), (2, 4)].map(|(p, d)| Workers::Disaggregated(p, d)).to_vec()
        );
        let row = s.run_point(3).unwrap();
        let keys: Vec<&str> = row.keys().map(String::as_str).take(5).collect();
        assert_eq!(keys, ["point", "engine_args", "num_prefill_workers", "num_decode_workers", "router"]);
        assert_eq!(
            (row["num_prefill_workers"].as_u64(), row["num_decode_workers"].as_u64()),
            (Some(2), Some(4))
        );
    }

    #[test]
    fn a_point_runs_alone_as_in_the_whole_sweep() {
        let s = sweep(&["--sweep-num-workers", "1,2", "--sla-ttft-ms", "50", "--jobs", "2"]).unwrap();
        let all = s.run().unwrap();
        assert_eq!(all.len(), 2);
        let alone = s.run_point(1).unwrap();
        let without_wall = |r: &Row| {
            r.iter().filter(|(k, _)| *k != "wall_ms").map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>()
        };
        assert_eq!(without_wall(&all[1]), without_wall(&alone));
        assert_eq!(alone["point"], 1);
        assert!(alone.contains_key("goodput_completed_requests"), "an SLA adds the goodput keys");
        assert!(s.run_point(2).unwrap_err().0.contains("point 2: the sweep has 2 points"));
    }

    #[test]
    fn bad_axes_name_their_flag() {
        for (flags, needle) in [
            (&["--sweep-num-workers", "1,0"][..], "--sweep-num-workers: must be a comma list"),
            (&["--sweep-router", "kv,random"][..], "--sweep-router: must be round-robin or kv"),
            (
                &["--sweep-num-prefill-workers", "2"][..],
                "--sweep-num-prefill-workers: disaggregated sweeps only",
            ),
            (&["--jobs", "0"][..], "--jobs: must be in 1..=1024 (got 0)"),
            (&["--mode", "online"][..], "--mode: sweep runs offline only"),
            (&["--scaling-plan", "plan.json"][..], "--scaling-plan: not used by sweep"),
            (
                &["--telemetry-jsonl", "t.jsonl"][..],
                "--telemetry-jsonl, --telemetry-interval-ms: not used by sweep",
            ),
            (
                &["--telemetry-interval-ms", "10"][..],
                "--telemetry-jsonl, --telemetry-interval-ms: not used by sweep",
            ),
        ] {
            let e = sweep(flags).err().unwrap_or_else(|| panic!("{flags:?} accepted"));
            assert!(e.0.contains(needle), "{flags:?}: {}", e.0);
        }
    }
}
