#!/usr/bin/env python3
"""Hand-run self-check of the AIConfigurator profile generator (scripts/aic_profile.py).

NOT part of CI: it needs aiconfigurator / aiconfigurator-core (scripts/requirements-profile.txt),
which the CI venv does not install. Run it from the repository root:

    python tests/python/aic_profile_check.py

It does three things and exits non-zero if 1 or 2 fail:
1. regenerates h100-llama3.1-8b-vllm-tp1 into a temporary file and checks it equals the bundled
   copy array for array (the bundled files are reproducible);
2. checks grid points of that profile against AIC's lower-level EngineHandle calls, made
   independently of the forward-pass model the generator uses (context: predict_prefill_latency;
   decode: decode_step_latency; mixed: the three parts of mixed_step_breakdown);
3. prints, for information only, how the bundled b300-qwen3-32b-vllm-tp1 profile's pass times
   compare with the measured vLLM 0.20.1 passes in
   ../shared/calibration/aic-fpm-qwen3-32b-vllm/tp1_ep1_past4096/ (MAPE per pass kind; both the
   table lookup and AIC's direct estimate of each pass). Nothing is fitted to these runs.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import aic_profile  # noqa: E402

CALIBRATION = Path(os.environ.get(
    "MOCKER_CALIBRATION_DIR", ROOT.parent.parent / "shared" / "calibration" / "aic-fpm-qwen3-32b-vllm"))
if not CALIBRATION.exists():
    CALIBRATION = Path("/work/shared/calibration/aic-fpm-qwen3-32b-vllm")

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


# --- table lookups (piecewise linear, end segments extended, as the core reads tables) ---

def interp1(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    i = min(max(int(np.searchsorted(xs, x, side="right")) - 1, 0), len(xs) - 2)
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return float(slope * (x - xs[i]) + ys[i])


def interp2(xs, ys, grid, x, y) -> float:
    col = np.array([interp1(ys, grid[r], y) for r in range(len(xs))])
    return interp1(xs, col, x)


def interp3(xs, ys, zs, cube, x, y, z) -> float:
    plane = np.array([interp2(ys, zs, cube[i], y, z) for i in range(len(xs))])
    return interp1(xs, plane, x)


def table_time(p: dict[str, np.ndarray], row: dict) -> float:
    """Pass time from the profile's tables for one measured pass (see docs/profiles.md)."""
    pt, pn, pkv = int(row["sum_prefill_tokens"]), int(row["num_prefill_requests"]), int(row["sum_prefill_kv_tokens"])
    dn, dkv = int(row["num_decode_requests"]), int(row["sum_decode_kv_tokens"])
    if pt and not dn:
        prefix = pkv / max(pn, 1)
        return interp2(p["prefill_isl"], p["prefill_prefix_tokens"], p["prefill_ms"], pt, prefix)
    if dn and not pt:
        return max(1.0, interp2(p["decode_active_kv_tokens"], p["decode_context_length"], p["decode_itl"],
                                dkv, dkv // dn))
    mixed = interp3(p["mixed_prefill_tokens"], p["mixed_decode_requests"], p["mixed_decode_context"],
                    p["mixed_ms"], pt, dn, dkv / dn)
    if pkv:
        # The mixed table has no prefix axis: add the prefix's extra context-attention time.
        prefix = pkv / max(pn, 1)
        grid = (p["prefill_isl"], p["prefill_prefix_tokens"], p["prefill_ms"])
        mixed += interp2(*grid, pt, prefix) - interp2(*grid, pt, 0)
    return mixed


# --- 1 + 2: reproducibility and agreement with direct SDK calls ---------------------------

def check_generator() -> None:
    name, model, system, backend, tp = ("h100-llama3.1-8b-vllm-tp1", "meta-llama/Meta-Llama-3.1-8B",
                                        "h100_sxm", "vllm", 1)
    bundled = ROOT / "profiles" / "aic" / f"{name}.npz"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.npz"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "aic_profile.py"), "--model", model,
                        "--system", system, "--backend", backend, "--tp", str(tp), "--out", str(out)],
                       check=True, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        fresh = load(out)
    old = load(bundled)
    check(sorted(fresh) == sorted(old), f"{name}: same array names as the bundled file")
    for key in fresh:
        if key == "meta_json":
            a, b = json.loads(fresh[key].tobytes()), json.loads(old[key].tobytes())
            a.pop("command"), b.pop("command")
            check(a == b, f"{name}: meta_json equal apart from the output path")
        else:
            check(np.array_equal(fresh[key], old[key]), f"{name}: {key} equal to the bundled file")
    for key in fresh:
        if key != "meta_json":
            check(fresh[key].dtype == np.float64, f"{name}: {key} is float64")
    for key in ("prefill_isl", "prefill_prefix_tokens", "decode_active_kv_tokens", "decode_context_length",
                "mixed_prefill_tokens", "mixed_decode_requests", "mixed_decode_context"):
        check(len(fresh[key]) >= 2 and bool(np.all(np.diff(fresh[key]) > 0)), f"{name}: {key} strictly increasing")
    check(bundled.stat().st_size < 150_000, f"{name}: file under 150 KB ({bundled.stat().st_size} bytes)")

    from aiconfigurator_core.sdk.engine import EngineHandle

    h = EngineHandle.compile(model, system, backend, backend_version=json.loads(
        fresh["meta_json"].tobytes())["backend_version"], tp_size=tp)
    p = fresh

    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)

    isl, pre = p["prefill_isl"], p["prefill_prefix_tokens"]
    for i, j in [(0, 0), (8, 0), (len(isl) - 1, 0), (8, 4), (3, len(pre) - 1)]:
        n, k = int(isl[i]), int(pre[j])
        want = h.predict_prefill_latency(1, n + k, k)
        check(close(p["prefill_ms"][i, j], want), f"prefill_ms[{n} new, {k} prefix] = {want:.4f} (predict_prefill_latency)")
    check(np.array_equal(p["prefill_ttft_ms"], p["prefill_ms"][:, 0]), "prefill_ttft_ms is prefill_ms at prefix 0")

    kv, ctx = p["decode_active_kv_tokens"], p["decode_context_length"]
    for r, c in [(0, 0), (10, 4), (len(kv) - 1, len(ctx) - 1), (12, 6)]:
        k, cx = int(kv[r]), int(ctx[c])
        batch = max(1, round(k / cx))
        # AIC's forward-pass model prices a request holding C KV tokens as its decode step
        # at isl = C - 2, osl = 2 (verified equal, not assumed).
        want = h.decode_step_latency(batch, cx - 2, 2)
        check(close(p["decode_itl"][r, c], want), f"decode_itl[kv {k}, ctx {cx}] (batch {batch}) = {want:.4f} (decode_step_latency)")

    mp, md, mc = p["mixed_prefill_tokens"], p["mixed_decode_requests"], p["mixed_decode_context"]
    for a, b, c in [(0, 0, 0), (5, 4, 4), (len(mp) - 1, len(md) - 1, len(mc) - 1)]:
        n, d, cx = int(mp[a]), int(md[b]), int(mc[c])
        _, shared, ctx_attn, _ = h.mixed_step_breakdown(n, d, n, 2, 0)
        dec_attn = h.mixed_step_breakdown(n, d, cx - 2, 2, 0)[3]
        want = shared + ctx_attn + dec_attn
        check(close(p["mixed_ms"][a, b, c], want), f"mixed_ms[{n} new, {d} decode @ {cx}] = {want:.4f} (mixed_step_breakdown parts)")


