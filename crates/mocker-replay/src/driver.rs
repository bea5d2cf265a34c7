//! The offline discrete-event loop: W engines on one simulated clock that jumps from event
//! to event (arrivals, pass ends, delayed turns) and never sleeps.
//!
//! Pass ends sit in a heap and only workers that got work or finished a pass are looked
//! at, so an event costs O(log W), not O(W), with many workers. A worker whose requests
//! all decode steadily with nothing waiting runs many passes as one event (a steady run,
//! see `Engine::extend_steady_run`): nobody else can observe those passes, and a request
//! routed to it mid-run truncates the run to the passes that started before it arrived.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use mocker_core::config::{Backend, LaunchConfig};
use mocker_core::hashing::PromptHashes;
use mocker_core::wave::Waves;
use mocker_core::{Engine, EngineOptions, Request};

use crate::collector::{Collector, RecordId};
use crate::deps::{Deps, SessionId};
use crate::feed::{FeedOptions, PlannedSession, PlannedTurn, PromptHashing, SessionFeed};
use crate::lanes::Lanes;
use crate::options::{ms_to_ns, Cluster, ReplayError, ReplayOptions, Workload};
use crate::pass_log::PassRecord;
use crate::report::Summary;
use crate::request_log::PoolKind;
use crate::request_log::RequestRecord;
use crate::router::{RouteId, RouteRequest, Router, RouterMode, RouterQueue};
use crate::trace::DepTrigger;

mod handoff;
mod scaling;
mod telemetry;
use handoff::{Disagg, HandoffId};
use scaling::Scaling;
use telemetry::Telemetry;

use crate::scaling::{LifecycleOperation, PoolName, ScalingPolicy};

/// A finished replay.
#[derive(Debug, Clone)]
pub struct ReplayOutcome {
    /// The report's summary (`.summary` of the reference).
    pub summary: Summary,
    /// Per worker: (input tokens, reused tokens) of the requests it completed.
    pub worker_tokens: Vec<(u64, u64)>,
    /// Every worker's lifecycle in a scaled run (empty without a policy, or without
    /// `Hooks::capture_planner_details`).
    pub lifecycle_operations: Vec<LifecycleOperation>,
}

/// Callbacks a replay reports through while it runs.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Called now and then with (requests finished, total requests, simulated ms).
    pub progress: Option<&'a mut dyn FnMut(usize, usize, f64)>,
    /// Called with each request's record as it ends (completed or rejected); setting it
    /// makes the replay keep every token time of live requests.
    pub request_ended: Option<&'a mut dyn FnMut(RequestRecord)>,
    /// Called with each simulated forward pass as it completes (`--report-passes`).
    pub pass_ended: Option<&'a mut dyn FnMut(PassRecord)>,
    /// Scales the pools on simulated-time ticks (the reference's `scaling_policy`).
    pub scaling_policy: Option<&'a mut dyn ScalingPolicy>,
    /// With a policy: record every worker's lifecycle in the outcome.
    pub capture_planner_details: bool,
    /// Receives telemetry samples (the reference's `capture_telemetry` and its sinks).
    pub telemetry: Option<crate::telemetry::TelemetrySink<'a>>,
    /// Simulated ms between telemetry samples (with `telemetry`).
    pub telemetry_interval_ms: f64,
}

/// What a worker does with the requests it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Prefills and decodes.
    Aggregated,
    /// Prefills, then holds the KV for the handoff (its token is not the user's).
    Prefill,
    /// Decodes requests whose KV it received.
    Decode,
}

struct Worker {
    engine: Engine,
    role: Role,
    /// Its index in its pool's router: the id in the pool (aggregated with data
    /// parallelism: worker `i`'s rank `r` is `i * dp + r`).
    pool_id: usize,
    busy: bool,
    /// Bumped when the worker's pending heap entry is replaced (a truncated run): entries
    /// carrying an older value are stale.
    generation: u32,
    /// The `drain` iteration in which its pending pass (a run's first) started.
    iteration: u32,
    /// Whether the worker is listed in `Sim::dirty`.
    dirty: bool,
    /// Owner of the request in each engine slot.
    owners: Vec<SlotOwner>,
}

/// Who a request in an engine slot belongs to.
#[derive(Debug, Clone, Copy, Default)]
struct SlotOwner {
    record: RecordId,
    session: SessionId,
    route: RouteId,
    /// First token not seen yet (the router still counts its prefill).
    prefilling: bool,
    /// Its handoff, on a prefill worker.
    handoff: HandoffId,
}

/// A turn held in the router queue.
struct Queued {
    sid: SessionId,
    record: RecordId,
    turn: PlannedTurn,
}

/// Requests from which the ITL sketches are built on a helper thread: below, starting
/// it costs more than the logarithms it takes off the simulation's thread.
const GAP_THREAD_MIN_REQUESTS: usize = 2_000;

/// A pending pass end: (end, start, drain iteration at the start, worker, generation).
type PassKey = (u64, u64, u32, usize, u32);

/// The heap key of a pass ending at `end`. Aggregated passes ending together complete in
/// the order they started; disaggregated ones in worker order, prefill pool first (the
/// reference's disagg replay orders simultaneous pass completions by stage and worker).
fn pass_key(disaggregated: bool, end: u64, start: u64, at: u32, w: usize, generation: u32) -> PassKey {
    if disaggregated {
        (end, 0, 0, w, generation)
    } else {
        (end, start, at, w, generation)
    }
}

/// How the run's engines are built (a scaled pool builds more as it runs).
#[derive(Clone, Copy)]
struct WorkerTemplate {
    /// Per-request logs need every token's time; aggregate reports only counts.
    aggregate_steady_tokens: bool,
    opaque_output_blocks: bool,
}

fn build_worker(
    template: WorkerTemplate,
    launch: &LaunchConfig,
    role: Role,
    record_kv_events: bool,
    index: usize,
    rank: usize,
) -> Result<Worker, ReplayError> {
    let engine = Engine::new(EngineOptions {
        // The reference seeds each rank's MTP sampler at `worker * dp_size + rank`.
        seed_offset: (index * launch.dp_size + rank) as u64,
        dp_rank: rank as u32,
        dp_size: launch.dp_size,
        config: launch.engine.clone(),
        record_kv_events,
        aggregate_steady_tokens: template.aggregate_steady_tokens,
        opaque_output_blocks: template.opaque_output_blocks,
        // Traces name no adapters.
        max_loras: 0,
    })?;
    Ok(Worker {
        engine,
        role,
        pool_id: index * launch.dp_size.max(1) + rank,
        busy: false,
        generation: 0,
        iteration: 0,
        dirty: false,
        owners: Vec::new(),
    })
}

