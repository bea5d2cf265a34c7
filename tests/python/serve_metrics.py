"""End-to-end checks of `mocker serve`'s /metrics exposition and small endpoints with real
clients: prometheus_client's text parser (the format vLLM's /metrics is written in), httpx,
the openai SDK. Driven by crates/mocker/tests/serve_e2e.rs, which starts the server with 2 DP
ranks and --max-model-len 512; prints one JSON line of results.

usage: serve_metrics.py BASE_URL API_KEY
"""

import json
import math
import sys

import httpx
import openai
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"

# vLLM's documented /metrics families (docs "Production Metrics" / design/metrics, v1 engine,
# 0.10-0.11) that mocker claims, as the text parser names them (counters without _total).
EXPECTED_VLLM = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:lora_requests_info": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
}
# mocker's own (no engine has it).
EXPECTED_MOCKER = {
    "mocker:stream_overflow_cancellations": "counter",
    # Runtime control (/admin/config) and what the engine is (mixed fleets).
    "mocker:admin_config_changes": "counter",
    "mocker:speedup_ratio": "gauge",
    "mocker:failure_injection_rate_percent": "gauge",
    "mocker:frontend_latency_seconds": "gauge",
    "mocker:engine_info": "gauge",
}


def scrape(base):
    r = httpx.get(f"{base}/metrics")
    r.raise_for_status()
    return r


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, family, sample, **labels):
    total = 0.0
    for s in fams[family].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def check_exposition(text):
    fams = families(text)
    # Every series of the server is labelled with the model and its engine (DP rank).
    for f in fams.values():
        for s in f.samples:
            assert s.labels.get("model_name") == MODEL, (f.name, s)
            assert s.labels.get("engine") in ("0", "1"), (f.name, s)
        assert f.type != "unknown", f"{f.name}: untyped (a sample without its # TYPE line)"
        assert not f.documentation.endswith(".."), (f.name, f.documentation)
    main = {n: f for n, f in fams.items() if not n.endswith("_created")}
    # The family list is vLLM's documented set plus mocker's own, nothing else.
    assert {n: f.type for n, f in main.items()} == {**EXPECTED_VLLM, **EXPECTED_MOCKER}, sorted(
        set(main) ^ (set(EXPECTED_VLLM) | set(EXPECTED_MOCKER)))
    for name, f in main.items():
        engines = {s.labels["engine"] for s in f.samples}
        assert engines == {"0", "1"}, (name, engines)
        if f.type == "counter":
            # The text parser types a counter only when its TYPE line names the _total
            # sample, as prometheus_client (vLLM) writes it.
            assert {s.name for s in f.samples} == {name + "_total"}, (name, f.samples)
        if f.type in ("counter", "histogram"):
            # prometheus_client's _created twin of each series.
            created = fams[name + "_created"]
            assert created.type == "gauge" and len(created.samples) == len(
                [s for s in f.samples if s.name.endswith(("_total", "_count"))]), name
        if f.type == "histogram":
            series = {}
            for s in f.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                series.setdefault(key, {"buckets": []})
                if s.name == name + "_bucket":
                    series[key]["buckets"].append((float(s.labels["le"]), s.value))
                else:
                    series[key][s.name[len(name):]] = s.value
            for key, parts in series.items():
                les = [le for le, _ in parts["buckets"]]
                counts = [c for _, c in parts["buckets"]]
                assert les == sorted(les) and les[-1] == math.inf, (name, les)
                assert counts == sorted(counts), (name, key, counts)
                assert counts[-1] == parts["_count"] and "_sum" in parts, (name, key, parts)
    return fams


