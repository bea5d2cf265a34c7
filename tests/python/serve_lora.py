"""`mocker serve --enable-lora` through the openai SDK and httpx, with the KV events read by
a raw pyzmq subscriber. Driven by crates/mocker/tests/serve_e2e.rs, which starts the server
with --enable-lora --max-loras 1, adapters `sql` (name=path form) and `chat` (JSON form),
--block-size 16 and KV events on; prints one JSON line of results.

usage: serve_lora.py BASE_URL API_KEY KV_EVENTS_ENDPOINT
"""

import json
import sys
import threading
import time

import httpx
import msgspec
import openai
import zmq
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"


def lora_info(base):
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        if family.name == "vllm:lora_requests_info":
            return [s.labels for s in family.samples]
    raise AssertionError("no vllm:lora_requests_info family")


def check_models_and_routes(base, client, http):
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {MODEL, "sql", "chat"}, cards
    assert cards["sql"].root == "/adapters/sql" and cards["sql"].parent == MODEL, cards["sql"]
    assert cards["chat"].root == "/adapters/chat", cards["chat"]

    r = http.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "math", "lora_path": "/adapters/math"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'math' added successfully.", (r.status_code, r.text)
    again = http.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "math", "lora_path": "/x"})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"], again.text
    assert http.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "nopath"}).status_code == 400
    assert http.post(f"{base}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x", "rank": 8}).status_code == 400
    assert "math" in {m.id for m in client.models.list().data}

    done = client.completions.create(model="math", prompt="one two three " * 12, max_tokens=3)
    assert done.model == "math" and done.usage.completion_tokens == 3, done

    r = http.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "math"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'math' removed successfully.", r.text
    gone = http.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "math"})
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "NotFoundError", gone.text
    assert "math" not in {m.id for m in client.models.list().data}
    try:
        client.completions.create(model="math", prompt="one", max_tokens=1)
        raise AssertionError("an unloaded adapter must be a 404")
    except openai.NotFoundError:
        pass


def check_prefix_isolation(client):
    prompt = "lorem ipsum dolor sit amet consectetur adipiscing elit " * 8
    cached = lambda model: client.completions.create(
        model=model, prompt=prompt, max_tokens=2
    ).usage.prompt_tokens_details.cached_tokens
    first = cached("sql")
    second = cached("sql")
    other = cached("chat")
    base = cached(MODEL)
    assert first == 0 and second > 0, (first, second)
    assert other == 0 and base == 0, (other, base)
    return second


def check_batch_limit(base, client):
    """Two adapters, --max-loras 1: the second adapter's requests wait until the first's end."""
    timings = {}
    t0 = time.perf_counter()

    def run(name, model):
        start = time.perf_counter()
        stream = client.completions.create(
            model=model, prompt=f"{name} " * 4, max_tokens=120, stream=True,
            extra_body={"ignore_eos": True},
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter() - t0
        timings[name] = (model, start - t0, first, time.perf_counter() - t0)

    threads = []
    for i, model in enumerate(["sql", "sql", "chat", "chat"]):
        t = threading.Thread(target=run, args=(f"r{i}", model))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    seen = []
    while any(t.is_alive() for t in threads):
        seen.extend(lora_info(base))
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert all(s["max_lora"] == "1" for s in seen), seen
    running = {s["running_lora_adapters"] for s in seen}
    # Never two adapters in one batch; each ran at some point while the other waited.
    assert not any("," in r for r in running), running
    assert {"sql", "chat"} <= running, running
    assert any(s["running_lora_adapters"] == "sql" and s["waiting_lora_adapters"] == "chat" for s in seen), seen
    sql_end = max(e for m, _, _, e in timings.values() if m == "sql")
    chat_first = min(f for m, _, f, _ in timings.values() if m == "chat")
    # The chat requests' first tokens come only once both sql requests have finished,
    # although they arrived while those ran (all times from one clock).
    assert chat_first > sql_end - 0.02, timings
    assert max(s for m, s, _, _ in timings.values() if m == "chat") < sql_end - 0.3, timings
    idle = lora_info(base)
    assert all(s["running_lora_adapters"] == "" and s["waiting_lora_adapters"] == "" for s in idle), idle
    return {k: [round(v, 3) if isinstance(v, float) else v for v in t] for k, t in timings.items()}


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
            if event[0] == "BlockStored":
                # vLLM's positional order: ..., block_size, lora_id, medium, lora_name, ...
                seen.setdefault("stored", []).append((event[5], event[7]))
    sock.close()


def main():
    base, key, kv_endpoint = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    seen, ready = {}, threading.Event()
    sub = threading.Thread(target=kv_subscriber, args=(kv_endpoint, seen, ready))
    sub.start()
    ready.wait()
    # Slow joiner: wait until the subscription sees a first batch.
    while not seen.get("stored"):
        client.completions.create(model=MODEL, prompt="warm up the subscription " * 4, max_tokens=1)
        time.sleep(0.1)
    check_models_and_routes(base, client, http)
    cached = check_prefix_isolation(client)
    timings = check_batch_limit(base, client)
    time.sleep(0.3)
    seen["stop"] = True
    sub.join()
    stored = set(seen["stored"])
    assert (None, None) in stored, stored
    ids = {name: lora_id for lora_id, name in stored if name is not None}
    assert {"sql", "chat", "math"} <= set(ids), stored
    assert len(set(ids.values())) == len(ids) and all(isinstance(i, int) and i > 0 for i in ids.values()), ids
    print(json.dumps({"ok": True, "cached_tokens": cached, "timings": timings, "lora_ids": ids}))


if __name__ == "__main__":
    main()
