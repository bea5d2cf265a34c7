"""A scaling policy in the loop (`scaling_policy=`) and telemetry (`capture_telemetry`,
`telemetry_callback`, `telemetry_jsonl_path`): the reference's protocol, errors and results.
With Dynamo's reference importable, the same policy gives the same summary, the same snapshot
at every tick, the same lifecycle operations and the same telemetry samples as there.

Run by crates/mocker/tests/python_api.rs (`MOCKER_DYNAMO_PYTHON`: an interpreter with
`dynamo._core`, when not this one).
"""

import json
import math
import os
import subprocess
import sys

import pytest

import mocker

ENGINE = {"engine": {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192}}
WALL = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}

# The policy both sides run: ticks every `every` ms from 0, the plan's latest step wins.
POLICY = '''
class Timetable:
    def __init__(self, plan, every=1000.0):
        self.plan, self.every, self.snapshots = plan, every, []
    def initial_tick_ms(self):
        return 0.0
    def on_tick(self, snap):
        self.snapshots.append(snap)
        tp = td = None
        for at, p, d in self.plan:
            if at <= snap["now_ms"]:
                tp, td = p, d
        return {"target_prefill": tp, "target_decode": td, "next_tick_ms": snap["now_ms"] + self.every}
'''
exec(POLICY)

CASES = {
    "aggregated": dict(extra_engine_args={**ENGINE, "startup_time": 1.5}, num_workers=1,
                       plan=[(2000.0, None, 3), (8000.0, None, 1)]),
    # Two data-parallel ranks a worker: snapshots and telemetry rows per (worker, rank), round
    # robin over workers and over each worker's ranks in turn (a new worker from rank 0).
    "aggregated_dp2": dict(extra_engine_args={**ENGINE, "startup_time": 1.5, "dp_size": 2}, num_workers=1,
                           plan=[(2000.0, None, 3), (8000.0, None, 1)]),
    "disaggregated": dict(prefill_engine_args={"engine": {**ENGINE["engine"], "worker_type": "prefill"}, "startup_time": 1.0},
                          decode_engine_args={"engine": {**ENGINE["engine"], "worker_type": "decode"}, "startup_time": 2.0},
                          plan=[(2000.0, 2, 3), (8000.0, 1, 1)]),
}

REFERENCE_SCRIPT = POLICY + '''
import json, sys
import dynamo._core as c
kwargs = json.loads(sys.stdin.read())
policy = Timetable(kwargs.pop("plan"))
r = c.run_mocker_synthetic_trace_replay(512, 256, 300, request_rate=20.0, arrival_seed=42,
                                        scaling_policy=policy, capture_telemetry=True,
                                        telemetry_sample_interval_ms=700.0, **kwargs)
print(json.dumps({"summary": r.summary, "snapshots": policy.snapshots, "telemetry": r.telemetry,
                  "lifecycle_operations": r.lifecycle_operations, "coverage": r.coverage}))
'''


def run(plan, **kwargs):
    policy = Timetable(plan)
    r = mocker.run_mocker_synthetic_trace_replay(512, 256, 300, request_rate=20.0, arrival_seed=42,
                                                 scaling_policy=policy, **kwargs)
    return r, policy


def reference_python():
    candidate = os.environ.get("MOCKER_DYNAMO_PYTHON") or sys.executable
    probe = subprocess.run([candidate, "-c", "import dynamo._core"], capture_output=True)
    return candidate if probe.returncode == 0 else None


