#!/usr/bin/env python3
"""Sample NVIDIA AIConfigurator's measured operator database into per-GPU op tables.

AIConfigurator (``aiconfigurator-core``, Apache-2.0) ships operator timings measured per
GPU system, backend and backend version. This script asks the SDK's own query path (the
compiled engine behind ``EngineHandle.evaluate_ops_json``, i.e. exactly the interpolation
and extrapolation AIC uses when it composes a forward pass) for single operators of the
vLLM backend on fixed grids, and writes one compact JSON table per GPU system in the
``mocker-ops-v1`` format described in crates/mocker-models/data/ops/README.md: GEMMs,
context (prefill) attention, generation (decode) attention, all-reduce and fused MoE, all
in milliseconds of one op on one GPU.

    python scripts/aic_op_tables.py --system h100_sxm
    python scripts/aic_op_tables.py --all
    python scripts/aic_op_tables.py --system h100_sxm --system b200_sxm --out-dir /tmp/ops
    python scripts/aic_op_tables.py --list
    python scripts/aic_op_tables.py --check target/aic-op-check.txt   # diagnostics, see below

The database's "current" version slot for (system, vllm) is used. Values are first asked
from the database in its default SILICON mode (measured rows, interpolated/extrapolated by
AIC); where that mode has no data the HYBRID view answers with AIC's empirical estimate
(SOL / utilisation borrowed from the nearest measured shape) and the entry is tagged
"empirical". Regenerating gives byte-identical files.

``--check FILE`` compares AIC's whole-pass estimate (RustForwardPassPerfModel, as in
scripts/aic_profile.py) with the sum of the per-layer operators of the same model read
from the generated tables (Llama-3.1-8B TP1 and Mixtral-8x7B TP2 on h100_sxm); it reads
``<out-dir>/h100_sxm.json``.

Needs only the standard library, numpy and aiconfigurator-core (no GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

import numpy as np

FORMAT = "mocker-ops-v1"
BACKEND = "vllm"
DEFAULT_OUT_DIR = Path("crates/mocker-models/data/ops")

# --- Grids (all strictly increasing) -----------------------------------------------------
# GEMM C[m, n] = A[m, k] x B[k, n]: m = tokens, n = output features, k = input features.
GEMM_M = [2**i for i in range(0, 16)]  # 1 .. 32768
GEMM_N = [2**i for i in range(7, 19)]  # 128 .. 262144
GEMM_K = [2**i for i in range(7, 17)]  # 128 .. 65536
# Attention head configs on one GPU: (q heads, kv heads, head_dim).
HEAD_CONFIGS = [(4, 1, 128), (8, 1, 128), (8, 8, 128), (16, 2, 128), (32, 8, 128), (64, 8, 128),
                (64, 8, 64), (16, 8, 256)]
CTX_BATCH = [1, 2, 4, 8, 16, 32, 64]
CTX_ISL = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
CTX_PREFIX = [0, 256, 1024, 4096, 16384, 65536]
GEN_BATCH = [2**i for i in range(0, 11)]  # 1 .. 1024
GEN_CONTEXT = [16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
AR_TP = [2, 4, 8]
AR_ELEMENTS = [2**i for i in range(6, 29)]  # 64 .. 268M elements
MOE_TP = [1, 2, 4, 8]
MOE_TOKENS = [2**i for i in range(0, 15)]  # 1 .. 16384
# Token routing: AIC's "balanced" (uniform) rows; on systems whose vLLM MoE table has no
# balanced rows, the least skewed measured one. (AIC's own model default is "power_law_1.2".)
MOE_DISTRIBUTIONS = ("balanced", "power_law_1.01")
# (model, hidden, moe intermediate (full, before TP), experts, top-k)
MOE_SHAPES = [
    ("mistralai/Mixtral-8x7B-v0.1", 4096, 14336, 8, 2),
    ("mistralai/Mixtral-8x22B-v0.1", 6144, 16384, 8, 2),
    ("Qwen/Qwen3-30B-A3B", 2048, 768, 128, 8),
    ("Qwen/Qwen3-235B-A22B", 4096, 1536, 128, 8),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 5120, 8192, 16, 1),
    ("openai/gpt-oss-120b", 2880, 2880, 128, 4),
    ("openai/gpt-oss-20b", 2880, 2880, 32, 4),
    ("deepseek-ai/DeepSeek-V3", 7168, 2048, 256, 8),
]
FLOPS_KEYS = {"bfloat16_tc_flops": "bf16", "fp8_tc_flops": "fp8", "int8_tc_flops": "int8",
              "fp4_tc_flops": "fp4", "float32_tc_flops": "fp32"}


def _fail(message: str) -> "NoReturn":  # noqa: F821
    print(f"aic_op_tables: {message}", file=sys.stderr)
    sys.exit(2)


def sdk_version() -> str:
    return metadata.version("aiconfigurator-core")


def vllm_systems() -> dict[str, str]:
    """{system: current vLLM version} for every system whose database has a vLLM slot."""
    from aiconfigurator_core.sdk import perf_database

    out = {}
    for system, backends in sorted(perf_database.get_supported_databases().items()):
        if BACKEND in backends:
            try:
                out[system] = perf_database.resolve_query_version(system, BACKEND, "current")
            except Exception:  # the SDK raises several types for unusable slots
                continue
    return out


def sig4(value: float) -> float:
    """Round to 4 significant digits."""
    return float(f"{value:.4g}")


def _finite(value: float) -> float:
    """sig4, with 0.0 for an unanswerable point (its whole entry is dropped later)."""
    return sig4(value) if math.isfinite(value) else 0.0


# --- SDK access ----------------------------------------------------------------------------


class Sampler:
    """Evaluates op lists through AIC's compiled engine for one (system, vLLM version).

    Each call first uses the database in its default SILICON mode (measured tables,
    interpolated and extrapolated by AIC -- the mode RustForwardPassPerfModel uses); if
    that mode reports missing data for an op, the op is re-asked from the HYBRID view,
    which answers with AIC's empirical estimate. Uses the SDK's model-less probe engine
    (`EngineHandle.for_database` + `evaluate_ops_json`, what AIC's own single-op helper
    `engine._evaluate_single_op` does) with AIC's op classes from `sdk.operations`.
    """

    def __init__(self, system: str, version: str):
        from aiconfigurator_core.sdk import engine, perf_database
        from aiconfigurator_core.sdk.errors import EmpiricalNotImplementedError

        self._engine = engine
        self._empirical_miss = EmpiricalNotImplementedError
        self._pdb = perf_database
        self.db = perf_database.get_database(system, BACKEND, version)
        if self.db is None:
            _fail(f"aiconfigurator-core has no {BACKEND} {version} database for {system}")
        self.hybrid = perf_database.get_database_view(system, BACKEND, version, database_mode="HYBRID")
        self._silicon_handle = engine.EngineHandle.for_database(self.db, systems_path=self.db.systems_root)
        self._hybrid_handle = engine.EngineHandle.for_database(self.hybrid, systems_path=self.hybrid.systems_root)
        self.tiers: set[str] = set()  # empirical provenance tiers that fired (xshape, ...)

    def prepare(self, ops: list) -> list:
        """Resolve attention kernel-lane orders the way AIC does when it builds a model."""
        self._engine._resolve_attention_lane_orders(ops, self.db, None)
        return ops

    def _eval(self, handle, ops, shape):
        rows = handle.evaluate_ops_json(self._engine.build_ops_json(ops), **shape)
        return {name: float(ms) for name, ms, _energy, _src in rows}

    def run(self, ops: list, **shape) -> dict[str, tuple[float, str]]:
        """{op name: (ms, 'silicon' | 'empirical' | 'none')} for ops evaluated at one shape.

        'none' (ms = NaN): neither the measured tables nor AIC's empirical fallback can answer.
        """
        try:
            got = self._eval(self._silicon_handle, ops, shape)
            return {name: (ms, "silicon") for name, ms in got.items()}
        except Exception as exc:
            if not self._pdb.has_perf_data_not_available_cause(exc):
                raise
        out = {}
        for op in ops:
            try:
                out.update({n: (ms, "silicon") for n, ms in self._eval(self._silicon_handle, [op], shape).items()})
            except Exception as exc:
                if not self._pdb.has_perf_data_not_available_cause(exc):
                    raise
                try:
                    got = self._eval(self._hybrid_handle, [op], shape)
                except Exception as exc2:
                    if not (isinstance(exc2, self._empirical_miss)
                            or self._pdb.has_perf_data_not_available_cause(exc2)):
                        raise
                    out[op._name] = (math.nan, "none")  # neither measured nor estimable
                    continue
                tier = self._hybrid_handle.last_provenance()
                if tier:
                    self.tiers.add(tier)
                out.update({n: (ms, "empirical") for n, ms in got.items()})
        return out


def _require(sources, what: str) -> None:
    if "none" in sources:
        _fail(f"{what}: AIC can neither look up nor estimate some grid points")


def _combine(sources) -> str:
    kinds = set(sources)
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _keys_at(tree, depth: int) -> set:
    """Union of the dict keys `depth` levels below `tree` (0 = tree's own keys)."""
    if not isinstance(tree, Mapping):
        return set()
    if depth == 0:
        return set(tree.keys())
    out = set()
    for value in tree.values():
        out |= _keys_at(value, depth - 1)
    return out


def _int_range(keys) -> str:
    ints = sorted(k for k in keys if isinstance(k, (int, float)))
    return f"{ints[0]}..{ints[-1]}" if ints else "none"


# --- Tables ------------------------------------------------------------------------------


def gpu_block(spec: dict) -> dict:
    """Hardware constants from the system yaml, as AIC loaded it."""
    gpu, node, misc = spec["gpu"], spec["node"], spec.get("misc", {})
    out = {
        "mem_capacity": gpu["mem_capacity"],
        "mem_bw": gpu["mem_bw"],
        "mem_bw_empirical_scaling_factor": gpu["mem_bw_empirical_scaling_factor"],
        "mem_empirical_constant_latency": gpu["mem_empirical_constant_latency"],
        "flops": {short: gpu[key] for key, short in FLOPS_KEYS.items() if key in gpu},
        "intra_node_bw": node["intra_node_bw"],
        "inter_node_bw": node["inter_node_bw"],
        "pcie_bw": node["pcie_bw"],
        "p2p_latency": node["p2p_latency"],
        "num_gpus_per_node": node["num_gpus_per_node"],
        "other_mem": misc.get("other_mem", 0),
        "nccl_mem": {str(k): v for k, v in sorted((misc.get("nccl_mem") or {}).items())},
    }
    return out


def gemm_tables(s: Sampler, notes: list) -> dict:
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops

    available = ops.GEMM.supported_quant_modes(s.db)
    modes = [("bf16", common.GEMMQuantMode.bfloat16)]
    if common.GEMMQuantMode.fp8 in available:
        modes.append(("fp8", common.GEMMQuantMode.fp8))
    else:
        notes.append("gemm: no fp8 (per-tensor) GEMM table for vLLM on this system; only bf16 written")
    out = {}
    for key, quant in modes:
        gemms = [ops.GEMM(f"g_{n}_{k}", 1, n, k, quant) for n in GEMM_N for k in GEMM_K]
        grid = np.zeros((len(GEMM_M), len(GEMM_N), len(GEMM_K)))
        sources = []
        for i, m in enumerate(GEMM_M):
            got = s.run(gemms, is_context=True, batch_size=1, s=1, x=m)
            for j, n in enumerate(GEMM_N):
                for h, k in enumerate(GEMM_K):
                    ms, src = got[f"g_{n}_{k}"]
                    grid[i, j, h] = ms
                    sources.append(src)
        _require(sources, f"{s.db.system} gemm {key}")
        out[key] = {"m": GEMM_M, "n": GEMM_N, "k": GEMM_K, "ms": [sig4(v) for v in grid.ravel()],
                    "source": _combine(sources)}
        table = s.db._gemm_data.get(quant) if hasattr(s.db, "_gemm_data") else None
        if table:
            notes.append(f"gemm {key}: measured m {_int_range(_keys_at(table, 0))}, "
                         f"n {_int_range(_keys_at(table, 1))}, "
                         f"k {_int_range(_keys_at(table, 2))}; points outside are AIC's extrapolation")
    return out


def _attention_kv_modes(s: Sampler, notes: list):
    """KV-cache dtypes with measured vLLM context AND generation attention rows."""
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops

    ops.ContextAttention.load_data(s.db)
    ops.GenerationAttention.load_data(s.db)
    ctx = s.db._context_attention_data.get(common.FMHAQuantMode.bfloat16) or {}
    gen = s.db._generation_attention_data or {}
    modes = []
    for key, kv in (("bf16", common.KVCacheQuantMode.bfloat16), ("fp8", common.KVCacheQuantMode.fp8)):
        if kv in ctx and kv in gen:
            modes.append((key, kv))
            notes.append(
                f"context_attention {key}: measured full sequence (isl + prefix) {_int_range(_keys_at(ctx[kv], 4))}, "
                f"batch {_int_range(_keys_at(ctx[kv], 5))}, head_dim {_int_range(_keys_at(ctx[kv], 1))}; "
                f"generation_attention {key}: measured batch {_int_range(_keys_at(gen[kv], 4))}, "
                f"context {_int_range(_keys_at(gen[kv], 5))}; points outside are AIC's extrapolation")
        elif key == "bf16":
            _fail(f"{s.db.system}: no bf16 vLLM attention table")
        else:
            notes.append(f"attention: no measured fp8-KV vLLM attention rows on this system; only bf16 written")
    return modes


def attention_tables(s: Sampler, notes: list) -> tuple[dict, dict]:
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops

    fmha = common.FMHAQuantMode.bfloat16
    ctx_out, gen_out = {}, {}
    for key, kv in _attention_kv_modes(s, notes):
        ctx_ops = s.prepare([ops.ContextAttention(f"c_{h}_{kvh}_{d}", 1, h, kvh, kv, fmha, head_size=d)
                             for h, kvh, d in HEAD_CONFIGS])
        gen_ops = s.prepare([ops.GenerationAttention(f"g_{h}_{kvh}_{d}", 1, h, kvh, kv, head_size=d)
                             for h, kvh, d in HEAD_CONFIGS])
        ctx_vals = {c: np.zeros((len(CTX_BATCH), len(CTX_ISL), len(CTX_PREFIX))) for c in HEAD_CONFIGS}
        ctx_src = {c: [] for c in HEAD_CONFIGS}
        for i, b in enumerate(CTX_BATCH):
            for j, isl in enumerate(CTX_ISL):
                for p, prefix in enumerate(CTX_PREFIX):
                    got = s.run(ctx_ops, is_context=True, batch_size=b, s=isl, prefix=prefix)
                    for c in HEAD_CONFIGS:
                        ms, src = got["c_%d_%d_%d" % c]
                        ctx_vals[c][i, j, p] = ms
                        ctx_src[c].append(src)
        gen_vals = {c: np.zeros((len(GEN_BATCH), len(GEN_CONTEXT))) for c in HEAD_CONFIGS}
        gen_src = {c: [] for c in HEAD_CONFIGS}
        for i, b in enumerate(GEN_BATCH):
            for j, ctx in enumerate(GEN_CONTEXT):
                got = s.run(gen_ops, is_context=False, batch_size=b, s=ctx)
                for c in HEAD_CONFIGS:
                    ms, src = got["g_%d_%d_%d" % c]
                    gen_vals[c][i, j] = ms
                    gen_src[c].append(src)
        ctx_out[key] = [
            {"heads": h, "kv_heads": kvh, "head_dim": d, "batch": CTX_BATCH, "isl": CTX_ISL,
             "prefix": CTX_PREFIX, "ms": [_finite(v) for v in ctx_vals[(h, kvh, d)].ravel()],
             "source": _combine(ctx_src[(h, kvh, d)])}
            for h, kvh, d in HEAD_CONFIGS]
        gen_out[key] = [
            {"heads": h, "kv_heads": kvh, "head_dim": d, "batch": GEN_BATCH, "context": GEN_CONTEXT,
             "ms": [_finite(v) for v in gen_vals[(h, kvh, d)].ravel()],
             "source": _combine(gen_src[(h, kvh, d)])}
            for h, kvh, d in HEAD_CONFIGS]
        for table, entries in (("context_attention", ctx_out[key]), ("generation_attention", gen_out[key])):
            dropped = [e for e in entries if e["source"] not in ("silicon", "empirical")]
            if dropped:
                notes.append(f"{table} {key}: skipped head configs "
                             + ", ".join(f"({e['heads']},{e['kv_heads']},hd{e['head_dim']})" for e in dropped)
                             + ": AIC can neither look up nor estimate them")
                entries[:] = [e for e in entries if e not in dropped]
            emp = [f"({e['heads']},{e['kv_heads']},hd{e['head_dim']})" for e in entries if e["source"] != "silicon"]
            if emp:
                notes.append(f"{table} {key}: no measured rows for head configs {', '.join(emp)}; "
                             "values are AIC's empirical estimate (source tag)")
        # The analytic extras AIC adds to every context-attention call (see README).
        extras = []
        for h, kvh, d in HEAD_CONFIGS[:1] + [HEAD_CONFIGS[4]]:
            extras.append(f"({h},{kvh},hd{d}) {sig4(_ctx_extras_ms(s.db.system_spec, h, kvh, d))}")
        if key == "bf16":
            notes.append("context_attention ms include AIC's fused RoPE + KV-write memory-op extras, a constant "
                         "per call independent of batch and tokens: " + ", ".join(extras) + " ms")
    return ctx_out, gen_out


def _ctx_extras_ms(spec: dict, heads: int, kv_heads: int, head_dim: int) -> float:
    """AIC's RoPE + KV-write extras of one ContextAttention call (use_qk_norm=False), ms."""
    gpu = spec["gpu"]

    def mem_op(nbytes: float) -> float:
        return (nbytes / (gpu["mem_bw"] * gpu["mem_bw_empirical_scaling_factor"])
                + gpu["mem_empirical_constant_latency"]) * 1000.0

    q, k = heads * head_dim, kv_heads * head_dim
    rope = 2 * mem_op(2 * q + 2 * k)
    kv_write = 2 * mem_op(2 * k)  # bf16 FMHA: 2 bytes
    return 1.1 * (rope + kv_write)


def allreduce_table(s: Sampler, notes: list) -> dict:
    from aiconfigurator_core.sdk import operations as ops

    # hidden=1 and x=elements: AIC sizes the message as tokens x hidden elements.
    ars = [ops.CustomAllReduce(f"ar_{tp}", 1, 1, tp) for tp in AR_TP]
    grid = np.zeros((len(AR_TP), len(AR_ELEMENTS)))
    sources = []
    for j, elements in enumerate(AR_ELEMENTS):
        got = s.run(ars, is_context=True, batch_size=1, s=1, x=elements)
        for i, tp in enumerate(AR_TP):
            ms, src = got[f"ar_{tp}"]
            grid[i, j] = ms
            sources.append(src)
    _require(sources, f"{s.db.system} allreduce")
    per_node = s.db.system_spec["node"]["num_gpus_per_node"]
    kind = "vllm custom allreduce"
    if per_node == 72 and max(AR_TP) > 4:
        kind = "vllm custom allreduce (tp<=4); nccl all_reduce (tp>4, AIC's NVL72 reroute)"
    ops.CustomAllReduce.load_data(s.db)
    table = getattr(s.db, "_custom_allreduce_data", None) or {}
    collected = sorted(_keys_at(table, 1))
    sizes = _keys_at(table, 3)
    notes.append(f"allreduce: AIC CustomAllReduce table (vLLM custom all-reduce, bf16), measured tp {collected}, "
                 f"elements {_int_range(sizes)}")
    over = [tp for tp in AR_TP if tp > per_node]
    if over:
        notes.append(f"allreduce: tp {over} exceed the {per_node} GPUs of a node; AIC answers with the "
                     f"{per_node}-GPU curve scaled to the inter-node bandwidth")
    return {"bf16": {"tp": AR_TP, "elements": AR_ELEMENTS, "ms": [sig4(v) for v in grid.ravel()],
                     "kind": kind, "source": _combine(sources)}}


def moe_table(s: Sampler, notes: list) -> dict:
    from aiconfigurator_core.sdk import common
    from aiconfigurator_core.sdk import operations as ops

    quant = common.MoEQuantMode.bfloat16
    ops.MoE.load_data(s.db)
    measured = set((getattr(s.db, "_moe_data", None) or {}).get(quant, {}).keys())
    dist = next((d for d in MOE_DISTRIBUTIONS if d in measured), MOE_DISTRIBUTIONS[0])
    moes, meta = [], []
    for model, hidden, inter, experts, topk in MOE_SHAPES:
        for tp in MOE_TP:
            if inter % tp:
                notes.append(f"moe: {model} moe_tp {tp} skipped (inter {inter} not divisible)")
                continue
            name = f"m_{len(moes)}"
            moes.append(ops.MoE(name, 1, hidden, inter, topk, experts, tp, 1, quant, dist, 1))
            meta.append((name, model, hidden, inter, experts, topk, tp))
    vals = {name: [] for name, *_ in meta}
    srcs = {name: [] for name, *_ in meta}
    for tokens in MOE_TOKENS:
        got = s.run(moes, is_context=True, batch_size=1, s=1, x=tokens)
        for name in vals:
            ms, src = got[name]
            vals[name].append(_finite(ms))
            srcs[name].append(src)
    out, emp, skipped = [], [], []
    for name, model, hidden, inter, experts, topk, tp in meta:
        source = _combine(srcs[name])
        if "none" in srcs[name]:
            skipped.append(f"{model} tp{tp}")
            continue
        if source != "silicon":
            emp.append(f"{model} tp{tp}")
        out.append({"model": model, "hidden": hidden, "inter": inter, "experts": experts, "topk": topk,
                    "moe_tp": tp, "moe_ep": 1, "distribution": dist, "tokens": MOE_TOKENS, "ms": vals[name],
                    "source": source})
    if skipped:
        notes.append("moe bf16: skipped " + ", ".join(skipped) + ": AIC can neither look up nor estimate them")
    if emp:
        notes.append("moe bf16: no measured rows for " + ", ".join(emp) + "; values are AIC's empirical "
                     "estimate (nearest measured shape's utilisation applied to this shape's roofline)")
    if dist == "balanced":
        notes.append("moe: token routing = AIC's 'balanced' (uniform top-k) rows")
    else:
        notes.append(f"moe: this system's vLLM MoE table has no 'balanced' (uniform) rows; using '{dist}', the "
                     "least skewed measured routing (measured: " + ", ".join(sorted(map(str, measured))) + ")")
    notes.append("moe: AIC's own model default routing is 'power_law_1.2' (skewed); it differs from uniform "
                 "by up to ~20% (h100 Mixtral-8x7B TP2: 14% faster at 1 token, 19% slower at 1024 tokens)")
    return {"bf16": out}


def _backfill_notes(s: Sampler, notes: list) -> None:
    """Name the tables this version slot does not hold itself (AIC's shared layer fills them
    from older collections of the same system)."""
    import glob

    tables = [("gemm", "_gemm_data"), ("context_attention", "_context_attention_data"),
              ("generation_attention", "_generation_attention_data"), ("allreduce", "_custom_allreduce_data"),
              ("moe", "_moe_data")]
    for what, attr in tables:
        view = getattr(s.db, attr, None)
        path = Path(str(getattr(view, "filepath", "")))
        if view is None or path.exists() or path.with_suffix(".txt").exists():
            continue
        root = Path(s.db.systems_root) / s.db.system_spec["data_dir"]
        found = (glob.glob(str(root / "*" / BACKEND / "*" / path.name))
                 + glob.glob(str(root / BACKEND / "*" / path.name)))
        older = sorted({Path(p).parent.name for p in found})
        notes.append(f"{what}: no {BACKEND} {s.db.version} collection on this system; AIC fills it from older "
                     f"{BACKEND} collections ({', '.join(older) or 'none found'})")


def build(system: str, version: str) -> dict:
    s = Sampler(system, version)
    notes: list[str] = []
    doc = {
        "format": FORMAT,
        "system": system,
        "backend": BACKEND,
        "backend_version": version,
        "generator": f"aiconfigurator-core {sdk_version()}",
        "command": f"python scripts/aic_op_tables.py --system {system}",
        "gpu": gpu_block(s.db.system_spec),
        "gemm": gemm_tables(s, notes),
    }
    doc["context_attention"], doc["generation_attention"] = attention_tables(s, notes)
    doc["allreduce"] = allreduce_table(s, notes)
    doc["moe"] = moe_table(s, notes)
    _backfill_notes(s, notes)
    if s.tiers:
        notes.append("AIC empirical transfer tiers used: " + ", ".join(sorted(s.tiers)))
    doc["notes"] = notes
    return doc


# --- Output --------------------------------------------------------------------------------


def _num(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"non-finite value {v}")
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.4g}" if v == sig4(v) else repr(v)
    raise TypeError(type(v))


