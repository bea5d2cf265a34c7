"""Runtime control (`/admin/config`) and mixed fleets (`--worker-engine-args`) through httpx,
the openai SDK and prometheus_client's parser. Driven by crates/mocker/tests/serve_admin_fleet.rs;
prints one JSON line of results.

usage: serve_admin_fleet.py admin BASE_URL API_KEY
       serve_admin_fleet.py fleet API_KEY BASE_URL...
       serve_admin_fleet.py pd API_KEY FRONT_URL WORKER_URL...
"""

import json
import sys
import time

import os

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "mocker-test"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def samples(base, name):
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        if family.name == name:
            return family.samples
    raise AssertionError(f"no {name} family")


def gauge(base, name):
    (sample,) = samples(base, name)
    assert sample.labels["engine"] == "0", sample
    return sample.value


def changes(base, key):
    (value,) = [s.value for s in samples(base, "mocker:admin_config_changes")
                if s.name.endswith("_total") and s.labels["key"] == key]
    return value


def timed_stream(client, max_tokens):
    """Seconds to the first token and to the end of a streamed completion."""
    start = time.monotonic()
    first = None
    for _ in client.completions.create(
        model=MODEL, prompt="alpha beta gamma delta", max_tokens=max_tokens, stream=True,
        extra_body={"ignore_eos": True},
    ):
        first = first or time.monotonic() - start
    return first, time.monotonic() - start


def admin(base, key):
    auth = {"Authorization": f"Bearer {key}"}
    http = httpx.Client(headers=auth, timeout=60)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)

    # The key guards both methods.
    assert httpx.get(f"{base}/admin/config").status_code == 401
    assert httpx.post(f"{base}/admin/config", json={"speedup-ratio": 2}).status_code == 401
    config = http.get(f"{base}/admin/config").json()
    assert config["model"] == MODEL and config["speedup-ratio"] == 1 and config["block-size"] == 16, config
    assert config["failure-injection-rate"] == 0 and config["failure-types"] == [], config

    # Refusals name the key and change nothing.
    for body, named in [
        ({"block-size": 32}, "block-size"),
        ({"time-to-first-token": "10ms"}, "time-to-first-token"),
        ({"bogus": 1}, "bogus"),
        ({"speedup-ratio": -1}, "speedup-ratio"),
        ({"speedup-ratio": 4, "num-gpu-blocks": 8}, "num-gpu-blocks"),
    ]:
        r = http.post(f"{base}/admin/config", json=body)
        assert r.status_code == 400 and named in r.json()["error"]["message"], (body, r.text)
        assert r.json()["error"]["param"] == named, r.text
    assert http.post(f"{base}/admin/config", content=b"{nope").status_code == 400
    assert http.get(f"{base}/admin/config").json() == config

    # Speed: the same request at a twentieth and at twenty times the speed.
    r = http.post(f"{base}/admin/config", json={"speedup-ratio": 0.05})
    assert r.status_code == 200 and r.json()["speedup-ratio"] == 0.05, r.text
    _, slow = timed_stream(client, 12)
    assert gauge(base, "mocker:speedup_ratio") == 0.05
    http.post(f"{base}/admin/config", json={"speedup-ratio": 20}).raise_for_status()
    _, fast = timed_stream(client, 12)
    assert slow > 5 * fast, (slow, fast)
    assert changes(base, "speedup-ratio") == 2

    # The API server's latency: every request now waits at least that long before its first token.
    http.post(f"{base}/admin/config", json={"frontend-latency-ms": 8000}).raise_for_status()
    # 8 s of simulated API-server time at speed-up 20 is 0.4 s of wall time.
    ttft, _ = timed_stream(client, 2)
    assert ttft >= 0.4, ttft
    assert abs(gauge(base, "mocker:frontend_latency_seconds") - 8.0) < 1e-9
    http.post(f"{base}/admin/config", json={"frontend-latency-ms": 0}).raise_for_status()

    # Failure injection: every request fails with the chosen type, then none does.
    r = http.post(f"{base}/admin/config", json={"failure-injection-rate": 100, "failure-types": ["rate_limit"]})
    assert r.json()["failure-types"] == ["rate_limit"], r.text
    try:
        client.completions.create(model=MODEL, prompt="one", max_tokens=1)
        raise AssertionError("a 100% injection rate must fail the request")
    except openai.RateLimitError:
        pass
    assert gauge(base, "mocker:failure_injection_rate_percent") == 100
    http.post(f"{base}/admin/config", json={"failure-injection-rate": 0}).raise_for_status()
    done = client.completions.create(model=MODEL, prompt="one", max_tokens=1)
    assert done.usage.completion_tokens == 1
    assert changes(base, "failure-injection-rate") == 2 and changes(base, "failure-types") == 1
    return {"ok": True, "slow_s": slow, "fast_s": fast, "ttft_s": ttft}


def model_info(base, key):
    """gRPC GetModelInfo on the worker's HTTP port (stubs from the vendored proto)."""
    import grpc
    from serve_grpc import stubs

    pb, pb_grpc = stubs()
    with grpc.insecure_channel(base.removeprefix("http://")) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        return stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=[("authorization", f"Bearer {key}")])


def fleet(key, bases, complete=True):
    cards = []
    for base in bases:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        (card,) = client.models.list().data
        engine = card.model_extra["mocker_engine"]
        info = samples(base, "mocker:engine_info")
        assert len(info) == 1 and info[0].value == 1, info
        labels = info[0].labels
        for k in ["backend", "block_size", "num_gpu_blocks", "max_num_seqs"]:
            assert labels[k] == str(engine[k]), (k, labels, engine)
        config = httpx.get(f"{base}/admin/config", headers={"Authorization": f"Bearer {key}"}).json()
        assert config["num-gpu-blocks"] == engine["num_gpu_blocks"], (config, engine)
        if complete:
            done = client.completions.create(model=card.id, prompt="one two three", max_tokens=2)
            assert done.usage.completion_tokens == 2
        info = model_info(base, key) if engine["backend"] == "vllm" else None
        cards.append({"id": card.id, "engine": engine, "max_model_len": card.model_extra["max_model_len"],
                      "grpc_model_path": info.model_path if info else None,
                      "grpc_max_context_length": info.max_context_length if info else None})
    return {"ok": True, "cards": cards}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "admin":
        print(json.dumps(admin(sys.argv[2], sys.argv[3])))
    elif mode == "fleet":
        print(json.dumps(fleet(sys.argv[2], sys.argv[3:])))
    else:
        # pd KEY FRONT WORKERS...: the workers report themselves; requests go through the front.
        key, front = sys.argv[2], sys.argv[3]
        result = fleet(key, sys.argv[4:], complete=False)
        client = openai.OpenAI(base_url=f"{front}/v1", api_key=key, max_retries=0)
        for _ in range(3):
            done = client.completions.create(model=MODEL, prompt="one two three four", max_tokens=3)
            assert done.usage.completion_tokens == 3, done
        print(json.dumps(result))
