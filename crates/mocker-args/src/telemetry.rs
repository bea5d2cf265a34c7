//! `--telemetry-jsonl`: telemetry samples written one compact JSON object per line, as the
//! reference's `telemetry_jsonl_path` writes them (the file opened at the first sample, its
//! parent directories created).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use mocker_replay::scaling::PolicyError;
use mocker_replay::telemetry::TelemetrySample;

/// The samples' file, opened at the first sample.
pub struct TelemetryFile {
    path: PathBuf,
    out: Option<BufWriter<File>>,
}

impl TelemetryFile {
    /// A file at `path`, not yet created.
    pub fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf(), out: None }
    }

    /// Appends `sample` as one line; an error stops the replay.
    pub fn write(&mut self, sample: &TelemetrySample) -> Result<(), PolicyError> {
        let error = |e: std::io::Error| PolicyError(format!("telemetry observer error: {e}"));
        if self.out.is_none() {
            if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(error)?;
            }
            self.out = Some(BufWriter::new(File::create(&self.path).map_err(error)?));
        }
        let out = self.out.as_mut().expect("opened above");
        serde_json::to_writer(&mut *out, sample).map_err(|e| error(e.into()))?;
        out.write_all(b"\n").map_err(error)
    }

    /// Flushes what was written.
    pub fn finish(mut self) -> Result<(), PolicyError> {
        match self.out.as_mut() {
            Some(out) => out.flush().map_err(|e| PolicyError(format!("telemetry observer error: {e}"))),
            None => Ok(()),
        }
    }
}
