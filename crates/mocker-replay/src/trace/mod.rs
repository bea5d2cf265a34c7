//! Trace files (Mooncake JSONL and its variants) parsed into sessions of turns.
//!
//! A trace row names its prompt by `hash_ids`, one id per `trace_block_size` tokens. Rows
//! are kept in that compact form (ids canonicalised to dense `u32` values, an injective
//! map) until a turn is dispatched; `expand_prompt` then synthesises the tokens the way the
//! reference does (each id repeated over its block, truncated to `input_length`).

pub mod agentic;
mod applied;
pub mod dynamo;
pub mod generator;
pub mod keys;
mod scan;
pub mod source;
mod weka;

use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

use crate::trace::keys::{KeyCheck, UnknownKeys};

/// Supported trace formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceFormat {
    /// One request per row; rows sharing `session_id` form a closed-loop session.
    #[default]
    Mooncake,
    /// Like `Mooncake`, but each row carries only the turn's new tokens: the prompt is the
    /// session history (earlier prompts and the outputs the engine produced) plus the delta.
    MooncakeDelta,
    /// Agentic request graphs: legacy rows (`request_id`, `wait_for`) or the v2 form (a
    /// `dynamo.agentic_mooncake` header, rows with `dependencies`); see [`agentic`].
    AgenticMooncake,
    /// Weka/AgentX agent traces (a trace object per `.json` file or `.jsonl` line, or a
    /// directory of them), lowered to an agentic request graph; see `weka`.
    Weka,
    /// One agent conversation per line (turn lengths and tool latencies, no timestamps);
    /// see `applied`.
    AppliedComputeAgentic,
    /// Dynamo's request traces (`dynamo.request.trace.v1` `request_end` records); see
    /// [`dynamo`].
    Dynamo,
}

impl TraceFormat {
    /// Parses a CLI/API name (both `-` and `_` spellings).
    pub fn parse(name: &str) -> Option<Self> {
        match name.replace('_', "-").as_str() {
            "mooncake" => Some(Self::Mooncake),
            "mooncake-delta" => Some(Self::MooncakeDelta),
            "agentic-mooncake" => Some(Self::AgenticMooncake),
            "weka" => Some(Self::Weka),
            "applied-compute-agentic" => Some(Self::AppliedComputeAgentic),
            "dynamo" => Some(Self::Dynamo),
            _ => None,
        }
    }

    /// Names accepted by [`TraceFormat::parse`], for error messages.
    pub const NAMES: &'static str =
        "mooncake, mooncake-delta, agentic-mooncake, weka, applied-compute-agentic, dynamo";

    /// Whether the format's requests form agentic graphs (their per-request records carry
    /// a dispatch time).
    pub fn is_agentic(self) -> bool {
        matches!(self, Self::AgenticMooncake | Self::Weka)
    }

    /// Whether per-request records number a session's turns (the reference does for the
    /// session formats, not for request graphs or Dynamo's request traces).
    pub fn numbers_turns(self) -> bool {
        matches!(self, Self::Mooncake | Self::MooncakeDelta | Self::AppliedComputeAgentic)
    }
}

/// How per-request records name a session.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SessionName {
    /// No name (null).
    #[default]
    Unnamed,
    /// A session-less row: `request_<line>`.
    Row,
    /// The trace's own session id.
    Key(String),
}

/// One turn of a trace session, prompt still as block ids.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceTurn {
    /// 1-based line of the row in its file (request ids and error messages use it).
    pub line: u32,
    /// Dense block ids (injective image of the row's `hash_ids`).
    pub ids: Vec<u32>,
    /// Tokens of this row (the delta for `mooncake-delta`).
    pub input_length: u32,
    /// Tokens to generate.
    pub output_length: u32,
    /// Delay after the previous turn of the session completes, ms (0 for the first).
    pub delay_ms: f64,
    /// Agentic v2: the turn is not released before this time (ms, as in the file).
    pub not_before_ms: Option<f64>,
}

/// A session: turns run one after another, each after the previous completes.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSession {
    /// Arrival of the first turn (ms, as in the file), if given; for a gated session its
    /// `not_before_ms`.
    pub first_arrival_ms: Option<f64>,
    /// Turns in file order.
    pub turns: Vec<TraceTurn>,
    /// Index in [`Trace::gates`] when the first turn waits for other requests (a join,
    /// a dispatch trigger, or a fork off a request that is not its session's last turn).
    pub gate: Option<u32>,
    /// What per-request records call it.
    pub name: SessionName,
}

/// What of an upstream request a dependency waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepTrigger {
    /// The upstream request is dispatched (released to the router).
    Dispatch,
    /// The upstream request completes.
    Completion,
}

