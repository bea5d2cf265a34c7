//! A crate's module layering, as its `lib.rs` doc comment states it: every `crate::` path in
//! a module's code names a module of the same layer or one below, and no two modules depend
//! on each other (directly or in a circle). The layer table is read from `src/lib.rs` (comment
//! lines naming a layer group the `mod` lines below them), so the documentation and the check
//! cannot drift apart. Included by each layered crate's `tests/layers.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name -> layer index (0 = bottom), parsed from the lib.rs comments `// NAME` (one
/// of `names`, bottom first) that group the `mod` lines.
pub fn layers(lib: &str, names: &[&str]) -> BTreeMap<String, usize> {
    let mut layer = None;
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let line = line.trim();
        if let Some(tag) = line.strip_prefix("// ") {
            if let Some(i) = names.iter().position(|n| *n == tag) {
                layer = Some(i);
            }
        } else if let Some(m) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .and_then(|m| m.strip_suffix(';'))
        {
            let l = layer.unwrap_or_else(|| panic!("module {m} is declared outside a layer group"));
            out.insert(m.to_string(), l);
        }
    }
    out
}

/// The crate modules a file's code refers to (comments skipped).
pub fn references(source: &str, modules: &BTreeMap<String, usize>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            // `use crate::{a::X, b::Y}` names several modules.
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                group.split(',').map(|p| p.trim().split("::").next().unwrap_or("")).collect()
            } else {
                vec![rest.split("::").next().unwrap_or("")]
            };
            for n in names {
                let n = n.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_'));
                if modules.contains_key(n) {
                    out.insert(n.to_string());
                }
            }
        }
    }
    out
}

/// A module's code: its file, or every file under its directory.
fn module_source(src: &Path, module: &str) -> String {
    let file = src.join(format!("{module}.rs"));
    if file.exists() {
        return std::fs::read_to_string(file).unwrap();
    }
    let mut out = String::new();
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("module {module}: {e}")) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&std::fs::read_to_string(path).unwrap());
                out.push('\n');
            }
        }
    }
    out
}

/// Checks the crate whose sources are in `src`, with layer groups `names` (bottom first).
pub fn check(src: &Path, names: &[&str]) {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules = layers(&lib, names);
    assert!(modules.len() >= 10, "lib.rs groups its modules by layer: {modules:?}");
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, &layer) in &modules {
        let source = module_source(src, m);
        let mut refs = references(&source, &modules);
        refs.remove(m);
        for r in &refs {
            assert!(
                modules[r] <= layer,
                "{m} (layer {layer}) imports {r} (layer {}), a higher layer",
                modules[r]
            );
        }
        deps.insert(m.clone(), refs);
    }
    // No circle: repeatedly remove modules whose dependencies are all removed.
    let mut left = deps.clone();
    while !left.is_empty() {
        let free: Vec<String> = left
            .iter()
            .filter(|(_, d)| d.iter().all(|x| !left.contains_key(x)))
            .map(|(m, _)| m.clone())
            .collect();
        assert!(!free.is_empty(), "these modules import each other in a circle: {:?}", left);
        for m in free {
            left.remove(&m);
        }
    }
}

/// The scanner on a sample: grouped and nested paths count, comments do not.
pub fn scanner_sees_grouped_and_nested_paths() {
    let modules: BTreeMap<String, usize> =
        [("a", 0), ("b", 0), ("c", 1)].map(|(m, l)| (m.to_string(), l)).into();
    let refs =
        references("use crate::{a::X, b::Y};\nlet x = crate::c::f(); // crate::b is a comment", &modules);
    assert_eq!(refs, ["a", "b", "c"].map(String::from).into());
}
