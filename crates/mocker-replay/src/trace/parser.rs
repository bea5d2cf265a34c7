//! The reader all trace formats share. A [`Parser`] holds what a parse has built so far
//! (sessions, gates, dense ids, each format's pending state) and checks the fields rows
//! have in common. Each format adds the reading of its own rows in an `impl Parser` of its
//! own file, so this file names no format's reader; `load`, above them all, picks one.

use std::path::PathBuf;

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

use crate::trace::keys::KeyCheck;
use crate::trace::{
    GraphRow, SessionName, Trace, TraceError, TraceFormat, TraceGate, TraceSession, TraceTurn,
    DEFAULT_TRACE_BLOCK_SIZE, MAX_DELAY_MS, MAX_TIMESTAMP_MS, MAX_TRACE_TOKENS,
};

/// Whether a time or delay of `x` ms is one a row may give (`max`: the field's bound).
pub(crate) fn time_in_range(x: f64, max: f64) -> bool {
    x.is_finite() && (0.0..=max).contains(&x)
}

/// Raw hash ids below this map to dense ids through a vector (4 MiB) from the start; the
/// vector's range then grows while the ids stay dense (see [`Parser::dense_id`]).
pub(crate) const DIRECT_IDS: u64 = 1 << 20;

/// Where an agentic request sits: its session and turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placed {
    pub(crate) session: usize,
    pub(crate) turn: usize,
    pub(crate) line: u32,
    /// The row's timestamp (legacy chain steps infer their delay from it).
    pub(crate) timestamp: Option<f64>,
}

/// A trace being parsed: what its rows have built so far, and what each format keeps
/// between rows.
#[derive(Default)]
pub(crate) struct Parser {
    pub(crate) format: TraceFormat,
    pub(crate) block_size: usize,
    /// `block_size` came from `--trace-block-size`: a file's own must agree with it.
    pub(crate) explicit_block_size: bool,
    /// A v2 header was read: rows use the v2 schema.
    pub(crate) v2: bool,
    /// Dense ids of raw ids below `direct_bound`, by raw id (`u32::MAX`: none yet).
    /// Mooncake traces number their blocks from 0, so a vector indexed by raw id replaces
    /// a hash map that, grown to a hundred thousand entries, cost a few ms of probes and
    /// page faults in every load, and at ten million entries 200 MB (the vector: 40 MB).
    direct_ids: Vec<u32>,
    /// The vector's range beyond [`DIRECT_IDS`] (0: not widened), doubled while ids stay
    /// dense.
    direct_bound: u64,
    /// Dense ids of larger raw ids.
    ids: FxHashMap<u64, u32>,
    pub(crate) sessions: Vec<TraceSession>,
    pub(crate) gates: Vec<TraceGate>,
    /// Session key -> (index in `sessions`, timestamp of its last row).
    pub(crate) open: FxHashMap<String, (usize, Option<f64>)>,
    /// Agentic request id -> where it was placed.
    pub(crate) requests: FxHashMap<String, Placed>,
    /// `mooncake-delta`: per session, the tokens its next turn's prompt starts with (earlier
    /// deltas and outputs).
    pub(crate) history: Vec<usize>,
    /// See [`Trace::row_sessions`].
    pub(crate) row_sessions: Vec<(u32, String)>,
    /// See [`Trace::graph_rows`].
    pub(crate) graph_rows: Vec<GraphRow>,
    /// Dense ids handed out so far.
    next_dense: u32,
    /// Requests numbered so far, for formats with several requests per line.
    requests_numbered: u32,
    /// `dynamo`: the embedded block size, request ids seen and requests read.
    pub(crate) dynamo_block_size: Option<usize>,
    pub(crate) dynamo_ids: rustc_hash::FxHashSet<String>,
    pub(crate) dynamo_requests: Vec<DynamoRequest>,
    /// Unknown keys found so far.
    pub(crate) keys: KeyCheck,
    /// Hash ids are used as they are (a streamed trace: no map of every id is kept, see
    /// `stream`); `max_raw` is then the largest seen, for the stream to bound them.
    pub(crate) raw_ids: bool,
    pub(crate) max_raw: u64,
}

/// A row's prompt and output, common to every format.
pub(crate) struct RowPrompt {
    pub(crate) ids: Vec<u32>,
    pub(crate) input_length: u32,
    pub(crate) output_length: u32,
}

/// A Dynamo request as read, before the file is sorted.
pub(crate) struct DynamoRequest {
    pub(crate) start_ms: f64,
    pub(crate) end_ms: f64,
    pub(crate) id: String,
    pub(crate) line: u32,
    pub(crate) prompt: RowPrompt,
}

