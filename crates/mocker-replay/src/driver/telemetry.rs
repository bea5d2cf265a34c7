//! Telemetry samples over simulated time: taken once an instant has settled (before a
//! policy's tick at the same instant), from gauges cached as the reference publishes them.

use mocker_core::config::Backend;
use mocker_core::metrics::EngineMetrics;

use super::{Role, Sim};
use crate::options::ReplayError;
use crate::scaling::{PoolName, PoolState, WorkerState};
use crate::telemetry::{
    GaugeRow, IntervalCounters, SampleKind, SampleTraffic, TelemetrySample, TelemetrySink,
};

/// A run's sampling state.
pub(super) struct Telemetry {
    interval_ns: u64,
    /// The next periodic sample (`None`: the baseline is still to come, or sampling ended).
    next_ns: Option<u64>,
    baseline_taken: bool,
    ordinal: u64,
    /// When the last sample was taken, ms.
    last_ms: f64,
    /// Its traffic window in the collector.
    window: usize,
    /// Per pool, the counters summed at the last sample.
    totals: [IntervalCounters; 2],
    /// Per driver worker, its gauges as last published.
    gauges: Vec<EngineMetrics>,
    /// Per driver worker, its prefix-cache (hit, looked-up) tokens as of its last completed
    /// pass: the reference adds a pass's cache counters as the pass completes.
    cache_at_completion: Vec<(u64, u64)>,
}

impl Telemetry {
    /// Sampling every `interval_ns`, reading collector traffic window `window`.
    pub(super) fn new(interval_ns: u64, window: usize) -> Self {
        Self {
            interval_ns,
            next_ns: None,
            baseline_taken: false,
            ordinal: 0,
            last_ms: 0.0,
            window,
            totals: Default::default(),
            gauges: Vec::new(),
            cache_at_completion: Vec::new(),
        }
    }

    /// When the next sample is due.
    pub(super) fn next_event(&self) -> Option<u64> {
        self.next_ns
    }
}

impl Sim {
    /// Worker `w` published its state: its pass completed, or a request was submitted to
    /// it. Either way the reference publishes the scheduler's state at that moment: what
    /// the pass just completed left, plus what arrived since.
    pub(super) fn publish_gauges(&mut self, w: usize) {
        let Some(t) = self.telemetry.as_mut() else { return };
        if t.gauges.len() <= w {
            t.gauges.resize(w + 1, EngineMetrics::default());
        }
        t.gauges[w] = self.workers[w].engine.metrics();
        if self.workers[w].role == Role::Decode {
            // Handoffs routed here and not reserved yet wait in the reference's engine.
            let i = self.workers[w].pool_id;
            if let Some(d) = self.disagg.as_ref() {
                t.gauges[w].waiting_requests += d.inbox_len(i);
            }
        }
    }

    /// Worker `w`'s pass completed: its state is published, and its cache counters added.
    pub(super) fn publish_completion(&mut self, w: usize) {
        self.publish_gauges(w);
        let Some(t) = self.telemetry.as_mut() else { return };
        if t.cache_at_completion.len() <= w {
            t.cache_at_completion.resize(w + 1, (0, 0));
        }
        let g = &t.gauges[w];
        t.cache_at_completion[w] = (g.prefix_cache_hits_total, g.prefix_cache_queries_total);
    }

    /// Samples due at `now` (the instant has settled): the baseline first, then a periodic
    /// one. Schedules the next while the workload is unfinished.
    pub(super) fn sample_due(&mut self, now: u64, sink: &mut TelemetrySink<'_>) -> Result<(), ReplayError> {
        let Some(t) = self.telemetry.as_mut() else { return Ok(()) };
        if !t.baseline_taken {
            t.baseline_taken = true;
            t.next_ns = Some(t.interval_ns);
            let sample = self.sample(now, SampleKind::Baseline);
            sink(&sample)?;
        }
        let t = self.telemetry.as_mut().expect("checked");
        if t.next_ns.is_some_and(|s| s <= now) {
            let sample = self.sample(now, SampleKind::Periodic);
            sink(&sample)?;
            let done = self.done();
            let t = self.telemetry.as_mut().expect("checked");
            let next = t.next_ns.expect("due") + t.interval_ns;
            t.next_ns = (!done).then_some(next);
        }
        Ok(())
    }

    /// The run ended at `now`: a final sample if anything happened since the last one.
    pub(super) fn sample_final(&mut self, now: u64, sink: &mut TelemetrySink<'_>) -> Result<(), ReplayError> {
        let Some(t) = self.telemetry.as_mut() else { return Ok(()) };
        let window = t.window;
        let moved = now as f64 / 1e6 > t.last_ms || self.collector.traffic(window).has_observations();
        if moved || self.counters_moved() {
            let sample = self.sample(now, SampleKind::Final);
            sink(&sample)?;
        }
        Ok(())
    }

    fn counters_moved(&mut self) -> bool {
        let Some(t) = self.telemetry.as_ref() else { return false };
        let totals = t.totals;
        (0..2).any(|p| self.pool_counters(p) != totals[p])
    }

