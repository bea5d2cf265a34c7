//! `cargo bench -p mocker-server --bench serve`: the server's two benchmark figures.
//!
//! * **timing**: one stream at speedup 1 on an idle engine; how late each token reaches an
//!   HTTP client compared with its modelled pass end (goal: within 2 ms).
//! * **load**: C concurrent streams of T tokens at a very high speedup, so the engine costs
//!   nothing in modelled time and the server's own work is the limit; tokens per second
//!   compared, in the same run, with a bare axum SSE server streaming the same number of
//!   frames of the same size (the machine's physical limit). Goal: ≥ 70% of it, no errors.
//!
//! Options (env): MOCKER_BENCH_STREAMS (default 2000), MOCKER_BENCH_TOKENS (default 100),
//! MOCKER_BENCH_TOKENIZER (absolute path of a tokenizer.json or its directory, e.g.
//! $PWD/tests/fixtures/tokenizers/qwen3, for the load part; default the built-in one), so a
//! profile of the load part shows what a real tokenizer costs per streamed token.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use mocker_core::config::LaunchConfig;
use mocker_core::{Engine, EngineOptions, Request};
use mocker_server::{BoundServer, ServerOptions, Tokenizer};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn start_mocker(config: &str, tokenizer: Option<&str>) -> SocketAddr {
    let launch = LaunchConfig::from_json_str(config).expect("bench config");
    let mut options = ServerOptions::new("127.0.0.1:0".parse().unwrap(), launch);
    if let Some(path) = tokenizer {
        options.tokenizer =
            Tokenizer::from_path(std::path::Path::new(path)).expect("MOCKER_BENCH_TOKENIZER loads");
    }
    let server = BoundServer::bind(options, Vec::new()).await.expect("server binds");
    let addr = server.local_addr();
    tokio::spawn(server.serve(std::future::pending()));
    addr
}

