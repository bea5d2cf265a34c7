//! `dynamo` traces: the request traces Dynamo's serving instrumentation writes
//! (`dynamo.request.trace.v1`), one record per line, bare or wrapped as `{"event": {...}}`.
//!
//! Each `request_end` record becomes a session-less request: it arrives at its
//! `request_received_ms` (else the event time minus `total_time_ms`), with the prompt its
//! `replay` block describes (`input_length`, `input_sequence_hashes` over blocks of the
//! embedded `trace_block_size`) and `output_tokens` to generate. Requests are ordered by
//! (start, end, request id), as the reference lowers them. `request_payload` and
//! `tool_start` records are skipped, and tool end records only matter to agentic traces
//! (records with `agent_context`), which mocker refuses rather than replay them wrongly.

use serde_json::{Map, Value};

use crate::trace::keys;
use crate::trace::parser::{DynamoRequest, Parser, RowPrompt};
use crate::trace::{SessionName, TraceError, TraceTurn, MAX_TIMESTAMP_MS};

/// The schema a record must carry.
pub const DYNAMO_SCHEMA: &str = "dynamo.request.trace.v1";

impl Parser {
    /// One record of a Dynamo request trace.
    pub(crate) fn dynamo_row(&mut self, line: usize, outer: &Map<String, Value>) -> Result<(), TraceError> {
        let row = match outer.get("event") {
            Some(Value::Object(e)) => e,
            _ => outer,
        };
        // A wrapper's own keys are its sink's business; the record's are the schema's.
        self.keys.check(line, "", row.keys(), keys::DYNAMO_RECORD);
        let kind = match row.get("event_type") {
            Some(Value::String(s)) => s.as_str(),
            v => {
                let got = v.map_or("(missing)".to_string(), Value::to_string);
                return Err(self.err(line, "event_type", format!("must be a string (got {got})")));
            }
        };
        match kind {
            "request_payload" | "tool_start" => return Ok(()),
            "request_end" | "tool_end" | "tool_error" => {}
            other => {
                let msg = format!(
                    "must be request_end, tool_end, tool_error, request_payload or tool_start (got {other:?})"
                );
                return Err(self.err(line, "event_type", msg));
            }
        }
        match row.get("schema") {
            Some(Value::String(s)) if s == DYNAMO_SCHEMA => {}
            v => {
                let got = v.map_or("(missing)".to_string(), Value::to_string);
                return Err(self.err(line, "schema", format!("must be \"{DYNAMO_SCHEMA}\" (got {got})")));
            }
        }
        if row.get("agent_context").is_some_and(|v| !v.is_null()) {
            return Err(self.err(
                line,
                "agent_context",
                "agentic Dynamo request traces (sessions and tool calls) are not supported; \
                 replay traces without agent_context"
                    .into(),
            ));
        }
        if kind != "request_end" {
            // Tool events only shape agentic traces.
            return Ok(());
        }
        if let Some(Value::Object(request)) = row.get("request") {
            self.keys.check(line, "request.", request.keys(), keys::DYNAMO_REQUEST);
            if let Some(Value::Object(replay)) = request.get("replay") {
                self.keys.check(line, "request.replay.", replay.keys(), keys::DYNAMO_REPLAY);
            }
        }
        let event_ms = self
            .number(row, line, &["event_time_unix_ms"])?
            .ok_or_else(|| self.err(line, "event_time_unix_ms", "missing".into()))?;
        let Some(Value::Object(request)) = row.get("request") else {
            return Err(self.err(line, "request", "request_end needs a request object".into()));
        };
        let nest = |e: TraceError, prefix: &str| TraceError { field: format!("{prefix}.{}", e.field), ..e };
        let id = match self.key(request, line, "request_id").map_err(|e| nest(e, "request"))? {
            Some(id) if !id.trim().is_empty() => id,
            _ => return Err(self.err(line, "request.request_id", "must be a non-empty string".into())),
        };
        if self.dynamo_ids.contains(&id) {
            return Err(self.err(line, "request.request_id", format!("duplicate request_id {id:?}")));
        }
        let total_ms = self.number(request, line, &["total_time_ms"]).map_err(|e| nest(e, "request"))?;
        let received =
            self.number(request, line, &["request_received_ms"]).map_err(|e| nest(e, "request"))?;
        // Whole milliseconds, as the reference reads them.
        let total_ms = total_ms.map(f64::round);
        let end_ms = match (received, total_ms) {
            (Some(start), Some(total)) => (start + total).min(MAX_TIMESTAMP_MS),
            _ => event_ms,
        };
        let start_ms = received.unwrap_or_else(|| (event_ms - total_ms.unwrap_or(0.0)).max(0.0));
        let Some(Value::Object(replay)) = request.get("replay") else {
            return Err(self.err(
                line,
                "request.replay",
                "missing; the trace must be recorded with replay data (trace_block_size, input_length, \
                 input_sequence_hashes)"
                    .into(),
            ));
        };
        let bs = self
            .count(replay, line, &["trace_block_size"])
            .map_err(|e| nest(e, "request.replay"))?
            .filter(|&b| b > 0)
            .ok_or_else(|| {
                self.err(line, "request.replay.trace_block_size", "must be a positive integer".into())
            })? as usize;
        match self.dynamo_block_size {
            None if self.explicit_block_size && bs != self.block_size => {
                let msg = format!(
                    "{bs}, but --trace-block-size is {}; drop the flag or make them agree",
                    self.block_size
                );
                return Err(self.err(line, "request.replay.trace_block_size", msg));
            }
            None => {
                self.dynamo_block_size = Some(bs);
                self.block_size = bs;
            }
            Some(first) if first != bs => {
                let msg =
                    format!("{bs} differs from the trace's {first}; mixed block sizes are not supported");
                return Err(self.err(line, "request.replay.trace_block_size", msg));
            }
            Some(_) => {}
        }
        // The prompt's fields under the names the common checks read.
        let mut fields = Map::new();
        for (from, to, src) in [
            ("output_tokens", "output_length", request),
            ("input_length", "input_length", replay),
            ("input_sequence_hashes", "hash_ids", replay),
        ] {
            if let Some(v) = src.get(from) {
                fields.insert(to.into(), v.clone());
            }
        }
        let prompt = self.prompt(&fields, line).map_err(|e| TraceError {
            field: match e.field.as_str() {
                "output_length" => "request.output_tokens".into(),
                "hash_ids" => "request.replay.input_sequence_hashes".into(),
                other => format!("request.replay.{other}"),
            },
            message: e
                .message
                .replace("output_length", "output_tokens")
                .replace("hash_ids", "input_sequence_hashes"),
            ..e
        })?;
        self.dynamo_ids.insert(id.clone());
        self.dynamo_requests.push(DynamoRequest { start_ms, end_ms, id, line: line as u32, prompt });
        Ok(())
    }

