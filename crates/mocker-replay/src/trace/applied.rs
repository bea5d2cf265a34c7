//! `applied_compute_agentic` traces: one agent conversation per line,
//! `{num_turns, input_prompt_length, assistant_response_length[n], tool_call_output_length[n],
//! tool_call_latency[n] (s), final_assistant_response_length}`.
//!
//! A line becomes a session of `num_turns + 1` turns. Turn 0's prompt is the initial
//! prompt; each later turn's prompt is the previous one plus the assistant's reply and the
//! tool's output, and it follows the previous turn's completion after that tool call's
//! latency. Turns answer with `assistant_response_length[i]`, the last with
//! `final_assistant_response_length`. A session's hash ids grow with its prompt (earlier
//! turns' ids are a prefix of later ones), so each turn reuses the previous prompt's
//! cached blocks. Lines carry no timestamps: the replay needs a concurrency.

use serde_json::{Map, Value};

use crate::trace::parser::Parser;
use crate::trace::{SessionName, TraceError, TraceTurn, MAX_DELAY_MS, MAX_TRACE_TOKENS};

impl Parser {
    /// One conversation line.
    pub(crate) fn applied_row(&mut self, line: usize, row: &Map<String, Value>) -> Result<(), TraceError> {
        self.keys.check(line, "", row.keys(), crate::trace::keys::APPLIED_ROW);
        let n = self
            .count(row, line, &["num_turns"])?
            .ok_or_else(|| self.err(line, "num_turns", "missing (the number of tool-calling turns)".into()))?
            as usize;
        // The turns are planned together: bounded before any list is read.
        let max_turns = crate::limits::MAX_TURNS;
        if n > max_turns {
            return Err(self.err(line, "num_turns", format!("must be in 0..={max_turns} (got {n})")));
        }
        let length = |p: &Self, name: &str| -> Result<usize, TraceError> {
            let v = p.count(row, line, &[name])?.ok_or_else(|| p.err(line, name, "missing".into()))?;
            Ok(v as usize)
        };
        let prompt0 = length(self, "input_prompt_length")?;
        let final_out = length(self, "final_assistant_response_length")?;
        let list = |p: &Self, name: &str| -> Result<Vec<f64>, TraceError> {
            let Some(Value::Array(a)) = row.get(name) else {
                return Err(p.err(line, name, format!("must be a list of {n} numbers (num_turns)")));
            };
            if a.len() != n {
                let msg = format!("has {} entries; num_turns is {n}", a.len());
                return Err(p.err(line, name, msg));
            }
            a.iter()
                .map(|v| match v.as_f64() {
                    Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
                    _ => Err(p.err(line, name, format!("must hold non-negative numbers (got {v})"))),
                })
                .collect()
        };
        let replies = list(self, "assistant_response_length")?;
        let tools = list(self, "tool_call_output_length")?;
        let latencies = list(self, "tool_call_latency")?;
        for (name, values) in [("assistant_response_length", &replies), ("tool_call_output_length", &tools)] {
            if let Some(v) = values.iter().find(|v| v.fract() != 0.0) {
                return Err(self.err(line, name, format!("must hold integers (got {v})")));
            }
        }
        if let Some(v) = latencies.iter().find(|&&v| v * 1e3 > MAX_DELAY_MS) {
            return Err(self.err(
                line,
                "tool_call_latency",
                format!("must be at most {} s (got {v})", MAX_DELAY_MS / 1e3),
            ));
        }
        // Prompts and outputs, checked before any id is allocated.
        let mut prompts = vec![prompt0];
        for i in 0..n {
            // Saturating: the lists hold any finite integer; the bound below refuses it.
            prompts.push(prompts[i].saturating_add(replies[i] as usize).saturating_add(tools[i] as usize));
        }
        let outputs: Vec<usize> = replies.iter().map(|&r| r as usize).chain([final_out]).collect();
        for (field, v) in [("input_prompt_length", prompt0), ("final_assistant_response_length", final_out)] {
            if !(1..=MAX_TRACE_TOKENS).contains(&v) {
                return Err(self.err(line, field, format!("must be in 1..={MAX_TRACE_TOKENS} (got {v})")));
            }
        }
        if let Some(&p) = prompts.last().filter(|&&p| p > MAX_TRACE_TOKENS) {
            let msg =
                format!("the last turn's prompt reaches {p} tokens, above the limit {MAX_TRACE_TOKENS}");
            return Err(self.err(line, "tool_call_output_length", msg));
        }
        if let Some(i) = outputs.iter().position(|&o| o == 0) {
            let msg = format!("turn {i} answers with 0 tokens; every turn must generate at least one");
            return Err(self.err(line, "assistant_response_length", msg));
        }
        let bs = self.block_size;
        // Each turn keeps its own copy of its prompt's ids (a prefix of the last turn's).
        let session_ids: usize = prompts.iter().map(|p| p.div_ceil(bs)).sum();
        let max_ids = crate::limits::MAX_SESSION_TOKENS;
        if session_ids > max_ids {
            let msg = format!(
                "its {} turns' prompts come to {session_ids} hash ids of {bs} tokens, above the limit \
                 {max_ids} for one session",
                n + 1
            );
            return Err(self.err(line, "num_turns", msg));
        }
        let ids: Vec<u32> = (0..prompts[n].div_ceil(bs)).map(|_| self.fresh_id()).collect();
        let mut session = None;
        for (i, (&prompt, &output)) in prompts.iter().zip(&outputs).enumerate() {
            let turn = TraceTurn {
                line: self.next_request_ordinal(),
                ids: ids[..prompt.div_ceil(bs)].to_vec(),
                input_length: prompt as u32,
                output_length: output as u32,
                delay_ms: if i == 0 { 0.0 } else { latencies[i - 1] * 1e3 },
                not_before_ms: None,
            };
            match session {
                None => {
                    let s = self.new_session(None, turn, None);
                    let name = format!("applied_compute_agentic_session_{}", self.sessions.len());
                    self.sessions[s].name = SessionName::Key(name);
                    session = Some(s);
                }
                Some(s) => self.sessions[s].turns.push(turn),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::trace::load::parse_trace;
    use crate::trace::TraceFormat;

    const LINE: &str = r#"{"num_turns": 2, "input_prompt_length": 500, "assistant_response_length": [20, 30], "tool_call_output_length": [100, 50], "tool_call_latency": [0.5, 0.25], "final_assistant_response_length": 10}"#;

    #[test]
    fn a_line_becomes_a_growing_session() {
        let t = parse_trace(LINE, TraceFormat::AppliedComputeAgentic, Some(64)).unwrap();
        assert_eq!(t.sessions.len(), 1);
        let turns = &t.sessions[0].turns;
        let shape: Vec<(u32, u32, f64, usize)> =
            turns.iter().map(|t| (t.input_length, t.output_length, t.delay_ms, t.ids.len())).collect();
        assert_eq!(shape, vec![(500, 20, 0.0, 8), (620, 30, 500.0, 10), (700, 10, 250.0, 11)]);
        assert_eq!(turns[2].ids[..10], turns[1].ids[..], "earlier turns' ids are a prefix");
        assert_eq!(t.sessions[0].first_arrival_ms, None);
        let lines: Vec<u32> = turns.iter().map(|t| t.line).collect();
        assert_eq!(lines, vec![1, 2, 3], "each turn is its own request");
    }

    #[test]
    fn errors_name_line_and_field() {
        let cases = [
            (
                LINE.replace("\"num_turns\": 2", "\"num_turns\": 3"),
                "assistant_response_length",
                "num_turns is 3",
            ),
            (LINE.replace("[0.5, 0.25]", "[0.5, -1]"), "tool_call_latency", "non-negative"),
            (
                LINE.replace("\"input_prompt_length\": 500", "\"input_prompt_length\": 0"),
                "input_prompt_length",
                "1..=",
            ),
            (LINE.replace("\"num_turns\": 2, ", ""), "num_turns", "missing"),
            (LINE.replace("[20, 30]", "[20, 0]"), "assistant_response_length", "turn 1"),
            (LINE.replace("[100, 50]", "[100, 5.5]"), "tool_call_output_length", "integers"),
        ];
        for (text, field, needle) in cases {
            let e = parse_trace(&format!("\n{text}"), TraceFormat::AppliedComputeAgentic, None).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (2, field), "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }
}
