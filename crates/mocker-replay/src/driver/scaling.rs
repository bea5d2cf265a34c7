//! Scaled pools: a policy's ticks, the workers it adds (after their start-up) and drains
//! (highest ids first), the snapshot it sees and the record of every worker's lifecycle.
//! None of it exists in a run without a policy.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use mocker_core::config::LaunchConfig;
use mocker_core::wave::Waves;

use super::{build_worker, Role, Sim};
use crate::options::{ms_to_ns, ReplayError};
use crate::request_log::uuid_string;
use crate::router::Router;
use crate::scaling::{
    ClusterSnapshot, FpmEntry, LifecycleOperation, OperationCause, PoolName, PoolState, ScalingPolicy,
    Transition, TransitionKind, WorkerState,
};

/// An idle active worker publishes an all-zero forward-pass entry once per this much
/// simulated time without a pass (as the reference's metrics heartbeat).
const IDLE_FPM_NS: u64 = 1_000_000_000;

/// One pool's workers by their id in the pool (ids are never reused).
pub(super) struct PoolTrack {
    pub(super) name: PoolName,
    /// What a new worker is built from.
    pub(super) launch: LaunchConfig,
    /// `startup_time` of the launch, ns (0: ready at once).
    startup_ns: u64,
    /// Data-parallel ranks per worker (more than one only in an aggregated pool).
    pub(super) dp: usize,
    /// Each worker's index among the driver's workers: its rank 0, the others after it.
    pub(super) members: Vec<usize>,
    pub(super) state: Vec<WorkerState>,
    /// The operation that began each worker's current phase.
    origin: Vec<Option<u64>>,
    /// When each worker was created and removed, for worker-seconds.
    created_ns: Vec<u64>,
    removed_ns: Vec<Option<u64>>,
    /// Latest pass per worker rank (`id * dp + rank`) since the last tick, and when it
    /// last published one.
    fpm: Vec<Option<FpmEntry>>,
    published_ns: Vec<u64>,
}

impl PoolTrack {
    fn ids(&self, state: WorkerState) -> Vec<usize> {
        (0..self.state.len()).filter(|&i| self.state[i] == state).collect()
    }

    pub(super) fn pool_state(&self) -> PoolState {
        PoolState {
            active: self.ids(WorkerState::Active),
            starting: self.ids(WorkerState::Starting),
            draining: self.ids(WorkerState::Draining),
        }
    }

    fn non_draining(&self) -> usize {
        self.state.iter().filter(|s| matches!(s, WorkerState::Active | WorkerState::Starting)).count()
    }

    /// Live worker-seconds up to `end_ns`.
    pub(super) fn worker_seconds(&self, end_ns: u64) -> f64 {
        (0..self.state.len())
            .map(|i| self.removed_ns[i].unwrap_or(end_ns).saturating_sub(self.created_ns[i]) as f64 / 1e9)
            .sum()
    }
}

/// A run's scaling state.
pub(super) struct Scaling {
    /// The aggregated (or prefill) pool, then the decode pool.
    pub(super) pools: Vec<PoolTrack>,
    /// Whether `initial_tick_ms` was asked.
    initialised: bool,
    next_tick_ns: Option<u64>,
    tick_ordinal: u64,
    /// Start-ups under way: (ready at, order, pool, id).
    startups: BinaryHeap<Reverse<(u64, u64, usize, usize)>>,
    startup_order: u64,
    /// Per driver worker, its last stepped pass's entry (published as the pass ends).
    stepped: Vec<FpmEntry>,
    capture: bool,
    pub(super) operations: Vec<LifecycleOperation>,
    next_operation: u64,
    /// Some worker drains (so settlements look).
    draining: usize,
}

