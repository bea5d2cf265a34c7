//! The profile table file: Dynamo's `perf_data.npz` arrays, mocker's optional extensions
//! (prefill by cached prefix, whole mixed passes) and the generator's `meta_json`.

use std::path::Path;

use mocker_core::timing::{ProfileArrays, ProfileError, ProfileTable};

use crate::meta::ProfileMeta;
use crate::npz::{self, Npz};
use crate::{LoadError, Profile};

/// The arrays every table has, in file order (the reference reads exactly these).
const TABLE_ARRAYS: [&str; 5] =
    ["prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl"];

/// mocker's prefix extension: given together or not at all.
const PREFIX_ARRAYS: [&str; 2] = ["prefill_prefix_tokens", "prefill_ms"];

/// mocker's mixed-pass extension: given together or not at all.
const MIXED_ARRAYS: [&str; 4] =
    ["mixed_prefill_tokens", "mixed_decode_requests", "mixed_decode_context", "mixed_ms"];

/// Reads a table file from disk.
pub fn read_table(path: &Path) -> Result<Profile, LoadError> {
    read(Npz::open(path)?, path)
}

/// Reads only a table file's `meta_json` (`None` when the file has none): describing a run
/// needs the profile's model and GPU, not its arrays.
pub fn read_meta(path: &Path) -> Result<Option<ProfileMeta>, LoadError> {
    let mut npz = Npz::open(path)?;
    if !npz.has("meta_json") {
        return Ok(None);
    }
    let bytes: Vec<u8> = take(&mut npz, path, "meta_json", None)?.into_iter().map(|b| b as u8).collect();
    ProfileMeta::parse(&bytes).map(Some).map_err(|reason| LoadError::array(path, "meta_json", reason))
}

/// Reads a table file held in memory; `label` names it in errors.
pub(crate) fn read_table_bytes(label: &Path, bytes: &[u8]) -> Result<Profile, LoadError> {
    read(Npz::from_bytes(label, bytes.to_vec())?, label)
}

/// Array `name`, which must have `dims` dimensions (and, for grids, exactly `shape`).
fn take(
    npz: &mut Npz<'_>,
    path: &Path,
    name: &'static str,
    shape: Option<&[usize]>,
) -> Result<Vec<f64>, LoadError> {
    let a = npz.array(name)?;
    let ok = match shape {
        None => a.shape.len() == 1,
        Some(want) => a.shape == want,
    };
    if !ok {
        let want = shape.map_or("1-D".to_string(), |w| format!("shape {w:?} (from its axes)"));
        return Err(LoadError::array(path, name, format!("must be {want}, has shape {:?}", a.shape)));
    }
    Ok(a.values)
}

/// Whether the extension made of `names` is present; a partial one is an error.
fn extension(npz: &Npz<'_>, path: &Path, names: &[&'static str]) -> Result<bool, LoadError> {
    let given = names.iter().filter(|n| npz.has(n)).count();
    match names.iter().find(|n| !npz.has(n)) {
        Some(missing) if given > 0 => Err(LoadError::array(
            path,
            missing,
            format!("missing: it comes together with {}", names.join(", ")),
        )),
        _ => Ok(given > 0),
    }
}

