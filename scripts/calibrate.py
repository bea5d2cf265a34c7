#!/usr/bin/env python3
"""How close mocker's simulated times are to a measured vLLM run (docs/calibration.md).

Stdlib only; it drives the mocker binary. From the repository root:

    cargo build -p mocker && python3 scripts/calibrate.py --mocker target/debug/mocker

For each TP folder of the run (default calibration/aic-fpm-qwen3-32b-vllm, made from the
collector's output by scripts/calibration_import.py) it reports, as simulated vs measured:

- per-pass latency: every recorded forward pass priced by `mocker profiles predict` (the
  core's timing model, with the shapes vLLM's scheduler builds) against its measured
  latency, separately for context, decode and mixed passes; once over all passes and once
  without the passes the outlier rule below flags;
- per-request end-to-end latency: the run's "real" requests (their prompt and output
  lengths, in the order sent) replayed by `mocker replay` closed loop at the run's
  concurrency with the run's engine limits, against the end-to-end time the client logged.

Errors are relative, (simulated - measured) / measured: MAPE is the mean of |e|, bias the
mean of e; median and p90 are of |e|.

Outlier rule (uses measurements only, never mocker's predictions): a pass is flagged when
its latency is below 0.5x or above 1.5x the median latency of its peers, the passes of the
same kind and workload segment with context tokens within 2% (context and mixed passes),
or with the same decode batch and decode KV tokens within 10% (decode passes), when it has
at least 4 peers besides itself. It catches the collector booking two passes' time on one
(one pass far too short, its neighbour twice as long).

Nothing is fitted unless --fit-on-tp N is given: then the prefill and decode speedup ratios
are set to the median predicted/measured ratio of TP N's context and decode passes
(unflagged), and every TP is reported again with that correction; only the other TPs are
out of sample.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT / "calibration" / "aic-fpm-qwen3-32b-vllm"
KINDS = ("context", "decode", "mixed")
SHAPE = ("ctx_tokens", "ctx_requests", "ctx_kv_tokens", "decode_requests", "decode_kv_tokens")


class Failure(Exception):
    """A problem worth one line on stderr and exit code 2."""


def find_mocker(given: str | None) -> str:
    candidates = [given, os.environ.get("MOCKER_BIN"),
                  str(ROOT / "target" / "release" / "mocker"), str(ROOT / "target" / "debug" / "mocker")]
    for c in candidates:
        if c and Path(c).is_file():
            return c
    found = shutil.which("mocker")
    if given or not found:
        raise Failure(f"--mocker: no mocker binary at {given or 'target/{release,debug}/mocker or on PATH'}"
                      " (cargo build -p mocker)")
    return found


def run(cmd: list[str], stdin: str | None = None) -> str:
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if p.returncode != 0:
        raise Failure(f"{' '.join(cmd[:3])} ... exited {p.returncode}: {p.stderr.strip()}")
    return p.stdout


# --- statistics ---------------------------------------------------------------------------

def spread(errors: list[float]) -> dict:
    """MAPE, median and p90 of |e|, bias (mean e), in percent."""
    if not errors:
        return {"n": 0}
    a = sorted(abs(e) for e in errors)
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    return {"n": len(errors), "mape": 100 * statistics.fmean(a), "median": 100 * statistics.median(a),
            "p90": 100 * p90, "bias": 100 * statistics.fmean(errors)}


# --- passes -------------------------------------------------------------------------------

def read_passes(folder: Path) -> list[dict]:
    with gzip.open(folder / "passes.csv.gz", "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in SHAPE:
            r[k] = int(r[k])
        r["latency_ms"] = float(r["latency_ms"])
        if r["phase"] not in KINDS:
            raise Failure(f"{folder}/passes.csv.gz: phase {r['phase']!r} is not one of {', '.join(KINDS)}")
    return rows


def flag_outliers(rows: list[dict]) -> None:
    """Sets r["outlier"] by the rule in the module docstring."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["phase"] == "decode":
            key, size, tol = ("decode", r["workload_segment"], r["decode_requests"]), r["decode_kv_tokens"], 0.10
        else:
            key, size, tol = (r["phase"], r["workload_segment"]), r["ctx_tokens"], 0.02
        r["_size"], r["_tol"] = size, tol
        groups.setdefault(key, []).append(r)
    for members in groups.values():
        members.sort(key=lambda r: r["_size"])
        sizes = [r["_size"] for r in members]
        for r in members:
            lo = bisect.bisect_left(sizes, r["_size"] * (1 - r["_tol"]))
            hi = bisect.bisect_right(sizes, r["_size"] * (1 + r["_tol"]))
            peers = [m["latency_ms"] for m in members[lo:hi] if m is not r]
            r["outlier"] = False
            if len(peers) >= 4:
                r["peer_median_ms"] = statistics.median(peers)
                ratio = r["latency_ms"] / r["peer_median_ms"]
                r["outlier"] = ratio < 0.5 or ratio > 1.5


