//! Lists the bundled model configs and operator tables for `include_str!`, so the binary
//! carries them and a user's clone needs nothing beside it.

use std::fmt::Write as _;
use std::path::Path;

fn list(dir: &Path, skip: &[&str]) -> Vec<(String, String)> {
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.extension().is_some_and(|x| x == "json") && !skip.contains(&name.as_str()) {
                println!("cargo:rerun-if-changed={}", p.display());
                found.push((name, p.canonicalize().unwrap().to_string_lossy().into_owned()));
            }
        }
    }
    found.sort();
    found
}

fn main() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let mut out = String::new();
    for (var, dir, skip) in
        [("MODEL_FILES", data.join("models"), vec!["catalogue.json"]), ("OP_FILES", data.join("ops"), vec![])]
    {
        writeln!(out, "/// (file name, contents), sorted by name.").unwrap();
        writeln!(out, "static {var}: &[(&str, &str)] = &[").unwrap();
        for (name, path) in list(&dir, &skip) {
            writeln!(out, "    ({name:?}, include_str!({path:?})),").unwrap();
        }
        out.push_str("];\n");
    }
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("bundled_models.rs");
    std::fs::write(dest, out).unwrap();
}
