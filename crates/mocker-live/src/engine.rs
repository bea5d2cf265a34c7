//! `LiveEngine`: the client-side handle of one rank of a live group.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use mocker_core::config::{EngineConfig, LaunchConfig};
use mocker_core::metrics::{EngineMetrics, LoraActivity};
use mocker_core::{Engine, EngineOptions, Request};
use tokio::sync::{mpsc, oneshot, watch, OnceCell};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::actor::Actor;
use crate::command::{CancelMsg, Command, Lanes, Registered};
use crate::error::LiveError;
use crate::handoff::{HandoffRoute, HandoffTransferTiming};
use crate::options::{LiveOptions, OutputBuffering};
use crate::rank::RankState;
use crate::request::{cancel_route, LiveRequest, LiveRequestRegistration};
use crate::route::{RankShared, Route};

/// Lane capacities: bounded, so a flood of submissions waits instead of growing memory.
const COMMAND_LANE: usize = 1024;
const CANCEL_LANE: usize = 1024;

static NEXT_ENGINE_ID: AtomicUsize = AtomicUsize::new(1);

/// What every rank of a group shares.
struct Group {
    token: CancellationToken,
    join: Mutex<Option<JoinHandle<Result<(), LiveError>>>>,
    result: OnceCell<Result<(), LiveError>>,
    epoch: Instant,
}

impl Group {
    /// Stops the actor once and joins it; every caller gets the same result.
    async fn shutdown(&self) -> Result<(), LiveError> {
        self.result
            .get_or_init(|| async {
                self.token.cancel();
                let join = self.join.lock().expect("join").take();
                match join {
                    Some(j) => match j.await {
                        Ok(r) => r,
                        Err(e) => Err(LiveError::SchedulerTaskFailed(e.to_string())),
                    },
                    None => Ok(()),
                }
            })
            .await
            .clone()
    }
}

/// One rank's client-side state (shared by its `LiveEngine` clones).
pub(crate) struct Rank {
    id: usize,
    rank: u32,
    group: Arc<Group>,
    pub(crate) shared: Arc<RankShared>,
    cmd: mpsc::Sender<Command>,
    cancel: mpsc::Sender<CancelMsg>,
    metrics: watch::Receiver<EngineMetrics>,
    lora: Option<watch::Receiver<LoraActivity>>,
    kv_groups: Option<watch::Receiver<Vec<(u64, u64)>>>,
    shutdown: OnceCell<Result<(), LiveError>>,
}

impl Drop for Rank {
    fn drop(&mut self) {
        // Retire only this rank's requests; the actor ends when every rank is gone.
        if let Err(mpsc::error::TrySendError::Full(msg)) =
            self.cancel.try_send(CancelMsg::Retire { rank: self.rank })
        {
            // Never lose a retirement to a full lane: deliver it from a task.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let lane = self.cancel.clone();
                rt.spawn(async move {
                    let _ = lane.send(msg).await;
                });
            }
        }
    }
}

/// One rank of a running live engine. Cheap to clone; dropping the last clone retires the
/// rank's requests (and stops the actor when it was the group's last rank).
#[derive(Clone)]
pub struct LiveEngine {
    inner: Arc<Rank>,
    /// How the streams this handle hands out are buffered (the rank's option, unless
    /// [`LiveEngine::with_buffering`] chose another).
    buffering: OutputBuffering,
}

impl std::fmt::Debug for LiveEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveEngine").field("dp_rank", &self.inner.rank).finish()
    }
}

impl LiveEngine {
    /// Starts a single-rank engine on the current tokio runtime.
    pub fn start(config: EngineConfig, options: LiveOptions) -> Result<LiveEngine, LiveError> {
        Ok(Self::start_group(config, vec![options])?.pop().expect("one rank"))
    }

