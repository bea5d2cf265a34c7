//! `mocker serve`'s flags turned into engine configuration and server options: each
//! flag checked and refused by name, one set of options per worker.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use mocker_core::config::{Backend, LaunchConfig, RuntimeConfig, WorkerType};
use mocker_core::output_length::OutputLengthDistribution;
use mocker_server::faults::{FailureInjectionOptions, FailureType};
use mocker_server::lora::{LoraModule, LoraOptions, LoraRegistry};
use mocker_server::pd::{
    BootstrapOptions, KvRole, KvTransferConfig, PdOptions, PeerAllowList, DEFAULT_ABORT_TIMEOUT,
};
use mocker_server::{KvEventsOptions, ServerOptions, Tokenizer};

use super::args::ServeArgs;
use crate::UsageError;

/// Most workers of one `serve` process (`--num-workers`, and each pool of
/// `--prefill-workers`/`--decode-workers`): each is an engine, a listener and its threads.
const MAX_SERVE_WORKERS: usize = 1024;
/// Longest `--embedding-dim` (OpenAI's largest model returns 3072): every input of a
/// request allocates a vector of it.
const MAX_EMBEDDING_DIM: usize = 65536;

/// SGLang's default `--disaggregation-bootstrap-port`.
const SGLANG_BOOTSTRAP_PORT: u16 = 8998;

/// The prefill and decode pools of a `--prefill-workers` deployment.
#[derive(Debug, Clone, Copy)]
pub struct Deployment {
    /// Prefill workers: the first servers of [`ServeArgs::options`]' list.
    pub prefill: usize,
    /// Decode workers: the rest.
    pub decode: usize,
    /// `--pd-router kv`: the front routes with the KV router.
    pub kv_router: bool,
}

/// File descriptors kept free of connections by the default `--max-connections`.
const RESERVED_FDS: usize = 128;

/// The default `--max-connections`: what the open-file limit leaves.
fn default_max_connections() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        1024
    };
    soft.saturating_sub(RESERVED_FDS).max(16)
}

/// A duration flag: finite and non-negative (positive when `positive`).
fn seconds(flag: &str, value: f64, positive: bool) -> Result<Duration, UsageError> {
    let ok = value.is_finite() && if positive { value > 0.0 } else { value >= 0.0 } && value < 1e9;
    if !ok {
        let kind = if positive { "a positive" } else { "a non-negative" };
        return Err(UsageError(format!("{flag}: must be {kind} number of seconds, got {value}")));
    }
    Ok(Duration::from_secs_f64(value))
}

impl ServeArgs {
    /// The name clients use: `--served-model-name`, else `--model` as given (as vLLM
    /// serves a model under its path or id), else "mocker".
    fn served_model_name(&self) -> String {
        self.model_name.clone().or_else(|| self.engine.model.clone()).unwrap_or_else(|| "mocker".into())
    }

    /// The name a worker with `launch` serves: `--model-name`, else its model's.
    fn served_model_name_of(&self, launch: &LaunchConfig) -> String {
        self.model_name.clone().or_else(|| launch.hardware.model.clone()).unwrap_or_else(|| "mocker".into())
    }

