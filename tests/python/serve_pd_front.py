"""`mocker serve --prefill-workers 1 --decode-workers 2` through a plain openai client: the
front runs each request as a prefill then a decode. Driven by crates/mocker/tests/serve_e2e.rs
with the workers' URLs (read from the server's start-up lines); prints one JSON line.

usage: serve_pd_front.py FRONT_URL API_KEY PREFILL_URL DECODE_URL...
"""

import json
import sys
import threading

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"


def metric(base, name):
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            if s.name == name:
                total += s.value
    return total


def main():
    front, key, prefill, decodes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    client = openai.OpenAI(base_url=f"{front}/v1", api_key=key, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{front}/health").status_code == 200
    prompt = "a disaggregated deployment answers like one server " * 6

    results = []

    def chat(i):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"{i} {prompt}"}], max_completion_tokens=10 + i,
            stream=True, stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.delta.content or ""
        results.append((i, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens, text))

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6, results
    for i, completion, cached, prompt_tokens, text in results:
        assert completion == 10 + i and text, (i, completion, text)
        # The decode worker received the prompt's KV: all of it counts as cached.
        assert cached == prompt_tokens, (i, cached, prompt_tokens)

    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7)
    assert done.usage.completion_tokens == 7 and done.choices[0].finish_reason == "length", done

    # A request the workers refuse is refused through the front, as the worker words it.
    try:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)
        raise AssertionError("max_tokens 0 must be a 400")
    except openai.BadRequestError as e:
        assert e.response.json()["error"]["param"] == "max_tokens", e.response.text
    try:
        client.completions.create(model="nope", prompt=prompt, max_tokens=1)
        raise AssertionError("an unknown model must be a 404")
    except openai.NotFoundError:
        pass

    assert metric(front, "mocker:pd_handoffs_total") == 7
    assert metric(front, "mocker:pd_kv_transfer_seconds_count") == 7
    # Round-robin over two decode workers, and every worker ends idle with its KV freed.
    served = [metric(d, "vllm:request_success_total") for d in decodes]
    assert sum(served) == 7 and all(n >= 3 for n in served), served
    for base in [prefill, *decodes]:
        assert metric(base, "vllm:num_requests_running") == 0 and metric(base, "vllm:num_requests_waiting") == 0
        assert metric(base, "vllm:kv_cache_usage_perc") == 0.0, base
    print(json.dumps({"ok": True, "decode_requests": served}))


if __name__ == "__main__":
    main()
