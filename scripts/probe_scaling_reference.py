#!/usr/bin/env python3
"""Probe the reference (ai-dynamo-runtime 1.6.1, module dynamo._core) on its in-the-loop scaling
policy, its telemetry sampler, SLA goodput and KV-event lag. Prints one JSON line per case with
its inputs (workload, engine args, replay options, the policy's timetable) and what the reference
did: every snapshot handed to the policy, `lifecycle_operations`, telemetry samples, `coverage`,
summary figures, and a few checks derived from per-request records (which are not kept).
docs/scaling.md explains the results; tests/fixtures/scaling_reference.json pins one run.

Usage: python3 scripts/probe_scaling_reference.py [--fixture tests/fixtures/scaling_reference.json]
           [--only PREFIX]
The reference runs in the interpreter named by env MOCKER_DYNAMO_PYTHON, else in this one
(`pip install ai-dynamo-runtime==1.6.1` there). Every replay is small (a few hundred requests);
the whole probe takes a few seconds on 2 cores, one reference process. Not part of CI.

Determinism: round-robin cases are bit-reproducible. kv_router cases are not (the reference breaks
routing ties with an unseeded RNG), so their figures vary slightly from run to run.
"""
import json
import os
import statistics
import tempfile

import reference_probe

# Headline figures kept from the reference's summary.
SUMMARY_KEYS = [
    "num_requests", "completed_requests", "total_input_tokens", "total_output_tokens",
    "duration_ms", "request_throughput_rps", "output_throughput_tok_s",
    "prefill_worker_seconds", "decode_worker_seconds", "prefill_gpus_per_worker",
    "decode_gpus_per_worker", "gpu_hours", "goodput_completed_requests",
    "goodput_request_throughput_rps", "goodput_output_throughput_tok_s", "mean_ttft_ms",
    "p99_ttft_ms", "mean_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms",
    "prefix_cache_reused_ratio",
]

ENGINE = {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256,
          "max_num_batched_tokens": 8192}

# Main workload: 300 requests, 512-token prompts, 256 output tokens, Poisson 20 req/s (seed 42):
# about 15 s of arrivals; long enough outputs that a drain lasts a few seconds.
MAIN_WL = {"input_tokens": 512, "output_tokens": 256, "request_count": 300,
           "request_rate": 20.0, "arrival_seed": 42}
# Shared-prefix workload for the KV-event lag cases: 3/4 of each 1024-token prompt shared
# within 4 prefix groups.
LAG_WL = {"input_tokens": 1024, "output_tokens": 32, "request_count": 200, "request_rate": 20.0,
          "arrival_seed": 42, "shared_prefix_ratio": 0.75, "num_prefix_groups": 4}

# The scripted policies. Each entry (at_ms, target_prefill, target_decode) is the desired count
# from at_ms on; the policy returns the latest entry's targets on every tick (so it repeats a
# target that is already pending or reached, as a real planner does), None before the first.
AGG_PLAN = [(2000.0, None, 3), (8000.0, None, 1)]
DISAGG_PLAN = [(2000.0, 2, 3), (8000.0, 1, 1)]
# SLA of the main cases (tight enough that only some requests are good).
SLA = {"sla_ttft_ms": 50.0, "sla_itl_ms": 8.0}


def launch(worker_type=None, startup_s=None, **engine):
    eng = dict(ENGINE, **engine)
    if worker_type:
        eng["worker_type"] = worker_type
    cfg = {"engine": eng}
    if startup_s is not None:
        cfg["startup_time"] = startup_s  # seconds
    return cfg


class Timetable:
    """Deterministic scaling policy: ticks at `first_ms`, then every `every_ms` (None: stop)."""

    def __init__(self, plan, first_ms=0.0, every_ms=1000.0, until_ms=None):
        self.plan, self.first_ms, self.every_ms = plan, first_ms, every_ms
        self.until_ms = until_ms  # no tick is re-armed from a tick at or after this time
        self.snapshots = []
        self.decisions = []

    def initial_tick_ms(self):
        return self.first_ms

    def on_tick(self, snap):
        self.snapshots.append(snap)
        now = snap["now_ms"]
        tp = td = None
        for at, p, d in self.plan:
            if at <= now:
                tp, td = p, d
        nxt = None if self.every_ms is None else now + self.every_ms
        if self.until_ms is not None and now >= self.until_ms:
            nxt = None
        dec = {"target_prefill": tp, "target_decode": td, "next_tick_ms": nxt}
        self.decisions.append(dec)
        return dec


class RawPolicy:
    """Returns whatever `decide(snapshot)` gives, for the error and edge cases."""

    def __init__(self, decide, first_ms=0.0):
        self.decide, self.first_ms, self.ticks = decide, first_ms, []

    def initial_tick_ms(self):
        return self.first_ms

    def on_tick(self, snap):
        self.ticks.append((snap["now_ms"], snap["traffic"]["duration_s"]))
        return self.decide(snap)