    /// Each worker's launch config: `shared` unless `--worker-engine-args` gives the worker
    /// keys of its own, which are laid over `--engine-args` and checked as the shared
    /// config is.
    fn worker_launches(
        &self,
        shared: &LaunchConfig,
        workers: usize,
        deployment: Option<Deployment>,
    ) -> Result<Vec<LaunchConfig>, UsageError> {
        use crate::fleet::{WorkerEngineArgs, FLAG, FLAG_KEYS};
        let Some(arg) = &self.worker_engine_args else { return Ok(vec![shared.clone(); workers]) };
        let fleet = WorkerEngineArgs::parse(arg, workers)?;
        let flags_given = self.engine_flags_given();
        let mut launches = Vec::with_capacity(workers);
        for i in 0..workers {
            let keys = fleet.keys(i);
            if keys.is_empty() {
                launches.push(shared.clone());
                continue;
            }
            for (flag, flag_keys) in FLAG_KEYS {
                if let Some(key) = flag_keys.iter().find(|k| keys.contains(**k)) {
                    if flags_given.contains(flag) {
                        return Err(UsageError(format!(
                            "{FLAG}: worker {i} sets {key}, which {flag} also sets; give it in one place"
                        )));
                    }
                }
            }
            // Process-wide settings: one value serves every worker.
            for key in ["emit_kv_events", "emit_kv_token_ids", "dynamo", "worker_type"] {
                if keys.contains(key) {
                    return Err(UsageError(format!(
                        "{FLAG}: worker {i} sets {key}, which applies to every worker of the process; set it in \
                         --engine-args"
                    )));
                }
            }
            let text = fleet.engine_args(i, self.engine_args.as_deref())?;
            let launch = self.launch_config(&format!("{FLAG} (worker {i})"), text.as_deref())?;
            self.lora_options(&launch)?;
            self.pd_options(&launch)?;
            launches.push(launch);
        }
        if let Some(d) = deployment {
            let names: BTreeSet<String> = launches.iter().map(|l| self.served_model_name_of(l)).collect();
            if names.len() > 1 {
                return Err(UsageError(format!(
                    "{FLAG}: the workers of a --prefill-workers deployment serve one model behind the front; they \
                     would serve {} (give --model-name)",
                    names.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            let pool_block_sizes = |range: std::ops::Range<usize>| -> BTreeSet<usize> {
                launches[range].iter().map(|l| l.engine.block_size).collect()
            };
            if d.kv_router
                && (pool_block_sizes(0..d.prefill).len() > 1
                    || pool_block_sizes(d.prefill..workers).len() > 1)
            {
                return Err(UsageError(format!(
                    "{FLAG}: --pd-router kv scores each pool's workers by blocks of one size; the workers of a pool \
                     must share block_size"
                )));
            }
        }
        Ok(launches)
    }

    /// The engine flags given on the command line (as [`crate::fleet::FLAG_KEYS`] names them).
    fn engine_flags_given(&self) -> Vec<&'static str> {
        let e = &self.engine;
        [
            ("--block-size", self.block_size.is_some()),
            ("--num-gpu-blocks", self.num_gpu_blocks.is_some()),
            ("--max-num-seqs", self.max_num_seqs.is_some()),
            ("--max-num-batched-tokens", self.max_num_batched_tokens.is_some()),
            ("--speedup-ratio", self.speedup_ratio.is_some()),
            (
                "--enable-prefix-caching / --no-enable-prefix-caching",
                self.enable_prefix_caching || self.no_enable_prefix_caching,
            ),
            ("--max-model-len", self.max_model_len.is_some()),
            ("--data-parallel-size", self.data_parallel_size.is_some()),
            ("--output-length-distribution", self.output_length_distribution.is_some()),
            ("--engine-type", e.engine_type.is_some()),
            ("--model", e.model.is_some()),
            ("--gpu", e.gpu.is_some()),
            ("--tensor-parallel-size", e.tensor_parallel_size.is_some()),
            ("--quantization", e.quantization.is_some()),
            ("--kv-cache-dtype", e.kv_cache_dtype.is_some()),
            ("--enable-expert-parallel", e.enable_expert_parallel),
            ("--disable-hybrid-kv-cache-manager", e.disable_hybrid_kv_cache_manager),
            ("--timing-profile", e.timing_profile.is_some()),
            ("--planner-profile-data", e.planner_profile_data.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    fn launch_config(&self, flag: &str, engine_args: Option<&str>) -> Result<LaunchConfig, UsageError> {
        // A server publishing KV events turns the engine's emission on (ServerOptions): say so
        // before a model lays out its cache, which must then be one that emits them (the
        // reference's cache groups and align-mode state caches do not). engine-args
        // `emit_kv_events: false` keeps them off, as kv_event_keys reads it.
        let events_off = crate::engine_args::given_engine_key(engine_args, "emit_kv_events")?
            == Some(serde_json::Value::Bool(false));
        let publishes = !events_off && self.kv_events_endpoint.is_some();
        // The engine flags act as their engine-args keys: laid on before the timing source
        // is read, so a profile or a model sizes the cache with them.
        let mut launch = crate::engine_args::launch_config_with(flag, engine_args, &self.engine, |launch| {
            if publishes || (!events_off && launch.dynamo.zmq_kv_events_port.is_some()) {
                launch.engine.emit_kv_events = true;
            }
            let engine = &mut launch.engine;
            if let Some(v) = self.block_size {
                engine.block_size = v;
                launch.given_keys.block_size = true;
            }
            if let Some(v) = self.num_gpu_blocks {
                engine.num_gpu_blocks = v;
                launch.num_gpu_blocks_given = true;
                launch.num_gpu_blocks_is_explicit = true;
            }
            if let Some(v) = self.max_num_seqs {
                engine.max_num_seqs = v;
                launch.given_keys.max_num_seqs = true;
            }
            if let Some(v) = self.max_num_batched_tokens {
                engine.max_num_batched_tokens = v;
                launch.given_keys.max_num_batched_tokens = true;
            }
            if let Some(v) = self.speedup_ratio {
                engine.speedup_ratio = v;
            }
            // Given, as the key would be: a model's cache layout must not overrule it.
            if self.enable_prefix_caching {
                engine.enable_prefix_caching = true;
                launch.given_keys.enable_prefix_caching = true;
            }
            if self.no_enable_prefix_caching {
                engine.enable_prefix_caching = false;
                launch.given_keys.enable_prefix_caching = true;
            }
            if let Some(v) = self.max_model_len {
                engine.max_model_len = Some(v);
            }
        })?;
        if let Some(v) = self.data_parallel_size {
            launch.dp_size = v;
        }
        if let Some(text) = &self.output_length_distribution {
            launch.output_length_distribution = Some(
                OutputLengthDistribution::from_json_str(text, "--output-length-distribution")
                    .map_err(|e| UsageError(e.to_string()))?,
            );
        }
        launch.validate().map_err(|e| UsageError(e.to_string()))?;
        if self.kv_transfer_config.is_none() {
            crate::replay::warn_transfer_keys(
                "--engine-args",
                &launch,
                "a prefill server of a disaggregated pair (--kv-transfer-config) or a disaggregated replay's \
                 --prefill-engine-args",
            );
        }
        if launch.tensor_parallel_size != 1 && launch.hardware.model.is_none() {
            eprintln!(
                "warning: --engine-args: tensor_parallel_size not used by serve (no figure here is per GPU); \
                 it applies to replay's per-GPU figures (gpu_hours, decode_gpus_per_worker) and must match a \
                 timing profile's tp"
            );
        }
        if launch.dynamo.router_queue_policy.is_some() {
            eprintln!(
                "warning: --engine-args: dynamo.router_queue_policy not used by serve (it has no router); it \
                 orders the KV router's queue in mocker replay --router kv"
            );
        }
        if launch.engine.g3_offload.is_some() {
            let msg = "engine.g3_offload: is simulated only by offline replay (mocker replay)";
            return Err(UsageError(msg.into()));
        }
        if launch.engine.native_host_offload.is_some() {
            // Live engines are stepped by requests, not woken by transfer completions.
            let msg = "engine.native_host_offload: is simulated only by offline replay (mocker replay)";
            return Err(UsageError(msg.into()));
        }
        Ok(launch)
    }

    /// Engine-args `emit_kv_events` / `emit_kv_token_ids` in a server: with an endpoint,
    /// events are published with token ids unless a key turns them off (as the reference's
    /// ZMQ sink does); `emit_kv_events: false` publishes nothing; `emit_kv_events: true`
    /// without an endpoint has nowhere to publish. Returns the endpoint to publish on, if
    /// any, and whether Stored events carry token ids.
    fn kv_event_keys(
        &self,
        endpoint: Option<String>,
        launch: &LaunchConfig,
    ) -> Result<(Option<String>, bool), UsageError> {
        let given = |key| crate::engine_args::given_engine_key(self.engine_args.as_deref(), key);
        let events_given = given("emit_kv_events")?.is_some();
        let token_ids_given = given("emit_kv_token_ids")?.is_some();
        let engine = &launch.engine;
        match endpoint {
            None if events_given && engine.emit_kv_events => Err(UsageError(
                "--engine-args emit_kv_events: true needs --kv-events-endpoint (or dynamo.zmq_kv_events_port): \
                 mocker serve publishes KV events only over ZMQ"
                    .into(),
            )),
            None => Ok((None, false)),
            Some(_) if events_given && !engine.emit_kv_events => {
                eprintln!("mocker: KV events off (engine-args emit_kv_events: false); nothing is published");
                Ok((None, false))
            }
            Some(e) => Ok((Some(e), !token_ids_given || engine.emit_kv_token_ids)),
        }
    }

    fn failure_injection(&self) -> Result<FailureInjectionOptions, UsageError> {
        let rate = self.failure_injection_rate;
        if !(0.0..=100.0).contains(&rate) {
            return Err(UsageError(format!(
                "--failure-injection-rate: must be a percentage from 0 to 100, got {rate}"
            )));
        }
        let types = self
            .failure_types
            .iter()
            .map(|name| {
                FailureType::parse(name.trim()).ok_or_else(|| {
                    let all: Vec<_> = FailureType::ALL.iter().map(|t| t.name()).collect();
                    UsageError(format!(
                        "--failure-types: unknown type {name:?}; choose from {}",
                        all.join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if rate == 0.0 {
            let given = [
                ("--failure-types", !types.is_empty()),
                ("--failure-injection-seed", self.failure_injection_seed.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                return Err(UsageError(format!("{flag}: needs --failure-injection-rate above 0")));
            }
        }
        Ok(FailureInjectionOptions { rate_percent: rate, types, seed: self.failure_injection_seed })
    }

    /// `--kv-transfer-config` and its timeout.
    fn pd_options(&self, launch: &LaunchConfig) -> Result<Option<PdOptions>, UsageError> {
        // Engine-args worker_type (is_prefill / is_decode) makes a prefill-only or decode-only
        // server, as the reference's disaggregation modes: every request must then carry
        // the matching kv_transfer_params.
        let wt = launch.engine.worker_type;
        // The reference's state cache runs on aggregated workers only (it refuses P/D worker
        // types): a handoff would move the token blocks and not the recurrent state.
        if launch.engine.state_cache.is_some() {
            let flag = match (&self.kv_transfer_config, self.prefill_workers) {
                (Some(_), _) => Some("--kv-transfer-config"),
                (None, Some(_)) => Some("--prefill-workers"),
                _ => None,
            };
            if let Some(flag) = flag {
                let whose = match &launch.hardware.model {
                    Some(m) => format!("{m}'s recurrent layers keep a state_cache"),
                    None => "engine-args state_cache".to_string(),
                };
                return Err(UsageError(format!(
                    "{flag}: {whose}, which is simulated on aggregated workers only (the reference's rule: a \
                     handoff would move the tokens' KV and not the state)"
                )));
            }
        }
        let implied = match wt {
            WorkerType::Aggregated => None,
            WorkerType::Prefill => Some(KvRole::Producer),
            WorkerType::Decode => Some(KvRole::Consumer),
        };
        if implied.is_some() && self.prefill_workers.is_some() {
            return Err(UsageError(format!(
                "engine.worker_type: {wt} cannot be combined with --prefill-workers/--decode-workers (the front \
                 sets its workers' roles)"
            )));
        }
        let sglang = launch.engine.backend == Backend::Sglang;
        let rt = &launch.dynamo;
        let session_set =
            rt.handoff_session_timeout_ms != RuntimeConfig::default().handoff_session_timeout_ms;
        if rt.bootstrap_port.is_some() && !(sglang && wt == WorkerType::Prefill) {
            return Err(UsageError(
                "engine-args dynamo.bootstrap_port: SGLang's bootstrap port of a prefill worker; it needs \
                 backend sglang and worker_type prefill"
                    .into(),
            ));
        }
        if session_set && !(sglang && implied.is_some()) {
            return Err(UsageError(
                "engine-args dynamo.handoff_session_timeout_ms: the rendezvous timeout of SGLang prefill/decode \
                 workers (backend sglang, worker_type prefill or decode); vLLM's is --kv-abort-timeout-seconds"
                    .into(),
            ));
        }
        if let (true, Some(role)) = (sglang, implied) {
            // SGLang's PD protocol: bootstrap rooms, not vLLM's connector.
            if self.kv_transfer_config.is_some() || self.kv_abort_timeout_seconds.is_some() {
                let flag = if self.kv_transfer_config.is_some() {
                    "--kv-transfer-config"
                } else {
                    "--kv-abort-timeout-seconds"
                };
                return Err(UsageError(format!(
                    "{flag}: vLLM's; an SGLang {wt} worker speaks SGLang's bootstrap protocol (engine-args \
                     bootstrap_port, handoff_session_timeout_ms)"
                )));
            }
            let bootstrap = BootstrapOptions {
                port: rt.bootstrap_port.unwrap_or(SGLANG_BOOTSTRAP_PORT),
                session_timeout: Duration::from_millis(rt.handoff_session_timeout_ms),
            };
            return Ok(Some(PdOptions {
                config: KvTransferConfig { role },
                abort_timeout: DEFAULT_ABORT_TIMEOUT,
                transfers_only: true,
                bootstrap: Some(bootstrap),
                peers: self.peers_for(role)?,
                secret: self.secret()?,
            }));
        }
        let config = match (&self.kv_transfer_config, implied) {
            (None, None) => {
                if self.kv_abort_timeout_seconds.is_some() && self.prefill_workers.is_none() {
                    return Err(UsageError("--kv-abort-timeout-seconds: needs --kv-transfer-config".into()));
                }
                for (given, flag) in [
                    (self.kv_peer_allow.is_some(), "--kv-peer-allow"),
                    (self.kv_transfer_secret.is_some(), "--kv-transfer-secret"),
                ] {
                    if given && self.prefill_workers.is_none() {
                        return Err(UsageError(format!(
                            "{flag}: needs a P/D role (--kv-transfer-config, engine-args worker_type, or \
                             --prefill-workers)"
                        )));
                    }
                }
                return Ok(None);
            }
            (None, Some(role)) => KvTransferConfig { role },
            (Some(json), implied) => {
                let config = KvTransferConfig::parse(json).map_err(UsageError)?;
                match implied {
                    Some(role) if config.role != KvRole::Both && config.role != role => {
                        return Err(UsageError(format!(
                            "engine.worker_type: {wt} conflicts with --kv-transfer-config's kv_role {:?}",
                            config.role
                        )))
                    }
                    Some(role) => KvTransferConfig { role },
                    None => config,
                }
            }
        };
        if launch.engine.backend != Backend::Vllm {
            let what = if implied.is_some() { "engine.worker_type" } else { "--kv-transfer-config" };
            return Err(UsageError(format!(
                "{what}: vLLM's KV-transfer contract is simulated on the vllm backend only, not {}",
                launch.engine.backend
            )));
        }
        let abort_timeout = match self.kv_abort_timeout_seconds {
            None => DEFAULT_ABORT_TIMEOUT,
            Some(s) => seconds("--kv-abort-timeout-seconds", s, true)?,
        };
        Ok(Some(PdOptions {
            config,
            abort_timeout,
            transfers_only: implied.is_some(),
            bootstrap: None,
            peers: self.peers_for(config.role)?,
            secret: self.secret()?,
        }))
    }

    /// `--kv-transfer-secret`, checked: an empty secret would guard nothing.
    fn secret(&self) -> Result<Option<String>, UsageError> {
        match self.kv_transfer_secret.as_deref() {
            Some("") => Err(UsageError("--kv-transfer-secret: must not be empty".into())),
            other => Ok(other.map(str::to_string)),
        }
    }

    /// `--kv-peer-allow` for a server of `role`: a prefill-only server reads no KV, so the
    /// flag would change nothing there and is refused.
    fn peers_for(&self, role: KvRole) -> Result<Option<PeerAllowList>, UsageError> {
        if self.kv_peer_allow.is_some() && role == KvRole::Producer {
            return Err(UsageError(
                "--kv-peer-allow: a prefill (kv_producer) server reads no KV; it applies to decode and kv_both \
                 servers"
                    .into(),
            ));
        }
        self.peers()
    }

    /// `--kv-peer-allow`, parsed (`None`: the default list).
    fn peers(&self) -> Result<Option<PeerAllowList>, UsageError> {
        self.kv_peer_allow
            .as_deref()
            .map(|text| PeerAllowList::parse(text).map_err(|e| UsageError(format!("--kv-peer-allow: {e}"))))
            .transpose()
    }

    /// The LoRA flags, checked as vLLM checks them, plus what mocker cannot simulate.
    fn lora_options(&self, launch: &LaunchConfig) -> Result<Option<LoraOptions>, UsageError> {
        if self.max_cpu_loras.is_some() {
            return Err(UsageError(
                "--max-cpu-loras: not supported: in vLLM it sizes the CPU cache adapters are reloaded \
                 from, and mocker does not model adapter load times; leave it out"
                    .into(),
            ));
        }
        if !self.enable_lora {
            for (set, flag) in
                [(!self.lora_modules.is_empty(), "--lora-modules"), (self.max_loras.is_some(), "--max-loras")]
            {
                if set {
                    return Err(UsageError(format!("{flag}: needs --enable-lora")));
                }
            }
            return Ok(None);
        }
        if launch.engine.backend == Backend::Sglang {
            return Err(UsageError(
                "--enable-lora: LoRA adapters are simulated on the vllm and trtllm backends only, not sglang"
                    .into(),
            ));
        }
        if launch.engine.native_host_offload.is_some() {
            return Err(UsageError(
                "--enable-lora: cannot be combined with engine-args native_host_offload (its admission path \
                 does not model adapters)"
                    .into(),
            ));
        }
        let max_loras = self.max_loras.unwrap_or(1);
        if max_loras == 0 {
            return Err(UsageError("--max-loras: must be at least 1, got 0".into()));
        }
        let modules = self
            .lora_modules
            .iter()
            .map(|m| LoraModule::parse(m))
            .collect::<Result<Vec<_>, _>>()
            .map_err(UsageError)?;
        let options = LoraOptions { max_loras, modules };
        // Names clash with each other or the served model: the same check the server makes.
        LoraRegistry::new(&options, &self.served_model_name()).map_err(UsageError)?;
        Ok(Some(options))
    }

    /// The `--prefill-workers` / `--decode-workers` deployment, if asked for.
    fn deployment(&self) -> Result<Option<Deployment>, UsageError> {
        let (Some(prefill), Some(decode)) = (self.prefill_workers, self.decode_workers) else {
            return Ok(None);
        };
        if !(1..=MAX_SERVE_WORKERS).contains(&prefill) || !(1..=MAX_SERVE_WORKERS).contains(&decode) {
            return Err(UsageError(format!(
                "--prefill-workers / --decode-workers: each pool needs 1..={MAX_SERVE_WORKERS} workers, got \
                 {prefill} and {decode}"
            )));
        }
        if self.num_workers != 1 {
            return Err(UsageError(
                "--num-workers: cannot be combined with --prefill-workers/--decode-workers".into(),
            ));
        }
        if self.kv_transfer_config.is_some() {
            return Err(UsageError(
                "--kv-transfer-config: the --prefill-workers/--decode-workers front sets its workers' roles itself"
                    .into(),
            ));
        }
        Ok(Some(Deployment { prefill, decode, kv_router: self.pd_router.as_deref() == Some("kv") }))
    }

    /// `--grpc-port`: a backend with a gRPC service, no P/D front (HTTP only), and ports that fit and
    /// stay clear of the HTTP ports.
    fn check_grpc_port(
        &self,
        launch: &LaunchConfig,
        workers: usize,
        first_port: usize,
    ) -> Result<(), UsageError> {
        let Some(port) = self.grpc_port else { return Ok(()) };
        if launch.engine.backend == Backend::Trtllm {
            return Err(UsageError(format!(
                "--grpc-port: gRPC services are simulated on the vllm and sglang backends only (engine backend is {})",
                launch.engine.backend.as_str()
            )));
        }
        if self.prefill_workers.is_some() || self.decode_workers.is_some() {
            return Err(UsageError(
                "--grpc-port: cannot be combined with --prefill-workers/--decode-workers (the P/D front is HTTP only)"
                    .into(),
            ));
        }
        if port == 0 {
            return Ok(());
        }
        let last = usize::from(port) + workers - 1;
        if last > usize::from(u16::MAX) {
            return Err(UsageError(format!("--grpc-port: {port} + {workers} workers exceeds 65535")));
        }
        let http = first_port..first_port + workers;
        if self.port != 0 && (usize::from(port)..=last).any(|p| http.contains(&p)) {
            return Err(UsageError(format!(
                "--grpc-port: ports {port}..={last} overlap the HTTP ports {}..={} (--port, one per worker)",
                http.start,
                http.end - 1
            )));
        }
        Ok(())
    }

    /// One server's options per worker; with a deployment, its prefill workers first.
    pub(super) fn options(&self) -> Result<(Vec<ServerOptions>, Option<Deployment>), UsageError> {
        if !(1..=MAX_SERVE_WORKERS).contains(&self.num_workers) {
            return Err(UsageError(format!(
                "--num-workers: must be in 1..={MAX_SERVE_WORKERS}, got {}",
                self.num_workers
            )));
        }
        let dim = self.embedding_dim.get();
        if dim > MAX_EMBEDDING_DIM {
            return Err(UsageError(format!(
                "--embedding-dim: must be in 1..={MAX_EMBEDDING_DIM}, got {dim}"
            )));
        }
        let deployment = self.deployment()?;
        let workers = deployment.map_or(self.num_workers, |d| d.prefill + d.decode);
        // The front takes --port; its workers the ports after it.
        let first_port = usize::from(self.port) + usize::from(deployment.is_some());
        let grace = seconds("--shutdown-grace-seconds", self.shutdown_grace_seconds, false)?;
        let header_timeout = seconds("--header-timeout-seconds", self.header_timeout_seconds, true)?;
        let body_timeout = seconds("--body-timeout-seconds", self.body_timeout_seconds, true)?;
        if self.api_key.as_deref() == Some("") {
            return Err(UsageError(
                "--api-key (or MOCKER_API_KEY): must not be empty; omit it to serve without a key".into(),
            ));
        }
        let max_connections = match self.max_connections {
            Some(0) => return Err(UsageError("--max-connections: must be at least 1, got 0".into())),
            Some(n) => n,
            None => default_max_connections(),
        };
        let failure_injection = self.failure_injection()?;
        let tls = self.tls.options()?;
        let launch = self.launch_config("--engine-args", self.engine_args.as_deref())?;
        self.check_grpc_port(&launch, workers, first_port)?;
        let lora = self.lora_options(&launch)?;
        let pd = self.pd_options(&launch)?;
        let launches = self.worker_launches(&launch, workers, deployment)?;
        for launch in &launches {
            if deployment.is_some_and(|d| d.kv_router) && launch.dp_size > 1 {
                // A worker's HTTP endpoint picks its own rank, so the router cannot place on one.
                return Err(UsageError(format!(
                    "--pd-router kv: routes over workers of one DP rank each; got dp_size {}",
                    launch.dp_size
                )));
            }
            if deployment.is_some() && launch.engine.backend != Backend::Vllm {
                return Err(UsageError(format!(
                    "--prefill-workers: vLLM's KV-transfer contract is simulated on the vllm backend only, not {}",
                    launch.engine.backend
                )));
            }
        }
        let abort_timeout = match self.kv_abort_timeout_seconds {
            None => DEFAULT_ABORT_TIMEOUT,
            Some(s) => seconds("--kv-abort-timeout-seconds", s, true)?,
        };
        let peers = self.peers()?;
        // The deployment's workers share a secret: the one given, or a fresh random one, so
        // nothing outside this process can read or abort their held KV.
        let deployment_secret = match deployment {
            Some(_) => Some(self.secret()?.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())),
            None => None,
        };
        let role = |i: usize| match deployment {
            None => pd.clone(),
            Some(d) => {
                let role = if i < d.prefill { KvRole::Producer } else { KvRole::Consumer };
                Some(PdOptions {
                    config: KvTransferConfig { role },
                    abort_timeout,
                    transfers_only: false,
                    bootstrap: None,
                    peers: peers.clone(),
                    secret: deployment_secret.clone(),
                })
            }
        };
        let kv_endpoint = self
            .kv_events_endpoint
            .clone()
            .or_else(|| launch.dynamo.zmq_kv_events_port.map(|p| format!("tcp://{}:{p}", self.host)));
        let replay_endpoint = self
            .kv_events_replay_endpoint
            .clone()
            .or_else(|| launch.dynamo.zmq_replay_port.map(|p| format!("tcp://{}:{p}", self.host)));
        if replay_endpoint.is_some() && kv_endpoint.is_none() {
            return Err(UsageError(
                "--kv-events-replay-endpoint (or dynamo.zmq_replay_port): needs --kv-events-endpoint (or \
                 dynamo.zmq_kv_events_port)"
                    .into(),
            ));
        }
        let (kv_endpoint, kv_token_ids) = self.kv_event_keys(kv_endpoint, &launch)?;
        let tokenizer = match &self.tokenizer {
            Some(path) => Tokenizer::from_path(path).map_err(|e| UsageError(e.to_string()))?,
            None => Tokenizer::Builtin,
        };
        let servers = (0..workers)
            .map(|i| {
                let port = if self.port == 0 {
                    0
                } else {
                    u16::try_from(first_port + i).map_err(|_| {
                        UsageError(format!("--port: {} + {workers} workers exceeds 65535", self.port))
                    })?
                };
                let mut options = ServerOptions::new(SocketAddr::new(self.host, port), launches[i].clone());
                options.model_name = self.served_model_name_of(&launches[i]);
                options.tokenizer = tokenizer.clone();
                options.api_key = self.api_key.clone();
                options.shutdown_grace = grace;
                options.header_timeout = header_timeout;
                options.body_timeout = body_timeout;
                options.max_connections = max_connections;
                options.stream_buffer_tokens = self.stream_buffer_tokens;
                options.failure_injection = failure_injection.clone();
                options.image_tokens = self.image_tokens as usize;
                options.enable_sleep_mode = self.enable_sleep_mode;
                options.embedding_dim = self.embedding_dim.get();
                options.max_logprobs = self.max_logprobs;
                options.lora = lora.clone();
                options.pd = role(i);
                options.tls = tls.clone();
                options.grpc_port = match self.grpc_port {
                    None => None,
                    Some(0) => Some(0),
                    // Checked to fit in check_grpc_port.
                    Some(p) => Some(p + i as u16),
                };
                if let Some(endpoint) = &kv_endpoint {
                    // Each worker's ranks take the ports after the ranks of the workers before it.
                    let shift = launches[..i].iter().map(|l| l.dp_size).sum::<usize>() as u32;
                    let offset = |flag: &str, e: &str| {
                        mocker_kv_events::offset_endpoint(e, shift)
                            .map_err(|m| UsageError(format!("{flag}: {m}")))
                    };
                    options.kv_events = Some(KvEventsOptions {
                        token_ids: kv_token_ids,
                        endpoint: offset("--kv-events-endpoint", endpoint)?,
                        replay_endpoint: replay_endpoint
                            .as_deref()
                            .map(|e| offset("--kv-events-replay-endpoint", e))
                            .transpose()?,
                    });
                }
                Ok(options)
            })
            .collect::<Result<Vec<_>, UsageError>>()?;
        Ok((servers, deployment))
    }
}
