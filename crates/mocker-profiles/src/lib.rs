//! Measured timing profiles for mocker's core: the file formats and the I/O the pure core
//! leaves to its shells.
//!
//! A profile names a file or directory; [`load`] reads it into the core's
//! [`ProfileTable`], and [`resolve_launch`] does that for every engine configuration that
//! asks for `timing_model: {"type": "external", "provider": "dynamo_profile", ...}`, so the
//! engines built from it are timed by the table.
//!
//! Accepted forms, as the reference accepts them:
//! - the converted lookup table, `perf_data.npz` (`prefill_isl`, `prefill_ttft_ms`,
//!   `decode_active_kv_tokens`, `decode_context_length`, `decode_itl`);
//! - a planner profiler results directory (`selected_prefill_interpolation/raw_data.npz` and
//!   `selected_decode_interpolation/raw_data.npz`, or `prefill_raw_data.json` and
//!   `decode_raw_data.json`), converted as in [`planner`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mocker_core::config::{EngineConfig, LaunchConfig, TimingModelConfig};
use mocker_core::timing::{ProfileArrays, ProfileTable};
use serde_json::{json, Value};

mod npz;
pub mod planner;

/// Why a profile could not be read; names the file and, where it applies, the array.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct LoadError {
    /// The file or directory.
    pub path: PathBuf,
    /// The array within it, if the problem is one array.
    pub array: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl LoadError {
    pub(crate) fn file(path: &Path, reason: impl Into<String>) -> Self {
        Self { path: path.to_path_buf(), array: None, reason: reason.into() }
    }

    pub(crate) fn array(path: &Path, array: &str, reason: String) -> Self {
        Self { path: path.to_path_buf(), array: Some(array.to_string()), reason }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.array {
            Some(a) => write!(f, "timing profile {}: array {a}: {}", self.path.display(), self.reason),
            None => write!(f, "timing profile {}: {}", self.path.display(), self.reason),
        }
    }
}

/// The arrays of the converted table, in file order.
const TABLE_ARRAYS: [&str; 5] =
    ["prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl"];

/// Reads a profile: a converted `.npz` table or a profiler results directory.
pub fn load(path: &Path) -> Result<ProfileTable, LoadError> {
    if path.is_dir() {
        if planner::is_results_dir(path) {
            return planner::convert_results_dir(path, planner::DEFAULT_RESOLUTION);
        }
        return Err(LoadError::file(
            path,
            "is a directory without profiler results: expected selected_prefill_interpolation/raw_data.npz \
             and selected_decode_interpolation/raw_data.npz, or prefill_raw_data.json and decode_raw_data.json",
        ));
    }
    read_table(path)
}

/// Reads a converted lookup table (`perf_data.npz`).
pub fn read_table(path: &Path) -> Result<ProfileTable, LoadError> {
    let mut npz = npz::Npz::open(path)?;
    if let Some(missing) = TABLE_ARRAYS.iter().find(|n| !npz.has(n)) {
        return Err(LoadError::array(
            path,
            missing,
            format!("missing: a profile table has {}", TABLE_ARRAYS.join(", ")),
        ));
    }
    let mut vector = |name: &'static str| -> Result<Vec<f64>, LoadError> {
        let a = npz.array(name)?;
        if a.shape.len() != 1 {
            return Err(LoadError::array(path, name, format!("must be 1-D, has shape {:?}", a.shape)));
        }
        Ok(a.values)
    };
    let prefill_isl = vector("prefill_isl")?;
    let prefill_ttft_ms = vector("prefill_ttft_ms")?;
    let decode_active_kv_tokens = vector("decode_active_kv_tokens")?;
    let decode_context_length = vector("decode_context_length")?;
    let itl = npz.array("decode_itl")?;
    let &[rows, cols] = itl.shape.as_slice() else {
        return Err(LoadError::array(path, "decode_itl", format!("must be 2-D, has shape {:?}", itl.shape)));
    };
    ProfileTable::new(ProfileArrays {
        prefill_isl,
        prefill_ttft_ms,
        decode_active_kv_tokens,
        decode_context_length,
        decode_itl: itl.values,
        decode_itl_shape: (rows, cols),
    })
    .map_err(|e| {
        let array = match &e {
            mocker_core::timing::ProfileError::PrefillLength { .. } => "prefill_ttft_ms",
            mocker_core::timing::ProfileError::DecodeShape { .. } => "decode_itl",
            mocker_core::timing::ProfileError::Axis { array, .. }
            | mocker_core::timing::ProfileError::NotFinite { array, .. } => array,
        };
        LoadError::array(path, array, e.to_string())
    })
}

/// Writes `table` as a converted lookup table that [`read_table`] (and the reference) reads.
pub fn write_table(path: &Path, table: &ProfileTable) -> Result<(), LoadError> {
    let a = table.arrays();
    npz::write(
        path,
        &[
            ("prefill_isl", &a.prefill_isl, None),
            ("prefill_ttft_ms", &a.prefill_ttft_ms, None),
            ("decode_active_kv_tokens", &a.decode_active_kv_tokens, None),
            ("decode_context_length", &a.decode_context_length, None),
            ("decode_itl", &a.decode_itl, Some(a.decode_itl_shape)),
        ],
    )
}

/// The engine-args `timing_model` that times passes by the profile at `path`.
pub fn timing_model_for(path: &Path) -> TimingModelConfig {
    TimingModelConfig::External {
        provider: "dynamo_profile".into(),
        config: json!({ "path": path.to_string_lossy() }),
        profile: None,
    }
}

