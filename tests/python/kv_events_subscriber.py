"""A vLLM-style KV event subscriber, used by mocker-kv-events' end-to-end test.

It declares the event structs the way vLLM does (msgspec, tag=True, array_like=True,
omit_defaults=True, same field order and types), subscribes to a PUB endpoint, recovers any
gap (including the slow-joiner gap at the start) through the ROUTER replay socket, then
replays an explicit range, and prints everything it decoded as one JSON object on stdout.

Protocol with the driver: prints "READY" once connected, then the JSON line; exits 0 on
success, 1 with a message on stderr otherwise.
"""

import argparse
import json
import sys
import time
from typing import Any

import msgspec
import zmq

# --- vLLM's declarations (vllm/distributed/kv_events.py, newest array_like generation) -----

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# --- The oldest vLLM declarations (five-field BlockStored, no rank): must still decode ------


class LegacyEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class LegacyBlockStored(LegacyEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class LegacyBlockRemoved(LegacyEvent, tag="BlockRemoved"):
    block_hashes: list[int]


class LegacyAllBlocksCleared(LegacyEvent, tag="AllBlocksCleared"):
    pass


class LegacyBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[LegacyBlockStored | LegacyBlockRemoved | LegacyAllBlocksCleared]


END_SEQ = -1


def event_json(e: Any) -> dict:
    def hashes(hs: list) -> list:
        for h in hs:
            if not isinstance(h, int):
                raise TypeError(f"block hash {h!r} is not an int")
        return list(hs)

    if isinstance(e, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": hashes(e.block_hashes),
            "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "lora_id": e.lora_id,
            "medium": e.medium,
            "lora_name": e.lora_name,
            "extra_keys": e.extra_keys,
            "group_idx": e.group_idx,
        }
    if isinstance(e, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": hashes(e.block_hashes),
            "medium": e.medium,
            "group_idx": e.group_idx,
        }
    return {"type": "AllBlocksCleared"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--replay-endpoint", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--expect", type=int, required=True, help="batches to collect (seq 0..N-1)")
    ap.add_argument("--replay-from", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(args.endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(args.replay_endpoint)
    deadline = time.monotonic() + args.timeout
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    legacy = msgspec.msgpack.Decoder(LegacyBatch)

    def remaining_ms() -> int:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out waiting for the publisher")
        return int(left * 1000) + 1

    def replay(start: int) -> tuple[list[tuple[int, bytes]], bool]:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            if not dealer.poll(remaining_ms()):
                raise TimeoutError("timed out waiting for replay")
            frames = dealer.recv_multipart()
            if len(frames) != 3 or frames[0] != b"":
                raise ValueError(f"bad replay frame count/delimiter: {frames!r}")
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END_SEQ:
                return out, frames[2] == b""
            out.append((seq, frames[2]))

    print("READY", flush=True)
    payloads: dict[int, bytes] = {}
    topics: set[bytes] = set()
    live_seqs: list[int] = []
    recovered_seqs: list[int] = []
    expected = 0
    while len(payloads) < args.expect:
        if not sub.poll(remaining_ms()):
            continue
        topic, seq_bytes, payload = sub.recv_multipart()
        topics.add(topic)
        seq = int.from_bytes(seq_bytes, "big")
        live_seqs.append(seq)
        if seq > expected:
            # Gap (at least the slow-joiner one): fetch what was missed, then go on live.
            got, _ = replay(expected)
            for s, p in got:
                if s < seq and s not in payloads:
                    payloads[s] = p
                    recovered_seqs.append(s)
        payloads[seq] = payload
        expected = max(expected, seq + 1)

    batches = []
    legacy_ok = True
    same_bytes = True
    for seq in sorted(payloads):
        b = decoder.decode(payloads[seq])
        # What vLLM's own encoder would send for these values, byte for byte.
        same_bytes &= msgspec.msgpack.encode(b) == payloads[seq]
        old = legacy.decode(payloads[seq])
        legacy_ok &= len(old.events) == len(b.events) and abs(old.ts - b.ts) < 1e-9
        batches.append(
            {"seq": seq, "ts": b.ts, "dp_rank": b.data_parallel_rank, "events": [event_json(e) for e in b.events]}
        )

    replayed, end_marker_empty = replay(args.replay_from)
    result = {
        "topics": sorted(t.decode() for t in topics),
        "live_seqs": live_seqs,
        "recovered_seqs": recovered_seqs,
        "batches": batches,
        "legacy_decode_ok": legacy_ok,
        "reencoded_bytes_identical": same_bytes,
        "replay": {
            "from": args.replay_from,
            "seqs": [s for s, _ in replayed],
            "end_marker_payload_empty": end_marker_empty,
            "payloads_match_live": all(payloads.get(s) == p for s, p in replayed),
        },
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # report to the driver instead of a bare traceback
        print(f"kv_events_subscriber: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