def brief_tick(s):
    return {"tick_ordinal": s["tick_ordinal"], "now_ms": s["now_ms"],
            "prefill": [s["active_prefill_ids"], s["starting_prefill_ids"],
                        s["draining_prefill_ids"]],
            "decode": [s["active_decode_ids"], s["starting_decode_ids"],
                       s["draining_decode_ids"]],
            "prefill_fpm_workers": [f["worker_id"] for f in s["prefill_fpm_snapshots"]],
            "decode_fpm_workers": [f["worker_id"] for f in s["decode_fpm_snapshots"]],
            "traffic_num_req": s["traffic"]["num_req"],
            "traffic_shape_count": s["traffic"]["shape_count"]}


def brief_op(op):
    return {"operation_ordinal": op["operation_ordinal"], "at_ms": op["at_ms"],
            "pool": op["pool"], "cause": op["cause"],
            "planner_tick_ordinal": op["planner_tick_ordinal"],
            "origin_operation_ordinal": op["origin_operation_ordinal"],
            "transitions": [[t["worker_id"], t["transition"], t["prior_state"], t.get("reason"),
                             t.get("origin_operation_ordinal")] for t in op["transitions"]],
            "state_after_batch": op["state_after_batch"],
            "released": len(op["topology_released_request_uuids"])}


def summary_of(r):
    s = r.summary if hasattr(r, "summary") else r
    return {k: s[k] for k in SUMMARY_KEYS if k in s}


def synth(c, wl, **kw):
    args = dict(wl)
    n_in, n_out, n = args.pop("input_tokens"), args.pop("output_tokens"), args.pop("request_count")
    return c.run_mocker_synthetic_trace_replay(n_in, n_out, n, **args, **kw)


def err(ex):
    return {"type": type(ex).__name__, "message": str(ex)}


# --- derived checks (per-request records are used, not kept) -----------------------------------
def lifecycle_times(ops):
    """{(pool, worker): {"ready": t, "draining": t, "removed": t, "starting": t}}."""
    out = {}
    for op in ops:
        for t in op["transitions"]:
            key = f'{op["pool"]}:{t["worker_id"]}'
            out.setdefault(key, {})[t["transition"].replace("worker_", "")] = op["at_ms"]
    return out


def worker_usage(per_request, disagg):
    """Per pool and worker: requests routed there, first/last routing time, last release."""
    use = {}
    for q in per_request:
        if disagg:
            # Prefill is routed at arrival; decode when the prefill pass ends (source_held_ms,
            # no KV-transfer delay configured here).
            rows = [("prefill", q["prefill_worker_idx"], q["arrival_time_ms"],
                     q["source_released_ms"]),
                    ("decode", q["decode_worker_idx"], q["source_held_ms"],
                     q["terminal_time_ms"])]
        else:
            rows = [("agg", q["decode_worker_idx"], q["arrival_time_ms"], q["terminal_time_ms"])]
        for pool, w, at, end in rows:
            u = use.setdefault(f"{pool}:{w}", {"requests": 0, "first_routed_ms": at,
                                                "last_routed_ms": at, "last_release_ms": end})
            u["requests"] += 1
            u["first_routed_ms"] = min(u["first_routed_ms"], at)
            u["last_routed_ms"] = max(u["last_routed_ms"], at)
            u["last_release_ms"] = max(u["last_release_ms"], end)
    return use


def lifecycle_checks(ops, per_request, disagg, initial):
    times, use = lifecycle_times(ops), worker_usage(per_request, disagg)
    checks = {}
    for key, u in sorted(use.items()):
        t = times.get(key, {})
        c = {"requests": u["requests"], "first_routed_ms": u["first_routed_ms"],
             "last_routed_ms": u["last_routed_ms"], "last_release_ms": u["last_release_ms"]}
        if "ready" in t:
            c["ready_ms"] = t["ready"]
            c["no_work_before_ready"] = u["first_routed_ms"] >= t["ready"]
        if "draining" in t:
            c["draining_ms"] = t["draining"]
            c["no_new_work_after_drain"] = u["last_routed_ms"] <= t["draining"]
        if "removed" in t:
            c["removed_ms"] = t["removed"]
            # Removed as soon as it is draining and holds nothing: at the drain decision if
            # idle then, else when its last request releases it.
            c["removed_at_max_of_drain_and_last_release"] = abs(
                t["removed"] - max(t.get("draining", 0.0), u["last_release_ms"])) < 1e-6
        checks[key] = c
    ids = sorted(q["uuid"] for q in per_request)
    checks["every_request_once"] = len(ids) == len(set(ids)) == initial
    return checks


def window_traffic(per_request, lo, hi, first):
    arr = [q for q in per_request
           if (q["arrival_time_ms"] >= lo if first else q["arrival_time_ms"] > lo)
           and q["arrival_time_ms"] <= hi]
    done = [q for q in per_request if q["terminal_status"] == "completed"
            and (q["terminal_time_ms"] >= lo if first else q["terminal_time_ms"] > lo)
            and q["terminal_time_ms"] <= hi]
    ttft = [q["ttft_ms"] for q in done if q["ttft_ms"] and q["ttft_ms"] > 0]
    itl = [q["itl_ms"] for q in done if q["output_length"] > 1]
    return {"num_req": len(arr), "shape_count": len(done),
            "avg_isl": statistics.mean([q["input_length"] for q in done]) if done else 0.0,
            "avg_osl": statistics.mean([q["output_length"] for q in done]) if done else 0.0,
            "avg_ttft_ms": statistics.mean(ttft) if ttft else 0.0,
            "avg_itl_ms": statistics.mean(itl) if itl else 0.0}


