//! Per-request records (`--report-jsonl`): the reference's per-request record (its 34
//! fields under its names: routing and admission history, handoff times) plus mocker's
//! own (every token time). A request's data is kept only while it is live; ended records
//! wait in a reorder buffer only until every earlier arrival has ended, so they come out
//! in arrival order (as the reference sorts them) with memory bounded by live requests.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Serialize;

use crate::collector::RecordId;
use crate::trace::{SessionName, Trace};

/// Which pool a routing decision or an admission belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// An aggregated worker.
    Agg,
    /// A disaggregated prefill worker.
    Prefill,
    /// A disaggregated decode worker.
    Decode,
}

/// One routing decision (the reference's `routing_history` entry).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoutingEntry {
    /// Pool routed within.
    pub pool: PoolKind,
    /// `immediate`, or `queued` when the request waited in the router queue.
    pub outcome: &'static str,
    /// When it entered the router queue, ms (queued only).
    pub queue_entered_at_ms: Option<f64>,
    /// When the queue released it, ms (queued only).
    pub released_at_ms: Option<f64>,
    /// Time spent in the router queue, ms.
    pub queue_wait_ms: f64,
    /// Chosen worker (index within its pool).
    pub logical_worker_id: u32,
    /// The worker's scheduler (one per worker: the worker index).
    pub scheduler_id: u32,
    /// Data-parallel rank (always 0: one rank per worker).
    pub dp_rank: u32,
    /// Prompt tokens the router believed the chosen worker held.
    pub reported_overlap_tokens: u32,
    /// KV router: blocks the index believed the chosen worker held.
    pub selected_overlap_blocks: Option<u32>,
    /// KV router: the most any worker held.
    pub best_available_overlap_blocks: Option<u32>,
    /// KV router: best minus selected.
    pub overlap_regret_blocks: Option<u32>,
    /// Replica of a replicated placement (none in mocker).
    pub placement_replica_id: Option<u32>,
}

/// One admission of the request by a worker (the reference's `admission_history` entry).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdmissionEntry {
    /// Order among all of the request's admissions, from 0.
    pub admission_ordinal: u32,
    /// Order among its admissions in this pool, from 0.
    pub pool_admission_ordinal: u32,
    /// Pool of the admitting worker.
    pub pool: PoolKind,
    /// When, ms.
    pub at_ms: f64,
    /// Prompt tokens served from that worker's prefix cache.
    pub reused_input_tokens: u32,
    /// Not the first admission in this pool (after a preemption).
    pub is_readmission: bool,
}

/// One request's life, as written to `--report-jsonl` (one JSON object per line). The
/// fields up to `terminal_status` are the reference's, in its order; the rest are mocker's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    /// The trace session (`request_<line>` for a session-less Mooncake row); null for
    /// synthetic workloads and formats without sessions.
    pub session_id: Option<String>,
    /// Turn within the session, for formats the reference numbers turns of.
    pub turn_index: Option<u32>,
    /// Request id as a UUID: the trace row's line (plus the copy number in the high bits),
    /// or the synthetic request number.
    pub uuid: String,
    /// Arrival (dispatch to the router), ms.
    pub arrival_time_ms: f64,
    /// Agentic traces: when the request was dispatched (its arrival), ms.
    pub dispatched_at_ms: Option<f64>,
    /// First admission by a worker (the prefill worker's in a disaggregated replay), ms.
    pub first_admit_ms: Option<f64>,
    /// When it completed or was rejected, ms.
    pub terminal_time_ms: f64,
    /// First output token, ms.
    pub first_token_ms: Option<f64>,
    /// Last output token, ms.
    pub last_token_ms: Option<f64>,
    /// First token minus arrival, ms.
    pub ttft_ms: Option<f64>,
    /// Second token minus first, ms.
    pub ttst_ms: Option<f64>,
    /// Last token minus arrival, ms.
    pub e2e_latency_ms: Option<f64>,
    /// Mean gap between its tokens (TPOT), ms.
    pub itl_ms: Option<f64>,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens asked for.
    pub requested_output_length: u32,
    /// Output tokens produced.
    pub output_length: u32,
    /// Prompt tokens served from the prefix cache (best admission; the prefill pool's in
    /// a disaggregated replay).
    pub reused_input_tokens: u32,
    /// Disaggregated: the prefill worker (index within its pool).
    pub prefill_worker_idx: Option<u32>,
    /// The decode worker (disaggregated, index within its pool) or the aggregated worker.
    pub decode_worker_idx: Option<u32>,
    /// Handoff times (disaggregated replays; null otherwise).
    #[serde(flatten)]
    pub handoff: HandoffRecord,
    /// Disaggregated: prompt tokens the prefill router believed its worker held.
    pub prefill_route_overlap_tokens: Option<u32>,
    /// Disaggregated: prompt tokens the decode router believed its worker held.
    pub decode_route_overlap_tokens: Option<u32>,
    /// Every routing decision, in order.
    pub routing_history: Vec<RoutingEntry>,
    /// Every admission, in order.
    pub admission_history: Vec<AdmissionEntry>,
    /// Admissions in all.
    pub admission_count: u32,
    /// Admissions beyond the first, summed over pools.
    pub readmission_count: u32,
    /// The reference's planner pressure records naming the request (mocker has no
    /// planner: always empty).
    pub pressure_record_ordinals: Vec<u64>,
    /// `completed` or `rejected`.
    pub terminal_status: &'static str,
    /// Arrival order in the replay, from 0.
    pub request_index: u64,
    /// `completed`, or `rejected` (could never fit the engine, or ended without a token:
    /// the report does not count it as completed either).
    pub status: &'static str,
    /// Worker the request was placed on (the prefill worker when disaggregated).
    pub worker: u32,
    /// Simulated time the request arrived (was dispatched), ms.
    pub arrival_ms: f64,
    /// Simulated time its engine first admitted it, ms.
    pub admission_ms: Option<f64>,
    /// Simulated time of every output token, ms, in order.
    pub token_times_ms: Vec<f64>,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens received.
    pub output_tokens: u32,
    /// Prompt tokens served from the prefix cache (as `reused_input_tokens`).
    pub cached_tokens: u32,
}