/// One G3 tier for every engine of the pool (and those a scaled pool adds), when
/// `g3_offload` is `cluster_shared`.
fn shared_g3_tier(launch: &LaunchConfig, engines: usize) -> Option<mocker_core::kv::SharedG3> {
    let g3 = launch.engine.g3_offload.as_ref()?;
    if g3.scope != mocker_core::config::G3Scope::ClusterShared {
        return None;
    }
    let bytes = launch.engine.kv_cache_bytes_per_token.unwrap_or(1) * launch.engine.block_size as u64;
    let tier = mocker_core::kv::G3Tier::new(g3, engines, bytes);
    Some(std::sync::Arc::new(std::sync::Mutex::new(tier)))
}

struct Sim {
    /// The aggregated or prefill pool (indices from 0), then the decode pool; a scaled
    /// pool's new workers follow them all.
    workers: Vec<Worker>,
    template: WorkerTemplate,
    /// The pools' workers by state, for a policy or telemetry (`None`: fixed for the whole
    /// run, and nobody asks).
    scaling: Option<Box<Scaling>>,
    /// Telemetry sampling, when a sink takes samples.
    telemetry: Option<Box<Telemetry>>,
    /// A request found no worker to go to (a scaled pool at zero): the run stops.
    placement_error: Option<ReplayError>,
    /// Each aggregated or prefill worker rank's index among `workers`, by its router index.
    entry_members: Vec<usize>,
    /// With KV cache groups: each group's peak bytes on one worker (empty without groups).
    group_peaks: Vec<u64>,
    /// The pool's G3 tier when it is `cluster_shared` across several engines.
    shared_g3: Option<mocker_core::kv::SharedG3>,
    /// Disaggregated: requests waiting for a prefill worker (a scaled pool at zero).
    parked: VecDeque<(SessionId, RecordId, Request, Option<HandoffId>)>,
    feed: SessionFeed,
    sessions: SessionTable,
    collector: Collector,
    /// Router of the aggregated or prefill pool.
    router: Router,
    queue: Option<RouterQueue<Queued>>,
    /// The decode pool and the handoffs to it (disaggregated replays).
    disagg: Option<Disagg>,
    concurrency: Option<usize>,
    /// Dispatched and not finished, router-queued included.
    in_flight: usize,
    finished: usize,
    block_size: usize,
    speedup: f64,
    /// Runs end by this (the `max_sim_time` cap), so none spans a pass the cap drops.
    max_end_ns: u64,
    /// Pass ends, keyed by `pass_key`. Aggregated passes ending together complete in the
    /// order they started, as (start, iteration, worker) orders them: workers start passes
    /// in index order within an iteration of `drain`.
    passes: BinaryHeap<Reverse<PassKey>>,
    /// Workers that may be idle with work, to look at in index order.
    dirty: Vec<usize>,
    /// Sessions whose next turn is due (now or later): (due, session order, session).
    /// Turns due at the same instant are released in workload order
    /// (`PlannedSession::order`), as the reference's ready heap orders them by session
    /// index, whatever order their previous turns completed in.
    delayed: BinaryHeap<Reverse<(u64, u64, SessionId)>>,
    /// Sessions whose next turn is due now.
    ready: VecDeque<SessionId>,
    /// Agentic traces: dependency gates (and failure cascades).
    deps: Option<Deps>,
    /// `--agentic-lanes`: plays started a lane at a time (they then hold every session).
    lanes: Option<Lanes>,
    /// Requests that ended in the pass being delivered: (session, id, rejected).
    ended: Vec<(SessionId, u128, bool)>,
    /// Data-parallel ranks per aggregated worker: with more than one, `workers` holds
    /// every rank (worker `i`'s rank `r` at `i * dp + r`, the router's index too) and
    /// each worker's ranks step in lock-step waves (`waves`, one per worker).
    dp: usize,
    waves: Vec<Waves>,
    /// Round robin with ranks: each worker's next rank (the reference's per-worker rank
    /// rotation, which a scaled pool's new worker starts at 0).
    rr_ranks: Vec<usize>,
    /// Records of the passes delivered since the hook last took them, when one is set.
    pass_log: Option<Vec<PassRecord>>,
    /// Whether some engine has a host tier (`native_host_offload`), whose transfers wake
    /// an idle engine: without one, no event loop needs to ask every worker per event.
    wakes: bool,
    /// API-server time of every request (`frontend_latency_ms`): a turn reaches the router
    /// this long after it arrives, and its latencies count from its arrival.
    frontend_ns: u64,
    /// Turns in the API server: (due at the router, session, record, turn), by due time.
    ingress: VecDeque<(u64, SessionId, RecordId, PlannedTurn)>,
    /// `kv_event_lag_ms` in ns (0: routers see KV events as passes deliver them).
    kv_lag_ns: u64,
    /// KV events on their way to a router, in delivery order (so in due order too).
    lagged: VecDeque<LaggedEvents>,
}

/// One pass's KV events, due at a KV router later.
struct LaggedEvents {
    due: u64,
    /// For the decode pool's router (else the aggregated or prefill pool's).
    decode: bool,
    /// The worker's index in that router.
    worker: usize,
    events: Vec<mocker_core::events::KvEvent>,
}

/// Started sessions and their remaining turns.
#[derive(Default)]
struct SessionTable {
    slots: Vec<Option<PlannedSession>>,
    free: Vec<SessionId>,
    /// Sessions started and not finished (what the concurrency cap counts).
    active: usize,
}

impl SessionTable {
    fn start(&mut self, s: PlannedSession) -> SessionId {
        self.active += 1;
        match self.free.pop() {
            Some(sid) => {
                self.slots[sid as usize] = Some(s);
                sid
            }
            None => {
                self.slots.push(Some(s));
                (self.slots.len() - 1) as SessionId
            }
        }
    }

    /// Delay before the session's next turn and its `not_before_ms`, if it has one.
    fn next_delay_ms(&self, sid: SessionId) -> Option<(f64, Option<f64>)> {
        self.slots[sid as usize].as_ref()?.turns.front().map(|t| (t.delay_ms, t.not_before_ms))
    }

    /// The session's `PlannedSession::order` (0 for an ended one).
    fn order(&self, sid: SessionId) -> u64 {
        self.slots[sid as usize].as_ref().map_or(0, |s| s.order)
    }

    fn next_turn(&mut self, sid: SessionId) -> Option<PlannedTurn> {
        self.slots[sid as usize].as_mut()?.turns.pop_front()
    }

    fn end(&mut self, sid: SessionId) {
        self.slots[sid as usize] = None;
        self.free.push(sid);
        self.active -= 1;
    }
}

/// Runs a replay offline and returns its report.
pub fn run_synthetic(options: &ReplayOptions) -> Result<ReplayOutcome, ReplayError> {
    run_replay(options, Hooks::default())
}

