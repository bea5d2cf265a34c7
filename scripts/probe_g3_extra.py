#!/usr/bin/env python3
"""More g3_offload cases run against the reference (ai-dynamo-runtime 1.6.1), on the deep
workload of probe_hybrid_reference.py (its rows are crates/mocker-replay/tests/data/
hybrid_deep.jsonl): several workers with a binding cluster_shared cap, small worker_local
pools with a first-byte latency, a host tier too small for any store cohort, and the KV
router. Writes tests/fixtures/g3_extra_reference.json; see docs/hybrid-kv.md §3.3.

Run with the reference's Python: /path/to/venv/bin/python scripts/probe_g3_extra.py
"""
import json
import os

from dynamo import _core as c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = os.path.join(ROOT, "crates/mocker-replay/tests/data/hybrid_deep.jsonl")
OUT = os.path.join(ROOT, "tests/fixtures/g3_extra_reference.json")
KEEP = ["num_requests", "completed_requests", "total_input_tokens", "total_output_tokens",
        "committed_prefill_tokens", "duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
        "p99_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms", "prefix_cache_reused_ratio",
        "first_admission_prefix_cache_reused_ratio", "g3_offload"]
BASE = {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 1024, "num_gpu_blocks": 96,
        "kv_cache_bytes_per_token": 1024, "native_host_offload": {"num_host_blocks": 64}}


def g3(**kw):
    return dict(BASE, g3_offload=kw)


CASES = {
    "X1_kv_router_shared_2w": (g3(scope="cluster_shared", num_g3_blocks=4096), 2, "kv_router"),
    "X2_shared_cap_3w": (g3(scope="cluster_shared", num_g3_blocks=4096, read_bandwidth_gbps=1.0,
                            write_bandwidth_gbps=1.0, shared_read_bandwidth_gbps=0.05,
                            shared_write_bandwidth_gbps=0.05), 3, "round_robin"),
    "X3_local_small_3w": (g3(scope="worker_local", num_g3_blocks=200, latency_to_first_byte_ms=2.0),
                          3, "round_robin"),
    "X4_tiny_host": (dict(g3(scope="worker_local", num_g3_blocks=4096),
                          native_host_offload={"num_host_blocks": 8}), 1, "round_robin"),
    "X5_kv_router_local_2w": (g3(scope="worker_local", num_g3_blocks=4096), 2, "kv_router"),
    "X6_kv_router_host_only_2w": (dict(BASE), 2, "kv_router"),
}


def bypass_rows():
    """A 24-block prefix written through a 16- or 20-block host tier in 8-block chunks, flushed
    by six other prompts, then asked for again: promoting it back evicts its own blocks, so
    the request thrashes until the 1024-round bound makes it compute."""
    pre = list(range(100, 124))
    rows = [{"timestamp": 0, "input_length": 416, "output_length": 2, "hash_ids": pre + [1, 2]}]
    for i in range(6):
        rows.append({"timestamp": 1000 * (i + 1), "input_length": 416, "output_length": 2,
                     "hash_ids": list(range(1000 + 100 * i, 1026 + 100 * i))})
    rows.append({"timestamp": 10000, "input_length": 416, "output_length": 2, "hash_ids": pre + [3, 4]})
    return rows


def bypass_engine(host):
    return {"block_size": 16, "max_num_seqs": 32, "max_num_batched_tokens": 128, "num_gpu_blocks": 48,
            "kv_cache_bytes_per_token": 1024, "native_host_offload": {"num_host_blocks": host},
            "g3_offload": {"scope": "worker_local", "num_g3_blocks": 4096},
            "timing_model": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}}


def main():
    out = {}
    rows = bypass_rows()
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "g3_bypass_rows.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for name, host in [("Y1_bypass_host16", 16), ("Y2_bypass_host20", 20)]:
        engine = bypass_engine(host)
        r = c.run_mocker_trace_replay([path], trace_block_size=16,
                                      extra_engine_args={"engine": engine, "dp_size": 1},
                                      num_workers=1, router_mode="round_robin", replay_mode="offline")
        s = r.summary
        out[name] = {"engine": engine, "replay": {"num_workers": 1, "router_mode": "round_robin"},
                     "workload": {"kind": "rows", "trace_format": "mooncake", "trace_block_size": 16,
                                  "rows": rows},
                     "result": {k: s[k] for k in KEEP if k in s}}
    for name, (engine, workers, router) in CASES.items():
        r = c.run_mocker_trace_replay([ROWS], trace_block_size=16,
                                      extra_engine_args={"engine": engine, "dp_size": 1},
                                      num_workers=workers, router_mode=router, replay_mode="offline")
        s = r.summary
        out[name] = {"engine": engine, "replay": {"num_workers": workers, "router_mode": router},
                     "result": {k: s[k] for k in KEEP if k in s}}
    with open(OUT, "w") as f:
        json.dump({"reference": "ai-dynamo-runtime==1.6.1", "generated_by": "scripts/probe_g3_extra.py",
                   "cases": out}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