/// A server that streams `tokens` SSE frames as fast as the socket takes them.
async fn start_bare(tokens: usize) -> SocketAddr {
    let frame = Bytes::from(format!(
        "data: {}\n\n",
        r#"{"id":"cmpl-0123456789abcdef0123456789abcdef","object":"text_completion","created":1764700000,"model":"mocker","choices":[{"index":0,"text":" t12345","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#
    ));
    let app = Router::new().route(
        "/v1/completions",
        post(move || {
            let frame = frame.clone();
            async move {
                let frames =
                    futures_util::stream::iter(0..tokens).map(move |_| Ok::<_, Infallible>(frame.clone()));
                let done = futures_util::stream::once(async { Ok(Bytes::from_static(b"data: [DONE]\n\n")) });
                Body::from_stream(frames.chain(done))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Runs `streams` concurrent streamed completions; returns (frames received, errors, wall).
async fn load(addr: SocketAddr, streams: usize, tokens: usize) -> (usize, usize, Duration) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(streams).build().unwrap();
    let url = format!("http://{addr}/v1/completions");
    let body =
        serde_json::json!({"prompt": (1..=16).collect::<Vec<u32>>(), "max_tokens": tokens, "stream": true});
    let start = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let Ok(resp) = client.post(&url).json(&body).send().await else { return (0, 1) };
                if !resp.status().is_success() {
                    return (0, 1);
                }
                let mut stream = resp.bytes_stream();
                let (mut frames, mut done) = (0, false);
                let mut tail = Vec::new();
                while let Some(chunk) = stream.next().await {
                    let Ok(chunk) = chunk else { return (frames, 1) };
                    tail.extend_from_slice(&chunk);
                    frames += count(&tail, b"data: {");
                    done |= count(&tail, b"[DONE]") > 0;
                    // Keep less than a whole needle, so no frame is counted twice, but
                    // enough for one split across two chunks.
                    let keep = tail.len().saturating_sub(b"data: {".len() - 1);
                    tail.drain(..keep);
                }
                (frames, usize::from(!done || frames != tokens))
            })
        })
        .collect();
    let (mut frames, mut errors) = (0, 0);
    for t in tasks {
        let (f, e) = t.await.unwrap_or((0, 1));
        frames += f;
        errors += e;
    }
    (frames, errors, start.elapsed())
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// Modelled pass ends (ms after submission) of one request alone on the default engine.
fn modelled_ms(prompt: usize, tokens: usize) -> Vec<f64> {
    let config = LaunchConfig::from_json_str("").unwrap().engine;
    let mut engine = Engine::new(EngineOptions { config, ..Default::default() }).unwrap();
    engine
        .submit(Request { uuid: 7, tokens: vec![5; prompt], max_output_tokens: tokens, ..Default::default() })
        .unwrap();
    let (mut now, mut out) = (0, Vec::new());
    while engine.has_work() {
        let pass = engine.step(now);
        now = pass.end_ns;
        out.extend(pass.all_outputs().filter(|o| o.has_token()).map(|_| now as f64 / 1e6));
    }
    out
}

async fn timing() {
    let (prompt, tokens) = (2048, 64);
    let addr = start_mocker("", None).await;
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/v1/completions");
    // Warm the connection with a prompt that shares no block with the measured one.
    let warm = serde_json::json!({"prompt": [9, 9, 9], "max_tokens": 2, "stream": true});
    client.post(&url).json(&warm).send().await.unwrap().bytes().await.unwrap();
    let body = serde_json::to_vec(
        &serde_json::json!({"prompt": vec![5; prompt], "max_tokens": tokens, "stream": true}),
    )
    .unwrap();
    let start = Instant::now();
    let resp = client.post(&url).header("content-type", "application/json").body(body).send().await.unwrap();
    let mut stream = resp.bytes_stream();
    let mut arrivals = Vec::new();
    while let Some(chunk) = stream.next().await {
        let at = start.elapsed().as_secs_f64() * 1e3;
        let n = count(&chunk.unwrap(), b"data: {");
        arrivals.extend(std::iter::repeat_n(at, n));
    }
    let modelled = modelled_ms(prompt, tokens);
    let mut late: Vec<f64> = arrivals.iter().zip(&modelled).map(|(a, m)| a - m).collect();
    late.sort_by(f64::total_cmp);
    let pick = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize];
    println!(
        "timing: {} tokens, lateness vs modelled pass ends: min {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (goal: within 2 ms)",
        late.len(),
        late[0],
        pick(0.5),
        pick(0.99),
        late[late.len() - 1]
    );
}

async fn load_vs_bare() {
    let streams = env_usize("MOCKER_BENCH_STREAMS", 2000);
    let tokens = env_usize("MOCKER_BENCH_TOKENS", 100);
    let config = format!(
        r#"{{"max_num_seqs": {streams}, "max_num_batched_tokens": {}, "num_gpu_blocks": {}, "speedup_ratio": 1000000}}"#,
        streams * 16 + 1024,
        streams * 4 + 64
    );
    let bare = start_bare(tokens).await;
    let tokenizer = std::env::var("MOCKER_BENCH_TOKENIZER").ok();
    let mocker = start_mocker(&config, tokenizer.as_deref()).await;
    let (bf, be, bt) = load(bare, streams, tokens).await;
    let (mf, me, mt) = load(mocker, streams, tokens).await;
    let b_rate = bf as f64 / bt.as_secs_f64();
    let m_rate = mf as f64 / mt.as_secs_f64();
    let with = tokenizer.as_deref().unwrap_or("the built-in tokenizer");
    println!("load: {streams} concurrent streams x {tokens} tokens, {with}");
    println!("  bare axum SSE: {bf} frames in {:.2} s = {b_rate:.0} tokens/s, {be} errors", bt.as_secs_f64());
    println!("  mocker serve:  {mf} frames in {:.2} s = {m_rate:.0} tokens/s, {me} errors", mt.as_secs_f64());
    println!("  ratio mocker/bare: {:.2} (goal >= 0.70)", m_rate / b_rate);
}

fn main() {
    // `cargo bench` passes --bench; a filter argument selects one part.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        if filter.as_deref().is_none_or(|f| "timing".contains(f)) {
            timing().await;
        }
        if filter.as_deref().is_none_or(|f| "load".contains(f)) {
            load_vs_bare().await;
        }
    });
}
