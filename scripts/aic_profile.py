#!/usr/bin/env python3
"""Build a mocker timing profile (.npz) for a model on a GPU system from NVIDIA AIConfigurator.

AIConfigurator (``aiconfigurator-core``, Apache-2.0) ships a database of operator timings
measured per GPU system, backend and backend version, and composes them into the wall time
of one engine forward pass. This script asks it for the passes a mocker engine runs
(context-only, decode-only and mixed chunked-prefill passes) on fixed grids and writes them
in the format described in docs/profiles.md: Dynamo's five `perf_data.npz` arrays (so the
reference engine reads the same file) plus mocker's extensions (prefill with a cached
prefix, mixed passes) and a `meta_json` record (memory sizes for KV capacity, provenance).

    pip install -r scripts/requirements-profile.txt
    python scripts/aic_profile.py --model Qwen/Qwen3-32B --system b300_sxm \
        --backend vllm --tp 1 --out profiles/aic/b300-qwen3-32b-vllm-tp1.npz
    python scripts/aic_profile.py --list

No GPU is needed; a profile takes a few seconds on one CPU core.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import numpy as np

FORMAT = "mocker-profile-v1"
BACKENDS = ("vllm", "sglang", "trtllm")

# The block size each real engine uses when none is given (vLLM on CUDA: 16; SGLang's
# page size: 1; TRT-LLM's tokens_per_block: 32).
DEFAULT_BLOCK_SIZE = {"vllm": 16, "sglang": 1, "trtllm": 32}

# Per-iteration token budget used to size activation memory: vLLM's and SGLang's usual
# chunked-prefill budget and TRT-LLM's default max_num_tokens.
MEMORY_MAX_NUM_TOKENS = 8192

# --- Grids (all strictly increasing) -----------------------------------------------------
# New prompt tokens in a context-only pass (one request).
PREFILL_ISL = [1, 16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
               8192, 12288, 16384, 24576, 32768]
# Cached prefix tokens of that request.
PREFILL_PREFIX = [0, 256, 1024, 2048, 4096, 8192, 16384, 32768]
# Decode: mean context per request (columns) and total KV tokens in the batch (rows).
# Both are powers of two (plus row 0), so every cell with kv >= context is an integral
# batch of kv / context requests; cells with kv < context are a batch of one.
DECODE_CONTEXT = [16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
DECODE_KV = [0] + [2**k for k in range(4, 26)]  # 16 .. 33.5M: batch 512 at 65536 context
# Mixed chunked-prefill passes: prompt chunk x decode requests x decode context.
MIXED_PREFILL = [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
MIXED_DECODE_REQUESTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
MIXED_DECODE_CONTEXT = [128, 512, 1024, 2048, 4096, 8192, 16384, 32768]


def _quiet_sdk() -> None:
    """The SDK logs every fallback table it loads; keep stderr for our own errors."""
    logging.disable(logging.WARNING)


def _fail(message: str) -> "NoReturn":  # noqa: F821
    print(f"aic_profile: {message}", file=sys.stderr)
    sys.exit(2)


def sdk_version() -> str:
    """The installed aiconfigurator-core version (the database ships inside it)."""
    return metadata.version("aiconfigurator-core")


def list_coverage() -> None:
    """Print the systems, backends and queryable versions the installed database covers."""
    from aiconfigurator_core.sdk import perf_database
    from aiconfigurator_core.sdk.common import DefaultHFModels

    print(f"aiconfigurator-core {sdk_version()}")
    print("systems (--system), backend: queryable versions (first = default 'current' slot):")
    for system, backends in sorted(perf_database.get_supported_databases().items()):
        for backend, versions in sorted(backends.items()):
            slots = perf_database.get_version_slots(system, backend) or {}
            current = slots.get("current")
            ordered = ([current] if current else []) + [v for v in versions if v != current]
            print(f"  {system:22} {backend:7} {', '.join(ordered)}")
    print("models with a bundled config (--model):")
    for model in sorted(DefaultHFModels):
        print(f"  {model}")
    extra = sorted(_bundled_only_models())
    if extra:
        print("models whose config ships but that are outside AIC's default list (used via a staged copy):")
        for model in extra:
            print(f"  {model}")


def _model_configs_dir() -> Path:
    from importlib import resources

    return Path(str(resources.files("aiconfigurator_core") / "model_configs"))


def _bundled_only_models() -> set[str]:
    from aiconfigurator_core.sdk.common import DefaultHFModels

    out = set()
    for path in _model_configs_dir().glob("*_config.json"):
        if path.name.endswith("_hf_quant_config.json"):
            continue
        hf_id = path.name[: -len("_config.json")].replace("--", "/", 1)
        if hf_id not in DefaultHFModels:
            out.add(hf_id)
    return out


def resolve_model_path(model: str, staging: Path) -> str:
    """The path AIC should load `model` from, without touching the network.

    AIC reads configs of models on its default list from its package; a few more configs
    ship in the package but only load through a local directory, so those are staged
    into `staging/<org>--<name>/config.json`. Local directories pass through.
    """
    from aiconfigurator_core.sdk.common import DefaultHFModels

    if model in DefaultHFModels or Path(model).is_dir():
        return model
    name = model.replace("/", "--")
    config = _model_configs_dir() / f"{name}_config.json"
    if not config.exists():
        _fail(
            f"--model {model!r}: no bundled config in aiconfigurator-core {sdk_version()} and not a "
            "local directory with config.json; see --list for the models it covers"
        )
    target = staging / name
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, target / "config.json")
    quant = _model_configs_dir() / f"{name}_hf_quant_config.json"
    if quant.exists():
        shutil.copy(quant, target / "hf_quant_config.json")
    return str(target)


def resolve_version(system: str, backend: str, version: str | None) -> str:
    """The literal database version for `version` (None = the 'current' slot)."""
    from aiconfigurator_core.sdk import perf_database

    try:
        return perf_database.resolve_query_version(system, backend, version or "current")
    except Exception as exc:  # the SDK raises several types for unknown systems/versions
        _fail(f"--system {system} --backend {backend} --version {version or 'current'}: {exc}")


class PassModel:
    """One AIC forward-pass model: times a pass given its scheduled work.

    Uses `RustForwardPassPerfModel.from_native`, AIC's estimator for Dynamo's forward-pass
    metrics (the per-iteration record vLLM/SGLang/TRT-LLM workers publish): the pass is
    described by its prefill requests/tokens/cached-prefix tokens and decode
    requests/KV tokens, and AIC composes the model's operators for exactly that work
    (GEMMs and communication over all tokens of the pass, context attention per prefill
    request with its prefix, decode attention per decode request at its context).
    """

    def __init__(self, config: dict):
        from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

        self._model = RustForwardPassPerfModel.from_native(config)

    def ms(self, prefill_tokens=0, prefill_requests=0, prefix_tokens=0, decode_requests=0, decode_kv=0):
        """Wall time of one pass in ms; all token counts are sums over the pass."""
        scheduled = {
            "num_prefill_requests": int(prefill_requests),
            "sum_prefill_tokens": int(prefill_tokens),
            "var_prefill_length": 0.0,
            "sum_prefill_kv_tokens": int(prefix_tokens),
            "num_decode_requests": int(decode_requests),
            "sum_decode_kv_tokens": int(decode_kv),
            "var_decode_kv_tokens": 0.0,
        }
        fpm = {"version": 1, "worker_id": "0", "dp_rank": 0, "counter_id": 0, "wall_time": 0.0,
               "scheduled_requests": scheduled, "queued_requests": {}}
        value = self._model.estimate_forward_pass_time_ms(fpm)
        if value is None or not math.isfinite(value) or value < 0:
            raise RuntimeError(f"AIC returned {value!r} for pass {scheduled}")
        return float(value)

    def context(self, new_tokens: int, prefix: int = 0) -> float:
        """Context-only pass: one request with `new_tokens` new and `prefix` cached tokens."""
        return self.ms(prefill_tokens=new_tokens, prefill_requests=1, prefix_tokens=prefix)

    def decode(self, batch: int, context: int) -> float:
        """Decode-only pass: `batch` requests, each attending to `context` KV tokens."""
        return self.ms(decode_requests=batch, decode_kv=batch * context)

    def mixed(self, new_tokens: int, batch: int, context: int) -> float:
        """One prompt chunk (no prefix) plus `batch` decode requests at `context`."""
        return self.ms(prefill_tokens=new_tokens, prefill_requests=1,
                       decode_requests=batch, decode_kv=batch * context)


def decode_batch(kv: int, context: int) -> int:
    """Requests in a decode cell: kv / context, at least one."""
    return max(1, round(kv / context))


def sample(model: PassModel) -> dict[str, np.ndarray]:
    """All timing arrays of a profile, sampled from `model`."""
    f64 = lambda xs: np.asarray(xs, dtype=np.float64)  # noqa: E731
    prefill_ms = np.array([[model.context(n, p) for p in PREFILL_PREFIX] for n in PREFILL_ISL])
    decode_itl = np.array([[model.decode(decode_batch(kv, c), c) for c in DECODE_CONTEXT] for kv in DECODE_KV])
    mixed_ms = np.array([[[model.mixed(n, b, c) for c in MIXED_DECODE_CONTEXT]
                          for b in MIXED_DECODE_REQUESTS] for n in MIXED_PREFILL])
    return {
        "prefill_isl": f64(PREFILL_ISL),
        "prefill_ttft_ms": f64(prefill_ms[:, 0]),
        "decode_active_kv_tokens": f64(DECODE_KV),
        "decode_context_length": f64(DECODE_CONTEXT),
        "decode_itl": f64(decode_itl),
        "prefill_prefix_tokens": f64(PREFILL_PREFIX),
        "prefill_ms": f64(prefill_ms),
        "mixed_prefill_tokens": f64(MIXED_PREFILL),
        "mixed_decode_requests": f64(MIXED_DECODE_REQUESTS),
        "mixed_decode_context": f64(MIXED_DECODE_CONTEXT),
        "mixed_ms": f64(mixed_ms),
    }


def memory(model_path, system, backend, version, tp, moe_tp, moe_ep) -> dict:
    """Per-GPU memory: weights, KV bytes per token, other non-KV memory, GPU capacity."""
    from aiconfigurator_core.sdk.memory import KVCacheEstimator

    est = KVCacheEstimator.from_request(
        model_path, system, backend, version,
        max_num_tokens=MEMORY_MAX_NUM_TOKENS, max_batch_size=256,
        tp_size=tp, moe_tp_size=moe_tp, moe_ep_size=moe_ep,
    )
    b = est.breakdown
    return {
        "gpu_memory_bytes": int(b["gpu_memory_capacity_bytes"]),
        "weight_bytes_per_gpu": int(b["weights_bytes"]),
        "kv_bytes_per_token_per_gpu": int(b["kv_size_per_token_bytes"]),
        "activation_bytes_per_gpu": int(b["activations_bytes"]),
        "runtime_overhead_bytes_per_gpu": int(b["runtime_overhead_bytes"]),
        "comm_overhead_bytes_per_gpu": int(b["comm_overhead_bytes"]),
    }


def quant_modes(model_path, backend, tp, moe_tp, moe_ep) -> dict:
    """The precisions AIC infers from the model's config (weights, MoE, KV cache, attention)."""
    from aiconfigurator_core.sdk.config_builders import build_model_config
    from aiconfigurator_core.sdk.models import get_model

    cfg = build_model_config(tp_size=tp, pp_size=1, attention_dp_size=1, moe_tp_size=moe_tp, moe_ep_size=moe_ep)
    built = get_model(model_path, cfg, backend).config
    keys = ("gemm_quant_mode", "moe_quant_mode", "kvcache_quant_mode", "fmha_quant_mode", "comm_quant_mode")
    return {k: getattr(getattr(built, k, None), "name", None) for k in keys}


