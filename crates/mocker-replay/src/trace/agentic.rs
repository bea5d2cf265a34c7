//! Agentic Mooncake rows: request graphs rather than sessions.
//!
//! Two generations. Legacy rows carry `request_id` and `wait_for` (requests that must
//! complete first, then `delay + tool_wait_ms`). v2 files start with a header
//! `{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": N, ...}` and rows carry
//! `not_before_ms` and `dependencies: [{request_id, trigger, delay_ms, relation}]`.
//!
//! A request whose only dependency is the completion of its session's latest turn is
//! appended to that session, so chains replay on the cheap closed-loop path sessions use.
//! Anything else (a join, a dispatch trigger, a fork off an earlier turn) starts a *gated*
//! session whose first turn the driver releases once every dependency has fired.
//! Dependencies must name earlier rows, which also rules out cycles.
//!
//! `hash_id_scope`: `"local"` ids name one block's content; prefix identity comes from the
//! engine chaining block hashes by position, which is what token synthesis gives anyway.
//! `"global"` (position-aware ids, as plain Mooncake) replays identically, so both are read
//! the same way.

use serde_json::{Map, Value};

use crate::trace::keys;
use crate::trace::parser::{Parser, Placed, RowPrompt};
use crate::trace::{
    DepTrigger, GraphRow, RowPlay, TraceDep, TraceError, TraceGate, TraceTurn, MAX_TRACE_BLOCK_SIZE,
};

/// The schema name a v2 header must carry.
pub const V2_SCHEMA: &str = "dynamo.agentic_mooncake";

/// A dependency as read, before it is resolved to a row.
pub(crate) struct RawDep {
    pub(crate) id: String,
    pub(crate) trigger: DepTrigger,
    pub(crate) delay_ms: f64,
}

