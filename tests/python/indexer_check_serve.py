"""Checks `mocker serve --kv-events-endpoint` against Dynamo's standalone KV indexer (a real
subscriber of vLLM-format ZMQ KV events). Run by crates/mocker/tests/serve_indexer.rs when
MOCKER_DYNAMO_PYTHON names a Python with ai-dynamo-runtime==1.6.1 (.ci/run installs it); by hand:

    cargo build --release -p mocker
    PYTHON_WITH_DYNAMO tests/python/indexer_check_serve.py target/release/mocker [--pd]

Sends completions (token-id prompts) to the server, then asks the indexer for each prompt's
overlap: it must equal the cached full blocks the server reported on a repeat of the prompt
(usage.prompt_tokens_details.cached_tokens), in tokens.

With `--pd` it runs the same check on both sides of a disaggregated pair: a prefill and a
decode server (`--kv-transfer-config` kv_both, each with its own indexer), each prompt sent
as vLLM's P/D proxy does (prefill with `do_remote_decode`, then decode with the returned
`kv_transfer_params`). Each side's indexer must match what that side reports cached.
"""

import json
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from indexer_check import free_port, longest, score, start_indexer  # noqa: E402

BLOCK = 16


def complete(port, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["usage"]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def start_server(mocker, http_port, pub_port, extra=()):
    return subprocess.Popen([mocker, "serve", "--port", str(http_port), "--block-size", str(BLOCK),
                             "--num-gpu-blocks", "40", "--speedup-ratio", "100",
                             "--kv-events-endpoint", f"tcp://127.0.0.1:{pub_port}", *extra],
                            stderr=subprocess.DEVNULL)


# Two prompts sharing a 64-token prefix, then one long enough to evict from a 40-block pool.
SHARED = list(range(500, 564))
PROMPTS = [SHARED + list(range(1, 37)), SHARED + list(range(40, 90)), list(range(2000, 2300))]


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)


def main_pd(mocker):
    both = ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    sides = {name: (free_port(), free_port()) for name in ("prefill", "decode")}
    procs = [start_server(mocker, h, z, both) for h, z in sides.values()]
    try:
        time.sleep(1.0)
        indexers = {}
        for name, (_, pub_port) in sides.items():
            idx, idx_port = start_indexer(BLOCK, pub_port)
            procs.append(idx)
            indexers[name] = idx_port
        time.sleep(1.5)
        (p_http, _), (d_http, _) = sides["prefill"], sides["decode"]
        checks = []
        for p in PROMPTS:
            first = post(p_http, {"prompt": p, "max_tokens": 1, "kv_transfer_params": {
                "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}})
            params = first["kv_transfer_params"]
            decoded = post(d_http, {"prompt": p, "max_tokens": 8, "kv_transfer_params": params})
            assert decoded["usage"]["completion_tokens"] == 8, decoded["usage"]
            time.sleep(0.5)
            for name, (port, _) in sides.items():
                indexed = longest(score(indexers[name], p))
                cached = complete(port, p, 1)["prompt_tokens_details"]["cached_tokens"]
                checks.append({"side": name, "prompt_len": len(p), "server_cached_tokens_on_repeat": cached,
                               "indexer_matched_tokens": indexed})
        ok = all(c["server_cached_tokens_on_repeat"] == c["indexer_matched_tokens"] for c in checks)
        # The check means something only if each side cached something.
        ok &= all(any(c["side"] == n and c["indexer_matched_tokens"] > 0 for c in checks) for n in sides)
        print(json.dumps({"checks": checks, "ok": ok}, indent=1))
        return 0 if ok else 1
    finally:
        stop(procs)


def main():
    mocker = sys.argv[1]
    if "--pd" in sys.argv[2:]:
        return main_pd(mocker)
    http_port, pub_port = free_port(), free_port()
    procs = [start_server(mocker, http_port, pub_port)]
    try:
        time.sleep(1.0)
        idx, idx_port = start_indexer(BLOCK, pub_port)
        procs.append(idx)
        time.sleep(1.5)
        checks = []
        for p in PROMPTS:
            complete(http_port, p, 8)
            time.sleep(0.5)
            indexed = longest(score(idx_port, p))
            cached = complete(http_port, p, 1)["prompt_tokens_details"]["cached_tokens"]
            checks.append({"prompt_len": len(p), "server_cached_tokens_on_repeat": cached,
                           "indexer_matched_tokens": indexed})
        # The 300-token prompt evicted blocks of the first ones (40-block pool): the indexer
        # must have applied the removals too.
        time.sleep(0.5)
        after = [{"prompt_len": len(p), "indexer_matched_tokens": longest(score(idx_port, p))} for p in PROMPTS[:2]]
        ok = all(c["server_cached_tokens_on_repeat"] == c["indexer_matched_tokens"] for c in checks)
        print(json.dumps({"checks": checks, "after_eviction": after, "ok": ok}, indent=1))
        return 0 if ok else 1
    finally:
        stop(procs)


if __name__ == "__main__":
    sys.exit(main())