def predict(mocker: str, rows: list[dict], timing: list[str], engine_args: dict) -> list[float]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SHAPE)
    for r in rows:
        w.writerow([r[k] for k in SHAPE])
    out = run([mocker, "profiles", "predict", *timing,
               "--engine-args", json.dumps(engine_args)], stdin=buf.getvalue())
    preds = [float(row["pass_ms"]) for row in csv.DictReader(io.StringIO(out))]
    if len(preds) != len(rows):
        raise Failure(f"mocker profiles predict printed {len(preds)} rows for {len(rows)} passes")
    return preds


# --- requests -----------------------------------------------------------------------------

def read_requests(folder: Path) -> list[dict]:
    with open(folder / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["prompt_tokens"], r["max_tokens"] = int(r["prompt_tokens"]), int(r["max_tokens"])
        r["e2e_ms"] = float(r["elapsed_seconds"]) * 1000 if r["elapsed_seconds"] else None
    return rows


def replay(mocker: str, requests: list[dict], timing: list[str], engine_args: dict, concurrency: int,
           scratch: Path) -> list[float]:
    """Simulated E2E ms per request (in order). Prompts get unique hash ids: the run's prompts
    are random tokens, so no request shares a prefix with another."""
    block = engine_args.get("block_size", 16)
    trace, report = scratch / "trace.jsonl", scratch / "requests.jsonl"
    next_id = 0
    with open(trace, "w") as f:
        for r in requests:
            n = -(-r["prompt_tokens"] // block)
            f.write(json.dumps({"timestamp": 0, "input_length": r["prompt_tokens"],
                                "output_length": r["max_tokens"], "hash_ids": list(range(next_id, next_id + n))}))
            f.write("\n")
            next_id += n
    run([mocker, "replay", str(trace), "--trace-format", "mooncake", "--trace-block-size", str(block),
         "--concurrency", str(concurrency), *timing,
         "--engine-args", json.dumps(engine_args), "--report-jsonl", str(report),
         "--report-json", str(scratch / "summary.json")])
    e2e = [None] * len(requests)
    with open(report) as f:
        for line in f:
            rec = json.loads(line)
            i = int(rec["session_id"].rsplit("_", 1)[1]) - 1  # request_<line>, lines from 1
            if rec["status"] != "completed":
                raise Failure(f"request {requests[i]['request_index']} ended {rec['status']} in the replay")
            e2e[i] = rec["e2e_latency_ms"]
    if any(v is None for v in e2e):
        raise Failure("the replay did not report every request")
    return e2e


# --- one TP -------------------------------------------------------------------------------

def timing_args(run_cfg: dict, tp: int, architecture: bool) -> tuple[str, list[str]]:
    """The timing source's label and its mocker flags: the run's bundled profile at `tp`, or
    the model's architecture on the run's GPU."""
    if architecture:
        gpu = run_cfg.get("gpu", "b300")
        return (f"{run_cfg['model']} on {gpu} TP{tp}",
                ["--model", run_cfg["model"], "--gpu", gpu, "--tensor-parallel-size", str(tp)])
    profile = run_cfg["profile"].format(tp=tp)
    return profile, ["--timing-profile", profile]


def evaluate(mocker: str, folder: Path, tp: int, run_cfg: dict, engine_args: dict, scratch: Path,
             architecture: bool = False) -> dict:
    profile, timing = timing_args(run_cfg, tp, architecture)
    passes = read_passes(folder)
    flag_outliers(passes)
    preds = predict(mocker, passes, timing, engine_args)
    result: dict = {"tp": tp, "profile": profile, "passes": {}, "ratios": {}, "residuals": {},
                    "outliers": [(r, p) for r, p in zip(passes, preds) if r["outlier"]]}
    for kind in KINDS:
        pairs = [(p, r) for p, r in zip(preds, passes) if r["phase"] == kind]
        err = [(p - r["latency_ms"]) / r["latency_ms"] for p, r in pairs]
        kept = [(p - r["latency_ms"]) / r["latency_ms"] for p, r in pairs if not r["outlier"]]
        result["passes"][kind] = {
            "all": spread(err), "rule": spread(kept),
            "measured_mean": statistics.fmean(r["latency_ms"] for _, r in pairs) if pairs else 0.0,
            "simulated_mean": statistics.fmean(p for p, _ in pairs) if pairs else 0.0,
        }
        result["ratios"][kind] = [p / r["latency_ms"] for p, r in pairs if not r["outlier"]]
        result["residuals"][kind] = [r["latency_ms"] - p for p, r in pairs if not r["outlier"]]
    requests = [r for r in read_requests(folder) if r["e2e_ms"] is not None]
    sim = replay(mocker, requests, timing, engine_args, run_cfg["concurrency"], scratch)
    meas = [r["e2e_ms"] for r in requests]
    result["e2e_residuals"] = [m - s for s, m in zip(sim, meas)]
    result["e2e"] = spread([(s - m) / m for s, m in zip(sim, meas)])
    result["e2e"]["measured_mean"] = statistics.fmean(meas)
    result["e2e"]["simulated_mean"] = statistics.fmean(sim)
    result["failed_requests"] = len(read_requests(folder)) - len(requests)
    return result


# --- output -------------------------------------------------------------------------------

def fmt(s: dict) -> str:
    if not s.get("n"):
        return "       -"
    return f"{s['mape']:6.1f}% (median {s['median']:5.1f}%, p90 {s['p90']:5.1f}%, bias {s['bias']:+6.1f}%) n={s['n']}"


def print_results(title: str, results: list[dict], note: dict[int, str]) -> None:
    print(f"== {title}")
    print(f"{'tp':>3}  {'metric':<22} {'sim mean':>10} {'meas mean':>10}  MAPE")
    for res in results:
        tag = note.get(res["tp"], "")
        for kind in KINDS:
            k = res["passes"][kind]
            print(f"{res['tp']:>3}  {kind + ' pass':<22} {k['simulated_mean']:10.2f} {k['measured_mean']:10.2f}  "
                  f"{fmt(k['all'])}{tag}")
            if k["rule"]["n"] != k["all"]["n"]:
                print(f"{'':>3}  {'  w/o outliers':<22} {'':>10} {'':>10}  {fmt(k['rule'])}")
        e = res["e2e"]
        failed = f" ({res['failed_requests']} failed in the run, not replayed)" if res["failed_requests"] else ""
        print(f"{res['tp']:>3}  {'request e2e':<22} {e['simulated_mean']:10.1f} {e['measured_mean']:10.1f}  "
              f"{fmt(e)}{tag}{failed}")


def list_outliers(results: list[dict]) -> None:
    print("outliers: tp kind segment ctx_tokens/ctx_requests/ctx_kv_tokens decode_requests/decode_kv_tokens "
          "measured_ms peer_median_ms simulated_ms")
    for res in results:
        for r, p in res["outliers"]:
            print(f"outlier: {res['tp']} {r['phase']} {r['workload_segment']} "
                  f"{r['ctx_tokens']}/{r['ctx_requests']}/{r['ctx_kv_tokens']} "
                  f"{r['decode_requests']}/{r['decode_kv_tokens']} {r['latency_ms']:.3f} "
                  f"{r['peer_median_ms']:.3f} {p:.3f}")


def markdown(results: list[dict]) -> None:
    print("| TP | context pass | decode pass | mixed pass | mixed w/o outliers | request E2E |")
    print("|---|---|---|---|---|---|")
    for r in results:
        cell = lambda s: f"{s['mape']:.1f}% ({s['bias']:+.1f}%)" if s.get("n") else "-"  # noqa: E731
        p = r["passes"]
        print(f"| {r['tp']} | {cell(p['context']['all'])} | {cell(p['decode']['all'])} | "
              f"{cell(p['mixed']['all'])} | {cell(p['mixed']['rule'])} | {cell(r['e2e'])} |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="run directory (tp<N>/ folders, run.json)")
    ap.add_argument("--tp", type=int, nargs="*", help="TPs to report (default: every tp<N> folder)")
    ap.add_argument("--mocker", help="mocker binary (default: $MOCKER_BIN, target/release, target/debug, PATH)")
    ap.add_argument("--fit-on-tp", type=int, metavar="N",
                    help="also report with prefill/decode speedup ratios fitted on TP N's passes")
    ap.add_argument("--architecture", action="store_true",
                    help="time passes from the model's architecture on the run's GPU (--model, --gpu, --tp) "
                         "instead of the bundled profile")
    ap.add_argument("--no-overheads", action="store_true",
                    help="with --architecture: price the operations alone (pass_overhead_ms and "
                         "frontend_latency_ms 0) instead of mocker's defaults")
    ap.add_argument("--fit-overheads-on-tp", type=int, metavar="N",
                    help="with --architecture: fit pass_overhead_ms on TP N (median measured - predicted "
                         "decode pass, operations alone), then report every TP with it")
    ap.add_argument("--list-outliers", action="store_true", help="print every pass the outlier rule flags")
    ap.add_argument("--markdown", action="store_true", help="also print the summary as a Markdown table")
    args = ap.parse_args(argv)
    try:
        mocker = find_mocker(args.mocker)
        try:
            run_cfg = json.loads((args.data / "run.json").read_text())
        except (OSError, ValueError) as e:
            raise Failure(f"--data: cannot read {args.data / 'run.json'}: {e}")
        available = sorted(int(p.name[2:]) for p in args.data.glob("tp*") if p.name[2:].isdigit())
        tps = args.tp or available
        for tp in tps + ([args.fit_on_tp] if args.fit_on_tp else []):
            if tp not in available:
                raise Failure(f"--tp {tp}: no folder tp{tp} in {args.data} (have {available})")
        base_args = dict(run_cfg["engine_args"])
        with tempfile.TemporaryDirectory(prefix="mocker-calibrate-") as tmp:
            scratch = Path(tmp)
            arch = args.architecture
            if arch and args.no_overheads:
                base_args.setdefault("pass_overhead_ms", 0.0)
                base_args.setdefault("frontend_latency_ms", 0.0)
            results = [evaluate(mocker, args.data / f"tp{tp}", tp, run_cfg, base_args, scratch, arch) for tp in tps]
            print(f"mocker {' '.join(run([mocker, '--version']).split()[1:])}; data {args.data}; "
                  f"profile {run_cfg['profile']}; engine args {json.dumps(base_args)}")
            print_results("uncorrected (nothing fitted)", results, {})
            if args.markdown:
                markdown(results)
            if args.list_outliers:
                list_outliers(results)
            if args.fit_overheads_on_tp:
                if not arch:
                    raise Failure("--fit-overheads-on-tp needs --architecture")
                n = args.fit_overheads_on_tp
                fit = next((r for r in results if r["tp"] == n), None) or evaluate(
                    mocker, args.data / f"tp{n}", n, run_cfg, base_args, scratch, arch)
                bare = dict(base_args, pass_overhead_ms=0.0)
                if "pass_overhead_ms" in base_args and base_args["pass_overhead_ms"] == 0.0:
                    bare_fit = fit
                else:
                    bare_fit = evaluate(mocker, args.data / f"tp{n}", n, run_cfg, bare, scratch, arch)
                # The client's E2E includes the API server's time, which these unstreamed
                # requests cannot separate from decode: it stays at its default.
                corrected = dict(base_args)
                corrected["pass_overhead_ms"] = round(max(0.0, statistics.median(bare_fit["residuals"]["decode"])), 3)
                fitted = [evaluate(mocker, args.data / f"tp{tp}", tp, run_cfg, corrected, scratch, arch)
                          for tp in tps]
                print()
                print_results(f"pass_overhead_ms fitted on TP{n}: {corrected['pass_overhead_ms']}", fitted,
                              {n: "  [in sample]"})
                if args.markdown:
                    markdown(fitted)
            if args.fit_on_tp:
                fit = next((r for r in results if r["tp"] == args.fit_on_tp), None)
                if fit is None:
                    fit = evaluate(mocker, args.data / f"tp{args.fit_on_tp}", args.fit_on_tp, run_cfg,
                                   base_args, scratch, arch)
                corrected = dict(base_args)
                corrected["speedup_ratio"] = round(statistics.median(fit["ratios"]["context"]), 4)
                # The engine divides decode time by speedup_ratio x decode_speedup_ratio.
                decode = statistics.median(fit["ratios"]["decode"])
                corrected["decode_speedup_ratio"] = round(decode / corrected["speedup_ratio"], 4)
                fitted = [evaluate(mocker, args.data / f"tp{tp}", tp, run_cfg, corrected, scratch, arch)
                          for tp in tps]
                print()
                print_results(f"corrected: speedup_ratio {corrected['speedup_ratio']}, decode_speedup_ratio "
                              f"{corrected['decode_speedup_ratio']} (fitted on TP{args.fit_on_tp})", fitted,
                              {args.fit_on_tp: "  [in sample]"})
                if args.markdown:
                    markdown(fitted)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