/// Runs a replay offline, reporting through `hooks`.
pub fn run_replay(options: &ReplayOptions, mut hooks: Hooks<'_>) -> Result<ReplayOutcome, ReplayError> {
    options.validate("offline")?;
    let entry = options.cluster.entry();
    let block_size = entry.launch.engine.block_size;
    let disaggregated = options.cluster.decode().is_some();
    let router_config = options.router_config.with_runtime(&entry.launch.dynamo);
    // A disaggregated cluster routes each pool as the reference derives it.
    let entry_router_config = if disaggregated { router_config.for_prefill_pool() } else { router_config };
    // Offline aggregated workers only (validated): the router places on ranks.
    let dp = entry.launch.dp_size.max(1);
    // The KV router places on ranks; round robin picks a worker, which takes its ranks in
    // turn (`rr_ranks`).
    let targets = if options.router == RouterMode::RoundRobin { entry.workers } else { entry.workers * dp };
    let mut router = Router::new(
        options.router,
        entry_router_config,
        targets,
        block_size,
        entry.launch.engine.max_num_batched_tokens,
    );
    router.expect_blocks((entry.workers * dp).saturating_mul(entry.launch.engine.num_gpu_blocks));
    // Only delta traces put earlier outputs into later prompts; everywhere else a generated
    // block is never looked up by another request, and KV events stay with our router.
    let outputs_reappear = matches!(&options.workload,
        Workload::Trace(t) if t.trace.format == crate::trace::TraceFormat::MooncakeDelta);
    let template = WorkerTemplate {
        aggregate_steady_tokens: hooks.request_ended.is_none(),
        opaque_output_blocks: !outputs_reappear,
    };
    let new_worker =
        |launch: &LaunchConfig, role: Role, record_kv_events: bool, index: usize, rank: usize| {
            build_worker(template, launch, role, record_kv_events, index, rank)
        };
    let entry_role = if disaggregated { Role::Prefill } else { Role::Aggregated };
    let mut workers = Vec::with_capacity(options.cluster.total_workers() * dp);
    for i in 0..entry.workers {
        for r in 0..dp {
            workers.push(new_worker(&entry.launch, entry_role, router.wants_kv_events(), i, r)?);
        }
    }
    // A cluster_shared G3 tier is one store for the whole pool; otherwise each engine keeps
    // the (worker_local) tier it built.
    let shared_g3 = shared_g3_tier(&entry.launch, entry.workers * dp);
    if let Some(tier) = &shared_g3 {
        for (i, w) in workers.iter_mut().enumerate() {
            w.engine.share_g3(tier.clone(), i);
        }
    }
    let disagg = match options.cluster.decode() {
        None => None,
        Some(decode) => {
            // The decode pool's router balances load only: it reads no KV events.
            for i in 0..decode.workers {
                workers.push(new_worker(&decode.launch, Role::Decode, false, i, 0)?);
            }
            let mut router = Router::new(
                options.router,
                router_config.for_decode_pool(),
                decode.workers,
                block_size,
                decode.launch.engine.max_num_batched_tokens,
            )
            .without_kv_events();
            router.expect_blocks(decode.workers.saturating_mul(decode.launch.engine.num_gpu_blocks));
            Some(Disagg::new(entry.workers, decode.workers, router, &entry.launch.engine))
        }
    };
    let queue = (router.wants_kv_events() && router_config.router_queue_threshold.is_some())
        .then(|| RouterQueue::new(router_config.router_queue_policy));
    let engines = || options.cluster.pools().map(|p| &p.launch.engine);
    // The KV router makes the engines record events, whose Stored blocks carry locals.
    let hashing = match (router.wants_kv_events(), engines().any(|e| e.enable_prefix_caching)) {
        (true, _) => PromptHashing::WithLocal,
        (false, true) => PromptHashing::Sequence,
        (false, false) => PromptHashing::Off,
    };
    // Blocks no other request can share stay out of the engines' indexes, their KV events
    // and the router's: nobody but their own request could ever look them up.
    let feed_options = FeedOptions {
        block_size,
        hashing,
        private_tails: !outputs_reappear,
        // Prompts are only hashed, and vLLM-style engines with opaque output blocks need
        // no tokens beside the hashes (SGLang's radix cache reads them, a state cache's
        // align mode hashes prompts inside blocks).
        tokenless: !outputs_reappear
            && engines().all(|e| {
                e.backend != Backend::Sglang && !e.emit_kv_token_ids && e.prefix_match_unit.is_none()
            }),
    };
    let started = Instant::now();
    let mut collector = Collector::with_sla(options.sla);
    if hooks.request_ended.is_some() {
        let trace = match &options.workload {
            Workload::Trace(t) => Some(t.trace.clone()),
            Workload::Synthetic(_) => None,
        };
        collector = collector.with_request_log().with_record_labels(trace, block_size);
    }
    if options.workload.total_requests() >= GAP_THREAD_MIN_REQUESTS {
        collector = collector.with_gap_thread();
    }
    if let Workload::Trace(_) = &options.workload {
        // A trace's requests are rows it has: room for their samples at once, so a long
        // replay does not copy them each time the vectors double.
        collector.expect_requests(options.workload.total_requests());
    }
    let (policy, sampled) = (hooks.scaling_policy.is_some(), hooks.telemetry.is_some());
    let telemetry = match sampled {
        false => None,
        true => {
            crate::telemetry::check_interval(hooks.telemetry_interval_ms)
                .map_err(|m| crate::options::invalid("telemetry_sample_interval_ms", m))?;
            let interval_ns = ms_to_ns(hooks.telemetry_interval_ms).max(1);
            Some(Box::new(Telemetry::new(interval_ns, usize::from(policy))))
        }
    };
    let scaling = match policy || sampled {
        false => None,
        true => {
            collector = collector.with_traffic_windows(usize::from(policy) + usize::from(sampled));
            let entry_name = if disaggregated { PoolName::Prefill } else { PoolName::Agg };
            let first_ranks = (0..entry.workers).map(|i| i * dp).collect();
            let mut pools = vec![(entry_name, entry.launch.clone(), first_ranks)];
            if let Some(decode) = options.cluster.decode() {
                let first = entry.workers;
                pools.push((
                    PoolName::Decode,
                    decode.launch.clone(),
                    (first..first + decode.workers).collect(),
                ));
            }
            Some(Box::new(Scaling::new(pools, workers.len(), hooks.capture_planner_details)))
        }
    };
    let mut sim = Sim {
        workers,
        template,
        scaling,
        telemetry,
        placement_error: None,
        entry_members: (0..entry.workers * dp).collect(),
        group_peaks: vec![0; entry.launch.engine.kv_cache_groups.len()],
        shared_g3,
        parked: VecDeque::new(),
        feed: SessionFeed::new(&options.workload, feed_options),
        sessions: SessionTable::default(),
        collector,
        router,
        queue,
        disagg,
        concurrency: options.workload.concurrency(),
        in_flight: 0,
        finished: 0,
        block_size,
        speedup: options.arrival_speedup_ratio,
        max_end_ns: options.max_sim_time_ms.map_or(u64::MAX, ms_to_ns),
        passes: BinaryHeap::new(),
        dirty: Vec::new(),
        delayed: BinaryHeap::new(),
        ready: VecDeque::new(),
        deps: match &options.workload {
            Workload::Trace(t) => Deps::new(&t.trace, options.arrival_speedup_ratio),
            Workload::Synthetic(_) => None,
        },
        lanes: None,
        ended: Vec::new(),
        dp,
        waves: if dp > 1 { vec![Waves::new(dp); entry.workers] } else { Vec::new() },
        rr_ranks: if dp > 1 { vec![0; entry.workers] } else { Vec::new() },
        pass_log: hooks.pass_ended.is_some().then(Vec::new),
        wakes: engines().any(|e| e.native_host_offload.is_some()),
        frontend_ns: {
            let ms = entry.launch.hardware.frontend_latency_ms.unwrap_or(0.0);
            mocker_core::timing::scaled_nanos(ms, entry.launch.engine.speedup_ratio)
        },
        ingress: VecDeque::new(),
        kv_lag_ns: options.kv_event_lag_ms.map_or(0, ms_to_ns),
        lagged: VecDeque::new(),
    };
    if let Workload::Trace(t) = &options.workload {
        if let Some(n) = t.lanes {
            sim.lanes = Some(Lanes::new(&t.trace, n, &mut sim.feed, options.arrival_speedup_ratio));
        }
    }
    let total = options.workload.total_requests();
    let cap = options.max_sim_time_ms.map(ms_to_ns);
    sim.run(cap, total, &mut hooks)?;
    sim.take_passes(&mut hooks);
    sim.collector.flush_requests();
    if let Some(sink) = hooks.request_ended.as_mut() {
        sim.collector.take_ended_requests().for_each(&mut **sink);
    }
    if cap.is_none() {
        // A finished replay leaves every engine empty: no held source, no reservation,
        // no block in use (debug builds, so the test suite checks every replay it runs).
        for w in &sim.workers {
            debug_assert_eq!(w.engine.num_parked(), 0, "a handoff was left open");
            debug_assert!(w.engine.pool().is_none_or(|p| p.num_active() == 0), "KV blocks left in use");
        }
    }
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;

    let committed: u64 = sim.workers.iter().map(|w| w.engine.metrics().prompt_tokens_computed_total).sum();
    let mut worker_tokens = sim.collector.worker_tokens().to_vec();
    // Every worker of the pool, idle ones too (a scaled pool's added ones come after).
    let pool_size = sim.scaling.as_ref().map_or(entry.workers, |sc| sc.pools[0].members.len());
    worker_tokens.resize(pool_size.max(worker_tokens.len()), (0, 0));
    let mut inputs = sim.collector.finish();
    let duration_s = (inputs.duration_ms / 1000.0).max(1e-9);
    inputs.committed_prefill_tokens = committed;
    inputs.wall_time_ms = wall_ms;
    let gpus = |l: &LaunchConfig| (l.tensor_parallel_size * l.dp_size) as u64;
    // With a policy; telemetry alone leaves the pools fixed, and the plain product exact.
    let scaled_seconds = sim.scaling.as_ref().filter(|_| policy).map(|sc| {
        let end_ns = ms_to_ns(inputs.duration_ms);
        let seconds: Vec<f64> = sc.pools.iter().map(|p| p.worker_seconds(end_ns)).collect();
        seconds
    });
    match &options.cluster {
        // Aggregated workers count as decode workers, as the reference reports them.
        Cluster::Aggregated(pool) => {
            inputs.decode_worker_seconds = pool.workers as f64 * duration_s;
            inputs.decode_gpus_per_worker = gpus(&pool.launch);
        }
        Cluster::Disaggregated { prefill, decode } => {
            inputs.prefill_worker_seconds = prefill.workers as f64 * duration_s;
            inputs.prefill_gpus_per_worker = gpus(&prefill.launch);
            inputs.decode_worker_seconds = decode.workers as f64 * duration_s;
            inputs.decode_gpus_per_worker = gpus(&decode.launch);
        }
    }
    if let Some(seconds) = scaled_seconds {
        // Live workers (starting and draining included) integrated over the run.
        match seconds[..] {
            [agg] => inputs.decode_worker_seconds = agg,
            [prefill, decode, ..] => {
                inputs.prefill_worker_seconds = prefill;
                inputs.decode_worker_seconds = decode;
            }
            [] => {}
        }
    }
    let mut summary = Summary::from_inputs(inputs);
    summary.kv_eviction_policy = entry.launch.engine.eviction_policy.as_str().to_string();
    let budget = entry.launch.engine.kv_cache_capacity_bytes.unwrap_or(0).max(1) as f64;
    if entry.launch.engine.g3_offload.is_some() {
        // The reference lets the last stores' G3 writes finish before it reports.
        while sim.workers.iter_mut().fold(false, |any, w| w.engine.settle_transfers() | any) {}
    }
    summary.g3_offload = match &sim.shared_g3 {
        Some(tier) => Some(tier.lock().expect("G3 tier lock").stats()),
        None => sim.workers.iter().filter_map(|w| w.engine.g3_stats()).reduce(|mut a, b| {
            a.add(&b);
            a
        }),
    };
    summary.kv_cache_group_peak_usage = (entry.launch.engine.kv_cache_groups.iter().zip(&sim.group_peaks))
        .map(|(g, &peak_bytes)| crate::report::GroupPeak {
            group: g.name.clone(),
            peak_bytes,
            peak_usage: peak_bytes as f64 / budget,
        })
        .collect();
    let lifecycle_operations = sim.scaling.map(|sc| sc.operations).unwrap_or_default();
    if let Workload::Trace(t) = &options.workload {
        // A streamed trace whose second reading failed replayed only part of it.
        if let Some(failure) = t.trace.stream.as_ref().and_then(|st| st.failure.get()) {
            return Err(crate::options::invalid("trace", failure.clone()));
        }
    }
    Ok(ReplayOutcome { summary, worker_tokens, lifecycle_operations })
}

