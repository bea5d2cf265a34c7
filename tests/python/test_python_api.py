"""The Python module `mocker` (python/, installed by .ci/run): its calls give the summary
`mocker replay` reports for the same workload, keep per-request records when asked, refuse
what mocker does not do by name and raise the CLI's messages for bad values; with Dynamo's
reference importable, the same numbers as the reference.

Run by crates/mocker/tests/python_api.rs (`MOCKER_BIN`: the mocker binary;
`MOCKER_DYNAMO_PYTHON`: an interpreter with `dynamo._core`, when not this one).
"""

import json
import math
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

import mocker

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOCKER_BIN = os.environ.get("MOCKER_BIN") or str(ROOT / "target" / "debug" / "mocker")
# The reference figures' engine (spec reference.md), nested as 1.6.1 takes it.
ENGINE = {"engine": {"block_size": 64, "num_gpu_blocks": 16384, "max_num_seqs": 256, "max_num_batched_tokens": 8192}}
# Keys that measure the simulator's wall clock, not the simulated engines.
WALL = {"wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s"}
# Sessionless Mooncake rows with shared prefixes, over six requests.
TRACE = [
    {"timestamp": 0, "input_length": 1500, "output_length": 200, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 2100, "output_length": 150, "hash_ids": [0, 1, 3, 4, 5]},
    {"timestamp": 900, "input_length": 700, "output_length": 300, "hash_ids": [6, 7]},
    {"timestamp": 1200, "input_length": 2600, "output_length": 100, "hash_ids": [0, 1, 3, 4, 8, 9]},
    {"timestamp": 1300, "input_length": 1000, "output_length": 50, "hash_ids": [0, 1]},
    {"timestamp": 1350, "input_length": 3000, "output_length": 80, "hash_ids": [6, 7, 10, 11, 12, 13]},
]
DISAGG = {
    "prefill_engine_args": {"engine": {"worker_type": "prefill"}},
    "decode_engine_args": {"engine": {"worker_type": "decode"}},
}


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in TRACE))
    return path


def cli(*args):
    """`mocker replay ARGS`: the completed process (stderr kept)."""
    return subprocess.run([MOCKER_BIN, "replay", *map(str, args)], capture_output=True, text=True)


