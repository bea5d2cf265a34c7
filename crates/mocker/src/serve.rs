//! `mocker serve`: flags to engine configuration and server options, one server per worker
//! on consecutive ports, stopped by SIGINT or SIGTERM.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use mocker_core::config::LaunchConfig;
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
    /// Model name clients use and `/v1/models` lists.
    #[arg(long, default_value = "mocker", visible_alias = "served-model-name")]
    pub model_name: String,
    /// Engine configuration as JSON (flat or {"engine": {...}}) or @file; the flags below
    /// override it.
    #[arg(long, visible_alias = "extra-engine-args")]
    pub engine_args: Option<String>,
    /// Engine family (engine-args key `backend`, alias `engine_type`).
    #[arg(long, value_enum)]
    pub engine_type: Option<crate::engine_args::EngineType>,
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
    /// Context window: prompt plus output tokens.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Independent engines in this process, each with its own server.
    #[arg(long, default_value_t = 1)]
    pub num_workers: usize,
    /// Hugging Face `tokenizer.json` (or a folder holding one); a built-in word tokenizer
    /// is used otherwise.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Require `Authorization: Bearer KEY` on /v1 routes.
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
    /// Seconds in-flight streams may run on after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_grace_seconds: f64,
}

impl ServeArgs {
    fn launch_config(&self) -> Result<LaunchConfig, UsageError> {
        let mut launch = crate::engine_args::launch_config(self.engine_args.as_deref(), self.engine_type)?;
        let engine = &mut launch.engine;
        if let Some(v) = self.block_size {
            engine.block_size = v;
        }
        if let Some(v) = self.num_gpu_blocks {
            engine.num_gpu_blocks = v;
        }
        if let Some(v) = self.max_num_seqs {
            engine.max_num_seqs = v;
        }
        if let Some(v) = self.max_num_batched_tokens {
            engine.max_num_batched_tokens = v;
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
        if let Some(v) = self.data_parallel_size {
            launch.dp_size = v;
        }
        launch.validate().map_err(|e| UsageError(e.to_string()))?;
        Ok(launch)
    }

    fn options(&self) -> Result<Vec<ServerOptions>, UsageError> {
        if self.num_workers == 0 {
            return Err(UsageError("--num-workers: must be at least 1, got 0".into()));
        }
        if !(self.shutdown_grace_seconds.is_finite() && self.shutdown_grace_seconds >= 0.0) {
            return Err(UsageError(format!(
                "--shutdown-grace-seconds: must be a non-negative number, got {}",
                self.shutdown_grace_seconds
            )));
        }
        let launch = self.launch_config()?;
        let kv_endpoint = self
            .kv_events_endpoint
            .clone()
            .or_else(|| launch.dynamo.zmq_kv_events_port.map(|p| format!("tcp://{}:{p}", self.host)));
        let replay_endpoint = self
            .kv_events_replay_endpoint
            .clone()
            .or_else(|| launch.dynamo.zmq_replay_port.map(|p| format!("tcp://{}:{p}", self.host)));
        if replay_endpoint.is_some() && kv_endpoint.is_none() {
            return Err(UsageError("--kv-events-replay-endpoint: needs --kv-events-endpoint".into()));
        }
        let tokenizer = match &self.tokenizer {
            Some(path) => Tokenizer::from_path(path).map_err(|e| UsageError(e.to_string()))?,
            None => Tokenizer::Builtin,
        };
        (0..self.num_workers)
            .map(|i| {
                let port = if self.port == 0 {
                    0
                } else {
                    u16::try_from(usize::from(self.port) + i).map_err(|_| {
                        UsageError(format!(
                            "--port: {} + {} workers exceeds 65535",
                            self.port, self.num_workers
                        ))
                    })?
                };
                let mut options = ServerOptions::new(SocketAddr::new(self.host, port), launch.clone());
                options.model_name = self.model_name.clone();
                options.tokenizer = tokenizer.clone();
                options.api_key = self.api_key.clone();
                options.shutdown_grace = Duration::from_secs_f64(self.shutdown_grace_seconds);
                if let Some(endpoint) = &kv_endpoint {
                    let shift = (i * launch.dp_size) as u32;
                    let offset = |flag: &str, e: &str| {
                        mocker_kv_events::offset_endpoint(e, shift)
                            .map_err(|m| UsageError(format!("{flag}: {m}")))
                    };
                    options.kv_events = Some(KvEventsOptions {
                        endpoint: offset("--kv-events-endpoint", endpoint)?,
                        replay_endpoint: replay_endpoint
                            .as_deref()
                            .map(|e| offset("--kv-events-replay-endpoint", e))
                            .transpose()?,
                    });
                }
                Ok(options)
            })
            .collect()
    }
}

/// Runs the servers until a signal arrives; exit code 1 if one failed after starting.
pub fn run(args: ServeArgs) -> Result<ExitCode, UsageError> {
    let options = args.options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut servers = Vec::new();
        for o in options {
            let server = BoundServer::bind(o, Vec::new()).await.map_err(|e| UsageError(e.to_string()))?;
            // Scripts and tests read the address from this line (port 0 picks a free one).
            eprintln!("mocker: serving model on http://{}", server.local_addr());
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
        tokio::spawn(async move {
            shutdown_signal().await;
            eprintln!("mocker: shutting down");
            let _ = stop_tx.send(true);
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
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