def op_sources(model_path, system, backend, version, tp, moe_tp, moe_ep) -> dict:
    """Where AIC's answer for each operator comes from, on two representative passes.

    'silicon' = measured rows of the database; 'empirical' = AIC's fitted/roofline
    estimate (used e.g. for norms, activations and TP=1 all-reduce placeholders);
    'mixed' = both across the op's layers or sub-queries.
    """
    from aiconfigurator_core.sdk.engine import EngineHandle

    handle = EngineHandle.compile(model_path, system, backend, backend_version=version, tp_size=tp,
                                  moe_tp_size=moe_tp, moe_ep_size=moe_ep)
    ctx, _ = handle.run_static_per_op(batch_size=1, isl=4096, osl=2)
    _, gen = handle.run_static_per_op(batch_size=64, isl=4096, osl=2)

    def fold(ops):
        return {name: src for name, _lat, _energy, src in ops}

    return {"context_1x4096": fold(ctx), "decode_64x4096": fold(gen)}


def build(args) -> tuple[dict[str, np.ndarray], dict]:
    """Sample the profile and its metadata for the parsed CLI arguments."""
    version = resolve_version(args.system, args.backend, args.version)
    moe_tp = args.moe_tp if args.moe_tp is not None else args.tp // args.moe_ep
    if moe_tp * args.moe_ep != args.tp:
        _fail(f"--moe-tp {moe_tp} x --moe-ep {args.moe_ep} must equal --tp {args.tp}")
    with tempfile.TemporaryDirectory(prefix="aic_profile_") as staging:
        model_path = resolve_model_path(args.model, Path(staging))
        config = {
            "schema_version": 1, "model_name": model_path, "system_name": args.system,
            "backend": args.backend, "backend_version": version, "tp_size": args.tp, "pp_size": 1,
            "moe_tp_size": moe_tp, "moe_ep_size": args.moe_ep,
        }
        try:
            model = PassModel(config)
            arrays = sample(model)
            mem = memory(model_path, args.system, args.backend, version, args.tp, moe_tp, args.moe_ep)
            sources = op_sources(model_path, args.system, args.backend, version, args.tp, moe_tp, args.moe_ep)
            quant = quant_modes(model_path, args.backend, args.tp, moe_tp, args.moe_ep)
        except SystemExit:
            raise
        except Exception as exc:
            _fail(f"AIConfigurator cannot model {args.model} on {args.system}/{args.backend} "
                  f"{version} TP{args.tp}: {exc}")
    meta = {
        "format": FORMAT,
        "model": args.model,
        "system": args.system,
        "backend": args.backend,
        "backend_version": version,
        "tp": args.tp,
        "moe_tp": moe_tp,
        "moe_ep": args.moe_ep,
        "generator": f"aiconfigurator-core {sdk_version()}",
        **{k: mem[k] for k in ("gpu_memory_bytes", "weight_bytes_per_gpu", "kv_bytes_per_token_per_gpu")},
        "default_block_size": DEFAULT_BLOCK_SIZE[args.backend],
        "non_kv_bytes_per_gpu": {k: mem[k] for k in (
            "activation_bytes_per_gpu", "runtime_overhead_bytes_per_gpu", "comm_overhead_bytes_per_gpu")},
        "memory_max_num_tokens": MEMORY_MAX_NUM_TOKENS,
        "quant_modes": quant,
        "op_sources": sources,
        "command": " ".join(["python", "scripts/aic_profile.py"] + _canonical_args(args)),
        "notes": (
            "Pass times in ms from aiconfigurator-core's RustForwardPassPerfModel (native, no "
            "tuning). Context passes: one request, no cached prefix (prefill_ttft_ms) or the "
            "given cached prefix (prefill_ms). Decode passes: batch = max(1, kv/context) requests "
            "all at the column's context (no length variance). Mixed passes: one prompt chunk "
            "with no prefix plus the decode batch. Memory from AIC's backend memory model at "
            f"max_num_tokens={MEMORY_MAX_NUM_TOKENS}. See docs/profiles.md."
        ),
    }
    return arrays, meta