# --- 3: sanity against measured vLLM passes (information only) ---------------------------

def calibration_mape() -> None:
    folder = CALIBRATION / "tp1_ep1_past4096"
    profile = ROOT / "profiles" / "aic" / "b300-qwen3-32b-vllm-tp1.npz"
    if not folder.exists():
        print(f"skip calibration comparison: {folder} not found (set MOCKER_CALIBRATION_DIR)")
        return
    p = load(profile)
    meta = json.loads(p["meta_json"].tobytes())
    model = aic_profile.PassModel({
        "schema_version": 1, "model_name": meta["model"], "system_name": meta["system"],
        "backend": meta["backend"], "backend_version": meta["backend_version"], "tp_size": meta["tp"],
        "pp_size": 1, "moe_tp_size": meta["moe_tp"], "moe_ep_size": meta["moe_ep"]})
    with open(folder / "fpm_metrics_detail.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(folder / "fpm_metrics_phase.csv", newline="") as f:
        phases = {r["counter_id"]: r["phase"] for r in csv.DictReader(f)}
    errs: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        phase = phases.get(row["counter_id"], row["phase"])
        measured = float(row["latency_ms"])
        if measured <= 0:
            continue
        direct = model.ms(row["sum_prefill_tokens"], row["num_prefill_requests"], row["sum_prefill_kv_tokens"],
                          row["num_decode_requests"], row["sum_decode_kv_tokens"])
        for how, value in (("table", table_time(p, row)), ("aic", direct)):
            e = (value - measured) / measured
            errs.setdefault((phase, "all", how), []).append(e)
            errs.setdefault((phase, row["workload_segment"], how), []).append(e)
    print(f"\n{profile.name} vs measured vLLM 0.20.1 passes ({folder.name}); information only, nothing fitted")
    print(f"{'phase':8} {'passes':7} {'source':6} {'count':>6} {'MAPE':>7} {'bias':>7} {'p50 |e|':>8} {'p90 |e|':>8}")
    for phase in ("context", "decode", "mixed"):
        for segment in ("all", "sweep", "real"):
            for how in ("table", "aic"):
                e = np.array(errs.get((phase, segment, how), []))
                if e.size == 0:
                    continue
                a = np.abs(e) * 100
                print(f"{phase:8} {segment:7} {how:6} {e.size:6d} {a.mean():6.1f}% {e.mean()*100:+6.1f}% "
                      f"{np.percentile(a, 50):7.1f}% {np.percentile(a, 90):7.1f}%")
    print("passes: 'sweep' = the collector's fixed shape sweep, 'real' = the 128 requests at concurrency 32.")
    print("source 'table' = the profile's tables read as docs/profiles.md describes; "
          "'aic' = AIC's forward-pass model on the exact pass (all requests, prefixes).")


def main() -> int:
    logging.disable(logging.WARNING)
    check_generator()
    calibration_mape()
    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