def cli_report(tmp_path, *args):
    """The JSON report of `mocker replay ARGS`."""
    out = tmp_path / "cli_report.json"
    done = cli(*args, "--report-json", out)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def cli_error(*args):
    """The message `mocker replay ARGS` exits 2 with (its `error: ` line, without the prefix)."""
    done = cli(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return lines[0][len("error: "):]


def assert_same_as_report(summary, report):
    """The summary carries the report's keys (all but mocker's `run`) with equal values;
    both come from the same simulation, so equal means bit for bit."""
    assert set(summary) == set(report) - {"run"}
    differ = {k: (v, report[k]) for k, v in summary.items() if k not in WALL and v != report[k]}
    assert not differ


def test_synthetic_summary_equals_the_cli_report(tmp_path):
    r = mocker.run_mocker_synthetic_trace_replay(1000, 100, 200, extra_engine_args=ENGINE, num_workers=2,
                                                 replay_concurrency=16)
    report = cli_report(tmp_path, "--input-tokens", 1000, "--output-tokens", 100, "--request-count", 200,
                        "--engine-args", json.dumps(ENGINE), "--num-workers", 2, "--concurrency", 16)
    assert_same_as_report(r.summary, report)
    assert r.per_request is None
    assert r.coverage == {"capture_per_request": False, "capture_planner_details": False, "per_request_records": 0}
    assert r.lifecycle_operations == [] and r.telemetry is None
    assert r.run == report["run"]


def test_kv_router_sessions_and_router_config_act_as_their_flags(tmp_path):
    config = mocker.KvRouterConfig(router_temperature=0.5, overlap_score_weight=2.0, router_queue_threshold=1.5,
                                   router_queue_policy="wspt", seed=7)
    r = mocker.run_mocker_synthetic_trace_replay(
        512, 32, 60, extra_engine_args={"block_size": 16, "num_gpu_blocks": 4096}, num_workers=3,
        router_mode="kv_router", router_config=config, request_rate=40.0, arrival_seed=3, turns_per_session=2,
        shared_prefix_ratio=0.5, num_prefix_groups=4, inter_turn_delay_ms=25.0, sla_ttft_ms=100.0)
    router = {"router_temperature": 0.5, "prefill_load_scale": 2.0, "router_queue_threshold": 1.5,
              "router_queue_policy": "wspt", "seed": 7}
    report = cli_report(tmp_path, "--input-tokens", 512, "--output-tokens", 32, "--request-count", 60,
                        "--engine-args", '{"block_size": 16, "num_gpu_blocks": 4096}', "--num-workers", 3,
                        "--router", "kv", "--router-config", json.dumps(router), "--request-rate", 40,
                        "--arrival-seed", 3, "--turns-per-session", 2, "--shared-prefix-ratio", 0.5,
                        "--num-prefix-groups", 4, "--inter-turn-delay-ms", 25, "--sla-ttft-ms", 100)
    assert_same_as_report(r.summary, report)
    assert "goodput_completed_requests" in r.summary and r.summary["prefix_cache_reused_ratio"] > 0


def test_trace_summary_and_records_equal_the_cli_report(tmp_path, trace):
    jsonl = tmp_path / "py.jsonl"
    r = mocker.run_mocker_trace_replay([trace], extra_engine_args=ENGINE, num_workers=2, router_mode="kv_router",
                                       arrival_speedup_ratio=2.0, trace_block_size=512, report_jsonl_path=jsonl,
                                       max_sim_time_ms=60_000.0, capture_per_request=True)
    cli_jsonl = tmp_path / "cli.jsonl"
    report = cli_report(tmp_path, trace, "--engine-args", json.dumps(ENGINE), "--num-workers", 2, "--router", "kv",
                        "--arrival-speedup-ratio", 2, "--trace-block-size", 512, "--report-jsonl", cli_jsonl,
                        "--max-sim-time-seconds", 60)
    assert_same_as_report(r.summary, report)
    records = [json.loads(line) for line in cli_jsonl.read_text().splitlines()]
    assert r.per_request == records
    assert jsonl.read_text() == cli_jsonl.read_text()
    assert r.coverage == {"capture_per_request": True, "capture_planner_details": False,
                          "per_request_records": len(TRACE)}


def test_disaggregated_summary_equals_the_cli_report(tmp_path):
    r = mocker.run_mocker_synthetic_trace_replay(3000, 20, 40, replay_concurrency=4, num_prefill_workers=2, **DISAGG)
    report = cli_report(tmp_path, "--input-tokens", 3000, "--output-tokens", 20, "--request-count", 40,
                        "--concurrency", 4, "--num-prefill-workers", 2,
                        "--prefill-engine-args", json.dumps(DISAGG["prefill_engine_args"]),
                        "--decode-engine-args", json.dumps(DISAGG["decode_engine_args"]))
    assert_same_as_report(r.summary, report)
    assert r.summary["prefill_worker_seconds"] > 0


def test_online_mode_returns_the_summary_dict():
    offline = mocker.run_mocker_synthetic_trace_replay(200, 10, 12, replay_concurrency=4).summary
    online = mocker.run_mocker_synthetic_trace_replay(200, 10, 12, replay_concurrency=4, replay_mode="online",
                                                      extra_engine_args={"speedup_ratio": 50.0})
    assert isinstance(online, dict) and list(online) == list(offline)
    assert online["completed_requests"] == 12
    with pytest.raises(ValueError, match=r"^capture_per_request: only offline replays"):
        mocker.run_mocker_synthetic_trace_replay(200, 10, 12, replay_mode="online", capture_per_request=True)


def test_per_request_records_are_returned_when_asked():
    r = mocker.run_mocker_synthetic_trace_replay(300, 20, 25, replay_concurrency=5, capture_per_request=True)
    assert len(r.per_request) == 25 and r.coverage["per_request_records"] == 25
    first = r.per_request[0]
    assert first["input_length"] == 300 and first["output_length"] == 20
    assert first["terminal_status"] == "completed" and first["ttft_ms"] > 0


def test_an_unknown_keyword_is_a_type_error_naming_it():
    # As the reference (and any Python function) does.
    with pytest.raises(TypeError, match="'replay_concurency'"):
        mocker.run_mocker_synthetic_trace_replay(100, 10, 5, replay_concurency=2)
    with pytest.raises(TypeError, match="'request_rate'"):
        mocker.run_mocker_trace_replay(["t.jsonl"], request_rate=2.0)


# The reference's keywords mocker does not support yet, each with a value that asks for it.
UNSUPPORTED = [
    ("ais_perf_config", {"model": "x"}),
    ("model_name", "Qwen/Qwen3-8B"),
]
UNSUPPORTED_TRACE = [
    ("trace_shared_prefix_ratio", 0.5),
    ("trace_num_prefix_groups", 2),
]


@pytest.mark.parametrize("keyword,value", UNSUPPORTED, ids=[k for k, _ in UNSUPPORTED])
def test_unsupported_keywords_are_refused_by_name(keyword, value, trace):
    for call in (lambda **kw: mocker.run_mocker_synthetic_trace_replay(100, 10, 5, **kw),
                 lambda **kw: mocker.run_mocker_trace_replay([trace], **kw)):
        with pytest.raises(ValueError, match=rf"^{keyword}: not supported yet"):
            call(**{keyword: value})


@pytest.mark.parametrize("keyword,value", UNSUPPORTED_TRACE, ids=[k for k, _ in UNSUPPORTED_TRACE])
def test_unsupported_trace_keywords_are_refused_by_name(keyword, value, trace):
    with pytest.raises(ValueError, match=rf"^{keyword}: not supported yet"):
        mocker.run_mocker_trace_replay([trace], **{keyword: value})


def test_unsupported_keywords_at_their_defaults_are_accepted(trace):
    defaults = dict(scaling_policy=None, capture_telemetry=False, telemetry_sample_interval_ms=1000.0,
                    telemetry_callback=None, telemetry_jsonl_path=None, kv_event_lag_ms=0.0, ais_perf_config=None,
                    model_name=None, capture_planner_details=False)
    plain = mocker.run_mocker_trace_replay([trace]).summary
    r = mocker.run_mocker_trace_replay([trace], trace_shared_prefix_ratio=0.0, trace_num_prefix_groups=0,
                                       agentic_lanes=None, execution_model=None, weka_nested_timestamp_basis=None,
                                       **defaults)
    assert {k: v for k, v in r.summary.items() if k not in WALL} == {k: v for k, v in plain.items() if k not in WALL}
    assert mocker.run_mocker_synthetic_trace_replay(100, 10, 5, **defaults).summary["completed_requests"] == 5


def test_kv_event_lag_acts_with_the_kv_router_and_is_refused_with_round_robin():
    # As --kv-event-lag-ms: a router that sees no stored block routes blind; round robin
    # has no index to delay.
    load = dict(replay_concurrency=16, shared_prefix_ratio=0.5, num_prefix_groups=4, num_workers=4,
                router_mode="kv_router")
    live = mocker.run_mocker_synthetic_trace_replay(1024, 16, 200, capture_per_request=True, **load)
    blind = mocker.run_mocker_synthetic_trace_replay(1024, 16, 200, capture_per_request=True,
                                                     kv_event_lag_ms=1e9, **load)
    overlap = lambda r: sum(x["routing_history"][0]["selected_overlap_blocks"] for x in r.per_request)
    assert overlap(live) > 0 and overlap(blind) == 0
    with pytest.raises(ValueError, match=r"^--kv-event-lag-ms: only applies to the kv router"):
        mocker.run_mocker_synthetic_trace_replay(100, 10, 5, replay_concurrency=2, kv_event_lag_ms=5.0)


def test_router_config_keywords_mocker_does_not_model_are_refused_unless_default():
    with pytest.raises(ValueError, match=r"^KvRouterConfig: router_event_threads: not supported yet"):
        mocker.KvRouterConfig(router_event_threads=8)
    with pytest.raises(ValueError, match=r"^KvRouterConfig: use_kv_events: not supported yet"):
        mocker.KvRouterConfig(use_kv_events=False)
    assert mocker.KvRouterConfig(router_event_threads=4, use_kv_events=True).router_temperature == 0.0
    with pytest.raises(ValueError, match=r"^KvRouterConfig: router_temperature: must be a finite number >= 0"):
        mocker.KvRouterConfig(router_temperature=-1.0)
    assert mocker.KvRouterConfig(overlap_score_weight=0.0).prefill_load_scale == 0.0


# (keywords, the same mistake as flags): the Python error is the CLI's message.
BAD_VALUES = [
    ({"num_workers": 0}, ["--num-workers", 0]),
    ({"replay_concurrency": 0}, ["--concurrency", 0]),
    ({"replay_concurrency": 2, "request_rate": 1.0}, ["--concurrency", 2, "--request-rate", 1]),
    ({"shared_prefix_ratio": 1.5}, ["--shared-prefix-ratio", 1.5]),
    ({"router_mode": "random"}, ["--router", "random"]),
    ({"sla_itl_ms": -1.0}, ["--sla-itl-ms", -1]),
    ({"arrival_speedup_ratio": 0.0}, ["--arrival-speedup-ratio", 0]),
    ({"extra_engine_args": {"block_sise": 64}}, ["--engine-args", '{"block_sise": 64}']),
    ({"num_decode_workers": 2}, ["--num-decode-workers", 2]),
    ({"decode_engine_args": DISAGG["decode_engine_args"]},
     ["--decode-engine-args", json.dumps(DISAGG["decode_engine_args"])]),
]


@pytest.mark.parametrize("keywords,flags", BAD_VALUES, ids=[",".join(k) for k, _ in BAD_VALUES])
def test_bad_values_raise_the_cli_message(keywords, flags):
    expected = cli_error("--input-tokens", 100, "--output-tokens", 10, "--request-count", 5, *flags)
    with pytest.raises(ValueError) as e:
        mocker.run_mocker_synthetic_trace_replay(100, 10, 5, **keywords)
    assert str(e.value) == expected


def test_a_bad_trace_raises_the_cli_message(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 100}\n')
    with pytest.raises(ValueError) as e:
        mocker.run_mocker_trace_replay([bad])
    assert str(e.value) == cli_error(bad)
    with pytest.raises(ValueError, match=r"^trace_files: mocker replays one trace file"):
        mocker.run_mocker_trace_replay([bad, bad])


def test_replay_takes_the_cli_flags(tmp_path, trace):
    report_path = tmp_path / "py_report.json"
    r = mocker.replay(trace, num_workers=2, router="kv", engine_args=ENGINE, strict=True, report_json=report_path,
                      per_request=True, plot=None)
    # Keeping records sums the ITL statistics in another order (their last bit may differ):
    # the CLI keeps them too.
    cli_jsonl = tmp_path / "cli.jsonl"
    report = cli_report(tmp_path, trace, "--num-workers", 2, "--router", "kv", "--engine-args", json.dumps(ENGINE),
                        "--strict", "--report-jsonl", cli_jsonl)
    assert_same_as_report(r.summary, report)
    assert_same_as_report(r.summary, json.loads(report_path.read_text()))
    assert r.per_request == [json.loads(line) for line in cli_jsonl.read_text().splitlines()]
    with pytest.raises(ValueError, match=r"^unexpected argument '--num-worker' found"):
        mocker.replay(trace, num_worker=2)


def test_the_interpreter_runs_other_threads_during_a_replay():
    span = {}

    def work():
        span["start"] = time.perf_counter()
        mocker.run_mocker_synthetic_trace_replay(1000, 100, 20000, replay_concurrency=64)
        span["end"] = time.perf_counter()

    ticks = []
    worker = threading.Thread(target=work)
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    worker.join()
    assert span["end"] - span["start"] > 0.1, "the replay is too short to tell"
    during = [t for t in ticks if span["start"] + 0.02 < t < span["end"] - 0.02]
    assert during, "the main thread never ran while the replay did"


# ---- agentic and Weka trace options -------------------------------------------------------

# The reference's results for them (tests/fixtures/hybrid_reference.json, docs/hybrid-kv.md §4).
F_CASES = [c for c in json.loads((ROOT / "tests" / "fixtures" / "hybrid_reference.json").read_text())["cases"]
           if c["case"].startswith("F")]
# The reference's refusals and the part of mocker's message (the CLI's, flags for keywords)
# that says the same.
F_SUBSTANCE = {
    "agentic execution requires a configured target model": "agentic execution requires a configured target model",
    "execution_model must be non-empty": "--execution-model: must be non-empty",
    "agentic_lanes must be at least 1": "--agentic-lanes: must be at least 1",
    "agentic_lanes cannot be combined with replay_concurrency": "--agentic-lanes: cannot be combined with --concurrency",
    "agentic_lanes requires trace_format='agentic_mooncake', 'weka', or 'dynamo'":
        "--agentic-lanes: requires --trace-format agentic-mooncake, weka, or dynamo",
    "weka_nested_timestamp_basis requires trace_format='weka'": "weka_nested_timestamp_basis requires trace_format='weka'",
    "weka_nested_timestamp_basis must be 'auto', 'absolute', or 'relative', got 'sometimes'":
        "--weka-nested-timestamp-basis: must be 'auto', 'absolute', or 'relative', got 'sometimes'",
}


def f_call(case, tmp_path):
    """A fixture case as the probe called the reference: (trace file, keywords)."""
    w, r = case["workload"], case["replay"]
    # The reference names a Weka source by its file: the probe's was this.
    path = tmp_path / "rows_e6ee3f4ea019.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in w["rows"]))
    kw = {"trace_format": w["trace_format"], "extra_engine_args": {"engine": case["engine"]}}
    if "trace_block_size" in w:
        kw["trace_block_size"] = w["trace_block_size"]
    for k in ("execution_model", "agentic_lanes", "weka_nested_timestamp_basis", "replay_concurrency"):
        if k in r:
            kw[k] = r[k]
    kw["capture_per_request"] = bool(r.get("per_request"))
    return path, kw


@pytest.mark.parametrize("case", F_CASES, ids=[c["case"] for c in F_CASES])
def test_trace_options_give_the_reference_results(case, tmp_path):
    path, kw = f_call(case, tmp_path)
    if "error" in case:
        reference = case["error"].split(": ", 1)[1]
        with pytest.raises(ValueError) as e:
            mocker.run_mocker_trace_replay([path], **kw)
        assert F_SUBSTANCE.get(reference, reference) in str(e.value)
        return
    r = mocker.run_mocker_trace_replay([path], **kw)
    differ = {k: (v, r.summary[k]) for k, v in case["result"].items() if not close(r.summary[k], v, 1e-9)}
    assert not differ, f"(reference, mocker): {differ}"
    if "per_request" in case:
        got = sorted([x["arrival_time_ms"], x["ttft_ms"], x["reused_input_tokens"]] for x in r.per_request)
        assert got == [row[:3] for row in case["per_request"]]


def test_trace_option_keywords_take_the_reference_types(tmp_path):
    path, kw = f_call(next(c for c in F_CASES if c["case"] == "F2_agentic_execution_model"), tmp_path)
    # The reference's TypeErrors, from the keywords' types.
    with pytest.raises(TypeError, match="agentic_lanes"):
        mocker.run_mocker_trace_replay([path], **kw, agentic_lanes="2")
    with pytest.raises(TypeError, match="execution_model"):
        mocker.run_mocker_trace_replay([path], **{**kw, "execution_model": 3})
    with pytest.raises(ValueError, match="--agentic-lanes: must be at least 1 \\(got -1\\)"):
        mocker.run_mocker_trace_replay([path], **kw, agentic_lanes=-1)
    # True is 1, as the reference takes it.
    assert mocker.run_mocker_trace_replay([path], **kw, agentic_lanes=True).summary["duration_ms"] == 536.0
    # The run records the projection; mocker.replay takes the same flags.
    r = mocker.replay(path, trace_format="agentic-mooncake", engine_args=kw["extra_engine_args"],
                      execution_model="target", agentic_lanes=2)
    assert r.summary["duration_ms"] == 268.0
    assert r.run["agentic"]["model_projection"] == {
        "policy": "project_to_configured_target", "source_models": ["source-a", "source-b"], "target_model": "target"}
    assert r.run["agentic"]["lanes"] == 2


# A lane case the fixture does not hold: 3 lanes, a faster clock, and plays of uneven length.
LANE_ROWS = [
    {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16, "hash_id_scope": "local",
     "source": {"format": "probe", "digest": "probe"}},
    *[{"request_id": f"p{p}r{i}", "play_id": f"play{p}", "session_id": f"s{p}", "model": "m", "input_length": 32 + 16 * i,
       "output_length": 4 + p, "hash_ids": list(range(100 * p, 100 * p + 2 + i)), "not_before_ms": 7.0 * p + 3.0 * i,
       "dependencies": [] if i == 0 else [{"request_id": f"p{p}r{i - 1}", "trigger": "completion",
                                           "delay_ms": 40.0 + p, "relation": "sequence"}]}
      for p in range(5) for i in range(1 + p % 3)],
]


def test_lanes_match_the_reference_on_an_unseen_case(tmp_path):
    python = reference_python()
    if python is None:
        pytest.skip("Dynamo's reference (dynamo._core, ai-dynamo-runtime 1.6.1) is not importable: set "
                    "MOCKER_DYNAMO_PYTHON to an interpreter that has it")
    path = tmp_path / "lanes.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in LANE_ROWS))
    engine = {"engine": {"block_size": 16, "num_gpu_blocks": 1000, "max_num_seqs": 32, "max_num_batched_tokens": 1024}}
    for lanes in (None, 1, 3):
        kw = dict(extra_engine_args=engine, trace_format="agentic_mooncake", execution_model="target",
                  agentic_lanes=lanes, arrival_speedup_ratio=2.0, capture_per_request=True)
        ours = mocker.run_mocker_trace_replay([path], **kw)
        ref = run_reference(python, "run_mocker_trace_replay", [[str(path)]], kw)
        # The reference's agentic summary adds graph and trajectory keys mocker does not report.
        differ = {k: (v, ours.summary[k]) for k, v in ref["summary"].items()
                  if k in ours.summary and k not in WALL and not close(ours.summary[k], v, 1e-9)}
        assert not differ, f"lanes={lanes} (reference, mocker): {differ}"
        mine = sorted(ours.per_request, key=lambda x: x["arrival_time_ms"])
        theirs = sorted(ref["per_request"], key=lambda x: x["arrival_time_ms"])
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            differ = {k: (b[k], a[k]) for k in RECORD_KEYS if not close(a[k], b[k], 1e-9)}
            assert not differ, f"lanes={lanes} (reference, mocker): {differ}"


# ---- against the reference ---------------------------------------------------------------

# Deterministic workloads (one worker, round robin; the reference's kv_router breaks ties at
# random): call, positional and keyword arguments.
REFERENCE_CASES = {
    "single_worker": ("run_mocker_synthetic_trace_replay", [1000, 100, 200],
                      dict(extra_engine_args=ENGINE, replay_concurrency=64)),
    "prefix_groups": ("run_mocker_synthetic_trace_replay", [1024, 16, 100],
                      dict(extra_engine_args=ENGINE, replay_concurrency=1, shared_prefix_ratio=0.5, num_prefix_groups=2)),
    "turns": ("run_mocker_synthetic_trace_replay", [500, 20, 20],
              dict(extra_engine_args=ENGINE, replay_concurrency=2, turns_per_session=3, inter_turn_delay_ms=100.0)),
    "goodput": ("run_mocker_synthetic_trace_replay", [1000, 100, 100],
                dict(extra_engine_args=ENGINE, replay_concurrency=16, sla_ttft_ms=200.0, sla_itl_ms=20.0)),
    "disaggregated": ("run_mocker_synthetic_trace_replay", [3000, 20, 50], dict(replay_concurrency=4, **DISAGG)),
    "trace_round_robin": ("run_mocker_trace_replay", ["TRACE"],
                          dict(extra_engine_args=ENGINE, num_workers=2, capture_per_request=True)),
    "trace_concurrency": ("run_mocker_trace_replay", ["TRACE"],
                          dict(extra_engine_args=ENGINE, replay_concurrency=2, arrival_speedup_ratio=2.0)),
}
# Poisson arrivals: mocker's clock counts whole nanoseconds, so each arrival time is the
# reference's rounded to 1e-6 ms, and latencies differ from the 9th significant digit on.
POISSON_CASE = ("run_mocker_synthetic_trace_replay", [1000, 100, 300],
                dict(extra_engine_args=ENGINE, num_workers=2, request_rate=20.0, arrival_seed=7))
# What a per-request record of a trace replay must share with the reference's (the uuid is
# random there; mocker names sessionless rows' sessions, the reference leaves them null).
RECORD_KEYS = ["arrival_time_ms", "first_admit_ms", "first_token_ms", "last_token_ms", "ttft_ms", "ttst_ms",
               "e2e_latency_ms", "itl_ms", "input_length", "output_length", "reused_input_tokens",
               "decode_worker_idx", "terminal_status"]

REFERENCE_SCRIPT = """
import json, sys
import dynamo._core as c
call, args, kwargs = json.loads(sys.stdin.read())
r = getattr(c, call)(*args, **kwargs)
print(json.dumps({"summary": r.summary, "per_request": r.per_request}))
"""


def reference_python():
    """An interpreter with the reference, or None: MOCKER_DYNAMO_PYTHON, else this one."""
    candidate = os.environ.get("MOCKER_DYNAMO_PYTHON") or sys.executable
    probe = subprocess.run([candidate, "-c", "import dynamo._core"], capture_output=True)
    return candidate if probe.returncode == 0 else None


def run_reference(python, call, args, kwargs):
    # In its own process: the reference logs to stderr, and this keeps its runtime out of
    # the one testing mocker.
    done = subprocess.run([python, "-c", REFERENCE_SCRIPT], input=json.dumps([call, args, kwargs]),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def close(a, b, rel):
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("case", [*REFERENCE_CASES, "poisson"])
def test_numbers_match_the_reference(case, trace):
    python = reference_python()
    if python is None:
        pytest.skip("Dynamo's reference (dynamo._core, ai-dynamo-runtime 1.6.1) is not importable: set "
                    "MOCKER_DYNAMO_PYTHON to an interpreter that has it")
    call, args, kwargs = REFERENCE_CASES[case] if case != "poisson" else POISSON_CASE
    rel = 1e-6 if case == "poisson" else 1e-9
    args = [[str(trace)] if a == "TRACE" else a for a in args]
    ours = getattr(mocker, call)(*args, **kwargs)
    ref = run_reference(python, call, args, kwargs)
    assert list(ours.summary) == list(ref["summary"])
    differ = {k: (v, ours.summary[k]) for k, v in ref["summary"].items()
              if k not in WALL and not close(ours.summary[k], v, rel)}
    assert not differ, f"(reference, mocker): {differ}"
    if ref["per_request"] is not None:
        assert len(ours.per_request) == len(ref["per_request"])
        for mine, theirs in zip(ours.per_request, ref["per_request"]):
            differ = {k: (theirs[k], mine[k]) for k in RECORD_KEYS if not close(mine[k], theirs[k], rel)}
            assert not differ, f"(reference, mocker): {differ}"