def run(base, key):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    auth = {"Authorization": f"Bearer {key}"}
    results = {}

    # Endpoints: health aliases, /v1/models with the context window.
    assert httpx.get(f"{base}/ping").status_code == 200
    assert httpx.post(f"{base}/ping").status_code == 200
    assert httpx.get(f"{base}/health/ready").status_code == 200
    models = httpx.get(f"{base}/v1/models", headers=auth).json()["data"]
    assert [(m["id"], m["root"], m["max_model_len"]) for m in models] == [(MODEL, MODEL, 512)], models

    # X-Request-Id: echoed, and the response id (after vLLM's prefix), streamed or not.
    r = httpx.post(f"{base}/v1/completions", headers={**auth, "X-Request-Id": "trace-41"},
                   json={"model": MODEL, "prompt": [5] * 20, "max_tokens": 3})
    assert r.headers["x-request-id"] == "trace-41" and r.json()["id"] == "cmpl-trace-41", (r.headers, r.text)
    chat = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        extra_headers={"X-Request-Id": "trace-42"})
    assert chat.headers["x-request-id"] == "trace-42"
    chunks = list(chat.parse())
    assert chunks and all(c.id == "chatcmpl-trace-42" for c in chunks), [c.id for c in chunks]
    n_chat_prompt = None
    for c in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True}):
        if c.usage:
            n_chat_prompt = c.usage.prompt_tokens
    prompts = [20, n_chat_prompt, n_chat_prompt, 30]
    outputs = [3, 4, 4, 7]
    r = client.completions.create(model=MODEL, prompt=[6] * 30, max_tokens=7)
    assert r.id.startswith("cmpl-") and len(r.id) > 10, r.id

    head = scrape(base)
    assert head.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8", head.headers
    fams = check_exposition(head.text)

    # What the requests fed: counts, token histograms, and vLLM's phase times from the
    # simulated clock (inference = prefill + decode; end-to-end covers them).
    n = len(prompts)
    assert value(fams, "vllm:request_success", "vllm:request_success_total", finished_reason="length") == n
    assert value(fams, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == sum(prompts)
    assert value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == sum(outputs)
    assert value(fams, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == sum(prompts)
    assert value(fams, "vllm:request_generation_tokens", "vllm:request_generation_tokens_sum") == sum(outputs)
    assert value(fams, "vllm:request_params_max_tokens", "vllm:request_params_max_tokens_sum") == sum(outputs)
    assert value(fams, "vllm:request_params_n", "vllm:request_params_n_sum") == n
    assert value(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == sum(outputs) - n
    assert value(fams, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count") == sum(outputs) - n
    les = sorted({float(s.labels["le"]) for s in fams["vllm:request_prompt_tokens"].samples if "le" in s.labels})
    assert les[-2:] == [500.0, math.inf], les  # vLLM's 1-2-5 buckets up to max_model_len
    phases = {p: value(fams, f"vllm:request_{p}_time_seconds", f"vllm:request_{p}_time_seconds_sum")
              for p in ("queue", "prefill", "decode", "inference")}
    for p in phases:
        assert value(fams, f"vllm:request_{p}_time_seconds", f"vllm:request_{p}_time_seconds_count") == n, p
    assert phases["prefill"] > 0 and phases["decode"] > 0, phases
    assert abs(phases["inference"] - phases["prefill"] - phases["decode"]) < 1e-6, phases
    e2e = value(fams, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_sum")
    assert e2e >= phases["inference"], (e2e, phases)
    iterations = value(fams, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_count")
    iteration_tokens = value(fams, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_sum")
    assert iterations > 0 and 0 < iteration_tokens <= sum(prompts) + sum(outputs), (iterations, iteration_tokens)
    lora = fams["vllm:lora_requests_info"].samples[0].labels
    assert (lora["running_lora_adapters"], lora["waiting_lora_adapters"], lora["max_lora"]) == ("", "", "0"), lora

    # A client that leaves mid-stream is an aborted request: counted, with its tokens.
    with httpx.stream("POST", f"{base}/v1/completions", headers=auth,
                      json={"model": MODEL, "prompt": [9] * 16, "max_tokens": 300, "stream": True}) as s:
        got = 0
        for line in s.iter_lines():
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
    for _ in range(300):
        fams = families(scrape(base).text)
        if value(fams, "vllm:num_requests_running", "vllm:num_requests_running") == 0:
            break
    assert value(fams, "vllm:request_success", "vllm:request_success_total", finished_reason="abort") == 1
    assert value(fams, "vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == n
    assert value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") >= sum(outputs) + 3

    # The body is the 0.0.4 text format (its content type), which is not OpenMetrics: a
    # counter's TYPE line names the _total sample and there is no "# EOF". So only the
    # text parser applies; the OpenMetrics parser must refuse it rather than misread it.
    try:
        list(openmetrics_families(scrape(base).text))
    except ValueError as e:
        results["openmetrics_refuses"] = str(e)[:80]
    else:
        raise AssertionError("a 0.0.4 body parsed as OpenMetrics")
    results["families"] = len(fams)
    results["ok"] = True
    return results


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2])))