def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def traffic_checks(snaps, samples, per_request):
    """Recompute the policy's and the telemetry's traffic windows from per-request records."""
    bad_ticks, prev = [], 0.0
    for i, s in enumerate(snaps):
        want = window_traffic(per_request, prev, s["now_ms"], i == 0)
        got = s["traffic"]
        if not (got["num_req"] == want["num_req"] and got["shape_count"] == want["shape_count"]
                and all(close(got[k], want[k])
                        for k in ("avg_isl", "avg_osl", "avg_ttft_ms", "avg_itl_ms"))):
            bad_ticks.append({"tick": s["tick_ordinal"], "got": got, "recomputed": want})
        prev = s["now_ms"]
    bad_samples = []
    for s in samples:
        if s["kind"] == "baseline":
            continue
        want = window_traffic(per_request, s["interval_start_ms"], s["sampled_at_ms"],
                              s["interval_start_ms"] == 0.0)
        got = s["traffic"]
        if not (got["arriving_requests"] == want["num_req"]
                and got["completed_requests"] == want["shape_count"]
                and close(got["avg_ttft_ms"], want["avg_ttft_ms"])
                and close(got["avg_itl_ms"], want["avg_itl_ms"])):
            bad_samples.append({"sample": s["sample_ordinal"], "got": got, "recomputed": want})
    return {"policy_traffic_matches_per_request": not bad_ticks,
            "policy_traffic_mismatches": bad_ticks[:3],
            "telemetry_traffic_matches_per_request": not bad_samples,
            "telemetry_traffic_mismatches": bad_samples[:3]}


def goodput_recount(per_request, duration_ms, sla):
    good = []
    for q in per_request:
        if q["terminal_status"] != "completed":
            continue
        ok = True
        if sla.get("sla_e2e_ms") is not None and q["e2e_latency_ms"] > sla["sla_e2e_ms"]:
            ok = False
        if sla.get("sla_ttft_ms") is not None and q["ttft_ms"] > sla["sla_ttft_ms"]:
            ok = False
        if sla.get("sla_itl_ms") is not None and q["output_length"] > 1:
            avg_itl = (q["e2e_latency_ms"] - q["ttft_ms"]) / (q["output_length"] - 1)
            if avg_itl > sla["sla_itl_ms"]:
                ok = False
        if ok:
            good.append(q)
    dur_s = max(duration_ms / 1000.0, 1e-9)
    return {"goodput_completed_requests": len(good),
            "goodput_request_throughput_rps": len(good) / dur_s,
            "goodput_output_throughput_tok_s": sum(q["output_length"] for q in good) / dur_s}


# --- cases ----------------------------------------------------------------------------------------
def scaling_case(c, name, router_mode, disagg, what):
    if disagg:
        pol = Timetable(DISAGG_PLAN)
        topo = {"prefill_engine_args": launch("prefill", 1.0),
                "decode_engine_args": launch("decode", 2.0),
                "num_prefill_workers": 1, "num_decode_workers": 1}
    else:
        pol = Timetable(AGG_PLAN)
        topo = {"extra_engine_args": launch(startup_s=1.5), "num_workers": 1}
    opts = dict(topo, router_mode=router_mode, capture_telemetry=True,
                telemetry_sample_interval_ms=1000.0, sla_ttft_ms=SLA["sla_ttft_ms"],
                sla_itl_ms=SLA["sla_itl_ms"], capture_per_request=True)
    rec = {"case": name, "what": what, "workload": MAIN_WL,
           "replay": {k: v for k, v in opts.items() if k != "capture_per_request"},
           "policy": {"first_tick_ms": pol.first_ms, "every_ms": pol.every_ms,
                      "plan_at_ms_prefill_decode": DISAGG_PLAN if disagg else AGG_PLAN},
           "deterministic": router_mode == "round_robin"}
    r = synth(c, MAIN_WL, scaling_policy=pol, **opts)
    pr = r.per_request
    rec["summary"] = summary_of(r)
    rec["coverage"] = r.coverage
    rec["ticks"] = [brief_tick(s) for s in pol.snapshots]
    rec["snapshots"] = pol.snapshots
    rec["decisions"] = pol.decisions
    rec["lifecycle_operations"] = r.lifecycle_operations
    rec["telemetry"] = r.telemetry
    rec["checks"] = {
        "lifecycle": lifecycle_checks(r.lifecycle_operations, pr, disagg,
                                      MAIN_WL["request_count"]),
        **traffic_checks(pol.snapshots, r.telemetry["samples"], pr),
        "goodput_recount": goodput_recount(pr, r.summary["duration_ms"],
                                           SLA),
        "telemetry_sample_times": [[s["kind"], s["sampled_at_ms"]]
                                   for s in r.telemetry["samples"]],
    }
    # The same workload without a policy: pools stay at their initial size.
    base = synth(c, MAIN_WL, **{k: v for k, v in opts.items()
                                if k not in ("capture_telemetry", "capture_per_request")})
    rec["without_policy_summary"] = summary_of(base)
    return rec