impl Scaling {
    /// Scaling over `pools` (name, launch, each worker's first driver index), recording
    /// operations when `capture`.
    pub(super) fn new(
        pools: Vec<(PoolName, LaunchConfig, Vec<usize>)>,
        workers: usize,
        capture: bool,
    ) -> Self {
        let pools = pools
            .into_iter()
            .map(|(name, launch, members)| {
                let n = members.len();
                let dp = launch.dp_size.max(1);
                PoolTrack {
                    dp,
                    name,
                    startup_ns: ms_to_ns(launch.startup_time.unwrap_or(0.0) * 1000.0),
                    launch,
                    members,
                    state: vec![WorkerState::Active; n],
                    origin: vec![None; n],
                    created_ns: vec![0; n],
                    removed_ns: vec![None; n],
                    fpm: vec![None; n * dp],
                    published_ns: vec![0; n * dp],
                }
            })
            .collect();
        Self {
            pools,
            initialised: false,
            next_tick_ns: None,
            tick_ordinal: 0,
            startups: BinaryHeap::new(),
            startup_order: 0,
            stepped: vec![FpmEntry::default(); workers],
            capture,
            operations: Vec::new(),
            next_operation: 0,
            draining: 0,
        }
    }

    /// The next tick or start-up end, if any.
    pub(super) fn next_event(&self) -> Option<u64> {
        let startup = self.startups.peek().map(|Reverse((t, ..))| *t);
        [self.next_tick_ns, startup].into_iter().flatten().min()
    }

    fn record(&mut self, op: LifecycleOperation) {
        // Ordinals count every operation, recorded or not.
        if self.capture {
            self.operations.push(op);
        }
    }

    fn open_operation(
        &mut self,
        pool: usize,
        at: u64,
        cause: OperationCause,
        tick: Option<u64>,
        origin: Option<u64>,
    ) -> LifecycleOperation {
        let ordinal = self.next_operation;
        self.next_operation += 1;
        LifecycleOperation {
            operation_ordinal: ordinal,
            at_ms: at as f64 / 1e6,
            pool: self.pools[pool].name,
            cause,
            planner_tick_ordinal: tick,
            origin_operation_ordinal: origin,
            transitions: Vec::new(),
            state_after_batch: PoolState::default(),
            topology_released_request_uuids: Vec::new(),
        }
    }

    /// Returns an operation's ordinal to the counter when it stayed empty (empty batches
    /// are not operations).
    fn close_operation(&mut self, pool: usize, mut op: LifecycleOperation) {
        if op.transitions.is_empty() {
            self.next_operation -= 1;
            return;
        }
        op.state_after_batch = self.pools[pool].pool_state();
        self.record(op);
    }
}

impl Sim {
    /// Ticks and start-ups due: the run loop's part. Asks the policy for its first tick
    /// once the t=0 instant has settled; fires a tick due by `now` (after everything else
    /// at `now` has settled). Returns whether a tick fired (the instant must settle again).
    pub(super) fn scaling_tick(
        &mut self,
        now: u64,
        policy: &mut dyn ScalingPolicy,
    ) -> Result<bool, ReplayError> {
        let Some(sc) = self.scaling.as_mut() else { return Ok(false) };
        if !sc.initialised {
            sc.initialised = true;
            let first = policy.initial_tick_ms()?;
            sc.next_tick_ns = first.is_finite().then(|| ms_to_ns(first.max(0.0)));
            if sc.next_tick_ns.is_none() {
                return Ok(false);
            }
        }
        if self.done() {
            return Ok(false);
        }
        let sc = self.scaling.as_mut().expect("checked");
        match sc.next_tick_ns {
            Some(t) if t <= now => {}
            _ => return Ok(false),
        }
        let snapshot = self.snapshot(now);
        let decision = policy.on_tick(&snapshot)?;
        let sc = self.scaling.as_mut().expect("checked");
        let tick = sc.tick_ordinal;
        sc.tick_ordinal += 1;
        let now_ms = now as f64 / 1e6;
        sc.next_tick_ns = decision.next_tick_ms.filter(|t| t.is_finite() && *t > now_ms).map(ms_to_ns);
        if sc.pools.len() == 1 {
            if let Some(target) = decision.target_decode {
                self.scale_pool(0, target, now, tick);
            }
        } else if decision.target_prefill.is_some() || decision.target_decode.is_some() {
            for (pool, target) in [(0, decision.target_prefill), (1, decision.target_decode)] {
                let sc = self.scaling.as_ref().expect("checked");
                let target = target.unwrap_or_else(|| sc.pools[pool].non_draining());
                self.scale_pool(pool, target, now, tick);
            }
        }
        // Workers that came up at once may take queued work.
        let mut released = Vec::new();
        self.release_queued_into(now, Some(&mut released));
        if let Some(op) = self.scaling.as_mut().and_then(|sc| sc.operations.last_mut()) {
            if op.at_ms == now as f64 / 1e6
                && op.cause == OperationCause::PlannerScale
                && op.planner_tick_ordinal == Some(tick)
            {
                op.topology_released_request_uuids.extend(released.into_iter().map(uuid_string));
            }
        }
        Ok(true)
    }

