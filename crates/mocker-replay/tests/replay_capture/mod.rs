//! A replay's outcome in comparable form, for tests that replay one workload two ways
//! and expect the same: the summary without its wall-clock fields, and every per-request
//! record, both as JSON.

use mocker_replay::{run_replay, Hooks, ReplayOptions};

/// The summary (wall-time and processing-rate fields dropped) and the per-request
/// records of replaying `options`.
pub fn capture(options: &ReplayOptions) -> (String, Vec<String>) {
    let mut records = Vec::new();
    let mut sink = |r: mocker_replay::RequestRecord| records.push(serde_json::to_string(&r).unwrap());
    let out =
        run_replay(options, Hooks { request_ended: Some(&mut sink), ..Default::default() }).expect("replay");
    let mut summary = out.summary.to_json_value();
    summary.as_object_mut().unwrap().retain(|k, _| !k.contains("wall") && !k.starts_with("processed_"));
    (summary.to_string(), records)
}
