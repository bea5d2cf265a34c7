//! Mooncake and `mooncake-delta` rows: one request a row; rows sharing a `session_id`
//! form a closed-loop session, each later turn following the previous one's completion by
//! its explicit delay or else its timestamp's gap. Rows of the public traces' plain schema
//! are read typed (see [`PlainRow`]); any other row takes the generic path.

use serde_json::{Map, Value};

use crate::trace::keys;
use crate::trace::parser::{time_in_range, Parser, RowPrompt};
use crate::trace::{SessionName, TraceError, TraceFormat, TraceTurn, MAX_TIMESTAMP_MS, MAX_TRACE_TOKENS};

/// A row of the plain Mooncake schema and nothing else (what the public traces hold),
/// read typed: a generic JSON tree (a map of named values, an array of boxed numbers) per
/// row was two thirds of loading a trace. A row with any other key, or a field of another
/// type, fails to parse as this and takes the generic path, which also words every error.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlainRow {
    #[serde(default)]
    timestamp: Option<f64>,
    #[serde(default)]
    input_length: Option<u32>,
    output_length: u32,
    hash_ids: Vec<u64>,
}

impl Parser {
    /// A Mooncake or `mooncake-delta` row the typed reader did not take (another key, a
    /// value of another type or out of range): read generically, which words every error.
    pub(crate) fn mooncake_row(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
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
    pub(crate) fn plain_row(&mut self, line: usize, row: PlainRow) -> Result<bool, TraceError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::load::parse_trace;
    use crate::trace::parser::DIRECT_IDS;
    use crate::trace::{expand_prompt, Trace};

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
            let mut p = Parser::new(format, None);
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
}
