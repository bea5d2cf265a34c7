//! Synthetic prompts are handed to vLLM-style engines without their tokens (only lengths
//! and block keys, `FeedOptions::tokenless`): the replay is the same as with the tokens.
//! Engines asked to put token ids in their KV events (`emit_kv_token_ids`) still get
//! them, which makes the two runs to compare.

mod replay_capture;
use replay_capture::capture;

use mocker_core::config::LaunchConfig;
use mocker_replay::{Cluster, Load, ReplayOptions, RouterMode, SyntheticWorkload, Workload};

fn replay(engine: &str, router: RouterMode, turns: usize) -> (String, Vec<String>) {
    let options = ReplayOptions {
        cluster: Cluster::aggregated(LaunchConfig::from_json_str(engine).expect("engine args"), 3),
        workload: Workload::Synthetic(SyntheticWorkload {
            input_tokens: 700,
            output_tokens: 30,
            request_count: 120,
            load: Load::Concurrency(24),
            turns_per_session: turns,
            shared_prefix_ratio: 0.6,
            num_prefix_groups: 4,
            ..Default::default()
        }),
        router,
        ..Default::default()
    };
    capture(&options)
}

#[test]
fn synthetic_prompts_without_tokens_replay_as_with_them() {
    // A small pool, so blocks are evicted and requests preempted too.
    let base = r#""block_size": 16, "num_gpu_blocks": 220, "max_num_seqs": 12"#;
    for (router, turns) in [(RouterMode::Kv, 1), (RouterMode::RoundRobin, 3)] {
        let tokenless = replay(&format!("{{{base}}}"), router, turns);
        let tokens = replay(
            &format!("{{{base}, \"emit_kv_events\": true, \"emit_kv_token_ids\": true}}"),
            router,
            turns,
        );
        let completed = format!("\"completed_requests\":{}", 120 * turns);
        assert!(tokenless.0.contains(&completed), "{}", tokenless.0);
        assert_eq!(tokenless.0, tokens.0, "summary ({router:?}, {turns} turns)");
        assert!(tokenless.1 == tokens.1, "per-request records ({router:?}, {turns} turns)");
    }
}
