#!/usr/bin/env python3
"""Replay the public Mooncake traces on the reference (ai-dynamo-runtime 1.6.1) and on mocker,
side by side, and print wall times and headline metrics with reference/mocker ratios.

Usage: python3 scripts/trace_vs_reference.py [--mocker target/release/mocker]
           [--traces ../shared/traces] [--workers 8] [--runs 5] [--router kv,round-robin]
           [--disagg 3:5] [--mocker-runs 3]
With --disagg P:D both simulators replay a disaggregated cluster instead: P prefill and D
decode workers, the prefill side transferring 128 KiB per token at 64 GB/s.
Needs `pip install ai-dynamo-runtime==1.6.1` in the Python that runs it. Not part of CI.
The reference's kv_router is not deterministic, so it runs `--runs` times and its spread
(min..max) is printed beside mocker's figure (mocker is deterministic: its metrics are the same on
every run). Wall times on this kind of shared VM drift by tens of percent from run to run, so both
simulators run `--runs` times, interleaved (mocker `--mocker-runs` times after each reference run:
its runs are a tenth as long, so one slow spell moves a median of few of them far more), and two
speedups are printed: the ratio of the median wall times, and a conservative "worst" one, the
fastest reference run over the slowest mocker run.
Both are the simulators' own `wall_time_ms` (the replay itself); "process" is the ratio of median
whole-process times (start-up, trace loading and report included), what `time` shows a user, and
"vs call" sets the reference's median call (`wall_time_ms`) against mocker's median whole process.
Each simulator runs in its own process (the reference's runtime threads slow a child process down
if it is started from the same one).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ENGINE = {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192}
HEADLINE = ["duration_ms", "mean_ttft_ms", "mean_itl_ms", "prefix_cache_reused_ratio"]
REF_ROUTER = {"kv": "kv_router", "round-robin": "round_robin"}

TRANSFER = {"kv_transfer_bytes_per_token": 131072, "kv_transfer_bandwidth": 64}

REF_SNIPPET = """
import json, sys
import dynamo._core as c
path, workers, router, engine = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
if ":" in workers:
    p, d = (int(x) for x in workers.split(":"))
    pre = dict(engine, worker_type="prefill", **json.loads(sys.argv[5]))
    dec = dict(engine, worker_type="decode")
    r = c.run_mocker_trace_replay([path], prefill_engine_args={"engine": pre},
            decode_engine_args={"engine": dec}, num_prefill_workers=p, num_decode_workers=d,
            trace_block_size=512, router_mode=router)
else:
    r = c.run_mocker_trace_replay([path], extra_engine_args={"engine": engine},
            trace_block_size=512, num_workers=int(workers), router_mode=router)
print(json.dumps(r.summary))
"""


def run_reference(trace, workers, router):
    # Its per-request INFO log goes to stderr; discarding it keeps the terminal out of its time.
    t = time.perf_counter()
    out = subprocess.check_output(
        [sys.executable, "-c", REF_SNIPPET, trace, str(workers), REF_ROUTER[router], json.dumps(ENGINE),
         json.dumps(TRANSFER)],
        stderr=subprocess.DEVNULL)
    summary = json.loads(out.decode().strip().splitlines()[-1])
    summary["process_s"] = time.perf_counter() - t
    return summary


def run_mocker(binary, trace, workers, router):
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        if ":" in str(workers):
            p, d = str(workers).split(":")
            pools = ["--num-prefill-workers", p, "--num-decode-workers", d,
                     "--prefill-engine-args", json.dumps(dict(ENGINE, worker_type="prefill", **TRANSFER)),
                     "--decode-engine-args", json.dumps(dict(ENGINE, worker_type="decode"))]
        else:
            pools = ["--num-workers", str(workers), "--engine-args", json.dumps(ENGINE)]
        t = time.perf_counter()
        subprocess.check_call(
            [binary, "replay", trace, "--trace-format", "mooncake", "--trace-block-size", "512",
             "--router", router, *pools, "--report-json", report], stdout=subprocess.DEVNULL)
        elapsed = time.perf_counter() - t
        with open(report) as f:
            summary = json.load(f)
        summary["process_s"] = elapsed
        return summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mocker", default="target/release/mocker")
    ap.add_argument("--traces", default="../shared/traces")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--runs", "--ref-runs", dest="ref_runs", type=int, default=5)
    ap.add_argument("--router", default="kv,round-robin")
    ap.add_argument("--disagg", help="P:D prefill and decode workers instead of --workers")
    ap.add_argument("--mocker-runs", type=int, default=3, help="mocker runs after each reference run")
    args = ap.parse_args()
    if args.mocker_runs < 1:
        ap.error(f"--mocker-runs: must be at least 1 (got {args.mocker_runs})")
    if args.disagg:
        args.workers = args.disagg
    traces = sorted(f for f in os.listdir(args.traces) if f.endswith(".jsonl"))
    print(f"{'trace':<34} {'router':<12} {'ref s (min..max)':>18} {'mocker s (min..max)':>14} "
          f"{'median':>7} {'worst':>6} {'process':>8} {'vs call':>8}  "
          + "  ".join(f"{k}: ref min..max / mocker" for k in HEADLINE))
    for name in traces:
        path = os.path.join(args.traces, name)
        for router in args.router.split(","):
            runs, mocker_runs = [], []
            for _ in range(args.ref_runs):
                runs.append(run_reference(path, args.workers, router))
                for _ in range(args.mocker_runs):
                    mocker_runs.append(run_mocker(args.mocker, path, args.workers, router))
            m = mocker_runs[0]
            walls = [r["wall_time_ms"] / 1e3 for r in runs]
            mwalls = [r["wall_time_ms"] / 1e3 for r in mocker_runs]
            cells = []
            for k in HEADLINE:
                vals = [r[k] for r in runs]
                cells.append(f"{k}: {min(vals):.4f}..{max(vals):.4f} / {m[k]:.4f}")
            median = statistics.median(walls) / statistics.median(mwalls)
            worst = min(walls) / max(mwalls)
            process = (statistics.median(r["process_s"] for r in runs)
                       / statistics.median(r["process_s"] for r in mocker_runs))
            vs_call = statistics.median(walls) / statistics.median(r["process_s"] for r in mocker_runs)
            print(f"{name:<34} {router:<12} {min(walls):>8.2f}..{max(walls):<8.2f} "
                  f"{min(mwalls):>6.3f}..{max(mwalls):<6.3f} {median:>6.1f}x {worst:>5.1f}x {process:>7.1f}x {vs_call:>7.1f}x  "
                  + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
