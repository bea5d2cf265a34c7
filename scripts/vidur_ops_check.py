#!/usr/bin/env python3
"""Checks `mocker profiles ops` (operator times from AIConfigurator's database) against
Microsoft Vidur's measured per-operator profiling (calibration/vidur-ops/, MIT).

Stdlib only; from the repository root:

    python3 scripts/vidur_ops_check.py --mocker target/release/mocker [--markdown]

For each (GPU, model, TP) in calibration/vidur-ops/compute/ it runs mocker once
(`mocker profiles ops --model M --gpu G --tensor-parallel-size N --tokens <all measured
counts>`) and compares, per token count, one layer's op on one GPU (ms):

    qkv_proj_ms       vs  time_stats.attn_pre_proj.median   (QKV GEMM, TP shard)
    o_proj_ms         vs  time_stats.attn_post_proj.median  (attention output GEMM, TP shard)
    mlp_gate_up_ms    vs  time_stats.mlp_up_proj.median     (fused gate+up GEMM, TP shard)
    mlp_down_ms       vs  time_stats.mlp_down_proj.median   (down GEMM, TP shard)
    elementwise_ms + activation_ms
                      vs  input_layernorm + post_attention_layernorm + attn_rope + mlp_act
                          + add (medians; Vidur does not time the attention residual add)
    allreduce_ms      vs  network/<gpu>_dgx/all_reduce.csv time_stats.all_reduce.median at
                          size = tokens x hidden x 2 bytes, num_workers = TP (NCCL;
                          linear interpolation between the two nearest measured sizes;
                          `--network pairwise` uses <gpu>_pairwise_nvlink instead)

Vidur GPU dirs map to mocker GPUs: a100 -> a100-80gb, h100 -> h100 (SXM). Vidur models map
to catalogue ids through calibration/vidur-ops/models.csv (Meta-Llama-3-8B/70B -> Llama-3.1,
identical shapes for these ops). It prints, per (GPU, model, TP, op), the number of token
counts, MAPE = mean |mocker - measured| / measured and bias = mean (mocker - measured) /
measured (positive: mocker slower), then the same per GPU and op pooled over models and TP,
and per GPU, op and token range ("4 GEMMs" pools the four projections). `--markdown` prints Markdown tables. Exit 2 when the
binary, the data or `profiles ops` is missing.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUS = {"a100": "a100-80gb", "h100": "h100"}
# mocker column -> Vidur time_stats columns summed (medians, ms).
OPS = {
    "qkv_proj": ("qkv_proj_ms", ["attn_pre_proj"]),
    "o_proj": ("o_proj_ms", ["attn_post_proj"]),
    "mlp_gate_up": ("mlp_gate_up_ms", ["mlp_up_proj"]),
    "mlp_down": ("mlp_down_ms", ["mlp_down_proj"]),
    "elementwise": (
        ("elementwise_ms", "activation_ms"),
        ["input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add"],
    ),
}
OP_ORDER = ["qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "elementwise", "allreduce"]
GEMMS = {"qkv_proj", "o_proj", "mlp_gate_up", "mlp_down"}
# Token ranges for the bias-by-size table: (label, lowest, highest).
RANGES = [("1-32", 1, 32), ("33-256", 33, 256), ("257-2048", 257, 2048), (">2048", 2049, 10**9)]


def die(msg: str) -> None:
    print(f"vidur_ops_check: {msg}", file=sys.stderr)
    sys.exit(2)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        die(f"missing file {path}")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def measured_compute(path: Path) -> dict[int, dict[int, dict[str, float]]]:
    """tp -> tokens -> op -> ms; the few token counts measured twice are averaged."""
    acc: dict[int, dict[int, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in read_csv(path):
        tp, t = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
        for op, (_, cols) in OPS.items():
            acc[tp][t][op].append(sum(float(r[f"time_stats.{c}.median"]) for c in cols))
    return {
        tp: {t: {op: sum(v) / len(v) for op, v in ops.items()} for t, ops in per_t.items()}
        for tp, per_t in acc.items()
    }


def allreduce_table(path: Path) -> dict[int, tuple[list[int], list[float]]]:
    """num_workers -> (sizes in bytes ascending, median ms), duplicate sizes averaged."""
    acc: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in read_csv(path):
        acc[int(r["num_workers"])][int(r["size"])].append(float(r["time_stats.all_reduce.median"]))
    out = {}
    for n, by_size in acc.items():
        sizes = sorted(by_size)
        out[n] = (sizes, [sum(by_size[s]) / len(by_size[s]) for s in sizes])
    return out


def interp(table: tuple[list[int], list[float]], size: float) -> float | None:
    sizes, ms = table
    if not sizes or size < sizes[0] or size > sizes[-1]:
        return None
    i = bisect.bisect_left(sizes, size)
    if sizes[i] == size:
        return ms[i]
    s0, s1, m0, m1 = sizes[i - 1], sizes[i], ms[i - 1], ms[i]
    return m0 + (m1 - m0) * (size - s0) / (s1 - s0)


def run_mocker(binary: str, model: str, gpu: str, tp: int, tokens: list[int]) -> dict[int, dict[str, float]]:
    cmd = [binary, "profiles", "ops", "--model", model, "--gpu", gpu,
           "--tensor-parallel-size", str(tp), "--tokens", ",".join(map(str, tokens)),
           # An explicit KV capacity skips the memory check (Llama-2-70B at TP 1 does not
           # fit an 80 GB GPU, but its per-op times still exist); it changes no op time.
           "--engine-args", '{"num_gpu_blocks": 1024}']
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        err = p.stderr.strip()
        if "unrecognized subcommand" in err:
            die(f"{binary} has no `profiles ops` (stale build?): {err.splitlines()[0]}")
        die(f"`{' '.join(cmd[:9])} ...` failed ({p.returncode}): {err}")
    return {int(r["tokens"]): {k: float(v) for k, v in r.items() if k != "tokens"}
            for r in csv.DictReader(io.StringIO(p.stdout))}


def stats(points: list[tuple[float, float]]) -> tuple[int, float, float]:
    rel = [(m - v) / v for m, v in points]
    return len(rel), 100 * sum(abs(x) for x in rel) / len(rel), 100 * sum(rel) / len(rel)


def table(title: str, header: list[str], rows: list[list[str]], markdown: bool) -> None:
    print(f"\n{'### ' if markdown else ''}{title}\n")
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i < len(header) - 3 else "---:" for i in range(len(header))) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w[i]) for i, h in enumerate(header)))
        for r in rows:
            print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mocker", default=str(ROOT / "target/release/mocker"), help="mocker binary")
    ap.add_argument("--data", default=str(ROOT / "calibration/vidur-ops"), help="trimmed Vidur data")
    ap.add_argument("--network", choices=["dgx", "pairwise"], default="dgx",
                    help="all-reduce data: <gpu>_dgx (8 GPUs, NVSwitch; default) or <gpu>_pairwise_nvlink")
    ap.add_argument("--max-tokens", type=int, default=None, help="ignore token counts above this")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    a = ap.parse_args()

    if not (os.path.isfile(a.mocker) and os.access(a.mocker, os.X_OK)):
        die(f"mocker binary not found or not executable: {a.mocker}")
    data = Path(a.data)
    models = read_csv(data / "models.csv")
    net_name = {"dgx": "{g}_dgx", "pairwise": "{g}_pairwise_nvlink"}[a.network]

    per_combo: dict[tuple[str, str, int, str], list[tuple[float, float]]] = defaultdict(list)
    per_gpu_op: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    per_range: dict[tuple[str, str, str], list[tuple[float, float]]] = defaultdict(list)

    for m in models:
        g, vm, mm = m["gpu"], m["vidur_model"], m["mocker_model"]
        hidden = int(m["n_embd"])
        measured = measured_compute(data / "compute" / g / vm / "mlp.csv")
        ar = allreduce_table(data / "network" / net_name.format(g=g) / "all_reduce.csv")
        for tp in sorted(measured):
            tokens = sorted(t for t in measured[tp] if a.max_tokens is None or t <= a.max_tokens)
            if not tokens:
                continue
            mk = run_mocker(a.mocker, mm, GPUS[g], tp, tokens)
            for t in tokens:
                def priced(cols):
                    return sum(mk[t][c] for c in cols) if isinstance(cols, tuple) else mk[t][cols]
                pairs = [(op, priced(OPS[op][0]), measured[tp][t][op]) for op in OPS]
                if tp > 1 and tp in ar:
                    v = interp(ar[tp], t * hidden * 2)
                    if v is not None:
                        pairs.append(("allreduce", mk[t]["allreduce_ms"], v))
                for op, mv, vv in pairs:
                    if vv <= 0:
                        continue
                    per_combo[(g, vm, tp, op)].append((mv, vv))
                    per_gpu_op[(g, op)].append((mv, vv))
                    per_gpu_op[(g, "all ops")].append((mv, vv))
                    if op in GEMMS:
                        per_gpu_op[(g, "4 GEMMs")].append((mv, vv))
                    for label, lo, hi in RANGES:
                        if lo <= t <= hi:
                            per_range[(g, op, label)].append((mv, vv))

    opi = {o: i for i, o in enumerate(OP_ORDER + ["4 GEMMs", "all ops"])}
    rows = []
    for (g, vm, tp, op), pts in sorted(per_combo.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], opi[kv[0][3]])):
        n, mape, bias = stats(pts)
        rows.append([GPUS[g], vm, str(tp), op, str(n), f"{mape:.1f}%", f"{bias:+.1f}%"])
    table("Per (GPU, model, TP, op): mocker vs Vidur measured",
          ["gpu", "vidur model", "tp", "op", "n", "MAPE", "bias"], rows, a.markdown)

    rows = []
    for (g, op), pts in sorted(per_gpu_op.items(), key=lambda kv: (kv[0][0], opi[kv[0][1]])):
        n, mape, bias = stats(pts)
        rows.append([GPUS[g], op, str(n), f"{mape:.1f}%", f"{bias:+.1f}%"])
    table("Overall per GPU (all models and TPs pooled, each token count one point)",
          ["gpu", "op", "n", "MAPE", "bias"], rows, a.markdown)

    ri = {r[0]: i for i, r in enumerate(RANGES)}
    rows = []
    for (g, op, label), pts in sorted(per_range.items(), key=lambda kv: (kv[0][0], opi[kv[0][1]], ri[kv[0][2]])):
        n, mape, bias = stats(pts)
        rows.append([GPUS[g], op, label, str(n), f"{mape:.1f}%", f"{bias:+.1f}%"])
    table("By token range (all models and TPs pooled)",
          ["gpu", "op", "tokens", "n", "MAPE", "bias"], rows, a.markdown)


if __name__ == "__main__":
    main()
