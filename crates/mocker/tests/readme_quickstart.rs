//! The README's quick start, run as written: every `sh` block of its "Quick start" section
//! in one bash session (so `mocker serve ... &` and `kill %1` pair up as in a terminal),
//! each `python` block through `$MOCKER_PYTHON` (the venv `.ci/run` installs `openai`
//! into), with the built `mocker` first on `PATH`; then the "Python" section's blocks, in
//! the same directory (they read the quick start's trace). `cargo` lines (the install) are
//! the build this test already ran and `pip` lines the Python module `.ci/run` installed,
//! so they are left out, and port 8000 becomes a free one.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The fenced blocks of the README section headed `heading`: (info string, body).
fn blocks(readme: &str, heading: &str) -> Vec<(String, String)> {
    let start = readme.find(heading).unwrap_or_else(|| panic!("README has no {heading:?} section"));
    let rest = &readme[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
            out.push((info.trim().to_string(), body.join("\n")));
        }
    }
    out
}

/// A port with the next two free as well (the P/D example's workers take port + 1 and + 2).
fn free_port() -> u16 {
    for _ in 0..50 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if port < 65000 && (1..=2).all(|i| std::net::TcpListener::bind(("127.0.0.1", port + i)).is_ok()) {
            return port;
        }
    }
    panic!("no three consecutive free ports");
}

#[test]
fn the_quick_start_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut blocks = blocks(&readme, "## Quick start");
    assert!(blocks.iter().filter(|(info, _)| info == "sh").count() >= 4, "{blocks:?}");
    blocks.extend(self::blocks(&readme, "## Python"));
    let python = std::env::var("MOCKER_PYTHON").ok();
    if python.is_none() {
        eprintln!("MOCKER_PYTHON is unset (.ci/run sets it): the README's python blocks are skipped");
    }
    let port = free_port().to_string();
    // Any background server still running when the script ends (or fails) is stopped.
    let mut script = String::from("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    for (info, body) in &blocks {
        let body = body.replace("8000", &port);
        match info.as_str() {
            "sh" => {
                for line in body.lines().filter(|l| !l.starts_with("cargo ") && !l.starts_with("pip ")) {
                    script.push_str(line);
                    script.push('\n');
                }
            }
            "python" if python.is_some() => {
                script.push_str(&format!("\"$MOCKER_PYTHON\" - <<'PYEOF'\n{body}\nPYEOF\n"));
            }
            "python" => {}
            other => panic!("quick-start block of unknown kind {other:?}"),
        }
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_mocker")).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the quick start did not finish in 300 s:\n{script}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out_reader.join().unwrap(), err_reader.join().unwrap());
    assert!(
        status.success(),
        "quick start failed ({status}):\n{script}\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    for want in [
        "\"object\":\"chat.completion\"",
        "\"object\":\"text_completion\"",
        "model\tarchitecture\t",
        "gpu\tdescription\t",
        "Timing: architecture: Qwen/Qwen3-14B on l40s, TP 2",
    ] {
        assert!(out.contains(want), "{want:?} missing from the quick start's output:\n{out}");
    }
    assert_eq!(out.matches("mocker | LLM Metrics").count(), 4, "four replays print their table:\n{out}");
    if python.is_some() {
        let line =
            out.lines().find(|l| l.starts_with("stop ") || l.starts_with("length ")).unwrap_or_else(|| {
                panic!("the openai SDK example printed no finish reason and token count:\n{out}")
            });
        let tokens: u64 = line.split(' ').nth(1).unwrap().parse().unwrap();
        assert!((1..=4096).contains(&tokens), "{line}");
    }
    assert!(dir.join("report.json").is_file() && dir.join("plots/ttft_cdf.svg").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