def small_scaling(c, name, what, plan_fn, wl=None, first_ms=0.0, every_ms=500.0, raw=False,
                  until_ms=None, **opts):
    wl = wl or {"input_tokens": 500, "output_tokens": 50, "request_count": 60,
                "request_rate": 20.0, "arrival_seed": 42}
    rec = {"case": name, "what": what, "workload": wl,
           "replay": {k: (repr(v) if k == "router_config" else v) for k, v in opts.items()},
           "deterministic": opts.get("router_mode", "round_robin") == "round_robin"}
    pol = (RawPolicy(plan_fn, first_ms) if raw
           else Timetable(plan_fn, first_ms=first_ms, every_ms=every_ms, until_ms=until_ms))
    if not raw:
        rec["policy"] = {"first_tick_ms": first_ms, "every_ms": every_ms, "until_ms": until_ms,
                         "plan_at_ms_prefill_decode": plan_fn}
    try:
        r = synth(c, wl, scaling_policy=pol, **opts)
        rec["summary"] = summary_of(r)
        rec["coverage"] = r.coverage
        rec["lifecycle"] = [brief_op(op) for op in r.lifecycle_operations]
        if r.telemetry:
            rec["router_pending_decode_requests"] = [
                s["router_pending_decode_requests"] for s in r.telemetry["samples"]]
    except Exception as ex:  # noqa: BLE001 - a refusal is a finding
        rec["error"] = err(ex)
    rec["ticks"] = ([brief_tick(s) for s in pol.snapshots] if not raw
                    else [{"now_ms": t, "traffic_duration_s": d} for t, d in pol.ticks])
    return rec


