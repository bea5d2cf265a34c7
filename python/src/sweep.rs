//! `mocker.sweep`'s native half: its keywords become the `mocker sweep` command line they
//! stand for, parsed and expanded into the grid by the CLI's own code
//! (`mocker_args::sweep`), so a bad axis raises the CLI's message. The points then run
//! here, in parallel on threads as `mocker sweep` runs them (`_SweepPlan.run`), or one per
//! call of `_sweep_point` (a Ray task's body, in another process or on another machine,
//! given the plan's command line). The Python half (`mocker/__init__.py`) only dispatches
//! and assembles the table.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Parser;
use mocker_args::sweep::{Row, Sweep, SweepArgs};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::keywords::Argv;

/// `mocker sweep`'s flags but its output files, parsed from the command line a call stands
/// for.
#[derive(Parser)]
#[command(name = "mocker sweep")]
struct SweepCommand {
    #[command(flatten)]
    args: SweepArgs,
    /// Points run at once on threads (default: all cores), as `mocker sweep --jobs`.
    #[arg(long)]
    jobs: Option<usize>,
}

/// A checked sweep: the command line it was parsed from (what a Ray task is sent) and its
/// points, ready to run.
#[pyclass(module = "mocker", name = "_SweepPlan", frozen)]
pub struct SweepPlan {
    argv: Vec<OsString>,
    sweep: Arc<Sweep>,
}

#[pymethods]
impl SweepPlan {
    /// The `mocker sweep` command line (program name first) the plan was parsed from.
    #[getter]
    fn argv(&self) -> Vec<OsString> {
        self.argv.clone()
    }

    /// The number of points.
    fn __len__(&self) -> usize {
        self.sweep.points.len()
    }

    /// Runs every point on threads (`jobs` at once, default one per core) with the
    /// interpreter detached, as `mocker sweep` does, and returns the rows in grid order.
    fn run(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let sweep = Arc::clone(&self.sweep);
        let rows = py.detach(|| sweep.run()).map_err(crate::value_error)?;
        rows_to_python(py, &rows)
    }
}

/// Rows as Python dicts, keys in the CLI's order.
fn rows_to_python(py: Python<'_>, rows: &[Row]) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(rows).expect("rows serialize to JSON");
    Ok(crate::from_json(py, &text)?.unbind())
}

/// Parses `argv` as `mocker sweep`'s command line and expands its grid (reading the
/// trace, if any), with the interpreter detached.
fn plan(py: Python<'_>, argv: &[OsString]) -> PyResult<Sweep> {
    let mut command =
        SweepCommand::try_parse_from(argv).map_err(|e| PyValueError::new_err(crate::clap_message(&e)))?;
    py.detach(|| command.args.sweep(command.jobs)).map_err(crate::value_error)
}

/// Pushes a grid axis given as a Python value: a list or tuple is the flag's list (`sweep_engine_args`:
/// the flag once per value, mappings as JSON; the others: one comma list), anything else
/// one value as `mocker.replay` passes it.
fn push_axis(py: Python<'_>, argv: &mut Argv, keyword: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let items: Vec<Bound<'_, PyAny>> = if let Ok(list) = value.cast::<PyList>() {
        list.iter().collect()
    } else if let Ok(tuple) = value.cast::<PyTuple>() {
        tuple.iter().collect()
    } else {
        return argv.python_flag(py, keyword, value);
    };
    let text = |v: &Bound<'_, PyAny>| -> PyResult<String> {
        match v.cast::<PyString>() {
            Ok(s) => s.extract(),
            Err(_) if v.is_instance_of::<PyDict>() => {
                py.import("json")?.call_method1("dumps", (v,))?.extract()
            }
            Err(_) => v.str()?.extract(),
        }
    };
    let name = keyword.replace('_', "-");
    if keyword == "sweep_engine_args" {
        for item in &items {
            argv.flag(&name, text(item)?);
        }
    } else {
        let values = items.iter().map(text).collect::<PyResult<Vec<_>>>()?;
        argv.flag(&name, values.join(","));
    }
    Ok(())
}

/// The grid axes: keywords whose list values become the flag's list.
const AXES: [&str; 5] = [
    "sweep_engine_args",
    "sweep_num_workers",
    "sweep_num_prefill_workers",
    "sweep_num_decode_workers",
    "sweep_router",
];

/// Checks a sweep given as `mocker sweep`'s flags (`_` for `-`; the axes also as lists)
/// and a trace file (none: a synthetic workload); returns the plan that runs it. A bad
/// flag or axis raises `ValueError` with the CLI's message.
#[pyfunction]
#[pyo3(signature = (trace, flags))]
pub fn _sweep_plan(py: Python<'_>, trace: Option<PathBuf>, flags: &Bound<'_, PyDict>) -> PyResult<SweepPlan> {
    let mut argv = Argv::new();
    for (name, value) in flags.iter() {
        let name: String = name.extract()?;
        match name.as_str() {
            "output_csv" | "output_json" => {
                return Err(PyValueError::new_err(format!(
                    "{name}: not taken by mocker.sweep, which returns the rows as a table (write it with \
                     DataFrame.to_csv or json.dump)"
                )))
            }
            axis if AXES.contains(&axis) => push_axis(py, &mut argv, axis, &value)?,
            _ => argv.python_flag(py, &name, &value)?,
        }
    }
    if let Some(trace) = &trace {
        argv.trace(trace);
    }
    let mut argv = argv.into_vec();
    argv[0] = "mocker sweep".into();
    let sweep = plan(py, &argv)?;
    Ok(SweepPlan { argv, sweep: Arc::new(sweep) })
}

/// The last plan `_sweep_point` expanded in this process, by its command line: a worker
/// running many points of one sweep reads the trace and checks the grid once.
static LAST_PLAN: Mutex<Option<(Vec<OsString>, Arc<Sweep>)>> = Mutex::new(None);

/// Runs point `index` of the sweep `argv` stands for (a plan's `argv`) and returns its
/// row: a Ray task's body. The grid is expanded as the plan was, so the point is the
/// plan's.
#[pyfunction]
pub fn _sweep_point(py: Python<'_>, argv: Vec<OsString>, index: usize) -> PyResult<Py<PyAny>> {
    let cached = {
        let last = LAST_PLAN.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref().filter(|(a, _)| *a == argv).map(|(_, s)| Arc::clone(s))
    };
    let sweep = match cached {
        Some(sweep) => sweep,
        None => {
            let sweep = Arc::new(plan(py, &argv)?);
            *LAST_PLAN.lock().unwrap_or_else(|e| e.into_inner()) = Some((argv, Arc::clone(&sweep)));
            sweep
        }
    };
    let row = py.detach(|| sweep.run_point(index)).map_err(crate::value_error)?;
    let text = serde_json::to_string(&row).expect("a row serializes to JSON");
    Ok(crate::from_json(py, &text)?.unbind())
}
