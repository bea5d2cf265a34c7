//! The reference's keywords mapped onto `mocker replay`'s flags: each keyword either
//! becomes its flag (values the CLI then parses and checks) or, where mocker has no such
//! feature, is refused by name unless it has its default (which asks for nothing).

use std::ffi::OsString;
use std::fmt::Display;
use std::path::Path;

use mocker_router::KvRouterConfig as RouterConfig;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyList, PyString};

/// A `mocker replay` command line being assembled (flags as `--name=value`, so a value
/// starting with `-` stays a value).
pub struct Argv(Vec<OsString>);

impl Argv {
    /// The command's name, no flags yet.
    pub fn new() -> Self {
        Self(vec!["mocker replay".into()])
    }

    /// `--name=value`.
    pub fn flag(&mut self, name: &str, value: impl Display) {
        self.0.push(format!("--{name}={value}").into());
    }

    /// `--name=value` when given.
    pub fn opt(&mut self, name: &str, value: Option<impl Display>) {
        if let Some(v) = value {
            self.flag(name, v);
        }
    }

    /// `--name=PATH` (paths need not be UTF-8).
    pub fn path(&mut self, name: &str, path: &Path) {
        let mut arg = OsString::from(format!("--{name}="));
        arg.push(path);
        self.0.push(arg);
    }

    /// The positional trace file, after `--` so no name is read as a flag.
    pub fn trace(&mut self, path: &Path) {
        self.0.push("--".into());
        self.0.push(path.into());
    }

    /// A flag given as a Python keyword of `mocker.replay`: `_` for `-` in its name; True a
    /// switch, None or False left out; a dict or list as JSON; anything else as its `str`.
    pub fn python_flag(&mut self, py: Python<'_>, keyword: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let name = keyword.replace('_', "-");
        if value.is_none() {
            return Ok(());
        }
        if let Ok(b) = value.cast::<PyBool>() {
            if b.is_true() {
                self.0.push(format!("--{name}").into());
            }
            return Ok(());
        }
        if value.is_instance_of::<PyDict>() || value.is_instance_of::<PyList>() {
            self.flag(&name, json_dumps(py, value)?);
            return Ok(());
        }
        let os = py.import("os")?;
        if value.is_instance(&os.getattr("PathLike")?)? {
            let path: std::path::PathBuf = value.extract()?;
            self.path(&name, &path);
            return Ok(());
        }
        self.flag(&name, value.str()?.extract::<String>()?);
        Ok(())
    }

    /// The assembled command line.
    pub fn into_vec(self) -> Vec<OsString> {
        self.0
    }
}

/// `json.dumps(value)`.
fn json_dumps(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
    py.import("json")?.call_method1("dumps", (value,))?.extract()
}

