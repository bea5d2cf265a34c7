//! Keys of trace rows mocker does not know: collected once per key and file (first line,
//! later lines counted) so a typo such as `input_len` is reported instead of silently
//! ignored, with the known key it is probably meant to be.
//!
//! The known keys of each object are those the format's parsers read plus those the
//! reference (Dynamo's mocker) accepts and ignores, so a trace the reference writes or
//! reads never draws a warning. This module depends on no trace parser; they call it.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

/// Legacy agentic Mooncake rows: Mooncake rows (the first [`MOONCAKE_KEYS`] keys) plus the
/// workflow fields.
pub const AGENTIC_LEGACY_ROW: &[&str] = &[
    "timestamp",
    "created_time",
    "input_length",
    "input_tokens",
    "output_length",
    "output_tokens",
    "hash_ids",
    "session_id",
    "delay",
    "delay_ms",
    "request_id",
    "output_token_ids",
    "priority",
    "strict_priority",
    "policy_class",
    "wait_for",
    "branches",
    "prefix_reset",
    "tool_wait_ms",
    "tool_events",
];

/// How many of [`AGENTIC_LEGACY_ROW`]'s keys a plain Mooncake row has.
const MOONCAKE_KEYS: usize = 15;

/// Mooncake and `mooncake-delta` rows (aliases and the newer schema's extras included).
pub const MOONCAKE_ROW: &[&str] = AGENTIC_LEGACY_ROW.split_at(MOONCAKE_KEYS).0;

/// The header of an agentic Mooncake v2 file.
pub const AGENTIC_V2_HEADER: &[&str] = &["schema", "version", "block_size", "hash_id_scope", "source"];

/// Agentic Mooncake v2 rows.
pub const AGENTIC_V2_ROW: &[&str] = &[
    "request_id",
    "play_id",
    "source_play_ordinal",
    "session_id",
    "model",
    "input_length",
    "input_tokens",
    "output_length",
    "output_tokens",
    "output_token_ids",
    "hash_ids",
    "not_before_ms",
    "recorded_api_time_ms",
    "priority",
    "strict_priority",
    "policy_class",
    "dependencies",
];

/// One entry of a v2 row's `dependencies`.
pub const AGENTIC_V2_DEPENDENCY: &[&str] = &["request_id", "trigger", "delay_ms", "relation"];

/// `applied_compute_agentic` lines.
pub const APPLIED_ROW: &[&str] = &[
    "num_turns",
    "input_prompt_length",
    "assistant_response_length",
    "tool_call_output_length",
    "tool_call_latency",
    "final_assistant_response_length",
];

/// A Dynamo request-trace record (bare, or the `event` of a wrapper).
pub const DYNAMO_RECORD: &[&str] = &[
    "schema",
    "event_type",
    "event_time_unix_ms",
    "event_source",
    "agent_context",
    "request",
    "tool",
    "payload",
];

/// The `request` object of a Dynamo `request_end` record.
pub const DYNAMO_REQUEST: &[&str] = &[
    "request_id",
    "x_request_id",
    "model",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "request_received_ms",
    "prefill_wait_time_ms",
    "prefill_time_ms",
    "ttft_ms",
    "total_time_ms",
    "avg_itl_ms",
    "kv_hit_rate",
    "kv_transfer_estimated_latency_ms",
    "queue_depth",
    "worker",
    "replay",
    "finish_reason_metadata",
];

/// The `request.replay` object of a Dynamo `request_end` record.
pub const DYNAMO_REPLAY: &[&str] =
    &["trace_block_size", "input_length", "input_sequence_hashes", "completion_sequence_hashes"];

/// A Weka trace object.
pub const WEKA_TRACE: &[&str] =
    &["id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens", "requests", "totals"];

/// A Weka request (`type` `n` or `s`).
pub const WEKA_REQUEST: &[&str] = &[
    "type",
    "t",
    "model",
    "in",
    "out",
    "hash_ids",
    "input_types",
    "output_types",
    "stop",
    "api_time",
    "think_time",
    "ttft",
];

