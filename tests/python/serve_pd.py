"""Disaggregated prefill/decode between two `mocker serve --kv-transfer-config` processes,
driven with the request flow of vLLM's P/D test proxy
(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py in vllm-project/vllm): the
request goes to the prefill server with `kv_transfer_params: {do_remote_decode: true, ...}`,
`stream: false` and one output token; the `kv_transfer_params` of its answer go, with the
client's original request, to the decode server, whose answer (streamed or not) is the
client's. Driven by crates/mocker/tests/serve_e2e.rs; prints one JSON line of results.

The prefill server runs with kv_transfer_bytes_per_token 131072 and kv_transfer_bandwidth
0.05 GB/s (so a 160-token prompt's transfer takes 419.43 ms) and a 2 s abort timeout.

usage: serve_pd.py PREFILL_URL DECODE_URL API_KEY MODELLED_TTFT_MS PREFILL_EVENTS DECODE_EVENTS

MODELLED_TTFT_MS: the core's prefill pass + transfer + first decode pass for a 160-token
prompt, which the streamed completion's TTFT must match within the serve tests' tolerance.
"""

import copy
import json
import sys
import time
import uuid

import threading

import httpx
import msgspec
import zmq
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"
BYTES_PER_TOKEN, BANDWIDTH_GB_S = 131072, 0.05


def metric(base, name, **labels):
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def subscribe(endpoint, stored, stop, removed=None):
    """Collects the block hashes of every BlockStored (and BlockRemoved) event published on
    `endpoint`."""
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 100)
    sock.connect(endpoint)
    while not stop.is_set():
        try:
            frames = sock.recv_multipart()
        except zmq.Again:
            continue
        for event in msgspec.msgpack.decode(frames[-1])[1]:
            if event[0] == "BlockStored":
                stored.extend(event[1])
            elif event[0] == "BlockRemoved" and removed is not None:
                removed.extend(event[1])
    sock.close()