def same(a, b, path=""):
    """Differences between two JSON-like values: floats to 1e-9 relative or 2e-6 absolute
    (mocker's clock counts whole nanoseconds, the reference's float ms)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [] if list(a) == list(b) else [f"{path}: keys {list(a)} vs {list(b)}"]
        return out + [d for k in b if k in a for d in same(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None or not math.isclose(a, b, rel_tol=1e-9, abs_tol=2e-6):
            return [f"{path}: {a} vs {b}"]
        return []
    return [] if a == b else [f"{path}: {a} vs {b}"]


@pytest.mark.parametrize("case", CASES)
def test_a_policy_gives_the_reference_results_tick_by_tick(case):
    python = reference_python()
    if python is None:
        pytest.skip("Dynamo's reference (dynamo._core, ai-dynamo-runtime 1.6.1) is not importable: set "
                    "MOCKER_DYNAMO_PYTHON to an interpreter that has it")
    kwargs = dict(CASES[case])
    done = subprocess.run([python, "-c", REFERENCE_SCRIPT], input=json.dumps(kwargs), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ref = json.loads(done.stdout.splitlines()[-1])
    plan = kwargs.pop("plan")
    ours, policy = run(plan, capture_telemetry=True, telemetry_sample_interval_ms=700.0, **kwargs)
    summary = {k: v for k, v in ours.summary.items() if k not in WALL}
    differ = same(summary, {k: v for k, v in ref["summary"].items() if k not in WALL}, "summary")
    differ += same(policy.snapshots, ref["snapshots"], "snapshots")
    differ += same(ours.lifecycle_operations, ref["lifecycle_operations"], "lifecycle_operations")
    differ += same(ours.telemetry, ref["telemetry"], "telemetry")
    assert not differ, "\n".join(differ[:40])
    assert ours.coverage["capture_planner_details"] is ref["coverage"]["capture_planner_details"] is True


def test_ranks_with_the_kv_router_stay_within_the_reference_spread():
    """The reference's KV router breaks ties at random, so a kv_router run matches it only
    within its own run-to-run spread: the same decisions at the same ticks, the same entries
    per (worker, rank), and a duration within 0.2% (its three runs span 0.06%)."""
    python = reference_python()
    if python is None:
        pytest.skip("Dynamo's reference (dynamo._core, ai-dynamo-runtime 1.6.1) is not importable: set "
                    "MOCKER_DYNAMO_PYTHON to an interpreter that has it")
    kwargs = dict(CASES["aggregated_dp2"], router_mode="kv_router")
    done = subprocess.run([python, "-c", REFERENCE_SCRIPT], input=json.dumps(kwargs), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ref = json.loads(done.stdout.splitlines()[-1])
    plan = kwargs.pop("plan")
    ours, policy = run(plan, **kwargs)
    planned = lambda ops: [(o["cause"], o["at_ms"], [(t["worker_id"], t["transition"]) for t in o["transitions"]])
                           for o in ops if o["cause"] != "drain_settlement"]
    assert planned(ours.lifecycle_operations) == planned(ref["lifecycle_operations"])
    pairs = lambda snaps: [[(e["worker_id"], e["dp_rank"]) for e in s["decode_fpm_snapshots"]] for s in snaps]
    assert pairs(policy.snapshots) == pairs(ref["snapshots"])
    assert ours.summary["completed_requests"] == ref["summary"]["completed_requests"] == 300
    assert math.isclose(ours.summary["duration_ms"], ref["summary"]["duration_ms"], rel_tol=2e-3)


def test_the_policy_sees_the_pools_change():
    r, policy = run([(2000.0, None, 3), (8000.0, None, 1)], extra_engine_args={**ENGINE, "startup_time": 1.5})
    ticks = {s["now_ms"]: s for s in policy.snapshots}
    assert ticks[3000.0]["starting_decode_ids"] == [1, 2] and ticks[3000.0]["non_draining_decode_count"] == 3
    assert ticks[4000.0]["active_decode_ids"] == [0, 1, 2]
    assert ticks[9000.0]["draining_decode_ids"] == [1, 2]
    assert len(policy.snapshots[0]) == 21
    causes = [op["cause"] for op in r.lifecycle_operations]
    assert causes == ["planner_scale", "worker_ready_event", "worker_ready_event", "planner_scale",
                      "drain_settlement", "drain_settlement"]
    assert r.summary["decode_worker_seconds"] > 1.5 * r.summary["duration_ms"] / 1e3
    # Without details the pools still scale, and nothing is recorded.
    quiet, _ = run([(2000.0, None, 3)], extra_engine_args=ENGINE, capture_planner_details=False)
    assert quiet.lifecycle_operations == [] and quiet.coverage["capture_planner_details"] is False
    assert quiet.summary["decode_worker_seconds"] > 2 * quiet.summary["duration_ms"] / 1e3


class Raw:
    def __init__(self, result):
        self.result = result

    def initial_tick_ms(self):
        return 0.0

    def on_tick(self, snap):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@pytest.mark.parametrize("result,error,message", [
    (3, TypeError, "'int' object is not subscriptable"),
    (None, TypeError, "'NoneType' object is not subscriptable"),
    ({"target_decode": 1, "next_tick_ms": None}, KeyError, "target_prefill"),
    ({"target_prefill": None, "target_decode": 1}, KeyError, "next_tick_ms"),
    ({"target_prefill": None, "target_decode": -1, "next_tick_ms": None}, OverflowError, "negative"),
    ({"target_prefill": -1, "target_decode": None, "next_tick_ms": None}, OverflowError, "negative"),
    ({"target_prefill": None, "target_decode": 2.0, "next_tick_ms": None}, TypeError, "'float' object cannot be interpreted"),
    ({"target_prefill": None, "target_decode": None, "next_tick_ms": "x"}, TypeError, "must be real number"),
    (RuntimeError("boom from policy"), RuntimeError, "boom from policy"),
])
def test_policy_errors_reach_the_caller_as_the_reference_raises_them(result, error, message):
    with pytest.raises(error, match=message):
        mocker.run_mocker_synthetic_trace_replay(100, 10, 5, request_rate=10.0, scaling_policy=Raw(result))


def test_policy_shapes_the_reference_accepts():
    # A bool is an int; extra keys are ignored; an int next tick is a time.
    for result in [{"target_prefill": None, "target_decode": True, "next_tick_ms": None},
                   {"target_prefill": None, "target_decode": 1, "next_tick_ms": 500, "extra": 1}]:
        r = mocker.run_mocker_synthetic_trace_replay(100, 10, 5, request_rate=10.0, scaling_policy=Raw(result))
        assert r.summary["completed_requests"] == 5
    with pytest.raises(AttributeError, match="initial_tick_ms"):
        mocker.run_mocker_synthetic_trace_replay(100, 10, 5, request_rate=10.0, scaling_policy=object())
    with pytest.raises(ValueError, match="scaling_policy only supports replay_mode='offline'"):
        mocker.run_mocker_synthetic_trace_replay(100, 10, 5, request_rate=10.0, replay_mode="online",
                                                 scaling_policy=Raw(None))


def test_a_pool_scaled_to_zero_fails_the_next_arrival_as_the_reference():
    policy = Raw({"target_prefill": None, "target_decode": 0, "next_tick_ms": None})
    with pytest.raises(ValueError, match="no active workers for round-robin placement"):
        mocker.run_mocker_synthetic_trace_replay(500, 50, 60, request_rate=20.0, scaling_policy=policy)


def test_telemetry_sinks_receive_the_same_samples(tmp_path):
    got = []
    path = tmp_path / "deep" / "dir" / "samples.jsonl"
    r = mocker.run_mocker_synthetic_trace_replay(500, 50, 40, request_rate=20.0, extra_engine_args=ENGINE,
                                                 capture_telemetry=True, telemetry_sample_interval_ms=700.0,
                                                 telemetry_callback=got.append, telemetry_jsonl_path=str(path))
    samples = r.telemetry["samples"]
    assert r.telemetry["sample_interval_ms"] == 700.0
    assert got == samples and all(type(s) is dict for s in got)
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == samples
    assert lines[0].startswith('{"sample_ordinal":0,"kind":"baseline","interval_start_ms":0.0,"sampled_at_ms":0.0,')
    kinds = [(s["kind"], s["interval_start_ms"], s["sampled_at_ms"]) for s in samples]
    assert kinds[:3] == [("baseline", 0.0, 0.0), ("periodic", 0.0, 700.0), ("periodic", 700.0, 1400.0)]
    assert kinds[-1][0] == "final" and kinds[-1][2] == r.summary["duration_ms"]
    assert sum(s["traffic"]["completed_requests"] for s in samples) == 40
    # A callback alone: the result keeps no samples; sampling changes no figure.
    seen = []
    alone = mocker.run_mocker_synthetic_trace_replay(500, 50, 40, request_rate=20.0, extra_engine_args=ENGINE,
                                                     telemetry_callback=seen.append)
    plain = mocker.run_mocker_synthetic_trace_replay(500, 50, 40, request_rate=20.0, extra_engine_args=ENGINE)
    assert alone.telemetry is None and len(seen) == 3  # baseline, 1000 ms, final (the reference's M5)
    assert {k: v for k, v in alone.summary.items() if k not in WALL} == {k: v for k, v in plain.summary.items() if k not in WALL}


def test_telemetry_errors(tmp_path):
    call = lambda **kw: mocker.run_mocker_synthetic_trace_replay(100, 10, 5, request_rate=10.0, **kw)
    with pytest.raises(TypeError, match="telemetry_callback must be callable or None"):
        call(telemetry_callback=3)
    with pytest.raises(ValueError, match="replay telemetry only supports replay_mode='offline'"):
        call(capture_telemetry=True, replay_mode="online")
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="telemetry_sample_interval_ms must be a positive finite number"):
            call(capture_telemetry=True, telemetry_sample_interval_ms=bad)
    with pytest.raises(ValueError, match="telemetry_sample_interval_ms: applies only with"):
        call(telemetry_sample_interval_ms=250.0)

    def boom(sample):
        raise RuntimeError("boom from callback")
    with pytest.raises(RuntimeError, match="boom from callback"):
        call(telemetry_callback=boom)
    with pytest.raises(ValueError, match="Is a directory"):
        call(telemetry_jsonl_path=str(tmp_path))


TELEMETRY_SCRIPT = '''
import json, sys
import dynamo._core as c
kwargs = json.loads(sys.stdin.read())
r = c.run_mocker_synthetic_trace_replay(500, 50, 40, request_rate=20.0, arrival_seed=42, capture_telemetry=True,
                                        telemetry_sample_interval_ms=500.0, **kwargs)
print(json.dumps(r.telemetry))
'''


@pytest.mark.parametrize("engine", [
    {"engine": {"block_size": 64, "num_gpu_blocks": 16384, "aic_nextn": 3}},
    {"engine": {"block_size": 64, "num_gpu_blocks": 300, "backend": "sglang"}},
], ids=["mtp", "sglang_small_cache"])
def test_telemetry_without_a_policy_matches_the_reference(engine):
    python = reference_python()
    if python is None:
        pytest.skip("Dynamo's reference (dynamo._core, ai-dynamo-runtime 1.6.1) is not importable")
    kwargs = {"extra_engine_args": engine}
    done = subprocess.run([python, "-c", TELEMETRY_SCRIPT], input=json.dumps(kwargs), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ref = json.loads(done.stdout.splitlines()[-1])
    ours = mocker.run_mocker_synthetic_trace_replay(500, 50, 40, request_rate=20.0, arrival_seed=42, capture_telemetry=True,
                                                    telemetry_sample_interval_ms=500.0, **kwargs).telemetry
    differ = same(ours, ref, "telemetry")
    assert not differ, "\n".join(differ[:40])
