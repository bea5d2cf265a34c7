//! What a replay runs: engines, workers, workload, router, stop condition and SLAs, and the
//! checks every replay mode shares.

use std::sync::Arc;

use mocker_core::config::{LaunchConfig, WorkerType};
use mocker_core::EngineError;

use crate::limits;
use crate::router::KvRouterConfig;
pub use crate::router::RouterMode;
use crate::trace::Trace;
use crate::workload::{Load, SyntheticWorkload, WorkloadError};

/// The requests a replay issues.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// Generated requests (`--input-tokens`, `--request-count`, ...).
    Synthetic(SyntheticWorkload),
    /// Rows of a trace file.
    Trace(TraceWorkload),
}

impl From<SyntheticWorkload> for Workload {
    fn from(w: SyntheticWorkload) -> Self {
        Self::Synthetic(w)
    }
}

impl Default for Workload {
    fn default() -> Self {
        Self::Synthetic(SyntheticWorkload::default())
    }
}

/// A trace and how its sessions are released.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceWorkload {
    /// The parsed trace (shared: sweeps replay one trace many times).
    pub trace: Arc<Trace>,
    /// `None`: trace mode (first turns at their timestamps); `Some(c)`: at most `c`
    /// sessions active, started in file order, timestamps ignored.
    pub concurrency: Option<usize>,
    /// Replay the trace this many times back to back (later copies shifted by the trace's
    /// span), for benchmarks larger than any file.
    pub repeat: usize,
    /// Request graphs (agentic Mooncake, Weka): run the plays this many at a time, each
    /// started when a lane frees (`--agentic-lanes`); `None`: every play at its authored
    /// time.
    pub lanes: Option<usize>,
}

impl Workload {
    /// Closed-loop session cap, if any.
    pub fn concurrency(&self) -> Option<usize> {
        match self {
            Self::Synthetic(w) => match w.load {
                Load::Concurrency(c) => Some(c),
                _ => None,
            },
            Self::Trace(t) => t.concurrency,
        }
    }

    /// Requests the workload issues in total.
    pub fn total_requests(&self) -> usize {
        match self {
            Self::Synthetic(w) => w.total_requests(),
            Self::Trace(t) => t.trace.num_turns().saturating_mul(t.repeat),
        }
    }

    fn validate(&self) -> Result<(), ReplayError> {
        match self {
            Self::Synthetic(w) => Ok(w.validate()?),
            Self::Trace(t) => {
                if t.concurrency == Some(0) {
                    return Err(invalid("concurrency", "must be at least 1 (got 0)".into()));
                }
                if t.repeat == 0 {
                    return Err(invalid("repeat", "must be at least 1 (got 0)".into()));
                }
                if let Some(c) = t.concurrency {
                    limits::count("concurrency", c, limits::MAX_CONCURRENCY)?;
                }
                if let Some(lanes) = t.lanes {
                    // The reference's words where it has them.
                    if lanes == 0 {
                        return Err(invalid("agentic_lanes", "must be at least 1".into()));
                    }
                    if t.concurrency.is_some() {
                        return Err(invalid(
                            "agentic_lanes",
                            "cannot be combined with replay_concurrency".into(),
                        ));
                    }
                    if t.trace.graph_rows.is_empty() {
                        return Err(invalid(
                            "agentic_lanes",
                            "requires trace_format='agentic_mooncake', 'weka', or 'dynamo' (an agentic trace)".into(),
                        ));
                    }
                    if t.repeat != 1 {
                        return Err(invalid("agentic_lanes", "replays the trace once (repeat 1)".into()));
                    }
                    t.trace.plays()?;
                }
                if let Some(st) = &t.trace.stream {
                    // `scan_for_stream` promises these; a caller that streams otherwise errs.
                    let by_time_ok = t.concurrency.is_some() || st.span_ms.is_some();
                    if t.repeat != 1 || t.lanes.is_some() || !by_time_ok {
                        let msg = "a streamed trace replays once, without lanes, and by timestamp only \
                                   when every row has one";
                        return Err(invalid("trace", msg.into()));
                    }
                }
                if t.concurrency.is_none() {
                    if let Some(s) = t.trace.sessions.iter().find(|s| s.first_arrival_ms.is_none()) {
                        let msg = "missing; trace mode needs a timestamp on every session's first row \
                                   (or use --concurrency to ignore timestamps)";
                        return Err(t.trace.error_at(s.turns[0].line, "timestamp", msg.into()).into());
                    }
                }
                Ok(())
            }
        }
    }
}