    /// After the last record: the requests in (start, end, id) order, each a session.
    pub(crate) fn finish_dynamo(&mut self) -> Result<(), TraceError> {
        if self.dynamo_requests.is_empty() {
            return Err(self.err(0, "trace", "contains no request_end records".into()));
        }
        let mut requests = std::mem::take(&mut self.dynamo_requests);
        requests.sort_by(|a, b| {
            a.start_ms
                .total_cmp(&b.start_ms)
                .then(a.end_ms.total_cmp(&b.end_ms))
                .then_with(|| a.id.cmp(&b.id))
        });
        for r in requests {
            let RowPrompt { ids, input_length, output_length } = r.prompt;
            let turn = TraceTurn {
                line: r.line,
                ids,
                input_length,
                output_length,
                delay_ms: 0.0,
                not_before_ms: None,
            };
            let s = self.new_session(Some(r.start_ms), turn, None);
            self.sessions[s].name = SessionName::Unnamed;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::trace::load::parse_trace;
    use crate::trace::TraceFormat;

    fn record(id: &str, received: u64, total: u64, hashes: &str, extra: &str) -> String {
        format!(
            r#"{{"schema": "dynamo.request.trace.v1", "event_type": "request_end", "event_time_unix_ms": {end}, "request": {{"request_id": "{id}", "output_tokens": 4, "request_received_ms": {received}, "total_time_ms": {total}, "replay": {{"trace_block_size": 64, "input_length": 200, "input_sequence_hashes": {hashes}}}}}{extra}}}"#,
            end = received + total
        )
    }

    #[test]
    fn request_ends_become_requests_in_start_order() {
        let text = [
            record("b", 1_700_000_000_100, 800, "[11, 12, 13, 99]", ""),
            r#"{"event": {"schema": "dynamo.request.trace.v1", "event_type": "request_payload"}}"#.into(),
            format!("{{\"event\": {}}}", record("a", 1_700_000_000_000, 500, "[11, 12, 13, 14]", "")),
        ]
        .join("\n");
        let t = parse_trace(&text, TraceFormat::Dynamo, None).unwrap();
        assert_eq!(t.block_size, 64, "the embedded block size");
        let firsts: Vec<(u32, Option<f64>)> =
            t.sessions.iter().map(|s| (s.turns[0].line, s.first_arrival_ms)).collect();
        assert_eq!(firsts, vec![(3, Some(1_700_000_000_000.0)), (1, Some(1_700_000_000_100.0))]);
        let (a, b) = (&t.sessions[0].turns[0], &t.sessions[1].turns[0]);
        assert_eq!((a.input_length, a.output_length), (200, 4));
        assert_eq!(a.ids[..3], b.ids[..3], "shared hashes share blocks");
        assert!(parse_trace(&text, TraceFormat::Dynamo, Some(64)).is_ok());
    }

    #[test]
    fn errors_name_line_and_field() {
        let ok = record("a", 1_000, 10, "[1, 2, 3, 4]", "");
        let cases = [
            (ok.replace("v1\"", "v9\""), "schema", "dynamo.request.trace.v1"),
            (ok.replace("request_end", "request_start"), "event_type", "request_end"),
            (ok.replace("[1, 2, 3, 4]", "[1]"), "request.replay.input_length", "capacity 64"),
            (ok.replace("\"output_tokens\": 4, ", ""), "request.output_tokens", "missing output_tokens"),
            (
                ok.replace("\"trace_block_size\": 64", "\"trace_block_size\": 0"),
                "request.replay.trace_block_size",
                "positive",
            ),
            (
                record("a", 1_000, 10, "[1, 2, 3, 4]", r#", "agent_context": {"session_id": "s"}"#),
                "agent_context",
                "not supported",
            ),
            (format!("{ok}\n{ok}"), "request.request_id", "duplicate"),
            (
                format!(
                    "{ok}\n{}",
                    ok.replace("\"trace_block_size\": 64", "\"trace_block_size\": 32")
                        .replace("\"a\"", "\"b\"")
                ),
                "request.replay.trace_block_size",
                "mixed",
            ),
        ];
        for (text, field, needle) in cases {
            let e = parse_trace(&text, TraceFormat::Dynamo, None).unwrap_err();
            assert_eq!(e.field, field, "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
        let e = parse_trace(&ok, TraceFormat::Dynamo, Some(512)).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (1, "request.replay.trace_block_size"), "{e}");
        let e = parse_trace("", TraceFormat::Dynamo, None).unwrap_err();
        assert!(e.message.contains("no request_end"), "{e}");
    }
}
