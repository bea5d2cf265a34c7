//! The flags of `mocker serve`, named as vLLM's `vllm serve` names them.

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::Args;

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