def _canonical_args(args) -> list[str]:
    out = ["--model", args.model, "--system", args.system, "--backend", args.backend]
    if args.version:
        out += ["--version", args.version]
    out += ["--tp", str(args.tp)]
    if args.moe_ep != 1:
        out += ["--moe-ep", str(args.moe_ep)]
    if args.moe_tp is not None:
        out += ["--moe-tp", str(args.moe_tp)]
    return out + ["--out", str(args.out)]


def write(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write the profile (uncompressed .npz; meta_json as UTF-8 bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta_bytes = np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays, meta_json=meta_bytes)
    os.replace(tmp, path)


def read_meta(path: Path) -> dict:
    """The meta_json record of a profile file."""
    with np.load(path) as npz:
        return json.loads(npz["meta_json"].tobytes().decode("utf-8"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the systems, backends, versions and models covered")
    p.add_argument("--model", help="HuggingFace id (as AIC names it, e.g. meta-llama/Meta-Llama-3.1-8B) or a local dir with config.json")
    p.add_argument("--system", help="AIC system, e.g. h100_sxm, h200_sxm, b200_sxm, b300_sxm")
    p.add_argument("--backend", choices=BACKENDS)
    p.add_argument("--version", help="backend version in the database (default: its 'current' slot)")
    p.add_argument("--tp", type=int, help="tensor-parallel size (GPUs per engine)")
    p.add_argument("--moe-ep", type=int, default=1, help="MoE expert-parallel size (default 1: experts sharded by TP, vLLM's default)")
    p.add_argument("--moe-tp", type=int, help="MoE tensor-parallel size (default tp / moe-ep)")
    p.add_argument("--out", type=Path, help="output .npz path")
    args = p.parse_args(argv)
    if args.list:
        return args
    missing = [f"--{k}" for k in ("model", "system", "backend", "tp", "out") if getattr(args, k) is None]
    if missing:
        p.error(f"missing {', '.join(missing)} (or use --list)")
    if args.tp < 1 or args.moe_ep < 1 or (args.moe_tp is not None and args.moe_tp < 1):
        p.error("--tp, --moe-tp and --moe-ep must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    _quiet_sdk()
    if args.list:
        list_coverage()
        return 0
    arrays, meta = build(args)
    write(args.out, arrays, meta)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size} bytes): {meta['model']} on {meta['system']} "
          f"{meta['backend']} {meta['backend_version']} TP{meta['tp']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