/// SLA thresholds for goodput, ms; a request is good when it meets every one set.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sla {
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// Mean inter-token latency, `(e2e - ttft) / (output - 1)`.
    pub itl_ms: Option<f64>,
    /// Arrival to last token.
    pub e2e_ms: Option<f64>,
}

impl Sla {
    /// Whether any threshold is set (the report then carries the `goodput_*` keys).
    pub fn any(&self) -> bool {
        self.ttft_ms.is_some() || self.itl_ms.is_some() || self.e2e_ms.is_some()
    }

    /// Whether a completed request with these latencies (ms) and `tokens` outputs is good.
    pub fn is_good(&self, ttft: f64, e2e: f64, tokens: u32) -> bool {
        if tokens == 0 {
            return self.e2e_ms.is_some() && self.ttft_ms.is_none() && self.itl_ms.is_none();
        }
        self.e2e_ms.is_none_or(|s| e2e <= s)
            && self.ttft_ms.is_none_or(|s| ttft <= s)
            && (tokens <= 1 || self.itl_ms.is_none_or(|s| (e2e - ttft) / f64::from(tokens - 1) <= s))
    }
}

/// Identical workers: one engine configuration and how many engines run it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// Engine configuration of every worker in the pool.
    pub launch: LaunchConfig,
    /// Workers (engines).
    pub workers: usize,
}

impl Default for Pool {
    fn default() -> Self {
        Self { launch: LaunchConfig::default(), workers: 1 }
    }
}

/// The simulated workers of a replay.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per replay, read at setup only
pub enum Cluster {
    /// Workers that prefill and decode their own requests.
    Aggregated(Pool),
    /// Prefill workers compute each prompt and hand its KV to a decode worker, which
    /// generates the output (`worker_type` prefill and decode).
    Disaggregated {
        /// Workers that run prefills.
        prefill: Pool,
        /// Workers that receive the KV and decode.
        decode: Pool,
    },
}

impl Default for Cluster {
    fn default() -> Self {
        Self::Aggregated(Pool::default())
    }
}

impl Cluster {
    /// `workers` aggregated engines configured by `launch`.
    pub fn aggregated(launch: LaunchConfig, workers: usize) -> Self {
        Self::Aggregated(Pool { launch, workers })
    }

    /// The pool arrivals are routed to first (the aggregated or the prefill pool).
    pub fn entry(&self) -> &Pool {
        match self {
            Self::Aggregated(p) | Self::Disaggregated { prefill: p, .. } => p,
        }
    }

    /// The decode pool of a disaggregated cluster.
    pub fn decode(&self) -> Option<&Pool> {
        match self {
            Self::Aggregated(_) => None,
            Self::Disaggregated { decode, .. } => Some(decode),
        }
    }

    /// Every pool, entry pool first.
    pub fn pools(&self) -> impl Iterator<Item = &Pool> {
        std::iter::once(self.entry()).chain(self.decode())
    }

    /// Engines in all pools.
    pub fn total_workers(&self) -> usize {
        self.pools().map(|p| p.workers).sum()
    }

