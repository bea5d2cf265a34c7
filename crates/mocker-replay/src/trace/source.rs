//! A trace's sessions in release order with their prompts synthesised: trace mode orders
//! sessions by first arrival (normalised so the first is at 0), concurrency mode keeps file
//! order and drops timestamps.

use std::sync::Arc;

use mocker_core::hashing::deterministic_output_token;

use crate::options::TraceWorkload;
use crate::trace::stream::StreamRows;
use crate::trace::{expand_prompt, Trace, TraceFormat, TraceSession};

/// One synthesised turn of a trace session.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedTurn {
    /// Request id: the row's line number, plus the copy number in the high bits.
    pub uuid: u128,
    /// Prompt tokens; empty from a [`TraceSource::tokenless`] source.
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub input_length: usize,
    /// From a [`TraceSource::tokenless`] source, the trace block ids the prompt is made of
    /// (each covers the trace's block size, the last possibly in part); empty otherwise.
    pub ids: Vec<u32>,
    /// Tokens to generate.
    pub max_output_tokens: usize,
    /// Delay after the previous turn completes (ms, before the speedup ratio).
    pub delay_ms: f64,
    /// Trace mode: not released before this (ms on the normalised timeline, before the
    /// speedup ratio).
    pub not_before_ms: Option<f64>,
    /// Leading prompt tokens some other turn may share: those before the turn's first
    /// hash id that no other row of the replay uses (`None`: all of them, or unknown).
    pub shareable_tokens: Option<usize>,
}

/// A session of a trace copy, prompts synthesised.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedSession {
    /// Turns in order.
    pub turns: Vec<SourcedTurn>,
    /// Gate of the first turn: `copy * trace.gates.len() + gate index`.
    pub gate: Option<u64>,
    /// Its index in file order (first appearance of its session id), counting on across
    /// copies: `copy * sessions + index`. The reference's session index, which orders
    /// turns due at the same instant.
    pub order: u64,
}

/// Sessions of a [`TraceWorkload`], one at a time.
#[derive(Debug)]
pub struct TraceSource {
    trace: Arc<Trace>,
    /// Session indices in release order, with first arrivals (ms, normalised).
    order: Vec<(u32, Option<f64>)>,
    /// Gap between copies when the trace is repeated.
    span_ms: f64,
    /// Subtracted from the file's times (the earliest first arrival), in trace mode.
    origin_ms: Option<f64>,
    repeat: usize,
    copy: usize,
    pos: usize,
    /// Rows using each (dense) hash id, saturating, when a turn's unshared tail is known:
    /// a single replay of a format whose rows list their whole prompt. Repeats share every
    /// id between copies, and delta rows list only new blocks.
    id_uses: Option<Vec<u8>>,
    /// Hand out block ids instead of synthesised tokens.
    tokenless: bool,
    /// A streamed trace's rows (`order` is then empty), one read ahead.
    stream: Option<Streamed>,
}

/// The rows of a streamed trace still to hand out.
#[derive(Debug)]
struct Streamed {
    rows: Option<StreamRows>,
    /// The next row's session, read ahead for its arrival.
    ahead: Option<TraceSession>,
    /// Rows handed out so far.
    handed: usize,
}

impl Streamed {
    fn open(trace: &Trace) -> Self {
        let mut s = Self { rows: None, ahead: None, handed: 0 };
        match StreamRows::open(&trace.path, trace.format, Some(trace.block_size)) {
            Ok(rows) => s.rows = Some(rows),
            Err(e) => Self::fail(trace, format!("cannot read it again: {e}")),
        }
        s.read_ahead(trace);
        s
    }

    /// Reads the next row into `ahead`. The first pass read the same file without error,
    /// so a failure here means it changed since: the sessions end there and the replay
    /// fails (see [`crate::trace::TraceStream::failure`]).
    fn read_ahead(&mut self, trace: &Trace) {
        let rows = trace.stream.as_ref().map_or(0, |st| st.rows);
        self.ahead = match self.rows.as_mut().map(StreamRows::next_row) {
            Some(Ok(Some(Some(session)))) => Some(session),
            Some(Ok(None)) if self.handed < rows => {
                let read = self.handed;
                Self::fail(
                    trace,
                    format!("changed while it was replayed: it ended after {read} of its {rows} rows"),
                );
                None
            }
            Some(Ok(None)) | None => None,
            Some(Ok(Some(None))) => {
                Self::fail(
                    trace,
                    "changed while it was replayed: a row is no longer a request of its own".into(),
                );
                None
            }
            Some(Err(e)) => {
                Self::fail(trace, format!("changed while it was replayed: {e}"));
                None
            }
        };
        if self.ahead.is_none() {
            self.rows = None;
        }
    }

    fn fail(trace: &Trace, message: String) {
        if let Some(st) = &trace.stream {
            let _ = st.failure.set(format!("{}: {message}", trace.path.display()));
        }
    }
}

