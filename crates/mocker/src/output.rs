//! Report files the CLI writes, always atomically: the bytes go to a temporary file beside
//! the target and are renamed over it only when complete, so a reader (or a crash
//! mid-write) never sees a partial report and a failed run leaves the previous one in
//! place. Plain std: a same-directory rename is atomic on POSIX.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A file being written that appears at its path only on [`AtomicFile::commit`]; dropped
/// uncommitted, it leaves no trace.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Starts writing what will become `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let out = BufWriter::new(File::create(&tmp)?);
        Ok(Self { path: path.to_path_buf(), tmp, out: Some(out) })
    }

    /// The writer for the file's contents.
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.out.as_mut().expect("an AtomicFile is only written before commit")
    }

    /// Flushes the contents and moves the file into place.
    pub fn commit(mut self) -> std::io::Result<()> {
        let out = self.out.take().expect("commit runs once");
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&self.tmp, &self.path)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.out.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Writes `bytes` as the whole of `path`, atomically.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.writer().write_all(bytes)?;
    file.commit()
}
