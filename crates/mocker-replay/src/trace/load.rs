//! Reading a trace, from a file or text: row by row, each handed to its format's reader
//! (a Weka corpus is handed over whole). Above the formats, since it picks one.

use std::io::{BufRead, BufReader};
use std::path::Path;

use serde_json::{Map, Value};

use crate::trace::mooncake::PlainRow;
use crate::trace::parser::Parser;
use crate::trace::{NestedTimestampBasis, Trace, TraceError, TraceFormat, MAX_TRACE_BLOCK_SIZE};

/// Reads and parses a trace file; `block_size` is the explicit `--trace-block-size`, if
/// given (a v2 agentic header's `block_size` must then agree with it).
pub fn load_trace(path: &Path, format: TraceFormat, block_size: Option<usize>) -> Result<Trace, TraceError> {
    load_trace_with(path, format, block_size, NestedTimestampBasis::Auto)
}

/// [`load_trace`], a Weka corpus's nested request times read by `basis` (other formats
/// have none; the caller refuses a basis given for them).
pub fn load_trace_with(
    path: &Path,
    format: TraceFormat,
    block_size: Option<usize>,
    basis: NestedTimestampBasis,
) -> Result<Trace, TraceError> {
    let fail = |line: usize, field: &str, message: String| TraceError {
        path: path.to_path_buf(),
        line,
        field: field.into(),
        message,
    };
    if format == TraceFormat::Weka {
        // A file or a directory of them.
        return crate::trace::weka::load_weka(path, block_size, basis);
    }
    // A device (`/dev/zero`, a terminal) would be read forever or block; pipes are fine.
    let meta = std::fs::metadata(path).map_err(|e| fail(0, "trace", format!("cannot read: {e}")))?;
    if !(meta.is_file() || is_fifo(&meta)) {
        return Err(fail(0, "trace", "not a regular file (or a pipe); give a trace file".into()));
    }
    // Read a line at a time: the file's text is never held whole (a million-row trace is
    // hundreds of MB of JSON, more than the rows parsed from it).
    let file = std::fs::File::open(path).map_err(|e| fail(0, "trace", format!("cannot read: {e}")))?;
    let mut lines =
        Lines::Reader { reader: BufReader::with_capacity(1 << 16, file), buf: Vec::new(), line: 0 };
    let mut trace = parse_lines(&mut lines, format, block_size).map_err(|mut e| {
        e.path = path.to_path_buf();
        e
    })?;
    trace.path = path.to_path_buf();
    trace.unknown_keys.set_path(path);
    Ok(trace)
}

#[cfg(unix)]
fn is_fifo(meta: &std::fs::Metadata) -> bool {
    std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type())
}

#[cfg(not(unix))]
fn is_fifo(_: &std::fs::Metadata) -> bool {
    false
}

/// Parses trace text (errors carry an empty path; [`load_trace`] fills it in).
pub fn parse_trace(text: &str, format: TraceFormat, block_size: Option<usize>) -> Result<Trace, TraceError> {
    parse_trace_with(text, format, block_size, NestedTimestampBasis::Auto)
}

/// [`parse_trace`], Weka text's nested request times read by `basis`.
pub fn parse_trace_with(
    text: &str,
    format: TraceFormat,
    block_size: Option<usize>,
    basis: NestedTimestampBasis,
) -> Result<Trace, TraceError> {
    let p = Parser::new(format, block_size);
    if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&p.block_size) {
        let msg = format!("must be in 1..={MAX_TRACE_BLOCK_SIZE} (got {})", p.block_size);
        return Err(p.err(0, "trace_block_size", msg));
    }
    if format == TraceFormat::Weka {
        return crate::trace::weka::parse_weka_text(text, block_size, basis);
    }
    parse_lines(&mut Lines::<std::io::Empty>::Text(text.lines().enumerate()), format, block_size)
}

/// A trace's lines, numbered from 1: from text in memory, or read from a file as they
/// are needed.
pub(crate) enum Lines<'a, R> {
    Text(std::iter::Enumerate<std::str::Lines<'a>>),
    Reader { reader: R, buf: Vec<u8>, line: usize },
}

