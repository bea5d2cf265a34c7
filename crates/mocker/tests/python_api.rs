//! The Python module `mocker` (python/) through its pytest suites:
//! tests/python/test_python_api.py (the reference's two calls and `mocker.replay` against
//! this binary's JSON report for the same workload, per-request records, refusals by name,
//! the CLI's messages for bad values, the interpreter left free during a replay, and, when
//! Dynamo's reference is importable (`MOCKER_DYNAMO_PYTHON`, or MOCKER_PYTHON itself), the
//! reference's numbers), tests/python/test_scaling_policy.py and tests/python/test_sweep.py
//! (`mocker.sweep` against `mocker sweep`'s rows, and a sweep over a local Ray instance
//! against the local sweep). The module is the one installed in MOCKER_PYTHON's environment:
//! .ci/run builds it from this tree (`pip install ./python`) after building the tests, and
//! installs Ray and pandas.

mod common;

use std::process::Command;

#[test]
fn python_api_matches_the_cli_and_the_reference() {
    pytest("test_python_api.py", "mocker, pytest");
}

/// tests/python/test_scaling_policy.py: a scaling policy in the loop, against the reference.
#[test]
fn scaling_policies_act_as_in_the_reference() {
    pytest("test_scaling_policy.py", "mocker, pytest");
}

/// tests/python/test_sweep.py: `mocker.sweep` locally and as Ray tasks, against the CLI.
#[test]
fn python_sweep_matches_the_cli_locally_and_over_ray() {
    pytest("test_sweep.py", "mocker, pytest, ray, pandas");
}

/// Runs one pytest file of tests/python with the module installed in MOCKER_PYTHON, after
/// checking that interpreter imports `modules`.
fn pytest(file: &str, modules: &str) {
    let python = common::python();
    let probe =
        Command::new(&python).args(["-c", &format!("import {modules}")]).output().expect("python runs");
    assert!(
        probe.status.success(),
        "{python} cannot import {modules}: run .ci/run, or `pip install ./python` and pytest (and, for the \
         sweep, ray and pandas: tests/python/requirements.txt) into its environment\n{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let out = Command::new(&python)
        // No cache or bytecode files left in the source tree.
        .args(["-B", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
        .arg(common::repo_root().join("tests/python").join(file))
        .env("MOCKER_BIN", env!("CARGO_BIN_EXE_mocker"))
        .output()
        .expect("pytest runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pytest failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // The summary line (e.g. `43 passed in 2.0s`), and skips with their reasons, for the log.
    eprintln!(
        "{}",
        stdout.lines().filter(|l| l.contains("passed") || l.contains("SKIP")).collect::<Vec<_>>().join("\n")
    );
}
