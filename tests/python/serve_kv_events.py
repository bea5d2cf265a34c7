"""KV events of a running `mocker serve`, as a vLLM-style subscriber sees them: pyzmq SUB and
DEALER sockets, msgspec structs declared as vLLM declares them (kv_events_subscriber.py).
Driven by crates/mocker/tests/serve_kv_events.rs, which checks the hashes against the core.

usage: serve_kv_events.py BASE_URL API_KEY PUB_ENDPOINT REPLAY_ENDPOINT
Prints one JSON object: the prompts sent, every batch in sequence order, the live and replayed
sequence numbers, and the result of an explicit replay range.
"""

import json
import os
import sys
import time

import httpx
import msgspec
import zmq

sys.path.insert(0, os.path.dirname(__file__))
from kv_events_subscriber import END_SEQ, KVEventBatch, event_json  # noqa: E402


def main():
    base, key, pub, router = sys.argv[1:5]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(pub)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(router)
    time.sleep(0.3)  # slow joiner; anything missed is recovered through replay below

    shared = list(range(100, 164))  # four full 16-token blocks
    prompts = [shared + [1, 2, 3, 4, 5, 6, 7, 8], shared + [9, 10, 11, 12, 13, 14, 15, 16, 17]]
    # Distinct prompts that overflow the 24-block pool, forcing evictions.
    prompts += [[1000 * k + i for i in range(150)] for k in range(1, 4)]
    cached = []
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for p in prompts:
            r = http.post(f"{base}/v1/completions", json={"model": "mocker-test", "prompt": p, "max_tokens": 3})
            r.raise_for_status()
            cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        http.post(f"{base}/reset_prefix_cache").raise_for_status()

    payloads, live = {}, []
    quiet_until = time.monotonic() + 1.0
    while time.monotonic() < quiet_until:
        if sub.poll(100):
            _topic, seq, payload = sub.recv_multipart()
            seq = int.from_bytes(seq, "big")
            live.append(seq)
            payloads[seq] = payload
            quiet_until = time.monotonic() + 0.5

    def replay(start):
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            if not dealer.poll(5000):
                raise TimeoutError("no replay answer")
            frames = dealer.recv_multipart()
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                return out, frames[2] == b""
            out.append((seq, frames[2]))

    recovered, _ = replay(0)
    for seq, payload in recovered:
        payloads.setdefault(seq, payload)
    last = max(payloads)
    tail, end_marker = replay(max(last - 2, 0))

    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    batches = []
    for seq in sorted(payloads):
        b = decoder.decode(payloads[seq])
        batches.append({"seq": seq, "dp_rank": b.data_parallel_rank, "events": [event_json(e) for e in b.events]})
    print(json.dumps({
        "prompts": prompts,
        "cached_tokens": cached,
        "batches": batches,
        "live_seqs": live,
        "replayed_seqs": [s for s, _ in recovered],
        "tail_seqs": [s for s, _ in tail],
        "tail_end_marker": end_marker,
        "tail_same_bytes": all(payloads[s] == p for s, p in tail),
    }), flush=True)


if __name__ == "__main__":
    main()
