"""`mocker serve`'s /v1/embeddings and /v1/responses through the openai SDK, and vLLM's
sleep mode (/sleep, /wake_up, /is_sleeping) through httpx, with the KV events a sleep
publishes read by a raw pyzmq subscriber. Driven by crates/mocker/tests/serve_e2e.rs, which
starts the server with --enable-sleep-mode --embedding-dim 64 --max-model-len 512 and KV
events on; prints one JSON line of results.

usage: serve_endpoints.py BASE_URL API_KEY KV_EVENTS_ENDPOINT
"""

import base64
import json
import math
import struct
import sys
import threading
import time

import httpx
import msgspec
import openai
import zmq
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"
DIM = 64


def sample(base, name):
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            if s.name == name:
                total += s.value
    return total


def expect_400(param, fn):
    try:
        fn()
    except openai.BadRequestError as e:
        got = e.response.json()["error"]["param"]
        assert got == param, (got, param, e.message)
        return
    raise AssertionError(f"{param}: expected HTTP 400")


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def check_embeddings(base, client, http):
    count = lambda text: http.post(f"{base}/tokenize", json={"prompt": text}).json()["count"]
    queries = sample(base, "vllm:prefix_cache_queries_total")
    one = client.embeddings.create(model=MODEL, input="the quick brown fox")
    assert len(one.data) == 1 and len(one.data[0].embedding) == DIM, one
    assert abs(norm(one.data[0].embedding) - 1.0) < 1e-4
    assert one.usage.prompt_tokens == count("the quick brown fox"), (one.usage, count("the quick brown fox"))
    assert one.usage.total_tokens == one.usage.prompt_tokens
    # The request went through the simulated engine: its prompt was looked up in the prefix cache.
    assert sample(base, "vllm:prefix_cache_queries_total") >= queries + one.usage.prompt_tokens

    two = client.embeddings.create(model=MODEL, input=["the quick brown fox", "jumps over"])
    assert [d.index for d in two.data] == [0, 1]
    assert two.data[0].embedding == one.data[0].embedding, "same input, same vector"
    assert two.data[0].embedding != two.data[1].embedding, "different inputs, different vectors"
    assert two.usage.prompt_tokens == count("the quick brown fox") + count("jumps over")

    ids = client.embeddings.create(model=MODEL, input=[1012, 2054, 3000, 4000])
    assert ids.usage.prompt_tokens == 4
    lists = client.embeddings.create(model=MODEL, input=[[1012, 2054], [3000, 4000, 5000]])
    assert lists.usage.prompt_tokens == 5 and len(lists.data) == 2

    # float and base64 (little-endian f32, what the SDK decodes) carry the same vector.
    raw = http.post(f"{base}/v1/embeddings", json={"input": "jumps over", "encoding_format": "float"}).json()
    b64 = http.post(f"{base}/v1/embeddings", json={"input": "jumps over", "encoding_format": "base64"}).json()
    decoded = list(struct.unpack(f"<{DIM}f", base64.b64decode(b64["data"][0]["embedding"])))
    assert all(abs(a - b) < 1e-6 for a, b in zip(raw["data"][0]["embedding"], decoded))
    assert all(abs(a - b) < 1e-6 for a, b in zip(two.data[1].embedding, decoded))

    short = client.embeddings.create(model=MODEL, input="jumps over", dimensions=8)
    assert len(short.data[0].embedding) == 8 and abs(norm(short.data[0].embedding) - 1.0) < 1e-4

    expect_400("pooling_type", lambda: client.embeddings.create(model=MODEL, input="x", extra_body={"pooling_type": "mean"}))
    expect_400("dimensions", lambda: client.embeddings.create(model=MODEL, input="x", dimensions=DIM + 1))
    expect_400("encoding_format", lambda: client.embeddings.create(model=MODEL, input="x", encoding_format="int8"))
    try:
        client.embeddings.create(model="other", input="x")
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError:
        pass


