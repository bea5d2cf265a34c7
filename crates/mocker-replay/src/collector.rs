//! Per-request latency bookkeeping during a replay, folded into report inputs.
//! Live requests hold a small record; completed ones leave only their scalar samples.

use crate::gaps::GapStats;
use crate::options::Sla;
use crate::report::{ExactDistribution, GoodputInputs, SummaryInputs};
use std::sync::Arc;

use crate::request_log::{PoolKind, RequestLog, RequestRecord};
use crate::trace::Trace;

/// Index of a live request's record.
pub type RecordId = u32;

#[derive(Debug, Clone, Copy)]
struct Record {
    arrival_ns: u64,
    first_ns: u64,
    second_ns: u64,
    last_ns: u64,
    tokens: u32,
    input_len: u32,
    admitted: bool,
    /// Largest reuse of any admission, in either pool (the summary's).
    reused_max: u32,
    /// Largest reuse of the entry pool's (aggregated or prefill) admissions: the
    /// request record's and the per-worker figure.
    reused_entry: u32,
    reused_first: u32,
    worker: u32,
}

/// Collects what the report needs while a replay runs.
#[derive(Debug, Default)]
pub struct Collector {
    records: Vec<Record>,
    free: Vec<RecordId>,
    num_requests: u64,
    completed: u64,
    input_tokens: u64,
    output_tokens: u64,
    reused: u64,
    reused_first: u64,
    duration_ns: u64,
    ttft: ExactDistribution,
    ttst: ExactDistribution,
    tpot: ExactDistribution,
    e2e: ExactDistribution,
    /// ITL and per-user throughput.
    gaps: GapStats,
    /// Gaps of one pass are usually identical: batch them into one sketch update.
    run_gap_ns: u64,
    run_len: u64,
    sla: Sla,
    good: u64,
    good_tokens: u64,
    /// Per worker: (input tokens, reused tokens) of completed requests.
    workers: Vec<(u64, u64)>,
    /// Every token time of live requests, when per-request records are wanted.
    log: Option<RequestLog>,
    /// Traffic windows (a scaling policy's, telemetry's), fed as requests arrive,
    /// complete and are placed; empty when nobody reads them.
    traffic: Vec<crate::scaling::TrafficWindow>,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes room for the per-request samples of `requests` requests (an upper bound).
    pub fn expect_requests(&mut self, requests: usize) {
        for d in [&mut self.ttft, &mut self.ttst, &mut self.tpot, &mut self.e2e] {
            d.reserve_exact(requests);
        }
    }

    /// Builds the ITL distributions on a helper thread (for long replays).
    pub fn with_gap_thread(mut self) -> Self {
        self.gaps = GapStats::threaded();
        self
    }

    /// Also feeds `windows` traffic windows (see [`traffic`](Self::traffic)).
    pub fn with_traffic_windows(mut self, windows: usize) -> Self {
        self.traffic = vec![Default::default(); windows];
        self
    }

    /// Traffic window `i` (as many as [`with_traffic_windows`](Self::with_traffic_windows) made).
    pub fn traffic(&mut self, i: usize) -> &mut crate::scaling::TrafficWindow {
        &mut self.traffic[i]
    }

    /// A KV router placed a request of `isl_blocks` blocks where it saw `overlap` cached.
    pub fn on_kv_placement(&mut self, overlap_blocks: u32, isl_blocks: u32) {
        self.traffic.iter_mut().for_each(|w| w.on_placement(overlap_blocks, isl_blocks));
    }

    /// A pass ran `forwards` decode forwards producing `tokens` tokens.
    pub fn on_decode_forwards(&mut self, tokens: u64, forwards: u64) {
        self.traffic.iter_mut().for_each(|w| w.on_decode(tokens, forwards));
    }

    /// Whether traffic windows are fed.
    pub fn has_traffic(&self) -> bool {
        !self.traffic.is_empty()
    }

    /// An empty collector that also counts goodput under `sla` (when any threshold is set).
    pub fn with_sla(sla: Sla) -> Self {
        Self { sla, ..Self::new() }
    }

    /// Also keeps per-request records (every token time), handed out by
    /// [`Collector::take_ended_requests`] as requests end.
    pub fn with_request_log(mut self) -> Self {
        self.log = Some(RequestLog::default());
        self
    }