    fn validate(&self, mode: &str) -> Result<(), ReplayError> {
        let role = |p: &Pool| p.launch.engine.worker_type;
        match self {
            Self::Aggregated(p) => {
                limits::count("num_workers", p.workers, limits::MAX_WORKERS)?;
                if mode != "offline" && p.launch.engine.g3_offload.is_some() {
                    // The reference's G3 tier needs its offline deployment's registry.
                    let msg = format!("is simulated only by offline replay (--mode offline), got {mode}");
                    return Err(invalid("engine.g3_offload", msg));
                }
                if mode != "offline" && p.launch.engine.native_host_offload.is_some() {
                    // Live engines are stepped by requests, not woken by transfer completions.
                    let msg = format!("is simulated only by offline replay (--mode offline), got {mode}");
                    return Err(invalid("engine.native_host_offload", msg));
                }
                if role(p) != WorkerType::Aggregated {
                    return Err(invalid(
                        "worker_type",
                        format!(
                            "{mode} replay only supports aggregated workers here, got {} (a disaggregated \
                             replay takes prefill and decode engine args instead)",
                            role(p)
                        ),
                    ));
                }
            }
            Self::Disaggregated { prefill, decode } => {
                if mode != "offline" {
                    return Err(invalid(
                        "mode",
                        format!("disaggregated replay only supports replay_mode='offline' (--mode offline), got {mode}"),
                    ));
                }
                for (field, pool, want) in [
                    ("num_prefill_workers", prefill, WorkerType::Prefill),
                    ("num_decode_workers", decode, WorkerType::Decode),
                ] {
                    limits::count(field, pool.workers, limits::MAX_WORKERS)?;
                    if role(pool) != want {
                        let side = if want == WorkerType::Prefill { "prefill" } else { "decode" };
                        return Err(invalid(
                            "worker_type",
                            format!(
                                "disaggregated replay requires {side}_engine_args.worker_type={want}, got {}",
                                role(pool)
                            ),
                        ));
                    }
                }
                let (p, d) = (prefill.launch.engine.backend, decode.launch.engine.backend);
                if p != d {
                    return Err(invalid(
                        "backend",
                        format!(
                            "disaggregated replay requires matching prefill/decode backends, got {p} and {d}"
                        ),
                    ));
                }
                let (p, d) = (prefill.launch.engine.block_size, decode.launch.engine.block_size);
                if p != d {
                    return Err(invalid(
                        "block_size",
                        format!("disaggregated replay requires matching prefill/decode block_size, got {p} and {d}"),
                    ));
                }
                // A request spends its API-server time once, on arrival, before its prefill:
                // a decode pool's own value would change nothing.
                let ms = |pool: &Pool| pool.launch.hardware.frontend_latency_ms.unwrap_or(0.0);
                let (p, d) = (ms(prefill), ms(decode));
                if p != d {
                    return Err(invalid(
                        "frontend_latency_ms",
                        format!(
                            "disaggregated replay spends it once, on arrival, before the prefill: give both pools \
                             the same value (a model sets 10 by default), got {p} and {d}"
                        ),
                    ));
                }
            }
        }
        // Every DP rank of every worker is an engine built up front.
        let engines: usize = self.pools().map(|p| p.workers * p.launch.dp_size).sum();
        if engines > limits::MAX_ENGINES {
            let field = if self.decode().is_some() { "num_prefill_workers" } else { "num_workers" };
            let msg = format!(
                "workers × dp_size come to {engines} simulated engines, above the limit {}",
                limits::MAX_ENGINES
            );
            return Err(invalid(field, msg));
        }
        for p in self.pools() {
            let dp = p.launch.dp_size;
            // Offline aggregated workers run their ranks in lock-step waves.
            if dp != 1 && (mode != "offline" || self.decode().is_some()) {
                let what = if mode == "offline" { "disaggregated" } else { mode };
                return Err(invalid(
                    "dp_size",
                    format!("{what} replay supports dp_size 1 only (got {dp}); dp_size > 1 runs in aggregated offline replays"),
                ));
            }
        }
        Ok(())
    }
}