def check_responses(base, client, http):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hello"}]
    prompt_tokens = http.post(f"{base}/tokenize", json={"messages": messages}).json()["count"]

    r = client.responses.create(model=MODEL, input="Say hello", instructions="be brief", max_output_tokens=6)
    assert r.object == "response" and r.id.startswith("resp_"), r
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert r.output_text and r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens == 6, r.usage
    assert r.usage.input_tokens == prompt_tokens, (r.usage, prompt_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # The cap ended it: OpenAI's incomplete status.
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6)
    assert chat.usage.prompt_tokens == r.usage.input_tokens, "same prompt as the chat path"

    parts = client.responses.create(
        model=MODEL,
        max_output_tokens=3,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Say "}, {"type": "input_text", "text": "hello"}]}],
    )
    plain = client.responses.create(model=MODEL, max_output_tokens=3, input="Say hello")
    assert parts.usage.input_tokens == plain.usage.input_tokens

    events = list(client.responses.create(model=MODEL, input="Say hello", instructions="be brief", max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    for kind in ["response.output_text.delta", "response.output_text.done", "response.output_item.done"]:
        assert kind in kinds, (kind, kinds)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response
    assert deltas == done.text == final.output_text, (deltas, done.text, final.output_text)
    assert final.usage.output_tokens == 12 and final.usage.input_tokens == prompt_tokens, final.usage

    expect_400("tools", lambda: client.responses.create(model=MODEL, input="x", tools=[{"type": "function", "name": "f", "parameters": {}}]))
    expect_400("previous_response_id", lambda: client.responses.create(model=MODEL, input="x", previous_response_id="resp_1"))
    expect_400("store", lambda: client.responses.create(model=MODEL, input="x", store=True))
    expect_400("max_output_tokens", lambda: client.responses.create(model=MODEL, input="x", max_output_tokens=100000))
    return final.usage.output_tokens


def kv_subscriber(endpoint, seen, ready):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 200)
    sock.connect(endpoint)
    ready.set()
    deadline = time.time() + 60
    while time.time() < deadline and not seen.get("stop"):
        try:
            frames = sock.recv_multipart()
        except zmq.Again:
            continue
        batch = msgspec.msgpack.decode(frames[-1])
        for event in batch[1]:
            seen.setdefault("kinds", []).append(event[0])
    sock.close()


def check_sleep(base, key, kv_endpoint):
    auth = {"Authorization": f"Bearer {key}"}
    http = httpx.Client(headers=auth, timeout=60)
    long_prompt = "alpha beta gamma delta " * 20
    chat = lambda: http.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": long_prompt}], "max_tokens": 2},
    )
    assert http.get(f"{base}/is_sleeping").json() == {"is_sleeping": False}
    chat()
    warm = chat().json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert warm > 0, "the prefix cache holds the prompt before the sleep"

    seen, ready = {}, threading.Event()
    subscriber = threading.Thread(target=kv_subscriber, args=(kv_endpoint, seen, ready))
    subscriber.start()
    ready.wait()
    time.sleep(0.5)  # the SUB socket's slow-joiner window

    # A long stream in flight when the sleep comes: vLLM's default sleep aborts it.
    streamed = []
    first = threading.Event()

    def stream():
        body = {"model": MODEL, "prompt": "one two three", "max_tokens": 480, "stream": True}
        with http.stream("POST", f"{base}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    streamed.append(line[6:])
                    first.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert first.wait(30)
    assert httpx.post(f"{base}/sleep?level=1").status_code == 401, "state-changing: needs the key"
    assert http.post(f"{base}/sleep?level=1").status_code == 200
    streamer.join(30)
    assert not streamer.is_alive()
    frames = [json.loads(s) for s in streamed if s != "[DONE]"]
    assert streamed[-1] == "[DONE]"
    assert "error" in frames[-1] and frames[-1]["error"]["code"] == 503, frames[-1]
    assert "sleep" in frames[-1]["error"]["message"]
    assert not any(f.get("choices") and f["choices"][0].get("finish_reason") for f in frames), "aborted, not finished"

    assert http.get(f"{base}/is_sleeping").json() == {"is_sleeping": True}
    assert http.post(f"{base}/sleep?level=2").status_code == 200, "a second sleep is a no-op"
    refused = chat()
    assert refused.status_code == 503 and "sleeping" in refused.json()["error"]["message"], refused.text
    assert http.post(f"{base}/v1/embeddings", json={"input": "x"}).status_code == 503
    assert http.post(f"{base}/v1/responses", json={"input": "x"}).status_code == 503
    assert http.post(f"{base}/tokenize", json={"prompt": "x"}).status_code == 200, "no weights needed"
    assert http.get(f"{base}/v1/models").status_code == 200
    assert sample(base, "vllm:num_requests_running") == 0

    for bad, param in [("/sleep?level=3", "level"), ("/sleep?mode=wait", "mode"), ("/sleep?lvl=1", "lvl"), ("/wake_up?tags=gpu", "tags")]:
        r = http.post(f"{base}{bad}")
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (bad, r.text)

    # Waking the weights alone leaves the engine asleep until the KV cache wakes too.
    assert http.post(f"{base}/wake_up?tags=weights").status_code == 200
    assert http.get(f"{base}/is_sleeping").json() == {"is_sleeping": True}
    assert chat().status_code == 503
    assert http.post(f"{base}/wake_up?tags=kv_cache").status_code == 200
    assert http.get(f"{base}/is_sleeping").json() == {"is_sleeping": False}

    after = chat().json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert after == 0, f"the sleep dropped the prefix cache, yet {after} tokens were cached"
    assert chat().json()["usage"]["prompt_tokens_details"]["cached_tokens"] == warm, "the cache refills"
    time.sleep(0.3)
    seen["stop"] = True
    subscriber.join()
    kinds = seen.get("kinds", [])
    assert kinds.count("AllBlocksCleared") == 1, kinds
    # The stored blocks of the refill come after the clear.
    assert "BlockStored" in kinds[kinds.index("AllBlocksCleared"):], kinds
    # wake_up with everything awake is a no-op, as in vLLM.
    assert http.post(f"{base}/wake_up").status_code == 200
    return len(frames)


def main():
    base, key, kv_endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    check_embeddings(base, client, http)
    streamed_tokens = check_responses(base, client, http)
    aborted_after = check_sleep(base, key, kv_endpoint)
    print(json.dumps({"ok": True, "streamed_tokens": streamed_tokens, "aborted_after_frames": aborted_after}))


if __name__ == "__main__":
    main()
