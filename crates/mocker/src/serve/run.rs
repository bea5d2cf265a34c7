//! Running `mocker serve`: the servers (and the P/D front) started on consecutive ports,
//! then stopped by SIGINT or SIGTERM within the grace period, a watchdog as the backstop.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use mocker_core::output_length::OutputLengthDistribution;
use mocker_live::{KvEventSink, LiveOptions};
use mocker_replay::router::{KvRouter, KvRouterConfig};
use mocker_server::front::{BoundFront, FrontOptions, PdRouting};
use mocker_server::BoundServer;

use super::args::ServeArgs;
use crate::UsageError;

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
                let kv = match e.kv_cache_capacity_bytes.filter(|_| e.has_kv_cache_groups()) {
                    Some(bytes) => format!("KV cache groups sharing {bytes} bytes per rank"),
                    None => format!("{} KV blocks × {} tokens per rank", e.num_gpu_blocks, e.block_size),
                };
                // A state cache takes its blocks from the same pool: say how many a request.
                let kv = match e.state_cache.zip(e.state_blocks()) {
                    Some((s, blocks)) => format!(
                        "{kv}, shared with a recurrent state of {blocks} blocks ({} bytes) a request",
                        s.bytes_per_request
                    ),
                    None => kv,
                };
                eprintln!(
                    "mocker: {}engine {}, {kv}, context {} tokens; chat outputs without max_tokens: {}",
                    if mixed { format!("worker {i}: ") } else { String::new() },
                    e.backend.as_str(),
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
