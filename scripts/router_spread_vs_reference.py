#!/usr/bin/env python3
"""Compare the KV router's run-to-run spread on the reference (ai-dynamo-runtime 1.6.1) with
mocker's seed-to-seed spread, on synthetic high-concurrency workloads.

Usage: python3 scripts/router_spread_vs_reference.py [--mocker target/release/mocker]
           [--ref-runs 12] [--seeds 1-16] [--workload NAME ...] [--list]
Needs `pip install ai-dynamo-runtime==1.6.1` in the Python that runs it. Not part of CI.

The reference breaks routing-cost ties with an unseeded RNG, so each of its runs is one draw;
mocker breaks them with the router seed, so each seed is one draw. Two or three reference runs
say little: on the `heavy` workload single runs range from about 80 to 105 ms mean TTFT, about
half of them between 80 and 85 and a few far above, so a handful of runs can look ten times
tighter than the distribution really is. Use a dozen runs or more before reading a bias into the means.

For each workload it prints, for both simulators, the mean, median and standard deviation of
the runs' mean TTFT, their range, and the mean simulated duration; then mocker's mean over the
reference's, and its standard deviation over the reference's (the targets: within 2% and at
most 3x). Each reference run is its own process (its runtime threads outlive a call).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ENGINE = {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192}

# name: (input tokens, output tokens, requests, concurrency, shared prefix ratio, groups, workers)
WORKLOADS = {
    "heavy": (2000, 200, 20000, 256, 0.5, 16, 4),
    "long": (4000, 300, 5000, 128, 0.7, 8, 3),
    "wide": (1000, 100, 20000, 512, 0.3, 32, 8),
    "short": (2000, 200, 3000, 256, 0.5, 16, 4),
}
KEYS = ("mean_ttft_ms", "duration_ms")

REF_SNIPPET = """
import json, sys
import dynamo._core as c
isl, osl, n, conc, ratio, groups, workers = json.loads(sys.argv[1])
r = c.run_mocker_synthetic_trace_replay(isl, osl, n, extra_engine_args={"engine": json.loads(sys.argv[2])},
        num_workers=workers, replay_mode="offline", replay_concurrency=conc, router_mode="kv_router",
        shared_prefix_ratio=ratio, num_prefix_groups=groups)
print(json.dumps(r.summary))
"""


def run_reference(spec):
    out = subprocess.check_output([sys.executable, "-c", REF_SNIPPET, json.dumps(spec), json.dumps(ENGINE)],
                                  stderr=subprocess.DEVNULL)
    return json.loads(out.decode().strip().splitlines()[-1])


def run_mocker(binary, spec, seed):
    isl, osl, n, conc, ratio, groups, workers = spec
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        subprocess.check_call(
            [binary, "replay", "--input-tokens", str(isl), "--output-tokens", str(osl),
             "--request-count", str(n), "--concurrency", str(conc), "--shared-prefix-ratio", str(ratio),
             "--num-prefix-groups", str(groups), "--num-workers", str(workers), "--router", "kv",
             "--router-config", json.dumps({"seed": seed}), "--engine-args", json.dumps(ENGINE),
             "--report-json", report], stdout=subprocess.DEVNULL)
        with open(report) as f:
            return json.load(f)


def describe(name, runs):
    ttft = [r["mean_ttft_ms"] for r in runs]
    dur = [r["duration_ms"] / 1e3 for r in runs]
    mean, sd = statistics.mean(ttft), statistics.stdev(ttft)
    print(f"  {name:<10} n={len(ttft):<3} mean {mean:8.2f}  median {statistics.median(ttft):8.2f}  "
          f"sd {sd:6.2f} ({sd / mean * 100:4.1f}%)  range {min(ttft):7.2f}..{max(ttft):<7.2f}  "
          f"duration {statistics.mean(dur):8.1f} s ({min(dur):.1f}..{max(dur):.1f})")
    return mean, sd


def seeds(text):
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mocker", default="target/release/mocker")
    ap.add_argument("--ref-runs", type=int, default=12)
    ap.add_argument("--seeds", default="1-16", help="mocker router seeds: 1-16 or 1,2,3")
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS),
                    help="repeatable; default heavy and long")
    ap.add_argument("--list", action="store_true", help="print the workloads and exit")
    args = ap.parse_args()
    if args.list:
        for k, v in WORKLOADS.items():
            print(k, dict(zip(["isl", "osl", "requests", "concurrency", "prefix_ratio", "groups", "workers"], v)))
        return
    if args.ref_runs < 2 or len(seeds(args.seeds)) < 2:
        sys.exit("need at least 2 reference runs and 2 seeds for a spread")
    for name in args.workload or ["heavy", "long"]:
        spec = WORKLOADS[name]
        print(f"{name}: isl {spec[0]} osl {spec[1]} requests {spec[2]} concurrency {spec[3]} "
              f"prefix {spec[4]} x {spec[5]} groups, {spec[6]} workers, kv router")
        ref = [run_reference(spec) for _ in range(args.ref_runs)]
        mock = [run_mocker(args.mocker, spec, s) for s in seeds(args.seeds)]
        rm, rs = describe("reference", ref)
        mm, ms = describe("mocker", mock)
        print(f"  mocker/reference: mean {mm / rm:.4f} (target within 2%), sd {ms / rs:.2f}x (target <= 3x)")


if __name__ == "__main__":
    main()
