//! The trace module's layering (see `tests/rust/layers.rs` at the repository root): the
//! layer groups of `src/trace/mod.rs`, bottom first.

#[path = "../../../tests/rust/layers.rs"]
mod layers;

#[test]
fn trace_files_import_only_their_own_layer_or_below_and_form_no_circle() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/trace");
    layers::check_module(&dir, "crate::trace", &["common", "formats", "entry"]);
}

#[test]
fn the_reference_scanner_sees_grouped_and_nested_paths() {
    layers::scanner_sees_grouped_and_nested_paths();
}
