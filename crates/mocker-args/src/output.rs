//! Report files the CLI writes. A regular file (or a new path) is written atomically: the
//! bytes go to a temporary file beside it and are renamed over it only when complete, so a
//! reader (or a crash mid-write) never sees a partial report and a failed run leaves the
//! previous one in place. Plain std: a same-directory rename is atomic on POSIX.
//!
//! Anything else is written in place, because renaming over it would replace it: a
//! character device (`/dev/null`, `/dev/stdout`), a FIFO or a socket is opened and written
//! like a shell redirection would. A symlink is followed (through a chain of them) and its
//! final target is treated by the same rules, so the link survives and points at the new
//! contents. The temporary file never outlives the writer, whether writing fails or not.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};

/// Symlinks followed before giving up (the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// A file being written that appears at its path only on [`AtomicFile::commit`]; dropped
/// uncommitted, it leaves no trace. Special files are written in place (see the module).
pub struct AtomicFile {
    /// Where the bytes end up.
    path: PathBuf,
    /// The temporary file renamed over `path`; `None` when writing in place.
    tmp: Option<PathBuf>,
    out: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Starts writing what will become `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let path = follow_links(path)?;
        let special = match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(std::io::Error::new(ErrorKind::IsADirectory, "is a directory"))
            }
            Ok(m) => !m.is_file(),
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if special {
            // No truncation: it means nothing for a device or a pipe.
            let out = BufWriter::new(OpenOptions::new().write(true).open(&path)?);
            return Ok(Self { path, tmp: None, out: Some(out) });
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let out = BufWriter::new(File::create(&tmp)?);
        Ok(Self { path, tmp: Some(tmp), out: Some(out) })
    }

    /// The writer for the file's contents.
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.out.as_mut().expect("an AtomicFile is only written before commit")
    }

    /// Flushes the contents and moves the file into place. On failure the temporary file
    /// is removed (by `drop`) and the previous contents stay.
    pub fn commit(mut self) -> std::io::Result<()> {
        let out = self.out.as_mut().expect("commit runs once");
        out.flush()?;
        let Some(tmp) = &self.tmp else {
            self.out = None;
            return Ok(());
        };
        out.get_ref().sync_all()?;
        std::fs::rename(tmp, &self.path)?;
        self.out = None;
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let (Some(out), Some(tmp)) = (self.out.take(), &self.tmp) {
            drop(out);
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// `path` with every symlink along the final component resolved (a relative link target
/// is relative to the link's directory). A dangling link yields its missing target.
fn follow_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path)?;
                path = match path.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => return Ok(path),
        }
    }
    Err(std::io::Error::other(format!("more than {MAX_LINKS} levels of symbolic links")))
}

/// Writes `bytes` as the whole of `path`, atomically where `path` is a regular file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = AtomicFile::create(path)?;
    file.writer().write_all(bytes)?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mocker-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        let names =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
        names.filter(|n| n.contains(".tmp-")).collect()
    }

    #[test]
    fn regular_files_are_replaced_and_new_ones_created() {
        let dir = scratch("regular");
        let p = dir.join("r.json");
        write_atomically(&p, b"one").unwrap();
        write_atomically(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(leftovers(&dir).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_followed_and_kept() {
        let dir = scratch("links");
        let target = dir.join("real.json");
        std::fs::write(&target, b"old").unwrap();
        std::os::unix::fs::symlink("real.json", dir.join("a")).unwrap();
        std::os::unix::fs::symlink(dir.join("a"), dir.join("b")).unwrap();
        write_atomically(&dir.join("b"), b"new").unwrap();
        assert!(std::fs::symlink_metadata(dir.join("b")).unwrap().file_type().is_symlink());
        assert!(std::fs::symlink_metadata(dir.join("a")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        // A dangling link gets its target created.
        std::os::unix::fs::symlink("made.json", dir.join("dangling")).unwrap();
        write_atomically(&dir.join("dangling"), b"x").unwrap();
        assert_eq!(std::fs::read(dir.join("made.json")).unwrap(), b"x");
        // A loop is an error, not a hang.
        std::os::unix::fs::symlink("loop2", dir.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", dir.join("loop2")).unwrap();
        assert!(write_atomically(&dir.join("loop1"), b"x").is_err());
        assert!(leftovers(&dir).is_empty());
    }

    #[test]
    fn a_failed_commit_leaves_no_temporary_file_and_the_old_contents() {
        let dir = scratch("fail");
        let p = dir.join("busy");
        std::fs::create_dir(&p).unwrap();
        assert_eq!(write_atomically(&p, b"x").unwrap_err().kind(), ErrorKind::IsADirectory);
        let p = dir.join("r.json");
        std::fs::write(&p, b"old").unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        f.writer().write_all(b"new").unwrap();
        // Aim the rename at the directory: it fails after every byte was written.
        let tmp = f.tmp.clone().unwrap();
        f.path = dir.join("busy");
        assert!(f.commit().is_err());
        assert!(!tmp.exists(), "temporary file left behind");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert!(leftovers(&dir).is_empty());
    }
}