def proxy(http, prefill, decode, path, body):
    """The toy proxy's two steps; returns (decode response, the prefill's params, TTFT s)."""
    request_id = str(uuid.uuid4())
    headers = {"X-Request-Id": request_id}
    p = copy.deepcopy(body)
    p["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                               "remote_block_ids": None, "remote_host": None, "remote_port": None}
    p["stream"] = False
    p["max_tokens"] = 1
    if "max_completion_tokens" in p:
        p["max_completion_tokens"] = 1
    p.pop("stream_options", None)
    start = time.perf_counter()
    r = http.post(f"{prefill}{path}", json=p, headers=headers)
    assert r.status_code == 200, r.text
    params = r.json().get("kv_transfer_params")
    assert params and params["do_remote_prefill"] is True and params["do_remote_decode"] is False, r.json()
    held_usage = metric(prefill, "vllm:kv_cache_usage_perc")
    d = copy.deepcopy(body)
    d["kv_transfer_params"] = params
    if not body.get("stream"):
        r = http.post(f"{decode}{path}", json=d, headers=headers)
        assert r.status_code == 200, r.text
        return r.json(), params, held_usage, None
    first, chunks, usage = None, [], None
    with http.stream("POST", f"{decode}{path}", json=d, headers=headers) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                piece = c.get("text") or (c.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter() - start
                    chunks.append(piece)
    return {"usage": usage, "text": "".join(chunks)}, params, held_usage, first


def main():
    prefill, decode, key, modelled_ms = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    http = httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    stop = threading.Event()
    stored = {"prefill": [], "decode": []}
    removed = []
    subs = [threading.Thread(target=subscribe, args=(e, stored[side], stop, removed if side == "prefill" else None), daemon=True)
            for side, e in (("prefill", sys.argv[5]), ("decode", sys.argv[6]))]
    for t in subs:
        t.start()
    # Slow joiners: wait until both subscriptions see a batch.
    warm = 0
    while not (stored["prefill"] and stored["decode"]):
        warm += 1
        for base in (prefill, decode):
            http.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": [7] * 16 + [warm], "max_tokens": 1})
        time.sleep(0.1)
    stored["prefill"].clear()
    stored["decode"].clear()
    ids = list(range(1000, 1160))
    prompt = "the quick brown fox jumps over the lazy dog " * 16
    prompt_tokens = len(ids)
    transfer_s = prompt_tokens * BYTES_PER_TOKEN / (BANDWIDTH_GB_S * 1e9)

    # Streamed completion: exact counts, the whole prompt counted as computed, and a TTFT
    # that is the modelled prefill + transfer + first decode pass.
    body = {"model": MODEL, "prompt": ids, "max_tokens": 24, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    out, params, held_usage, ttft = proxy(http, prefill, decode, "/v1/completions", body)
    assert out["usage"]["completion_tokens"] == 24 and out["usage"]["prompt_tokens"] == prompt_tokens, out
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens, out["usage"]
    assert len(params["remote_block_ids"]) == -(-prompt_tokens // 16), params
    assert params["remote_port"] > 0 and params["remote_host"] == "127.0.0.1" and params["tp_size"] == 1, params
    assert held_usage > 0, "the prefill server holds the prompt's blocks until the decode side reads them"
    ttft_ms = ttft * 1e3
    assert modelled_ms - 1.0 <= ttft_ms <= modelled_ms * 1.5 + 100.0, (ttft_ms, modelled_ms, transfer_s)
    assert metric(prefill, "vllm:kv_cache_usage_perc") == 0.0, "the read freed the prefill's blocks"
    # Both sides publish the prompt's blocks under the same hashes (the decode side for the
    # blocks it received), so a KV router sees the prompt on both.
    time.sleep(0.2)
    prompt_blocks = prompt_tokens // 16
    assert len(stored["prefill"]) >= prompt_blocks, stored
    assert stored["prefill"][:prompt_blocks] == stored["decode"][:prompt_blocks], stored
    # Read and released, the prefill's blocks stay cached, as in vLLM: no BlockRemoved yet.
    first_prompt = stored["prefill"][:prompt_blocks]
    assert not set(first_prompt) & set(removed), "freed blocks stay cached until evicted"

    # Streamed chat and non-streamed completions through the same flow.
    chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_completion_tokens": 12,
            "stream": True, "stream_options": {"include_usage": True}}
    out, _, _, _ = proxy(http, prefill, decode, "/v1/chat/completions", chat)
    assert out["usage"]["completion_tokens"] == 12, out
    plain = {"model": MODEL, "prompt": prompt + " again", "max_tokens": 8}
    out, _, _, _ = proxy(http, prefill, decode, "/v1/completions", plain)
    assert out["usage"]["completion_tokens"] == 8 and out["choices"][0]["finish_reason"] == "length", out

    # A second read of the same blocks finds nothing: the decode side recomputes the prompt.
    before = metric(decode, "mocker:kv_transfer_recomputes_total")
    again = {"model": MODEL, "prompt": ids, "max_tokens": 4, "kv_transfer_params": params}
    r = http.post(f"{decode}/v1/completions", json=again)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    assert metric(decode, "mocker:kv_transfer_recomputes_total") == before + 1
    # An engine id the prefill server does not have is the client's mistake: a 400.
    r = http.post(f"{decode}/v1/completions", json=dict(again, kv_transfer_params=dict(params, remote_engine_id="x")))
    assert r.status_code == 400 and "remote_engine_id" in r.json()["error"]["message"], r.text
    # An unreachable prefill server falls back to a local prefill.
    gone = dict(params, remote_port=1, remote_request_id="nobody")
    r = http.post(f"{decode}/v1/completions", json=dict(again, kv_transfer_params=gone))
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt_tokens, r.text
    assert metric(decode, "mocker:kv_transfer_recomputes_total") == before + 2

    # A prefill nobody reads is freed after the abort timeout (2 s here).
    p = {"model": MODEL, "prompt": "never decoded " * 40, "max_tokens": 1,
         "kv_transfer_params": {"do_remote_decode": True}}
    assert http.post(f"{prefill}/v1/completions", json=p).status_code == 200
    assert metric(prefill, "vllm:kv_cache_usage_perc") > 0
    deadline = time.time() + 10
    while metric(prefill, "vllm:kv_cache_usage_perc") > 0 and time.time() < deadline:
        time.sleep(0.2)
    assert metric(prefill, "vllm:kv_cache_usage_perc") == 0.0, "the abort timeout freed the held blocks"

    # Malformed params are a 400 naming the field, before anything runs.
    for bad in [{"do_remote_prefill": True, "remote_block_ids": "1,2", "remote_engine_id": "e",
                 "remote_host": "h", "remote_port": 1},
                {"do_remote_prefill": True, "remote_block_ids": [1], "remote_engine_id": "e", "remote_host": "h"},
                {"do_remote_decode": "yes"}, [1]]:
        r = http.post(f"{decode}/v1/completions", json={"model": MODEL, "prompt": "x", "kv_transfer_params": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params", (bad, r.text)

    # A streamed prefill: its params come in a last chunk with no choices, before usage.
    streamed = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": True,
                "stream_options": {"include_usage": True}, "kv_transfer_params": {"do_remote_decode": True}}
    frames = []
    with http.stream("POST", f"{prefill}/v1/completions", json=streamed) as r:
        assert r.status_code == 200, r.read()
        frames = [json.loads(l[6:]) for l in r.iter_lines() if l.startswith("data: {")]
    kv = [f for f in frames if "kv_transfer_params" in f]
    assert len(kv) == 1 and kv[0]["choices"] == [] and frames[-1].get("usage"), frames
    assert frames.index(kv[0]) == len(frames) - 2, frames
    params = kv[0]["kv_transfer_params"]
    r = http.post(f"{decode}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 3,
                                                   "kv_transfer_params": params})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == r.json()["usage"]["prompt_tokens"], r.text

    # A client that leaves during the transfer cancels the decode: its reserved blocks are
    # freed, and the prefill side frees its held blocks once the transfer it started ends.
    leaving = {"model": MODEL, "prompt": list(range(3000, 3160)), "max_tokens": 8}
    p = dict(leaving, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    r = http.post(f"{prefill}/v1/completions", json=p)
    assert r.status_code == 200, r.text
    d = dict(leaving, stream=True, kv_transfer_params=r.json()["kv_transfer_params"])
    finished_before = metric(decode, "vllm:request_success_total", finished_reason="length")
    try:
        # The transfer takes 419 ms: this client gives up long before its first token.
        with httpx.stream("POST", f"{decode}/v1/completions", json=d, timeout=0.15,
                          headers={"Authorization": f"Bearer {key}"}) as r:
            for _ in r.iter_lines():
                raise AssertionError("no token can come before the transfer ends")
    except httpx.TimeoutException:
        pass
    assert metric(prefill, "vllm:kv_cache_usage_perc") > 0, "the transfer is still under way"
    deadline = time.time() + 5
    while time.time() < deadline and (metric(decode, "vllm:kv_cache_usage_perc") > 0
                                      or metric(prefill, "vllm:kv_cache_usage_perc") > 0):
        time.sleep(0.05)
    assert metric(decode, "vllm:kv_cache_usage_perc") == 0.0, "the disconnect freed the decode's reservation"
    assert metric(prefill, "vllm:kv_cache_usage_perc") == 0.0, "the prefill's blocks were freed"
    time.sleep(0.3)
    assert metric(decode, "vllm:request_success_total", finished_reason="length") == finished_before, \
        "the decode was cancelled, not run"

    for base in (prefill, decode):
        assert metric(base, "vllm:num_requests_running") == 0 and metric(base, "vllm:num_requests_waiting") == 0

    # New prompts evict the first prompt's cached blocks: the prefill side publishes
    # BlockRemoved for them (its pool is 40 blocks).
    for i in range(4):
        filler = {"model": MODEL, "prompt": list(range(10000 + 200 * i, 10000 + 200 * i + 192)), "max_tokens": 1}
        assert http.post(f"{prefill}/v1/completions", json=filler).status_code == 200
    deadline = time.time() + 5
    while time.time() < deadline and not set(first_prompt) <= set(removed):
        time.sleep(0.05)
    assert set(first_prompt) <= set(removed), "evicting the first prompt's blocks published BlockRemoved"
    stop.set()
    for t in subs:
        t.join()
    print(json.dumps({"ok": True, "prompt_tokens": prompt_tokens, "ttft_ms": round(ttft_ms, 3),
                      "modelled_ms": modelled_ms}))


if __name__ == "__main__":
    main()