impl Sim {
    /// Records worker `w`'s last pass (kept out of `deliver`, which every pass runs).
    #[inline(never)]
    fn log_pass(&mut self, w: usize) {
        let worker = &self.workers[w];
        let pool = match worker.role {
            Role::Aggregated => "agg",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        };
        let blocks = worker.engine.pool().map(|p| (p.num_active(), p.capacity()));
        if let Some(log) = self.pass_log.as_mut() {
            crate::pass_log::records(worker.engine.last_pass(), w, pool, blocks, log);
        }
    }

    /// Hands the passes delivered so far to the hook.
    fn take_passes(&mut self, hooks: &mut Hooks<'_>) {
        if let (Some(sink), Some(log)) = (hooks.pass_ended.as_mut(), self.pass_log.as_mut()) {
            log.drain(..).for_each(&mut **sink);
        }
    }

    fn run(&mut self, cap: Option<u64>, total: usize, hooks: &mut Hooks<'_>) -> Result<(), ReplayError> {
        let mut now = 0;
        let mut reported = 0;
        loop {
            self.drain(now)?;
            if let Some(sink) = hooks.telemetry.as_mut() {
                self.sample_due(now, sink)?;
            }
            if let Some(policy) = hooks.scaling_policy.as_deref_mut() {
                // A tick fires once the instant has settled; what it changed settles too.
                if self.scaling_tick(now, policy)? {
                    continue;
                }
            }
            self.take_passes(hooks);
            if let Some(sink) = hooks.request_ended.as_mut() {
                self.collector.take_ended_requests().for_each(&mut **sink);
            }
            if let Some(p) = hooks.progress.as_mut() {
                if self.finished >= reported + 256 || self.done() {
                    reported = self.finished;
                    p(self.finished, total, now as f64 / 1e6);
                }
            }
            if self.done() {
                if let Some(sink) = hooks.telemetry.as_mut() {
                    self.sample_final(now, sink)?;
                }
                return Ok(());
            }
            let speedup = self.speedup;
            let next_arrival = match (self.concurrency, &self.lanes) {
                (None, Some(lanes)) => lanes.next_due(),
                (None, None) => self.feed.next_arrival_ms().map(|ms| ms_to_ns(ms / speedup)),
                (Some(_), _) => None,
            };
            let next_delayed = self.delayed.peek().map(|Reverse((t, _, _))| *t);
            let next_pass = self.next_pass_end();
            let next_handoff = self.disagg.as_ref().and_then(Disagg::next_due);
            let next_wake = self.next_wake();
            let next_ingress = self.ingress.front().map(|e| e.0);
            let next_scaling = self.scaling.as_ref().and_then(|sc| sc.next_event());
            let next_sample = self.telemetry.as_ref().and_then(|t| t.next_event());
            match [
                next_arrival,
                next_delayed,
                next_pass,
                next_handoff,
                next_wake,
                next_ingress,
                next_scaling,
                next_sample,
            ]
            .into_iter()
            .flatten()
            .min()
            {
                Some(t) if cap.is_some_and(|c| t > c) => return Ok(()),
                Some(t) => now = t.max(now),
                None => return Err(ReplayError::DeadEnd(self.in_flight)),
            }
        }
    }

