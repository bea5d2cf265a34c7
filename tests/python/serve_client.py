"""End-to-end checks of `mocker serve` with real clients (the `openai` SDK, httpx and
prometheus_client's text parser). Driven by crates/mocker/tests/serve_e2e.rs, which starts
the server; every check raises on failure and the script prints one JSON line of results.

usage: serve_client.py {suite,timing,hold} BASE_URL API_KEY
"""

import json
import sys
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"


def metrics(base):
    text = httpx.get(f"{base}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, 0.0)
            out[sample.name] += sample.value
        out.setdefault("__families__", set()).add(family.name)
    return out


def tokenize(base, prompt):
    r = httpx.post(f"{base}/tokenize", json={"model": MODEL, "prompt": prompt})
    r.raise_for_status()
    return r.json()["count"]


def expect_error(status, fn):
    try:
        fn()
    except openai.APIStatusError as e:
        assert e.status_code == status, (e.status_code, e.message)
        body = e.response.json()
        assert set(body["error"]) >= {"message", "type", "param", "code"}, body
        return body["error"]
    raise AssertionError(f"expected HTTP {status}")


def wait_idle(base, limit_s=3.0):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        m = metrics(base)
        if m.get("vllm:num_requests_running", 1) == 0 and m.get("vllm:kv_cache_usage_perc", 1) == 0:
            return m
        time.sleep(0.02)
    raise AssertionError(f"engine not idle after {limit_s}s: {m}")


def suite(base, key):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    results = {}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL], models

    # Non-streaming completion: exact usage, finish reason, decoded text.
    prompt = "the quick brown fox jumps over the lazy dog " * 20
    n_prompt = tokenize(base, prompt)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5)
    assert r.object == "text_completion", r
    assert r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].text, str) and r.choices[0].text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 5, n_prompt + 5)
    prompt_total, generated_total, requests = n_prompt, 5, 1

    # The same prompt again hits the simulated prefix cache (full blocks only).
    r2 = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < n_prompt and cached % 16 == 0, cached
    results["cached_tokens"] = cached
    prompt_total, generated_total, requests = prompt_total + n_prompt, generated_total + 3, requests + 1

    # Streaming completion with usage, as vllm bench and inference-perf ask for it.
    chunks = list(client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5, 6, 7], max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices]
    assert len(content) == 6 and all(c.object == "text_completion" for c in chunks), chunks
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == 7
    prompt_total, generated_total, requests = prompt_total + 7, generated_total + 6, requests + 1

    # Chat, non-streaming and streaming, with max_completion_tokens and content parts.
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hello there"}], "name": "u"}]
    c = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=4)
    assert c.object == "chat.completion" and c.choices[0].message.role == "assistant"
    assert c.usage.completion_tokens == 4 and c.choices[0].finish_reason == "length"
    n_chat = c.usage.prompt_tokens
    stream = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=4,
                                                 stream=True, stream_options={"include_usage": True}))
    assert all(s.object == "chat.completion.chunk" for s in stream)
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(s.choices[0].delta.content or "" for s in stream if s.choices)
    assert text.strip(), stream
    assert stream[-1].usage.prompt_tokens == n_chat and stream[-1].usage.completion_tokens == 4
    prompt_total, generated_total, requests = prompt_total + 2 * n_chat, generated_total + 8, requests + 2

    # Bad input: OpenAI-style JSON errors, the server keeps serving.
    expect_error(404, lambda: client.completions.create(model="nope", prompt="x", max_tokens=1))
    expect_error(400, lambda: client.completions.create(model=MODEL, prompt="x", max_tokens=0))
    expect_error(400, lambda: client.completions.create(model=MODEL, prompt="", max_tokens=1))
    err = expect_error(400, lambda: client.completions.create(model=MODEL, prompt="word " * 600, max_tokens=4))
    assert "maximum context length" in err["message"], err
    err = expect_error(400, lambda: client.completions.create(model=MODEL, prompt=[7] * 100, max_tokens=420))
    assert "maximum context length" in err["message"], err
    raw = httpx.post(f"{base}/v1/completions", content=b"{not json", headers={"Authorization": f"Bearer {key}"})
    assert raw.status_code == 400 and "malformed JSON" in raw.json()["error"]["message"], raw.text
    raw = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": "ten"},
                     headers={"Authorization": f"Bearer {key}"})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "max_tokens", raw.text
    raw = httpx.post(f"{base}/v1/completions", content=b"x" * (40 * 1024 * 1024),
                     headers={"Authorization": f"Bearer {key}"})
    assert raw.status_code == 413 and raw.json()["error"]["code"] == 413, raw.status_code
    raw = httpx.post(f"{base}/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer wrong"})
    assert raw.status_code == 401 and raw.json()["error"]["type"] == "AuthenticationError", raw.text
    # A request that can never fit the KV pool is an error, not a hang.
    err = expect_error(400, lambda: client.completions.create(model=MODEL, prompt=[5] * 400, max_tokens=10))
    assert "never" in err["message"], err

    # Metrics: vLLM names, counters equal to what was sent, engine idle.
    m = wait_idle(base)
    fams = m["__families__"]
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc", "vllm:num_preemptions", "vllm:prefix_cache_queries",
                 "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds"]:
        assert name in fams, (name, sorted(fams))
    assert m["vllm:prompt_tokens_total"] == prompt_total, (m["vllm:prompt_tokens_total"], prompt_total)
    assert m["vllm:generation_tokens_total"] == generated_total, (m["vllm:generation_tokens_total"], generated_total)
    assert m["vllm:time_to_first_token_seconds_count"] == requests
    assert m["vllm:e2e_request_latency_seconds_count"] == requests
    assert m["vllm:prefix_cache_hits_total"] >= cached
    assert m["vllm:num_requests_waiting"] == 0

    # A client that disconnects mid-stream cancels its request: the engine frees its blocks.
    with httpx.stream("POST", f"{base}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "prompt": [9] * 64, "max_tokens": 300, "stream": True}) as s:
        lines = s.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
        running = metrics(base)["vllm:num_requests_running"]
        assert running == 1, running
    m = wait_idle(base)
    # As in vLLM, its tokens count as generated, but it is an aborted request, not a finished one.
    assert m["vllm:generation_tokens_total"] >= generated_total + 3, m["vllm:generation_tokens_total"]
    assert m["vllm:e2e_request_latency_seconds_count"] == requests
    results["ok"] = True
    return results


def timing(base, key, prompt_len, max_tokens):
    """Arrival time of each streamed token, relative to sending the request. Raw httpx with
    a pre-encoded body, so client-side request building is not counted."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as http:
        def run(prompt, n):
            body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": n, "stream": True}).encode()
            times = []
            start = time.perf_counter()
            with http.stream("POST", f"{base}/v1/completions", content=body, headers=headers) as s:
                for line in s.iter_lines():
                    if line.startswith("data: {"):
                        times.append(time.perf_counter() - start)
            return times
        run([12] * 8, 2)  # warm the connection; shares no block with the measured prompt
        return {"arrivals_s": run([11] * prompt_len, max_tokens)}


def hold(base, key):
    """Starts a long stream, says so, and reports how it ended (used with SIGTERM)."""
    with httpx.stream("POST", f"{base}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": MODEL, "prompt": [3] * 16, "max_tokens": 30000, "stream": True}) as s:
        frames = []
        for line in s.iter_lines():
            if line.startswith("data: "):
                frames.append(line[6:])
                if len(frames) == 1:
                    print("STARTED", flush=True)
    last_json = json.loads(frames[-2]) if len(frames) >= 2 else {}
    return {"frames": len(frames), "done": frames[-1] == "[DONE]", "ended_with_error": "error" in last_json}


if __name__ == "__main__":
    mode, base, key = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "suite":
        out = suite(base, key)
    elif mode == "timing":
        out = timing(base, key, int(sys.argv[4]), int(sys.argv[5]))
    else:
        out = hold(base, key)
    print(json.dumps(out), flush=True)
