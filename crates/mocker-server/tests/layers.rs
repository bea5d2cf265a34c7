//! This crate's module layering (see `tests/rust/layers.rs` at the repository root): the
//! layer groups of `src/lib.rs`, bottom first.

#[path = "../../../tests/rust/layers.rs"]
mod layers;

#[test]
fn modules_import_only_their_own_layer_or_below_and_form_no_circle() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    layers::check(&src, &["types", "state", "serving", "api", "assembly"]);
}

#[test]
fn the_reference_scanner_sees_grouped_and_nested_paths() {
    layers::scanner_sees_grouped_and_nested_paths();
}
