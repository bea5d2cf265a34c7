//! `/metrics`: the Prometheus text exposition (format 0.0.4) vLLM serves, with vLLM's metric
//! names, HELP texts, buckets and labels (or SGLang's names when serving that backend).
//!
//! vLLM's metrics come from the Python `prometheus_client`, whose text format names a
//! counter family after its sample (`# TYPE vllm:prompt_tokens_total counter`) and adds a
//! `<name>_created` gauge per counter and histogram series. The `prometheus` crate writes
//! that format; `prometheus-client` writes OpenMetrics only (`# TYPE vllm:prompt_tokens
//! counter`, which a 0.0.4 parser reads as an empty counter plus an untyped sample).
//!
//! Request latencies and token counts are observed by the request handlers into series
//! resolved once per engine rank (no label lookup per token); engine state (queues, KV
//! usage, preemptions, prefix-cache counters) is read from each rank's metrics watch at
//! scrape time (see [`engine_state`]), so nothing is mirrored.

mod engine_state;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mocker_core::metrics::{EngineMetrics, ForwardPassMetrics};
use mocker_live::{FpmSink, LiveEngine};
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
};
use tokio::sync::watch;

use engine_state::EngineState;

/// The content type vLLM's `/metrics` answers with.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which engine family's metric names to expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricFlavor {
    /// `vllm:*` names (vLLM and TRT-LLM backends).
    Vllm,
    /// `sglang:*` names.
    Sglang,
}

/// What a registry is built for.
#[derive(Debug, Clone)]
pub struct MetricsOptions {
    /// Names to expose.
    pub flavor: MetricFlavor,
    /// The `model_name` label.
    pub model_name: String,
    /// The `engine` label of each rank, in rank order (DP ranks).
    pub dp_ranks: Vec<u32>,
    /// Tokens per KV block (`vllm:cache_config_info`).
    pub block_size: usize,
    /// Longest sequence the engine accepts: the top of vLLM's 1-2-5 token-count buckets.
    pub max_model_len: usize,
    /// Most LoRA adapters per batch (`vllm:lora_requests_info`'s `max_lora`; 0 without LoRA).
    pub max_loras: usize,
    /// With KV cache groups: their names (the `group` label of mocker's per-group gauges)
    /// and the byte budget they share.
    pub kv_cache_groups: Vec<String>,
    /// See `kv_cache_groups`.
    pub kv_cache_capacity_bytes: u64,
}

/// Why a request stopped (vLLM's `finished_reason` label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or stop condition.
    Stop = 0,
    /// `max_tokens` (or the context) reached.
    Length = 1,
    /// Cancelled before its end (client gone, stream shed, server stopping).
    Abort = 2,
}

const FINISH_REASONS: [&str; 3] = ["stop", "length", "abort"];

/// What one finished request reports, on the engine's simulated clock where vLLM measures
/// in its engine core (queue, prefill, decode, inference) and on the server's clock where
/// vLLM measures in its API server (end-to-end).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishedRequest {
    /// Rank position in [`MetricsOptions::dp_ranks`].
    pub rank: usize,
    /// Arrival at the server to the last token.
    pub e2e: Duration,
    /// Submission to the engine to the start of the pass that first scheduled it.
    pub queue: Duration,
    /// That pass's start to the first token.
    pub prefill: Duration,
    /// First token to last token.
    pub decode: Duration,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Output tokens generated.
    pub generated: usize,
    /// The request's `max_tokens` (after defaults).
    pub max_tokens: usize,
    /// The request's `n`.
    pub n: usize,
    /// Why it ended.
    pub reason: FinishReason,
}

/// vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `max`.
fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    'outer: loop {
        for m in [1, 2, 5] {
            let v = m * scale;
            if v > max {
                break 'outer;
            }
            out.push(v as f64);
        }
        scale = match scale.checked_mul(10) {
            Some(s) => s,
            None => break,
        };
    }
    out
}

const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's request-latency buckets (end-to-end and the queue/prefill/decode/inference phases).
const LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];
/// vLLM's `iteration_tokens_total` buckets when no CUDA graph sizes apply (eager mode).
const ITERATION_BUCKETS: [f64; 13] =
    [1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
const N_BUCKETS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];

/// Per-request histograms vLLM has and SGLang does not.
#[derive(Debug)]
struct VllmOnly {
    itl_deprecated: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    inference: Histogram,
    prompt_len: Histogram,
    generation_len: Histogram,
    params_n: Histogram,
    params_max_tokens: Histogram,
}