    /// The earliest host-tier transfer completion of an idle worker (`native_host_offload`).
    fn next_wake(&self) -> Option<u64> {
        if !self.wakes {
            return None;
        }
        self.workers.iter().filter(|w| !w.busy).filter_map(|w| w.engine.next_wake_ns()).min()
    }

    /// End of the earliest pending pass, dropping stale heap entries on the way.
    fn next_pass_end(&mut self) -> Option<u64> {
        while let Some(&Reverse((t, _, _, w, generation))) = self.passes.peek() {
            if generation == self.workers[w].generation {
                return Some(t);
            }
            self.passes.pop();
        }
        None
    }

    fn done(&self) -> bool {
        self.in_flight == 0
            && self.feed.sessions_remaining() == 0
            && self.delayed.is_empty()
            && self.ready.is_empty()
            && self.passes.is_empty()
            && self.lanes.as_ref().is_none_or(Lanes::idle)
    }

    fn mark_dirty(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        if !worker.dirty {
            worker.dirty = true;
            self.dirty.push(w);
        }
    }

    /// Processes everything that can happen at `now`, until nothing changes.
    fn drain(&mut self, now: u64) -> Result<(), ReplayError> {
        let mut dirty = Vec::new();
        let mut iteration = 0u32;
        loop {
            let mut changed = false;
            // 1. Pass completions, in (end, start order).
            while let Some(&Reverse((t, _, _, w, generation))) = self.passes.peek() {
                if t > now {
                    break;
                }
                self.passes.pop();
                if generation != self.workers[w].generation {
                    continue;
                }
                self.workers[w].busy = false;
                // A shared G3 tier sees the pass's boundary now, in time order.
                self.workers[w].engine.complete_pass();
                self.deliver(w, now);
                self.mark_dirty(w);
                if self.dp > 1 {
                    // The wave is over for the whole worker: idle ranks that got work
                    // during it start with the next one.
                    let g = w / self.dp * self.dp;
                    (g..g + self.dp).for_each(|r| self.mark_dirty(r));
                }
                changed = true;
            }
            // Workers whose start-up ends now join their pool.
            if self.scaling.is_some() {
                changed |= self.ready_due(now);
            }
            // KV transfers that end now (after the passes, as the reference orders them).
            changed |= self.activate_due(now);
            // 2. Arrivals. A disaggregated replay takes them up only after the passes
            // below have started: the reference dispatches an arrival's first action (a
            // prefill, or SGLang's reservation) on its next round at that instant, so
            // a pass started now by other work does not take it.
            let disaggregated = self.disagg.is_some();
            if !disaggregated {
                changed |= self.release_arrivals(now)?;
            }
            // Idle workers whose host transfers complete by now step to take them up.
            if self.wakes {
                for w in 0..self.workers.len() {
                    let worker = &self.workers[w];
                    if !worker.busy && worker.engine.next_wake_ns().is_some_and(|t| t <= now) {
                        self.mark_dirty(w);
                    }
                }
            }
            // 3. Idle workers with work run one pass, in worker order.
            std::mem::swap(&mut dirty, &mut self.dirty);
            dirty.sort_unstable();
            for &w in &dirty {
                self.workers[w].dirty = false;
            }
            let mut last_group = usize::MAX;
            for &w in &dirty {
                if self.dp > 1 {
                    // Ranks of one worker are contiguous in `dirty` (sorted): one wave each.
                    let g = w / self.dp;
                    if g != last_group {
                        last_group = g;
                        changed |= self.start_wave(g, now, iteration)?;
                    }
                    continue;
                }
                let decode = self.workers[w].role == Role::Decode;
                let worker = &mut self.workers[w];
                let wake = worker.engine.next_wake_ns().is_some_and(|t| t <= now);
                if worker.busy || !(worker.engine.has_work() || wake) {
                    continue;
                }
                if decode {
                    let pending = self.disagg.as_ref().is_some_and(|d| !d.inbox_empty(worker.pool_id));
                    worker.engine.set_destinations_pending(pending);
                }
                let end = worker.engine.step(now).end_ns;
                if let Some(fault) = worker.engine.fault() {
                    return Err(fault.clone().into());
                }
                if self.scaling.is_some() {
                    self.note_stepped(w);
                }
                let worker = &mut self.workers[w];
                if end > now {
                    // Each pass end retries a waiting reservation: no run while one could.
                    // A scaled run steps pass by pass: a policy reads each one's metrics.
                    let settled = |d: &Disagg| d.inbox_settled(worker.pool_id, &worker.engine);
                    if self.scaling.is_none() && (!decode || self.disagg.as_ref().is_none_or(settled)) {
                        worker.engine.extend_steady_run(self.max_end_ns);
                    }
                    let pass = worker.engine.last_pass();
                    worker.busy = true;
                    worker.iteration = iteration;
                    // A run's last pass starts at the first iteration of its start time.
                    let at = if pass.run_ends.is_empty() { iteration } else { 0 };
                    let key =
                        pass_key(disaggregated, pass.end_ns, pass.last_start_ns(), at, w, worker.generation);
                    self.passes.push(Reverse(key));
                } else if worker.engine.last_pass().had_effect() {
                    self.deliver(w, now);
                    self.mark_dirty(w);
                } else if wake || worker.engine.next_wake_ns().is_some() {
                    // It took up transfers, or waits for one (a request loading from host).
                    if !wake {
                        continue;
                    }
                } else if self.disagg.is_none() {
                    return Err(ReplayError::DeadEnd(self.in_flight));
                } else {
                    // Held sources or reservations fill its pool: it waits for a handoff to
                    // free them (the run loop still reports a true dead end).
                    continue;
                }
                changed = true;
            }
            dirty.clear();
            if disaggregated {
                changed |= self.release_arrivals(now)?;
            }
            iteration += 1;
            if let Some(e) = self.placement_error.take() {
                return Err(e);
            }
            if !changed {
                self.settle_drained(now);
                return Ok(());
            }
        }
    }