/// Reads the profile an engine configuration names, if any, into it.
pub fn resolve_engine(engine: &mut EngineConfig) -> Result<(), LoadError> {
    if let TimingModelConfig::External { provider, config, profile } = &mut engine.timing_model {
        if provider == "dynamo_profile" && profile.is_none() {
            let path = match config.get("path") {
                Some(Value::String(p)) => PathBuf::from(p),
                _ => {
                    return Err(LoadError::file(Path::new(""), "engine.timing_model.config.path is not set"))
                }
            };
            *profile = Some(Arc::new(load(&path)?));
        }
    }
    Ok(())
}

/// [`resolve_engine`] for a launch configuration's engine.
pub fn resolve_launch(launch: &mut LaunchConfig) -> Result<(), LoadError> {
    resolve_engine(&mut launch.engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mocker-profiles-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn h200() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles/dynamo/h200-llama3.1-8b-fp8-tp1")
    }

    #[test]
    fn the_json_layout_converts_like_the_npz_layout() {
        let dir = scratch("json");
        let read = |rel: &str, names: &[&'static str]| {
            let path = h200().join(rel);
            let mut npz = npz::Npz::open(&path).unwrap();
            let map: serde_json::Map<String, Value> =
                names.iter().map(|&n| (n.to_string(), json!(npz.array(n).unwrap().values))).collect();
            Value::Object(map)
        };
        let prefill = read("selected_prefill_interpolation/raw_data.npz", &["prefill_isl", "prefill_ttft"]);
        let mut decode = read(
            "selected_decode_interpolation/raw_data.npz",
            &["x_kv_usage", "y_context_length", "z_itl", "max_kv_tokens"],
        );
        // The JSON layout stores max_kv_tokens as a plain number.
        decode["max_kv_tokens"] = decode["max_kv_tokens"][0].clone();
        std::fs::write(dir.join("prefill_raw_data.json"), prefill.to_string()).unwrap();
        std::fs::write(dir.join("decode_raw_data.json"), decode.to_string()).unwrap();
        assert_eq!(load(&dir).unwrap(), load(&h200()).unwrap());
    }

    /// Writes a table file with arbitrary (possibly inconsistent) arrays.
    fn write_raw(path: &Path, arrays: &[npz::Named<'_>]) {
        npz::write(path, arrays).unwrap();
    }

    #[test]
    fn malformed_tables_are_refused_naming_the_array() {
        let dir = scratch("malformed");
        let f = dir.join("t.npz");
        let axis = [0.0, 1000.0, 2000.0];
        let grid = [1.0, 2.0, 3.0, 4.0];
        let cases: Vec<(Vec<npz::Named<'_>>, &str, &str)> = vec![
            (
                vec![
                    ("prefill_isl", &axis, None),
                    ("prefill_ttft_ms", &axis[..2], None),
                    ("decode_active_kv_tokens", &axis[..2], None),
                    ("decode_context_length", &axis[..2], None),
                    ("decode_itl", &grid, Some((2, 2))),
                ],
                "prefill_ttft_ms",
                "Prefill array length mismatch: isl=3, ttft=2",
            ),
            (
                vec![
                    ("prefill_isl", &axis, None),
                    ("prefill_ttft_ms", &axis, None),
                    ("decode_active_kv_tokens", &axis, None),
                    ("decode_context_length", &axis[..2], None),
                    ("decode_itl", &grid, Some((2, 2))),
                ],
                "decode_itl",
                "Decode array dimension mismatch",
            ),
            (
                vec![
                    ("prefill_isl", &[0.0, 5.0, 5.0], None),
                    ("prefill_ttft_ms", &axis, None),
                    ("decode_active_kv_tokens", &axis[..2], None),
                    ("decode_context_length", &axis[..2], None),
                    ("decode_itl", &grid, Some((2, 2))),
                ],
                "prefill_isl",
                "strictly increasing",
            ),
            (
                vec![
                    ("prefill_isl", &axis, None),
                    ("prefill_ttft_ms", &axis, None),
                    ("decode_active_kv_tokens", &axis[..2], None),
                    ("decode_itl", &grid, Some((2, 2))),
                ],
                "decode_context_length",
                "missing",
            ),
            (
                vec![
                    ("prefill_isl", &axis, None),
                    ("prefill_ttft_ms", &axis, None),
                    ("decode_active_kv_tokens", &axis[..2], None),
                    ("decode_context_length", &axis[..2], None),
                    ("decode_itl", &grid, None),
                ],
                "decode_itl",
                "must be 2-D",
            ),
        ];
        for (arrays, array, words) in cases {
            write_raw(&f, &arrays);
            let e = load(&f).unwrap_err();
            assert_eq!(e.array.as_deref(), Some(array), "{e}");
            assert!(e.to_string().contains(words), "{e}");
            assert!(e.to_string().contains(&f.display().to_string()), "{e}");
        }
    }

    #[test]
    fn resolving_an_engine_config_loads_its_table_once() {
        let mut engine = EngineConfig { timing_model: timing_model_for(&h200()), ..Default::default() };
        resolve_engine(&mut engine).unwrap();
        let TimingModelConfig::External { profile: Some(table), .. } = &engine.timing_model else {
            panic!("profile not loaded");
        };
        assert_eq!(table.arrays().decode_itl_shape, (100, 100));
        let mut missing =
            EngineConfig { timing_model: timing_model_for(Path::new("/no/such.npz")), ..Default::default() };
        assert!(resolve_engine(&mut missing).unwrap_err().to_string().contains("/no/such.npz"));
    }
}
