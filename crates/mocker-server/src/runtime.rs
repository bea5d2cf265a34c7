//! The settings a running server may change (`/admin/config`): the engine's speed-up ratio,
//! failure injection and the API server's latency. Each is read per request from here, so
//! a change applies to the next request; each is exposed on `/metrics` with a counter of
//! the changes, labelled by key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus::{GaugeVec, IntCounterVec, Opts};

use crate::faults::{FailureInjectionOptions, FailureInjector};

/// The current values of the runtime settings.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeSettings {
    /// Modelled pass times are divided by it (engine-args `speedup_ratio`).
    pub speedup_ratio: f64,
    /// API-server time a request spends before the engine sees it, in simulated ms
    /// (engine-args `frontend_latency_ms`; divided by the speed-up ratio like the passes).
    pub frontend_latency_ms: f64,
    /// Failure injection (`--failure-injection-*`).
    pub failure: FailureInjectionOptions,
}

/// The settings and what is derived from them, shared by every handler.
#[derive(Debug)]
pub struct RuntimeConfig {
    settings: Mutex<RuntimeSettings>,
    faults: RwLock<Option<Arc<FailureInjector>>>,
    frontend_delay_ns: AtomicU64,
    gauges: Gauges,
}

/// Families with one series per DP rank (labelled `model_name` and `engine`, as vLLM's);
/// clones share their values.
#[derive(Debug, Clone)]
struct Gauges {
    model_name: String,
    engines: Vec<String>,
    changes_created: GaugeVec,
    speedup: GaugeVec,
    failure_rate: GaugeVec,
    frontend: GaugeVec,
    changes: IntCounterVec,
}

impl RuntimeConfig {
    /// The settings a server starts with; its series are labelled `model_name` and
    /// `engine` (each of `dp_ranks`), the change counter's created at `created` (Unix s).
    pub fn new(settings: RuntimeSettings, model_name: &str, dp_ranks: &[u32], created: f64) -> Self {
        let gauge = |name: &str, help: &str| {
            GaugeVec::new(Opts::new(name, help), &["model_name", "engine"]).expect("valid gauge")
        };
        let changes = IntCounterVec::new(
            Opts::new(
                "mocker:admin_config_changes_total",
                "Runtime settings changed through POST /admin/config, by key.",
            ),
            &["model_name", "engine", "key"],
        )
        .expect("valid counter");
        let changes_created = GaugeVec::new(
            Opts::new(
                "mocker:admin_config_changes_created",
                "Runtime settings changed through POST /admin/config, by key.",
            ),
            &["model_name", "engine", "key"],
        )
        .expect("valid gauge");
        let engines: Vec<String> = dp_ranks.iter().map(u32::to_string).collect();
        let gauges = Gauges {
            model_name: model_name.to_string(),
            engines: engines.clone(),
            changes_created: changes_created.clone(),
            speedup: gauge(
                "mocker:speedup_ratio",
                "The engine's speed-up ratio: modelled pass times are divided by it.",
            ),
            failure_rate: gauge(
                "mocker:failure_injection_rate_percent",
                "Share of inference requests answered with an injected error, in percent.",
            ),
            frontend: gauge(
                "mocker:frontend_latency_seconds",
                "API-server time each request spends before the engine sees it (simulated seconds).",
            ),
            changes: changes.clone(),
        };
        // The counter's series exist from the start, at 0, so a scrape sees every key.
        for engine in &engines {
            for key in ADMIN_KEYS {
                changes.with_label_values(&[model_name, engine, key]);
                changes_created.with_label_values(&[model_name, engine, key]).set(created);
            }
        }
        let config = Self {
            settings: Mutex::new(settings.clone()),
            faults: RwLock::new(None),
            frontend_delay_ns: AtomicU64::new(0),
            gauges,
        };
        config.install(&settings, true);
        config
    }

