//! `/metrics`: Prometheus text with vLLM's metric names (or SGLang's when serving that
//! backend). Engine state (queues, KV usage, preemptions, prefix-cache counters) is read
//! from each rank's metrics watch at scrape time, so nothing is mirrored; request latencies
//! and token counters are observed by the request handlers.

use std::sync::OnceLock;
use std::time::Duration;

use mocker_core::metrics::EngineMetrics;
use mocker_live::LiveEngine;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// Which engine family's metric names to expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricFlavor {
    /// `vllm:*` names (vLLM and TRT-LLM backends).
    Vllm,
    /// `sglang:*` names.
    Sglang,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model_name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineLabels {
    model_name: String,
    engine: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FinishedLabels {
    model_name: String,
    finished_reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheConfigLabels {
    model_name: String,
    block_size: String,
    num_gpu_blocks: String,
}

const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: [f64; 18] =
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 80.0];
const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
];

/// The server's metrics registry and the handles handlers observe into.
#[derive(Debug)]
pub struct ServerMetrics {
    registry: Registry,
    label: ModelLabel,
    ttft: Histograms,
    itl: Histograms,
    e2e: Histograms,
    tpot: Histograms,
    prompt_tokens: Family<ModelLabel, Counter>,
    generation_tokens: Family<ModelLabel, Counter>,
    success: Family<FinishedLabels, Counter>,
    /// The series every request observes into, resolved once: a family lookup hashes the
    /// label and takes the family's lock, which per token is most of the cost.
    hot: HotSeries,
    finished_label: FinishedLabels,
}

/// Each series is created on its first observation, as the family would create it, so the
/// exposition does not change.
#[derive(Debug, Default)]
struct HotSeries {
    ttft: OnceLock<Histogram>,
    itl: OnceLock<Histogram>,
    e2e: OnceLock<Histogram>,
    tpot: OnceLock<Histogram>,
    prompt_tokens: OnceLock<Counter>,
    generation_tokens: OnceLock<Counter>,
    success: OnceLock<Counter>,
}

fn series<'a, L, M, C>(cell: &'a OnceLock<M>, family: &Family<L, M, C>, label: &L) -> &'a M
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: prometheus_client::metrics::family::MetricConstructor<M>,
{
    cell.get_or_init(|| family.get_or_create(label).clone())
}

type Histograms = Family<ModelLabel, Histogram, fn() -> Histogram>;

fn histograms(constructor: fn() -> Histogram) -> Histograms {
    Family::new_with_constructor(constructor)
}

impl ServerMetrics {
    /// A registry for `model_name` over the ranks whose metrics the watches carry;
    /// `engines` (the same ranks, when live) add their stream-overflow cancellations.
    pub fn new(
        flavor: MetricFlavor,
        model_name: &str,
        block_size: usize,
        ranks: Vec<watch::Receiver<EngineMetrics>>,
        engines: Vec<LiveEngine>,
    ) -> Self {
        let mut registry = Registry::default();
        let label = ModelLabel { model_name: model_name.to_string() };
        let ttft = histograms(|| Histogram::new(TTFT_BUCKETS));
        let itl = histograms(|| Histogram::new(ITL_BUCKETS));
        let e2e = histograms(|| Histogram::new(E2E_BUCKETS));
        let tpot = histograms(|| Histogram::new(ITL_BUCKETS));
        let prompt_tokens: Family<ModelLabel, Counter> = Family::default();
        let generation_tokens: Family<ModelLabel, Counter> = Family::default();
        let success: Family<FinishedLabels, Counter> = Family::default();
        let finished_label =
            FinishedLabels { model_name: model_name.to_string(), finished_reason: "length".to_string() };
        let this = Self {
            ttft,
            itl,
            e2e,
            tpot,
            prompt_tokens,
            generation_tokens,
            success,
            hot: HotSeries::default(),
            label,
            finished_label,
            registry: Registry::default(),
        };
        let names = Names::of(flavor);
        registry.register(names.ttft, "Histogram of time to first token in seconds.", this.ttft.clone());
        registry.register(names.itl, "Histogram of inter-token latency in seconds.", this.itl.clone());
        registry.register(names.e2e, "Histogram of end to end request latency in seconds.", this.e2e.clone());
        registry.register(names.tpot, "Histogram of time per output token in seconds.", this.tpot.clone());
        registry.register(
            names.prompt_tokens,
            "Number of prefill tokens processed.",
            this.prompt_tokens.clone(),
        );
        registry.register(
            names.generation_tokens,
            "Number of generation tokens processed.",
            this.generation_tokens.clone(),
        );
        registry.register(names.success, "Count of successfully processed requests.", this.success.clone());
        registry.register_collector(Box::new(EngineCollector {
            flavor,
            model_name: model_name.to_string(),
            block_size,
            ranks,
            engines,
        }));
        Self { registry, ..this }
    }

