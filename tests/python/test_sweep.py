"""`mocker.sweep` (python/mocker/__init__.py over `mocker_args::sweep`): its rows are
`mocker sweep`'s for the same grid, in grid order; its axes take lists; bad flags raise the
CLI's message and keywords it does not take are refused by name; and on a local Ray
instance (`ray.init(num_cpus=2)`) the same 8 points, run as Ray tasks, give the same table.

Run by crates/mocker/tests/python_api.rs (`MOCKER_BIN`: the mocker binary).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import mocker

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOCKER_BIN = os.environ.get("MOCKER_BIN") or str(ROOT / "target" / "debug" / "mocker")
# A small synthetic workload every point replays; prefix groups make the routers differ.
WORKLOAD = {
    "input_tokens": 512,
    "output_tokens": 16,
    "request_count": 40,
    "concurrency": 8,
    "num_prefix_groups": 4,
    "shared_prefix_ratio": 0.5,
}
ENGINES = [{"block_size": 16}, {"block_size": 32, "max_num_seqs": 4}]
# 2 engine args × 2 worker counts × 2 routers: the 8 points of the Ray test.
GRID = {"sweep_engine_args": ENGINES, "sweep_num_workers": [1, 2], "sweep_router": ["round-robin", "kv"]}


def flags(**kw):
    """Keyword arguments as `mocker sweep`'s command line (the CLI spelling of each)."""
    argv = []
    for k, v in kw.items():
        name = "--" + k.replace("_", "-")
        if k == "sweep_engine_args":
            for e in v:
                argv += [name, json.dumps(e)]
        elif isinstance(v, (list, tuple)):
            argv += [name, ",".join(map(str, v))]
        elif isinstance(v, dict):
            argv += [name, json.dumps(v)]
        else:
            argv += [name, str(v)]
    return argv