/// Engine args as `--engine-args` takes them: a mapping as JSON, a string as given (JSON
/// text, or `@file`).
fn engine_args_text(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<String> {
    match value.cast::<PyString>() {
        Ok(s) => s.extract(),
        Err(_) => json_dumps(py, value),
    }
}

/// A keyword mocker does not support yet, refused by name.
fn unsupported(keyword: &str, why: &str) -> PyErr {
    PyValueError::new_err(format!("{keyword}: not supported yet ({why})"))
}

/// The keywords both of the reference's calls take.
pub struct Common<'py, 'a> {
    /// `--engine-args`.
    pub extra_engine_args: Option<Bound<'py, PyAny>>,
    /// `--prefill-engine-args`.
    pub prefill_engine_args: Option<Bound<'py, PyAny>>,
    /// `--decode-engine-args`.
    pub decode_engine_args: Option<Bound<'py, PyAny>>,
    /// `--router-config`.
    pub router_config: Option<RouterConfig>,
    /// Refused unless None.
    pub ais_perf_config: Option<Bound<'py, PyAny>>,
    /// `--num-workers` (left out at its default 1).
    pub num_workers: usize,
    /// `--num-prefill-workers` (left out at its default 1).
    pub num_prefill_workers: usize,
    /// `--num-decode-workers` (left out at its default 1).
    pub num_decode_workers: usize,
    /// `--concurrency`.
    pub replay_concurrency: Option<usize>,
    /// `--mode`.
    pub replay_mode: &'a str,
    /// `--router` (`round_robin` or `kv_router`, and the CLI's spellings).
    pub router_mode: &'a str,
    /// `--arrival-speedup-ratio`.
    pub arrival_speedup_ratio: f64,
    /// Refused unless None.
    pub model_name: Option<Bound<'py, PyAny>>,
    /// `--sla-ttft-ms`.
    pub sla_ttft_ms: Option<f64>,
    /// `--sla-itl-ms`.
    pub sla_itl_ms: Option<f64>,
    /// `--sla-e2e-ms`.
    pub sla_e2e_ms: Option<f64>,
    /// The policy that scales the pools (offline only).
    pub scaling_policy: Option<Bound<'py, PyAny>>,
    /// Keep telemetry samples on the result.
    pub capture_telemetry: bool,
    /// Simulated ms between samples (`--telemetry-interval-ms`).
    pub telemetry_sample_interval_ms: f64,
    /// Called with each sample dict.
    pub telemetry_callback: Option<Bound<'py, PyAny>>,
    /// `--telemetry-jsonl`.
    pub telemetry_jsonl_path: Option<Bound<'py, PyAny>>,
    /// `--kv-event-lag-ms` (None and 0 are no lag, as in the reference).
    pub kv_event_lag_ms: Option<f64>,
}

impl Common<'_, '_> {
    /// Refuses, by name, the keywords that ask for what mocker does not do yet.
    pub fn refuse_unsupported(&self) -> PyResult<()> {
        if self.scaling_policy.is_some() && self.replay_mode != "offline" {
            return Err(PyValueError::new_err("scaling_policy only supports replay_mode='offline'"));
        }
        if self.telemetry_callback.as_ref().is_some_and(|c| !c.is_callable()) {
            return Err(PyTypeError::new_err("telemetry_callback must be callable or None"));
        }
        let sampled = self.capture_telemetry
            || self.telemetry_callback.is_some()
            || self.telemetry_jsonl_path.is_some();
        if sampled && self.replay_mode != "offline" {
            return Err(PyValueError::new_err("replay telemetry only supports replay_mode='offline'"));
        }
        let interval = self.telemetry_sample_interval_ms;
        if sampled && !(interval.is_finite() && interval > 0.0) {
            return Err(PyValueError::new_err(
                "telemetry_sample_interval_ms must be a positive finite number",
            ));
        }
        if !sampled && interval != 1000.0 {
            // The reference ignores it; mocker says it does nothing rather than ignore it.
            return Err(PyValueError::new_err(
                "telemetry_sample_interval_ms: applies only with capture_telemetry, telemetry_callback or \
                 telemetry_jsonl_path",
            ));
        }
        if self.ais_perf_config.is_some() {
            return Err(unsupported(
                "ais_perf_config",
                "mocker times passes by the engine args' timing_model; for a model on a GPU give \
                 extra_engine_args {\"model\": ..., \"gpu\": ...}",
            ));
        }
        if self.model_name.is_some() {
            return Err(unsupported(
                "model_name",
                "it names the model of an AIS perf model; for a model on a GPU give extra_engine_args \
                 {\"model\": ..., \"gpu\": ...}",
            ));
        }
        Ok(())
    }

    /// The scaling policy, if one was given, with `capture_planner_details`.
    pub fn scaler(&self, capture_planner_details: bool) -> Option<crate::Scaler> {
        self.scaling_policy
            .as_ref()
            .map(|p| crate::Scaler { policy: p.clone().unbind(), capture_planner_details })
    }

    /// Pushes the flags these keywords stand for.
    pub fn push(&self, py: Python<'_>, argv: &mut Argv) -> PyResult<()> {
        for (flag, args) in [
            ("engine-args", &self.extra_engine_args),
            ("prefill-engine-args", &self.prefill_engine_args),
            ("decode-engine-args", &self.decode_engine_args),
        ] {
            if let Some(a) = args {
                argv.flag(flag, engine_args_text(py, a)?);
            }
        }
        argv.opt("router-config", self.router_config.map(|c| c.to_json()));
        // Worker counts at their default are left out, as flags not given: the CLI refuses
        // a count for a pool the run does not have.
        for (flag, n) in [
            ("num-workers", self.num_workers),
            ("num-prefill-workers", self.num_prefill_workers),
            ("num-decode-workers", self.num_decode_workers),
        ] {
            if n != 1 {
                argv.flag(flag, n);
            }
        }
        argv.opt("concurrency", self.replay_concurrency);
        argv.flag("mode", self.replay_mode);
        argv.flag("router", self.router_mode);
        argv.flag("arrival-speedup-ratio", self.arrival_speedup_ratio);
        argv.opt("sla-ttft-ms", self.sla_ttft_ms);
        argv.opt("sla-itl-ms", self.sla_itl_ms);
        argv.opt("sla-e2e-ms", self.sla_e2e_ms);
        argv.opt("kv-event-lag-ms", self.kv_event_lag_ms);
        if let Some(path) = &self.telemetry_jsonl_path {
            let path: std::path::PathBuf = path.extract()?;
            argv.path("telemetry-jsonl", &path);
        }
        if self.capture_telemetry || self.telemetry_callback.is_some() || self.telemetry_jsonl_path.is_some()
        {
            argv.flag("telemetry-interval-ms", self.telemetry_sample_interval_ms);
        }
        Ok(())
    }

    /// Where telemetry samples go besides the JSONL file: kept, and/or handed to a callable.
    pub fn sampler(&self) -> Option<crate::Sampler> {
        (self.capture_telemetry || self.telemetry_callback.is_some()).then(|| crate::Sampler {
            capture: self.capture_telemetry,
            callback: self.telemetry_callback.as_ref().map(|c| c.clone().unbind()),
            interval_ms: self.telemetry_sample_interval_ms,
        })
    }
}

/// Refuses, by name, the trace keywords that ask for what mocker does not do yet.
pub fn refuse_trace_unsupported(
    trace_shared_prefix_ratio: f64,
    trace_num_prefix_groups: usize,
) -> PyResult<()> {
    const PREFIX: &str = "mocker does not share prefixes across applied_compute_agentic sessions";
    if trace_shared_prefix_ratio != 0.0 {
        return Err(unsupported("trace_shared_prefix_ratio", PREFIX));
    }
    if trace_num_prefix_groups != 0 {
        return Err(unsupported("trace_num_prefix_groups", PREFIX));
    }
    Ok(())
}

/// The agentic and Weka trace keywords as their flags (`--agentic-lanes`,
/// `--execution-model`, `--weka-nested-timestamp-basis`), which check them in the
/// reference's order and with its words.
pub fn push_trace_options(
    argv: &mut Argv,
    agentic_lanes: Option<i64>,
    execution_model: Option<&str>,
    weka_nested_timestamp_basis: Option<&str>,
) {
    argv.opt("agentic-lanes", agentic_lanes);
    argv.opt("execution-model", execution_model);
    argv.opt("weka-nested-timestamp-basis", weka_nested_timestamp_basis);
}