/// A disaggregated request's handoff, under the reference's per-request field names
/// (all null in an aggregated replay).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HandoffRecord {
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
    pub decode_reused_input_tokens: Option<u32>,
}

/// Handoff times of a live request, ns.
#[derive(Debug, Default, Clone, Copy)]
struct Handoff {
    decode_worker: Option<u32>,
    held_ns: Option<u64>,
    reserved_ns: Option<u64>,
    activated_ns: Option<u64>,
    admitted_ns: Option<u64>,
    released_ns: Option<u64>,
    decode_reused: u32,
}

#[derive(Debug, Default)]
struct Live {
    index: u64,
    uuid: u128,
    requested_output: u32,
    arrival_ns: u64,
    admission_ns: Option<u64>,
    token_ns: Vec<u64>,
    handoff: Option<Handoff>,
    /// Synthetic sessions: (session index, turn index).
    session: Option<(u32, u32)>,
    queued_ns: Option<u64>,
    routing: Vec<RoutingEntry>,
    admissions: Vec<AdmissionEntry>,
    /// Admissions per pool (agg or prefill, decode).
    pool_admissions: [u32; 2],
    /// Route overlap tokens (entry pool, decode pool), disaggregated.
    route_overlap: [Option<u32>; 2],
}

/// What the reference names a trace request by: its session and turn.
#[derive(Debug)]
struct Labels {
    trace: Arc<Trace>,
    /// Per trace line: (session index + 1, turn index); 0 for lines without a request.
    by_line: Vec<(u32, u32)>,
}

impl Labels {
    fn new(trace: Arc<Trace>) -> Self {
        let mut by_line = Vec::new();
        for (s, session) in trace.sessions.iter().enumerate() {
            for (k, t) in session.turns.iter().enumerate() {
                let line = t.line as usize;
                if by_line.len() <= line {
                    by_line.resize(line + 1, (0, 0));
                }
                by_line[line] = (s as u32 + 1, k as u32);
            }
        }
        Self { trace, by_line }
    }

    fn of(&self, uuid: u128) -> (Option<String>, Option<u32>) {
        if self.trace.stream.is_some() {
            // Every row of a streamed trace is a session of its own, named by its line.
            let line = uuid as u32;
            return (Some(format!("request_{line}")), self.trace.format.numbers_turns().then_some(0));
        }
        let Some(&(s, k)) = self.by_line.get(uuid as u32 as usize).filter(|e| e.0 > 0) else {
            return (None, None);
        };
        let rows = &self.trace.row_sessions;
        if let Ok(i) = rows.binary_search_by_key(&(uuid as u32), |r| r.0) {
            return (Some(rows[i].1.clone()), None);
        }
        let session = &self.trace.sessions[s as usize - 1];
        let name = match &session.name {
            SessionName::Unnamed => None,
            SessionName::Row => Some(format!("request_{}", session.turns[0].line)),
            SessionName::Key(key) => Some(key.clone()),
        };
        (name, self.trace.format.numbers_turns().then_some(k))
    }
}

