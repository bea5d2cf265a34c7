#!/usr/bin/env python3
"""Run mocker's benchmark suite on the reference (ai-dynamo-runtime 1.6.1) and on mocker,
side by side in one run, and print reference/mocker ratios.

Usage: python3 scripts/bench_vs_reference.py [--mocker target/release/mocker] [--repeat 3]
Needs `pip install ai-dynamo-runtime==1.6.1` in the Python that runs it. Not part of CI.
Wall time is each simulator's own in-process measurement (`wall_time_ms`); the best of
`--repeat` runs is used for both.
"""
import argparse
import json
import subprocess
import sys

HEADLINE = ["duration_ms", "mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "prefix_cache_reused_ratio"]


REF_SNIPPET = """
import json, sys
import dynamo._core as ref
case, repeat = json.loads(sys.argv[1]), int(sys.argv[2])
best, summary = float("inf"), None
pools = case.get("pools")
if pools:
    transfer = {k: pools[k] for k in ("kv_transfer_bytes_per_token", "kv_transfer_bandwidth")}
    cluster = dict(prefill_engine_args={"engine": dict(case["engine"], worker_type="prefill", **transfer)},
                   decode_engine_args={"engine": dict(case["engine"], worker_type="decode")},
                   num_prefill_workers=pools["num_prefill_workers"],
                   num_decode_workers=pools["num_decode_workers"])
else:
    cluster = dict(extra_engine_args={"engine": case["engine"]}, num_workers=1)
for _ in range(repeat):
    r = ref.run_mocker_synthetic_trace_replay(
        case["input_tokens"], case["output_tokens"], case["request_count"],
        replay_mode="offline", **cluster,
        shared_prefix_ratio=case["shared_prefix_ratio"], num_prefix_groups=case["num_prefix_groups"],
        **case["load"])
    summary = r.summary
    best = min(best, summary["wall_time_ms"])
summary["wall_time_ms"] = best
print(json.dumps(summary))
"""


def run_reference(case, repeat):
    # A child process of its own: the reference's runtime threads outlive its calls and
    # would otherwise compete with everything that runs after them.
    out = subprocess.check_output([sys.executable, "-c", REF_SNIPPET, json.dumps(case), str(repeat)],
                                  stderr=subprocess.DEVNULL)
    return json.loads(out.decode().strip().splitlines()[-1])


def run_mocker(binary, name, repeat):
    out = subprocess.check_output([binary, "bench", "--json", "--repeat", str(repeat), "--filter", name])
    rows = [json.loads(line) for line in out.decode().splitlines()]
    return next(r for r in rows if r["name"] == name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mocker", default="target/release/mocker")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the two simulators this many times per workload (best of all)")
    ap.add_argument("--filter", default=None)
    args = ap.parse_args()
    extra = ["--filter", args.filter] if args.filter else []
    cases = json.loads(subprocess.check_output([args.mocker, "bench", "--list", *extra]))
    head = f"{'workload':<26} {'ref ms':>9} {'mocker ms':>9} {'speedup':>8} " + " ".join(
        f"{k.replace('_ms', '').replace('prefix_cache_reused_ratio', 'reuse'):>14}" for k in HEADLINE)
    print(head)
    worst = 0.0
    for case in cases:
        if case.get("launch"):
            print(f"{case['name']:<26} (mocker only: {json.dumps(case['launch'])} has no counterpart in the reference)")
            continue
        # Alternating keeps slow drift of a shared machine from favouring either side.
        r, m = None, None
        for _ in range(args.rounds):
            rr = run_reference(case, args.repeat)
            mm = run_mocker(args.mocker, case["name"], args.repeat)
            r = rr if r is None or rr["wall_time_ms"] < r["wall_time_ms"] else r
            m = mm if m is None or mm["wall_time_ms"] < m["wall_time_ms"] else m
        cells = []
        for k in HEADLINE:
            if r[k] == 0 and m[k] == 0:
                cells.append(f"{'=':>14}")
            else:
                ratio = r[k] / m[k] if m[k] else float("inf")
                worst = max(worst, abs(ratio - 1))
                cells.append(f"{ratio:>14.6f}")
        speed = r["wall_time_ms"] / m["wall_time_ms"]
        print(f"{case['name']:<26} {r['wall_time_ms']:>9.2f} {m['wall_time_ms']:>9.2f} {speed:>7.1f}x " + " ".join(cells),
              flush=True)
    print(f"metric ratios are reference/mocker; largest deviation from 1: {worst:.2e}")


if __name__ == "__main__":
    main()