    /// Starts `options.len()` data-parallel ranks that share one actor and one pass
    /// barrier; each rank keeps its own routes, sinks and metrics.
    pub fn start_group(
        config: EngineConfig,
        options: Vec<LiveOptions>,
    ) -> Result<Vec<LiveEngine>, LiveError> {
        let rt = tokio::runtime::Handle::try_current().map_err(|_| LiveError::NoRuntime)?;
        if options.is_empty() {
            return Err(LiveError::InvalidArguments(
                "dp_size: a group needs at least one options value (one per DP rank)".into(),
            ));
        }
        let launch = LaunchConfig { engine: config.clone(), dp_size: options.len(), ..Default::default() };
        launch.validate().map_err(|e| LiveError::InvalidArguments(e.to_string()))?;
        let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_LANE);
        let (cancel_tx, cancel_rx) = mpsc::channel(CANCEL_LANE);
        let token = CancellationToken::new();
        let epoch = Instant::now();
        let n = options.len();
        let mut states = Vec::with_capacity(n);
        let mut ranks = Vec::with_capacity(options.len());
        for (r, o) in options.into_iter().enumerate() {
            let engine = Engine::new(EngineOptions {
                config: config.clone(),
                dp_rank: r as u32,
                record_kv_events: o.kv_events.is_some(),
                // One worker: rank r draws MTP acceptances from seed + r, as the reference.
                seed_offset: r as u64,
                dp_size: n,
                max_loras: o.max_loras,
                ..Default::default()
            })
            .map_err(|e| LiveError::InvalidArguments(e.to_string()))?;
            let (mtx, mrx) = watch::channel(engine.metrics());
            let (ltx, lrx) = match o.max_loras {
                0 => (None, None),
                _ => {
                    let (tx, rx) = watch::channel(LoraActivity::default());
                    (Some(tx), Some(rx))
                }
            };
            let (gtx, grx) = match config.has_kv_cache_groups() {
                false => (None, None),
                true => {
                    let (tx, rx) = watch::channel(engine.kv_group_usage());
                    (Some(tx), Some(rx))
                }
            };
            let shared = RankShared::new();
            let mut state = RankState::new(
                engine,
                shared.clone(),
                mtx,
                o.kv_events,
                o.forward_pass_metrics,
                o.admissions,
            );
            state.transfer = HandoffTransferTiming::from_config(&config, 0);
            state.lora = ltx;
            state.kv_groups = gtx;
            states.push(state);
            ranks.push((r as u32, shared, mrx, lrx, grx, o.buffering));
        }
        let actor = Actor::new(states, cmd_rx, cancel_rx, token.clone(), epoch);
        let join = rt.spawn(actor.run());
        let group = Arc::new(Group { token, join: Mutex::new(Some(join)), result: OnceCell::new(), epoch });
        Ok(ranks
            .into_iter()
            .map(|(rank, shared, metrics, lora, kv_groups, buffering)| LiveEngine {
                inner: Arc::new(Rank {
                    id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
                    rank,
                    group: group.clone(),
                    shared,
                    cmd: cmd_tx.clone(),
                    cancel: cancel_tx.clone(),
                    metrics,
                    lora,
                    kv_groups,
                    shutdown: OnceCell::new(),
                }),
                buffering,
            })
            .collect())
    }

    /// A handle to the same rank whose requests are buffered as `buffering` says: a
    /// server reading a whole response itself (not streamed) must not be shed as a slow
    /// reader.
    pub fn with_buffering(&self, buffering: OutputBuffering) -> LiveEngine {
        LiveEngine { inner: Arc::clone(&self.inner), buffering }
    }

    /// Whether the engine still runs (not shut down, its actor not failed).
    pub fn is_running(&self) -> bool {
        self.inner.shared.is_running() && !self.inner.group.token.is_cancelled()
    }

    pub(crate) fn rank(&self) -> &Arc<Rank> {
        &self.inner
    }

    /// A handle for commands on requests already prepared (their buffering is fixed).
    pub(crate) fn from_rank(inner: Arc<Rank>) -> Self {
        Self { inner, buffering: OutputBuffering::default() }
    }

    pub(crate) async fn command(&self, cmd: Command) -> Result<(), LiveError> {
        self.inner.cmd.send(cmd).await.map_err(|_| LiveError::NotAcceptingCommands)
    }

    /// Submits one side of a handoff (see `LiveHandoffControl`).
    pub(crate) async fn submit_handoff(
        &self,
        registration: LiveRequestRegistration,
        route: Arc<HandoffRoute>,
        source: bool,
    ) -> Result<(), LiveError> {
        let rank = self.inner.rank;
        self.submit_registered(registration, |reg, reply| Command::SubmitHandoff {
            rank,
            reg,
            route,
            source,
            reply,
        })
        .await
    }

    /// Takes a registration made by this engine and sends the command built from it;
    /// resolves with the actor's answer. A dropped answer means the actor stopped (or
    /// lost the command), which callers must be able to tell apart.
    async fn submit_registered(
        &self,
        mut registration: LiveRequestRegistration,
        command: impl FnOnce(Registered, oneshot::Sender<Result<(), LiveError>>) -> Command,
    ) -> Result<(), LiveError> {
        if registration.engine_id != self.inner.id {
            return Err(LiveError::ForeignRegistration);
        }
        let reg = registration.inner.take().ok_or(LiveError::ForeignRegistration)?;
        if !self.is_running() {
            return Err(LiveError::NotRunning);
        }
        let (tx, rx) = oneshot::channel();
        self.command(command(reg, tx)).await?;
        match rx.await {
            Ok(r) => r,
            Err(_) if !self.is_running() => Err(LiveError::NotRunning),
            Err(_) => Err(LiveError::CommandAckDropped),
        }
    }

    fn lanes(&self) -> Lanes {
        Lanes { cancel: self.inner.cancel.downgrade() }
    }

    /// This handle's data-parallel rank.
    pub fn dp_rank(&self) -> u32 {
        self.inner.rank
    }

    /// The tokio instant the engine's simulated clock counts from (`sim_time_ns` = 0).
    pub fn started_at(&self) -> Instant {
        self.inner.group.epoch
    }

    /// Registers a request without submitting it: its id counts as active from now on and
    /// the returned stream is already bound to it. `request.uuid` is the client id (0 for
    /// a fresh one); the core sees a fresh internal id.
    pub fn prepare_request(
        &self,
        mut request: Request,
    ) -> Result<(LiveRequestRegistration, LiveRequest), LiveError> {
        if !self.is_running() {
            return Err(LiveError::NotRunning);
        }
        let len = request.output_token_ids.as_ref().map_or(request.max_output_tokens, Vec::len);
        if len == 0 {
            return Err(LiveError::NoOutputTokens);
        }
        request.max_output_tokens = len;
        let client_id = if request.uuid == 0 { Uuid::new_v4() } else { Uuid::from_u128(request.uuid) };
        let sched_id = Uuid::new_v4().as_u128();
        request.uuid = sched_id;
        let cap = match self.buffering {
            OutputBuffering::CancelOnOverflow { capacity } => len.min(capacity.get()),
            OutputBuffering::FullResponse => len,
        };
        let (tx, rx) = mpsc::channel(cap.max(1));
        let route = Route::new(client_id, sched_id);
        self.inner.shared.insert(route.clone())?;
        let reg = Registered { route: Some(route.clone()), request, tx, rank: self.inner.shared.clone() };
        if !self.is_running() {
            drop(reg);
            return Err(LiveError::NotRunning);
        }
        let stream = LiveRequest { route, rx, lanes: self.lanes(), rank: self.inner.rank, finished: false };
        Ok((LiveRequestRegistration { inner: Some(reg), engine_id: self.inner.id }, stream))
    }

    /// Submits a prepared registration; resolves when the actor has applied it (at once
    /// when idle, at the next pass boundary while a pass is in flight).
    pub async fn submit_prepared(&self, registration: LiveRequestRegistration) -> Result<(), LiveError> {
        let rank = self.inner.rank;
        self.submit_registered(registration, |reg, reply| Command::Submit { rank, reg, reply }).await
    }

    /// Submits a request and returns its output stream. `request.uuid` is the client id
    /// (0 for a fresh one); a request that can never fit yields one `rejected` terminal.
    pub async fn submit(&self, request: Request) -> Result<LiveRequest, LiveError> {
        let (reg, stream) = self.prepare_request(request)?;
        self.submit_prepared(reg).await?;
        Ok(stream)
    }

    /// Cancels the active request `client_id` and waits for the scheduler's cleanup:
    /// `Ok(false)` when it is unknown or had nothing left to cancel.
    pub async fn cancel(&self, client_id: Uuid) -> Result<bool, LiveError> {
        let Some(route) = self.inner.shared.get(&client_id) else { return Ok(false) };
        cancel_route(&route, &self.lanes(), self.inner.rank).await
    }

    /// This rank's metrics, updated at pass ends and when commands change them.
    pub fn metrics(&self) -> watch::Receiver<EngineMetrics> {
        self.inner.metrics.clone()
    }

    /// The LoRA adapters with running and with waiting requests on this rank, as of the
    /// last pass (empty when the rank serves no adapters).
    pub fn lora_activity(&self) -> LoraActivity {
        self.inner.lora.as_ref().map(|rx| rx.borrow().clone()).unwrap_or_default()
    }

    /// With KV cache groups: the pages and bytes each group holds on this rank, in the
    /// configured groups' order, as of the last pass (empty without groups).
    pub fn kv_group_usage(&self) -> Vec<(u64, u64)> {
        self.inner.kv_groups.as_ref().map(|rx| rx.borrow().clone()).unwrap_or_default()
    }

    /// Requests of this rank cancelled so far because their reader let the output buffer
    /// overflow (always 0 with [`OutputBuffering::FullResponse`]).
    pub fn overflow_cancellations(&self) -> u64 {
        self.inner.shared.overflow_cancellations.load(Ordering::Relaxed)
    }

    /// Registered requests of this rank (prepared ones included).
    pub fn active_request_count(&self) -> usize {
        self.inner.shared.len()
    }

    /// Drops every cached block (only when none is in use); the `Cleared` event goes to
    /// the KV-event sink.
    pub async fn reset_prefix_cache(&self) -> Result<(), LiveError> {
        if !self.is_running() {
            return Err(LiveError::NotRunning);
        }
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Command::ResetPrefixCache { rank: self.inner.rank, reply: tx })
            .await
            .map_err(|_| LiveError::NotAcceptingCommands)?;
        rx.await.map_err(|_| LiveError::CommandAckDropped)?
    }

    /// Changes the speed-up ratio (modelled pass times are divided by it) of every rank of
    /// this engine's group, from the next pass on: a running server's runtime control. The
    /// pass in flight keeps its time. The ratio must be positive and finite.
    pub async fn set_speedup_ratio(&self, ratio: f64) -> Result<(), LiveError> {
        if !(ratio.is_finite() && ratio > 0.0) {
            return Err(LiveError::InvalidArguments(format!(
                "speedup_ratio must be positive and finite, got {ratio}"
            )));
        }
        if !self.is_running() {
            return Err(LiveError::NotRunning);
        }
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Command::SetSpeedupRatio { ratio, reply: tx })
            .await
            .map_err(|_| LiveError::NotAcceptingCommands)?;
        rx.await.map_err(|_| LiveError::CommandAckDropped)
    }

    /// Aborts every request of this rank, then drops its prefix cache (the `Cleared` event
    /// goes to the KV-event sink): what vLLM's `sleep` does to the scheduler in its default
    /// `abort` mode. Returns how many requests were aborted; their streams end early.
    pub async fn abort_all_and_reset(&self) -> Result<usize, LiveError> {
        if !self.is_running() {
            return Err(LiveError::NotRunning);
        }
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Command::AbortAllAndReset { rank: self.inner.rank, reply: tx })
            .await
            .map_err(|_| LiveError::NotAcceptingCommands)?;
        rx.await.map_err(|_| LiveError::CommandAckDropped)?
    }

    /// Stops the whole group and waits until its actor (with its engines and sinks) is
    /// gone. Idempotent: every call, on any rank, sees the same result for that rank.
    pub async fn shutdown(&self) -> Result<(), LiveError> {
        let inner = &self.inner;
        inner
            .shutdown
            .get_or_init(|| async {
                let group = inner.group.shutdown().await;
                let failure = inner.shared.failure.lock().expect("failure").clone();
                let left = inner.shared.len();
                let left_handoffs = inner.shared.handoffs.lock().expect("handoffs").len();
                inner.shared.stop();
                group?;
                if let Some(e) = failure {
                    return Err(e);
                }
                if left > 0 {
                    return Err(LiveError::LeakedRoutes);
                }
                if left_handoffs > 0 {
                    return Err(LiveError::LeakedHandoffRoutes);
                }
                Ok(())
            })
            .await
            .clone()
    }
}
