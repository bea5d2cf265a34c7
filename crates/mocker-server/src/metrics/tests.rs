use super::*;

fn vllm(ranks: Vec<u32>) -> ServerMetrics {
    ServerMetrics::new(MetricsOptions {
        flavor: MetricFlavor::Vllm,
        model_name: "mocker".into(),
        dp_ranks: ranks,
        block_size: 64,
        max_model_len: 1000,
        max_loras: 0,
        kv_cache_groups: Vec::new(),
        kv_cache_capacity_bytes: 0,
    })
}

fn finished(rank: usize) -> FinishedRequest {
    FinishedRequest {
        rank,
        e2e: Duration::from_millis(900),
        queue: Duration::from_millis(100),
        prefill: Duration::from_millis(200),
        decode: Duration::from_millis(400),
        prompt_tokens: 12,
        generated: 5,
        max_tokens: 16,
        n: 1,
        reason: FinishReason::Length,
    }
}

#[test]
fn counters_are_typed_under_their_total_name_with_created_twins() {
    let metrics = vllm(vec![0]);
    metrics.observe_first_token(0, Duration::from_millis(30), 12);
    let text = metrics.render();
    for line in [
        "# TYPE vllm:prompt_tokens_total counter",
        "vllm:prompt_tokens_total{engine=\"0\",model_name=\"mocker\"} 12",
        "# TYPE vllm:prompt_tokens_created gauge",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n",
        "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"mocker\"} 0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(!text.contains("..\n") && !text.contains("# TYPE vllm:prompt_tokens counter"), "{text}");
}

#[test]
fn a_finished_request_feeds_vllms_phase_histograms_of_its_rank() {
    let metrics = vllm(vec![0, 1]);
    metrics.observe_finished(&finished(1));
    let text = metrics.render();
    for line in [
        "vllm:request_queue_time_seconds_sum{engine=\"1\",model_name=\"mocker\"} 0.1",
        "vllm:request_prefill_time_seconds_sum{engine=\"1\",model_name=\"mocker\"} 0.2",
        "vllm:request_decode_time_seconds_sum{engine=\"1\",model_name=\"mocker\"} 0.4",
        "vllm:request_inference_time_seconds_sum{engine=\"1\",model_name=\"mocker\"} 0.6",
        // decode over the 4 tokens after the first
        "vllm:request_time_per_output_token_seconds_sum{engine=\"1\",model_name=\"mocker\"} 0.1",
        "vllm:request_prompt_tokens_bucket{engine=\"1\",model_name=\"mocker\",le=\"10\"} 0",
        "vllm:request_prompt_tokens_bucket{engine=\"1\",model_name=\"mocker\",le=\"20\"} 1",
        "vllm:request_params_max_tokens_sum{engine=\"1\",model_name=\"mocker\"} 16",
        "vllm:request_params_n_count{engine=\"1\",model_name=\"mocker\"} 1",
        "vllm:request_success_total{engine=\"1\",finished_reason=\"length\",model_name=\"mocker\"} 1",
        "vllm:request_queue_time_seconds_count{engine=\"0\",model_name=\"mocker\"} 0",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    // 1-2-5 buckets stop at max_model_len (1000).
    assert!(
        text.contains("vllm:request_prompt_tokens_bucket{engine=\"0\",model_name=\"mocker\",le=\"1000\"}")
    );
    assert!(!text.contains("le=\"2000\""), "{text}");
}

#[test]
fn tokens_count_as_generated_and_gaps_feed_both_itl_names() {
    let metrics = vllm(vec![0]);
    metrics.observe_token(0, None);
    metrics.observe_token(0, Some(Duration::from_millis(20)));
    metrics.observe_aborted(0);
    let text = metrics.render();
    for line in [
        "vllm:generation_tokens_total{engine=\"0\",model_name=\"mocker\"} 2",
        "vllm:inter_token_latency_seconds_count{engine=\"0\",model_name=\"mocker\"} 1",
        "vllm:time_per_output_token_seconds_count{engine=\"0\",model_name=\"mocker\"} 1",
        "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"mocker\"} 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[test]
fn iteration_tokens_count_prefill_and_decode_tokens_of_passes_that_ran() {
    let metrics = vllm(vec![0]);
    let mut sink = metrics.iteration_sink(0, None).expect("vLLM has iteration tokens");
    sink(&ForwardPassMetrics { sum_prefill_tokens: 30, num_decode_requests: 2, ..Default::default() });
    sink(&ForwardPassMetrics::default());
    let text = metrics.render();
    assert!(
        text.contains("vllm:iteration_tokens_total_sum{engine=\"0\",model_name=\"mocker\"} 32"),
        "{text}"
    );
    assert!(
        text.contains("vllm:iteration_tokens_total_count{engine=\"0\",model_name=\"mocker\"} 1"),
        "{text}"
    );
}

#[test]
fn engine_state_is_read_at_scrape_time() {
    let (tx, rx) = watch::channel(EngineMetrics { total_blocks: 100, ..Default::default() });
    let metrics = vllm(vec![0]);
    metrics.attach_engines(vec![rx], Vec::new());
    tx.send_modify(|m| {
        m.running_requests = 3;
        m.gpu_cache_usage_perc = 0.25;
        m.prefix_cache_hits_total = 64;
    });
    let text = metrics.render();
    for line in [
        "vllm:num_requests_running{engine=\"0\",model_name=\"mocker\"} 3",
        "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"mocker\"} 0.25",
        "# TYPE vllm:prefix_cache_hits_total counter",
        "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"mocker\"} 64",
        "vllm:cache_config_info{block_size=\"64\",engine=\"0\",model_name=\"mocker\",num_gpu_blocks=\"100\"} 1",
        "vllm:lora_requests_info{engine=\"0\",max_lora=\"0\",model_name=\"mocker\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[test]
fn sglang_flavor_uses_sglang_names() {
    let (_tx, rx) = watch::channel(EngineMetrics { running_requests: 2, ..Default::default() });
    let metrics = ServerMetrics::new(MetricsOptions {
        flavor: MetricFlavor::Sglang,
        model_name: "m".into(),
        dp_ranks: vec![0],
        block_size: 64,
        max_model_len: 100,
        max_loras: 0,
        kv_cache_groups: Vec::new(),
        kv_cache_capacity_bytes: 0,
    });
    assert!(metrics.iteration_sink(0, None).is_none());
    metrics.attach_engines(vec![rx], Vec::new());
    let text = metrics.render();
    assert!(text.contains("sglang:num_running_reqs{engine=\"0\",model_name=\"m\"} 2"), "{text}");
    assert!(text.contains("# TYPE sglang:num_requests_total counter"), "{text}");
    assert!(!text.contains("vllm:"));
}

#[test]
fn one_two_five_buckets_stop_at_the_limit() {
    assert_eq!(buckets_1_2_5(60), vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
    assert_eq!(buckets_1_2_5(1), vec![1.0]);
}