impl Parser {
    /// A parser of `format`'s rows; `block_size` is the explicit `--trace-block-size`, if
    /// given (what a file says must then agree with it).
    pub(crate) fn new(format: TraceFormat, block_size: Option<usize>) -> Self {
        Parser {
            format,
            block_size: block_size.unwrap_or(DEFAULT_TRACE_BLOCK_SIZE),
            explicit_block_size: block_size.is_some(),
            ..Parser::default()
        }
    }

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
            graph_rows: self.graph_rows,
            nested_timestamp_basis: None,
            stream: None,
        }
    }

    /// The dense id of a trace's raw hash id.
    pub(crate) fn dense_id(&mut self, raw: u64) -> u32 {
        if self.raw_ids {
            // Any injective map gives the replay the same prompts up to renaming; the
            // stream refuses raw ids that do not fit (`stream::MAX_RAW_ID`).
            self.max_raw = self.max_raw.max(raw);
            return raw.min(u64::from(u32::MAX - 1)) as u32;
        }
        if raw >= self.direct_bound() {
            self.widen_direct(raw);
        }
        if raw < self.direct_bound() {
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

    /// The vector's range (a parser made by `Default` starts at [`DIRECT_IDS`] too).
    #[inline]
    fn direct_bound(&self) -> u64 {
        self.direct_bound.max(DIRECT_IDS)
    }

    /// Widens the vector's range to cover `raw` if it then holds at most two slots per id
    /// handed out (so it never costs more than the map would), moving the map's entries
    /// it now covers into it: a raw id is always found where it was put.
    fn widen_direct(&mut self, raw: u64) {
        let Some(bound) = raw.checked_add(1).and_then(u64::checked_next_power_of_two) else { return };
        if bound > 2 * (u64::from(self.next_dense) + 1) {
            return;
        }
        self.direct_bound = bound;
        let direct = &mut self.direct_ids;
        self.ids.retain(|&r, &mut d| {
            if r >= bound {
                return true;
            }
            let i = r as usize;
            if i >= direct.len() {
                direct.resize(i + 1, u32::MAX);
            }
            direct[i] = d;
            false
        });
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
    pub(crate) fn check_entries(&self, line: usize, text: &str) -> Result<(), TraceError> {
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

    /// An error at `line`, without a path: `load_trace` adds the file.
    pub(crate) fn err(&self, line: usize, field: &str, message: String) -> TraceError {
        TraceError { path: PathBuf::new(), line, field: field.into(), message }
    }

    /// The row as a JSON object, for the formats that read it generically.
    pub(crate) fn object(&self, line: usize, text: &str) -> Result<Map<String, Value>, TraceError> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(other) => Err(self.err(line, "row", format!("must be a JSON object (got {other})"))),
            Err(e) => Err(self.err(line, "row", format!("invalid JSON: {e}"))),
        }
    }

    /// A time or delay (ms): the first of the spellings `names` the row gives (null counts
    /// as absent), within its field's bound.
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

    /// A length or count: the first of the spellings `names` the row gives (null counts as
    /// absent), a non-negative integer that fits a `u32`.
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

    /// An id (`session_id`, `request_id`): a string, or an integer read as its digits.
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

    /// Refuses an output length out of range; the typed Mooncake reading shares it.
    pub(crate) fn check_output_length(&self, line: usize, output_length: u32) -> Result<(), TraceError> {
        if !(1..=MAX_TRACE_TOKENS).contains(&(output_length as usize)) {
            let msg = format!("must be in 1..={MAX_TRACE_TOKENS} (got {output_length})");
            return Err(self.err(line, "output_length", msg));
        }
        Ok(())
    }

    /// The prompt of dense `ids` and the row's input length (the ids' capacity when absent).
    pub(crate) fn checked_prompt(
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
    /// Takes back the session the last row made, when that row was a session of its own
    /// (no session is open by key): a streamed trace hands rows out instead of keeping
    /// them. `None` when it made none or sessions are keyed.
    pub(crate) fn take_row_session(&mut self) -> Option<TraceSession> {
        if !self.open.is_empty() {
            return None;
        }
        self.history.pop();
        self.sessions.pop()
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw ids first seen while sparse go to the map; once the ids are dense enough the
    /// vector's range grows over them and each raw id keeps the dense id it was given.
    #[test]
    fn widening_the_direct_range_keeps_every_raw_ids_dense_id() {
        let mut p = Parser::new(TraceFormat::Mooncake, None);
        let late = [DIRECT_IDS + 5, 3 * DIRECT_IDS, u64::MAX - 1];
        let first: Vec<u32> = late.iter().map(|&r| p.dense_id(r)).collect();
        assert_eq!(first, vec![0, 1, 2]);
        assert_eq!(p.direct_bound(), DIRECT_IDS, "three ids do not make a dense range");
        let dense: Vec<u32> = (0..4 * DIRECT_IDS).map(|r| p.dense_id(r)).collect();
        assert!(p.direct_bound() >= 4 * DIRECT_IDS, "sequential ids widen the range");
        assert_eq!(p.ids.len(), 1, "only the sparse id stays in the map");
        // Every id, either side of the widening, still has the id it was first given.
        assert_eq!(late.iter().map(|&r| p.dense_id(r)).collect::<Vec<_>>(), first);
        let again: Vec<u32> = (0..4 * DIRECT_IDS).map(|r| p.dense_id(r)).collect();
        assert_eq!(again, dense);
        let mut sorted = dense.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), dense.len(), "injective");
        // The two late ids inside the swept range kept theirs (from the map, then the vector).
        assert_eq!(dense[(DIRECT_IDS + 5) as usize], first[0]);
        assert_eq!(dense[(3 * DIRECT_IDS) as usize], first[1]);
    }
}