def cli_rows(tmp_path, **kw):
    """`mocker sweep`'s JSON rows for the same keywords."""
    out = tmp_path / "sweep.json"
    done = subprocess.run([MOCKER_BIN, "sweep", *flags(**kw), "--output-json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())["points"]


def cli_error(**kw):
    """The message `mocker sweep` exits 2 with (its `error: ` line, without the prefix)."""
    done = subprocess.run([MOCKER_BIN, "sweep", *flags(**kw)], capture_output=True, text=True)
    assert done.returncode == 2, (done.returncode, done.stderr)
    return [line for line in done.stderr.splitlines() if line.startswith("error: ")][0][len("error: "):]


def without_wall(rows):
    """Rows as (key, value) lists, keys in order, without `wall_ms` (each run's own wall time)."""
    return [[(k, v) for k, v in row.items() if k != "wall_ms"] for row in rows]


@pytest.fixture
def records(monkeypatch):
    """`mocker.sweep` as it behaves without pandas: a list of dicts."""
    monkeypatch.setitem(sys.modules, "pandas", None)


def test_local_rows_are_the_cli_rows_in_grid_order(tmp_path, records):
    rows = mocker.sweep(**WORKLOAD, **GRID)
    assert isinstance(rows, list) and len(rows) == 8
    cli = cli_rows(tmp_path, **WORKLOAD, **GRID)
    assert without_wall(rows) == without_wall(cli)
    assert [r["point"] for r in rows] == list(range(8))
    assert [(r["num_workers"], r["router"]) for r in rows[:4]] == [(1, "round-robin"), (1, "kv"), (2, "round-robin"), (2, "kv")]
    assert rows[0]["engine_args"] == json.dumps(ENGINES[0]) and rows[4]["engine_args"] == json.dumps(ENGINES[1])
    assert all(r["wall_ms"] > 0 for r in rows)
    # The grid is not a constant: engine args, worker counts and routers each move a figure.
    assert len({r["duration_ms"] for r in rows}) > 4


def test_axes_take_the_cli_comma_text_and_an_sla_adds_goodput(tmp_path, records):
    kw = dict(WORKLOAD, sweep_num_workers="1,3", sla_ttft_ms=40, jobs=1)
    rows = mocker.sweep(**kw)
    assert without_wall(rows) == without_wall(cli_rows(tmp_path, **kw))
    assert "goodput_completed_requests" in rows[0]


def test_a_disaggregated_sweep_gives_the_cli_rows(tmp_path, records):
    kw = dict(
        WORKLOAD,
        prefill_engine_args={"worker_type": "prefill"},
        decode_engine_args={"worker_type": "decode"},
        sweep_num_prefill_workers=[1, 2],
        sweep_num_decode_workers=(1, 2),
    )
    rows = mocker.sweep(**kw)
    assert without_wall(rows) == without_wall(cli_rows(tmp_path, **kw))
    assert [(r["num_prefill_workers"], r["num_decode_workers"]) for r in rows] == [(1, 1), (1, 2), (2, 1), (2, 2)]


def test_a_trace_sweep_gives_the_cli_rows(tmp_path, records):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 100 * i, "input_length": 1024, "output_length": 20, "hash_ids": [0, 1 + i % 3]}) + "\n"
            for i in range(30)
        )
    )
    rows = mocker.sweep(trace, sweep_router=["round-robin", "kv"], num_workers=2)
    out = tmp_path / "cli.json"
    done = subprocess.run(
        [MOCKER_BIN, "sweep", str(trace), "--sweep-router", "round-robin,kv", "--num-workers", "2", "--output-json", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert without_wall(rows) == without_wall(json.loads(out.read_text())["points"])


def test_the_table_is_a_dataframe_with_pandas():
    pandas = pytest.importorskip("pandas")
    table = mocker.sweep(**WORKLOAD, sweep_num_workers=[1, 2])
    assert isinstance(table, pandas.DataFrame)
    rows = mocker.sweep(**WORKLOAD, sweep_num_workers=[1, 2], jobs=2)
    assert isinstance(rows, pandas.DataFrame)
    assert list(table.columns) == list(rows.columns) and list(table.columns)[:4] == ["point", "engine_args", "num_workers", "router"]
    assert table.drop(columns="wall_ms").equals(rows.drop(columns="wall_ms"))
    assert table["num_workers"].tolist() == [1, 2]


@pytest.mark.parametrize(
    "kw",
    [
        {"sweep_num_workers": [1, 0]},
        {"sweep_num_workers": "2,x"},
        {"sweep_router": ["kv", "random"]},
        {"sweep_engine_args": [{"block_size": 16}, {"no_such_knob": 1}]},
        {"sweep_num_prefill_workers": [2]},
        {"jobs": 0},
        {"mode": "online"},
        {"router_config": {"router_temperature": 0.5}},
        {"scaling_plan": "plan.json"},
        {"telemetry_jsonl": "telemetry.jsonl"},
    ],
)
def test_bad_axes_and_flags_raise_the_cli_message(kw):
    with pytest.raises(ValueError) as e:
        mocker.sweep(**WORKLOAD, **kw)
    assert str(e.value) == cli_error(**WORKLOAD, **kw)


def test_keywords_sweep_does_not_take_are_refused_by_name(monkeypatch):
    with pytest.raises(ValueError, match="--no-such-flag"):
        mocker.sweep(**WORKLOAD, no_such_flag=1)
    for keyword in ["output_csv", "output_json"]:
        with pytest.raises(ValueError, match=f"^{keyword}: not taken by mocker.sweep"):
            mocker.sweep(**WORKLOAD, **{keyword: "rows.csv"})
    with pytest.raises(ValueError, match="^jobs: local sweeps only"):
        mocker.sweep(**WORKLOAD, jobs=2, ray_address="auto")
    with pytest.raises(ValueError, match="^ray_address: must be a Ray address"):
        mocker.sweep(**WORKLOAD, ray_address=1)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"^ray_address: Ray is not installed \(pip install './python\[ray\]'"):
        mocker.sweep(**WORKLOAD, ray_address="auto")


class LocalRunRefused:
    """A sweep plan whose local run fails: a Ray sweep must not fall back to it."""

    def __init__(self, plan):
        self.plan = plan
        self.argv = plan.argv

    def __len__(self):
        return len(self.plan)

    def run(self):
        raise AssertionError("a Ray sweep ran its points in the driver")


class Native:
    """`mocker._native` with its sweep plans' local runs refused."""

    native = mocker._native

    def __getattr__(self, name):
        return getattr(self.native, name)

    def _sweep_plan(self, trace, flags):
        return LocalRunRefused(self.native._sweep_plan(trace, flags))


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    # A new local instance even where a cluster runs on this machine (`ray.init()` alone would
    # join that one, and refuse `num_cpus` for it).
    ray.init(address="local", num_cpus=2)
    yield ray
    ray.shutdown()


def test_a_ray_sweep_of_8_points_equals_the_local_sweep(ray_instance, monkeypatch, records):
    local = mocker.sweep(**WORKLOAD, **GRID)
    # The driver only plans: its plan refuses to run locally, so the rows are the tasks'.
    monkeypatch.setattr(mocker, "_native", Native())
    # The instance ray.init started is used as it is; "auto" would also find it.
    remote = mocker.sweep(**WORKLOAD, **GRID, ray_address="auto")
    assert len(remote) == 8
    assert without_wall(remote) == without_wall(local)
    # A bad axis is refused before any task is sent, with the CLI's message.
    with pytest.raises(ValueError, match="--sweep-num-workers: must be a comma list"):
        mocker.sweep(**WORKLOAD, sweep_num_workers=[0], ray_address="auto")


class FailingPlan:
    """A plan whose command line fails where the tasks expand it (here the driver never does)."""

    argv = ["mocker sweep", "--input-tokens=64", "--jobs=0"]

    def __len__(self):
        return 2


def test_a_ray_task_error_is_raised_as_the_local_value_error(ray_instance):
    with pytest.raises(ValueError) as e:
        mocker._ray_rows(ray_instance, "auto", FailingPlan())
    # The point's own message, not wrapped in the task's traceback.
    assert str(e.value) == "--jobs: must be in 1..=1024 (got 0)"
    assert type(e.value) is ValueError
