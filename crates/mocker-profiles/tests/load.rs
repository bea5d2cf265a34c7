//! Reading profiles: the shipped H200 table, the raw profiler directory in both layouts, and
//! the errors for files that are not profiles.

use std::path::{Path, PathBuf};

use mocker_core::timing::{DecodeShape, PrefillShape, ProfileTable, TimingModel};
use mocker_profiles::{load, read_table, write_table, LoadError};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn h200() -> PathBuf {
    repo().join("profiles/dynamo/h200-llama3.1-8b-fp8-tp1")
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mocker-profiles-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn prefill(t: &ProfileTable, batch: usize, isl: usize, prefix: usize) -> f64 {
    t.prefill_ms(PrefillShape { batch, mean_isl: isl, mean_prefix: prefix })
}

fn decode(t: &ProfileTable, batch: usize, kv: usize) -> f64 {
    t.decode_ms(DecodeShape { batch, active_kv_tokens: kv, total_kv_tokens: 1 << 20 })
}

#[test]
fn the_h200_table_reads_and_predicts_between_its_points() {
    let t = load(&h200().join("perf_data.npz")).unwrap().table;
    let a = t.arrays();
    assert_eq!((a.prefill_isl.len(), a.decode_itl_shape), (17, (24, 6)));
    // On a profiled point the table gives the measurement itself.
    let (x, y) = (a.prefill_isl[3], a.prefill_ttft_ms[3]);
    assert_eq!(prefill(&t, 1, x as usize, 0), y);
    // Between points, between their values.
    let mid = prefill(&t, 1, ((a.prefill_isl[3] + a.prefill_isl[4]) / 2.0) as usize, 0);
    assert!(mid > y.min(a.prefill_ttft_ms[4]) && mid < y.max(a.prefill_ttft_ms[4]));
    assert!(decode(&t, 64, 64 * 3000) >= 1.0);
}

#[test]
fn the_raw_directory_converts_as_the_reference_launcher_does() {
    // The reference (ai-dynamo 1.6.1's converter) run on the same directory.
    let reference =
        read_table(&repo().join("crates/mocker-profiles/tests/data/h200_reference_converted.npz"))
            .unwrap()
            .table;
    let ours = load(&h200()).unwrap().table;
    let (r, o) = (reference.arrays(), ours.arrays());
    assert_eq!(o.decode_itl_shape, (100, 100));
    let close = |x: &[f64], y: &[f64], what: &str| {
        assert_eq!(x.len(), y.len(), "{what}");
        for (i, (p, q)) in x.iter().zip(y).enumerate() {
            assert!((p - q).abs() <= 1e-9 * q.abs().max(1.0), "{what}[{i}]: ours {p}, reference {q}");
        }
    };
    close(&o.prefill_isl, &r.prefill_isl, "prefill_isl");
    close(&o.prefill_ttft_ms, &r.prefill_ttft_ms, "prefill_ttft_ms");
    close(&o.decode_active_kv_tokens, &r.decode_active_kv_tokens, "decode_active_kv_tokens");
    close(&o.decode_context_length, &r.decode_context_length, "decode_context_length");
    close(&o.decode_itl, &r.decode_itl, "decode_itl");
    // Pass times agree with the reference-converted table well inside 2% across shapes.
    for (batch, isl) in [(1, 100), (1, 3000), (4, 2500), (16, 1000), (1, 20000)] {
        let (p, q) = (prefill(&ours, batch, isl, 0), prefill(&reference, batch, isl, 0));
        assert!((p - q).abs() <= 0.02 * q, "prefill {batch}x{isl}: {p} vs {q}");
    }
    for (batch, kv) in [(1, 1000), (64, 64 * 3300), (128, 128 * 1200), (256, 256 * 3000)] {
        let (p, q) = (decode(&ours, batch, kv), decode(&reference, batch, kv));
        assert!((p - q).abs() <= 0.02 * q, "decode {batch}/{kv}: {p} vs {q}");
    }
}

#[test]
fn a_written_table_reads_back_identically() {
    let dir = scratch("roundtrip");
    let t = load(&h200()).unwrap();
    let file = dir.join("perf_data.npz");
    write_table(&file, &t).unwrap();
    let back = read_table(&file).unwrap();
    assert_eq!(back, t);
    let (back, t) = (back.table, t.table);
    for (b, isl) in [(1, 777), (8, 4096)] {
        assert_eq!(prefill(&back, b, isl, 0), prefill(&t, b, isl, 0));
    }
}

fn expect_err(path: &Path) -> LoadError {
    let e = load(path).expect_err("must not load");
    assert_eq!(e.path, path);
    e
}

#[test]
fn files_that_are_not_profiles_are_refused_naming_path_and_array() {
    let dir = scratch("errors");
    let e = expect_err(&dir.join("nope.npz"));
    assert!(e.to_string().contains("cannot open"), "{e}");

    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(expect_err(&empty).reason.contains("selected_prefill_interpolation"));

    let text = dir.join("text.npz");
    std::fs::write(&text, "not a zip").unwrap();
    assert!(expect_err(&text).reason.contains(".npz archive"));

    // Raw directory with a decode file missing an array.
    let raw = dir.join("raw");
    std::fs::create_dir(&raw).unwrap();
    std::fs::write(
        raw.join("prefill_raw_data.json"),
        r#"{"prefill_isl": [100, 1000], "prefill_ttft": [10, 50]}"#,
    )
    .unwrap();
    std::fs::write(raw.join("decode_raw_data.json"), r#"{"x_kv_usage": [0.1], "y_context_length": [100]}"#)
        .unwrap();
    let e = load(&raw).unwrap_err();
    assert_eq!(e.array.as_deref(), Some("z_itl"), "{e}");
    assert!(e.path.ends_with("decode_raw_data.json"));

    // Measurements that fall with more tokens cannot be fitted.
    std::fs::write(
        raw.join("prefill_raw_data.json"),
        r#"{"prefill_isl": [100, 1000], "prefill_ttft": [50, 10]}"#,
    )
    .unwrap();
    std::fs::write(
        raw.join("decode_raw_data.json"),
        r#"{"x_kv_usage": [0.1, 0.2], "y_context_length": [100, 100], "z_itl": [5, 6], "max_kv_tokens": 10000}"#,
    )
    .unwrap();
    let e = load(&raw).unwrap_err();
    assert_eq!(e.array.as_deref(), Some("prefill_ttft"), "{e}");
}

#[test]
fn a_generated_profile_round_trips_with_its_extensions_and_memory_facts() {
    let file = repo().join("profiles/aic/b300-qwen3-32b-vllm-tp1.npz");
    let p = load(&file).unwrap();
    assert_eq!(p.table.has_extensions(), (true, true));
    let meta = p.meta.as_ref().expect("meta_json");
    assert_eq!((meta.model.as_str(), meta.system.as_str(), meta.tp), ("Qwen/Qwen3-32B", "b300_sxm", 1));
    let dir = scratch("generated");
    let copy = dir.join("copy.npz");
    write_table(&copy, &p).unwrap();
    let back = read_table(&copy).unwrap();
    assert_eq!(back, p);
    let d = DecodeShape { batch: 32, active_kv_tokens: 32 * 3000, total_kv_tokens: 1 << 24 };
    for (batch, isl, prefix) in [(1, 512, 0), (2, 3000, 1000), (1, 9000, 0)] {
        let s = PrefillShape { batch, mean_isl: isl, mean_prefix: prefix };
        assert_eq!(back.table.prefill_ms(s), p.table.prefill_ms(s));
        assert_eq!(back.table.mixed_ms(s, d), p.table.mixed_ms(s, d));
    }
    // A measured mixed pass costs less than its prefill and decode priced apart.
    let s = PrefillShape { batch: 1, mean_isl: 2048, mean_prefix: 0 };
    let (pre, dec) = p.table.mixed_ms(s, d);
    assert!(pre + dec < p.table.prefill_ms(s) + p.table.decode_ms(d), "{pre} + {dec}");
    assert_eq!(dec, p.table.decode_ms(d));
}