/// Live requests' data, by collector record id, and the ended records awaiting output.
#[derive(Debug, Default)]
pub(crate) struct RequestLog {
    live: Vec<Live>,
    next_index: u64,
    /// Ended records by arrival index, from `next_out` on (`None`: still live).
    pending: VecDeque<Option<RequestRecord>>,
    next_out: u64,
    ended: Vec<RequestRecord>,
    labels: Option<Labels>,
    /// The overlap unit of routing entries (the engines' block size).
    block_size: u32,
}

const MS: f64 = 1e6;

fn ms(t: u64) -> f64 {
    t as f64 / MS
}

impl RequestLog {
    /// Labels records with `trace`'s sessions and turns.
    pub(crate) fn set_trace(&mut self, trace: Arc<Trace>) {
        self.labels = Some(Labels::new(trace));
    }

    pub(crate) fn set_block_size(&mut self, block_size: usize) {
        self.block_size = block_size as u32;
    }

    pub(crate) fn arrival(&mut self, id: RecordId, arrival_ns: u64) {
        let id = id as usize;
        if self.live.len() <= id {
            self.live.resize_with(id + 1, Live::default);
        }
        let slot = &mut self.live[id];
        // The buffers of the slot's previous owner are reused.
        slot.token_ns.clear();
        slot.routing.clear();
        slot.admissions.clear();
        slot.index = self.next_index;
        slot.uuid = 0;
        slot.requested_output = 0;
        slot.session = None;
        slot.arrival_ns = arrival_ns;
        slot.admission_ns = None;
        slot.handoff = None;
        slot.queued_ns = None;
        slot.pool_admissions = [0; 2];
        slot.route_overlap = [None; 2];
        self.next_index += 1;
        self.pending.push_back(None);
    }

    pub(crate) fn describe(
        &mut self,
        id: RecordId,
        uuid: u128,
        requested_output: usize,
        session: Option<(u32, u32)>,
    ) {
        let slot = &mut self.live[id as usize];
        slot.uuid = uuid;
        slot.requested_output = requested_output as u32;
        slot.session = session;
    }

    pub(crate) fn queued(&mut self, id: RecordId, t_ns: u64) {
        self.live[id as usize].queued_ns = Some(t_ns);
    }

    /// Routed within `pool` to `worker`; `overlap` is (chosen, best) index overlap in
    /// blocks, the best known only to the KV router.
    pub(crate) fn routed(
        &mut self,
        id: RecordId,
        pool: PoolKind,
        worker: u32,
        overlap: (u32, Option<u32>),
        t_ns: u64,
    ) {
        let bs = self.block_size;
        let slot = &mut self.live[id as usize];
        let queued = slot.queued_ns.take();
        let (selected, best) = overlap;
        let tokens = selected * bs;
        match pool {
            PoolKind::Prefill => slot.route_overlap[0] = Some(tokens),
            PoolKind::Decode => slot.route_overlap[1] = Some(tokens),
            PoolKind::Agg => {}
        }
        slot.routing.push(RoutingEntry {
            pool,
            outcome: if queued.is_some() { "queued" } else { "immediate" },
            queue_entered_at_ms: queued.map(ms),
            released_at_ms: queued.map(|_| ms(t_ns)),
            queue_wait_ms: queued.map_or(0.0, |q| ms(t_ns - q)),
            logical_worker_id: worker,
            scheduler_id: worker,
            dp_rank: 0,
            reported_overlap_tokens: tokens,
            selected_overlap_blocks: best.map(|_| selected),
            best_available_overlap_blocks: best,
            overlap_regret_blocks: best.map(|b| b.saturating_sub(selected)),
            placement_replica_id: None,
        });
    }

    /// Disaggregated: the prefill finished (its source holds the KV) at `held_ns`, and
    /// `decode_worker` reserved the blocks at `t_ns`.
    pub(crate) fn reserved(&mut self, id: RecordId, decode_worker: u32, held_ns: u64, t_ns: u64) {
        let h = self.live[id as usize].handoff.get_or_insert_with(Handoff::default);
        h.decode_worker = Some(decode_worker);
        h.held_ns = Some(held_ns);
        h.reserved_ns = Some(t_ns);
    }