/// A Weka `subagent` entry.
pub const WEKA_SUBAGENT: &[&str] = &[
    "type",
    "t",
    "agent_id",
    "subagent_type",
    "duration_ms",
    "total_tokens",
    "tool_use_count",
    "status",
    "requests",
    "models",
    "tool_tokens",
    "system_tokens",
];

/// Spellings of one field (the first is the one errors name).
const ALIASES: &[&[&str]] = &[
    &["input_length", "input_tokens"],
    &["output_length", "output_tokens"],
    &["timestamp", "created_time"],
    &["delay", "delay_ms"],
];

/// Distinct unknown keys reported per trace; the rest are only counted, so a trace whose
/// keys are data (ids as keys) cannot flood the terminal.
pub const MAX_REPORTED_KEYS: usize = 20;

/// One unknown key: where it first appears and what it is probably meant to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// The trace file (empty for parsed text).
    pub path: PathBuf,
    /// 1-based line of the first row that has it.
    pub line: usize,
    /// The key, with the path of its object (`request.replay.input_len`).
    pub key: String,
    /// The known key it is close to, with the same object path.
    pub suggestion: Option<String>,
    /// Later lines that have it too.
    pub later_lines: usize,
}

impl fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.as_os_str().is_empty() {
            write!(f, "{}:", self.path.display())?;
        }
        write!(f, "{}: unknown key {:?} in trace rows", self.line, self.key)?;
        if let Some(s) = &self.suggestion {
            write!(f, " (did you mean {s:?}?)")?;
        }
        match self.later_lines {
            0 => Ok(()),
            1 => write!(f, ", also on 1 later line"),
            n => write!(f, ", also on {n} later lines"),
        }
    }
}

/// The unknown keys of a trace, in order of first appearance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnknownKeys {
    /// Reported keys (at most [`MAX_REPORTED_KEYS`]).
    pub keys: Vec<UnknownKey>,
    /// Distinct unknown keys past that limit.
    pub unreported: usize,
}

impl UnknownKeys {
    /// Whether the trace has no unknown key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.unreported == 0
    }

    /// One line per key (and one for the keys past the limit), in order of appearance.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.keys.iter().map(ToString::to_string).collect();
        if self.unreported > 0 {
            out.push(format!("{} more unknown keys in trace rows", self.unreported));
        }
        out
    }

    /// Sets the file the keys found so far (and all later ones) were read from, where it
    /// was not known while parsing.
    pub fn set_path(&mut self, path: &std::path::Path) {
        for k in &mut self.keys {
            if k.path.as_os_str().is_empty() {
                k.path = path.to_path_buf();
            }
        }
    }
}

/// Collects the unknown keys of a trace while its parser reads it.
#[derive(Debug, Default)]
pub(crate) struct KeyCheck {
    found: UnknownKeys,
    /// File of the keys being found now (empty for parsed text).
    path: PathBuf,
    /// Index in `found.keys` by key, for the current file (`usize::MAX`: past the limit).
    index: HashMap<String, usize>,
    /// The last line each reported key was seen on, by index in `found.keys`.
    last: Vec<usize>,
    /// The line being read and its unknown keys (indices in `found.keys`), for errors
    /// about that line.
    line: usize,
    on_line: Vec<usize>,
    /// Reused for the path-qualified key, so a key seen before costs one lookup.
    full: String,
}

impl KeyCheck {
    /// Starts a file: keys are reported once per file.
    pub(crate) fn set_file(&mut self, path: PathBuf) {
        self.path = path;
        self.index.clear();
        self.line = 0;
        self.on_line.clear();
    }