    /// The state a policy sees at `now`; drains the tick's traffic window and FPM buffer.
    fn snapshot(&mut self, now: u64) -> ClusterSnapshot {
        let traffic = self.collector.traffic(0).drain(now as f64 / 1e6);
        let sc = self.scaling.as_mut().expect("a scaled run");
        let mut fpm = [Vec::new(), Vec::new()];
        for (p, pool) in sc.pools.iter_mut().enumerate() {
            for k in 0..pool.fpm.len() {
                let (id, rank) = (k / pool.dp, k % pool.dp);
                let entry = pool.fpm[k].take();
                if pool.state[id] != WorkerState::Active {
                    continue;
                }
                match entry {
                    Some(e) => fpm[p].push(e),
                    None if now.saturating_sub(pool.published_ns[k]) >= IDLE_FPM_NS => {
                        let idle = (now - pool.published_ns[k]) / IDLE_FPM_NS;
                        pool.published_ns[k] += idle * IDLE_FPM_NS;
                        fpm[p].push(FpmEntry::idle(id, rank as u32));
                    }
                    None => {}
                }
            }
        }
        let [first, second] = fpm;
        let (prefill_fpm, decode_fpm) =
            if sc.pools.len() == 1 { (Vec::new(), first) } else { (first, second) };
        let state = |i: usize| sc.pools.get(i).map(PoolTrack::pool_state).unwrap_or_default();
        let (p, d) =
            if sc.pools.len() == 1 { (PoolState::default(), state(0)) } else { (state(0), state(1)) };
        let tick_ordinal = sc.tick_ordinal;
        ClusterSnapshot {
            tick_ordinal,
            now_ms: now as f64 / 1e6,
            prefill_fpm_snapshots: prefill_fpm,
            decode_fpm_snapshots: decode_fpm,
            active_prefill_count: p.active.len(),
            active_decode_count: d.active.len(),
            starting_prefill_count: p.starting.len(),
            starting_decode_count: d.starting.len(),
            draining_prefill_count: p.draining.len(),
            draining_decode_count: d.draining.len(),
            non_draining_prefill_count: p.active.len() + p.starting.len(),
            non_draining_decode_count: d.active.len() + d.starting.len(),
            total_prefill_count: p.active.len() + p.starting.len() + p.draining.len(),
            total_decode_count: d.active.len() + d.starting.len() + d.draining.len(),
            active_prefill_ids: p.active,
            active_decode_ids: d.active,
            starting_prefill_ids: p.starting,
            starting_decode_ids: d.starting,
            draining_prefill_ids: p.draining,
            draining_decode_ids: d.draining,
            traffic,
        }
    }

