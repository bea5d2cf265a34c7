//! Profiles compiled into the binary (`profiles/aic/*.npz` and Dynamo's H200 table), so
//! `--timing-profile NAME` works on a fresh clone without Python or data files.

use std::path::Path;

use crate::table::read_table_bytes;
use crate::{LoadError, Profile};

include!(concat!(env!("OUT_DIR"), "/bundled_profiles.rs"));

/// Names of the bundled profiles, sorted.
pub fn bundled_names() -> Vec<&'static str> {
    BUNDLED.iter().map(|(name, _)| *name).collect()
}

/// The bundled profile called `name`, read; `None` if there is none by that name.
pub fn bundled(name: &str) -> Option<Result<Profile, LoadError>> {
    let (_, bytes) = BUNDLED.iter().find(|(n, _)| *n == name)?;
    let label = format!("bundled:{name}");
    Some(read_table_bytes(Path::new(&label), bytes))
}
