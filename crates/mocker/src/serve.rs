//! `mocker serve`: flags to engine configuration and server options, one server per worker
//! on consecutive ports, stopped by SIGINT or SIGTERM.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use mocker_core::config::{Backend, LaunchConfig, RuntimeConfig, WorkerType};
use mocker_core::output_length::OutputLengthDistribution;
use mocker_live::{KvEventSink, LiveOptions};
use mocker_replay::router::{KvRouter, KvRouterConfig};
use mocker_server::faults::{FailureInjectionOptions, FailureType};
use mocker_server::front::{BoundFront, FrontOptions, PdRouting};
use mocker_server::lora::{LoraModule, LoraOptions, LoraRegistry};
use mocker_server::pd::{
    BootstrapOptions, KvRole, KvTransferConfig, PdOptions, PeerAllowList, DEFAULT_ABORT_TIMEOUT,
};
use mocker_server::{BoundServer, KvEventsOptions, ServerOptions, Tokenizer};

use crate::UsageError;

/// Server and engine flags (names as vLLM's `vllm serve` has them).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the first worker (worker i listens on port + i; 0 picks free ports).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model name clients use and `/v1/models` lists (default: `--model`'s, else "mocker").
    #[arg(long, visible_alias = "served-model-name")]
    pub model_name: Option<String>,
    /// Engine configuration as JSON (flat or {"engine": {...}}) or @file; the flags below
    /// override it.
    #[arg(long, visible_alias = "extra-engine-args")]
    pub engine_args: Option<String>,
    /// Engine family and timing source.
    #[command(flatten)]
    pub engine: crate::engine_args::EngineFlags,
    /// Tokens per KV block.
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV blocks per rank.
    #[arg(long)]
    pub num_gpu_blocks: Option<usize>,
    /// Most requests running at once.
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Token budget of one forward pass.
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Simulated speed-up: modelled pass times are divided by it.
    #[arg(long)]
    pub speedup_ratio: Option<f64>,
    /// Reuse cached prompt prefixes.
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Do not reuse cached prompt prefixes.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Data-parallel ranks sharing one scheduler.
    #[arg(long, visible_alias = "dp")]
    pub data_parallel_size: Option<usize>,
    /// Context window: prompt plus output tokens. Default: 32768, or what one rank's KV
    /// pool holds when that is less.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Output lengths of chat requests that set no max_tokens: where the simulated model
    /// writes end-of-sequence, as JSON: {"type": "lognormal", "mean": M, "sigma": S, "min":
    /// A, "max": B}, {"type": "uniform", "min": A, "max": B}, {"type": "fixed", "tokens":
    /// N} or {"type": "none"} (run to the context). Default: lognormal, mean 215, sigma 1,
    /// max 4096. Engine-args key `output_length_distribution`.
    #[arg(long, value_name = "JSON")]
    pub output_length_distribution: Option<String>,
    /// Independent engines in this process, each with its own server.
    #[arg(long, default_value_t = 1)]
    pub num_workers: usize,
    /// A mixed fleet: each worker's own engine args, laid over --engine-args key by key. A
    /// JSON list with one object per worker (a --prefill-workers deployment's prefill
    /// workers first), or a map from worker index to object; inline, @file or a file path.
    /// A key a worker sets here may not also be set by an engine flag.
    #[arg(long, value_name = "JSON|FILE")]
    pub worker_engine_args: Option<String>,
    /// Also serve the backend's gRPC service (vllm: vllm.grpc.engine.VllmEngine; sglang:
    /// sglang.grpc.scheduler.SglangScheduler) on this port (worker i on port + i; 0 picks
    /// free ports). It is served on --port in any case, to HTTP/2 requests with a gRPC
    /// content type. vllm and sglang backends.
    #[arg(long, value_name = "PORT")]
    pub grpc_port: Option<u16>,
    /// Hugging Face `tokenizer.json` (or a folder holding one); a built-in word tokenizer
    /// is used otherwise.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Require `Authorization: Bearer KEY` on /v1 routes and on /reset_prefix_cache.
    #[arg(long, env = "MOCKER_API_KEY")]
    pub api_key: Option<String>,
    /// Publish KV events over ZMQ in vLLM's format, e.g. tcp://127.0.0.1:5557 (DP rank r
    /// binds port + r; worker w of --num-workers shifts by w × dp size). Off by default;
    /// engine-args key `zmq_kv_events_port` does the same on --host.
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// ZMQ ROUTER endpoint answering KV-event replay (gap recovery) requests; engine-args
    /// key `zmq_replay_port`.
    #[arg(long)]
    pub kv_events_replay_endpoint: Option<String>,
    /// Seconds in-flight streams may run on after SIGINT/SIGTERM; then open streams end
    /// with an error event and every connection is closed. A second signal exits at once.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_grace_seconds: f64,
    /// Seconds a connection may take to send a request's head (line and headers), counted
    /// from its opening or its previous response; also the idle keep-alive timeout.
    #[arg(long, default_value_t = 5.0)]
    pub header_timeout_seconds: f64,
    /// Seconds a request body may take to arrive in full (else 408).
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout_seconds: f64,
    /// Most open connections per worker; more are answered 503. Default: the open-file
    /// limit (`ulimit -n`) minus 128 kept for the engine, sockets and files.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Output tokens buffered per stream for a client that reads slower than the engine
    /// generates; a stream whose buffer overflows is cancelled (its KV freed) and counted
    /// in mocker:stream_overflow_cancellations_total.
    #[arg(long, default_value_t = NonZeroUsize::new(8192).unwrap())]
    pub stream_buffer_tokens: NonZeroUsize,
    /// Percentage (0-100) of inference requests answered with an injected OpenAI-style
    /// error instead of running, for gateway and client tests. Off (0) by default.
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    pub failure_injection_rate: f64,
    /// Errors injected, drawn uniformly (default: all): rate_limit (429), invalid_api_key
    /// (401), context_length (400), server_error (500), invalid_request (400),
    /// model_not_found (404). Comma-separated or repeated.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub failure_types: Vec<String>,
    /// Seed of the injection draw: the same seed fails the same request positions (in
    /// arrival order) with the same errors. Random by default.
    #[arg(long)]
    pub failure_injection_seed: Option<u64>,
    /// Prompt tokens each image_url part of a chat message counts as (default: Qwen2-VL's
    /// 256 for a 448x448 image). The ids are a hash of the image's URL or data, so the
    /// same image shares prefix-cache blocks.
    #[arg(long, default_value_t = mocker_server::server::DEFAULT_IMAGE_TOKENS as u32,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub image_tokens: u32,
    /// Serve vLLM's sleep-mode routes: POST /sleep?level=1|2 (aborts in-flight requests,
    /// frees the KV cache, then answers inference routes 503), POST /wake_up, GET
    /// /is_sleeping. Without it they answer 404, as in vLLM without dev mode.
    #[arg(long)]
    pub enable_sleep_mode: bool,
    /// Length of the unit-norm vectors /v1/embeddings returns (at least 1).
    #[arg(long, value_name = "N", default_value_t = NonZeroUsize::new(1024).unwrap())]
    pub embedding_dim: NonZeroUsize,
    /// Most log-probability alternatives a request may ask for (`top_logprobs`, completions'
    /// `logprobs`); more is a 400 naming the field, as vLLM's flag (0 to 20).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub max_logprobs: u32,
    /// Serve LoRA adapters (vLLM's flag; vllm and trtllm backends): a request's `model`
    /// picks one, at most --max-loras adapters share a batch (requests of others wait),
    /// adapters never share cached blocks, KV events name the adapter, and
    /// POST /v1/load_lora_adapter and /v1/unload_lora_adapter manage them at run time.
    #[arg(long)]
    pub enable_lora: bool,
    /// Adapters loaded at start: `name=path` or `{"name": ..., "path": ...,
    /// "base_model_name": ...}` (vLLM's forms), space-separated or repeated. No weights are
    /// read; the path is what /v1/models reports as the adapter's root. Needs --enable-lora.
    #[arg(long, num_args = 1.., value_name = "NAME=PATH")]
    pub lora_modules: Vec<String>,
    /// Most LoRA adapters in one batch (vLLM's default: 1). Needs --enable-lora.
    #[arg(long, value_name = "N")]
    pub max_loras: Option<usize>,
    /// vLLM's CPU cache of adapters: refused, since all it changes is how long vLLM takes
    /// to reload an adapter from disk, which mocker does not model.
    #[arg(long, value_name = "N")]
    pub max_cpu_loras: Option<usize>,
    /// Take part in disaggregated prefill/decode with vLLM's NIXL contract (vllm backend):
    /// `{"kv_connector": "NixlConnector", "kv_role": "kv_both"|"kv_producer"|"kv_consumer"}`.
    /// Requests' `kv_transfer_params` then prefill and hold KV for a remote decode, or decode
    /// from KV a remote prefill holds, read over mocker's side channel with the modelled
    /// transfer time (engine-args kv_transfer_* of the prefill server).
    #[arg(long, value_name = "JSON")]
    pub kv_transfer_config: Option<String>,
    /// How long a finished prefill holds its KV for a decode side that never reads it
    /// (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT). Needs --kv-transfer-config.
    #[arg(long, value_name = "SECONDS")]
    pub kv_abort_timeout_seconds: Option<f64>,
    /// Networks a decode server may read KV from, comma-separated CIDRs or addresses (the
    /// peer named by a request's kv_transfer_params.remote_host or bootstrap_host). Default:
    /// loopback and the server's own --host. Needs a P/D role.
    #[arg(long, value_name = "CIDR,...")]
    pub kv_peer_allow: Option<String>,
    /// A secret the servers of a P/D deployment share: side-channel reads, aborts and
    /// bootstrap reads must carry it (x-mocker-kv-transfer-secret), and this server's reads
    /// send it. Needs a P/D role; a --prefill-workers deployment makes a random one unless
    /// given. Also read from MOCKER_KV_TRANSFER_SECRET.
    #[arg(long, value_name = "SECRET", env = "MOCKER_KV_TRANSFER_SECRET", hide_env_values = true)]
    pub kv_transfer_secret: Option<String>,
    /// A disaggregated deployment in one process: P prefill workers (kv_producer) and
    /// --decode-workers D decode workers (kv_consumer), each on its own port (--port + 1
    /// on, listed at start), behind an OpenAI front on --port that runs each request as a
    /// prefill then a decode with the returned kv_transfer_params (vllm backend).
    #[arg(long, value_name = "P", requires = "decode_workers")]
    pub prefill_workers: Option<usize>,
    /// Decode workers of the deployment (see --prefill-workers).
    #[arg(long, value_name = "D", requires = "prefill_workers")]
    pub decode_workers: Option<usize>,
    /// How the front picks workers: round-robin over each pool, or kv, Dynamo's KV router
    /// (prefill worker by cached prefix and pending prefill, from the prefill workers' KV
    /// events; decode worker by the blocks of its live requests). Needs --prefill-workers.
    #[arg(long, value_name = "POLICY", value_parser = ["round-robin", "kv"], requires = "prefill_workers")]
    pub pd_router: Option<String>,
    /// TLS (vLLM's --ssl-* flags).
    #[command(flatten)]
    pub tls: crate::tls_args::TlsFlags,
}

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
            ("--timing-profile", e.timing_profile.is_some()),
            ("--planner-profile-data", e.planner_profile_data.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    fn launch_config(&self, flag: &str, engine_args: Option<&str>) -> Result<LaunchConfig, UsageError> {
        // The engine flags act as their engine-args keys: laid on before the timing source
        // is read, so a profile or a model sizes the cache with them.
        let mut launch = crate::engine_args::launch_config_with(flag, engine_args, &self.engine, |launch| {
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
            if self.enable_prefix_caching {
                engine.enable_prefix_caching = true;
            }
            if self.no_enable_prefix_caching {
                engine.enable_prefix_caching = false;
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
    fn options(&self) -> Result<(Vec<ServerOptions>, Option<Deployment>), UsageError> {
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

/// Runs the servers until a signal arrives; exit code 1 if one failed after starting.
pub fn run(args: ServeArgs) -> Result<ExitCode, UsageError> {
    let (options, deployment) = args.options()?;
    let mixed = args.worker_engine_args.is_some();
    let grace = options.first().map_or(Duration::ZERO, |o| o.shutdown_grace);
    let front_addr = SocketAddr::new(args.host, args.port);
    let (model_name, max_body_bytes) =
        options.first().map_or((String::new(), 0), |o| (o.model_name.clone(), o.max_body_bytes));
    // The front aborts held prefills with the secret its workers share.
    let front_secret = options.first().and_then(|o| o.pd.as_ref()).and_then(|p| p.secret.clone());
    // The front serves and calls its workers with their TLS.
    let front_tls = options.first().and_then(|o| o.tls.clone());
    let scheme = if front_tls.is_some() { "https" } else { "http" };
    // The front guards its port as the workers guard theirs. Each of its connections can
    // hold one to a worker in this same process, so it takes half the connection limit.
    let front_limits =
        options.first().map(|o| (o.header_timeout, o.body_timeout, (o.max_connections / 2).max(1)));
    let routers = deployment.filter(|d| d.kv_router).zip(options.first()).map(|(d, o)| {
        let engine = &o.launch.engine;
        let config = KvRouterConfig::default();
        let pool = |config: KvRouterConfig, n| {
            Arc::new(Mutex::new(KvRouter::new(config, n, engine.block_size, engine.max_num_batched_tokens)))
        };
        // Each pool's router as the reference derives it for a disaggregated deployment.
        (pool(config.for_prefill_pool(), d.prefill), pool(config.for_decode_pool(), d.decode))
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(async move {
        // Watched before the address is announced: a signal right after it must not kill
        // the process unhandled.
        let mut signals = Signals::new().map_err(|e| UsageError(format!("cannot watch signals: {e}")))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        let mut workers = Vec::new();
        let mut hasher = None;
        for (i, o) in options.into_iter().enumerate() {
            // A KV-routing front indexes its prefill workers' cached blocks from their KV events.
            let ranks = match (&routers, deployment) {
                (Some((prefill, _)), Some(d)) if i < d.prefill => {
                    let router = prefill.clone();
                    let sink: KvEventSink = Box::new(move |events| {
                        router.lock().unwrap_or_else(PoisonError::into_inner).apply_events(i, events)
                    });
                    vec![LiveOptions { kv_events: Some(sink), ..Default::default() }]
                }
                _ => Vec::new(),
            };
            // A mixed fleet's workers each say what they are.
            if i == 0 || mixed {
                let lengths = o.launch.output_length_distribution.unwrap_or(OutputLengthDistribution::CHAT);
                let e = &o.launch.engine;
                eprintln!(
                    "mocker: {}engine {}, {} KV blocks × {} tokens per rank, context {} tokens; chat outputs \
                     without max_tokens: {}",
                    if mixed { format!("worker {i}: ") } else { String::new() },
                    e.backend.as_str(),
                    e.num_gpu_blocks,
                    e.block_size,
                    mocker_server::served_max_model_len(e),
                    lengths.describe()
                );
                if let mocker_core::config::TimingModelConfig::Architecture { label, .. } = &e.timing_model {
                    let h = &o.launch.hardware;
                    eprintln!(
                        "mocker: timing {label} from its architecture; {} ms a pass, {} ms API server a request",
                        h.pass_overhead_ms.unwrap_or(0.0),
                        h.frontend_latency_ms.unwrap_or(0.0)
                    );
                }
            }
            let server = BoundServer::bind(o, ranks).await.map_err(|e| UsageError(e.to_string()))?;
            if i == 0 {
                hasher = Some(server.prompt_hasher());
            }
            let url = format!("{scheme}://{}", server.local_addr());
            match deployment {
                // Scripts and tests read the address from this line (port 0 picks a free one).
                None => eprintln!("mocker: serving model on {url}"),
                Some(d) if i < d.prefill => eprintln!("mocker: prefill worker {i} on {url}"),
                Some(d) => eprintln!("mocker: decode worker {} on {url}", i - d.prefill),
            }
            // The front dials a worker bound to all interfaces on loopback (an address its
            // certificate can name).
            let mut dial = server.local_addr();
            if dial.ip().is_unspecified() {
                dial.set_ip(IpAddr::from([127, 0, 0, 1]));
            }
            workers.push(format!("{scheme}://{dial}"));
            if let Some(at) = server.bootstrap_addr() {
                let tls = if server.is_tls() { " (TLS)" } else { "" };
                eprintln!("mocker: SGLang bootstrap server on {at}{tls}");
            }
            if let Some(at) = server.grpc_addr() {
                // Tests read the gRPC address from this line.
                eprintln!("mocker: gRPC ({}) on {at}", server.grpc_service().unwrap_or("none"));
            }
            for kv in server.kv_events() {
                let replay =
                    kv.replay_endpoint.as_deref().map(|r| format!(" (replay {r})")).unwrap_or_default();
                eprintln!("mocker: dp rank {} publishing KV events on {}{replay}", kv.dp_rank, kv.endpoint);
            }
            let mut stop = stop_rx.clone();
            servers.push(tokio::spawn(server.serve(async move {
                let _ = stop.wait_for(|s| *s).await;
            })));
        }
        if let Some(d) = deployment {
            let decode = workers.split_off(d.prefill);
            let front = BoundFront::bind(FrontOptions {
                addr: front_addr,
                prefill: workers,
                decode,
                max_body_bytes,
                model_name,
                routing: match (routers, hasher) {
                    (Some((prefill, decode)), Some(hasher)) => PdRouting::Kv { prefill, decode, hasher },
                    _ => PdRouting::RoundRobin,
                },
                header_timeout: front_limits.map_or(Duration::from_secs(5), |l| l.0),
                body_timeout: front_limits.map_or(Duration::from_secs(30), |l| l.1),
                max_connections: front_limits.map_or(1, |l| l.2),
                shutdown_grace: grace,
                kv_transfer_secret: front_secret.clone(),
                tls: front_tls.clone(),
            })
            .await
            .map_err(|e| UsageError(e.to_string()))?;
            let workers =
                |n: usize, role: &str| format!("{n} {role} worker{}", if n == 1 { "" } else { "s" });
            eprintln!(
                "mocker: P/D front over {} and {}",
                workers(d.prefill, "prefill"),
                workers(d.decode, "decode")
            );
            eprintln!("mocker: serving model on {scheme}://{}", front.local_addr());
            let mut stop = stop_rx.clone();
            servers.push(tokio::spawn(front.serve(async move {
                let _ = stop.wait_for(|s| *s).await;
            })));
        }
        tokio::spawn(async move {
            signals.next().await;
            eprintln!("mocker: shutting down (a second SIGINT/SIGTERM exits at once)");
            let _ = stop_tx.send(true);
            watchdog(grace + WATCHDOG_MARGIN);
            let signal = signals.next().await;
            eprintln!("mocker: second signal, exiting now");
            std::process::exit(128 + signal);
        });
        let mut failure = None;
        for s in servers {
            match s.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failure = Some(e.to_string()),
                Err(e) => failure = Some(format!("server task failed: {e}")),
            }
        }
        Ok(match failure {
            Some(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
            None => ExitCode::SUCCESS,
        })
    });
    // Connections closed by force may leave tasks behind: never wait on them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

/// How long past the grace period the process may still run before the watchdog ends it.
/// The orderly shutdown is bounded well within it; the watchdog is the backstop for a part
/// that does not stop (a stuck thread), so a stop never hangs.
const WATCHDOG_MARGIN: Duration = Duration::from_secs(2);

fn watchdog(after: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(after);
        eprintln!("error: shutdown did not finish {} s after the signal; exiting", after.as_secs_f64());
        std::process::exit(1);
    });
}

/// SIGINT and SIGTERM, watched for the whole run (once watched, a signal no longer kills
/// the process by itself, so the second one must be handled too).
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Self { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// The next signal's number.
    async fn next(&mut self) -> i32 {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.int.recv() => libc::SIGINT,
                _ = self.term.recv() => libc::SIGTERM,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            2
        }
    }
}