    /// With a request log: records name their trace session and turn from `trace`, and
    /// give router overlaps in tokens of `block_size`.
    pub fn with_record_labels(mut self, trace: Option<Arc<Trace>>, block_size: usize) -> Self {
        if let Some(log) = &mut self.log {
            if let Some(t) = trace {
                log.set_trace(t);
            }
            log.set_block_size(block_size);
        }
        self
    }

    /// The run is over: hands out the records still held back for arrival order (those
    /// after a request the simulated-time cap left unfinished).
    pub fn flush_requests(&mut self) {
        if let Some(log) = &mut self.log {
            log.flush();
        }
    }

    /// Per-request records: the request is `uuid` and asks for `max_output` tokens; a
    /// synthetic session's turn carries its (session, turn) indices.
    #[inline]
    pub fn describe(&mut self, id: RecordId, uuid: u128, max_output: usize, session: Option<(u32, u32)>) {
        if let Some(log) = &mut self.log {
            log.describe(id, uuid, max_output, session);
        }
    }

    /// Per-request records: the request entered the router queue at `t_ns`.
    #[inline]
    pub fn on_queued(&mut self, id: RecordId, t_ns: u64) {
        if let Some(log) = &mut self.log {
            log.queued(id, t_ns);
        }
    }

    /// Per-request records: the request was routed within `pool` to `worker` at `t_ns`;
    /// `overlap` is the router's (chosen, best) overlap in blocks (best: KV router only).
    #[inline]
    pub fn on_routed(
        &mut self,
        id: RecordId,
        pool: PoolKind,
        worker: usize,
        overlap: (u32, Option<u32>),
        t_ns: u64,
    ) {
        if let Some(log) = &mut self.log {
            log.routed(id, pool, worker as u32, overlap, t_ns);
        }
    }

    /// Per-request records: a decode worker admitted the request again (after a
    /// preemption) at `t_ns`, reusing `reused` cached tokens.
    #[inline]
    pub fn on_decode_readmission(&mut self, id: RecordId, reused: u32, t_ns: u64) {
        if let Some(log) = &mut self.log {
            log.admitted(id, PoolKind::Decode, reused, t_ns);
        }
        self.decode_reuse(id, reused);
    }

    /// A decode admission's reuse counts toward the request's, as the reference takes
    /// the largest over all its admissions in either pool.
    fn decode_reuse(&mut self, id: RecordId, reused: u32) {
        let r = &mut self.records[id as usize];
        r.reused_max = r.reused_max.max(reused);
    }

    /// Whether per-request records are kept (so steady tokens must be reported one by one
    /// through [`Collector::on_steady_token`]).
    #[inline]
    pub fn logs_requests(&self) -> bool {
        self.log.is_some()
    }

