//! NumPy `.npz` archives of numeric arrays, read defensively and written plainly.
//!
//! Profiles are small (kilobytes), so a file is read whole, each member's size is checked
//! against a cap and its header's claimed shape against the bytes actually present before
//! `ndarray-npy` decodes it: a hostile header cannot make us allocate what it claims.

use std::io::{Cursor, Read};
use std::path::Path;

use ndarray::{ArrayD, IxDyn};
use ndarray_npy::npy::header::Header;
use ndarray_npy::{NpzWriter, ReadNpyExt, ReadableElement};

use crate::LoadError;

/// Largest profile file or archive member we read; real profiles are a few kilobytes.
const MAX_BYTES: u64 = 16 << 20;

/// An opened `.npz` archive.
pub(crate) struct Npz<'p> {
    path: &'p Path,
    zip: zip::ZipArchive<Cursor<Vec<u8>>>,
}

/// One numeric array, converted to `f64`, with its shape.
pub(crate) struct NumArray {
    /// Values in row-major order.
    pub values: Vec<f64>,
    /// Dimensions as stored.
    pub shape: Vec<usize>,
}

impl<'p> Npz<'p> {
    /// Opens `path` as an `.npz` archive.
    pub(crate) fn open(path: &'p Path) -> Result<Self, LoadError> {
        Self::from_bytes(path, read_capped(path)?)
    }

    /// Opens an archive already in memory; `path` names it in errors.
    pub(crate) fn from_bytes(path: &'p Path, bytes: Vec<u8>) -> Result<Self, LoadError> {
        let zip = zip::ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| LoadError::file(path, format!("not a NumPy .npz archive: {e}")))?;
        Ok(Self { path, zip })
    }

    /// Whether the archive holds an array called `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.zip.index_for_name(&format!("{name}.npy")).is_some() || self.zip.index_for_name(name).is_some()
    }

    /// Reads array `name` (float or integer dtype) as `f64`.
    pub(crate) fn array(&mut self, name: &'static str) -> Result<NumArray, LoadError> {
        let err = |reason: String| LoadError::array(self.path, name, reason);
        let index = self
            .zip
            .index_for_name(&format!("{name}.npy"))
            .or_else(|| self.zip.index_for_name(name))
            .ok_or_else(|| err("missing from the archive".into()))?;
        let mut member = self.zip.by_index(index).map_err(|e| err(format!("unreadable: {e}")))?;
        if member.size() > MAX_BYTES {
            return Err(err(format!("{} bytes is larger than the {MAX_BYTES}-byte limit", member.size())));
        }
        let mut bytes = Vec::with_capacity(member.size() as usize);
        (&mut member)
            .take(MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| err(format!("unreadable: {e}")))?;
        drop(member);
        decode(&bytes).map_err(err)
    }
}

/// Decodes one `.npy` member after checking that its claimed shape fits in its bytes.
fn decode(bytes: &[u8]) -> Result<NumArray, String> {
    let header =
        Header::from_reader(&mut Cursor::new(bytes)).map_err(|e| format!("not a NumPy array: {e}"))?;
    let count = header.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    // Every element takes at least one byte, so this bounds what decoding allocates.
    if count.is_none_or(|n| n > bytes.len()) {
        return Err(format!("shape {:?} does not fit in {} bytes", header.shape, bytes.len()));
    }
    let shape = header.shape.clone();
    fn read<T: ReadableElement + Copy>(bytes: &[u8], to_f64: fn(T) -> f64) -> Option<Vec<f64>> {
        let a = ArrayD::<T>::read_npy(Cursor::new(bytes)).ok()?;
        // Row-major order whatever the stored layout.
        Some(a.into_dimensionality::<IxDyn>().ok()?.iter().map(|&v| to_f64(v)).collect())
    }
    let values = read::<f64>(bytes, |v| v)
        .or_else(|| read::<f32>(bytes, f64::from))
        .or_else(|| read::<i64>(bytes, |v| v as f64))
        .or_else(|| read::<i32>(bytes, f64::from))
        .or_else(|| read::<u64>(bytes, |v| v as f64))
        .or_else(|| read::<u32>(bytes, f64::from))
        .or_else(|| read::<u8>(bytes, f64::from))
        .ok_or_else(|| {
            format!(
                "dtype {} is not a float or integer type (or the data is truncated)",
                header.type_descriptor
            )
        })?;
    Ok(NumArray { values, shape })
}

/// Reads a whole file, refusing anything larger than [`MAX_BYTES`].
pub(crate) fn read_capped(path: &Path) -> Result<Vec<u8>, LoadError> {
    let file = std::fs::File::open(path).map_err(|e| LoadError::file(path, format!("cannot open: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| LoadError::file(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(LoadError::file(path, format!("larger than the {MAX_BYTES}-byte limit for a profile")));
    }
    Ok(bytes)
}

/// One array to write: its name, values, and its shape if it is not 1-D.
pub(crate) type Named<'a> = (&'a str, &'a [f64], Option<Vec<usize>>);

/// Writes named `f64` arrays, and byte arrays (as `uint8`), as an uncompressed `.npz`.
pub(crate) fn write(path: &Path, arrays: &[Named<'_>], bytes: &[(&str, &[u8])]) -> Result<(), LoadError> {
    let io = |e: &dyn std::fmt::Display| LoadError::file(path, format!("cannot write: {e}"));
    let file = std::fs::File::create(path).map_err(|e| io(&e))?;
    let mut npz = NpzWriter::new(file);
    for (name, values, shape) in arrays {
        let dims = shape.clone().unwrap_or_else(|| vec![values.len()]);
        let a = ArrayD::from_shape_vec(IxDyn(&dims), values.to_vec()).map_err(|e| io(&e))?;
        npz.add_array(*name, &a).map_err(|e| io(&e))?;
    }
    for (name, b) in bytes {
        let a = ndarray::Array1::from(b.to_vec());
        npz.add_array(*name, &a).map_err(|e| io(&e))?;
    }
    npz.finish().map_err(|e| io(&e))?;
    Ok(())
}