    /// Disaggregated, destination first (SGLang): the prefill ended at `t_ns`, after the
    /// destination was reserved.
    pub(crate) fn held(&mut self, id: RecordId, t_ns: u64) {
        self.live[id as usize].handoff.get_or_insert_with(Handoff::default).held_ns = Some(t_ns);
    }

    /// Disaggregated: the KV arrived at `t_ns`.
    pub(crate) fn activated(&mut self, id: RecordId, t_ns: u64, released_ns: u64) {
        let h = self.live[id as usize].handoff.get_or_insert_with(Handoff::default);
        h.activated_ns = Some(t_ns);
        h.released_ns = Some(released_ns);
    }

    /// The decode worker admitted the activated request at `t_ns`, reusing `reused` tokens.
    pub(crate) fn decode_admitted(&mut self, id: RecordId, reused: u32, t_ns: u64) {
        self.live[id as usize].handoff.get_or_insert_with(Handoff::default).admitted_ns = Some(t_ns);
        self.admitted(id, PoolKind::Decode, reused, t_ns);
    }

    /// An admission by a worker of `pool` at `t_ns`, reusing `reused` cached tokens.
    pub(crate) fn admitted(&mut self, id: RecordId, pool: PoolKind, reused: u32, t_ns: u64) {
        let slot = &mut self.live[id as usize];
        if pool != PoolKind::Decode {
            slot.admission_ns.get_or_insert(t_ns);
        } else {
            // The largest reuse of its decode admissions, as the reference reports it.
            let h = slot.handoff.get_or_insert_with(Handoff::default);
            h.decode_reused = h.decode_reused.max(reused);
        }
        let p = usize::from(pool == PoolKind::Decode);
        let pool_ordinal = slot.pool_admissions[p];
        slot.pool_admissions[p] += 1;
        slot.admissions.push(AdmissionEntry {
            admission_ordinal: slot.admissions.len() as u32,
            pool_admission_ordinal: pool_ordinal,
            pool,
            at_ms: ms(t_ns),
            reused_input_tokens: reused,
            is_readmission: pool_ordinal > 0,
        });
    }

    /// The pool where the request's non-decode admissions happen.
    pub(crate) fn entry_pool(&self, id: RecordId) -> PoolKind {
        // A destination-first handoff routes the decode pool first; admissions before the
        // decode worker's are the prefill pool's.
        let routing = &self.live[id as usize].routing;
        routing.iter().map(|r| r.pool).find(|&p| p != PoolKind::Decode).unwrap_or(PoolKind::Agg)
    }

    #[inline]
    pub(crate) fn token(&mut self, id: RecordId, t_ns: u64) {
        self.live[id as usize].token_ns.push(t_ns);
    }

