//! Engine state read from each rank's metrics watch at scrape time: queue lengths, KV usage,
//! preemption and prefix-cache counters, the config info gauges.

use mocker_core::metrics::EngineMetrics;
use mocker_live::LiveEngine;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use tokio::sync::watch;

use super::MetricFlavor;

/// The scrape-time collector.
#[derive(Debug)]
pub(super) struct EngineState {
    pub flavor: MetricFlavor,
    pub model_name: String,
    pub block_size: usize,
    /// `max_lora` of `vllm:lora_requests_info`.
    pub max_loras: usize,
    /// KV cache group names (empty without groups) and their shared budget, bytes.
    pub kv_cache_groups: Vec<String>,
    pub kv_cache_capacity_bytes: u64,
    /// `_created` of the counters (the server's start).
    pub created: f64,
    pub ranks: Vec<watch::Receiver<EngineMetrics>>,
    pub engines: Vec<LiveEngine>,
}

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    let mut out: Vec<LabelPair> = pairs
        .iter()
        .map(|(name, value)| {
            let mut l = LabelPair::default();
            l.set_name(name.to_string());
            l.set_value(value.to_string());
            l
        })
        .collect();
    // As every other family is written: label names in order.
    out.sort_by(|a, b| a.name().cmp(b.name()));
    out
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(metrics);
    f
}

fn gauge_sample(label_pairs: Vec<LabelPair>, value: f64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(value);
    let mut m = Metric::from_gauge(g);
    m.set_label(label_pairs);
    m
}

fn counter_sample(label_pairs: Vec<LabelPair>, value: f64) -> Metric {
    let mut c = Counter::default();
    c.set_value(value);
    let mut m = Metric::from_label(label_pairs);
    m.set_counter(c);
    m
}

impl EngineState {
    fn rank_labels(&self, dp_rank: u32) -> Vec<LabelPair> {
        labels(&[("model_name", &self.model_name), ("engine", &dp_rank.to_string())])
    }

    fn gauge(
        &self,
        out: &mut Vec<MetricFamily>,
        name: &str,
        help: &str,
        ranks: &[EngineMetrics],
        value: impl Fn(&EngineMetrics) -> f64,
    ) {
        let samples = ranks.iter().map(|m| gauge_sample(self.rank_labels(m.dp_rank), value(m))).collect();
        out.push(family(name, help, MetricType::GAUGE, samples));
    }

    /// mocker's per-group KV usage (vLLM exposes one usage for all groups): bytes each
    /// group's live requests hold, and their share of the budget the groups share.
    fn group_gauges(&self, out: &mut Vec<MetricFamily>) {
        let (mut bytes, mut share) = (Vec::new(), Vec::new());
        for e in &self.engines {
            let rank = e.dp_rank().to_string();
            for (name, (_, used)) in self.kv_cache_groups.iter().zip(e.kv_group_usage()) {
                let l = || labels(&[("model_name", &self.model_name), ("engine", &rank), ("group", name)]);
                bytes.push(gauge_sample(l(), used as f64));
                share.push(gauge_sample(l(), used as f64 / self.kv_cache_capacity_bytes.max(1) as f64));
            }
        }
        out.push(family(
            "mocker:kv_cache_group_used_bytes",
            "KV-cache bytes the requests hold in each cache group.",
            MetricType::GAUGE,
            bytes,
        ));
        out.push(family(
            "mocker:kv_cache_group_usage_perc",
            "Share of the KV-cache byte budget each cache group holds. 1 means 100 percent.",
            MetricType::GAUGE,
            share,
        ));
    }

    /// `<base>_total` and its `<base>_created` twin.
    fn counter(&self, out: &mut Vec<MetricFamily>, base: &str, help: &str, values: &[(u32, u64)]) {
        let samples =
            values.iter().map(|(rank, v)| counter_sample(self.rank_labels(*rank), *v as f64)).collect();
        out.push(family(&format!("{base}_total"), help, MetricType::COUNTER, samples));
        let created =
            values.iter().map(|(rank, _)| gauge_sample(self.rank_labels(*rank), self.created)).collect();
        out.push(family(&format!("{base}_created"), help, MetricType::GAUGE, created));
    }
}

