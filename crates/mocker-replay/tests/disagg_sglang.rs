//! Disaggregated SGLang replay: the reference's figures (ai-dynamo-runtime 1.6.1, engine
//! `{"backend": "sglang"}` 64/16384/256/8192, polynomial timing), measured with its offline
//! disagg replay, and the destination-first handoff's invariants.

use mocker_core::config::LaunchConfig;
use mocker_replay::{
    run_replay, Cluster, Hooks, Load, Pool, ReplayOptions, RequestRecord, RouterMode, SyntheticWorkload,
};
use proptest::prelude::*;
use serde_json::{json, Value};

const ENGINE: &str = r#""backend": "sglang", "block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192"#;
const TRANSFER: &str = r#", "kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 64"#;
const MISSING: &str = r#", "kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 64, "kv_transfer_timing_mode": "destination_missing""#;

fn launch(role: &str, extra: &str) -> LaunchConfig {
    LaunchConfig::from_json_str(&format!(r#"{{{ENGINE}, "worker_type": "{role}"{extra}}}"#))
        .expect("engine args")
}

fn disagg(prefill_extra: &str, decode_extra: &str, p: usize, d: usize) -> Cluster {
    Cluster::Disaggregated {
        prefill: Pool { launch: launch("prefill", prefill_extra), workers: p },
        decode: Pool { launch: launch("decode", decode_extra), workers: d },
    }
}

fn synthetic(isl: usize, osl: usize, n: usize, concurrency: usize) -> SyntheticWorkload {
    SyntheticWorkload {
        input_tokens: isl,
        output_tokens: osl,
        request_count: n,
        load: Load::Concurrency(concurrency),
        ..Default::default()
    }
}

fn run(options: &ReplayOptions) -> (Value, Vec<RequestRecord>) {
    let mut records = Vec::new();
    let mut sink = |r| records.push(r);
    let out = run_replay(options, Hooks { request_ended: Some(&mut sink), ..Default::default() }).unwrap();
    (out.summary.to_json_value(), records)
}

fn close(got: &Value, want: f64, what: &str) {
    let got = got.as_f64().unwrap_or_else(|| panic!("{what} missing"));
    assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{what}: got {got}, reference {want}");
}

fn check(s: &Value, figures: &[(&str, f64)]) {
    for &(key, want) in figures {
        close(&s[key], want, key);
    }
}

#[test]
fn one_request_reserves_its_destination_before_the_prefill() {
    for (extra, ttft, activated) in
        [("", 37.897344, 32.105859), (TRANSFER, 39.945344, 34.153859), (MISSING, 39.994496, 34.203011)]
    {
        let options = ReplayOptions {
            cluster: disagg(extra, "", 1, 1),
            workload: synthetic(1000, 4, 1, 1).into(),
            ..Default::default()
        };
        let (s, records) = run(&options);
        close(&s["mean_ttft_ms"], ttft, "mean_ttft_ms");
        let r = &records[0];
        let h = &r.handoff;
        // SGLang hands off destination first: the decode pool is routed and reserves at
        // arrival, the prefill follows.
        close(&json!(h.destination_reserved_ms), 0.0, "destination_reserved_ms");
        close(&json!(h.source_held_ms), 32.105859, "source_held_ms");
        close(&json!(h.destination_activated_ms), activated, "destination_activated_ms");
        close(&json!(h.source_released_ms), activated, "source_released_ms");
        let pools: Vec<_> = r.routing_history.iter().map(|e| format!("{:?}", e.pool)).collect();
        assert_eq!(pools, ["Decode", "Prefill"], "routing order");
        assert_eq!(r.output_tokens, 4);
    }
}

#[test]
fn one_by_one_matches_the_reference_with_and_without_a_transfer() {
    // Arrivals while the decode worker is mid-pass reserve one per pass end (and one per
    // landed transfer), which staggers the prefill batches as in the reference.
    for (extra, figures) in [
        (
            "",
            [
                ("duration_ms", 5167.587757),
                ("mean_ttft_ms", 126.664705),
                ("p99_ttft_ms", 337.690805),
                ("mean_itl_ms", 6.493959),
                ("mean_e2e_latency_ms", 769.566632),
            ],
        ),
        (
            TRANSFER,
            [
                ("duration_ms", 5192.607185),
                ("mean_ttft_ms", 129.042416),
                ("p99_ttft_ms", 339.738805),
                ("mean_itl_ms", 6.491616),
                ("mean_e2e_latency_ms", 771.712393),
            ],
        ),
    ] {
        let options = ReplayOptions {
            cluster: disagg(extra, "", 1, 1),
            workload: synthetic(1000, 100, 100, 16).into(),
            ..Default::default()
        };
        check(&run(&options).0, &figures);
    }
}

#[test]
fn two_by_two_matches_the_reference_in_every_transfer_mode() {
    let same = [("mean_itl_ms", 10.362881), ("committed_prefill_tokens", 800000.0)];
    for (extra, figures) in [
        (
            "",
            [
                ("duration_ms", 10025.047466),
                ("mean_ttft_ms", 860.234326),
                ("p99_ttft_ms", 2702.736981),
                ("mean_e2e_latency_ms", 2922.447555),
                ("prefill_worker_seconds", 20.050095),
            ],
        ),
        (
            TRANSFER,
            [
                ("duration_ms", 10033.239466),
                ("mean_ttft_ms", 862.855766),
                ("p99_ttft_ms", 2710.928981),
                ("mean_e2e_latency_ms", 2925.068995),
                ("prefill_worker_seconds", 20.066479),
            ],
        ),
        (
            MISSING,
            [
                ("duration_ms", 10033.305002),
                ("mean_ttft_ms", 862.876738),
                ("p99_ttft_ms", 2710.994517),
                ("mean_e2e_latency_ms", 2925.089966),
                ("prefill_worker_seconds", 20.06661),
            ],
        ),
    ] {
        let options = ReplayOptions {
            cluster: disagg(extra, "", 2, 2),
            workload: synthetic(4000, 200, 200, 64).into(),
            ..Default::default()
        };
        let s = run(&options).0;
        check(&s, &figures);
        check(&s, &same);
    }
    // The kv router (ties broken randomly in the reference) stays within 5%.
    let options = ReplayOptions {
        cluster: disagg("", "", 2, 2),
        workload: synthetic(4000, 200, 200, 64).into(),
        router: RouterMode::Kv,
        ..Default::default()
    };
    let s = run(&options).0;
    for (key, want) in
        [("duration_ms", 10025.047466), ("mean_ttft_ms", 860.234326), ("mean_itl_ms", 10.362881)]
    {
        let got = s[key].as_f64().unwrap();
        assert!((got - want).abs() / want < 0.05, "kv router {key}: {got} vs {want}");
    }
}

#[test]
fn a_small_decode_pool_retracts_as_the_reference_does() {
    // 250 pages of 64 tokens on each of 3 decode workers cannot hold their share of 32
    // concurrent 1200-token sequences: decode workers retract and recompute (for free).
    let options = ReplayOptions {
        cluster: disagg("", r#", "num_gpu_blocks": 250"#, 2, 3),
        workload: synthetic(1000, 200, 200, 32).into(),
        ..Default::default()
    };
    check(
        &run(&options).0,
        &[
            ("duration_ms", 41362.461527),
            ("mean_ttft_ms", 143.296407),
            ("p99_ttft_ms", 377.036923),
            ("mean_itl_ms", 30.631334),
        ],
    );
}

#[test]
fn reservations_made_by_arrivals_reach_the_prefill_pool_after_its_passes_start() {
    // A 300-page decode pool holds four 4000-token requests: each time four finish, four
    // waiting ones are reserved at once. The first (retried as the decode pass ends) is
    // prefilled alone on prefill worker 0; the three reserved as the new arrivals come in
    // reach the prefill pool only after that pass started, as in the reference (two run
    // together on worker 1, one waits for worker 0).
    let options = ReplayOptions {
        cluster: disagg("", r#", "num_gpu_blocks": 300"#, 2, 1),
        workload: synthetic(4000, 200, 60, 16).into(),
        ..Default::default()
    };
    let (s, records) = run(&options);
    check(&s, &[("duration_ms", 100493.535628), ("mean_ttft_ms", 17531.883359), ("mean_itl_ms", 32.930056)]);
    let mut held: Vec<f64> = records
        .iter()
        .map(|r| r.handoff.destination_reserved_ms.unwrap())
        .zip(records.iter().map(|r| r.handoff.source_held_ms.unwrap()))
        .filter(|&(reserved, _)| (reserved - 6782.682883).abs() < 1e-3)
        .map(|(_, held)| held)
        .collect();
    held.sort_by(f64::total_cmp);
    let want = [6866.654045, 6947.595753, 6947.595753, 6950.625207];
    assert_eq!(held.len(), 4, "{held:?}");
    for (got, want) in held.iter().zip(want) {
        close(&json!(got), want, "source_held_ms");
    }
}

#[test]
fn shared_prefixes_under_decode_pressure_match_the_reference() {
    // Timed transfers of prefix-sharing prompts into a 300-page decode pool: a destination
    // that found no room is retried only once capacity came back, and the decode worker
    // admits no retracted request for recompute while destinations wait for a reservation
    // (the reference's rules; without either the figures move).
    let options = ReplayOptions {
        cluster: disagg(TRANSFER, r#", "num_gpu_blocks": 300"#, 2, 1),
        workload: SyntheticWorkload {
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 2,
            ..synthetic(4000, 200, 60, 16)
        }
        .into(),
        ..Default::default()
    };
    check(
        &run(&options).0,
        &[("duration_ms", 60435.354639), ("mean_ttft_ms", 4946.09971), ("mean_itl_ms", 51.679235)],
    );
}

#[test]
fn simultaneous_transfers_land_in_the_order_their_handoffs_opened() {
    // Two prefill workers finish equal passes together; their timed transfers into the
    // same 300-page decode worker end at the same instant and are reserved in the order
    // the requests arrived, as the reference orders its transfer completions.
    let options = ReplayOptions {
        cluster: disagg(TRANSFER, r#", "num_gpu_blocks": 300"#, 2, 2),
        workload: SyntheticWorkload {
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 2,
            ..synthetic(4000, 100, 60, 16)
        }
        .into(),
        ..Default::default()
    };
    check(
        &run(&options).0,
        &[
            ("duration_ms", 16528.468216),
            ("mean_ttft_ms", 644.055119),
            ("p99_ttft_ms", 3603.975721),
            ("mean_itl_ms", 33.350824),
        ],
    );
}

#[test]
fn one_prefill_worker_feeding_two_small_decode_pools_matches_the_reference() {
    // Two 250-page decode workers retract under twelve 3200-token sequences while one
    // prefill worker keeps handing new ones over.
    let options = ReplayOptions {
        cluster: disagg("", r#", "num_gpu_blocks": 250"#, 1, 2),
        workload: synthetic(3000, 200, 100, 12).into(),
        ..Default::default()
    };
    check(
        &run(&options).0,
        &[("duration_ms", 69078.381131), ("mean_ttft_ms", 1415.283001), ("mean_itl_ms", 33.716757)],
    );
}

#[test]
fn a_retracted_request_finds_its_prompt_where_the_reference_does() {
    // Poisson arrivals into two 300-page decode workers: a request retracted before its
    // first token keeps its prompt pages in the tree, and other finished requests' runs are
    // older (a finish that adds no page stamps nothing), so most survive until it is
    // readmitted, as in the reference.
    let options = ReplayOptions {
        cluster: disagg("", r#", "num_gpu_blocks": 300"#, 1, 2),
        workload: SyntheticWorkload {
            load: Load::RequestRate(10.0),
            arrival_seed: 42,
            shared_prefix_ratio: 0.6,
            num_prefix_groups: 2,
            ..synthetic(2000, 150, 60, 1)
        }
        .into(),
        ..Default::default()
    };
    check(
        &run(&options).0,
        &[
            ("duration_ms", 11589.734964),
            ("mean_ttft_ms", 628.253398),
            ("p99_ttft_ms", 1959.176265),
            ("mean_itl_ms", 34.18994),
            ("committed_prefill_tokens", 51150.0),
            ("prefix_cache_reused_ratio", 0.5936),
        ],
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Small pools force retraction on the decode side and waiting reservations; every
    /// request is reserved, prefilled, handed off and decoded once, in that order.
    #[test]
    fn every_request_is_reserved_prefilled_and_decoded_once(
        p in 1usize..4,
        d in 1usize..4,
        isl in 1usize..400,
        osl in 1usize..40,
        n in 1usize..40,
        conc in 1usize..12,
        spare_pages in 0usize..24,
        mode in 0usize..3,
        kv in any::<bool>(),
        prefix in any::<bool>(),
    ) {
        let transfer = [
            "",
            r#", "kv_transfer_bytes_per_token": 1000000, "kv_transfer_bandwidth": 1"#,
            r#", "kv_transfer_bytes_per_token": 1000000, "kv_transfer_bandwidth": 1, "kv_transfer_timing_mode": "destination_missing""#,
        ][mode];
        // One page past the finished sequence so any one request fits (SGLang's rule).
        let pages = (isl + osl).div_ceil(16) + 1 + spare_pages;
        let small = |role: &str, extra: &str| {
            let text = format!(r#"{{"backend": "sglang", "block_size": 16, "num_gpu_blocks": {pages}, "worker_type": "{role}"{extra}}}"#);
            LaunchConfig::from_json_str(&text).unwrap()
        };
        let options = ReplayOptions {
            cluster: Cluster::Disaggregated {
                prefill: Pool { launch: small("prefill", transfer), workers: p },
                decode: Pool { launch: small("decode", ""), workers: d },
            },
            workload: SyntheticWorkload {
                shared_prefix_ratio: if prefix { 0.5 } else { 0.0 },
                num_prefix_groups: if prefix { 2 } else { 0 },
                ..synthetic(isl, osl, n, conc)
            }
            .into(),
            router: if kv { RouterMode::Kv } else { RouterMode::RoundRobin },
            ..Default::default()
        };
        let (s, records) = run(&options);
        prop_assert_eq!(records.len(), n);
        for r in &records {
            prop_assert_eq!(r.status, "completed");
            prop_assert_eq!(r.output_tokens as usize, osl);
            let h = &r.handoff;
            let (reserved, held, activated) =
                (h.destination_reserved_ms.unwrap(), h.source_held_ms.unwrap(), h.destination_activated_ms.unwrap());
            prop_assert!(reserved <= r.admission_ms.unwrap() && r.admission_ms.unwrap() <= held);
            prop_assert!(held <= activated && r.first_token_ms.unwrap() > activated);
            prop_assert!(r.token_times_ms.windows(2).all(|w| w[0] <= w[1]));
        }
        prop_assert_eq!(s["completed_requests"].as_u64(), Some(n as u64));
    }
}