    /// Records a request's first token `ttft` after its arrival.
    pub fn observe_first_token(&self, ttft: Duration, prompt_tokens: usize) {
        series(&self.hot.ttft, &self.ttft, &self.label).observe(ttft.as_secs_f64());
        series(&self.hot.prompt_tokens, &self.prompt_tokens, &self.label).inc_by(prompt_tokens as u64);
    }

    /// Records the gap between two tokens of a stream.
    pub fn observe_inter_token(&self, gap: Duration) {
        series(&self.hot.itl, &self.itl, &self.label).observe(gap.as_secs_f64());
    }

    /// Records a finished request.
    pub fn observe_finished(&self, e2e: Duration, ttft: Duration, generated: usize) {
        series(&self.hot.e2e, &self.e2e, &self.label).observe(e2e.as_secs_f64());
        if generated > 1 {
            let tpot = (e2e.saturating_sub(ttft)).as_secs_f64() / (generated - 1) as f64;
            series(&self.hot.tpot, &self.tpot, &self.label).observe(tpot);
        }
        series(&self.hot.generation_tokens, &self.generation_tokens, &self.label).inc_by(generated as u64);
        series(&self.hot.success, &self.success, &self.finished_label).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Metric names per flavor. Counters are registered without `_total`: the encoder adds it.
struct Names {
    ttft: &'static str,
    itl: &'static str,
    e2e: &'static str,
    tpot: &'static str,
    prompt_tokens: &'static str,
    generation_tokens: &'static str,
    success: &'static str,
}

impl Names {
    fn of(flavor: MetricFlavor) -> Self {
        match flavor {
            MetricFlavor::Vllm => Self {
                ttft: "vllm:time_to_first_token_seconds",
                itl: "vllm:inter_token_latency_seconds",
                e2e: "vllm:e2e_request_latency_seconds",
                tpot: "vllm:request_time_per_output_token_seconds",
                prompt_tokens: "vllm:prompt_tokens",
                generation_tokens: "vllm:generation_tokens",
                success: "vllm:request_success",
            },
            MetricFlavor::Sglang => Self {
                ttft: "sglang:time_to_first_token_seconds",
                itl: "sglang:inter_token_latency_seconds",
                e2e: "sglang:e2e_request_latency_seconds",
                tpot: "sglang:time_per_output_token_seconds",
                prompt_tokens: "sglang:prompt_tokens",
                generation_tokens: "sglang:generation_tokens",
                success: "sglang:num_requests",
            },
        }
    }
}

/// Reads every rank's watch at scrape time.
#[derive(Debug)]
struct EngineCollector {
    flavor: MetricFlavor,
    model_name: String,
    block_size: usize,
    ranks: Vec<watch::Receiver<EngineMetrics>>,
    engines: Vec<LiveEngine>,
}

impl EngineCollector {
    fn snapshot(&self) -> Vec<EngineMetrics> {
        self.ranks.iter().map(|r| *r.borrow()).collect()
    }

    fn labels(&self, m: &EngineMetrics) -> EngineLabels {
        EngineLabels { model_name: self.model_name.clone(), engine: m.dp_rank.to_string() }
    }

    fn gauge<N: prometheus_client::encoding::EncodeGaugeValue + Copy>(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        ranks: &[EngineMetrics],
        value: impl Fn(&EngineMetrics) -> N,
    ) -> Result<(), std::fmt::Error>
    where
        ConstGauge<N>: EncodeMetric,
    {
        let mut metric =
            encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
        for m in ranks {
            let labels = self.labels(m);
            ConstGauge::new(value(m)).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn counter(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        ranks: &[EngineMetrics],
        value: impl Fn(&EngineMetrics) -> u64,
    ) -> Result<(), std::fmt::Error> {
        let mut metric =
            encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
        for m in ranks {
            let labels = self.labels(m);
            ConstCounter::new(value(m)).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let ranks = self.snapshot();
        let e = &mut encoder;
        // mocker's own: no engine has it, so it keeps the `mocker:` prefix in both flavors.
        {
            let mut shed = e.encode_descriptor(
                "mocker:stream_overflow_cancellations",
                "Requests cancelled because their client read the stream too slowly and its output \
             buffer (--stream-buffer-tokens) overflowed.",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for engine in &self.engines {
                let labels = EngineLabels {
                    model_name: self.model_name.clone(),
                    engine: engine.dp_rank().to_string(),
                };
                ConstCounter::new(engine.overflow_cancellations()).encode(shed.encode_family(&labels)?)?;
            }
        }
        match self.flavor {
            MetricFlavor::Vllm => {
                self.gauge(
                    e,
                    "vllm:num_requests_running",
                    "Number of requests in model execution batches.",
                    &ranks,
                    |m| m.running_requests as i64,
                )?;
                self.gauge(
                    e,
                    "vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.",
                    &ranks,
                    |m| m.waiting_requests as i64,
                )?;
                self.gauge(
                    e,
                    "vllm:kv_cache_usage_perc",
                    "KV-cache usage. 1 means 100 percent usage.",
                    &ranks,
                    |m| m.gpu_cache_usage_perc,
                )?;
                self.gauge(
                    e,
                    "vllm:gpu_cache_usage_perc",
                    "GPU KV-cache usage. 1 means 100 percent usage.",
                    &ranks,
                    |m| m.gpu_cache_usage_perc,
                )?;
                self.counter(e, "vllm:num_preemptions", "Cumulative number of preemptions.", &ranks, |m| {
                    m.num_preemptions_total
                })?;
                self.counter(
                    e,
                    "vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    &ranks,
                    |m| m.prefix_cache_queries_total,
                )?;
                self.counter(
                    e,
                    "vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    &ranks,
                    |m| m.prefix_cache_hits_total,
                )?;
                let mut info = e.encode_descriptor(
                    "vllm:cache_config_info",
                    "Information of the LLMEngine CacheConfig.",
                    None,
                    prometheus_client::metrics::MetricType::Gauge,
                )?;
                if let Some(m) = ranks.first() {
                    let labels = CacheConfigLabels {
                        model_name: self.model_name.clone(),
                        block_size: self.block_size.to_string(),
                        num_gpu_blocks: m.total_blocks.to_string(),
                    };
                    ConstGauge::new(1i64).encode(info.encode_family(&labels)?)?;
                }
            }
            MetricFlavor::Sglang => {
                self.gauge(e, "sglang:num_running_reqs", "The number of running requests.", &ranks, |m| {
                    m.running_requests as i64
                })?;
                self.gauge(
                    e,
                    "sglang:num_queue_reqs",
                    "The number of requests in the waiting queue.",
                    &ranks,
                    |m| m.waiting_requests as i64,
                )?;
                self.gauge(e, "sglang:token_usage", "The token usage.", &ranks, |m| m.gpu_cache_usage_perc)?;
                self.gauge(e, "sglang:cache_hit_rate", "The prefix cache hit rate.", &ranks, |m| {
                    if m.prefix_cache_queries_total == 0 {
                        0.0
                    } else {
                        m.prefix_cache_hits_total as f64 / m.prefix_cache_queries_total as f64
                    }
                })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_vllm_names_with_engine_state_read_at_scrape_time() {
        let (tx, rx) = watch::channel(EngineMetrics { total_blocks: 100, ..Default::default() });
        let metrics = ServerMetrics::new(MetricFlavor::Vllm, "mocker", 64, vec![rx], Vec::new());
        metrics.observe_first_token(Duration::from_millis(30), 12);
        metrics.observe_finished(Duration::from_millis(90), Duration::from_millis(30), 4);
        tx.send_modify(|m| {
            m.running_requests = 3;
            m.gpu_cache_usage_perc = 0.25;
            m.prefix_cache_hits_total = 64;
        });
        let text = metrics.render();
        for line in [
            "vllm:num_requests_running{model_name=\"mocker\",engine=\"0\"} 3",
            "vllm:kv_cache_usage_perc{model_name=\"mocker\",engine=\"0\"} 0.25",
            "vllm:prefix_cache_hits_total{model_name=\"mocker\",engine=\"0\"} 64",
            "vllm:prompt_tokens_total{model_name=\"mocker\"} 12",
            "vllm:generation_tokens_total{model_name=\"mocker\"} 4",
            "vllm:time_to_first_token_seconds_count{model_name=\"mocker\"} 1",
            "vllm:request_success_total{model_name=\"mocker\",finished_reason=\"length\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn sglang_flavor_uses_sglang_names() {
        let (_tx, rx) = watch::channel(EngineMetrics { running_requests: 2, ..Default::default() });
        let text = ServerMetrics::new(MetricFlavor::Sglang, "m", 64, vec![rx], Vec::new()).render();
        assert!(text.contains("sglang:num_running_reqs{model_name=\"m\",engine=\"0\"} 2"), "{text}");
        assert!(!text.contains("vllm:"));
    }
}
