//! Per-request records (`--report-jsonl`): every token time of every request, kept only
//! while the request is live and handed out as soon as it ends, so memory stays bounded
//! by live requests rather than by the workload.

use serde::Serialize;

use crate::collector::RecordId;

/// One request's life, as written to `--report-jsonl` (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Arrival order in the replay, from 0.
    pub request_index: u64,
    /// `completed`, or `rejected` (could never fit the engine, or ended without a token:
    /// the report does not count it as completed either).
    pub status: &'static str,
    /// Worker the request was placed on.
    pub worker: u32,
    /// Simulated time the request arrived (was dispatched), ms.
    pub arrival_ms: f64,
    /// Simulated time its engine first admitted it, ms.
    pub admission_ms: Option<f64>,
    /// Simulated time of its first token, ms.
    pub first_token_ms: Option<f64>,
    /// Simulated time of every output token, ms, in order.
    pub token_times_ms: Vec<f64>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens received.
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache (best admission, as the report counts).
    pub cached_tokens: u32,
}

#[derive(Debug, Default)]
struct Live {
    index: u64,
    arrival_ns: u64,
    admission_ns: Option<u64>,
    token_ns: Vec<u64>,
}

/// Token times of live requests, by collector record id.
#[derive(Debug, Default)]
pub(crate) struct RequestLog {
    live: Vec<Live>,
    next_index: u64,
    ended: Vec<RequestRecord>,
}

const MS: f64 = 1e6;

impl RequestLog {
    pub(crate) fn arrival(&mut self, id: RecordId, arrival_ns: u64) {
        let id = id as usize;
        if self.live.len() <= id {
            self.live.resize_with(id + 1, Live::default);
        }
        let slot = &mut self.live[id];
        // The token buffer of the slot's previous owner is reused.
        slot.token_ns.clear();
        slot.index = self.next_index;
        slot.arrival_ns = arrival_ns;
        slot.admission_ns = None;
        self.next_index += 1;
    }

    pub(crate) fn admission(&mut self, id: RecordId, t_ns: u64) {
        let slot = &mut self.live[id as usize];
        slot.admission_ns.get_or_insert(t_ns);
    }

    #[inline]
    pub(crate) fn token(&mut self, id: RecordId, t_ns: u64) {
        self.live[id as usize].token_ns.push(t_ns);
    }

    /// The request ended; `counts` is (worker, input, cached tokens).
    pub(crate) fn end(&mut self, id: RecordId, completed: bool, counts: (u32, u32, u32)) {
        let slot = &self.live[id as usize];
        let (worker, input_tokens, cached_tokens) = counts;
        self.ended.push(RequestRecord {
            request_index: slot.index,
            status: if completed { "completed" } else { "rejected" },
            worker,
            arrival_ms: slot.arrival_ns as f64 / MS,
            admission_ms: slot.admission_ns.map(|t| t as f64 / MS),
            first_token_ms: slot.token_ns.first().map(|&t| t as f64 / MS),
            token_times_ms: slot.token_ns.iter().map(|&t| t as f64 / MS).collect(),
            input_tokens,
            output_tokens: slot.token_ns.len() as u32,
            cached_tokens,
        });
    }

    /// Records of requests that ended since the last call, in the order they ended.
    pub(crate) fn take_ended(&mut self) -> std::vec::Drain<'_, RequestRecord> {
        self.ended.drain(..)
    }
}