def dumps(obj, indent: int = 0) -> str:
    """Stable JSON: sorted keys, one key per line, number arrays on one line."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(str(k))}: {dumps(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj):
            return "[" + ",".join(_num(x) for x in obj) + "]"
        items = [f"{inner}{dumps(x, indent + 1)}" for x in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(obj, str):
        return json.dumps(obj)
    if obj is None:
        return "null"
    return _num(obj)


def write(path: Path, doc: dict) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(doc) + "\n"
    json.loads(text)  # well-formed
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return len(text.encode("utf-8"))


# --- Check (diagnostic) --------------------------------------------------------------------


def _interp(axes: list[list[int]], values: np.ndarray, point: list[float]) -> float:
    """Multilinear interpolation (clamped at the ends) in raw coordinates."""
    idx, wts = [], []
    for axis, x in zip(axes, point):
        a = np.asarray(axis, dtype=float)
        x = min(max(float(x), a[0]), a[-1])
        hi = int(np.searchsorted(a, x))
        if hi == 0:
            idx.append((0, 0)); wts.append(0.0); continue
        lo = hi - 1
        idx.append((lo, hi)); wts.append((x - a[lo]) / (a[hi] - a[lo]))
    total = 0.0
    for corner in range(2 ** len(axes)):
        w, sel = 1.0, []
        for d in range(len(axes)):
            bit = (corner >> d) & 1
            w *= wts[d] if bit else 1.0 - wts[d]
            sel.append(idx[d][bit])
        if w:
            total += w * values[tuple(sel)]
    return total


class Tables:
    """Reader for one generated mocker-ops-v1 file (used by --check only)."""

    def __init__(self, doc: dict):
        self.doc = doc

    def gemm(self, m, n, k, dtype="bf16"):
        t = self.doc["gemm"][dtype]
        v = np.array(t["ms"]).reshape(len(t["m"]), len(t["n"]), len(t["k"]))
        return _interp([t["m"], t["n"], t["k"]], v, [m, n, k])

    def _attn_entry(self, table, heads, kv_heads, head_dim=128):
        """Exact head config, else linear in q heads between the two configs sharing this GQA ratio."""
        entries = [e for e in self.doc[table]["bf16"] if e["head_dim"] == head_dim]
        for e in entries:
            if (e["heads"], e["kv_heads"]) == (heads, kv_heads):
                return [(1.0, e)]
        same = sorted((e for e in entries if e["heads"] * kv_heads == e["kv_heads"] * heads), key=lambda e: e["heads"])
        lo = max((e for e in same if e["heads"] < heads), key=lambda e: e["heads"])
        hi = min((e for e in same if e["heads"] > heads), key=lambda e: e["heads"])
        w = (heads - lo["heads"]) / (hi["heads"] - lo["heads"])
        return [(1.0 - w, lo), (w, hi)]

    def context_attention(self, heads, kv_heads, batch, isl, prefix=0):
        total = 0.0
        for w, e in self._attn_entry("context_attention", heads, kv_heads):
            v = np.array(e["ms"]).reshape(len(e["batch"]), len(e["isl"]), len(e["prefix"]))
            total += w * _interp([e["batch"], e["isl"], e["prefix"]], v, [batch, isl, prefix])
        return total

    def generation_attention(self, heads, kv_heads, batch, context):
        total = 0.0
        for w, e in self._attn_entry("generation_attention", heads, kv_heads):
            v = np.array(e["ms"]).reshape(len(e["batch"]), len(e["context"]))
            total += w * _interp([e["batch"], e["context"]], v, [batch, context])
        return total

    def allreduce(self, tp, elements):
        t = self.doc["allreduce"]["bf16"]
        v = np.array(t["ms"]).reshape(len(t["tp"]), len(t["elements"]))
        return _interp([t["tp"], t["elements"]], v, [tp, elements])

    def moe(self, model, moe_tp, tokens):
        for e in self.doc["moe"]["bf16"]:
            if e["model"] == model and e["moe_tp"] == moe_tp:
                return _interp([e["tokens"]], np.array(e["ms"]), [tokens])
        raise KeyError(model)


CHECK_MODELS = [
    # name, tp, layers, hidden, heads, kv_heads, head_dim, inter (dense) / moe, vocab
    dict(model="meta-llama/Meta-Llama-3.1-8B", tp=1, layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
         inter=14336, vocab=128256, moe=None),
    dict(model="mistralai/Mixtral-8x7B-v0.1", tp=2, layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
         inter=None, vocab=32000, moe=dict(inter=14336, experts=8, topk=2)),
]
CHECK_ISL = [128, 1024, 4096, 8192]
CHECK_DECODE_BATCH = [1, 8, 32, 128]
CHECK_DECODE_CONTEXT = [1024, 4096]


def _op_sum(t: Tables, cfg: dict, tokens: int, requests: int, attention: float) -> dict:
    """Per-op sum for one pass from the tables: body ops x layers + LM head (m = requests)."""
    tp, h, d = cfg["tp"], cfg["hidden"], cfg["head_dim"]
    q, kv = cfg["heads"] // tp, cfg["kv_heads"] // tp
    parts = {
        "qkv": t.gemm(tokens, (q + 2 * kv) * d, h),
        "o": t.gemm(tokens, h, q * d),
        "attn": attention,
    }
    if cfg["moe"]:
        parts["moe"] = t.moe(cfg["model"], tp, tokens)
    else:
        parts["gate_up"] = t.gemm(tokens, 2 * cfg["inter"] // tp, h)
        parts["down"] = t.gemm(tokens, h, cfg["inter"] // tp)
    if tp > 1:
        parts["allreduce"] = 2 * t.allreduce(tp, tokens * h)
    out = {k: v * cfg["layers"] for k, v in parts.items()}
    out["lm_head"] = t.gemm(requests, cfg["vocab"] // tp, h)
    return out


AIC_OP_GROUPS = [  # AIC op-name suffix -> the table category it corresponds to
    ("_qkv_gemm", "qkv"), ("_proj_gemm", "o"), ("_attention", "attn"), ("_gate_ffn1_gemm", "gate_up"),
    ("_ffn2_gemm", "down"), ("_moe", "moe"), ("_ar_1", "allreduce"), ("_ar_2", "allreduce"),
    ("_moe_pre_dispatch", "allreduce"), ("_moe_post_dispatch", "allreduce"), ("_logits_gemm", "lm_head"),
]


def _aic_groups(per_op) -> dict:
    """AIC's per-op list folded onto the table categories; everything else under its own name."""
    out: dict[str, float] = {}
    for name, ms, _energy, _src in per_op:
        key = next((cat for suffix, cat in AIC_OP_GROUPS if name.endswith(suffix)), None)
        if key is None:
            if ms == 0:
                continue
            key = "+" + name.split("_", 1)[1]
        out[key] = out.get(key, 0.0) + ms
    return out