    /// The families to register with the server's metrics.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let g = &self.gauges;
        vec![
            Box::new(g.speedup.clone()),
            Box::new(g.failure_rate.clone()),
            Box::new(g.frontend.clone()),
            Box::new(g.changes.clone()),
            Box::new(g.changes_created.clone()),
        ]
    }

    /// The settings now.
    pub fn settings(&self) -> RuntimeSettings {
        self.settings.lock().expect("runtime settings").clone()
    }

    /// The failure injector of the next request, when failures are injected.
    pub fn faults(&self) -> Option<Arc<FailureInjector>> {
        self.faults.read().expect("runtime faults").clone()
    }

    /// The API-server delay of the next request (wall time).
    pub fn frontend_delay(&self) -> Duration {
        Duration::from_nanos(self.frontend_delay_ns.load(Ordering::Relaxed))
    }

    /// Replaces the settings (already applied to the engine where they concern it), counting
    /// each changed key. Returns the keys that changed.
    pub fn replace(&self, new: RuntimeSettings) -> Vec<&'static str> {
        let mut current = self.settings.lock().expect("runtime settings");
        let mut changed = Vec::new();
        if current.speedup_ratio != new.speedup_ratio {
            changed.push("speedup-ratio");
        }
        if current.frontend_latency_ms != new.frontend_latency_ms {
            changed.push("frontend-latency-ms");
        }
        if current.failure.rate_percent != new.failure.rate_percent {
            changed.push("failure-injection-rate");
        }
        if current.failure.types != new.failure.types {
            changed.push("failure-types");
        }
        if current.failure.seed != new.failure.seed {
            changed.push("failure-injection-seed");
        }
        if changed.is_empty() {
            return changed;
        }
        self.install(&new, current.failure != new.failure);
        *current = new;
        let g = &self.gauges;
        for key in &changed {
            for engine in &g.engines {
                g.changes.with_label_values(&[g.model_name.as_str(), engine, key]).inc();
            }
        }
        changed
    }

    /// Derives what requests read from `s`; the failure injector only when `faults`, so a
    /// change of speed does not restart a seeded injection's draw.
    fn install(&self, s: &RuntimeSettings, faults: bool) {
        if faults {
            *self.faults.write().expect("runtime faults") = FailureInjector::new(&s.failure).map(Arc::new);
        }
        let delay = mocker_core::timing::scaled_nanos(s.frontend_latency_ms, s.speedup_ratio);
        self.frontend_delay_ns.store(delay, Ordering::Relaxed);
        let g = &self.gauges;
        for engine in &g.engines {
            let m = [g.model_name.as_str(), engine.as_str()];
            g.speedup.with_label_values(&m).set(s.speedup_ratio);
            g.failure_rate.with_label_values(&m).set(s.failure.rate_percent);
            g.frontend.with_label_values(&m).set(s.frontend_latency_ms / 1e3);
        }
    }
}

/// The keys `/admin/config` may change.
pub const ADMIN_KEYS: [&str; 5] = [
    "speedup-ratio",
    "frontend-latency-ms",
    "failure-injection-rate",
    "failure-types",
    "failure-injection-seed",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FailureType;

    fn seeded(rate: f64) -> RuntimeSettings {
        RuntimeSettings {
            speedup_ratio: 1.0,
            frontend_latency_ms: 100.0,
            failure: FailureInjectionOptions { rate_percent: rate, types: Vec::new(), seed: Some(7) },
        }
    }

    fn draws(config: &RuntimeConfig, n: usize) -> Vec<Option<FailureType>> {
        let faults = config.faults().expect("failures injected");
        (0..n).map(|_| faults.draw()).collect()
    }

    #[test]
    fn a_speed_change_keeps_the_injection_draw_and_rescales_the_delay() {
        let reference = RuntimeConfig::new(seeded(50.0), "m", &[0], 0.0);
        let whole = draws(&reference, 40);
        let config = RuntimeConfig::new(seeded(50.0), "m", &[0], 0.0);
        let mut seen = draws(&config, 20);
        assert_eq!(
            config.replace(RuntimeSettings { speedup_ratio: 4.0, ..seeded(50.0) }),
            vec!["speedup-ratio"]
        );
        seen.extend(draws(&config, 20));
        assert_eq!(seen, whole, "the draw goes on where it was");
        assert_eq!(config.frontend_delay(), Duration::from_millis(25));
        // A new failure setting starts a new draw.
        assert_eq!(
            config.replace(RuntimeSettings { speedup_ratio: 4.0, ..seeded(60.0) }),
            vec!["failure-injection-rate"]
        );
        assert_eq!(draws(&config, 40), draws(&RuntimeConfig::new(seeded(60.0), "m", &[0], 0.0), 40));
    }
}
