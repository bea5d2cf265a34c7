//! Shared harness of the CLI tests: run the real binary, give each test a scratch
//! directory, read a replay's JSON report, check usage errors.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The `mocker` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mocker");

/// Runs the binary with `args` and waits for it.
pub fn mocker(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run the mocker binary")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

/// A fresh scratch directory for one test, named after the test file and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{}-{name}-{}",
        env!("CARGO_CRATE_NAME"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `mocker replay <args> --report-json <dir>/<name>.json`, asserts success and
/// returns the parsed report.
pub fn report(dir: &Path, name: &str, args: &[&str]) -> Value {
    let path = dir.join(format!("{name}.json"));
    let mut full = vec!["replay"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["--report-json", path.to_str().unwrap()]);
    let out = mocker(&full);
    assert!(out.status.success(), "{full:?}: {}", stderr(&out));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Asserts a usage error: exit code 2, no panic, and stderr names each of `needles`.
pub fn assert_exit_2(args: &[&str], needles: &[&str]) -> Output {
    let out = mocker(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: status {} stderr {err}", out.status);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr does not name {n:?}: {err}");
    }
    out
}