    /// Starts a wave on aggregated worker `g`'s ranks at `now` unless one is under way;
    /// returns whether anything happened.
    fn start_wave(&mut self, g: usize, now: u64, iteration: u32) -> Result<bool, ReplayError> {
        let ranks = g * self.dp..(g + 1) * self.dp;
        let group = &mut self.workers[ranks.clone()];
        if group.iter().any(|w| w.busy) || !group.iter().any(|w| w.engine.has_work()) {
            return Ok(false);
        }
        let end = self.waves[g].step(group, now, |w| (&mut w.engine, true));
        if let Some(fault) = group.iter().find_map(|w| w.engine.fault()) {
            return Err(fault.clone().into());
        }
        let mut effect = false;
        for (i, w) in ranks.enumerate() {
            if !self.waves[g].stepped(i) {
                continue;
            }
            if self.scaling.is_some() {
                self.note_stepped(w);
            }
            let worker = &mut self.workers[w];
            effect |= worker.engine.last_pass().had_effect();
            if end > now {
                worker.busy = true;
                worker.iteration = iteration;
                self.passes.push(Reverse((end, now, iteration, w, worker.generation)));
            } else {
                self.deliver(w, now);
                self.mark_dirty(w);
            }
        }
        if end == now && !effect {
            return Err(ReplayError::DeadEnd(self.in_flight));
        }
        Ok(true)
    }

    /// Hands worker `w`'s last pass outputs to the collector and router, stamped at `t`.
    fn deliver(&mut self, w: usize, t: u64) {
        if self.pass_log.is_some() {
            self.log_pass(w);
        }
        if self.scaling.is_some() {
            self.note_delivered(w, t);
        }
        if !self.group_peaks.is_empty() {
            for (peak, (_, bytes)) in self.group_peaks.iter_mut().zip(self.workers[w].engine.kv_group_usage())
            {
                *peak = (*peak).max(bytes);
            }
        }
        if self.collector.has_traffic() {
            // Decode forwards of requests past their prompt (vLLM; the pass's decodes else).
            let m = &self.workers[w].engine.last_pass().metrics;
            let forwards = match self.workers[w].engine.backend() {
                mocker_core::config::Backend::Sglang => m.num_decode_requests as u64,
                _ => m.decode_lengths.count,
            };
            // Speculative decoding accepts several tokens a forward; otherwise each one.
            match m.spec_forwards {
                0 => self.collector.on_decode_forwards(forwards, forwards),
                n => self.collector.on_decode_forwards(m.spec_accepted_tokens, n),
            }
        }
        let worker = &mut self.workers[w];
        let role = worker.role;
        let pass = worker.engine.last_pass();
        let mut handoffs = self.disagg.as_mut().map(|d| std::mem::take(&mut d.started));
        // Each pool has its own router; a decode worker's index there is its place in its pool.
        let decode = role == Role::Decode && self.disagg.is_some();
        let (router, rw) = match (role, self.disagg.as_mut()) {
            (Role::Decode, Some(d)) => (&mut d.router, worker.pool_id),
            _ => (&mut self.router, w),
        };
        if let Router::Kv(r) = router {
            if self.kv_lag_ns == 0 {
                r.apply_events(rw, &pass.kv_events);
            } else if !pass.kv_events.is_empty() {
                let due = t.saturating_add(self.kv_lag_ns);
                let events = pass.kv_events.clone();
                self.lagged.push_back(LaggedEvents { due, decode, worker: rw, events });
            }
        }
        // A decode worker's admissions are its activated destinations joining the batch
        // (SGLang's are recorded as they activate) and their re-admissions; a request's
        // reuse is the largest of all its admissions, in either pool, as the reference's.
        if role != Role::Decode {
            for a in &pass.admissions {
                self.collector.on_admission(
                    worker.owners[a.key.0 as usize].record,
                    a.reused_tokens,
                    pass.start_ns,
                );
            }
        } else {
            for a in &pass.admissions {
                let rec = worker.owners[a.key.0 as usize].record;
                if a.readmission {
                    self.collector.on_decode_readmission(rec, a.reused_tokens, pass.start_ns);
                } else {
                    // vLLM: an activated destination joins the batch.
                    self.collector.on_decode_admitted(rec, a.reused_tokens, pass.start_ns);
                }
            }
        }
        for (steady, itl_ns) in pass.steady_runs() {
            if steady > 0 {
                self.collector.on_gaps(itl_ns, steady as u64);
            }
        }
        if self.collector.logs_requests() {
            for o in &pass.steady {
                self.collector.on_steady_token(worker.owners[o.key.0 as usize].record, t);
            }
        }
        let mut lifecycle = false;
        for o in &pass.outputs {
            let owner = &mut worker.owners[o.key.0 as usize];
            let SlotOwner { record: rec, session: sid, route, handoff, .. } = *owner;
            if o.rejected {
                self.collector.on_rejected(rec, t);
                if let (Role::Prefill, Some(h)) = (role, handoffs.as_mut()) {
                    h.push((handoff, false));
                }
            } else if role == Role::Prefill {
                // The prefill's one token is not the user's: the decode worker's first is.
                router.free(route);
                lifecycle = true;
                handoffs.as_mut().expect("prefill workers are disaggregated").push((handoff, true));
                continue;
            } else {
                if o.has_token() {
                    self.collector.on_token(rec, t, o.index, o.itl_ns);
                    if owner.prefilling {
                        owner.prefilling = false;
                        router.prefill_done(route);
                        lifecycle = true;
                    }
                }
                if o.completed {
                    self.collector.on_complete(rec, t);
                }
            }
            if o.completed {
                router.free(route);
                lifecycle = true;
                self.ended.push((sid, o.uuid, o.rejected));
            }
        }
        if let Some(started) = handoffs {
            self.start_handoffs(started, t);
        }
        if role == Role::Decode && self.disagg.is_some() {
            self.decode_pass_ended(w, t);
        }
        if self.telemetry.is_some() {
            self.publish_completion(w);
        }
        self.end_requests(t);
        if lifecycle {
            self.release_queued(t);
        }
    }

