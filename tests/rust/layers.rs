//! A module tree's layering, as its root file's doc comment states it: every path in a
//! module's code that names a module of the tree names one of the same layer or one below,
//! and no two modules depend on each other (directly or in a circle). The layer table is
//! read from the root file (`src/lib.rs` for a crate, `mod.rs` for a module directory):
//! comment lines naming a layer group the `mod` lines below them, so the documentation and
//! the check cannot drift apart. Included by each layered crate's `tests/layers.rs`.
//!
//! Unit tests (the `#[cfg(test)] mod tests` that ends a file) are not a module's code: they
//! may drive it through a higher layer, as a trace format's tests parse through the loader.

// Each includer checks either a crate or a module directory, leaving the other entry unused.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The name that stands for a module directory's own `mod.rs` code (a keyword, so no
/// module has it).
const ROOT: &str = "mod";

/// Module name -> layer index (0 = bottom), parsed from the root file's comments `// NAME`
/// (one of `names`, bottom first) that group the `mod` lines.
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

/// The modules a file's code refers to by paths starting with `prefix` (`crate::`, or
/// `crate::trace::` for a module directory), comments skipped. A path to an item that is
/// no module refers to the root's own code, when `modules` holds it.
pub fn references(source: &str, prefix: &str, modules: &BTreeMap<String, usize>) -> BTreeSet<String> {
    let code: Vec<&str> = source.lines().map(|line| line.split("//").next().unwrap_or("")).collect();
    let code = code.join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        // `use crate::{a::X, b::Y}` names several modules, possibly over several lines.
        let names = match rest.strip_prefix('{') {
            Some(group) => group_items(group).into_iter().map(|item| ident(item.trim_start())).collect(),
            None => vec![ident(rest)],
        };
        for n in names {
            if modules.contains_key(n) {
                out.insert(n.to_string());
            } else if modules.contains_key(ROOT) && !n.is_empty() && n != "self" {
                out.insert(ROOT.to_string());
            }
        }
    }
    out
}

/// The identifier `s` starts with.
fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The top-level items of a `{...}` group, given the text after its `{`.
fn group_items(group: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
}

/// A file's code: its text up to its unit-test module, which by the repository's
/// convention ends the file.
pub fn code(text: &str) -> &str {
    let Some(i) = text.find("\n#[cfg(test)]\nmod tests {\n") else {
        return text;
    };
    // Everything in the module is indented, so the first unindented `}` closes it.
    let tests = &text[i + 1..];
    let close = tests.find("\n}\n").map_or(tests.len(), |j| j + 3);
    assert!(tests[close..].trim().is_empty(), "code follows the unit-test module:\n{}", &tests[close..]);
    &text[..i + 1]
}

/// A module's code: its file, or every file under its directory; `ROOT` is `root`'s own.
fn module_source(src: &Path, module: &str, root: &str) -> String {
    let file = src.join(if module == ROOT { root.to_string() } else { format!("{module}.rs") });
    if file.exists() {
        return code(&std::fs::read_to_string(file).unwrap()).to_string();
    }
    let mut out = String::new();
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("module {module}: {e}")) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(code(&std::fs::read_to_string(path).unwrap()));
                out.push('\n');
            }
        }
    }
    out
}

/// Checks the crate whose sources are in `src`, with layer groups `names` (bottom first).
pub fn check(src: &Path, names: &[&str]) {
    check_tree(src, "lib.rs", "crate::", names, false);
}

/// Checks the module directory `dir` whose path is `path` (`crate::trace`), with layer
/// groups `names` (bottom first) in its `mod.rs`; that file's own code (the shared items
/// its modules build on) is part of the bottom layer.
pub fn check_module(dir: &Path, path: &str, names: &[&str]) {
    check_tree(dir, "mod.rs", &format!("{path}::"), names, true);
}

/// The layering of the modules declared in `src/root`, named by paths starting with
/// `prefix`; `root_code` is whether the root's own code joins the bottom layer (a crate's
/// lib.rs only re-exports, from every layer).
fn check_tree(src: &Path, root: &str, prefix: &str, names: &[&str], root_code: bool) {
    let table = std::fs::read_to_string(src.join(root)).unwrap();
    let mut modules = layers(&table, names);
    assert!(modules.len() >= 10, "{root} groups its modules by layer: {modules:?}");
    if root_code {
        modules.insert(ROOT.to_string(), 0);
    }
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, &layer) in &modules {
        let source = module_source(src, m, root);
        let mut refs = references(&source, prefix, &modules);
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

/// The scanner on samples: grouped (over lines too) and nested paths count, comments and
/// unit tests do not, and in a module directory a path to another item names the root.
pub fn scanner_sees_grouped_and_nested_paths() {
    let modules: BTreeMap<String, usize> =
        [("a", 0), ("b", 0), ("c", 1), ("d", 1)].map(|(m, l)| (m.to_string(), l)).into();
    let source = "use crate::{a::X, b::Y};\nlet x = crate::c::f(); // crate::d is a comment\n\
                  #[cfg(test)]\nmod tests {\n    use crate::d::Z;\n}\n";
    let refs = references(code(source), "crate::", &modules);
    assert_eq!(refs, ["a", "b", "c"].map(String::from).into());
    let mut modules = modules;
    modules.insert(ROOT.to_string(), 0);
    let refs =
        references("use crate::m::{\n    a::{X, Y},\n    Z,\n};\nuse crate::m::b;", "crate::m::", &modules);
    assert_eq!(refs, ["a", "b", ROOT].map(String::from).into());
}