    /// Moves pool `p` to `target` non-draining workers at `now` (tick `tick`).
    fn scale_pool(&mut self, p: usize, target: usize, now: u64, tick: u64) {
        let sc = self.scaling.as_mut().expect("a scaled run");
        let current = sc.pools[p].non_draining();
        if target == current {
            return;
        }
        if target > current {
            let mut op = sc.open_operation(p, now, OperationCause::PlannerScale, Some(tick), None);
            let ordinal = op.operation_ordinal;
            for _ in current..target {
                self.add_worker(p, now, ordinal, &mut op);
            }
            let sc = self.scaling.as_mut().expect("a scaled run");
            sc.close_operation(p, op);
            return;
        }
        // Cancel start-ups first, highest id first; then drain the highest active ids.
        let mut remove = current - target;
        let pool = &sc.pools[p];
        let starting: Vec<usize> = pool.ids(WorkerState::Starting).into_iter().rev().take(remove).collect();
        remove -= starting.len();
        let active: Vec<usize> = pool.ids(WorkerState::Active).into_iter().rev().take(remove).collect();
        let origin = starting.first().and_then(|&id| pool.origin[id]);
        let mut op = sc.open_operation(p, now, OperationCause::PlannerScale, Some(tick), origin);
        let ordinal = op.operation_ordinal;
        for &id in &starting {
            let pool = &mut sc.pools[p];
            pool.state[id] = WorkerState::Removed;
            pool.removed_ns[id] = Some(now);
            op.transitions.push(Transition {
                worker_id: id,
                transition: TransitionKind::WorkerRemoved,
                prior_state: Some(WorkerState::Starting),
                state: WorkerState::Removed,
                origin_operation_ordinal: pool.origin[id],
                reason: Some("startup_cancelled"),
            });
        }
        let mut removed = Vec::new();
        for &id in &active {
            let pool = &mut sc.pools[p];
            pool.state[id] = WorkerState::Draining;
            pool.origin[id] = Some(ordinal);
            sc.draining += 1;
            op.transitions.push(Transition {
                worker_id: id,
                transition: TransitionKind::WorkerDraining,
                prior_state: Some(WorkerState::Active),
                state: WorkerState::Draining,
                origin_operation_ordinal: Some(ordinal),
                reason: None,
            });
        }
        let dp = sc.pools[p].dp;
        for &id in &active {
            if let Some(r) = self.router_of(p) {
                leave(r, id, dp);
            }
            if self.drained(p, id) {
                removed.push(id);
            }
        }
        for id in removed {
            let t = self.remove_worker(p, id, now);
            op.transitions.push(t);
        }
        let sc = self.scaling.as_mut().expect("a scaled run");
        sc.close_operation(p, op);
    }

    /// Creates a worker in pool `p` at `now` (operation `ordinal`): starting, or active at
    /// once without a start-up time.
    fn add_worker(&mut self, p: usize, now: u64, ordinal: u64, op: &mut LifecycleOperation) {
        let w = self.workers.len();
        let sc = self.scaling.as_mut().expect("a scaled run");
        let pool = &mut sc.pools[p];
        let id = pool.members.len();
        let (launch, startup_ns, dp) = (pool.launch.clone(), pool.startup_ns, pool.dp);
        let role = match pool.name {
            PoolName::Agg => Role::Aggregated,
            PoolName::Prefill => Role::Prefill,
            PoolName::Decode => Role::Decode,
        };
        pool.members.push(w);
        pool.state.push(WorkerState::Starting);
        pool.origin.push(Some(ordinal));
        pool.created_ns.push(now);
        pool.removed_ns.push(None);
        pool.fpm.extend(std::iter::repeat_n(None, dp));
        pool.published_ns.extend(std::iter::repeat_n(now, dp));
        sc.stepped.extend(std::iter::repeat_n(FpmEntry::default(), dp));
        let record_events = self.router_of(p).is_some_and(|r| r.wants_kv_events());
        for rank in 0..dp {
            // The launch built this pool's first workers, so it builds this one.
            let mut worker = build_worker(self.template, &launch, role, record_events, id, rank)
                .expect("a launch that built the pool builds more of it");
            if let Some(tier) = &self.shared_g3 {
                let index = tier.lock().expect("G3 tier lock").add_worker();
                worker.engine.share_g3(tier.clone(), index);
            }
            self.workers.push(worker);
            if p == 0 {
                self.entry_members.push(w + rank);
            }
        }
        if dp > 1 {
            self.waves.push(Waves::new(dp));
            self.rr_ranks.push(0);
        }
        if role == Role::Decode {
            let d = self.disagg.as_mut().expect("decode workers are disaggregated");
            let pool_id = d.add_worker(w);
            debug_assert_eq!(pool_id, id);
        }
        // The router knows every id (so its indices stay the pool's ids), but can choose
        // a worker only once it is ready.
        if let Some(Router::Kv(r)) = self.router_of(p) {
            for rank in 0..dp {
                let index = r.add_worker();
                debug_assert_eq!(index, id * dp + rank);
                r.set_ineligible(index);
            }
        }
        let sc = self.scaling.as_mut().expect("a scaled run");
        op.transitions.push(Transition {
            worker_id: id,
            transition: if startup_ns == 0 {
                TransitionKind::WorkerReady
            } else {
                TransitionKind::WorkerStarting
            },
            prior_state: None,
            state: if startup_ns == 0 { WorkerState::Active } else { WorkerState::Starting },
            origin_operation_ordinal: Some(ordinal),
            reason: None,
        });
        if startup_ns == 0 {
            self.activate_worker(p, id, now);
        } else {
            let order = sc.startup_order;
            sc.startup_order += 1;
            sc.startups.push(Reverse((now + startup_ns, order, p, id)));
        }
    }