impl Collector for EngineState {
    fn desc(&self) -> Vec<&Desc> {
        // Families are built at scrape time; the registry holds only this collector's.
        Vec::new()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let ranks: Vec<EngineMetrics> = self.ranks.iter().map(|r| *r.borrow()).collect();
        let mut out = Vec::new();
        // mocker's own: no engine has it, so it keeps the `mocker:` prefix in both flavors.
        let shed: Vec<(u32, u64)> =
            self.engines.iter().map(|e| (e.dp_rank(), e.overflow_cancellations())).collect();
        self.counter(
            &mut out,
            "mocker:stream_overflow_cancellations",
            "Requests cancelled because their client read the stream too slowly and its output buffer \
             (--stream-buffer-tokens) overflowed.",
            &shed,
        );
        if !self.kv_cache_groups.is_empty() {
            self.group_gauges(&mut out);
        }
        let per_rank = |value: fn(&EngineMetrics) -> u64| -> Vec<(u32, u64)> {
            ranks.iter().map(|m| (m.dp_rank, value(m))).collect()
        };
        match self.flavor {
            MetricFlavor::Vllm => {
                self.gauge(
                    &mut out,
                    "vllm:num_requests_running",
                    "Number of requests in model execution batches.",
                    &ranks,
                    |m| m.running_requests as f64,
                );
                self.gauge(
                    &mut out,
                    "vllm:num_requests_waiting",
                    "Number of requests waiting to be processed.",
                    &ranks,
                    |m| m.waiting_requests as f64,
                );
                self.gauge(
                    &mut out,
                    "vllm:kv_cache_usage_perc",
                    "KV-cache usage. 1 means 100 percent usage.",
                    &ranks,
                    |m| m.gpu_cache_usage_perc,
                );
                self.gauge(
                    &mut out,
                    "vllm:gpu_cache_usage_perc",
                    "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
                    &ranks,
                    |m| m.gpu_cache_usage_perc,
                );
                self.counter(
                    &mut out,
                    "vllm:num_preemptions",
                    "Cumulative number of preemption from the engine.",
                    &per_rank(|m| m.num_preemptions_total),
                );
                self.counter(
                    &mut out,
                    "vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    &per_rank(|m| m.prefix_cache_queries_total),
                );
                self.counter(
                    &mut out,
                    "vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    &per_rank(|m| m.prefix_cache_hits_total),
                );
                let info = ranks
                    .iter()
                    .map(|m| {
                        let rank = m.dp_rank.to_string();
                        let l = labels(&[
                            ("model_name", &self.model_name),
                            ("engine", &rank),
                            ("block_size", &self.block_size.to_string()),
                            ("num_gpu_blocks", &m.total_blocks.to_string()),
                        ]);
                        gauge_sample(l, 1.0)
                    })
                    .collect();
                out.push(family(
                    "vllm:cache_config_info",
                    "Information of the LLMEngine CacheConfig",
                    MetricType::GAUGE,
                    info,
                ));
                // The Gateway API Inference Extension reads adapters from these labels
                // (comma-separated names, as vLLM joins them). The value is the time of
                // the reading, as in vLLM (readers take the newest series).
                let now = super::unix_now();
                let max_lora = self.max_loras.to_string();
                let lora = ranks
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let rank = m.dp_rank.to_string();
                        let activity = self.engines.get(i).map(LiveEngine::lora_activity).unwrap_or_default();
                        let join = |names: &[std::sync::Arc<str>]| {
                            names.iter().map(|n| &**n).collect::<Vec<_>>().join(",")
                        };
                        let l = labels(&[
                            ("model_name", &self.model_name),
                            ("engine", &rank),
                            ("max_lora", &max_lora),
                            ("running_lora_adapters", &join(&activity.running)),
                            ("waiting_lora_adapters", &join(&activity.waiting)),
                        ]);
                        gauge_sample(l, now)
                    })
                    .collect();
                out.push(family(
                    "vllm:lora_requests_info",
                    "Running stats on lora requests.",
                    MetricType::GAUGE,
                    lora,
                ));
            }
            MetricFlavor::Sglang => {
                self.gauge(
                    &mut out,
                    "sglang:num_running_reqs",
                    "The number of running requests.",
                    &ranks,
                    |m| m.running_requests as f64,
                );
                self.gauge(
                    &mut out,
                    "sglang:num_queue_reqs",
                    "The number of requests in the waiting queue.",
                    &ranks,
                    |m| m.waiting_requests as f64,
                );
                self.gauge(&mut out, "sglang:token_usage", "The token usage.", &ranks, |m| {
                    m.gpu_cache_usage_perc
                });
                self.gauge(&mut out, "sglang:cache_hit_rate", "The prefix cache hit rate.", &ranks, |m| {
                    if m.prefix_cache_queries_total == 0 {
                        0.0
                    } else {
                        m.prefix_cache_hits_total as f64 / m.prefix_cache_queries_total as f64
                    }
                });
            }
        }
        out
    }
}