/// What a replay runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayOptions {
    /// The workers and their engine configurations.
    pub cluster: Cluster,
    /// The workload.
    pub workload: Workload,
    /// First-turn arrival times and inter-turn delays are divided by this (finite, > 0).
    pub arrival_speedup_ratio: f64,
    /// Placement policy.
    pub router: RouterMode,
    /// KV router weights and queueing (used with [`RouterMode::Kv`]).
    pub router_config: KvRouterConfig,
    /// Stop when the simulated clock would pass this (ms); unfinished requests are dropped.
    pub max_sim_time_ms: Option<f64>,
    /// Goodput thresholds.
    pub sla: Sla,
    /// The reference's `kv_event_lag_ms`: the KV router's index sees the engines' stored
    /// and removed blocks this long after they happen (simulated ms), as a router fed by a
    /// slow event bus would; completions still free their blocks at once. Kv router only.
    pub kv_event_lag_ms: Option<f64>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            cluster: Cluster::default(),
            workload: Workload::default(),
            arrival_speedup_ratio: 1.0,
            router: RouterMode::RoundRobin,
            router_config: KvRouterConfig::default(),
            max_sim_time_ms: None,
            sla: Sla::default(),
            kv_event_lag_ms: None,
        }
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// A workload parameter is out of range.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The engine could not be built or refused a request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Options that are valid alone but not together, or not supported.
    #[error("{field}: {message}")]
    Invalid {
        /// The offending option.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A trace row is unusable for this replay (names file, line and field).
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
    /// An engine met a forward pass it can never run: a pass of cache groups
    /// (`kv_cache_groups`) larger than the whole byte budget. The reference stops there too.
    #[error("engine error: {0}")]
    EngineFault(#[from] mocker_core::scheduler::vllm::GroupedFault),
    /// A scaling policy failed.
    #[error(transparent)]
    Policy(#[from] crate::scaling::PolicyError),
    /// A request found no worker to go to (a scaled pool at zero workers).
    #[error("placement policy error: {0}")]
    Placement(String),
    /// The simulation cannot make progress.
    #[error("offline replay reached a dead end with {0} in-flight requests remaining")]
    DeadEnd(usize),
    /// A per-request record could not be written.
    #[error("cannot write per-request records: {0}")]
    Records(String),
}

pub(crate) fn invalid(field: &'static str, message: String) -> ReplayError {
    ReplayError::Invalid { field, message }
}

fn check_ms(field: &'static str, v: Option<f64>) -> Result<(), ReplayError> {
    match v {
        Some(x) if !(x.is_finite() && x >= 0.0) => {
            Err(invalid(field, format!("must be a finite number >= 0 (got {x})")))
        }
        _ => Ok(()),
    }
}

impl ReplayOptions {
    /// Checks the options every replay mode shares.
    pub fn validate(&self, mode: &str) -> Result<(), ReplayError> {
        self.workload.validate()?;
        self.cluster.validate(mode)?;
        let r = self.arrival_speedup_ratio;
        let (lo, hi) = limits::SPEEDUP_RANGE;
        if !(r.is_finite() && (lo..=hi).contains(&r)) {
            return Err(invalid(
                "arrival_speedup_ratio",
                format!("must be finite and in [{lo:e}, {hi:e}] (got {})", limits::show(r)),
            ));
        }
        check_ms("max_sim_time", self.max_sim_time_ms)?;
        if let Some(ms) = self.max_sim_time_ms.filter(|&ms| ms > limits::MAX_SIM_MS) {
            let msg =
                format!("must be at most {:e} s (10^6 hours; got {:e})", limits::MAX_SIM_MS / 1e3, ms / 1e3);
            return Err(invalid("max_sim_time", msg));
        }
        let total = self.workload.total_requests();
        if total > limits::MAX_REQUESTS {
            let msg = format!(
                "the workload issues {total} requests, above the limit {} (the report keeps samples of each)",
                limits::MAX_REQUESTS
            );
            let field = match &self.workload {
                Workload::Synthetic(_) => "request_count",
                Workload::Trace(_) => "trace_repeat",
            };
            return Err(invalid(field, msg));
        }
        limits::check_horizon(self)?;
        check_ms("sla_ttft_ms", self.sla.ttft_ms)?;
        check_ms("sla_itl_ms", self.sla.itl_ms)?;
        check_ms("sla_e2e_ms", self.sla.e2e_ms)?;
        self.router_config.validate().map_err(|(field, message)| invalid(field, message))?;
        check_ms("kv_event_lag_ms", self.kv_event_lag_ms)?;
        if self.kv_event_lag_ms.is_some_and(|ms| ms > 0.0) {
            if self.router != RouterMode::Kv {
                return Err(invalid("kv_event_lag_ms", "only applies to the kv router".into()));
            }
            if mode != "offline" {
                return Err(invalid(
                    "kv_event_lag_ms",
                    format!("only applies to offline replay (not {mode})"),
                ));
            }
        }
        // The KV router turns the engines' KV events on, which cache groups do not emit
        // (the reference fails the same way, from its engine).
        if self.router == RouterMode::Kv {
            if let Some(p) = self.cluster.pools().find(|p| p.launch.engine.has_kv_cache_groups()) {
                let mut msg =
                    "kv_cache_groups currently do not support KV event or token-ID emission, which \
                               the KV router reads; use the round-robin router"
                        .to_string();
                if let Some(model) = &p.launch.hardware.model {
                    // The groups came from the model's sliding-window layers.
                    msg += &format!(
                        ", or size {model}'s sliding-window layers as full ones with \
                         --disable-hybrid-kv-cache-manager"
                    );
                }
                return Err(invalid("router", msg));
            }
            // Nor does a state cache's align mode (the reference's engine error, up front).
            if let Some(p) = self.cluster.pools().find(|p| p.launch.engine.prefix_match_unit.is_some()) {
                let mut msg = "prefix_match_unit does not yet support KV event export, which the KV \
                               router reads; use the round-robin router"
                    .to_string();
                if let Some(model) = &p.launch.hardware.model {
                    // Align mode came from asking for prefix caching on a recurrent model.
                    msg += &format!(", or leave prefix caching off for {model}");
                }
                return Err(invalid("router", msg));
            }
        }
        Ok(())
    }

    /// `ms` on the sped-up timeline, in ns.
    pub fn scaled_ns(&self, ms: f64) -> u64 {
        ms_to_ns(ms / self.arrival_speedup_ratio)
    }
}

/// Milliseconds to whole nanoseconds (the simulated clock's unit).
pub fn ms_to_ns(ms: f64) -> u64 {
    mocker_core::timing::round_to_u64(ms * 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sla_goodput_rules() {
        let s = Sla { ttft_ms: Some(100.0), itl_ms: Some(10.0), e2e_ms: None };
        assert!(s.is_good(100.0, 190.0, 10)); // itl (190-100)/9 = 10
        assert!(!s.is_good(100.0, 200.0, 10));
        assert!(!s.is_good(101.0, 150.0, 10));
        assert!(s.is_good(50.0, 5000.0, 1), "one token: no ITL to check");
        assert!(!s.is_good(0.0, 0.0, 0));
        assert!(Sla { e2e_ms: Some(5.0), ..Default::default() }.is_good(0.0, 0.0, 0));
    }

    #[test]
    fn a_decode_pools_own_frontend_latency_is_refused() {
        let pool = |wt: WorkerType, ms: Option<f64>| {
            let mut launch = LaunchConfig::default();
            launch.engine.worker_type = wt;
            launch.hardware.frontend_latency_ms = ms;
            Pool { launch, workers: 1 }
        };
        let cluster = |p: Option<f64>, d: Option<f64>| Cluster::Disaggregated {
            prefill: pool(WorkerType::Prefill, p),
            decode: pool(WorkerType::Decode, d),
        };
        assert!(cluster(Some(10.0), Some(10.0)).validate("offline").is_ok());
        assert!(cluster(None, Some(0.0)).validate("offline").is_ok());
        let e = cluster(None, Some(10.0)).validate("offline").unwrap_err();
        assert!(matches!(e, ReplayError::Invalid { field: "frontend_latency_ms", .. }), "{e}");
    }
}