    /// Worker `id` of pool `p` serves from `now` on.
    fn activate_worker(&mut self, p: usize, id: usize, now: u64) {
        let sc = self.scaling.as_mut().expect("a scaled run");
        let pool = &mut sc.pools[p];
        pool.state[id] = WorkerState::Active;
        let dp = pool.dp;
        pool.published_ns[id * dp..(id + 1) * dp].fill(now);
        match self.router_of(p) {
            Some(Router::Kv(r)) => (id * dp..(id + 1) * dp).for_each(|i| r.set_eligible(i)),
            // Round robin picks workers (a worker its ranks in turn).
            Some(Router::RoundRobin(rr)) => rr.add(id),
            None => {}
        }
        // Work that waited for a worker of this pool goes on.
        if p == 1 {
            self.unpark_handoffs(now);
        } else if self.disagg.is_some() {
            while self.router.can_place() {
                let Some((sid, rec, request, handoff)) = self.parked.pop_front() else { break };
                self.place_request(sid, rec, request, handoff, now);
            }
        }
    }

    /// Start-ups that end by `now`: each its own operation. Returns whether any did.
    pub(super) fn ready_due(&mut self, now: u64) -> bool {
        let mut any = false;
        loop {
            let Some(sc) = self.scaling.as_mut() else { return any };
            let Some(&Reverse((t, _, p, id))) = sc.startups.peek() else { return any };
            if t > now {
                return any;
            }
            sc.startups.pop();
            if sc.pools[p].state[id] != WorkerState::Starting {
                continue; // cancelled
            }
            let origin = sc.pools[p].origin[id];
            let mut op = sc.open_operation(p, now, OperationCause::WorkerReadyEvent, None, origin);
            op.transitions.push(Transition {
                worker_id: id,
                transition: TransitionKind::WorkerReady,
                prior_state: Some(WorkerState::Starting),
                state: WorkerState::Active,
                origin_operation_ordinal: origin,
                reason: None,
            });
            self.activate_worker(p, id, now);
            let mut released = Vec::new();
            self.release_queued_into(now, Some(&mut released));
            op.topology_released_request_uuids = released.into_iter().map(uuid_string).collect();
            let sc = self.scaling.as_mut().expect("a scaled run");
            sc.close_operation(p, op);
            any = true;
        }
    }

    /// Removes the draining workers that hold nothing any more, each in its own operation.
    pub(super) fn settle_drained(&mut self, now: u64) {
        let Some(sc) = self.scaling.as_ref() else { return };
        if sc.draining == 0 {
            return;
        }
        for p in 0..sc.pools.len() {
            let sc = self.scaling.as_ref().expect("a scaled run");
            let draining = sc.pools[p].ids(WorkerState::Draining);
            for id in draining {
                if !self.drained(p, id) {
                    continue;
                }
                let sc = self.scaling.as_mut().expect("a scaled run");
                let origin = sc.pools[p].origin[id];
                let mut op = sc.open_operation(p, now, OperationCause::DrainSettlement, None, origin);
                let t = self.remove_worker(p, id, now);
                op.transitions.push(t);
                let sc = self.scaling.as_mut().expect("a scaled run");
                sc.close_operation(p, op);
            }
        }
    }