    /// The request ended at `t_ns`; `counts` is (worker, input, cached tokens).
    pub(crate) fn end(&mut self, id: RecordId, completed: bool, t_ns: u64, counts: (u32, u32, u32)) {
        let slot = &self.live[id as usize];
        let (worker, input_tokens, cached_tokens) = counts;
        let opt = |t: Option<u64>| t.map(ms);
        let disagg =
            slot.handoff.is_some() || slot.routing.first().is_some_and(|r| r.pool == PoolKind::Prefill);
        let handoff = match (disagg, slot.handoff) {
            (true, h) => {
                let h = h.unwrap_or_default();
                HandoffRecord {
                    prefill_admit_ms: opt(slot.admission_ns),
                    source_held_ms: opt(h.held_ns),
                    destination_reserved_ms: opt(h.reserved_ns),
                    destination_activated_ms: opt(h.activated_ns),
                    decode_admit_ms: opt(h.admitted_ns),
                    source_released_ms: opt(h.released_ns),
                    decode_reused_input_tokens: h.activated_ns.map(|_| h.decode_reused),
                }
            }
            (false, _) => HandoffRecord::default(),
        };
        let (prefill_worker_idx, decode_worker_idx) = if disagg {
            (Some(worker), slot.handoff.and_then(|h| h.decode_worker))
        } else {
            (None, Some(worker))
        };
        let tokens = &slot.token_ns;
        let first = tokens.first().copied();
        let last = tokens.last().copied();
        let n = tokens.len();
        let since_arrival = |t: Option<u64>| t.map(|t| ms(t.saturating_sub(slot.arrival_ns)));
        let (session_id, turn_index) = match (&self.labels, slot.session) {
            (Some(l), _) => l.of(slot.uuid),
            (None, Some((s, t))) => (Some(format!("session_{s}")), Some(t)),
            (None, None) => (None, None),
        };
        let agentic = self.labels.as_ref().is_some_and(|l| l.trace.format.is_agentic());
        let status = if completed { "completed" } else { "rejected" };
        let readmissions = slot.pool_admissions.iter().map(|&a| a.saturating_sub(1)).sum();
        let record = RequestRecord {
            session_id,
            turn_index,
            uuid: uuid_string(slot.uuid),
            arrival_time_ms: ms(slot.arrival_ns),
            dispatched_at_ms: agentic.then(|| ms(slot.arrival_ns)),
            first_admit_ms: opt(slot.admission_ns),
            terminal_time_ms: ms(t_ns),
            first_token_ms: opt(first),
            last_token_ms: opt(last),
            ttft_ms: since_arrival(first),
            ttst_ms: (n >= 2).then(|| ms(tokens[1] - tokens[0])),
            e2e_latency_ms: since_arrival(last),
            itl_ms: (n >= 2).then(|| ms(tokens[n - 1] - tokens[0]) / (n - 1) as f64),
            input_length: input_tokens,
            requested_output_length: slot.requested_output,
            output_length: n as u32,
            reused_input_tokens: cached_tokens,
            prefill_worker_idx,
            decode_worker_idx,
            handoff,
            prefill_route_overlap_tokens: slot.route_overlap[0],
            decode_route_overlap_tokens: slot.route_overlap[1],
            routing_history: slot.routing.clone(),
            admission_history: slot.admissions.clone(),
            admission_count: slot.admissions.len() as u32,
            readmission_count: readmissions,
            pressure_record_ordinals: Vec::new(),
            terminal_status: status,
            request_index: slot.index,
            status,
            worker,
            arrival_ms: ms(slot.arrival_ns),
            admission_ms: opt(slot.admission_ns),
            token_times_ms: tokens.iter().map(|&t| ms(t)).collect(),
            input_tokens,
            output_tokens: n as u32,
            cached_tokens,
        };
        let at = (slot.index - self.next_out) as usize;
        self.pending[at] = Some(record);
        while let Some(Some(_)) = self.pending.front() {
            let r = self.pending.pop_front().flatten().expect("checked");
            self.ended.push(r);
            self.next_out += 1;
        }
    }

    /// Records of requests that ended since the last call, in arrival order: a record
    /// waits until every request that arrived before it has ended.
    pub(crate) fn take_ended(&mut self) -> std::vec::Drain<'_, RequestRecord> {
        self.ended.drain(..)
    }

    /// The run is over: records still waiting on requests that never ended (cut off by
    /// the simulated-time cap) go out, in arrival order.
    pub(crate) fn flush(&mut self) {
        self.ended.extend(self.pending.drain(..).flatten());
        self.next_out = self.next_index;
    }
}

/// `uuid` in the hyphenated UUID form.
pub(crate) fn uuid_string(uuid: u128) -> String {
    let h = format!("{uuid:032x}");
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_out_in_arrival_order() {
        let mut log = RequestLog::default();
        for id in 0..3 {
            log.arrival(id, u64::from(id) * 10);
        }
        log.end(2, true, 50, (0, 1, 0));
        log.end(1, true, 60, (0, 1, 0));
        assert_eq!(log.take_ended().count(), 0, "request 0 is still live");
        log.end(0, true, 70, (0, 1, 0));
        let order: Vec<u64> = log.take_ended().map(|r| r.request_index).collect();
        assert_eq!(order, vec![0, 1, 2]);
        // A request cut off by the cap leaves the later ones waiting until the flush.
        log.arrival(0, 80);
        log.arrival(1, 90);
        log.end(1, true, 95, (0, 1, 0));
        assert_eq!(log.take_ended().count(), 0);
        log.flush();
        assert_eq!(log.take_ended().map(|r| r.request_index).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn uuids_are_hyphenated() {
        assert_eq!(uuid_string(1), "00000000-0000-0000-0000-000000000001");
        assert_eq!(uuid_string((1 << 32) | 7), "00000000-0000-0000-0000-000100000007");
    }
}
