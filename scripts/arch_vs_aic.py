#!/usr/bin/env python3
"""How closely pass times composed from the architecture (`--model`, `--gpu`) reproduce
AIConfigurator's own whole-pass estimates (the bundled profiles, docs/profiles.md).

Both sides rest on the same measured operator database; this checks the composition (which
operations, their shapes, attention per layer kind, all-reduces, MoE), not the database.
Stdlib only; from the repository root:

    cargo build --release -p mocker && python3 scripts/arch_vs_aic.py --mocker target/release/mocker

Per bundled vLLM profile it prices a grid of passes (context passes of 128..16384 new tokens
with 0..8192 cached, decode batches of 1..256 at 512..16384 context, and mixed passes) both
ways, with mocker's per-pass overhead set to 0 (AIConfigurator has none), and prints the
mean |relative difference| (MAPE) and the mean difference (bias) per kind.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import subprocess
import sys

# Bundled vLLM profile -> (model as the catalogue names it, GPU, TP).
PAIRS = {
    "h100-llama3.1-8b-vllm-tp1": ("meta-llama/Llama-3.1-8B", "h100", 1),
    "h100-llama3.1-70b-vllm-tp4": ("meta-llama/Llama-3.1-70B", "h100", 4),
    "h100-mixtral-8x7b-vllm-tp2": ("mistralai/Mixtral-8x7B-v0.1", "h100", 2),
    "h200-qwen3-32b-vllm-tp2": ("Qwen/Qwen3-32B", "h200", 2),
    "b300-qwen3-32b-vllm-tp1": ("Qwen/Qwen3-32B", "b300", 1),
    "b300-qwen3-32b-vllm-tp8": ("Qwen/Qwen3-32B", "b300", 8),
    "b200-deepseek-v3-vllm-tp8": ("deepseek-ai/DeepSeek-V3", "b200", 8),
}
HEADER = "ctx_tokens,ctx_requests,ctx_kv_tokens,decode_requests,decode_kv_tokens"


def grid() -> list[tuple[str, list[int]]]:
    rows = []
    for new in (128, 512, 2048, 8192, 16384):
        for prefix in (0, 1024, 8192):
            rows.append(("context", [new, 1, prefix, 0, 0]))
    for batch in (1, 4, 16, 64, 256):
        for ctx in (512, 2048, 8192, 16384):
            rows.append(("decode", [0, 0, 0, batch, batch * ctx]))
    for new in (256, 2048):
        for batch in (8, 64):
            rows.append(("mixed", [new, 1, 0, batch, batch * 2048]))
    return rows


def predict(mocker: str, timing: list[str], rows) -> list[float]:
    text = HEADER + "\n" + "\n".join(",".join(map(str, r)) for _, r in rows) + "\n"
    args = [mocker, "profiles", "predict", *timing, "--engine-args",
            json.dumps({"pass_overhead_ms": 0.0} if "--model" in timing else {})]
    out = subprocess.run(args, input=text, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(args)}: {out.stderr.strip()}")
    return [float(r["pass_ms"]) for r in csv.DictReader(io.StringIO(out.stdout))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mocker", default="target/release/mocker")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    rows = grid()
    table = []
    for profile, (model, gpu, tp) in PAIRS.items():
        aic = predict(args.mocker, ["--timing-profile", profile], rows)
        arch = predict(args.mocker, ["--model", model, "--gpu", gpu, "--tensor-parallel-size", str(tp)], rows)
        cells = []
        for kind in ("context", "decode", "mixed"):
            e = [(a - b) / b for (k, _), a, b in zip(rows, arch, aic) if k == kind]
            cells.append(f"{statistics.fmean(abs(x) for x in e) * 100:.1f}% ({statistics.fmean(e) * 100:+.1f}%)")
        table.append((profile, cells))
    if args.markdown:
        print("| profile | context pass | decode pass | mixed pass |\n|---|---|---|---|")
        for p, c in table:
            print(f"| {p} | " + " | ".join(c) + " |")
    else:
        for p, c in table:
            print(f"{p:<28} context {c[0]:<16} decode {c[1]:<16} mixed {c[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