impl TraceSource {
    /// A source for `w`.
    pub fn new(w: &TraceWorkload) -> Self {
        let trace = w.trace.clone();
        let trace_mode = w.concurrency.is_none();
        if let Some(st) = &trace.stream {
            // Rows come in release order already (time order was checked by the scan).
            let origin_ms = trace_mode.then(|| st.span_ms.map_or(0.0, |s| s.0));
            let stream = Some(Streamed::open(&trace));
            return Self {
                trace,
                order: Vec::new(),
                span_ms: 0.0,
                origin_ms,
                repeat: 1,
                copy: 0,
                pos: 0,
                // The stream keeps them (`uses`): one copy, a byte per id value.
                id_uses: None,
                tokenless: false,
                stream,
            };
        }
        let mut order: Vec<(u32, Option<f64>)> = trace
            .sessions
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, if trace_mode { s.first_arrival_ms } else { None }))
            .collect();
        let mut span_ms = 0.0;
        let mut origin_ms = None;
        if trace_mode {
            let min = order.iter().filter_map(|o| o.1).min_by(f64::total_cmp).unwrap_or(0.0);
            // A gated session without `not_before_ms` starts (waiting on its gate) at once.
            for (i, o) in order.iter_mut().enumerate() {
                if trace.sessions[i].gate.is_some() {
                    o.1 = Some(o.1.unwrap_or(min).max(min));
                }
            }
            // Stable: sessions arriving together keep file order.
            order.sort_by(|a, b| a.1.unwrap_or(0.0).total_cmp(&b.1.unwrap_or(0.0)));
            let min = order.first().and_then(|o| o.1).unwrap_or(0.0);
            for o in &mut order {
                o.1 = o.1.map(|t| t - min);
            }
            let last = order.last().and_then(|o| o.1).unwrap_or(0.0);
            let mean_gap = if order.len() > 1 { last / (order.len() - 1) as f64 } else { 1.0 };
            span_ms = last + mean_gap;
            origin_ms = Some(min);
        }
        let id_uses = (w.repeat == 1 && trace.format != TraceFormat::MooncakeDelta).then(|| {
            let turns = || trace.sessions.iter().flat_map(|s| &s.turns);
            let ids = turns().flat_map(|t| t.ids.iter().copied());
            let mut uses = vec![0u8; ids.clone().max().map_or(0, |m| m as usize + 1)];
            // Occurrences, not rows: an id repeated within one row counts as shared, which
            // only ever marks fewer blocks private.
            ids.for_each(|id| uses[id as usize] = uses[id as usize].saturating_add(1));
            uses
        });
        Self {
            trace,
            order,
            span_ms,
            origin_ms,
            repeat: w.repeat,
            copy: 0,
            pos: 0,
            id_uses,
            tokenless: false,
            stream: None,
        }
    }

    /// Turns carry their trace block ids instead of synthesised prompt tokens (a prompt's
    /// tokens are a function of its ids), for callers that only need block identities.
    /// Delta traces, whose prompts also hold earlier outputs, keep their tokens.
    pub fn tokenless(mut self) -> Self {
        self.tokenless = self.trace.format != TraceFormat::MooncakeDelta;
        self
    }

    /// The trace's block size (tokens per id).
    pub fn trace_block_size(&self) -> usize {
        self.trace.block_size
    }

    /// Sessions not started yet.
    pub fn sessions_remaining(&self) -> usize {
        if let Some(st) = &self.stream {
            let rows = self.trace.stream.as_ref().map_or(0, |t| t.rows);
            // Fewer when the file was cut short since the first pass.
            return if st.ahead.is_some() { rows - st.handed } else { 0 };
        }
        (self.repeat - self.copy) * self.order.len() - self.pos
    }

    /// First arrival (ms) of the next session, in trace mode.
    pub fn next_arrival_ms(&self) -> Option<f64> {
        if let Some(st) = &self.stream {
            let origin = self.origin_ms?;
            return st.ahead.as_ref().and_then(|s| s.first_arrival_ms).map(|t| t - origin);
        }
        if self.sessions_remaining() == 0 {
            return None;
        }
        self.order[self.pos].1.map(|t| t + self.copy as f64 * self.span_ms)
    }

    /// The next session, prompts synthesised.
    pub fn next_session(&mut self) -> Option<SourcedSession> {
        if let Some(st) = self.stream.as_mut() {
            let session = st.ahead.take()?;
            let index = st.handed as u32;
            st.handed += 1;
            st.read_ahead(&self.trace);
            let shift = self.origin_ms.map(|o| -o);
            return Some(self.source_session(&session, index, 0, shift));
        }
        if self.sessions_remaining() == 0 {
            return None;
        }
        let (index, _) = self.order[self.pos];
        let copy = self.copy;
        let shift = self.origin_ms.map(|o| self.copy as f64 * self.span_ms - o);
        self.pos += 1;
        if self.pos == self.order.len() {
            self.pos = 0;
            self.copy += 1;
        }
        let trace = self.trace.clone();
        Some(self.source_session(&trace.sessions[index as usize], index, copy, shift))
    }

    /// Rows using each hash id, when a turn's unshared tail is known (see `id_uses`).
    fn uses(&self) -> Option<&[u8]> {
        match &self.trace.stream {
            Some(st) => Some(&st.id_uses),
            None => self.id_uses.as_deref(),
        }
    }

    /// Session `index` (in file order) of copy `copy`, prompts synthesised; `shift` moves
    /// its `not_before_ms` onto the replay's timeline.
    fn source_session(
        &self,
        session: &TraceSession,
        index: u32,
        copy: usize,
        shift: Option<f64>,
    ) -> SourcedSession {
        let copy = copy as u128;
        let bs = self.trace.block_size;
        let delta = self.trace.format == TraceFormat::MooncakeDelta;
        let mut history: Vec<u32> = Vec::new();
        let mut turns = Vec::with_capacity(session.turns.len());
        for t in &session.turns {
            let uuid = (copy << 32) | u128::from(t.line);
            let input_length = t.input_length as usize;
            let (tokens, ids) = if self.tokenless {
                let used = input_length.div_ceil(bs).min(t.ids.len());
                (Vec::new(), t.ids[..used].to_vec())
            } else if delta {
                expand_prompt(&t.ids, t.input_length as usize, bs, &mut history);
                let prompt = history.clone();
                // The engine's deterministic output tokens join the history of later turns.
                history.extend((0..u64::from(t.output_length)).map(|k| deterministic_output_token(uuid, k)));
                (prompt, Vec::new())
            } else {
                let mut v = Vec::with_capacity(input_length);
                expand_prompt(&t.ids, input_length, bs, &mut v);
                (v, Vec::new())
            };
            let input_length = if delta { tokens.len() } else { input_length };
            let shareable_tokens = self
                .uses()
                .and_then(|uses| t.ids.iter().position(|&id| uses[id as usize] == 1))
                .map(|j| (j * bs).min(input_length));
            turns.push(SourcedTurn {
                uuid,
                tokens,
                input_length,
                ids,
                max_output_tokens: t.output_length as usize,
                delay_ms: t.delay_ms,
                not_before_ms: t.not_before_ms.zip(shift).map(|(nb, d)| nb + d),
                shareable_tokens,
            });
        }
        let gate = session.gate.map(|g| copy as u64 * self.trace.gates.len() as u64 + u64::from(g));
        let order = copy as u64 * self.order.len() as u64 + u64::from(index);
        SourcedSession { turns, gate, order }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::load::parse_trace;

    fn source(text: &str, format: TraceFormat, concurrency: Option<usize>, repeat: usize) -> TraceSource {
        let trace = Arc::new(parse_trace(text, format, Some(4)).unwrap());
        TraceSource::new(&TraceWorkload { trace, concurrency, repeat, lanes: None })
    }

    const ROWS: &str = r#"{"timestamp": 2000, "output_length": 2, "hash_ids": [1]}
{"timestamp": 1000, "output_length": 3, "hash_ids": [1, 2], "input_length": 6}
{"timestamp": 3000, "output_length": 1, "hash_ids": [3]}"#;

    #[test]
    fn trace_mode_sorts_normalises_and_repeats() {
        let mut s = source(ROWS, TraceFormat::Mooncake, None, 2);
        let mut seen = Vec::new();
        while let Some(t) = s.next_arrival_ms() {
            let turns = s.next_session().unwrap().turns;
            seen.push((t, turns[0].uuid, turns[0].tokens.len()));
        }
        let copy = 1u128 << 32;
        assert_eq!(
            seen,
            vec![
                (0.0, 2, 6),
                (1000.0, 1, 4),
                (2000.0, 3, 4),
                (3000.0, copy | 2, 6),
                (4000.0, copy | 1, 4),
                (5000.0, copy | 3, 4)
            ]
        );
        assert_eq!(s.sessions_remaining(), 0);
    }

    #[test]
    fn concurrency_mode_keeps_file_order_without_arrivals() {
        let mut s = source(ROWS, TraceFormat::Mooncake, Some(2), 1);
        assert_eq!(s.next_arrival_ms(), None);
        let uuids: Vec<u128> = std::iter::from_fn(|| s.next_session()).map(|t| t.turns[0].uuid).collect();
        assert_eq!(uuids, vec![1, 2, 3]);
    }

    #[test]
    fn delta_turns_carry_history_and_outputs() {
        let text = r#"{"session_id": "s", "timestamp": 0, "output_length": 3, "hash_ids": [1, 2]}
{"session_id": "s", "timestamp": 5, "output_length": 1, "hash_ids": [7], "input_length": 2}"#;
        let mut s = source(text, TraceFormat::MooncakeDelta, None, 1);
        let turns = s.next_session().unwrap().turns;
        assert_eq!(turns[0].tokens.len(), 8);
        assert_eq!(turns[1].tokens.len(), 8 + 3 + 2);
        assert_eq!(turns[1].tokens[..8], turns[0].tokens[..]);
        assert_eq!(turns[1].tokens[8], deterministic_output_token(1, 0));
        assert_eq!(turns[1].delay_ms, 5.0);
        let mut plain = source(text, TraceFormat::Mooncake, None, 1);
        assert_eq!(plain.next_session().unwrap().turns[1].tokens.len(), 2);
    }
}