impl Parser {
    /// Reads a v2 header (the file's first row, which has a `schema` key).
    pub(crate) fn header(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
        self.keys.check(line, "", row.keys(), keys::AGENTIC_V2_HEADER);
        match row.get("schema") {
            Some(Value::String(s)) if s == V2_SCHEMA => {}
            v => {
                return Err(self.err(
                    line,
                    "schema",
                    format!("unknown agentic trace schema {} (expected \"{V2_SCHEMA}\")", show(v)),
                ))
            }
        }
        match row.get("version") {
            Some(v) if v.as_u64() == Some(2) => {}
            v => {
                return Err(self.err(
                    line,
                    "version",
                    format!("unsupported agentic Mooncake version {} (expected 2)", show(v)),
                ))
            }
        }
        match self.count(row, line, &["block_size"])? {
            Some(n) if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&(n as usize)) => {
                let msg = format!("must be in 1..={MAX_TRACE_BLOCK_SIZE} (got {n})");
                return Err(self.err(line, "block_size", msg));
            }
            Some(n) if self.explicit_block_size && n as usize != self.block_size => {
                return Err(self.err(
                    line,
                    "block_size",
                    format!(
                        "the header says {n} but --trace-block-size is {}; drop the flag or make them agree",
                        self.block_size
                    ),
                ))
            }
            Some(n) => self.block_size = n as usize,
            None => {}
        }
        match row.get("hash_id_scope") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "local" || s == "global" => {}
            Some(v) => {
                return Err(self.err(
                    line,
                    "hash_id_scope",
                    format!("must be \"local\" or \"global\" (got {v})"),
                ))
            }
        }
        self.v2 = true;
        Ok(())
    }

    /// A legacy agentic row: `wait_for` requests complete, then `delay + tool_wait_ms`.
    pub(crate) fn legacy_row(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
        self.keys.check(line, "", row.keys(), keys::AGENTIC_LEGACY_ROW);
        if row.contains_key("dependencies") {
            return Err(self.err(
                line,
                "dependencies",
                format!(
                    "v2 rows need a {{\"schema\": \"{V2_SCHEMA}\", \"version\": 2, ...}} header on line 1"
                ),
            ));
        }
        let timestamp = self.number(row, line, &["timestamp", "created_time"])?;
        let prompt = self.prompt(row, line)?;
        let explicit_delay = self.number(row, line, &["delay", "delay_ms"])?;
        let tool_wait = self.number(row, line, &["tool_wait_ms"])?.unwrap_or(0.0);
        let id = self.key(row, line, "request_id")?;
        let waits: Vec<String> = match row.get("wait_for") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|d| match d {
                    Value::String(s) => Ok(s.clone()),
                    Value::Number(n) => Ok(n.to_string()),
                    v => Err(self.err(line, "wait_for", format!("must hold request ids (got {v})"))),
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(self.err(line, "wait_for", format!("must be a list of request ids (got {v})")))
            }
        };
        let deps = match waits.as_slice() {
            [] => Vec::new(),
            [one] => {
                // A chain step keeps the Mooncake rule: without an explicit delay, the
                // timestamp gap to the upstream row.
                let up = self.resolve(line, "wait_for", one)?;
                let gap = match explicit_delay {
                    Some(d) => d,
                    None => self.timestamp_gap(line, timestamp, up.timestamp)?,
                };
                vec![RawDep { id: one.clone(), trigger: DepTrigger::Completion, delay_ms: gap + tool_wait }]
            }
            // A join: ready `delay + tool_wait_ms` after the last of them completes.
            many => many
                .iter()
                .map(|d| RawDep {
                    id: d.clone(),
                    trigger: DepTrigger::Completion,
                    delay_ms: explicit_delay.unwrap_or(0.0) + tool_wait,
                })
                .collect(),
        };
        let arrival = if deps.is_empty() { timestamp } else { None };
        let request_id = id.clone().unwrap_or_else(|| format!("line {line}"));
        self.place(line, "wait_for", id, prompt, deps, arrival, timestamp, None)?;
        // Legacy rows name no play (the reference makes each dependency component one)
        // and no model (the reference calls theirs "unknown").
        self.graph_rows.push(GraphRow {
            line: line as u32,
            request_id,
            play: RowPlay::Component,
            model: Some("unknown".into()),
        });
        Ok(())
    }

    /// A v2 row: ready at `max(not_before_ms, each dependency's trigger + delay_ms)`.
    pub(crate) fn v2_row(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
        self.keys.check(line, "", row.keys(), keys::AGENTIC_V2_ROW);
        let id = self.key(row, line, "request_id")?.ok_or_else(|| {
            self.err(line, "request_id", "agentic Mooncake v2 rows need a request_id".into())
        })?;
        let prompt = self.prompt(row, line)?;
        let not_before = self.number(row, line, &["not_before_ms"])?;
        let deps = match row.get("dependencies") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.iter().map(|d| self.v2_dep(line, d)).collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(self.err(line, "dependencies", format!("must be a list of objects (got {v})")))
            }
        };
        let session_id = self.key(row, line, "session_id")?;
        let play = match self.key(row, line, "play_id")? {
            Some(id) => RowPlay::Named {
                id,
                ordinal: self.count(row, line, &["source_play_ordinal"])?.map(u64::from),
            },
            None => RowPlay::Component,
        };
        let model = self.key(row, line, "model")?;
        self.graph_rows.push(GraphRow { line: line as u32, request_id: id.clone(), play, model });
        self.place(line, "dependencies", Some(id), prompt, deps, not_before, not_before, not_before)?;
        // Records name a request by its own row's session (a gated or chained request
        // sits in a session of mocker's making).
        if let Some(key) = session_id {
            self.row_sessions.push((line as u32, key));
        }
        Ok(())
    }

    fn v2_dep(&mut self, line: usize, d: &Value) -> Result<RawDep, TraceError> {
        let Value::Object(d) = d else {
            return Err(self.err(line, "dependencies", format!("must hold objects (got {d})")));
        };
        self.keys.check(line, "dependencies.", d.keys(), keys::AGENTIC_V2_DEPENDENCY);
        let id = self.key(d, line, "request_id")?.ok_or_else(|| {
            self.err(line, "dependencies.request_id", "each dependency needs a request_id".into())
        })?;
        let trigger = match d.get("trigger") {
            None | Some(Value::Null) => DepTrigger::Completion,
            Some(Value::String(s)) if s == "completion" => DepTrigger::Completion,
            Some(Value::String(s)) if s == "dispatch" => DepTrigger::Dispatch,
            Some(v) => {
                return Err(self.err(
                    line,
                    "dependencies.trigger",
                    format!("must be \"dispatch\" or \"completion\" (got {v})"),
                ))
            }
        };
        let delay_ms = self
            .number(d, line, &["delay_ms"])
            .map_err(|e| TraceError { field: "dependencies.delay_ms".into(), ..e })?
            .unwrap_or(0.0);
        match d.get("relation") {
            None | Some(Value::Null) => {}
            Some(Value::String(s))
                if ["sequence", "spawn", "join", "replay_barrier"].contains(&s.as_str()) => {}
            Some(v) => {
                return Err(self.err(
                    line,
                    "dependencies.relation",
                    format!("must be one of sequence, spawn, join, replay_barrier (got {v})"),
                ))
            }
        }
        Ok(RawDep { id, trigger, delay_ms })
    }

    fn resolve(&self, line: usize, field: &str, id: &str) -> Result<Placed, TraceError> {
        self.requests.get(id).copied().ok_or_else(|| {
            self.err(
                line,
                field,
                format!("depends on request {id:?}, which no earlier row defines (dependencies must refer to earlier rows)"),
            )
        })
    }

    /// Adds a request: a session of its own (a root), the next turn of its upstream's
    /// session (a chain step), or a gated session.
    #[allow(clippy::too_many_arguments)] // one call per generation; a struct would only rename them
    pub(crate) fn place(
        &mut self,
        line: usize,
        field: &str,
        id: Option<String>,
        prompt: RowPrompt,
        deps: Vec<RawDep>,
        arrival: Option<f64>,
        timestamp: Option<f64>,
        not_before: Option<f64>,
    ) -> Result<(), TraceError> {
        if let Some(id) = &id {
            if self.requests.contains_key(id) {
                return Err(self.err(line, "request_id", format!("request {id:?} is defined twice")));
            }
        }
        let RowPrompt { ids, input_length, output_length } = prompt;
        let mut turn = TraceTurn {
            line: line as u32,
            ids,
            input_length,
            output_length,
            delay_ms: 0.0,
            not_before_ms: None,
        };
        let mut resolved = Vec::with_capacity(deps.len());
        for d in &deps {
            resolved.push((self.resolve(line, field, &d.id)?, d));
        }
        let placed = match resolved.as_slice() {
            [] => {
                let session = self.new_session(arrival, turn, None);
                Placed { session, turn: 0, line: line as u32, timestamp }
            }
            [(up, d)]
                if d.trigger == DepTrigger::Completion
                    && self.sessions[up.session].turns.len() == up.turn + 1 =>
            {
                turn.delay_ms = d.delay_ms;
                turn.not_before_ms = not_before;
                let turns = &mut self.sessions[up.session].turns;
                turns.push(turn);
                Placed { session: up.session, turn: turns.len() - 1, line: line as u32, timestamp }
            }
            _ => {
                let deps = resolved
                    .iter()
                    .map(|(up, d)| TraceDep { line: up.line, trigger: d.trigger, delay_ms: d.delay_ms })
                    .collect();
                let gate = self.gates.len() as u32;
                let session = self.new_session(not_before, turn, Some(gate));
                self.gates.push(TraceGate { session: session as u32, deps });
                Placed { session, turn: 0, line: line as u32, timestamp }
            }
        };
        if let Some(id) = id {
            self.requests.insert(id, placed);
        }
        Ok(())
    }
}

fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "(missing)".into(), Value::to_string)
}

#[cfg(test)]
mod tests {
    use crate::trace::load::parse_trace;
    use crate::trace::{DepTrigger, Trace, TraceDep, TraceError, TraceFormat};

    fn parse(text: &str, bs: Option<usize>) -> Result<Trace, TraceError> {
        parse_trace(text, TraceFormat::AgenticMooncake, bs)
    }

    const HEADER: &str = r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16, "hash_id_scope": "local", "source": {"format": "x", "digest": "y"}}"#;

    #[test]
    fn legacy_chains_become_sessions_and_joins_become_gates() {
        let text = r#"{"request_id": "a", "timestamp": 0, "output_length": 1, "hash_ids": [1]}
{"request_id": "b", "wait_for": ["a"], "delay": 5, "tool_wait_ms": 10, "output_length": 1, "hash_ids": [1, 2]}
{"request_id": "c", "timestamp": 3, "output_length": 1, "hash_ids": [9]}
{"request_id": "d", "wait_for": ["b", "c"], "delay": 2, "output_length": 1, "hash_ids": [1]}
{"request_id": "e", "wait_for": ["a"], "output_length": 1, "hash_ids": [1]}"#;
        let t = parse(text, Some(16)).unwrap();
        assert_eq!(t.sessions.len(), 4);
        assert_eq!(t.sessions[0].turns.len(), 2);
        assert_eq!(t.sessions[0].turns[1].delay_ms, 15.0);
        // d joins b and c; e forks off a, which is no longer its session's last turn.
        assert_eq!(t.gates.len(), 2);
        let c = DepTrigger::Completion;
        assert_eq!(
            t.gates[0].deps,
            vec![
                TraceDep { line: 2, trigger: c, delay_ms: 2.0 },
                TraceDep { line: 3, trigger: c, delay_ms: 2.0 }
            ]
        );
        assert_eq!((t.gates[1].session, t.gates[1].deps[0].line), (3, 1));
        assert_eq!(t.sessions[2].gate, Some(0));
    }

    #[test]
    fn v2_header_rows_both_spellings_and_dependency_kinds() {
        let text = format!(
            "{HEADER}\n\
             {{\"request_id\": \"r1\", \"session_id\": \"s\", \"input_length\": 20, \"output_length\": 3, \"hash_ids\": [1, 2], \"not_before_ms\": 100}}\n\
             {{\"request_id\": \"r2\", \"input_tokens\": 8, \"output_tokens\": 2, \"hash_ids\": [5], \"not_before_ms\": 150, \
               \"dependencies\": [{{\"request_id\": \"r1\", \"trigger\": \"completion\", \"delay_ms\": 7, \"relation\": \"sequence\"}}]}}\n\
             {{\"request_id\": \"r3\", \"output_length\": 2, \"hash_ids\": [6], \"not_before_ms\": 100, \
               \"dependencies\": [{{\"request_id\": \"r1\", \"trigger\": \"dispatch\", \"delay_ms\": 4, \"relation\": \"spawn\"}}]}}\n\
             {{\"request_id\": \"r4\", \"output_length\": 2, \"hash_ids\": [7], \"not_before_ms\": 0, \
               \"dependencies\": [{{\"request_id\": \"r2\"}}, {{\"request_id\": \"r3\", \"relation\": \"join\"}}]}}\n"
        );
        let t = parse(&text, None).unwrap();
        assert_eq!(t.block_size, 16, "the header's block size wins over the default");
        assert_eq!(t.sessions.len(), 3);
        let s = &t.sessions[0];
        assert_eq!(s.first_arrival_ms, Some(100.0));
        assert_eq!((s.turns[0].input_length, s.turns[1].input_length, s.turns[1].output_length), (20, 8, 2));
        assert_eq!((s.turns[1].delay_ms, s.turns[1].not_before_ms), (7.0, Some(150.0)));
        assert_eq!(t.gates[0].deps, vec![TraceDep { line: 2, trigger: DepTrigger::Dispatch, delay_ms: 4.0 }]);
        assert_eq!(t.gates[1].deps.iter().map(|d| d.line).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(t.sessions[2].first_arrival_ms, Some(0.0));
        // The same block size given explicitly is fine; the turn's default input length
        // follows the header's block size.
        let t = parse(&text, Some(16)).unwrap();
        assert_eq!(t.sessions[1].turns[0].input_length, 16);
    }

    #[test]
    fn v2_errors_name_line_and_field() {
        let row = r#"{"request_id": "a", "output_length": 1, "hash_ids": [1], "not_before_ms": 0}"#;
        let cases = [
            (r#"{"schema": "other", "version": 2}"#.to_string(), 1, "schema", "unknown agentic trace schema"),
            (r#"{"schema": "dynamo.agentic_mooncake", "version": 3}"#.into(), 1, "version", "version 3"),
            (r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 0}"#.into(), 1, "block_size", "must be in 1..="),
            (
                r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "hash_id_scope": "weird"}"#.into(),
                1,
                "hash_id_scope",
                "local",
            ),
            (format!("{HEADER}\n{{\"output_length\": 1, \"hash_ids\": [1]}}"), 2, "request_id", "need a request_id"),
            (
                format!("{HEADER}\n{row}\n{{\"request_id\": \"b\", \"output_length\": 1, \"hash_ids\": [1], \"dependencies\": [{{\"request_id\": \"zz\"}}]}}"),
                3,
                "dependencies",
                "\"zz\"",
            ),
            (
                format!("{HEADER}\n{{\"request_id\": \"a\", \"output_length\": 1, \"hash_ids\": [1], \"dependencies\": [{{\"request_id\": \"a\"}}]}}"),
                2,
                "dependencies",
                "earlier rows",
            ),
            (
                format!("{HEADER}\n{row}\n{{\"request_id\": \"b\", \"output_length\": 1, \"hash_ids\": [1], \"dependencies\": [{{\"request_id\": \"a\", \"trigger\": \"later\"}}]}}"),
                3,
                "dependencies.trigger",
                "dispatch",
            ),
            (
                format!("{HEADER}\n{row}\n{{\"request_id\": \"b\", \"output_length\": 1, \"hash_ids\": [1], \"dependencies\": [{{\"request_id\": \"a\", \"delay_ms\": -1}}]}}"),
                3,
                "dependencies.delay_ms",
                "number",
            ),
            (format!("{HEADER}\n{row}\n{row}"), 3, "request_id", "twice"),
            (format!("{HEADER}\n{{\"request_id\": \"a\", \"hash_ids\": [1]}}"), 2, "output_length", "missing"),
            (
                r#"{"request_id": "a", "output_length": 1, "hash_ids": [1], "dependencies": []}"#.into(),
                1,
                "dependencies",
                "header",
            ),
            (
                format!("{row}\n{{\"request_id\": \"b\", \"wait_for\": [\"a\", \"q\"], \"output_length\": 1, \"hash_ids\": [1]}}"),
                2,
                "wait_for",
                "\"q\"",
            ),
        ];
        for (text, line, field, needle) in cases {
            let e = parse(&text, None).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{text}: {e}");
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
        let e = parse(HEADER, Some(512)).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (1, "block_size"));
        assert!(e.message.contains("16") && e.message.contains("512"), "{e}");
    }
}