def semantics_cases(c):
    out = []
    agg = {"extra_engine_args": launch(startup_s=1.0), "num_workers": 1}
    out.append(small_scaling(
        c, "S1_no_startup_time", "startup_time unset: a new worker serves at the decision time",
        [(500.0, None, 3), (1500.0, None, 1)], extra_engine_args=launch(), num_workers=1))
    out.append(small_scaling(
        c, "S2_cancel_during_startup", "up to 4 at 500 ms, down to 2 at 1000 ms: the two highest "
        "starting ids are cancelled", [(500.0, None, 4), (1000.0, None, 2)], **agg))
    out.append(small_scaling(
        c, "S3_rescale_while_draining", "3 -> 1 -> 2 without start-up: draining workers are not "
        "reclaimed; a fresh id is added", [(0.0, None, 3), (1500.0, None, 1), (2000.0, None, 2)],
        wl={"input_tokens": 500, "output_tokens": 400, "request_count": 60,
            "request_rate": 20.0, "arrival_seed": 42},
        extra_engine_args=launch(), num_workers=1))
    out.append(small_scaling(
        c, "S4_zero_round_robin", "target 0 with round robin: the next arrival fails",
        [(500.0, None, 0)], **agg))
    out.append(small_scaling(
        c, "S5_zero_kv_router", "target 0 with kv_router (no router queue): the next arrival "
        "fails", [(500.0, None, 0)], router_mode="kv_router",
        extra_engine_args=launch(startup_s=1.0), num_workers=2))
    out.append(small_scaling(
        c, "S6_zero_kv_router_queue", "target 0 then 2 with kv_router and router_queue_threshold:"
        " arrivals wait in the router queue until new workers are ready",
        [(500.0, None, 0), (1000.0, None, 2)],
        wl={"input_tokens": 2000, "output_tokens": 64, "request_count": 100,
            "request_rate": 40.0, "arrival_seed": 42},
        router_mode="kv_router", router_config=c.KvRouterConfig(router_queue_threshold=0.5),
        extra_engine_args=launch(startup_s=1.0, max_num_batched_tokens=2048), num_workers=2,
        capture_telemetry=True, telemetry_sample_interval_ms=250.0))
    out.append(small_scaling(
        c, "S7_large_target", "no upper bound: 200 workers at once",
        [(0.0, None, 200)], every_ms=None, extra_engine_args=launch(), num_workers=1))
    out.append(small_scaling(
        c, "S8_agg_ignores_target_prefill", "aggregated: target_prefill is ignored",
        [(500.0, 7, None)], **agg))
    dis = {"prefill_engine_args": launch("prefill", 0.5), "decode_engine_args": launch("decode",
                                                                                       0.5)}
    out.append(small_scaling(
        c, "S9_disagg_prefill_only", "disaggregated: only target_prefill set; decode keeps its "
        "non-draining count", [(500.0, 3, None)], **dis))
    # A disaggregated pool at 0 makes requests wait, not fail. With a recurring tick the run
    # goes on (simulated time advances tick by tick) until the policy restores capacity; a
    # policy that keeps ticking and never does so makes the reference run forever, hence
    # until_ms here.
    for rm in ("round_robin", "kv_router"):
        out.append(small_scaling(
            c, f"S10_disagg_zero_prefill_then_one_{rm}", "disaggregated: prefill 0 at 500 ms, "
            "1 at 1500 ms: arrivals wait and are served once the new prefill worker is ready",
            [(500.0, 0, None), (1500.0, 1, None)], until_ms=5000.0, router_mode=rm, **dis))
        out.append(small_scaling(
            c, f"S10b_disagg_zero_decode_no_more_ticks_{rm}", "disaggregated: decode 0 at "
            "500 ms and no further tick: dead end", [(500.0, None, 0)], first_ms=500.0,
            every_ms=None, router_mode=rm, **dis))
    out.append(small_scaling(
        c, "S11_capture_planner_details_false", "capture_planner_details=False: no lifecycle "
        "operations are recorded", [(500.0, None, 2)], capture_planner_details=False, **agg))
    out.append(small_scaling(
        c, "S12_idle_worker_removed_at_once", "2 workers, sparse short requests; target 1 at "
        "500 ms while worker 1 is idle: draining and removal in one operation",
        [(500.0, None, 1)], wl={"input_tokens": 200, "output_tokens": 10, "request_count": 4,
                                "arrival_interval_ms": 1000.0},
        extra_engine_args=launch(), num_workers=2))
    # Tick timing rules.
    for nm, first, nxt in [("T1_next_tick_none", 0.0, lambda s: None),
                           ("T2_next_tick_not_after_now", 0.0, lambda s: s["now_ms"]),
                           ("T3_initial_negative", -100.0, lambda s: s["now_ms"] + 1000.0),
                           ("T4_initial_nan", float("nan"), lambda s: s["now_ms"] + 1000.0),
                           ("T5_initial_inf", float("inf"), lambda s: s["now_ms"] + 1000.0),
                           ("T6_initial_after_end", 1e9, lambda s: s["now_ms"] + 1000.0),
                           ("T7_initial_750_every_1000", 750.0,
                            lambda s: s["now_ms"] + 1000.0)]:
        rec = small_scaling(
            c, nm, "tick timing", (lambda nx: lambda s: {"target_prefill": None,
                                                         "target_decode": None,
                                                         "next_tick_ms": nx(s)})(nxt),
            first_ms=first, raw=True, **agg)
        rec["policy"] = {"initial_tick_ms": repr(first)}
        out.append(rec)
    # Ticks and telemetry do not perturb the simulation.
    wl = {"input_tokens": 1000, "output_tokens": 200, "request_count": 40, "request_rate": 20.0,
          "arrival_seed": 42}
    small = {"extra_engine_args": launch(num_gpu_blocks=200)}
    plain = synth(c, wl, **small).summary
    sampled = synth(c, wl, capture_telemetry=True, telemetry_sample_interval_ms=37.0,
                    **small).summary
    ticked = synth(c, wl, scaling_policy=RawPolicy(
        lambda s: {"target_prefill": None, "target_decode": None,
                   "next_tick_ms": s["now_ms"] + 13.0}), **small).summary
    skip = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
    out.append({"case": "P1_no_perturbation", "what": "same workload (200-block cache, with "
                "preemptions) plain, with telemetry every 37 ms, and with a no-op policy "
                "ticking every 13 ms: summary keys that differ", "workload": wl,
                "differing_keys": {k: [plain[k], sampled[k], ticked[k]] for k in plain
                                   if k not in skip
                                   and not plain[k] == sampled[k] == ticked[k]}})
    # Idle FPM: sparse arrivals, ticks every 500 ms.
    pol = Timetable([], first_ms=0.0, every_ms=500.0)
    wl = {"input_tokens": 500, "output_tokens": 20, "request_count": 4,
          "arrival_interval_ms": 1700.0}
    r = synth(c, wl, scaling_policy=pol, extra_engine_args=launch(), num_workers=1)
    out.append({"case": "F1_idle_fpm", "what": "a worker without a pass for >= 1000 ms gets an "
                "all-zero FPM snapshot", "workload": wl, "summary": summary_of(r),
                "fpm": [{"now_ms": s["now_ms"], "decode_fpm_snapshots": s["decode_fpm_snapshots"]}
                        for s in pol.snapshots]})
    return out