    /// Pool `p`'s counters summed over every worker it ever had (removed ones too).
    fn pool_counters(&self, p: usize) -> IntervalCounters {
        let Some(sc) = self.scaling.as_ref() else { return IntervalCounters::default() };
        let Some(pool) = sc.pools.get(p) else { return IntervalCounters::default() };
        let Some(t) = self.telemetry.as_ref() else { return IntervalCounters::default() };
        let mut c = IntervalCounters::default();
        for w in pool.members.iter().flat_map(|&first| first..first + pool.dp) {
            c.preemptions += t.gauges.get(w).map_or(0, |g| g.num_preemptions_total);
            // The reference's cache counters are SGLang's scheduler's: vLLM reports none.
            if self.workers[w].engine.backend() == Backend::Sglang {
                let (hits, total) = t.cache_at_completion.get(w).copied().unwrap_or_default();
                c.cache_hit_tokens += hits;
                c.cache_total_tokens += total;
            }
        }
        c
    }

    fn sample(&mut self, now: u64, kind: SampleKind) -> TelemetrySample {
        let now_ms = now as f64 / 1e6;
        let t = self.telemetry.as_ref().expect("sampling");
        let (window, ordinal, last_ms) = (t.window, t.ordinal, t.last_ms);
        let interval_start_ms = if kind == SampleKind::Baseline { 0.0 } else { last_ms };
        let traffic = match kind {
            // The baseline has gauges only; it does not close the first interval.
            SampleKind::Baseline => SampleTraffic::default(),
            _ => self.collector.traffic(window).drain(now_ms).into(),
        };
        let counters = [self.pool_counters(0), self.pool_counters(1)];
        let t = self.telemetry.as_mut().expect("sampling");
        let mut interval = [IntervalCounters::default(); 2];
        if kind != SampleKind::Baseline {
            for p in 0..2 {
                interval[p] = IntervalCounters {
                    cache_hit_tokens: counters[p].cache_hit_tokens - t.totals[p].cache_hit_tokens,
                    cache_total_tokens: counters[p].cache_total_tokens - t.totals[p].cache_total_tokens,
                    preemptions: counters[p].preemptions - t.totals[p].preemptions,
                };
            }
            t.totals = counters;
            t.last_ms = now_ms;
        }
        t.ordinal += 1;
        let sc = self.scaling.as_ref().expect("telemetry tracks the pools");
        let t = self.telemetry.as_ref().expect("sampling");
        let rows = |p: usize| -> Vec<GaugeRow> {
            let Some(pool) = sc.pools.get(p) else { return Vec::new() };
            (0..pool.state.len())
                .filter(|&id| pool.state[id] != WorkerState::Removed)
                .flat_map(|id| (0..pool.dp).map(move |rank| (id, rank)))
                .map(|(id, rank)| {
                    let w = pool.members[id] + rank;
                    let g = t.gauges.get(w).copied().unwrap_or_default();
                    let total = self.workers[w].engine.metrics().total_blocks;
                    gauge_row(id, rank as u32, &g, total)
                })
                .collect()
        };
        let ids = |p: usize| sc.pools.get(p).map(|pool| pool.pool_state()).unwrap_or_default();
        let pending = self.queue.as_ref().map_or(0, |q| q.len() as u64);
        let aggregated = sc.pools.len() == 1;
        let (prefill_rows, decode_rows, pi, di, p_ids, d_ids) = if aggregated {
            (Vec::new(), rows(0), IntervalCounters::default(), interval[0], PoolState::default(), ids(0))
        } else {
            (rows(0), rows(1), interval[0], interval[1], ids(0), ids(1))
        };
        debug_assert!(aggregated || sc.pools[0].name == PoolName::Prefill);
        TelemetrySample {
            sample_ordinal: ordinal,
            kind,
            interval_start_ms,
            sampled_at_ms: now_ms,
            traffic,
            prefill_scheduler_metrics: prefill_rows,
            decode_scheduler_metrics: decode_rows,
            prefill_interval_metrics: pi,
            decode_interval_metrics: di,
            router_pending_prefill_requests: if aggregated { 0 } else { pending },
            router_pending_decode_requests: if aggregated { pending } else { 0 },
            active_prefill_ids: p_ids.active,
            active_decode_ids: d_ids.active,
            starting_prefill_ids: p_ids.starting,
            starting_decode_ids: d_ids.starting,
            draining_prefill_ids: p_ids.draining,
            draining_decode_ids: d_ids.draining,
        }
    }
}

/// A gauge row of worker `id`'s rank `rank` from its published metrics (`total`: its
/// capacity, known before it ever published).
fn gauge_row(id: usize, rank: u32, g: &EngineMetrics, total: usize) -> GaugeRow {
    let total = total as u64;
    let (active, inactive) = (g.active_blocks as u64, g.inactive_blocks as u64);
    let share = |n: u64| if total == 0 { 0.0 } else { n as f64 / total as f64 };
    GaugeRow {
        worker_id: id,
        dp_rank: rank,
        active_blocks: active,
        inactive_blocks: inactive,
        total_blocks: total,
        active_cache_usage: share(active),
        physical_cache_usage: share(active + inactive),
        running_requests: g.running_requests as u64,
        waiting_requests: g.waiting_requests as u64,
        kv_cache_used_bytes: g.kv_cache_used_bytes,
        kv_cache_capacity_bytes: g.kv_cache_capacity_bytes,
    }
}
