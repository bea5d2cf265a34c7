"""Checks `mocker serve --kv-events-endpoint` against Dynamo's standalone KV indexer (a real
subscriber of vLLM-format ZMQ KV events). Not part of CI: it needs the reference wheel.

    cargo build --release -p mocker
    /work/refvenv/bin/python tests/python/indexer_check_serve.py target/release/mocker

Sends completions (token-id prompts) to the server, then asks the indexer for each prompt's
overlap: it must equal the cached full blocks the server reported on a repeat of the prompt
(usage.prompt_tokens_details.cached_tokens), in tokens.
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


def main():
    mocker = sys.argv[1]
    http_port, pub_port = free_port(), free_port()
    server = subprocess.Popen([mocker, "serve", "--port", str(http_port), "--block-size", str(BLOCK),
                               "--num-gpu-blocks", "40", "--speedup-ratio", "100",
                               "--kv-events-endpoint", f"tcp://127.0.0.1:{pub_port}"],
                              stderr=subprocess.DEVNULL)
    procs = [server]
    try:
        time.sleep(1.0)
        idx, idx_port = start_indexer(BLOCK, pub_port)
        procs.append(idx)
        time.sleep(1.5)
        shared = list(range(500, 564))
        prompts = [shared + list(range(1, 37)), shared + list(range(40, 90)), list(range(2000, 2300))]
        checks = []
        for p in prompts:
            complete(http_port, p, 8)
            time.sleep(0.5)
            indexed = longest(score(idx_port, p))
            cached = complete(http_port, p, 1)["prompt_tokens_details"]["cached_tokens"]
            checks.append({"prompt_len": len(p), "server_cached_tokens_on_repeat": cached,
                           "indexer_matched_tokens": indexed})
        # The 300-token prompt evicted blocks of the first ones (40-block pool): the indexer
        # must have applied the removals too.
        time.sleep(0.5)
        after = [{"prompt_len": len(p), "indexer_matched_tokens": longest(score(idx_port, p))} for p in prompts[:2]]
        ok = all(c["server_cached_tokens_on_repeat"] == c["indexer_matched_tokens"] for c in checks)
        print(json.dumps({"checks": checks, "after_eviction": after, "ok": ok}, indent=1))
        return 0 if ok else 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