def run_check(path: Path, out_dir: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tempfile

    from aic_profile import PassModel, resolve_model_path  # noqa: E402  (the repo's AIC wrappers)
    from aiconfigurator_core.sdk.engine import EngineHandle

    table_path = out_dir / "h100_sxm.json"
    if not table_path.exists():
        _fail(f"--check needs {table_path}; generate it first (--system h100_sxm)")
    doc = json.loads(table_path.read_text())
    t = Tables(doc)
    version = doc["backend_version"]
    lines = [
        f"AIC whole pass vs sum of per-layer ops from {table_path} ({doc['generator']}, "
        f"h100_sxm vllm {version}). All ms.",
        "AIC  = RustForwardPassPerfModel.from_native (scripts/aic_profile.py PassModel): context pass = one",
        "       request of isl new tokens, no prefix; decode pass = b requests each at ctx KV tokens.",
        "ops  = layers x (qkv + o + attention + [gate_up + down | moe] + [2 x allreduce if TP>1]) + LM head",
        "       (LM head at m = number of requests, as AIC does), read from the tables with multilinear",
        "       interpolation in raw coordinates; a head config not in the table is interpolated linearly in",
        "       q heads between the configs with the same GQA ratio (Mixtral TP2 (16,4) from (4,1) and (32,8)).",
        "gap  = AIC - ops.",
        "'aic:' line = AIC's own per-op values for the same pass (EngineHandle.run_static_per_op, all layers;",
        "       decode from a static batch of b at isl=ctx, osl=2, i.e. the step at ctx+1 tokens), folded onto",
        "       the same categories; '+name' = AIC ops the op sum leaves out (norms, activation, embedding,",
        "       router GEMM, embedding all-reduce). AIC's Mixtral all-reduces are its moe_pre/post_dispatch",
        "       ops (TP all-reduce of the attention and MoE outputs); its MoE uses power_law_1.2 routing while",
        "       the table holds 'balanced' (uniform) routing. AIC's MoE model has no LM-head GEMM in its",
        "       context pass (its Llama model has one); the op sum counts it in both.",
        "",
    ]
    staging = tempfile.TemporaryDirectory(prefix="aic_op_check_")
    for cfg in CHECK_MODELS:
        model_path = resolve_model_path(cfg["model"], Path(staging.name))
        config = {"schema_version": 1, "model_name": model_path,
                  "system_name": "h100_sxm", "backend": BACKEND, "backend_version": version,
                  "tp_size": cfg["tp"], "pp_size": 1, "moe_tp_size": cfg["tp"], "moe_ep_size": 1}
        model = PassModel(config)
        handle = EngineHandle.compile(model_path, "h100_sxm", BACKEND, backend_version=version, tp_size=cfg["tp"],
                                      moe_tp_size=cfg["tp"], moe_ep_size=1)
        tp = cfg["tp"]
        q, kv = cfg["heads"] // tp, cfg["kv_heads"] // tp
        lines.append(f"== {cfg['model']} TP{tp} (per GPU: {q} q heads, {kv} kv heads)")
        lines.append(f"{'pass':<22}{'AIC':>9}{'ops':>9}{'gap':>8}{'ops/AIC':>8}   breakdown")

        def row(label, aic, parts, aic_parts):
            total = sum(parts.values())
            lines.append(f"{label:<22}{aic:>9.3f}{total:>9.3f}{aic - total:>8.3f}{total / aic:>8.3f}   ops: "
                         + " ".join(f"{k}={v:.3f}" for k, v in parts.items()))
            lines.append(" " * 59 + "aic: " + " ".join(f"{k}={v:.3f}" for k, v in aic_parts.items()))

        for isl in CHECK_ISL:
            attn = t.context_attention(q, kv, 1, isl, 0)
            ctx_ops, _ = handle.run_static_per_op(batch_size=1, isl=isl, osl=2)
            row(f"context isl={isl}", model.context(isl), _op_sum(t, cfg, isl, 1, attn), _aic_groups(ctx_ops))
        for ctx in CHECK_DECODE_CONTEXT:
            for b in CHECK_DECODE_BATCH:
                attn = t.generation_attention(q, kv, b, ctx)
                _, gen_ops = handle.run_static_per_op(batch_size=b, isl=ctx, osl=2)
                row(f"decode b={b} ctx={ctx}", model.decode(b, ctx), _op_sum(t, cfg, b, b, attn),
                    _aic_groups(gen_ops))
        lines.append("")
    staging.cleanup()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {path}")


# --- CLI -----------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--system", action="append", default=[], help="AIC system (repeatable), e.g. h100_sxm")
    p.add_argument("--all", action="store_true", help="every system with a vLLM database")
    p.add_argument("--list", action="store_true", help="print the systems with a vLLM database and exit")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                   help=f"output directory (default {DEFAULT_OUT_DIR})")
    p.add_argument("--check", type=Path, metavar="FILE",
                   help="write the pass-vs-op-sum diagnostic (reads <out-dir>/h100_sxm.json)")
    args = p.parse_args(argv)
    if not (args.system or args.all or args.list or args.check):
        p.error("give --system NAME (repeatable), --all, --list or --check FILE")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.disable(logging.WARNING)  # the SDK logs every fallback table it loads
    systems = vllm_systems()
    if args.list:
        for name, version in systems.items():
            print(f"{name:22} {BACKEND} {version}")
        return 0
    wanted = list(systems) if args.all else list(dict.fromkeys(args.system))
    unknown = [name for name in wanted if name not in systems]
    if unknown:
        _fail(f"unknown system(s) {', '.join(unknown)}; systems with a {BACKEND} database: {', '.join(systems)}")
    for name in wanted:
        doc = build(name, systems[name])
        size = write(args.out_dir / f"{name}.json", doc)
        print(f"wrote {args.out_dir / (name + '.json')} ({size} bytes): {name} {BACKEND} {systems[name]}")
    if args.check:
        run_check(args.check, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