    /// Checks the keys of one object of line `line` against `known`; `prefix` is where the
    /// object sits (`""` for a row, `"request."` for a nested one).
    pub(crate) fn check<'k>(
        &mut self,
        line: usize,
        prefix: &str,
        keys: impl IntoIterator<Item = &'k String>,
        known: &[&str],
    ) {
        if line != self.line {
            self.line = line;
            self.on_line.clear();
        }
        for key in keys {
            if known.contains(&key.as_str()) {
                continue;
            }
            self.unknown(line, prefix, key, known);
        }
    }

    /// A key of a million-row trace may be unknown on every row: after its first sighting
    /// it costs a lookup, and the suggestion is computed once.
    fn unknown(&mut self, line: usize, prefix: &str, key: &str, known: &[&str]) {
        self.full.clear();
        self.full.push_str(prefix);
        self.full.push_str(key);
        match self.index.get(self.full.as_str()) {
            Some(&usize::MAX) => {}
            Some(&i) => {
                if !self.on_line.contains(&i) {
                    self.on_line.push(i);
                }
                // Counted per line: a Weka line holds many objects.
                if self.last[i] != line {
                    self.found.keys[i].later_lines += 1;
                    self.last[i] = line;
                }
            }
            None if self.found.keys.len() >= MAX_REPORTED_KEYS => {
                self.found.unreported += 1;
                self.index.insert(self.full.clone(), usize::MAX);
            }
            None => {
                let i = self.found.keys.len();
                self.index.insert(self.full.clone(), i);
                self.found.keys.push(UnknownKey {
                    path: self.path.clone(),
                    line,
                    key: self.full.clone(),
                    suggestion: suggest(key, known).map(|s| format!("{prefix}{s}")),
                    later_lines: 0,
                });
                self.last.push(line);
                self.on_line.push(i);
            }
        }
    }

    /// What an error about `field` on line `line` should add: the line's unknown keys
    /// that look meant for that field.
    pub(crate) fn note(&self, line: usize, field: &str) -> Option<String> {
        if line != self.line {
            return None;
        }
        let meant: Vec<String> = self
            .on_line
            .iter()
            .map(|&i| &self.found.keys[i])
            .filter_map(|k| Some((&k.key, k.suggestion.as_deref()?)))
            .filter(|(_, s)| same_field(s, field))
            .map(|(k, s)| format!("{k:?}: did you mean {s:?}?"))
            .collect();
        match meant.as_slice() {
            [] => None,
            [one] => Some(format!(" (the row has unknown key {one})")),
            many => Some(format!(" (the row has unknown keys {})", many.join("; "))),
        }
    }

    /// The keys found.
    pub(crate) fn finish(self) -> UnknownKeys {
        self.found
    }
}

/// Whether `a` and `b` name one field (equal, or aliases; object paths must agree, list
/// indices aside: `requests[3].in` is a `requests[].in`).
fn same_field(a: &str, b: &str) -> bool {
    let split = |s: &str| {
        let (p, k) = s.rsplit_once('.').unwrap_or(("", s));
        let mut path = String::with_capacity(p.len());
        let mut in_index = false;
        for c in p.chars() {
            match c {
                '[' => in_index = true,
                ']' => {
                    in_index = false;
                    path += "[]";
                }
                _ if in_index => {}
                _ => path.push(c),
            }
        }
        (path, k.to_string())
    };
    let ((pa, ka), (pb, kb)) = (split(a), split(b));
    pa == pb && (ka == kb || ALIASES.iter().any(|g| g.contains(&ka.as_str()) && g.contains(&kb.as_str())))
}