/// The [`VllmOnly`] families, handed out one rank at a time.
struct VllmFamilies {
    itl_deprecated: std::vec::IntoIter<Histogram>,
    queue: std::vec::IntoIter<Histogram>,
    prefill: std::vec::IntoIter<Histogram>,
    decode: std::vec::IntoIter<Histogram>,
    inference: std::vec::IntoIter<Histogram>,
    prompt_len: std::vec::IntoIter<Histogram>,
    generation_len: std::vec::IntoIter<Histogram>,
    params_n: std::vec::IntoIter<Histogram>,
    params_max_tokens: std::vec::IntoIter<Histogram>,
}

impl VllmFamilies {
    fn register(f: &Families) -> Self {
        let max_len = buckets_1_2_5(f.options.max_model_len);
        let h = |name: &str, help: &str, buckets: &[f64]| f.histogram(name, help, buckets).into_iter();
        Self {
            // The name vLLM used for the inter-token latency before 0.11, still exposed.
            itl_deprecated: h(
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.DEPRECATED: Use vllm:inter_token_latency_seconds \
                 instead.",
                &ITL_BUCKETS,
            ),
            queue: h(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                &LATENCY_BUCKETS,
            ),
            inference: h(
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                &LATENCY_BUCKETS,
            ),
            prefill: h(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                &LATENCY_BUCKETS,
            ),
            decode: h(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                &LATENCY_BUCKETS,
            ),
            prompt_len: h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", &max_len),
            generation_len: h("vllm:request_generation_tokens", "Number of generation tokens processed.", &max_len),
            params_n: h("vllm:request_params_n", "Histogram of the n request parameter.", &N_BUCKETS),
            params_max_tokens: h(
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                &max_len,
            ),
        }
    }

    fn next(&mut self) -> VllmOnly {
        let one = "one series per rank";
        VllmOnly {
            itl_deprecated: self.itl_deprecated.next().expect(one),
            queue: self.queue.next().expect(one),
            prefill: self.prefill.next().expect(one),
            decode: self.decode.next().expect(one),
            inference: self.inference.next().expect(one),
            prompt_len: self.prompt_len.next().expect(one),
            generation_len: self.generation_len.next().expect(one),
            params_n: self.params_n.next().expect(one),
            params_max_tokens: self.params_max_tokens.next().expect(one),
        }
    }
}

/// One rank's request-side series.
#[derive(Debug)]
struct RankSeries {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    tpot: Histogram,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    finished: Vec<IntCounter>,
    vllm: Option<VllmOnly>,
}

/// The server's metrics registry and the series handlers observe into.
#[derive(Debug)]
pub struct ServerMetrics {
    registry: Registry,
    options: MetricsOptions,
    ranks: Vec<RankSeries>,
    /// `vllm:iteration_tokens_total` per rank, fed by the engine's forward passes.
    iteration: Vec<Histogram>,
    created: f64,
}

/// Registers families labelled `model_name`, `engine` (plus extras) with their `_created`
/// twins, as `prometheus_client` exposes them.
struct Families<'a> {
    registry: &'a Registry,
    options: &'a MetricsOptions,
    created: f64,
}

const LABELS: [&str; 2] = ["model_name", "engine"];

impl Families<'_> {
    fn register(&self, collector: impl prometheus::core::Collector + 'static) {
        self.registry.register(Box::new(collector)).expect("metric names are unique and valid");
    }

    fn rank_labels(&self) -> impl Iterator<Item = [String; 2]> + '_ {
        self.options.dp_ranks.iter().map(|r| [self.options.model_name.clone(), r.to_string()])
    }

    /// `<base>_created` for each series, labelled as the series.
    fn created(&self, base: &str, help: &str, label_names: &[&str], series: &[Vec<String>]) {
        let gauges = GaugeVec::new(Opts::new(format!("{base}_created"), help), label_names).expect("valid");
        for labels in series {
            let values: Vec<&str> = labels.iter().map(String::as_str).collect();
            gauges.with_label_values(&values).set(self.created);
        }
        self.register(gauges);
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Vec<Histogram> {
        let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
        let family = HistogramVec::new(opts, &LABELS).expect("valid histogram");
        let series: Vec<Histogram> =
            self.rank_labels().map(|[m, e]| family.with_label_values(&[m.as_str(), e.as_str()])).collect();
        self.register(family);
        let labels: Vec<Vec<String>> = self.rank_labels().map(Vec::from).collect();
        self.created(name, help, &LABELS, &labels);
        series
    }

    /// A counter `<base>_total` per rank (and per value of `extra`, when given).
    fn counter(&self, base: &str, help: &str, extra: Option<(&str, &[&str])>) -> Vec<Vec<IntCounter>> {
        let mut names = LABELS.to_vec();
        let values: &[&str] = match extra {
            Some((label, values)) => {
                names.push(label);
                values
            }
            None => &[""],
        };
        let family = IntCounterVec::new(Opts::new(format!("{base}_total"), help), &names).expect("valid");
        let mut all_labels = Vec::new();
        let series = self
            .rank_labels()
            .map(|[m, e]| {
                values
                    .iter()
                    .map(|v| {
                        let mut labels = vec![m.clone(), e.clone()];
                        if extra.is_some() {
                            labels.push(v.to_string());
                        }
                        let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
                        let counter = family.with_label_values(&refs);
                        all_labels.push(labels);
                        counter
                    })
                    .collect()
            })
            .collect();
        self.register(family);
        self.created(base, help, &names, &all_labels);
        series
    }
}