def telemetry_cases(c):
    out = []
    # Preemptions: a tiny KV cache.
    wl = {"input_tokens": 1000, "output_tokens": 200, "request_count": 40, "request_rate": 20.0,
          "arrival_seed": 42}
    r = synth(c, wl, extra_engine_args=launch(num_gpu_blocks=200), capture_telemetry=True,
              telemetry_sample_interval_ms=500.0)
    out.append({"case": "M1_preemptions", "what": "num_gpu_blocks 200: preemptions per interval",
                "workload": wl, "summary": summary_of(r), "telemetry": r.telemetry})
    # Scheduler cache hits: SGLang with shared prefixes.
    wl = {"input_tokens": 1024, "output_tokens": 16, "request_count": 40, "request_rate": 20.0,
          "arrival_seed": 42, "shared_prefix_ratio": 0.75, "num_prefix_groups": 2}
    r = synth(c, wl, extra_engine_args=launch(backend="sglang"), capture_telemetry=True,
              telemetry_sample_interval_ms=500.0)
    out.append({"case": "M2_sglang_cache_hits", "what": "SGLang backend: cache_hit_tokens / "
                "cache_total_tokens per interval", "workload": wl, "summary": summary_of(r),
                "interval_metrics": [[s["kind"], s["sampled_at_ms"], s["decode_interval_metrics"]]
                                     for s in r.telemetry["samples"]]})
    r = synth(c, wl, extra_engine_args=launch(), capture_telemetry=True,
              telemetry_sample_interval_ms=500.0)
    out.append({"case": "M3_vllm_cache_hits", "what": "vLLM backend, same workload: cache hit "
                "counters stay 0", "workload": wl, "summary": summary_of(r),
                "interval_metrics": [[s["kind"], s["sampled_at_ms"], s["decode_interval_metrics"]]
                                     for s in r.telemetry["samples"]]})
    # Callback / JSONL / capture together.
    wl = {"input_tokens": 500, "output_tokens": 50, "request_count": 40, "request_rate": 20.0,
          "arrival_seed": 42}
    got = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sub", "telemetry.jsonl")
        r = synth(c, wl, extra_engine_args=launch(), capture_telemetry=True,
                  telemetry_sample_interval_ms=700.0, telemetry_callback=got.append,
                  telemetry_jsonl_path=path)
        lines = open(path).read().splitlines()
    out.append({"case": "M4_callback_jsonl_capture",
                "what": "interval 700 ms: callback, JSONL (parent dirs created) and capture",
                "workload": wl, "summary": summary_of(r),
                "callback_types": sorted({type(s).__name__ for s in got}),
                "callback_equals_captured": got == r.telemetry["samples"],
                "jsonl_equals_captured": [json.loads(x) for x in lines] == r.telemetry["samples"],
                "jsonl_first_line": lines[0],
                "sample_times": [[s["kind"], s["interval_start_ms"], s["sampled_at_ms"]]
                                 for s in got]})
    only_cb = []
    r = synth(c, wl, extra_engine_args=launch(), telemetry_callback=only_cb.append)
    out.append({"case": "M5_callback_only", "what": "callback without capture_telemetry: "
                "result.telemetry is None", "telemetry_is_none": r.telemetry is None,
                "samples_seen_by_callback": len(only_cb), "coverage": r.coverage})
    r = synth(c, wl, extra_engine_args=launch(), telemetry_sample_interval_ms=5.0)
    out.append({"case": "M6_interval_without_sink", "what": "interval alone enables nothing",
                "telemetry_is_none": r.telemetry is None})
    return out


def goodput_cases(c):
    out = []
    wl = {"input_tokens": 1000, "output_tokens": 64, "request_count": 200, "request_rate": 20.0,
          "arrival_seed": 3}
    for sla in [{"sla_ttft_ms": 60.0}, {"sla_itl_ms": 14.0}, {"sla_ttft_ms": 60.0,
                                                               "sla_itl_ms": 14.0},
                {"sla_e2e_ms": 800.0}]:
        r = synth(c, wl, extra_engine_args=launch(), capture_per_request=True, **sla)
        s = r.summary
        rec = {"case": "G_" + "_".join(f"{k[4:]}{v:g}" for k, v in sla.items()),
               "workload": wl, "sla": sla,
               "goodput": {k: s[k] for k in s if k.startswith("goodput_")},
               "recount_per_request_avg_itl": goodput_recount(r.per_request, s["duration_ms"],
                                                              sla),
               "max_itl_ms": s["max_itl_ms"], "mean_itl_ms": s["mean_itl_ms"],
               "duration_ms": s["duration_ms"], "completed_requests": s["completed_requests"]}
        out.append(rec)
    r = synth(c, wl, extra_engine_args=launch())
    out.append({"case": "G_none", "workload": wl,
                "goodput_keys": [k for k in r.summary if k.startswith("goodput_")]})
    r = synth(c, {"input_tokens": 500, "output_tokens": 50, "request_count": 40,
                  "arrival_interval_ms": 1.0}, extra_engine_args=launch(), replay_mode="online",
              sla_ttft_ms=50.0)
    out.append({"case": "G_online", "what": "online replay also reports goodput",
                "deterministic": False,
                "goodput": {k: r[k] for k in r if k.startswith("goodput_")}})
    return out