/// The known key `key` is probably a misspelling of: one it is a prefix of (or that is a
/// prefix of it, `input_len` / `timestamp_ms`) of at least half its length, else the nearest within an edit distance of
/// a third of its length (at least 1). Ties go to the earlier known key.
pub fn suggest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let lower = key.to_ascii_lowercase();
    let prefix = |k: &str| {
        let (short, long) = if lower.len() <= k.len() { (lower.as_str(), k) } else { (k, lower.as_str()) };
        short.len() >= 4 && 2 * short.len() >= long.len() && long.starts_with(short)
    };
    if let Some(k) = known.iter().find(|k| prefix(k)) {
        return Some(k);
    }
    let limit = (lower.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&lower, k), *k))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_rows_are_the_legacy_agentic_rows_without_the_workflow_fields() {
        assert_eq!(MOONCAKE_ROW.last(), Some(&"policy_class"));
        assert_eq!(AGENTIC_LEGACY_ROW[MOONCAKE_KEYS], "wait_for");
    }

    #[test]
    fn suggestions_cover_prefixes_typos_and_case_and_stay_quiet_otherwise() {
        let cases = [
            ("input_len", Some("input_length")),
            ("output_len", Some("output_length")),
            ("timestamp_ms", Some("timestamp")),
            ("hashids", Some("hash_ids")),
            ("hash_id", Some("hash_ids")),
            ("Output_Length", Some("output_length")),
            ("sesion_id", Some("session_id")),
            ("note", None),
            ("text_input", None),
            ("x", None),
        ];
        for (key, want) in cases {
            assert_eq!(suggest(key, MOONCAKE_ROW), want, "{key}");
        }
        // Short known keys do not swallow longer unknown ones.
        assert_eq!(suggest("input", WEKA_REQUEST), None);
        assert_eq!(suggest("outt", WEKA_REQUEST), Some("out"));
    }

    #[test]
    fn keys_are_reported_once_per_file_with_their_first_line_and_later_lines() {
        let mut c = KeyCheck::default();
        let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        c.check(1, "", &keys(&["hash_ids", "input_len"]), MOONCAKE_ROW);
        c.check(2, "", &keys(&["note"]), MOONCAKE_ROW);
        c.check(3, "", &keys(&["input_len", "note"]), MOONCAKE_ROW);
        c.check(3, "request.", &keys(&["note"]), MOONCAKE_ROW);
        c.check(4, "", &keys(&["input_len"]), MOONCAKE_ROW);
        assert_eq!(
            c.note(4, "input_length").as_deref(),
            Some(" (the row has unknown key \"input_len\": did you mean \"input_length\"?)")
        );
        assert_eq!(c.note(4, "output_length"), None);
        assert_eq!(c.note(3, "input_length"), None, "only the line being read");
        c.set_file(PathBuf::from("b.jsonl"));
        c.check(1, "", &keys(&["note"]), MOONCAKE_ROW);
        let found = c.finish();
        let lines = found.lines();
        assert_eq!(
            lines,
            [
                "1: unknown key \"input_len\" in trace rows (did you mean \"input_length\"?), also on 2 later lines",
                "2: unknown key \"note\" in trace rows, also on 1 later line",
                "3: unknown key \"request.note\" in trace rows",
                "b.jsonl:1: unknown key \"note\" in trace rows",
            ]
        );
    }

    #[test]
    fn aliases_match_in_notes_and_object_paths_must_agree() {
        assert!(same_field("output_tokens", "output_length"));
        assert!(same_field("request.output_tokens", "request.output_tokens"));
        assert!(!same_field("request.output_tokens", "output_tokens"));
        assert!(!same_field("input_length", "output_length"));
        assert!(same_field("requests[].requests[].in", "requests[3].requests[0].in"));
        assert!(!same_field("requests[].in", "requests[3].requests[0].in"));
    }

    #[test]
    fn distinct_keys_past_the_limit_are_counted_not_listed() {
        let mut c = KeyCheck::default();
        for i in 0..MAX_REPORTED_KEYS + 5 {
            c.check(i + 1, "", &[format!("k{i}")], MOONCAKE_ROW);
            c.check(i + 1, "", &[format!("k{i}")], MOONCAKE_ROW);
        }
        let found = c.finish();
        assert_eq!(found.keys.len(), MAX_REPORTED_KEYS);
        assert_eq!(found.unreported, 5);
        assert_eq!(found.lines().last().unwrap(), "5 more unknown keys in trace rows");
    }
}
