"""Checks mocker's KV events against Dynamo's standalone KV indexer (the reference's real
subscriber of vLLM-format ZMQ events). Not part of CI: it needs the reference wheel.

    cargo build -p mocker-kv-events --example publish_engine_events
    /work/refvenv/bin/python tests/python/indexer_check.py target/debug/examples/publish_engine_events

Runs one request (prompt of PROMPT_LEN tokens) through a real mocker engine publishing on a
PUB socket that the indexer subscribes to, then asks the indexer's HTTP `/query` for the
overlap of (a) the same prompt, (b) the prompt's first half, (c) a prompt that diverges after
two blocks, and (d) an indexer with another block size. Prints a JSON report; exits 1 if an
expectation fails.
"""

import json
import socket
import subprocess
import sys
import time
import urllib.request

BLOCK_SIZE = 16
# Phase 1: one request, large pool (nothing evicted). Phase 2: two distinct requests in a
# pool too small for both, so the second evicts part of the first (BlockRemoved). Phase 3: a
# request, a prefix-cache reset (AllBlocksCleared), then the same prompt again.
PHASES = [
    {"num_gpu_blocks": 1000, "steps": "100:40"},
    {"num_gpu_blocks": 12, "steps": "100:40,100:40"},
    {"num_gpu_blocks": 1000, "steps": "100:40,reset,100:40:0"},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port: int, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read() or b"null")


def start_indexer(block_size: int, pub_port: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dynamo.indexer", "--block-size", str(block_size), "--port", str(port),
         "--threads", "1", "--workers", f"1=tcp://127.0.0.1:{pub_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            http(port, "/workers")
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("indexer did not start")


def score(port: int, tokens: list[int]):
    return http(port, "/query", {"token_ids": tokens, "model_name": "default"})


def longest(resp) -> int:
    inst = resp.get("instances", {}).get("1")
    return inst["longest_matched"] if inst else 0


def run_phase(example: str, phase: dict) -> dict:
    pub_port = free_port()
    pub = subprocess.Popen(
        [example, f"tcp://127.0.0.1:{pub_port}", str(BLOCK_SIZE), str(phase["num_gpu_blocks"]), phase["steps"]],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    procs = [pub]
    try:
        bound = pub.stdout.readline().strip()
        assert bound.startswith("BOUND "), bound
        idx, idx_port = start_indexer(BLOCK_SIZE, pub_port)
        other, other_port = start_indexer(BLOCK_SIZE * 2, pub_port)
        procs += [idx, other]
        time.sleep(1.5)  # let both SUB sockets connect and subscribe before anything is sent
        steps = []
        for step in phase["steps"].split(","):
            pub.stdin.write("next\n")
            pub.stdin.flush()
            run = json.loads(pub.stdout.readline())
            time.sleep(0.5)  # let the indexer apply the events
            checks = []
            for seq, cached in zip(run["sequences"], run["cached_leading_blocks"]):
                got = longest(score(idx_port, seq))
                first3 = longest(score(idx_port, seq[: 3 * BLOCK_SIZE]))
                diverged = longest(score(idx_port, seq[: 2 * BLOCK_SIZE] + [7] * (len(seq) - 2 * BLOCK_SIZE)))
                other_bs = longest(score(other_port, seq))
                checks.append({
                    "engine_cached_leading_blocks": cached,
                    "indexer_matched_tokens": got,
                    "first3_blocks": first3,
                    "diverged_after_2": diverged,
                    "other_block_size_indexer": other_bs,
                    "ok": got == cached * BLOCK_SIZE
                    and first3 == min(cached, 3) * BLOCK_SIZE
                    and diverged == min(cached, 2) * BLOCK_SIZE
                    and other_bs == 0,
                })
            steps.append({"step": step, "published_batches": run["batches"], "requests": checks})
        return {"num_gpu_blocks": phase["num_gpu_blocks"], "steps": steps}
    finally:
        try:
            pub.stdin.write("bye\n")
            pub.stdin.flush()
        except OSError:
            pass
        time.sleep(0.2)
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=5)


def main() -> int:
    report = [run_phase(sys.argv[1], phase) for phase in PHASES]
    print(json.dumps(report, indent=1))
    return 0 if all(r["ok"] for p in report for s in p["steps"] for r in s["requests"]) else 1


if __name__ == "__main__":
    sys.exit(main())
