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
    /// Prompt tokens served from the prefix cache (best admission, as the report counts;
    /// the prefill pool's in a disaggregated replay).
    pub cached_tokens: u32,
    /// The prefill-to-decode handoff, in disaggregated replays only.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffRecord>,
}

/// A disaggregated request's handoff, under the reference's per-request field names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HandoffRecord {
    /// Prefill worker (index within the prefill pool).
    pub prefill_worker_idx: u32,
    /// Decode worker (index within the decode pool), once chosen.
    pub decode_worker_idx: Option<u32>,
    /// When the prefill worker admitted it, ms.
    pub prefill_admit_ms: Option<f64>,
    /// When its prefill finished and the source started holding the KV, ms.
    pub source_held_ms: Option<f64>,
    /// When the decode worker reserved its prompt blocks, ms.
    pub destination_reserved_ms: Option<f64>,
    /// When the KV arrived and the decode worker took the request, ms.
    pub destination_activated_ms: Option<f64>,
    /// When the decode worker admitted it (its activation), ms.
    pub decode_admit_ms: Option<f64>,
    /// When the prefill worker freed the held KV, ms.
    pub source_released_ms: Option<f64>,
    /// Prompt tokens the decode worker already cached (not transferred).
    pub decode_reused_input_tokens: u32,
}

/// Handoff times of a live request, ns.
#[derive(Debug, Default, Clone, Copy)]
struct Handoff {
    decode_worker: Option<u32>,
    held_ns: Option<u64>,
    reserved_ns: Option<u64>,
    activated_ns: Option<u64>,
    decode_reused: u32,
}

#[derive(Debug, Default)]
struct Live {
    index: u64,
    arrival_ns: u64,
    admission_ns: Option<u64>,
    token_ns: Vec<u64>,
    handoff: Option<Handoff>,
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
        slot.handoff = None;
        self.next_index += 1;
    }

    /// Disaggregated: the prefill finished (its source holds the KV) at `held_ns`, and
    /// `decode_worker` reserved the blocks at `t_ns`.
    pub(crate) fn reserved(&mut self, id: RecordId, decode_worker: u32, held_ns: u64, t_ns: u64) {
        let h = self.live[id as usize].handoff.get_or_insert_with(Handoff::default);
        h.decode_worker = Some(decode_worker);
        h.held_ns = Some(held_ns);
        h.reserved_ns = Some(t_ns);
    }

    /// Disaggregated: the KV arrived at `t_ns`; `reused` prompt tokens were cached there.
    pub(crate) fn activated(&mut self, id: RecordId, reused: u32, t_ns: u64) {
        let h = self.live[id as usize].handoff.get_or_insert_with(Handoff::default);
        h.activated_ns = Some(t_ns);
        h.decode_reused = reused;
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
        let ms = |t: Option<u64>| t.map(|t| t as f64 / MS);
        let handoff = slot.handoff.map(|h| HandoffRecord {
            prefill_worker_idx: worker,
            decode_worker_idx: h.decode_worker,
            prefill_admit_ms: ms(slot.admission_ns),
            source_held_ms: ms(h.held_ns),
            destination_reserved_ms: ms(h.reserved_ns),
            destination_activated_ms: ms(h.activated_ns),
            decode_admit_ms: ms(h.activated_ns),
            source_released_ms: ms(h.activated_ns),
            decode_reused_input_tokens: h.decode_reused,
        });
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
            handoff,
        });
    }

    /// Records of requests that ended since the last call, in the order they ended.
    pub(crate) fn take_ended(&mut self) -> std::vec::Drain<'_, RequestRecord> {
        self.ended.drain(..)
    }
}