fn read(mut npz: Npz<'_>, path: &Path) -> Result<Profile, LoadError> {
    if let Some(missing) = TABLE_ARRAYS.iter().find(|n| !npz.has(n)) {
        return Err(LoadError::array(
            path,
            missing,
            format!("missing: a profile table has {}", TABLE_ARRAYS.join(", ")),
        ));
    }
    let mut a = ProfileArrays {
        prefill_isl: take(&mut npz, path, "prefill_isl", None)?,
        prefill_ttft_ms: take(&mut npz, path, "prefill_ttft_ms", None)?,
        decode_active_kv_tokens: take(&mut npz, path, "decode_active_kv_tokens", None)?,
        decode_context_length: take(&mut npz, path, "decode_context_length", None)?,
        ..Default::default()
    };
    let itl = npz.array("decode_itl")?;
    let &[rows, cols] = itl.shape.as_slice() else {
        return Err(LoadError::array(path, "decode_itl", format!("must be 2-D, has shape {:?}", itl.shape)));
    };
    (a.decode_itl, a.decode_itl_shape) = (itl.values, (rows, cols));
    if extension(&npz, path, &PREFIX_ARRAYS)? {
        a.prefill_prefix_tokens = take(&mut npz, path, "prefill_prefix_tokens", None)?;
        let shape = [a.prefill_isl.len(), a.prefill_prefix_tokens.len()];
        a.prefill_ms = take(&mut npz, path, "prefill_ms", Some(&shape))?;
    }
    if extension(&npz, path, &MIXED_ARRAYS)? {
        a.mixed_prefill_tokens = take(&mut npz, path, "mixed_prefill_tokens", None)?;
        a.mixed_decode_requests = take(&mut npz, path, "mixed_decode_requests", None)?;
        a.mixed_decode_context = take(&mut npz, path, "mixed_decode_context", None)?;
        let shape =
            [a.mixed_prefill_tokens.len(), a.mixed_decode_requests.len(), a.mixed_decode_context.len()];
        a.mixed_ms = take(&mut npz, path, "mixed_ms", Some(&shape))?;
    }
    let meta = if npz.has("meta_json") {
        let bytes: Vec<u8> = take(&mut npz, path, "meta_json", None)?.into_iter().map(|b| b as u8).collect();
        Some(ProfileMeta::parse(&bytes).map_err(|reason| LoadError::array(path, "meta_json", reason))?)
    } else {
        None
    };
    let table = ProfileTable::new(a).map_err(|e| {
        let array = match &e {
            ProfileError::PrefillLength { .. } => "prefill_ttft_ms",
            ProfileError::DecodeShape { .. } => "decode_itl",
            ProfileError::Axis { array, .. }
            | ProfileError::NotFinite { array, .. }
            | ProfileError::TimeRange { array, .. }
            | ProfileError::GridShape { array, .. } => array,
        };
        LoadError::array(path, array, e.to_string())
    })?;
    Ok(Profile { table, meta })
}

/// Writes a profile as a table file that [`read_table`] reads back identically; the
/// reference reads its Dynamo arrays and ignores the rest.
pub fn write_table(path: &Path, profile: &Profile) -> Result<(), LoadError> {
    let a = profile.table.arrays();
    let mut arrays: Vec<npz::Named<'_>> = vec![
        ("prefill_isl", &a.prefill_isl, None),
        ("prefill_ttft_ms", &a.prefill_ttft_ms, None),
        ("decode_active_kv_tokens", &a.decode_active_kv_tokens, None),
        ("decode_context_length", &a.decode_context_length, None),
        ("decode_itl", &a.decode_itl, Some(vec![a.decode_itl_shape.0, a.decode_itl_shape.1])),
    ];
    if !a.prefill_ms.is_empty() {
        arrays.push(("prefill_prefix_tokens", &a.prefill_prefix_tokens, None));
        arrays.push((
            "prefill_ms",
            &a.prefill_ms,
            Some(vec![a.prefill_isl.len(), a.prefill_prefix_tokens.len()]),
        ));
    }
    if !a.mixed_ms.is_empty() {
        arrays.push(("mixed_prefill_tokens", &a.mixed_prefill_tokens, None));
        arrays.push(("mixed_decode_requests", &a.mixed_decode_requests, None));
        arrays.push(("mixed_decode_context", &a.mixed_decode_context, None));
        let shape =
            vec![a.mixed_prefill_tokens.len(), a.mixed_decode_requests.len(), a.mixed_decode_context.len()];
        arrays.push(("mixed_ms", &a.mixed_ms, Some(shape)));
    }
    let meta: Vec<(&str, &[u8])> = match &profile.meta {
        Some(m) => vec![("meta_json", m.raw.as_bytes())],
        None => vec![],
    };
    npz::write(path, &arrays, &meta)
}
