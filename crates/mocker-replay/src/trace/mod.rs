//! Trace files (Mooncake JSONL and its variants) parsed into sessions of turns, and what
//! replays or writes them.
//!
//! A trace row names its prompt by `hash_ids`, one id per `trace_block_size` tokens. Rows
//! are kept in that compact form (ids canonicalised to dense `u32` values, an injective
//! map) until a turn is dispatched; `expand_prompt` then synthesises the tokens the way the
//! reference does (each id repeated over its block, truncated to `input_length`).
//!
//! The files form three layers; a file imports only from its own layer or those below, and
//! no two import each other (`tests/layers.rs` checks both):
//!
//! - common (bottom): this file (the row model: [`Trace`] with its sessions, turns and
//!   gates, [`TraceError`], the bounds of a row's values), `keys` (a row's unknown keys),
//!   `scan` (the size check of long lines), `parser` (the reader all formats share: field
//!   checks, dense ids, new sessions), `plays` (a request graph's plays, which
//!   `--agentic-lanes` schedules, and the models its rows name);
//! - formats: `mooncake` (and `mooncake-delta`), `agentic`, `applied`, `dynamo` and `weka`
//!   (lowered to an agentic request graph, so above `agentic`), each reading its rows into
//!   the shared parser;
//! - entry: `load` (a file or text read in its format: [`load::load_trace`]), `stream` (a
//!   Mooncake file of one-row sessions read as the replay reaches its rows), `source` (a
//!   trace's sessions, prompts synthesised, for the replay), `generator` (synthetic
//!   Mooncake traces).

// common
pub mod keys;
mod parser;
pub mod plays;
mod scan;
// formats
pub mod agentic;
mod applied;
pub mod dynamo;
mod mooncake;
mod weka;
// entry
pub mod generator;
pub mod load;
pub mod source;
pub mod stream;

use std::path::PathBuf;

use crate::trace::keys::UnknownKeys;

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

/// How Weka traces read the `t` of requests nested under a `subagent` marker
/// (`--weka-nested-timestamp-basis`, the reference's `weka_nested_timestamp_basis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NestedTimestampBasis {
    /// Relative when any nested request of the corpus precedes its marker, else absolute.
    #[default]
    Auto,
    /// Nested times are on the trace's clock (one before its marker is an error).
    Absolute,
    /// Nested times are offsets from their marker's `t`.
    Relative,
}

impl NestedTimestampBasis {
    /// Parses a name, spelt exactly as the reference spells it.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "absolute" => Some(Self::Absolute),
            "relative" => Some(Self::Relative),
            _ => None,
        }
    }

    /// The name [`NestedTimestampBasis::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Absolute => "absolute",
            Self::Relative => "relative",
        }
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
    /// Request graphs (agentic Mooncake, Weka): each row's request id, play and model, by
    /// line (ascending); what `--agentic-lanes` and the model projection read (see
    /// [`plays`]). Empty for the session formats.
    pub graph_rows: Vec<GraphRow>,
    /// Weka traces: the basis nested times were read by, as the reference reports it
    /// (`absolute`, `relative`, or `not_applicable` when `auto` found no nested requests).
    pub nested_timestamp_basis: Option<&'static str>,
    /// Set when the trace is replayed as a stream (`stream::scan_for_stream`): `sessions`
    /// is then empty and the rows are read again as the replay reaches them.
    pub stream: Option<std::sync::Arc<TraceStream>>,
}

/// What the first pass over a streamed trace learnt (its rows are not held).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceStream {
    /// Rows (each a one-turn session).
    pub rows: usize,
    /// Prompt tokens of all rows.
    pub prompt_tokens: u64,
    /// Earliest and latest timestamps (ms; the first and last row's when replayed by
    /// timestamp, which needs time order), `None` when some row has none (replayable only
    /// by concurrency).
    pub span_ms: Option<(f64, f64)>,
    /// Rows using each dense hash id, saturating (see `TraceSource`'s private tails).
    pub id_uses: Vec<u8>,
    /// Why reading the rows again failed (the file changed or went since the first pass):
    /// the replay that read them then fails with this instead of reporting part of them.
    pub failure: std::sync::OnceLock<String>,
}

/// The play a request-graph row names: its trajectory, which `--agentic-lanes` runs as a
/// whole on one lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowPlay {
    /// The row's `play_id` (a Weka trace object's own id), with its `source_play_ordinal`
    /// (a Weka trace object's index in the corpus) if it has one.
    Named {
        /// The play's id.
        id: String,
        /// Its place in the source corpus (plays are run in this order when every play
        /// has one).
        ordinal: Option<u64>,
    },
    /// No `play_id` (legacy rows): the play is the row's dependency component, named
    /// `legacy-play:<root request id>` as the reference names it.
    Component,
}

/// One request-graph row's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphRow {
    /// Its line (the request's id in the replay).
    pub line: u32,
    /// The row's `request_id` (`line <n>` when a legacy row has none).
    pub request_id: String,
    /// Its play.
    pub play: RowPlay,
    /// The source model it names (`model`), if any.
    pub model: Option<String>,
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

impl Trace {
    /// Requests (turns) of one copy of the trace.
    pub fn num_turns(&self) -> usize {
        match &self.stream {
            Some(st) => st.rows,
            None => self.sessions.iter().map(|s| s.turns.len()).sum(),
        }
    }

    /// Prompt tokens of one copy of the trace.
    pub fn prompt_tokens(&self) -> u64 {
        match &self.stream {
            Some(st) => st.prompt_tokens,
            None => self.sessions.iter().flat_map(|s| &s.turns).map(|t| u64::from(t.input_length)).sum(),
        }
    }

    /// A [`TraceError`] at `line` of this trace's file.
    pub fn error_at(&self, line: u32, field: &str, message: String) -> TraceError {
        TraceError { path: self.path.clone(), line: line as usize, field: field.into(), message }
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

    #[test]
    fn format_names_parse_in_both_spellings() {
        assert_eq!(TraceFormat::parse("mooncake_delta"), Some(TraceFormat::MooncakeDelta));
        assert_eq!(TraceFormat::parse("agentic-mooncake"), Some(TraceFormat::AgenticMooncake));
        assert_eq!(TraceFormat::parse("applied_compute_agentic"), Some(TraceFormat::AppliedComputeAgentic));
        assert_eq!(TraceFormat::parse("weka"), Some(TraceFormat::Weka));
        assert_eq!(TraceFormat::parse("sharegpt"), None);
    }
}