/// Seconds since the Unix epoch, as `_created` samples carry them.
fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl ServerMetrics {
    /// A registry with every request-side series created (at zero, as vLLM creates them at
    /// startup); engine state joins with [`Self::attach_engines`].
    pub fn new(options: MetricsOptions) -> Self {
        let registry = Registry::new();
        let created = unix_now();
        let f = Families { registry: &registry, options: &options, created };
        let vllm = options.flavor == MetricFlavor::Vllm;
        let (p, names) = match options.flavor {
            MetricFlavor::Vllm => ("vllm", VLLM_NAMES),
            MetricFlavor::Sglang => ("sglang", SGLANG_NAMES),
        };
        let name = |n: &str| format!("{p}:{n}");
        let mut ttft = f
            .histogram(&name(names.ttft), "Histogram of time to first token in seconds.", &TTFT_BUCKETS)
            .into_iter();
        let mut itl = f
            .histogram(&name(names.itl), "Histogram of inter-token latency in seconds.", &ITL_BUCKETS)
            .into_iter();
        let mut e2e = f
            .histogram(&name(names.e2e), "Histogram of e2e request latency in seconds.", &LATENCY_BUCKETS)
            .into_iter();
        let tpot_help = if vllm {
            "Histogram of time_per_output_token_seconds per request."
        } else {
            "Histogram of time per output token in seconds."
        };
        let mut tpot = f.histogram(&name(names.tpot), tpot_help, &ITL_BUCKETS).into_iter();
        let mut prompt_tokens =
            f.counter(&name(names.prompt_tokens), "Number of prefill tokens processed.", None).into_iter();
        let mut generation_tokens = f
            .counter(&name(names.generation_tokens), "Number of generation tokens processed.", None)
            .into_iter();
        let mut finished = f
            .counter(
                &name(names.success),
                "Count of successfully processed requests.",
                Some(("finished_reason", &FINISH_REASONS)),
            )
            .into_iter();
        let mut vllm_only = if vllm { Some(VllmFamilies::register(&f)) } else { None };
        let iteration = if vllm {
            f.histogram(
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                &ITERATION_BUCKETS,
            )
        } else {
            Vec::new()
        };
        let one = "one series per rank";
        let ranks = options
            .dp_ranks
            .iter()
            .map(|_| RankSeries {
                ttft: ttft.next().expect(one),
                itl: itl.next().expect(one),
                e2e: e2e.next().expect(one),
                tpot: tpot.next().expect(one),
                prompt_tokens: prompt_tokens.next().expect(one).remove(0),
                generation_tokens: generation_tokens.next().expect(one).remove(0),
                finished: finished.next().expect(one),
                vllm: vllm_only.as_mut().map(VllmFamilies::next),
            })
            .collect();
        Self { registry, options, ranks, iteration, created }
    }

    /// A forward-pass sink feeding rank `rank`'s `vllm:iteration_tokens_total`, chained
    /// before `next`; `next` alone for SGLang. A step's tokens are those it computed: prompt
    /// chunk tokens plus one per decoding request (vLLM counts a prompt's full length, cached
    /// part included, in the step that finishes its prefill; mocker's passes report chunks).
    pub fn iteration_sink(&self, rank: usize, next: Option<FpmSink>) -> Option<FpmSink> {
        let Some(histogram) = self.iteration.get(rank).cloned() else { return next };
        let mut next = next;
        Some(Box::new(move |m: &ForwardPassMetrics| {
            let tokens = m.sum_prefill_tokens + m.num_decode_requests;
            // Idle ranks of a DP group publish empty passes; vLLM records steps that ran.
            if tokens > 0 {
                histogram.observe(tokens as f64);
            }
            if let Some(next) = next.as_mut() {
                next(m);
            }
        }))
    }

    /// Registers a collector of another module (exposed with the rest).
    pub fn register_collector(&self, collector: Box<dyn prometheus::core::Collector>) {
        self.registry.register(collector).expect("metric names are unique and valid");
    }

    /// Adds the engine state read at scrape time from each rank's watch (`ranks`), and the
    /// stream-overflow cancellations of `engines` (the same ranks, when live).
    pub fn attach_engines(&self, ranks: Vec<watch::Receiver<EngineMetrics>>, engines: Vec<LiveEngine>) {
        let state = EngineState {
            flavor: self.options.flavor,
            model_name: self.options.model_name.clone(),
            block_size: self.options.block_size,
            max_loras: self.options.max_loras,
            kv_cache_groups: self.options.kv_cache_groups.clone(),
            kv_cache_capacity_bytes: self.options.kv_cache_capacity_bytes,
            created: self.created,
            ranks,
            engines,
        };
        self.registry.register(Box::new(state)).expect("engine-state families are registered once");
    }

    /// Records a request's first token, `ttft` after its arrival at the server.
    pub fn observe_first_token(&self, rank: usize, ttft: Duration, prompt_tokens: usize) {
        let r = &self.ranks[rank];
        r.ttft.observe(ttft.as_secs_f64());
        r.prompt_tokens.inc_by(prompt_tokens as u64);
    }

    /// Records one generated token; `gap` is the time since the previous one (none for the
    /// first).
    pub fn observe_token(&self, rank: usize, gap: Option<Duration>) {
        let r = &self.ranks[rank];
        r.generation_tokens.inc();
        if let Some(gap) = gap {
            let gap = gap.as_secs_f64();
            r.itl.observe(gap);
            if let Some(v) = &r.vllm {
                v.itl_deprecated.observe(gap);
            }
        }
    }

    /// Records a request that ended before its last token.
    pub fn observe_aborted(&self, rank: usize) {
        self.ranks[rank].finished[FinishReason::Abort as usize].inc();
    }

    /// Records a finished request.
    pub fn observe_finished(&self, f: &FinishedRequest) {
        let r = &self.ranks[f.rank];
        r.e2e.observe(f.e2e.as_secs_f64());
        // vLLM: decode time over the tokens after the first, 0 for a single token.
        let tpot = if f.generated > 1 { f.decode.as_secs_f64() / (f.generated - 1) as f64 } else { 0.0 };
        r.tpot.observe(tpot);
        r.finished[f.reason as usize].inc();
        if let Some(v) = &r.vllm {
            v.queue.observe(f.queue.as_secs_f64());
            v.prefill.observe(f.prefill.as_secs_f64());
            v.decode.observe(f.decode.as_secs_f64());
            v.inference.observe((f.prefill + f.decode).as_secs_f64());
            v.prompt_len.observe(f.prompt_tokens as f64);
            v.generation_len.observe(f.generated as f64);
            v.params_n.observe(f.n as f64);
            v.params_max_tokens.observe(f.max_tokens as f64);
        }
    }

    /// The DP ranks the series are labelled with (`engine`).
    pub fn dp_ranks(&self) -> &[u32] {
        &self.options.dp_ranks
    }

    /// When the families were created (Unix seconds; their `_created` twins' value).
    pub fn created(&self) -> f64 {
        self.created
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("the families are well formed");
        String::from_utf8(out).expect("the text encoder writes UTF-8")
    }
}

/// Request-side family names per flavor (counters without `_total`).
struct Names {
    ttft: &'static str,
    itl: &'static str,
    e2e: &'static str,
    tpot: &'static str,
    prompt_tokens: &'static str,
    generation_tokens: &'static str,
    success: &'static str,
}

const VLLM_NAMES: Names = Names {
    ttft: "time_to_first_token_seconds",
    itl: "inter_token_latency_seconds",
    e2e: "e2e_request_latency_seconds",
    tpot: "request_time_per_output_token_seconds",
    prompt_tokens: "prompt_tokens",
    generation_tokens: "generation_tokens",
    success: "request_success",
};

const SGLANG_NAMES: Names = Names {
    ttft: "time_to_first_token_seconds",
    itl: "inter_token_latency_seconds",
    e2e: "e2e_request_latency_seconds",
    tpot: "time_per_output_token_seconds",
    prompt_tokens: "prompt_tokens",
    generation_tokens: "generation_tokens",
    success: "num_requests",
};

#[cfg(test)]
mod tests;
