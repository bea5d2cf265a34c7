//! A Mooncake trace replayed as a stream: rows are read as the replay reaches them
//! instead of held whole, so memory follows what is in flight, not the trace's length.
//!
//! Streaming needs rows that are sessions of their own (no `session_id`) and, when
//! replayed by timestamp, in time order: the release order is then the file's. A first
//! pass reads the file with the same parser a load uses (so it refuses exactly what a load
//! refuses) and keeps only what the replay needs up front (counts, time span, how many
//! rows use each hash id); a file that does not qualify is loaded whole instead. The
//! second pass hands rows out one at a time.
//!
//! Hash ids are used as the file gives them instead of renumbered densely in order of
//! first sight, which needs a map of every id (4 bytes each, a third of a gigabyte for ten
//! million rows): any one-to-one renaming of ids synthesises prompts that are equal where
//! the loaded trace's are, so the replay is the same. Ids must then be small and dense
//! enough for a byte of use count each ([`MAX_RAW_ID`], [`raw_ids_dense`]).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use crate::trace::load::Lines;
use crate::trace::parser::Parser;
use crate::trace::{
    SessionName, Trace, TraceError, TraceFormat, TraceSession, TraceStream, MAX_TRACE_BLOCK_SIZE,
};

/// Largest raw hash id a streamed trace may use (ids are `u32` prompts' token values).
pub const MAX_RAW_ID: u64 = u32::MAX as u64 - 2;

/// Whether ids up to `max_raw` are dense enough, `occurrences` ids having been read, for a
/// use count per id value (a byte each) to cost no more than the ids' own four bytes each.
fn raw_ids_dense(max_raw: u64, occurrences: u64) -> bool {
    max_raw <= MAX_RAW_ID && max_raw < (1 << 20) + 4 * occurrences
}

/// How a trace will be replayed, which decides whether it can be streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamIf {
    /// Released by timestamp (trace mode): rows must come in time order.
    pub by_timestamp: bool,
}

/// Reads `path` in a first pass and returns the trace to stream it (no sessions held,
/// [`Trace::stream`] set), or `None` when it is not a Mooncake file of one-row sessions
/// (in time order when `when.by_timestamp`). Errors are those a load reports.
pub fn scan_for_stream(
    path: &Path,
    format: TraceFormat,
    block_size: Option<usize>,
    when: StreamIf,
) -> Result<Option<Trace>, TraceError> {
    if format != TraceFormat::Mooncake || !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let mut rows = StreamRows::open(path, format, block_size)?;
    let mut stream = TraceStream {
        rows: 0,
        prompt_tokens: 0,
        span_ms: None,
        id_uses: Vec::new(),
        failure: Default::default(),
    };
    // Time order is what a replay by timestamp needs; the span bounds its horizon.
    let (mut untimed, mut in_order) = (false, true);
    let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut occurrences = 0u64;
    while let Some(session) = rows.next_row()? {
        let Some(session) = session else { return Ok(None) };
        let turn = &session.turns[0];
        match session.first_arrival_ms {
            Some(t) => {
                in_order &= t >= last;
                (first, last) = (first.min(t), last.max(t));
            }
            None => untimed = true,
        }
        if when.by_timestamp && (untimed || !in_order) {
            return Ok(None);
        }
        stream.rows += 1;
        stream.prompt_tokens += u64::from(turn.input_length);
        occurrences += turn.ids.len() as u64;
        if !raw_ids_dense(rows.parser.max_raw, occurrences) {
            return Ok(None);
        }
        for &id in &turn.ids {
            let i = id as usize;
            if i >= stream.id_uses.len() {
                stream.id_uses.resize(i + 1, 0);
            }
            stream.id_uses[i] = stream.id_uses[i].saturating_add(1);
        }
    }
    if stream.rows == 0 {
        return Ok(None); // nothing to stream: a load words what is wrong with it
    }
    stream.span_ms = (!untimed).then_some((first, last));
    let mut trace = rows.parser.finish();
    trace.path = path.to_path_buf();
    trace.unknown_keys.set_path(path);
    trace.stream = Some(std::sync::Arc::new(stream));
    Ok(Some(trace))
}

/// A trace file's rows, read one at a time.
pub struct StreamRows {
    parser: Parser,
    lines: Lines<'static, BufReader<File>>,
    first: bool,
    path: PathBuf,
}

impl std::fmt::Debug for StreamRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamRows").field("path", &self.path).finish_non_exhaustive()
    }
}

impl StreamRows {
    /// Opens `path` to read its rows in `format`.
    pub fn open(path: &Path, format: TraceFormat, block_size: Option<usize>) -> Result<Self, TraceError> {
        let fail = |message: String| TraceError {
            path: path.to_path_buf(),
            line: 0,
            field: "trace".into(),
            message,
        };
        let mut parser = Parser::new(format, block_size);
        parser.raw_ids = true;
        if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&parser.block_size) {
            let msg = format!("must be in 1..={MAX_TRACE_BLOCK_SIZE} (got {})", parser.block_size);
            return Err(TraceError { path: path.to_path_buf(), ..parser.err(0, "trace_block_size", msg) });
        }
        let file = File::open(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        let lines =
            Lines::Reader { reader: BufReader::with_capacity(1 << 16, file), buf: Vec::new(), line: 0 };
        Ok(Self { parser, lines, first: true, path: path.to_path_buf() })
    }

    /// The next row's session: `Ok(None)` at the end of the file, `Ok(Some(None))` for a
    /// row that is not a session of its own (a `session_id`, a named request).
    pub fn next_row(&mut self) -> Result<Option<Option<TraceSession>>, TraceError> {
        loop {
            let Some(next) = self.lines.next_line() else { return Ok(None) };
            let (n, line) = next.map_err(|e| TraceError { path: self.path.clone(), ..e })?;
            self.parser
                .read_line(n, line, &mut self.first)
                .map_err(|e| TraceError { path: self.path.clone(), ..e })?;
            match self.parser.take_row_session() {
                None if line.trim().is_empty() => continue,
                Some(s) if matches!(s.name, SessionName::Row) && s.turns.len() == 1 => {
                    return Ok(Some(Some(s)))
                }
                _ => return Ok(Some(None)),
            }
        }
    }
}
