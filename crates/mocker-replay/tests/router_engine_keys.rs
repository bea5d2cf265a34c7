//! Router keys given in the engine args' `dynamo` object act as in the reference's offline
//! replay: `dynamo.router_queue_policy` orders the KV router's queue, over the router
//! config's policy. Figures measured on the reference (ai-dynamo-runtime 1.6.1): ISL 2000 /
//! OSL 200, 1000 requests, Poisson 40 req/s (seed 42), 2 workers, kv router,
//! router_queue_threshold 0.2, engine 64/16384/256/8192.

use mocker_core::config::LaunchConfig;
use mocker_replay::router::{KvRouterConfig, QueuePolicy};
use mocker_replay::{run_synthetic, Cluster, Load, ReplayOptions, RouterMode, SyntheticWorkload};

/// p99 TTFT (ms) of the workload with these engine args and router queue policy.
fn p99_ttft(engine_args: &str, policy: QueuePolicy) -> f64 {
    let options = ReplayOptions {
        cluster: Cluster::aggregated(LaunchConfig::from_json_str(engine_args).expect("engine args"), 2),
        workload: SyntheticWorkload {
            input_tokens: 2000,
            output_tokens: 200,
            request_count: 1000,
            load: Load::RequestRate(40.0),
            ..Default::default()
        }
        .into(),
        router: RouterMode::Kv,
        router_config: KvRouterConfig {
            router_queue_threshold: Some(0.2),
            router_queue_policy: policy,
            ..Default::default()
        },
        ..Default::default()
    };
    run_synthetic(&options).expect("replay runs").summary.ttft_ms.p99
}

#[test]
fn engine_args_queue_policy_overrides_router_config() {
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() <= 1e-6 * want, "{what}: got {got}, reference {want}");
    };
    let lcfs = r#"{"engine":{},"dynamo":{"router_queue_policy":"lcfs"}}"#;
    // Reference: lcfs 32467.75811 whichever way it is given; fcfs 9499.165313.
    close(p99_ttft(lcfs, QueuePolicy::Fcfs), 32467.75811, "engine-args lcfs over router-config fcfs");
    close(p99_ttft(r#"{"engine":{}}"#, QueuePolicy::Lcfs), 32467.75811, "router-config lcfs");
    close(
        p99_ttft(r#"{"engine":{},"dynamo":{"router_queue_policy":"fcfs"}}"#, QueuePolicy::Lcfs),
        9499.165313,
        "engine-args fcfs over router-config lcfs",
    );
}