    /// Ends the requests the last delivered pass finished (or rejected) at `t`: their
    /// sessions go on, their dependents are released.
    fn end_requests(&mut self, t: u64) {
        for i in 0..self.ended.len() {
            let (sid, uuid, rejected) = self.ended[i];
            self.in_flight -= 1;
            self.finished += 1;
            if let Some(l) = &mut self.lanes {
                l.ended(uuid, t);
            }
            if let Some(d) = &mut self.deps {
                d.fire(uuid, DepTrigger::Completion, t, !rejected);
                if rejected {
                    // The session's later turns depend on this one: they fail too.
                    d.opened.push((sid, t, false));
                    continue;
                }
            }
            match self.sessions.next_delay_ms(sid) {
                None => self.sessions.end(sid),
                // A zero delay is due at once, yet still behind the sessions due now that
                // come first in workload order.
                Some((d, not_before)) => {
                    let mut due = t + ms_to_ns(d / self.speedup);
                    if let Some(nb) = not_before {
                        due = due.max(ms_to_ns(nb / self.speedup));
                    }
                    self.delayed.push(Reverse((due, self.sessions.order(sid), sid)));
                }
            }
        }
        self.ended.clear();
        self.open_gates(t);
    }

    /// Releases (or fails) the sessions whose gates opened, at `now` or later.
    fn open_gates(&mut self, now: u64) {
        let Some(deps) = &mut self.deps else { return };
        while let Some((sid, due, ok)) = deps.opened.pop() {
            if !ok {
                // Every remaining turn ends unfinished; it counts only in num_requests.
                while let Some(turn) = self.sessions.next_turn(sid) {
                    let rec = self.collector.on_arrival(now, turn.input_length);
                    self.collector.describe(rec, turn.uuid, turn.max_output_tokens, turn.session);
                    self.collector.on_rejected(rec, now);
                    self.finished += 1;
                    if let Some(l) = &mut self.lanes {
                        l.ended(turn.uuid, now);
                    }
                    deps.fire(turn.uuid, DepTrigger::Dispatch, now, false);
                    deps.fire(turn.uuid, DepTrigger::Completion, now, false);
                }
                self.sessions.end(sid);
            } else if due <= now {
                self.ready.push_back(sid);
            } else {
                self.delayed.push(Reverse((due, self.sessions.order(sid), sid)));
            }
        }
    }

    /// Starts a session from the feed at `at`: dispatches its first turn, or hands it to
    /// its gate.
    fn start_session(&mut self, s: PlannedSession, at: u64) -> Result<(), ReplayError> {
        let gate = s.gate;
        let sid = self.sessions.start(s);
        match (gate, &mut self.deps) {
            (Some(g), Some(d)) => {
                d.start(g, sid, at);
                self.open_gates(at);
                Ok(())
            }
            _ => self.dispatch(sid, at),
        }
    }

    /// Places router-queued turns while some worker has room.
    /// Hands the routers the lagged KV events due by `now`, before they decide anything.
    fn apply_lagged(&mut self, now: u64) {
        while self.lagged.front().is_some_and(|l| l.due <= now) {
            let l = self.lagged.pop_front().expect("checked");
            let router = match (l.decode, self.disagg.as_mut()) {
                (true, Some(d)) => &mut d.router,
                _ => &mut self.router,
            };
            if let Router::Kv(r) = router {
                r.apply_events(l.worker, &l.events);
            }
        }
    }

    fn release_queued(&mut self, now: u64) {
        self.release_queued_into(now, None);
    }

    /// [`release_queued`](Self::release_queued), noting the released requests' ids in
    /// `released` (a topology change records what it let through).
    fn release_queued_into(&mut self, now: u64, mut released: Option<&mut Vec<u128>>) {
        self.apply_lagged(now);
        loop {
            let Router::Kv(r) = &self.router else { return };
            if r.all_busy() {
                return;
            }
            let Some(q) = self.queue.as_mut().and_then(RouterQueue::pop) else { return };
            if let Some(out) = released.as_deref_mut() {
                out.push(q.turn.uuid);
            }
            self.place(q.sid, q.record, q.turn, now);
        }
    }

    /// Releases every turn due at `now`; returns whether any was dispatched.
    fn release_arrivals(&mut self, now: u64) -> Result<bool, ReplayError> {
        let mut any = false;
        while self.ingress.front().is_some_and(|e| e.0 <= now) {
            let (due, sid, rec, turn) = self.ingress.pop_front().expect("peeked");
            self.route(sid, rec, turn, due);
            any = true;
        }
        while let Some(&Reverse((t, _, _))) = self.delayed.peek() {
            if t > now {
                break;
            }
            let Reverse((_, _, sid)) = self.delayed.pop().expect("peeked");
            self.ready.push_back(sid);
        }
        while let Some(s) = self.ready.pop_front() {
            self.dispatch(s, now)?;
            any = true;
        }
        match self.concurrency {
            Some(c) => {
                while self.sessions.active < c {
                    let Some(s) = self.feed.start_session() else { break };
                    self.start_session(s, now)?;
                    any = true;
                }
            }
            None if self.lanes.is_some() => {
                while let Some((s, at)) = self.lanes.as_mut().and_then(|l| l.pop_due(now)) {
                    self.start_session(s, at)?;
                    any = true;
                }
            }
            None => {
                while let Some(at) = self.feed.next_arrival_ms() {
                    let at = ms_to_ns(at / self.speedup);
                    if at > now {
                        break;
                    }
                    let s = self.feed.start_session().expect("a session was peeked");
                    self.start_session(s, at)?;
                    any = true;
                }
            }
        }
        Ok(any)
    }

    /// The session's next turn arrives: route it (or queue it) and submit it.
    fn dispatch(&mut self, sid: SessionId, arrival_ns: u64) -> Result<(), ReplayError> {
        let Some(turn) = self.sessions.next_turn(sid) else {
            self.sessions.end(sid);
            return Ok(());
        };
        let rec = self.collector.on_arrival(arrival_ns, turn.input_length);
        self.collector.describe(rec, turn.uuid, turn.max_output_tokens, turn.session);
        self.in_flight += 1;
        if let Some(d) = &mut self.deps {
            d.fire(turn.uuid, DepTrigger::Dispatch, arrival_ns, true);
            self.open_gates(arrival_ns);
        }
        if turn.max_output_tokens == 0 || turn.input_length == 0 {
            return Err(mocker_core::EngineError::Submit(if turn.input_length == 0 {
                mocker_core::SubmitError::EmptyPrompt(turn.uuid)
            } else {
                mocker_core::SubmitError::NoOutput(turn.uuid)
            })
            .into());
        }
        if self.frontend_ns > 0 {
            let due = arrival_ns + self.frontend_ns;
            // Arrivals come in time order, so this is almost always the back.
            let at = self.ingress.partition_point(|e| e.0 <= due);
            self.ingress.insert(at, (due, sid, rec, turn));
            return Ok(());
        }
        self.route(sid, rec, turn, arrival_ns);
        Ok(())
    }

