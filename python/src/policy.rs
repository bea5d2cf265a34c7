//! A Python scaling policy as the replay driver calls it: `initial_tick_ms()` once, then
//! `on_tick(snapshot)` per tick, read exactly as the reference reads them (the result
//! indexed by its three keys, targets as unsigned ints, times as floats). A Python error
//! is kept aside and re-raised unchanged once the replay has stopped.

use mocker_replay::scaling::{ClusterSnapshot, PolicyError, ScalingDecision, ScalingPolicy};
use pyo3::prelude::*;

/// A Python object with `initial_tick_ms` and `on_tick`.
pub struct PyPolicy {
    policy: Py<PyAny>,
    /// The first Python error the policy raised (the replay stops at it).
    pub error: Option<PyErr>,
}

impl PyPolicy {
    /// Wraps `policy`.
    pub fn new(policy: Py<PyAny>) -> Self {
        Self { policy, error: None }
    }

    /// Runs `f` holding the interpreter; a Python error stops the replay and is kept.
    fn call<T>(
        &mut self,
        f: impl FnOnce(Python<'_>, &Bound<'_, PyAny>) -> PyResult<T>,
    ) -> Result<T, PolicyError> {
        Python::attach(|py| match f(py, self.policy.bind(py)) {
            Ok(v) => Ok(v),
            Err(e) => {
                let message = e.to_string();
                self.error = Some(e);
                Err(PolicyError(message))
            }
        })
    }
}

/// `value` as the reference reads an optional target: None, or a non-negative int.
fn target(value: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if value.is_none() {
        return Ok(None);
    }
    Ok(Some(value.extract::<u64>()? as usize))
}

impl ScalingPolicy for PyPolicy {
    fn initial_tick_ms(&mut self) -> Result<f64, PolicyError> {
        self.call(|_, p| p.call_method0("initial_tick_ms")?.extract::<f64>())
    }

    fn on_tick(&mut self, snapshot: &ClusterSnapshot) -> Result<ScalingDecision, PolicyError> {
        let text = serde_json::to_string(snapshot).expect("a snapshot serializes to JSON");
        self.call(|py, p| {
            let snapshot = py.import("json")?.call_method1("loads", (text,))?;
            let result = p.call_method1("on_tick", (snapshot,))?;
            let target_prefill = target(&result.get_item("target_prefill")?)?;
            let target_decode = target(&result.get_item("target_decode")?)?;
            let next = result.get_item("next_tick_ms")?;
            let next_tick_ms = if next.is_none() { None } else { Some(next.extract::<f64>()?) };
            Ok(ScalingDecision { target_prefill, target_decode, next_tick_ms })
        })
    }
}

/// A Python callable receiving each telemetry sample as a dict.
pub struct PyCallback {
    callback: Py<PyAny>,
    /// The first Python error it raised (the replay stops at it).
    pub error: Option<PyErr>,
}

impl PyCallback {
    /// Wraps `callback`.
    pub fn new(callback: Py<PyAny>) -> Self {
        Self { callback, error: None }
    }

    /// Calls it with the sample whose JSON text is `sample`.
    pub fn call(&mut self, sample: &str) -> Result<(), PolicyError> {
        Python::attach(|py| {
            let result = py
                .import("json")
                .and_then(|json| json.call_method1("loads", (sample,)))
                .and_then(|dict| self.callback.bind(py).call1((dict,)));
            result.map(|_| ()).map_err(|e| {
                let message = e.to_string();
                self.error = Some(e);
                PolicyError(message)
            })
        })
    }
}
