//! Lists the repository's profile files for `include_bytes!`, so the binary carries them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles");
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let aic = root.join("aic");
    println!("cargo:rerun-if-changed={}", aic.display());
    if let Ok(entries) = std::fs::read_dir(&aic) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "npz") {
                let name = p.file_stem().unwrap().to_string_lossy().into_owned();
                println!("cargo:rerun-if-changed={}", p.display());
                found.push((name, p));
            }
        }
    }
    let dynamo = root.join("dynamo/h200-llama3.1-8b-fp8-tp1/perf_data.npz");
    if dynamo.is_file() {
        println!("cargo:rerun-if-changed={}", dynamo.display());
        found.push(("dynamo-h200-llama3.1-8b-fp8-tp1".into(), dynamo));
    }
    found.sort();
    let mut out = String::from("/// (name, file bytes) of every bundled profile, sorted by name.\n");
    out.push_str("static BUNDLED: &[(&str, &[u8])] = &[\n");
    for (name, path) in &found {
        let abs = path.canonicalize().unwrap();
        writeln!(out, "    ({name:?}, include_bytes!({:?})),", abs.to_string_lossy()).unwrap();
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("bundled_profiles.rs");
    std::fs::write(dest, out).unwrap();
}