    /// A turn reaches the router at `now`: queue it (KV router with a queue) or place it.
    fn route(&mut self, sid: SessionId, rec: RecordId, mut turn: PlannedTurn, now: u64) {
        if let (Router::Kv(r), Some(q)) = (&mut self.router, self.queue.as_mut()) {
            if !q.is_empty() || r.all_busy() {
                let bs = self.block_size;
                let hashes = turn.block_hashes.get_or_insert_with(|| PromptHashes::of(&turn.tokens, bs));
                let best = r.best_cached_tokens(&hashes.sequence);
                let isl = turn.input_length;
                self.collector.on_queued(rec, now);
                q.push(Queued { sid, record: rec, turn }, now as f64 / 1e9, isl, best);
                return;
            }
        }
        self.place(sid, rec, turn, now);
    }

    /// Routes and submits a turn whose record exists, at `now`.
    fn place(&mut self, sid: SessionId, rec: RecordId, turn: PlannedTurn, now: u64) {
        let request = Request {
            uuid: turn.uuid,
            tokens: turn.tokens,
            max_output_tokens: turn.max_output_tokens,
            output_token_ids: None,
            block_hashes: turn.block_hashes,
            shareable_blocks: turn.shareable_blocks,
            prompt_len: Some(turn.input_length),
            lora: None,
        };
        if let Some(d) = self.disagg.as_mut().filter(|d| d.destination_first) {
            // The decode side reserves first; the prefill follows its reservation.
            let h = d.open(request, rec, sid, usize::MAX, mocker_core::SeqKey(0));
            self.route_destination(h, now);
            return;
        }
        self.place_request(sid, rec, request, None, now);
    }

    /// Routes `request` in the aggregated or prefill pool and submits it at `now`; on a
    /// prefill worker it is a held source, of `handoff` when its destination is already
    /// reserved (destination first) or of a new handoff.
    fn place_request(
        &mut self,
        sid: SessionId,
        rec: RecordId,
        request: Request,
        handoff: Option<HandoffId>,
        now: u64,
    ) {
        self.apply_lagged(now);
        if !self.router.can_place() && self.disagg.is_some() {
            // A scaled prefill pool at zero: the request waits for a worker.
            self.parked.push_back((sid, rec, request, handoff));
            return;
        }
        if !self.router.can_place() {
            // A scaled pool at zero: the reference's placement refuses the request.
            let message = match self.router {
                Router::RoundRobin(_) => "no active workers for round-robin placement",
                Router::Kv(_) => "no endpoints available to route work",
            };
            self.placement_error.get_or_insert(ReplayError::Placement(message.into()));
            return;
        }
        let hashes = request.block_hashes.as_ref().map_or(&[][..], |h| &h.sequence[..]);
        let p = self.router.route(RouteRequest {
            isl: request.prompt_len(),
            hashes,
            shareable: request.shareable_blocks.unwrap_or(hashes.len()),
        });
        let mut p = p;
        if self.dp > 1 && matches!(self.router, Router::RoundRobin(_)) {
            // Round robin over workers, and over each worker's ranks in turn: with fixed
            // pools the i-th request goes to worker i mod W, rank (i div W) mod dp.
            let rank = self.rr_ranks[p.worker];
            self.rr_ranks[p.worker] = (rank + 1) % self.dp;
            p.worker = p.worker * self.dp + rank;
        }
        self.collector.set_worker(rec, p.worker / self.dp);
        let pool = if self.disagg.is_some() { PoolKind::Prefill } else { PoolKind::Agg };
        let overlap = (p.overlap_blocks, p.best_overlap_blocks);
        self.collector.on_routed(rec, pool, p.worker / self.dp, overlap, now);
        if p.best_overlap_blocks.is_some() && self.collector.has_traffic() {
            let isl_blocks = request.prompt_len().div_ceil(self.block_size) as u32;
            self.collector.on_kv_placement(p.overlap_blocks, isl_blocks);
        }
        // The worker's index among all workers (a scaled pool's new ones come last).
        let w = self.entry_members[p.worker];
        self.interrupt_run(w, now);
        let worker = &mut self.workers[w];
        let (key, handoff) = if worker.role == Role::Prefill {
            // The prefill worker computes the prompt and samples one token; its KV stays
            // held until the decode worker has it.
            let d = self.disagg.as_mut().expect("prefill workers are disaggregated");
            match handoff {
                Some(h) => {
                    let prefill = Request { max_output_tokens: 1, ..request };
                    let key =
                        worker.engine.submit_held(prefill).expect("prompt length was checked at dispatch");
                    d.set_source(h, w, key);
                    (key, h)
                }
                None => {
                    let mut request = request;
                    let prefill = handoff::prefill_leg(&mut request, self.block_size);
                    let key =
                        worker.engine.submit_held(prefill).expect("prompt length was checked at dispatch");
                    (key, d.open(request, rec, sid, w, key))
                }
            }
        } else {
            let key =
                worker.engine.submit(request).expect("prompt and output lengths were checked at dispatch");
            (key, HandoffId::default())
        };
        let worker = &mut self.workers[w];
        let slot = key.0 as usize;
        if worker.owners.len() <= slot {
            worker.owners.resize(slot + 1, SlotOwner::default());
        }
        worker.owners[slot] = SlotOwner { record: rec, session: sid, route: p.id, prefilling: true, handoff };
        if self.telemetry.is_some() {
            self.publish_gauges(w);
        }
        self.mark_dirty(w);
    }

    /// A request joins worker `w` at `now`: the passes of its steady run that start from
    /// now on must see it, so the run is cut back to those that started before.
    fn interrupt_run(&mut self, w: usize, now: u64) {
        let worker = &mut self.workers[w];
        if !worker.busy {
            return;
        }
        let end = worker.engine.last_pass().end_ns;
        worker.engine.truncate_steady_run(now);
        let pass = worker.engine.last_pass();
        if pass.end_ns == end {
            return;
        }
        worker.generation += 1;
        if pass.end_ns <= now {
            // Its last pass ends now: it completes before this arrival, and the worker
            // starts its next pass in this iteration, with the request.
            worker.busy = false;
            self.deliver(w, now);
            self.mark_dirty(w);
        } else {
            let at = if pass.run_ends.is_empty() { worker.iteration } else { 0 };
            let key =
                pass_key(self.disagg.is_some(), pass.end_ns, pass.last_start_ns(), at, w, worker.generation);
            self.passes.push(Reverse(key));
        }
    }
}