/// One dependency of a gated session's first turn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceDep {
    /// Line of the upstream row (its request id in the replay).
    pub line: u32,
    /// Which event of the upstream request starts the delay.
    pub trigger: DepTrigger,
    /// Delay after the trigger, ms.
    pub delay_ms: f64,
}

/// The dependencies a gated session's first turn waits for (all of them).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceGate {
    /// Index of the gated session in [`Trace::sessions`].
    pub session: u32,
    /// Its dependencies, in file order.
    pub deps: Vec<TraceDep>,
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Format the rows were read as.
    pub format: TraceFormat,
    /// Tokens per hash id.
    pub block_size: usize,
    /// Sessions in order of first appearance.
    pub sessions: Vec<TraceSession>,
    /// Sessions whose first turn waits for other requests (agentic traces only).
    pub gates: Vec<TraceGate>,
    /// The file it was read from (empty for [`parse_trace`]), for errors found later.
    pub path: PathBuf,
    /// Request graphs: the session each row names, by line (ascending), for per-request
    /// records (mocker's own sessions group a graph's rows differently).
    pub row_sessions: Vec<(u32, String)>,
    /// Keys of the rows the format does not know (ignored; the caller warns or refuses).
    pub unknown_keys: UnknownKeys,
}

/// A malformed trace: file, 1-based line and field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct TraceError {
    /// The trace file.
    pub path: PathBuf,
    /// 1-based line number (0 when the error concerns the whole file, which is then
    /// reported without a line).
    pub line: usize,
    /// The offending field.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl std::fmt::Display for TraceError {
    /// `file:line: field: message`; an error about the whole file (line 0) is
    /// `file: message` (its field is then `trace`) or `file: field: message`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut place = self.path.display().to_string();
        if self.line > 0 {
            place += &format!(":{}", self.line);
        }
        if !place.is_empty() {
            write!(f, "{place}: ")?;
        }
        if self.line > 0 || self.field != "trace" {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Tokens per hash id when neither the flag nor the file says.
pub const DEFAULT_TRACE_BLOCK_SIZE: usize = 512;

// Bounds of a row's values, checked before anything is allocated from them. Each is far
// above real traces (Mooncake prompts are at most a few hundred thousand tokens) and low
// enough that a prompt (4 bytes a token) stays within 64 MiB and simulated times stay
// inside the u64 nanosecond clock.

/// Most tokens in one prompt (`input_length`, the `hash_ids` capacity it defaults to,
/// and a `mooncake-delta` turn's whole prompt: history plus delta) and in one output.
pub const MAX_TRACE_TOKENS: usize = 1 << 24;
/// Largest tokens-per-hash-id (`--trace-block-size`, a v2 header's `block_size`).
pub const MAX_TRACE_BLOCK_SIZE: usize = 1 << 20;
/// Latest timestamp (`timestamp`, `created_time`, `not_before_ms`), ms: about the year 2286
/// as a Unix time, so absolute epoch-millisecond timestamps fit.
pub const MAX_TIMESTAMP_MS: f64 = 1e13;
/// Longest delay (`delay`, `delay_ms`, `tool_wait_ms`, a dependency's `delay_ms`), ms:
/// about 115 days.
pub const MAX_DELAY_MS: f64 = 1e10;

/// Reads and parses a trace file; `block_size` is the explicit `--trace-block-size`, if
/// given (a v2 agentic header's `block_size` must then agree with it).
pub fn load_trace(path: &Path, format: TraceFormat, block_size: Option<usize>) -> Result<Trace, TraceError> {
    let fail = |line: usize, field: &str, message: String| TraceError {
        path: path.to_path_buf(),
        line,
        field: field.into(),
        message,
    };
    if format == TraceFormat::Weka {
        // A file or a directory of them.
        return crate::trace::weka::load_weka(path, block_size);
    }
    // A device (`/dev/zero`, a terminal) would be read forever or block; pipes are fine.
    let meta = std::fs::metadata(path).map_err(|e| fail(0, "trace", format!("cannot read: {e}")))?;
    if !(meta.is_file() || is_fifo(&meta)) {
        return Err(fail(0, "trace", "not a regular file (or a pipe); give a trace file".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(0, "trace", format!("cannot read: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line_start = bytes[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let line = bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        fail(line, "row", format!("invalid UTF-8 at byte {} of the line", at - line_start + 1))
    })?;
    let mut trace = parse_trace(&text, format, block_size).map_err(|mut e| {
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

impl Trace {
    /// A [`TraceError`] at `line` of this trace's file.
    pub fn error_at(&self, line: u32, field: &str, message: String) -> TraceError {
        TraceError { path: self.path.clone(), line: line as usize, field: field.into(), message }
    }
}

/// Parses trace text (errors carry an empty path; [`load_trace`] fills it in).
pub fn parse_trace(text: &str, format: TraceFormat, block_size: Option<usize>) -> Result<Trace, TraceError> {
    let mut p = Parser {
        format,
        block_size: block_size.unwrap_or(DEFAULT_TRACE_BLOCK_SIZE),
        explicit_block_size: block_size.is_some(),
        ..Parser::default()
    };
    if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&p.block_size) {
        let msg = format!("must be in 1..={MAX_TRACE_BLOCK_SIZE} (got {})", p.block_size);
        return Err(p.err(0, "trace_block_size", msg));
    }
    if format == TraceFormat::Weka {
        return crate::trace::weka::parse_weka_text(text, block_size);
    }
    let mut first = true;
    let plain = matches!(format, TraceFormat::Mooncake | TraceFormat::MooncakeDelta);
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if line.len() >= crate::trace::scan::SCAN_MIN_LINE {
            p.check_entries(i + 1, line)?;
        }
        if plain {
            if let Ok(row) = serde_json::from_str::<PlainRow>(line) {
                if p.plain_row(i + 1, row)? {
                    continue;
                }
            }
        }
        let row = p.object(i + 1, line)?;
        let header = std::mem::take(&mut first)
            && format == TraceFormat::AgenticMooncake
            && row.contains_key("schema");
        let read = if header { p.header(i + 1, &row) } else { p.row(i + 1, &row) };
        // A field the row lacks may be there under a misspelt key: say so.
        read.map_err(|mut e| {
            if let Some(note) = p.keys.note(e.line, &e.field) {
                e.message += &note;
            }
            e
        })?;
    }
    if format == TraceFormat::Dynamo {
        p.finish_dynamo()?;
    }
    Ok(p.finish())
}

/// A row of the plain Mooncake schema and nothing else (what the public traces hold),
/// read typed: a generic JSON tree (a map of named values, an array of boxed numbers) per
/// row was two thirds of loading a trace. A row with any other key, or a field of another
/// type, fails to parse as this and takes the generic path, which also words every error.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlainRow {
    #[serde(default)]
    timestamp: Option<f64>,
    #[serde(default)]
    input_length: Option<u32>,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Whether a time or delay of `x` ms is one a row may give (`max`: the field's bound).
fn time_in_range(x: f64, max: f64) -> bool {
    x.is_finite() && (0.0..=max).contains(&x)
}

/// Raw hash ids below this map to dense ids through a vector (at most 4 MiB): a fixed
/// bound, so a raw id always takes the same path.
const DIRECT_IDS: u64 = 1 << 20;

/// Where an agentic request sits: its session and turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) session: usize,
    pub(crate) turn: usize,
    pub(crate) line: u32,
    /// The row's timestamp (legacy chain steps infer their delay from it).
    pub(crate) timestamp: Option<f64>,
}

#[derive(Default)]
pub(crate) struct Parser {
    pub(crate) format: TraceFormat,
    pub(crate) block_size: usize,
    pub(crate) explicit_block_size: bool,
    /// A v2 header was read: rows use the v2 schema.
    pub(crate) v2: bool,
    /// Dense ids of raw ids below [`DIRECT_IDS`], by raw id (`u32::MAX`: none yet).
    /// Mooncake traces number their blocks from 0, so a vector indexed by raw id replaces
    /// a hash map that, grown to a hundred thousand entries, cost a few ms of probes and
    /// page faults in every load.
    direct_ids: Vec<u32>,
    /// Dense ids of larger raw ids.
    ids: FxHashMap<u64, u32>,
    pub(crate) sessions: Vec<TraceSession>,
    pub(crate) gates: Vec<TraceGate>,
    /// Session key -> (index in `sessions`, timestamp of its last row).
    open: FxHashMap<String, (usize, Option<f64>)>,
    /// Agentic request id -> where it was placed.
    pub(crate) requests: FxHashMap<String, Placed>,
    /// `mooncake-delta`: per session, the tokens its next turn's prompt starts with (earlier
    /// deltas and outputs).
    history: Vec<usize>,
    /// See [`Trace::row_sessions`].
    pub(crate) row_sessions: Vec<(u32, String)>,
    /// Dense ids handed out so far.
    next_dense: u32,
    /// Requests numbered so far, for formats with several requests per line.
    requests_numbered: u32,
    /// `dynamo`: the embedded block size, request ids seen and requests read.
    pub(crate) dynamo_block_size: Option<usize>,
    pub(crate) dynamo_ids: rustc_hash::FxHashSet<String>,
    pub(crate) dynamo_requests: Vec<crate::trace::dynamo::DynamoRequest>,
    /// Unknown keys found so far.
    pub(crate) keys: KeyCheck,
}

/// A row's prompt and output, common to every format.
pub(crate) struct RowPrompt {
    pub(crate) ids: Vec<u32>,
    pub(crate) input_length: u32,
    pub(crate) output_length: u32,
}

impl Parser {
    /// The parsed trace.
    pub(crate) fn finish(self) -> Trace {
        Trace {
            format: self.format,
            block_size: self.block_size,
            sessions: self.sessions,
            gates: self.gates,
            path: PathBuf::new(),
            row_sessions: self.row_sessions,
            unknown_keys: self.keys.finish(),
        }
    }

    /// The dense id of a trace's raw hash id.
    pub(crate) fn dense_id(&mut self, raw: u64) -> u32 {
        if raw < DIRECT_IDS {
            let i = raw as usize;
            if i >= self.direct_ids.len() {
                self.direct_ids.resize(i + 1, u32::MAX);
            }
            if self.direct_ids[i] == u32::MAX {
                self.direct_ids[i] = self.fresh_id();
            }
            return self.direct_ids[i];
        }
        match self.ids.get(&raw) {
            Some(&d) => d,
            None => {
                let d = self.fresh_id();
                self.ids.insert(raw, d);
                d
            }
        }
    }

    /// A dense id no raw hash id maps to (a block private to one session).
    pub(crate) fn fresh_id(&mut self) -> u32 {
        self.next_dense += 1;
        self.next_dense - 1
    }

    /// The next request number (from 1), which stands for a line in request ids where a
    /// line holds several requests.
    pub(crate) fn next_request_ordinal(&mut self) -> u32 {
        self.requests_numbered += 1;
        self.requests_numbered
    }

    /// Refuses a long line with an array or object larger than any row needs, before it is
    /// parsed (see [`crate::trace::scan`]).
    fn check_entries(&self, line: usize, text: &str) -> Result<(), TraceError> {
        // A Dynamo record embeds its own block size (possibly 1).
        let bs = if self.format == TraceFormat::Dynamo { 1 } else { self.block_size };
        let ids = MAX_TRACE_TOKENS.div_ceil(bs);
        let max = ids.max(crate::limits::MAX_TURNS);
        match crate::trace::scan::oversized(text, max) {
            None => Ok(()),
            Some(key) => Err(self.err(
                line,
                &key,
                format!(
                    "has more than {max} entries, more than any row needs (a prompt is at most \
                     {MAX_TRACE_TOKENS} tokens: {ids} hash ids of {bs}; a session at most {} turns)",
                    crate::limits::MAX_TURNS
                ),
            )),
        }
    }

    pub(crate) fn err(&self, line: usize, field: &str, message: String) -> TraceError {
        TraceError { path: PathBuf::new(), line, field: field.into(), message }
    }

    fn object(&self, line: usize, text: &str) -> Result<Map<String, Value>, TraceError> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(other) => Err(self.err(line, "row", format!("must be a JSON object (got {other})"))),
            Err(e) => Err(self.err(line, "row", format!("invalid JSON: {e}"))),
        }
    }

    pub(crate) fn number(
        &self,
        row: &Map<String, Value>,
        line: usize,
        names: &[&str],
    ) -> Result<Option<f64>, TraceError> {
        for n in names {
            if let Some(v) = row.get(*n) {
                if v.is_null() {
                    continue;
                }
                // Delays add up along a session; timestamps are absolute.
                let max = if n.starts_with("delay") || *n == "tool_wait_ms" {
                    MAX_DELAY_MS
                } else {
                    MAX_TIMESTAMP_MS
                };
                return match v.as_f64() {
                    Some(x) if time_in_range(x, max) => Ok(Some(x)),
                    _ => Err(self.err(line, n, format!("must be a number in [0, {max:e}] ms (got {v})"))),
                };
            }
        }
        Ok(None)
    }

    pub(crate) fn count(
        &self,
        row: &Map<String, Value>,
        line: usize,
        names: &[&str],
    ) -> Result<Option<u32>, TraceError> {
        for n in names {
            if let Some(v) = row.get(*n) {
                if v.is_null() {
                    continue;
                }
                return match v.as_u64() {
                    Some(x) if x <= u64::from(u32::MAX) => Ok(Some(x as u32)),
                    _ => Err(self.err(line, n, format!("must be a non-negative integer (got {v})"))),
                };
            }
        }
        Ok(None)
    }

    pub(crate) fn key(
        &self,
        row: &Map<String, Value>,
        line: usize,
        name: &str,
    ) -> Result<Option<String>, TraceError> {
        match row.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(v) => Err(self.err(line, name, format!("must be a string or an integer (got {v})"))),
        }
    }

    /// The row's output length, hash ids and input length, checked.
    pub(crate) fn prompt(&mut self, row: &Map<String, Value>, line: usize) -> Result<RowPrompt, TraceError> {
        let output_length = self.count(row, line, &["output_length", "output_tokens"])?.ok_or_else(|| {
            self.err(line, "output_length", format!("trace line {line} is missing output_length"))
        })?;
        self.check_output_length(line, output_length)?;
        let raw_ids = match row.get("hash_ids") {
            Some(Value::Array(a)) => a,
            Some(v) => {
                return Err(self.err(line, "hash_ids", format!("must be a list of integers (got {v})")))
            }
            None => return Err(self.err(line, "hash_ids", format!("trace line {line} is missing hash_ids"))),
        };
        if raw_ids.is_empty() {
            return Err(self.err(line, "hash_ids", "must not be empty".into()));
        }
        let mut ids = Vec::with_capacity(raw_ids.len());
        for v in raw_ids {
            let Some(id) = v.as_u64() else {
                return Err(self.err(line, "hash_ids", format!("must be non-negative integers (got {v})")));
            };
            ids.push(self.dense_id(id));
        }
        let input_length = self.count(row, line, &["input_length", "input_tokens"])?;
        self.checked_prompt(line, ids, input_length, output_length)
    }

    fn check_output_length(&self, line: usize, output_length: u32) -> Result<(), TraceError> {
        if !(1..=MAX_TRACE_TOKENS).contains(&(output_length as usize)) {
            let msg = format!("must be in 1..={MAX_TRACE_TOKENS} (got {output_length})");
            return Err(self.err(line, "output_length", msg));
        }
        Ok(())
    }

    /// The prompt of dense `ids` and the row's input length (the ids' capacity when absent).
    fn checked_prompt(
        &self,
        line: usize,
        ids: Vec<u32>,
        input_length: Option<u32>,
        output_length: u32,
    ) -> Result<RowPrompt, TraceError> {
        let capacity = ids.len().saturating_mul(self.block_size);
        let input_length = match input_length {
            Some(n) if !(1..=MAX_TRACE_TOKENS).contains(&(n as usize)) => {
                let msg = format!("must be in 1..={MAX_TRACE_TOKENS} (got {n})");
                return Err(self.err(line, "input_length", msg));
            }
            Some(n) if n as usize > capacity => {
                return Err(self.err(
                    line,
                    "input_length",
                    format!("trace line {line} input_length {n} exceeds hash_ids capacity {capacity}"),
                ))
            }
            Some(n) => n,
            None if capacity > MAX_TRACE_TOKENS => {
                let msg = format!(
                    "missing, and the {} hash_ids cover {capacity} tokens, above the limit \
                     {MAX_TRACE_TOKENS}; give input_length",
                    ids.len()
                );
                return Err(self.err(line, "input_length", msg));
            }
            None => capacity as u32,
        };
        Ok(RowPrompt { ids, input_length, output_length })
    }

    fn row(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
        match self.format {
            TraceFormat::AppliedComputeAgentic => return self.applied_row(line, row),
            TraceFormat::Dynamo => return self.dynamo_row(line, row),
            _ => {}
        }
        if self.format == TraceFormat::AgenticMooncake {
            return if self.v2 { self.v2_row(line, row) } else { self.legacy_row(line, row) };
        }
        self.keys.check(line, "", row.keys(), keys::MOONCAKE_ROW);
        let timestamp = self.number(row, line, &["timestamp", "created_time"])?;
        let prompt = self.prompt(row, line)?;
        let explicit_delay = self.number(row, line, &["delay", "delay_ms"])?;
        let session_key = self.key(row, line, "session_id")?;
        self.place_row(line, timestamp, prompt, explicit_delay, session_key)
    }

    /// A plain Mooncake row, typed; `false` when a value is out of range, for the generic
    /// path to refuse the row in its words (a refusal ends the parse, so the dense ids this
    /// may have handed out by then are never seen).
    fn plain_row(&mut self, line: usize, row: PlainRow) -> Result<bool, TraceError> {
        let timestamp_ok = row.timestamp.is_none_or(|t| time_in_range(t, MAX_TIMESTAMP_MS));
        if !timestamp_ok
            || row.hash_ids.is_empty()
            || self.check_output_length(line, row.output_length).is_err()
        {
            return Ok(false);
        }
        let ids = row.hash_ids.iter().map(|&id| self.dense_id(id)).collect();
        let Ok(prompt) = self.checked_prompt(line, ids, row.input_length, row.output_length) else {
            return Ok(false);
        };
        self.place_row(line, row.timestamp, prompt, None, None)?;
        Ok(true)
    }

    /// Puts a Mooncake row's turn into its session (a new one without a session key).
    fn place_row(
        &mut self,
        line: usize,
        timestamp: Option<f64>,
        prompt: RowPrompt,
        explicit_delay: Option<f64>,
        session_key: Option<String>,
    ) -> Result<(), TraceError> {
        let RowPrompt { ids, input_length, output_length } = prompt;
        let delay_ms = explicit_delay.unwrap_or(0.0);
        let turn =
            TraceTurn { line: line as u32, ids, input_length, output_length, delay_ms, not_before_ms: None };
        let existing = session_key.as_ref().and_then(|k| self.open.get(k).copied());
        if self.format == TraceFormat::MooncakeDelta {
            // The turn's prompt is the session's history plus this delta, and its output
            // joins the history: bound what replay will synthesise.
            let prior = existing.map_or(0, |(index, _)| self.history[index]);
            let prompt = prior + input_length as usize;
            if prompt > MAX_TRACE_TOKENS {
                let msg = format!(
                    "the session's prompt reaches {prompt} tokens ({prior} of history plus this \
                     row's {input_length}), above the limit {MAX_TRACE_TOKENS}"
                );
                return Err(self.err(line, "input_length", msg));
            }
        }
        let index = match existing {
            Some((index, last_ts)) => {
                let mut turn = turn;
                if explicit_delay.is_none() {
                    turn.delay_ms += self.timestamp_gap(line, timestamp, last_ts)?;
                }
                self.sessions[index].turns.push(turn);
                index
            }
            None => {
                if explicit_delay.is_some_and(|d| d > 0.0) {
                    return Err(self.err(line, "delay", "sets delay on the first turn of a session".into()));
                }
                let index = self.new_session(timestamp, TraceTurn { delay_ms: 0.0, ..turn }, None);
                self.sessions[index].name = match &session_key {
                    Some(k) => SessionName::Key(k.clone()),
                    None => SessionName::Row,
                };
                index
            }
        };
        if self.format == TraceFormat::MooncakeDelta {
            self.history[index] += (input_length + output_length) as usize;
        }
        if let Some(k) = session_key {
            self.open.insert(k, (index, timestamp));
        }
        Ok(())
    }

    /// The delay a session's later row implies by its timestamp (0 without timestamps).
    pub(crate) fn timestamp_gap(
        &self,
        line: usize,
        timestamp: Option<f64>,
        last: Option<f64>,
    ) -> Result<f64, TraceError> {
        match (timestamp, last) {
            (Some(t), Some(prev)) if t < prev => Err(self.err(
                line,
                "timestamp",
                format!("{t} is before the session's previous row ({prev}); give an explicit delay"),
            )),
            (Some(t), Some(prev)) => Ok(t - prev),
            _ => Ok(0.0),
        }
    }

    /// Starts a session with `turn`; returns its index.
    pub(crate) fn new_session(
        &mut self,
        first_arrival_ms: Option<f64>,
        turn: TraceTurn,
        gate: Option<u32>,
    ) -> usize {
        self.sessions.push(TraceSession {
            first_arrival_ms,
            turns: vec![turn],
            gate,
            name: SessionName::Unnamed,
        });
        self.history.push(0);
        self.sessions.len() - 1
    }
}

/// Synthesises `input_length` prompt tokens from dense ids: each id covers `block_size`
/// tokens of one value (`id + 1`, so distinct ids never share a token).
pub fn expand_prompt(ids: &[u32], input_length: usize, block_size: usize, out: &mut Vec<u32>) {
    let mut left = input_length;
    for &id in ids {
        let n = left.min(block_size);
        out.extend(std::iter::repeat_n(id.wrapping_add(1), n));
        left -= n;
        if left == 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        parse_trace(text, TraceFormat::Mooncake, None)
    }

    #[test]
    fn dense_ids_follow_first_sight_across_small_and_large_raw_ids() {
        let (edge, past) = (DIRECT_IDS - 1, DIRECT_IDS);
        let t = parse(&format!(
            "{{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [{past}, 3, {edge}]}}\n\
             {{\"timestamp\": 1, \"output_length\": 1, \"hash_ids\": [3, {edge}, {past}, 0, 3]}}\n"
        ))
        .unwrap();
        assert_eq!(t.sessions[0].turns[0].ids, vec![0, 1, 2]);
        assert_eq!(t.sessions[1].turns[0].ids, vec![1, 2, 0, 3, 1]);
    }

    #[test]
    fn rows_become_sessions_with_dense_ids_and_default_lengths() {
        let t = parse(
            "{\"timestamp\": 5, \"output_length\": 3, \"hash_ids\": [7, 99999999999]}\n\n\
             {\"timestamp\": 9, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [7, 8]}\n",
        )
        .unwrap();
        assert_eq!(t.sessions.len(), 2);
        let (a, b) = (&t.sessions[0].turns[0], &t.sessions[1].turns[0]);
        assert_eq!((a.line, a.ids.clone(), a.input_length), (1, vec![0, 1], 1024));
        assert_eq!((b.line, b.ids.clone(), b.input_length), (3, vec![0, 2], 600));
        assert_eq!(t.sessions[1].first_arrival_ms, Some(9.0));
        let mut toks = Vec::new();
        expand_prompt(&b.ids, 600, 512, &mut toks);
        assert_eq!(toks.len(), 600);
        assert!(toks[..512].iter().all(|&x| x == 1) && toks[512..].iter().all(|&x| x == 3));
    }

    #[test]
    fn sessions_infer_delays_from_timestamps_unless_explicit() {
        let t = parse(
            r#"{"session_id": "s", "timestamp": 100, "output_length": 1, "hash_ids": [1]}
{"session_id": 7, "timestamp": 150, "output_length": 1, "hash_ids": [2]}
{"session_id": "s", "timestamp": 400, "output_length": 1, "hash_ids": [1, 3]}
{"session_id": "s", "timestamp": 900, "delay_ms": 20, "output_length": 1, "hash_ids": [1, 3, 4]}"#,
        )
        .unwrap();
        assert_eq!(t.sessions.len(), 2);
        let d: Vec<f64> = t.sessions[0].turns.iter().map(|t| t.delay_ms).collect();
        assert_eq!(d, vec![0.0, 300.0, 20.0]);
    }

    /// Plain rows read typed give the trace the generic reading gives (forced here by a
    /// known key the plain schema lacks), in both formats that take them.
    #[test]
    fn typed_plain_rows_read_as_generic_rows() {
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let mut plain = String::new();
        let mut generic = String::new();
        for i in 0..300 {
            let ids: Vec<String> = (0..1 + next(6))
                .map(
                    |_| if next(5) == 0 { (DIRECT_IDS + next(50)).to_string() } else { next(40).to_string() },
                )
                .collect();
            let n = ids.len() as u64;
            let input = match next(3) {
                0 => String::new(),
                1 => format!(", \"input_length\": {}", 1 + next(n * 512)),
                _ => ", \"input_length\": null".to_string(),
            };
            let time = if next(4) == 0 { String::new() } else { format!("\"timestamp\": {}.5, ", i * 10) };
            let row = format!(
                "{time}\"output_length\": {}, \"hash_ids\": [{}]{input}",
                1 + next(90),
                ids.join(", ")
            );
            plain += &format!("{{{row}}}\n");
            generic += &format!("{{{row}, \"priority\": 1}}\n");
        }
        for format in [TraceFormat::Mooncake, TraceFormat::MooncakeDelta] {
            let generic = parse_trace(&generic, format, None).unwrap();
            assert_eq!(parse_trace(&plain, format, None).unwrap(), generic, "{format:?}");
            // The typed reader took every row itself (none fell back to the generic one).
            let mut p = Parser { format, block_size: DEFAULT_TRACE_BLOCK_SIZE, ..Parser::default() };
            for (i, line) in plain.lines().enumerate() {
                let row = serde_json::from_str::<PlainRow>(line).unwrap();
                assert!(p.plain_row(i + 1, row).unwrap(), "{format:?} line {}", i + 1);
            }
            assert_eq!(p.finish(), generic, "{format:?}");
        }
    }

    /// A key the format does not know leaves the row as it was (the typed reader hands
    /// such rows to the generic one, which records the key) and is reported once.
    #[test]
    fn unknown_keys_are_recorded_and_change_nothing_else() {
        let plain = "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n\
                     {\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 2]}\n";
        let extra = "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1], \"input_len\": 9}\n\
                     {\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 2], \"input_len\": 9}\n";
        let (plain, mut extra) = (parse(plain).unwrap(), parse(extra).unwrap());
        assert!(plain.unknown_keys.is_empty());
        let keys = std::mem::take(&mut extra.unknown_keys);
        assert_eq!(extra, plain);
        assert_eq!(
            keys.lines(),
            ["1: unknown key \"input_len\" in trace rows (did you mean \"input_length\"?), also on 1 later line"]
        );
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases = [
            ("{\"hash_ids\": [1]}", 1, "output_length", "missing output_length"),
            ("\n{\"output_length\": 2}", 2, "hash_ids", "missing hash_ids"),
            (
                "{\"output_length\": 2, \"hash_ids\": [1], \"input_length\": 513}",
                1,
                "input_length",
                "capacity 512",
            ),
            ("{\"output_length\": 2, \"hash_ids\": []}", 1, "hash_ids", "empty"),
            ("{\"output_length\": -2, \"hash_ids\": [1]}", 1, "output_length", "integer"),
            ("{\"output_length\": 2, \"hash_ids\": [\"x\"]}", 1, "hash_ids", "integers"),
            ("{\"output_length\": 2, \"hash_ids\": [1], \"timestamp\": \"soon\"}", 1, "timestamp", "number"),
            (
                "{\"output_length\": 2, \"hash_ids\": [1], \"delay\": 5, \"session_id\": \"a\"}",
                1,
                "delay",
                "first turn",
            ),
            ("{\"output_length\": 2, \"hash_ids\": [1]}\n{oops", 2, "row", "JSON"),
            ("[1]", 1, "row", "object"),
        ];
        for (text, line, field, needle) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{text}: {e}");
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
        let e = parse_trace("", TraceFormat::Mooncake, Some(0)).unwrap_err();
        assert_eq!(e.field, "trace_block_size");
    }

    /// Lengths and times are bounded per row before anything is allocated from them.
    #[test]
    fn lengths_and_times_out_of_range_name_line_and_field() {
        let row = |extra: &str| format!("{{\"timestamp\": 0, \"hash_ids\": [1]{extra}}}");
        let cases = [
            (row(", \"output_length\": 0"), "output_length", "must be in 1..=16777216 (got 0)"),
            (row(", \"output_length\": 2147483648"), "output_length", "must be in 1..=16777216"),
            (row(", \"output_length\": 16777217"), "output_length", "(got 16777217)"),
            (row(", \"output_length\": 1, \"input_length\": 0"), "input_length", "(got 0)"),
            (row(", \"output_length\": 1, \"input_length\": 4294967295"), "input_length", "1..=16777216"),
            (row(", \"output_length\": 1, \"timestamp\": 1e14"), "timestamp", "[0, 1e13]"),
            (row(", \"output_length\": 1, \"session_id\": 1, \"delay\": 1e11"), "delay", "[0, 1e10]"),
        ];
        for (text, field, needle) in cases {
            let e = parse(&text).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (1, field), "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
        // 40000 ids of 512 tokens: over the limit when the length must come from them.
        let ids = vec!["7"; 40_000].join(",");
        let e =
            parse(&format!("{{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [{ids}]}}")).unwrap_err();
        assert_eq!(e.field, "input_length", "{e}");
        assert!(e.message.contains("give input_length"), "{e}");
        let e = parse_trace("", TraceFormat::Mooncake, Some(usize::MAX)).unwrap_err();
        assert_eq!(e.field, "trace_block_size");
        // The bounds themselves are accepted.
        let ids16 = (0..16).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let ok = format!(
            "{{\"timestamp\": 1e13, \"output_length\": 16777216, \"input_length\": 16777216, \"hash_ids\": [{ids16}]}}"
        );
        assert!(parse_trace(&ok, TraceFormat::Mooncake, Some(1 << 20)).is_ok());
    }

    /// A delta session's prompt is its whole history: bounded as a whole, at the row
    /// that crosses the limit, before the history is ever synthesised.
    #[test]
    fn delta_sessions_are_bounded_by_their_whole_prompt() {
        let half = MAX_TRACE_TOKENS / 2;
        let row = |input: usize| {
            format!(
                "{{\"session_id\": \"s\", \"timestamp\": 0, \"input_length\": {input}, \"output_length\": 10, \"hash_ids\": [1, 2, 3, 4, 5, 6, 7, 8]}}"
            )
        };
        let text = [row(half), row(half - 10), row(1)].join("\n");
        let e = parse_trace(&text, TraceFormat::MooncakeDelta, Some(1 << 20)).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (3, "input_length"), "{e}");
        assert!(e.message.contains("16777227 tokens"), "{e}");
        // Separate sessions each have their own history; plain Mooncake rows do not add up.
        let text = [row(half), row(half - 10)].join("\n");
        assert!(parse_trace(&text, TraceFormat::MooncakeDelta, Some(1 << 20)).is_ok());
        let text = [row(half), row(half), row(half)].join("\n");
        assert!(parse_trace(&text, TraceFormat::Mooncake, Some(1 << 20)).is_ok());
    }

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

    #[test]
    fn format_names_parse_in_both_spellings() {
        assert_eq!(TraceFormat::parse("mooncake_delta"), Some(TraceFormat::MooncakeDelta));
        assert_eq!(TraceFormat::parse("agentic-mooncake"), Some(TraceFormat::AgenticMooncake));
        assert_eq!(TraceFormat::parse("applied_compute_agentic"), Some(TraceFormat::AppliedComputeAgentic));
        assert_eq!(TraceFormat::parse("weka"), Some(TraceFormat::Weka));
        assert_eq!(TraceFormat::parse("sharegpt"), None);
    }
}