def lag_cases(c):
    out = []
    for lag in [None, 0.0, 200.0, 2000.0, 1e7]:
        r = synth(c, LAG_WL, extra_engine_args=launch(), num_workers=4, router_mode="kv_router",
                  kv_event_lag_ms=lag, capture_per_request=True, capture_telemetry=True,
                  telemetry_sample_interval_ms=1000.0)
        ov = [h["reported_overlap_tokens"] for q in r.per_request for h in q["routing_history"]]
        out.append({"case": f"L_lag_{lag}", "workload": LAG_WL,
                    "replay": {"num_workers": 4, "router_mode": "kv_router",
                               "kv_event_lag_ms": lag},
                    "deterministic": False, "summary": summary_of(r),
                    "mean_routed_overlap_tokens": statistics.mean(ov),
                    "requests_with_overlap": sum(1 for o in ov if o > 0),
                    "router_kv_hit_rate_per_second": [
                        [s["sampled_at_ms"], s["traffic"]["avg_router_kv_hit_rate"],
                         s["traffic"]["router_kv_hit_rate_count"]]
                        for s in r.telemetry["samples"]],
                    "last_sample_ms": r.telemetry["samples"][-1]["sampled_at_ms"]})
    for lag in [0.0, 50.0]:
        rec = {"case": f"L_round_robin_lag_{lag}", "replay": {"router_mode": "round_robin",
                                                              "kv_event_lag_ms": lag}}
        try:
            r = synth(c, LAG_WL, extra_engine_args=launch(), num_workers=4, kv_event_lag_ms=lag)
            rec["summary"] = summary_of(r)
        except Exception as ex:  # noqa: BLE001
            rec["error"] = err(ex)
        out.append(rec)
    return out


def error_cases(c):
    out = []
    wl = {"input_tokens": 200, "output_tokens": 20, "request_count": 40, "request_rate": 20.0}
    agg = {"extra_engine_args": launch(startup_s=1.0)}
    online = {"replay_mode": "online", "request_rate": None, "arrival_interval_ms": 1.0}

    def tick(ret):
        return RawPolicy(lambda s: ret(s) if callable(ret) else ret)

    def noop(s):
        return {"target_prefill": None, "target_decode": None, "next_tick_ms": None}

    def boom(s):
        raise RuntimeError("boom from policy")

    class NoInit:
        def on_tick(self, s):
            return noop(s)

    class NoTick:
        def initial_tick_ms(self):
            return 0.0

    class InitNone(NoInit):
        def initial_tick_ms(self):
            return None

    class InitRaises(NoInit):
        def initial_tick_ms(self):
            raise KeyError("init boom")

    def d(**kw):
        base = {"target_prefill": None, "target_decode": None, "next_tick_ms": None}
        base.update(kw)
        return base

    def bad_callback(s):
        raise ValueError("callback boom")

    cases = [
        ("on_tick_returns_int", {"scaling_policy": tick(5)}),
        ("on_tick_returns_none", {"scaling_policy": tick(None)}),
        ("on_tick_returns_list", {"scaling_policy": tick([1, 2, 3])}),
        ("on_tick_missing_target_prefill", {"scaling_policy": tick({"target_decode": 2,
                                                                   "next_tick_ms": None})}),
        ("on_tick_missing_next_tick_ms", {"scaling_policy": tick({"target_prefill": None,
                                                                 "target_decode": 2})}),
        ("target_decode_negative", {"scaling_policy": tick(d(target_decode=-1))}),
        ("target_prefill_negative_in_agg", {"scaling_policy": tick(d(target_prefill=-1))}),
        ("target_decode_float", {"scaling_policy": tick(d(target_decode=2.0))}),
        ("target_decode_str", {"scaling_policy": tick(d(target_decode="2"))}),
        ("target_decode_bool_true", {"scaling_policy": tick(d(target_decode=True))}),
        ("next_tick_ms_str", {"scaling_policy": tick(d(next_tick_ms="x"))}),
        ("next_tick_ms_int", {"scaling_policy": tick(d(next_tick_ms=100))}),
        ("extra_keys_ignored", {"scaling_policy": tick(d(foo=1))}),
        ("on_tick_raises", {"scaling_policy": tick(boom)}),
        ("no_initial_tick_ms", {"scaling_policy": NoInit()}),
        ("no_on_tick", {"scaling_policy": NoTick()}),
        ("initial_tick_ms_none", {"scaling_policy": InitNone()}),
        ("initial_tick_ms_raises", {"scaling_policy": InitRaises()}),
        ("scaling_policy_online", dict(online, scaling_policy=tick(noop))),
        ("capture_per_request_online", dict(online, capture_per_request=True)),
        ("telemetry_interval_zero", {"capture_telemetry": True,
                                     "telemetry_sample_interval_ms": 0.0}),
        ("telemetry_interval_negative", {"capture_telemetry": True,
                                         "telemetry_sample_interval_ms": -5.0}),
        ("telemetry_interval_inf", {"capture_telemetry": True,
                                    "telemetry_sample_interval_ms": float("inf")}),
        ("telemetry_interval_nan", {"capture_telemetry": True,
                                    "telemetry_sample_interval_ms": float("nan")}),
        ("telemetry_interval_str", {"capture_telemetry": True,
                                    "telemetry_sample_interval_ms": "1"}),
        ("telemetry_interval_zero_without_sink", {"telemetry_sample_interval_ms": 0.0}),
        ("telemetry_callback_not_callable", {"telemetry_callback": 5}),
        ("telemetry_callback_raises", {"telemetry_callback": bad_callback}),
        ("telemetry_jsonl_is_directory", {"telemetry_jsonl_path": tempfile.gettempdir()}),
        ("capture_telemetry_online", dict(online, capture_telemetry=True)),
        ("telemetry_callback_online", dict(online, telemetry_callback=print)),
        ("telemetry_interval_only_online", dict(online, telemetry_sample_interval_ms=5.0)),
        ("sla_ttft_negative", {"sla_ttft_ms": -1.0}),
        ("sla_itl_nan", {"sla_itl_ms": float("nan")}),
        ("sla_e2e_inf", {"sla_e2e_ms": float("inf")}),
        ("sla_ttft_zero", {"sla_ttft_ms": 0.0}),
        ("sla_e2e_with_ttft", {"sla_ttft_ms": 100.0, "sla_e2e_ms": 500.0}),
        ("kv_event_lag_round_robin", {"kv_event_lag_ms": 10.0}),
        ("kv_event_lag_zero_round_robin", {"kv_event_lag_ms": 0.0}),
        ("kv_event_lag_negative", {"kv_event_lag_ms": -1.0, "router_mode": "kv_router",
                                   "num_workers": 2}),
        ("kv_event_lag_nan", {"kv_event_lag_ms": float("nan"), "router_mode": "kv_router",
                              "num_workers": 2}),
        ("kv_event_lag_inf", {"kv_event_lag_ms": float("inf"), "router_mode": "kv_router",
                              "num_workers": 2}),
        ("kv_event_lag_online", dict(online, kv_event_lag_ms=5.0, router_mode="kv_router",
                                     num_workers=2)),
    ]
    for name, kw in cases:
        args = dict(agg)
        args.update(kw)
        args = {k: v for k, v in args.items() if v is not None or k == "request_rate"}
        w = dict(wl)
        if "arrival_interval_ms" in args:
            w.pop("request_rate")
            args.pop("request_rate", None)
        rec = {"case": f"E_{name}",
               "args": {k: (v if isinstance(v, (int, float, str, bool, type(None)))
                            else type(v).__name__) for k, v in kw.items()}}
        try:
            r = synth(c, w, **args)
            s = r.summary if hasattr(r, "summary") else r
            rec["result"] = f"ok: completed {s.get('completed_requests')} of 40"
        except Exception as ex:  # noqa: BLE001
            rec["error"] = err(ex)
        out.append(rec)
    return out