    /// Records of requests that ended since the last call (empty without a request log).
    pub fn take_ended_requests(&mut self) -> impl Iterator<Item = RequestRecord> + '_ {
        self.log.iter_mut().flat_map(RequestLog::take_ended)
    }

    /// The request was placed on `worker` (for per-worker cache statistics).
    pub fn set_worker(&mut self, id: RecordId, worker: usize) {
        self.records[id as usize].worker = worker as u32;
    }

    /// Per worker, (input tokens, reused tokens) of its completed requests.
    pub fn worker_tokens(&self) -> &[(u64, u64)] {
        &self.workers
    }

    /// A request arrived (was dispatched) at `arrival_ns`.
    pub fn on_arrival(&mut self, arrival_ns: u64, input_len: usize) -> RecordId {
        self.num_requests += 1;
        let rec = Record {
            arrival_ns,
            first_ns: 0,
            second_ns: 0,
            last_ns: 0,
            tokens: 0,
            input_len: input_len as u32,
            admitted: false,
            reused_max: 0,
            reused_entry: 0,
            reused_first: 0,
            worker: 0,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.records[id as usize] = rec;
                id
            }
            None => {
                self.records.push(rec);
                (self.records.len() - 1) as RecordId
            }
        };
        if let Some(log) = &mut self.log {
            log.arrival(id, arrival_ns);
        }
        self.traffic.iter_mut().for_each(|w| w.on_arrival());
        id
    }

    /// The request was admitted by its engine at `t_ns`, reusing `reused` cached tokens.
    pub fn on_admission(&mut self, id: RecordId, reused: u32, t_ns: u64) {
        if let Some(log) = &mut self.log {
            let pool = log.entry_pool(id);
            log.admitted(id, pool, reused, t_ns);
        }
        let r = &mut self.records[id as usize];
        if !r.admitted {
            r.admitted = true;
            r.reused_first = reused;
        }
        r.reused_max = r.reused_max.max(reused);
        r.reused_entry = r.reused_entry.max(reused);
    }

    /// Disaggregated: the request's prefill finished at `held_ns` and `decode_worker`
    /// reserved its prompt blocks at `t_ns` (only the per-request log keeps handoff times).
    pub fn on_handoff_reserved(&mut self, id: RecordId, decode_worker: usize, held_ns: u64, t_ns: u64) {
        if let Some(log) = &mut self.log {
            log.reserved(id, decode_worker as u32, held_ns, t_ns);
        }
    }

    /// Disaggregated, destination first: the request's prefill ended at `held_ns`.
    pub fn on_handoff_held(&mut self, id: RecordId, held_ns: u64) {
        if let Some(log) = &mut self.log {
            log.held(id, held_ns);
        }
    }

    /// Disaggregated: the request's KV arrived at its decode worker at `t_ns`; its prefill
    /// worker freed the held KV at `released_ns`.
    pub fn on_handoff_activated(&mut self, id: RecordId, t_ns: u64, released_ns: u64) {
        if let Some(log) = &mut self.log {
            log.activated(id, t_ns, released_ns);
        }
    }

    /// Disaggregated: the decode worker admitted the activated request into its batch at
    /// `t_ns` (its first decode admission, reported as reusing `reused` tokens; it computes
    /// nothing of its prompt).
    pub fn on_decode_admitted(&mut self, id: RecordId, reused: u32, t_ns: u64) {
        if let Some(log) = &mut self.log {
            log.decode_admitted(id, reused, t_ns);
        }
        self.decode_reuse(id, reused);
    }

    /// The request received its token number `index` at `t_ns`, `itl_ns` after its
    /// previous one.
    #[inline]
    pub fn on_token(&mut self, id: RecordId, t_ns: u64, index: u32, itl_ns: u64) {
        let r = &mut self.records[id as usize];
        match index {
            0 => r.first_ns = t_ns,
            1 => r.second_ns = t_ns,
            _ => {}
        }
        r.tokens = index + 1;
        r.last_ns = t_ns;
        if index > 0 {
            self.on_gaps(itl_ns, 1);
        }
        if let Some(log) = &mut self.log {
            log.token(id, t_ns);
        }
    }

    /// With a request log, the time of one of the mid-stream tokens counted in bulk by
    /// [`Collector::on_gaps`].
    #[inline]
    pub fn on_steady_token(&mut self, id: RecordId, t_ns: u64) {
        if let Some(log) = &mut self.log {
            log.token(id, t_ns);
        }
    }

    /// `count` requests each received a mid-stream token (neither first, second nor last)
    /// `itl_ns` after their previous one; their records need no update until their last.
    #[inline]
    pub fn on_gaps(&mut self, itl_ns: u64, count: u64) {
        if itl_ns != self.run_gap_ns {
            self.flush_gaps();
            self.run_gap_ns = itl_ns;
        }
        self.run_len += count;
    }

    fn flush_gaps(&mut self) {
        if self.run_len == 0 {
            return;
        }
        self.gaps.add(self.run_gap_ns, self.run_len);
        self.run_len = 0;
    }

    /// The request finished at `t_ns` (after its last token).
    pub fn on_complete(&mut self, id: RecordId, t_ns: u64) {
        let r = self.records[id as usize];
        self.free.push(id);
        let completed = r.admitted && r.tokens > 0;
        if let Some(log) = &mut self.log {
            log.end(id, completed, t_ns, (r.worker, r.input_len, r.reused_entry));
        }
        if !completed {
            return;
        }
        self.completed += 1;
        self.input_tokens += u64::from(r.input_len);
        self.output_tokens += u64::from(r.tokens);
        self.reused += u64::from(r.reused_max);
        self.reused_first += u64::from(r.reused_first);
        self.duration_ns = self.duration_ns.max(t_ns);
        let ms = |ns: u64| ns as f64 / 1e6;
        let (ttft, e2e) =
            (ms(r.first_ns.saturating_sub(r.arrival_ns)), ms(r.last_ns.saturating_sub(r.arrival_ns)));
        self.ttft.push(ttft);
        self.e2e.push(e2e);
        if self.sla.any() && self.sla.is_good(ttft, e2e, r.tokens) {
            self.good += 1;
            self.good_tokens += u64::from(r.tokens);
        }
        let w = r.worker as usize;
        if self.workers.len() <= w {
            self.workers.resize(w + 1, (0, 0));
        }
        self.workers[w].0 += u64::from(r.input_len);
        self.workers[w].1 += u64::from(r.reused_entry);
        if r.tokens >= 2 {
            self.ttst.push(ms(r.second_ns - r.first_ns));
            self.tpot.push(ms(r.last_ns - r.first_ns) / f64::from(r.tokens - 1));
        }
        if !self.traffic.is_empty() {
            let itl =
                if r.tokens >= 2 { ms(r.last_ns - r.first_ns) / f64::from(r.tokens - 1) } else { f64::NAN };
            self.traffic.iter_mut().for_each(|w| w.on_completion(r.input_len, r.tokens, ttft, itl));
        }
    }

    /// The request ended at `t_ns` without completing (rejected); it counts only in
    /// `num_requests`.
    pub fn on_rejected(&mut self, id: RecordId, t_ns: u64) {
        self.free.push(id);
        if let Some(log) = &mut self.log {
            let r = &self.records[id as usize];
            log.end(id, false, t_ns, (r.worker, r.input_len, r.reused_entry));
        }
    }

    /// Requests still live.
    pub fn live(&self) -> usize {
        self.records.len() - self.free.len()
    }

    /// Folds everything into report inputs; the caller fills in engine-side totals.
    pub fn finish(mut self) -> SummaryInputs {
        self.flush_gaps();
        let (itl, per_user) = std::mem::take(&mut self.gaps).finish();
        SummaryInputs {
            num_requests: self.num_requests,
            completed_requests: self.completed,
            total_input_tokens: self.input_tokens,
            total_output_tokens: self.output_tokens,
            reused_input_tokens: self.reused,
            first_admission_reused_input_tokens: self.reused_first,
            duration_ms: self.duration_ns as f64 / 1e6,
            ttft_ms: self.ttft,
            ttst_ms: self.ttst,
            tpot_ms: self.tpot,
            e2e_latency_ms: self.e2e,
            itl_ms: itl,
            output_token_throughput_per_user: per_user,
            goodput: self
                .sla
                .any()
                .then_some(GoodputInputs { good_requests: self.good, good_output_tokens: self.good_tokens }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_come_from_token_times() {
        let mut c = Collector::new();
        let a = c.on_arrival(1_000_000, 10);
        c.on_admission(a, 0, 0);
        let mut last = 0;
        for (i, t) in [11_000_000, 14_000_000, 17_000_000, 21_000_000].into_iter().enumerate() {
            c.on_token(a, t, i as u32, if i == 0 { 0 } else { t - last });
            last = t;
        }
        c.on_complete(a, 21_000_000);
        let b = c.on_arrival(0, 5);
        c.on_rejected(b, 0);
        let mut s = c.finish();
        assert_eq!(s.num_requests, 2);
        assert_eq!(s.completed_requests, 1);
        assert_eq!(s.total_output_tokens, 4);
        assert_eq!(s.ttft_ms.summarize().mean, 10.0);
        assert_eq!(s.e2e_latency_ms.summarize().mean, 20.0);
        assert_eq!(s.ttst_ms.summarize().mean, 3.0);
        assert!((s.tpot_ms.summarize().mean - 10.0 / 3.0).abs() < 1e-12);
        let itl = s.itl_ms.summarize();
        assert!((itl.mean - 10.0 / 3.0).abs() < 1e-12);
        assert_eq!((itl.min, itl.max), (3.0, 4.0));
        assert_eq!(s.duration_ms, 21.0);
    }

    #[test]
    fn reuse_counts_the_best_admission_and_the_first() {
        let mut c = Collector::new();
        let a = c.on_arrival(0, 100);
        c.on_admission(a, 0, 0);
        c.on_admission(a, 64, 0);
        c.on_token(a, 5, 0, 0);
        c.on_complete(a, 5);
        let s = c.finish();
        assert_eq!(s.reused_input_tokens, 64);
        assert_eq!(s.first_admission_reused_input_tokens, 0);
    }
}
