//! Measured timing profiles for mocker's core: the file formats and the I/O the pure core
//! leaves to its shells.
//!
//! A profile names a file or directory; [`load`] reads it, and [`resolve_launch`] makes the
//! engines of a launch configuration timed by the profile it names (`timing_model:
//! {"type": "external", "provider": "dynamo_profile", "config": {"path": ...}}`) and sizes
//! their KV cache from the profile's memory facts where the configuration asks for that.
//!
//! Accepted forms:
//! - a table file (`.npz`): Dynamo's converted lookup table (`prefill_isl`,
//!   `prefill_ttft_ms`, `decode_active_kv_tokens`, `decode_context_length`, `decode_itl`),
//!   optionally with mocker's extensions (prefill by cached prefix, measured mixed passes,
//!   `meta_json`) written by `scripts/aic_profile.py`; see `docs/profiles.md`;
//! - a planner profiler results directory (`selected_prefill_interpolation/raw_data.npz` and
//!   `selected_decode_interpolation/raw_data.npz`, or `prefill_raw_data.json` and
//!   `decode_raw_data.json`), converted as in [`planner`];
//! - a profile bundled into the binary, by name ([`bundled`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mocker_core::config::{LaunchConfig, TimingModelConfig};
use mocker_core::timing::ProfileTable;
use serde_json::{json, Value};

mod bundled;
mod capacity;
mod meta;
mod npz;
pub mod planner;
mod table;

pub use bundled::{bundled, bundled_names};
pub use capacity::memory_fraction;
pub use meta::ProfileMeta;
pub use table::{read_meta, read_table, write_table};

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

/// A profile as read: the timing table, and what a generated profile says about the
/// hardware (absent in Dynamo's tables).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Pass timing.
    pub table: ProfileTable,
    /// Model and GPU facts, for sizing the KV cache.
    pub meta: Option<ProfileMeta>,
}

/// Reads a profile: a table file (`.npz`) or a profiler results directory.
pub fn load(path: &Path) -> Result<Profile, LoadError> {
    if path.is_dir() {
        if planner::is_results_dir(path) {
            let table = planner::convert_results_dir(path, planner::DEFAULT_RESOLUTION)?;
            return Ok(Profile { table, meta: None });
        }
        return Err(LoadError::file(
            path,
            "is a directory without profiler results: expected selected_prefill_interpolation/raw_data.npz \
             and selected_decode_interpolation/raw_data.npz, or prefill_raw_data.json and decode_raw_data.json",
        ));
    }
    read_table(path)
}

/// The engine-args `timing_model` that times passes by the profile at `path` (read later
/// by [`resolve_launch`]).
pub fn timing_model_for(path: &Path) -> TimingModelConfig {
    TimingModelConfig::External {
        provider: "dynamo_profile".into(),
        config: json!({ "path": path.to_string_lossy() }),
        profile: None,
    }
}

/// Why a launch configuration and its profile do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    /// The profile could not be read.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A launch key conflicts with the profile or needs one (named by `key`).
    #[error("{key}: {reason}")]
    Key {
        /// The engine-args key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// Makes a launch configuration's engine timed by `profile` (already read, named `label`)
/// and sizes its KV cache from the profile's memory facts.
pub fn use_profile(launch: &mut LaunchConfig, label: &str, profile: Profile) -> Result<(), ResolveError> {
    launch.engine.timing_model = TimingModelConfig::External {
        provider: "dynamo_profile".into(),
        config: json!({ "path": label }),
        profile: Some(Arc::new(profile.table)),
    };
    capacity::apply(launch, profile.meta.as_ref())
}

/// Sizes the launch's KV cache from memory facts that did not come from a profile file
/// (a model's architecture on a catalogue GPU), by the same rules and keys as a profile's.
pub fn size_from_memory(launch: &mut LaunchConfig, meta: &ProfileMeta) -> Result<(), ResolveError> {
    capacity::apply(launch, Some(meta))
}

/// Reads the profile the launch configuration's engine names (if any) into it, and sizes
/// the KV cache from the profile where the configuration leaves that to memory; memory
/// keys without a profile that can size anything are refused.
pub fn resolve_launch(launch: &mut LaunchConfig) -> Result<(), ResolveError> {
    let path = match &launch.engine.timing_model {
        TimingModelConfig::External { provider, config, profile: None } if provider == "dynamo_profile" => {
            match config.get("path") {
                Some(Value::String(p)) => Some(PathBuf::from(p)),
                _ => {
                    return Err(
                        LoadError::file(Path::new(""), "engine.timing_model.config.path is not set").into()
                    )
                }
            }
        }
        _ => None,
    };
    match path {
        Some(path) => {
            let profile = load(&path)?;
            use_profile(launch, &path.to_string_lossy(), profile)
        }
        None => capacity::apply(launch, None),
    }
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
        npz::write(path, arrays, &[]).unwrap();
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
                    ("decode_itl", &grid, Some(vec![2, 2])),
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
                    ("decode_itl", &grid, Some(vec![2, 2])),
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
                    ("decode_itl", &grid, Some(vec![2, 2])),
                ],
                "prefill_isl",
                "strictly increasing",
            ),
            (
                vec![
                    ("prefill_isl", &axis, None),
                    ("prefill_ttft_ms", &axis, None),
                    ("decode_active_kv_tokens", &axis[..2], None),
                    ("decode_itl", &grid, Some(vec![2, 2])),
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
    fn resolving_a_launch_config_loads_its_table_once() {
        let mut launch = LaunchConfig::default();
        launch.engine.timing_model = timing_model_for(&h200());
        resolve_launch(&mut launch).unwrap();
        let TimingModelConfig::External { profile: Some(table), .. } = &launch.engine.timing_model else {
            panic!("profile not loaded");
        };
        assert_eq!(table.arrays().decode_itl_shape, (100, 100));
        let mut missing = LaunchConfig::default();
        missing.engine.timing_model = timing_model_for(Path::new("/no/such.npz"));
        assert!(resolve_launch(&mut missing).unwrap_err().to_string().contains("/no/such.npz"));
    }
}