def run_child(only):
    import resource  # noqa: PLC0415

    # Safety net on a shared machine: a runaway case fails instead of eating the RAM.
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = 6 << 30 if hard == resource.RLIM_INFINITY else min(6 << 30, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    import dynamo._core as c  # noqa: PLC0415 - only the child has the reference

    groups = [
        (["A1_agg_round_robin"], lambda: [scaling_case(
            c, "A1_agg_round_robin", "round_robin", False,
            "aggregated, 1 worker, startup_time 1.5 s: decode 1 -> 3 from t=2 s, -> 1 from "
            "t=8 s; ticks every 1 s from 0")]),
        (["A2_agg_kv_router"], lambda: [scaling_case(
            c, "A2_agg_kv_router", "kv_router", False, "as A1 with kv_router")]),
        (["A3_disagg_round_robin"], lambda: [scaling_case(
            c, "A3_disagg_round_robin", "round_robin", True,
            "disaggregated 1P1D, prefill startup 1 s, decode startup 2 s: prefill 1 -> 2 and "
            "decode 1 -> 3 from t=2 s, both -> 1 from t=8 s")]),
        (["A4_disagg_kv_router"], lambda: [scaling_case(
            c, "A4_disagg_kv_router", "kv_router", True, "as A3 with kv_router")]),
        (["S", "T", "P", "F"], lambda: semantics_cases(c)),
        (["M"], lambda: telemetry_cases(c)),
        (["G"], lambda: goodput_cases(c)),
        (["L"], lambda: lag_cases(c)),
        (["E"], lambda: error_cases(c)),
    ]
    for names, fn in groups:
        if only and not any(n.startswith(only) or only.startswith(n) for n in names):
            continue
        for rec in fn():
            if only and not rec["case"].startswith(only):
                continue
            print(json.dumps(rec, default=repr), flush=True)


def main():
    reference_probe.main(__file__, __doc__.split("\n")[0], run_child,
                         "One object per case. A*: scripted scaling runs with every snapshot the "
                     "policy received ('snapshots'), its decisions, lifecycle_operations, "
                     "telemetry samples, summary, and checks recomputed from per-request "
                     "records (which are not kept). S*/T*/F*: scaling semantics and tick "
                     "rules (condensed ticks: [active, starting, draining] per pool). M*: "
                     "telemetry. G*: goodput. L*: kv_event_lag_ms. E*: verbatim errors. "
                     "kv_router cases ('deterministic': false) vary slightly run to run. "
                     "See docs/scaling.md.", compact=True)


if __name__ == "__main__":
    main()
