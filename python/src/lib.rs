//! The Python module `mocker`: NVIDIA Dynamo mocker's replay calls
//! (`run_mocker_trace_replay`, `run_mocker_synthetic_trace_replay`, `KvRouterConfig`, as
//! `dynamo._core` 1.6.1 names them) and `replay`, which takes `mocker replay`'s own flags.
//!
//! Every call becomes the `mocker replay` command line it stands for and goes through the
//! CLI's own parser and checks (`mocker_args`): a setting means what its flag means, and a
//! mistake raises `ValueError` with the message the CLI prints.

mod keywords;
mod policy;
mod router;
mod sweep;

use clap::Parser;
use mocker_args::replay::{Mode, ReplayArgs, RunHooks};
use mocker_args::UsageError;
use mocker_replay::{ReplayOutcome, RequestRecord};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use keywords::{Argv, Common};
pub use router::KvRouterConfig;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mocker replay`'s flags, parsed from the command line a call stands for.
#[derive(Parser)]
#[command(name = "mocker replay")]
struct ReplayCommand {
    #[command(flatten)]
    args: ReplayArgs,
}

/// An offline replay's result, as the reference's: `summary` (the report's keys),
/// `per_request` (records when asked for, else None), `coverage`, `lifecycle_operations`
/// and `telemetry`; plus `run` (mocker's: what the replay ran).
#[pyclass(module = "mocker", name = "ReplayResult", frozen)]
struct ReplayResult {
    /// The report's summary: a dict with the reference's keys, in its order.
    #[pyo3(get)]
    summary: Py<PyAny>,
    /// One dict per request (`--report-jsonl`'s records) when captured, else None.
    #[pyo3(get)]
    per_request: Py<PyAny>,
    /// What was captured: `capture_per_request`, `capture_planner_details` (True only when a
    /// scaling policy ran with it, as in the reference) and `per_request_records`.
    #[pyo3(get)]
    coverage: Py<PyAny>,
    /// Worker lifecycle changes a scaling policy made (empty without one, or without
    /// `capture_planner_details`).
    #[pyo3(get)]
    lifecycle_operations: Py<PyAny>,
    /// Telemetry samples with `capture_telemetry`: `{"sample_interval_ms", "samples"}`; else None.
    #[pyo3(get)]
    telemetry: Py<PyAny>,
    /// What the replay ran (timing source, KV capacity, pools, router): the report's `run`.
    #[pyo3(get)]
    run: Py<PyAny>,
}

#[pymethods]
impl ReplayResult {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let summary = self.summary.bind(py);
        let get = |key: &str| -> PyResult<String> { Ok(summary.get_item(key)?.repr()?.to_string()) };
        Ok(format!(
            "ReplayResult(completed_requests={}, duration_ms={}, mean_ttft_ms={}, mean_itl_ms={})",
            get("completed_requests")?,
            get("duration_ms")?,
            get("mean_ttft_ms")?,
            get("mean_itl_ms")?
        ))
    }
}

/// A finished replay: its outcome, the report's `run` object and the captured records.
struct Finished {
    outcome: ReplayOutcome,
    mode: Mode,
    run: serde_json::Value,
    /// Each record's JSON text, when captured.
    records: Option<Vec<String>>,
    /// A scaling policy ran, recording its lifecycle details.
    planner_details: bool,
    /// Captured telemetry: the interval and each sample's JSON text.
    telemetry: Option<(f64, Vec<String>)>,
}

/// Where telemetry samples go besides `--telemetry-jsonl`.
struct Sampler {
    /// Keep them on the result (`capture_telemetry`).
    capture: bool,
    /// Hand each to this callable (`telemetry_callback`).
    callback: Option<Py<PyAny>>,
    interval_ms: f64,
}

/// A scaling policy for a replay, and whether to record its decisions' details.
struct Scaler {
    policy: Py<PyAny>,
    capture_planner_details: bool,
}

/// A `UsageError` as Python sees it.
fn value_error(e: UsageError) -> PyErr {
    PyValueError::new_err(e.0)
}

/// Parses `argv` as `mocker replay`'s command line and runs it with the interpreter
/// detached (other Python threads run meanwhile), capturing per-request records if asked.
/// `max_sim_time_ms`, when given, replaces the flag's value converted from seconds, so the
/// stop time is exactly the one asked for.
fn run_command(
    py: Python<'_>,
    argv: Argv,
    capture: Option<&str>,
    max_sim_time_ms: Option<f64>,
    scaler: Option<Scaler>,
    sampler: Option<Sampler>,
) -> PyResult<Finished> {
    let mut args = ReplayCommand::try_parse_from(argv.into_vec())
        .map_err(|e| PyValueError::new_err(clap_message(&e)))?
        .args;
    args.policy_given = scaler.is_some();
    let planner_details = scaler.as_ref().is_some_and(|s| s.capture_planner_details);
    let capture_planner_details = planner_details;
    let mut policy = scaler.map(|s| policy::PyPolicy::new(s.policy));
    let capture_samples = sampler.as_ref().is_some_and(|s| s.capture);
    let interval_ms = sampler.as_ref().map_or(1000.0, |s| s.interval_ms);
    let mut callback = sampler.and_then(|s| s.callback).map(policy::PyCallback::new);
    if let (Some(keyword), Mode::Online) = (capture, args.mode) {
        return Err(PyValueError::new_err(format!(
            "{keyword}: only offline replays (replay_mode=\"offline\") capture per-request records"
        )));
    }
    let finished = py.detach(|| {
        let mut options = args.options()?;
        if max_sim_time_ms.is_some() {
            options.max_sim_time_ms = max_sim_time_ms;
        }
        let run = args.describe(&options);
        let mut records = capture.map(|_| Vec::new());
        let mut keep = |r: &RequestRecord| {
            if let Some(v) = records.as_mut() {
                v.push(serde_json::to_string(r).expect("a record serializes to JSON"));
            }
        };
        let mut samples = capture_samples.then(Vec::new);
        let sampled = capture_samples || callback.is_some();
        let mut sample = |s: &mocker_replay::telemetry::TelemetrySample| {
            let text = serde_json::to_string(s).expect("a sample serializes to JSON");
            if let Some(cb) = callback.as_mut() {
                cb.call(&text)?;
            }
            if let Some(v) = samples.as_mut() {
                v.push(text);
            }
            Ok(())
        };
        let hooks = RunHooks {
            request_ended: if capture.is_some() { Some(&mut keep) } else { None },
            scaling_policy: policy.as_mut().map(|p| p as &mut dyn mocker_replay::scaling::ScalingPolicy),
            capture_planner_details,
            telemetry: if sampled { Some(&mut sample) } else { None },
            ..Default::default()
        };
        let outcome = args.execute(&options, &run, hooks)?;
        let telemetry = samples.map(|v| (interval_ms, v));
        Ok(Finished { outcome, mode: args.mode, run: run.to_json(), records, planner_details, telemetry })
    });
    // A policy's or callback's own exception stops the replay and reaches the caller unchanged.
    if let Some(e) = policy.and_then(|p| p.error) {
        return Err(e);
    }
    if let Some(e) = callback.and_then(|c| c.error) {
        return Err(e);
    }
    finished.map_err(value_error)
}

/// `x` as JSON text.
fn json_f64(x: f64) -> String {
    serde_json::to_string(&x).expect("a finite float")
}

/// A clap error as the CLI prints it, without the `error: ` prefix and the usage and
/// `--help` hints that only make sense on a command line.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let end = ["\n\nUsage:", "\n\nFor more information"].iter().filter_map(|m| text.find(m)).min();
    text[..end.unwrap_or(text.len())].trim_end().to_string()
}

/// Python objects from JSON text (`json.loads`): dicts keep the report's key order.
fn from_json<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (text,))
}

/// The summary dict of a finished replay.
fn summary_dict<'py>(py: Python<'py>, f: &Finished) -> PyResult<Bound<'py, PyAny>> {
    from_json(py, &f.outcome.summary.to_json_value().to_string())
}

/// The reference's offline result object for a finished replay.
fn offline_result(py: Python<'_>, f: Finished) -> PyResult<ReplayResult> {
    let per_request = match &f.records {
        Some(records) => from_json(py, &format!("[{}]", records.join(",")))?,
        None => py.None().into_bound(py),
    };
    let coverage = PyDict::new(py);
    coverage.set_item("capture_per_request", f.records.is_some())?;
    coverage.set_item("capture_planner_details", f.planner_details)?;
    coverage.set_item("per_request_records", f.records.as_ref().map_or(0, Vec::len))?;
    Ok(ReplayResult {
        summary: summary_dict(py, &f)?.unbind(),
        per_request: per_request.unbind(),
        coverage: coverage.into_any().unbind(),
        lifecycle_operations: match f.outcome.lifecycle_operations.is_empty() {
            true => PyList::empty(py).into_any().unbind(),
            false => {
                let ops =
                    serde_json::to_string(&f.outcome.lifecycle_operations).expect("operations serialize");
                from_json(py, &ops)?.unbind()
            }
        },
        telemetry: match &f.telemetry {
            None => py.None(),
            Some((interval, samples)) => {
                let text = format!(
                    "{{\"sample_interval_ms\":{},\"samples\":[{}]}}",
                    json_f64(*interval),
                    samples.join(",")
                );
                from_json(py, &text)?.unbind()
            }
        },
        run: from_json(py, &f.run.to_string())?.unbind(),
    })
}

/// What the reference's calls return: the result object offline, the summary dict online.
fn reference_result(py: Python<'_>, f: Finished) -> PyResult<Py<PyAny>> {
    match f.mode {
        Mode::Offline => Ok(Bound::new(py, offline_result(py, f)?)?.into_any().unbind()),
        Mode::Online => Ok(summary_dict(py, &f)?.unbind()),
    }
}

/// Replays a trace file, as the reference's `run_mocker_trace_replay` (same keywords,
/// defaults and positional order).
#[pyfunction]
#[pyo3(signature = (
    trace_files,
    extra_engine_args = None,
    prefill_engine_args = None,
    decode_engine_args = None,
    router_config = None,
    ais_perf_config = None,
    num_workers = 1,
    num_prefill_workers = 1,
    num_decode_workers = 1,
    replay_concurrency = None,
    replay_mode = "offline",
    router_mode = "round_robin",
    arrival_speedup_ratio = 1.0,
    trace_block_size = None,
    trace_format = "mooncake",
    trace_shared_prefix_ratio = 0.0,
    trace_num_prefix_groups = 0,
    report_jsonl_path = None,
    max_sim_time_ms = None,
    model_name = None,
    sla_ttft_ms = None,
    sla_itl_ms = None,
    sla_e2e_ms = None,
    capture_per_request = false,
    capture_planner_details = true,
    scaling_policy = None,
    agentic_lanes = None,
    execution_model = None,
    weka_nested_timestamp_basis = None,
    capture_telemetry = false,
    telemetry_sample_interval_ms = 1000.0,
    telemetry_callback = None,
    telemetry_jsonl_path = None,
    kv_event_lag_ms = None,
))]
#[allow(clippy::too_many_arguments)]
fn run_mocker_trace_replay(
    py: Python<'_>,
    trace_files: Vec<std::path::PathBuf>,
    extra_engine_args: Option<Bound<'_, PyAny>>,
    prefill_engine_args: Option<Bound<'_, PyAny>>,
    decode_engine_args: Option<Bound<'_, PyAny>>,
    router_config: Option<PyRef<'_, KvRouterConfig>>,
    ais_perf_config: Option<Bound<'_, PyAny>>,
    num_workers: usize,
    num_prefill_workers: usize,
    num_decode_workers: usize,
    replay_concurrency: Option<usize>,
    replay_mode: &str,
    router_mode: &str,
    arrival_speedup_ratio: f64,
    trace_block_size: Option<usize>,
    trace_format: &str,
    trace_shared_prefix_ratio: f64,
    trace_num_prefix_groups: usize,
    report_jsonl_path: Option<std::path::PathBuf>,
    max_sim_time_ms: Option<f64>,
    model_name: Option<Bound<'_, PyAny>>,
    sla_ttft_ms: Option<f64>,
    sla_itl_ms: Option<f64>,
    sla_e2e_ms: Option<f64>,
    capture_per_request: bool,
    capture_planner_details: bool,
    scaling_policy: Option<Bound<'_, PyAny>>,
    agentic_lanes: Option<i64>,
    execution_model: Option<String>,
    weka_nested_timestamp_basis: Option<String>,
    capture_telemetry: bool,
    telemetry_sample_interval_ms: f64,
    telemetry_callback: Option<Bound<'_, PyAny>>,
    telemetry_jsonl_path: Option<Bound<'_, PyAny>>,
    kv_event_lag_ms: Option<f64>,
) -> PyResult<Py<PyAny>> {
    let common = Common {
        extra_engine_args,
        prefill_engine_args,
        decode_engine_args,
        router_config: router_config.map(|c| c.config),
        ais_perf_config,
        num_workers,
        num_prefill_workers,
        num_decode_workers,
        replay_concurrency,
        replay_mode,
        router_mode,
        arrival_speedup_ratio,
        model_name,
        sla_ttft_ms,
        sla_itl_ms,
        sla_e2e_ms,
        scaling_policy,
        capture_telemetry,
        telemetry_sample_interval_ms,
        telemetry_callback,
        telemetry_jsonl_path,
        kv_event_lag_ms,
    };
    common.refuse_unsupported()?;
    let scaler = common.scaler(capture_planner_details);
    let sampler = common.sampler();
    keywords::refuse_trace_unsupported(trace_shared_prefix_ratio, trace_num_prefix_groups)?;
    let mut argv = Argv::new();
    common.push(py, &mut argv)?;
    keywords::push_trace_options(
        &mut argv,
        agentic_lanes,
        execution_model.as_deref(),
        weka_nested_timestamp_basis.as_deref(),
    );
    argv.opt("trace-block-size", trace_block_size);
    argv.flag("trace-format", trace_format);
    if let Some(path) = &report_jsonl_path {
        argv.path("report-jsonl", path);
    }
    // The stop time is checked under its flag, in seconds, and then used in exact ms.
    argv.opt("max-sim-time-seconds", max_sim_time_ms.map(|ms| ms / 1e3));
    let [trace] = trace_files.as_slice() else {
        return Err(PyValueError::new_err(format!(
            "trace_files: mocker replays one trace file (or Weka directory) per run (got {})",
            trace_files.len()
        )));
    };
    argv.trace(trace);
    let capture = capture_per_request.then_some("capture_per_request");
    let finished = run_command(py, argv, capture, max_sim_time_ms, scaler, sampler)?;
    reference_result(py, finished)
}

/// Replays a synthetic workload, as the reference's `run_mocker_synthetic_trace_replay`
/// (same keywords, defaults and positional order). Without a load keyword the load is
/// `replay_concurrency=64`, as on the CLI.
#[pyfunction]
#[pyo3(signature = (
    input_tokens,
    output_tokens,
    request_count,
    extra_engine_args = None,
    prefill_engine_args = None,
    decode_engine_args = None,
    router_config = None,
    ais_perf_config = None,
    num_workers = 1,
    num_prefill_workers = 1,
    num_decode_workers = 1,
    replay_concurrency = None,
    replay_mode = "offline",
    router_mode = "round_robin",
    arrival_speedup_ratio = 1.0,
    request_rate = None,
    arrival_interval_ms = None,
    arrival_seed = 42,
    turns_per_session = 1,
    shared_prefix_ratio = 0.0,
    num_prefix_groups = 0,
    inter_turn_delay_ms = 0.0,
    model_name = None,
    sla_ttft_ms = None,
    sla_itl_ms = None,
    sla_e2e_ms = None,
    capture_per_request = false,
    capture_planner_details = true,
    scaling_policy = None,
    capture_telemetry = false,
    telemetry_sample_interval_ms = 1000.0,
    telemetry_callback = None,
    telemetry_jsonl_path = None,
    kv_event_lag_ms = None,
))]
#[allow(clippy::too_many_arguments)]
fn run_mocker_synthetic_trace_replay(
    py: Python<'_>,
    input_tokens: usize,
    output_tokens: usize,
    request_count: usize,
    extra_engine_args: Option<Bound<'_, PyAny>>,
    prefill_engine_args: Option<Bound<'_, PyAny>>,
    decode_engine_args: Option<Bound<'_, PyAny>>,
    router_config: Option<PyRef<'_, KvRouterConfig>>,
    ais_perf_config: Option<Bound<'_, PyAny>>,
    num_workers: usize,
    num_prefill_workers: usize,
    num_decode_workers: usize,
    replay_concurrency: Option<usize>,
    replay_mode: &str,
    router_mode: &str,
    arrival_speedup_ratio: f64,
    request_rate: Option<f64>,
    arrival_interval_ms: Option<f64>,
    arrival_seed: u64,
    turns_per_session: usize,
    shared_prefix_ratio: f64,
    num_prefix_groups: usize,
    inter_turn_delay_ms: f64,
    model_name: Option<Bound<'_, PyAny>>,
    sla_ttft_ms: Option<f64>,
    sla_itl_ms: Option<f64>,
    sla_e2e_ms: Option<f64>,
    capture_per_request: bool,
    capture_planner_details: bool,
    scaling_policy: Option<Bound<'_, PyAny>>,
    capture_telemetry: bool,
    telemetry_sample_interval_ms: f64,
    telemetry_callback: Option<Bound<'_, PyAny>>,
    telemetry_jsonl_path: Option<Bound<'_, PyAny>>,
    kv_event_lag_ms: Option<f64>,
) -> PyResult<Py<PyAny>> {
    let common = Common {
        extra_engine_args,
        prefill_engine_args,
        decode_engine_args,
        router_config: router_config.map(|c| c.config),
        ais_perf_config,
        num_workers,
        num_prefill_workers,
        num_decode_workers,
        replay_concurrency,
        replay_mode,
        router_mode,
        arrival_speedup_ratio,
        model_name,
        sla_ttft_ms,
        sla_itl_ms,
        sla_e2e_ms,
        scaling_policy,
        capture_telemetry,
        telemetry_sample_interval_ms,
        telemetry_callback,
        telemetry_jsonl_path,
        kv_event_lag_ms,
    };
    common.refuse_unsupported()?;
    let scaler = common.scaler(capture_planner_details);
    let sampler = common.sampler();
    let mut argv = Argv::new();
    common.push(py, &mut argv)?;
    argv.flag("input-tokens", input_tokens);
    argv.flag("output-tokens", output_tokens);
    argv.flag("request-count", request_count);
    argv.opt("request-rate", request_rate);
    argv.opt("arrival-interval-ms", arrival_interval_ms);
    argv.flag("arrival-seed", arrival_seed);
    // Left out at its default, as the flag: with it, a trace-only check would fire.
    if turns_per_session != 1 {
        argv.flag("turns-per-session", turns_per_session);
    }
    argv.flag("shared-prefix-ratio", shared_prefix_ratio);
    argv.flag("num-prefix-groups", num_prefix_groups);
    argv.flag("inter-turn-delay-ms", inter_turn_delay_ms);
    let capture = capture_per_request.then_some("capture_per_request");
    let finished = run_command(py, argv, capture, None, scaler, sampler)?;
    reference_result(py, finished)
}

/// Runs `mocker replay` with its own flags as keywords (`num_workers=4`, `router="kv"`,
/// `engine_args={"block_size": 64}`, `report_json="out.json"`; `_` for `-`): True passes
/// a switch, None or False leaves a flag out, a dict or list is passed as JSON. `trace` is
/// the trace file (none: a synthetic workload). `per_request=True` keeps the per-request
/// records. Returns a `ReplayResult` in either mode.
#[pyfunction]
#[pyo3(signature = (trace = None, *, per_request = false, **flags))]
fn replay(
    py: Python<'_>,
    trace: Option<std::path::PathBuf>,
    per_request: bool,
    flags: Option<&Bound<'_, PyDict>>,
) -> PyResult<ReplayResult> {
    let mut argv = Argv::new();
    if let Some(flags) = flags {
        for (name, value) in flags.iter() {
            argv.python_flag(py, &name.extract::<String>()?, &value)?;
        }
    }
    if let Some(trace) = &trace {
        argv.trace(trace);
    }
    let finished = run_command(py, argv, per_request.then_some("per_request"), None, None, None)?;
    offline_result(py, finished)
}

/// A GPU-free simulator of LLM inference engines: NVIDIA Dynamo mocker's replay calls (`run_mocker_trace_replay`,
/// `run_mocker_synthetic_trace_replay`, `KvRouterConfig`) and `replay`, with `mocker replay`'s own flags.
/// The extension module `mocker._native`; the package `mocker` (`python/mocker/__init__.py`)
/// re-exports it and adds `sweep`.
#[pymodule]
#[pyo3(name = "_native")]
fn mocker(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<KvRouterConfig>()?;
    m.add_class::<ReplayResult>()?;
    m.add_function(wrap_pyfunction!(run_mocker_trace_replay, m)?)?;
    m.add_function(wrap_pyfunction!(run_mocker_synthetic_trace_replay, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_class::<sweep::SweepPlan>()?;
    m.add_function(wrap_pyfunction!(sweep::_sweep_plan, m)?)?;
    m.add_function(wrap_pyfunction!(sweep::_sweep_point, m)?)?;
    Ok(())
}