    /// Whether draining worker `id` of pool `p` holds nothing: no pass under way, no
    /// request, no held source, no handoff on its way to it.
    fn drained(&self, p: usize, id: usize) -> bool {
        let sc = self.scaling.as_ref().expect("a scaled run");
        let (first, dp) = (sc.pools[p].members[id], sc.pools[p].dp);
        self.workers[first..first + dp].iter().all(|worker| {
            !worker.busy
                && worker.engine.num_requests() == 0
                && worker.engine.num_parked() == 0
                && (worker.role != Role::Decode || self.disagg.as_ref().is_none_or(|d| d.idle(id)))
        })
    }

    /// Removes draining worker `id` of pool `p` at `now`; returns its transition.
    fn remove_worker(&mut self, p: usize, id: usize, now: u64) -> Transition {
        let sc = self.scaling.as_mut().expect("a scaled run");
        let pool = &mut sc.pools[p];
        pool.state[id] = WorkerState::Removed;
        pool.removed_ns[id] = Some(now);
        sc.draining -= 1;
        let (origin, dp) = (pool.origin[id], pool.dp);
        if let Some(Router::Kv(r)) = self.router_of(p) {
            (id * dp..(id + 1) * dp).for_each(|i| r.remove_worker(i));
        }
        Transition {
            worker_id: id,
            transition: TransitionKind::WorkerRemoved,
            prior_state: Some(WorkerState::Draining),
            state: WorkerState::Removed,
            origin_operation_ordinal: origin,
            reason: None,
        }
    }

    /// The router of pool `p` (0: aggregated or prefill, 1: decode).
    fn router_of(&mut self, p: usize) -> Option<&mut Router> {
        match p {
            0 => Some(&mut self.router),
            _ => self.disagg.as_mut().map(|d| &mut d.router),
        }
    }

    /// Driver worker `w`'s pass was just stepped: keep its forward-pass metrics, published
    /// as the pass ends.
    pub(super) fn note_stepped(&mut self, w: usize) {
        let Some(sc) = self.scaling.as_mut() else { return };
        let worker = &self.workers[w];
        let dp = sc.pools[usize::from(worker.role == Role::Decode)].dp;
        let pass = worker.engine.last_pass();
        let m = &pass.metrics;
        let q = worker.engine.queued_work();
        sc.stepped[w] = FpmEntry {
            worker_id: worker.pool_id / dp,
            dp_rank: m.dp_rank,
            wall_time: pass.end_ns.saturating_sub(pass.start_ns) as f64 / 1e9,
            num_prefill_requests: m.num_prefill_requests as u64,
            sum_prefill_tokens: m.sum_prefill_tokens as u64,
            var_prefill_length: m.prefill_lengths.variance(),
            sum_prefill_kv_tokens: m.sum_prefill_kv_tokens as u64,
            num_decode_requests: m.decode_lengths.count,
            sum_decode_kv_tokens: m.decode_lengths.sum,
            var_decode_kv_tokens: m.decode_lengths.variance(),
            num_queued_prefill: q.prefill.count,
            sum_queued_prefill_tokens: q.prefill.sum,
            var_queued_prefill_length: q.prefill.variance(),
            num_queued_decode: q.decode.count,
            sum_queued_decode_kv_tokens: q.decode.sum,
            var_queued_decode_kv_tokens: q.decode.variance(),
        };
    }

    /// Driver worker `w`'s pass ended at `t`: its metrics become the latest.
    pub(super) fn note_delivered(&mut self, w: usize, t: u64) {
        let Some(sc) = self.scaling.as_mut() else { return };
        // `pool_id` is the worker rank's index, `id * dp + rank`.
        let k = self.workers[w].pool_id;
        let p = usize::from(self.workers[w].role == Role::Decode);
        let pool = &mut sc.pools[p];
        pool.fpm[k] = Some(sc.stepped[w]);
        pool.published_ns[k] = t;
    }
}

/// A draining worker (all `dp` of its ranks) leaves its router's choices.
fn leave(router: &mut Router, id: usize, dp: usize) {
    match router {
        Router::Kv(r) => (id * dp..(id + 1) * dp).for_each(|i| r.set_ineligible(i)),
        Router::RoundRobin(rr) => rr.remove(id),
    }
}