impl<R: BufRead> Lines<'_, R> {
    /// The next line and its number (line endings as [`str::lines`] drops them), or
    /// `None` at the end.
    pub(crate) fn next_line(&mut self) -> Option<Result<(usize, &str), TraceError>> {
        match self {
            Lines::Text(lines) => lines.next().map(|(i, l)| Ok((i + 1, l))),
            Lines::Reader { reader, buf, line } => {
                buf.clear();
                *line += 1;
                let fail = |message: String| TraceError {
                    path: Default::default(),
                    line: *line,
                    field: "row".into(),
                    message,
                };
                match reader.read_until(b'\n', buf) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(e) => {
                        return Some(Err(TraceError {
                            line: 0,
                            field: "trace".into(),
                            ..fail(format!("cannot read: {e}"))
                        }))
                    }
                }
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                }
                Some(match std::str::from_utf8(buf) {
                    Ok(text) => Ok((*line, text)),
                    Err(e) => Err(fail(format!("invalid UTF-8 at byte {} of the line", e.valid_up_to() + 1))),
                })
            }
        }
    }
}

/// Parses the rows of every format but Weka, a line at a time.
fn parse_lines<R: BufRead>(
    lines: &mut Lines<'_, R>,
    format: TraceFormat,
    block_size: Option<usize>,
) -> Result<Trace, TraceError> {
    let mut p = Parser::new(format, block_size);
    if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&p.block_size) {
        let msg = format!("must be in 1..={MAX_TRACE_BLOCK_SIZE} (got {})", p.block_size);
        return Err(p.err(0, "trace_block_size", msg));
    }
    let mut first = true;
    while let Some(next) = lines.next_line() {
        let (n, line) = next?;
        p.read_line(n, line, &mut first)?;
    }
    if format == TraceFormat::Dynamo {
        p.finish_dynamo()?;
    }
    Ok(p.finish())
}

impl Parser {
    /// Reads line `n` of the trace (blank lines are skipped); `first` is whether no
    /// non-blank line was read before (an agentic v2 header may only come first).
    pub(crate) fn read_line(&mut self, n: usize, line: &str, first: &mut bool) -> Result<(), TraceError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        if line.len() >= crate::trace::scan::SCAN_MIN_LINE {
            self.check_entries(n, line)?;
        }
        if matches!(self.format, TraceFormat::Mooncake | TraceFormat::MooncakeDelta) {
            if let Ok(row) = serde_json::from_str::<PlainRow>(line) {
                if self.plain_row(n, row)? {
                    *first = false;
                    return Ok(());
                }
            }
        }
        let row = self.object(n, line)?;
        let header = std::mem::take(first)
            && self.format == TraceFormat::AgenticMooncake
            && row.contains_key("schema");
        let read = if header { self.header(n, &row) } else { self.row(n, &row) };
        // A field the row lacks may be there under a misspelt key: say so.
        read.map_err(|mut e| {
            if let Some(note) = self.keys.note(e.line, &e.field) {
                e.message += &note;
            }
            e
        })
    }

    /// A row read generically, by its format's reader.
    fn row(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
        match self.format {
            TraceFormat::AppliedComputeAgentic => return self.applied_row(line, row),
            TraceFormat::Dynamo => return self.dynamo_row(line, row),
            _ => {}
        }
        if self.format == TraceFormat::AgenticMooncake {
            return if self.v2 { self.v2_row(line, row) } else { self.legacy_row(line, row) };
        }
        self.mooncake_row(line, row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_and_devices_are_reported_with_their_place() {
        let dir = std::env::temp_dir().join(format!("mocker-trace-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.jsonl");
        std::fs::write(&path, b"{\"output_length\": 1, \"hash_ids\": [1]}\n{\"output_length\": \xff}\n")
            .unwrap();
        let e = load_trace(&path, TraceFormat::Mooncake, None).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "row"), "{e}");
        assert!(
            e.to_string().starts_with(&format!("{}:2: row: invalid UTF-8 at byte 19", path.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        #[cfg(unix)]
        {
            let e = load_trace(Path::new("/dev/zero"), TraceFormat::Mooncake, None).unwrap_err();
            assert!(e.to_string().starts_with("/dev/zero: not a regular file"), "{e}");
        }
    }
}
