"""mocker: a GPU-free simulator of LLM inference engines, from Python.

The calls and classes are the extension module ``mocker._native``'s (see ``__init__.pyi``);
this file re-exports them and adds ``sweep``, which only dispatches a sweep's points (to
threads in this process, or to Ray tasks) and assembles their rows: every point is a native
replay, expanded and checked by ``mocker sweep``'s own code.
"""

from . import _native
from ._native import *  # noqa: F401,F403  (the reference's calls, replay, the result types)
from ._native import __version__  # noqa: F401

__doc__ = _native.__doc__


def sweep(trace=None, *, ray_address=None, **flags):
    """Run ``mocker sweep``: one offline replay per point of a grid, one summary row each.

    Keywords are ``mocker sweep``'s flags, ``_`` for ``-``, as in ``replay``: the base
    replay's (``input_tokens=...``, ``engine_args={...}``, ``router="kv"``, ...) and the
    axes ``sweep_engine_args`` (a list of engine args, each laid over ``engine_args``),
    ``sweep_num_workers``, ``sweep_num_prefill_workers``, ``sweep_num_decode_workers`` and
    ``sweep_router`` (lists, or the CLI's comma text); ``jobs`` caps the points run at once
    here. ``trace`` is the trace file; without it the workload is synthetic.

    Without ``ray_address`` the points run on this machine's cores with the interpreter
    released, as ``mocker sweep`` runs them. With one (``"auto"``, ``"ray://head:10001"``,
    ``"head:6379"``) each point is a Ray task (one CPU) running the native replay on some
    node of the cluster: ``mocker`` must be installed on every node, and files the flags
    name read there. An existing ``ray.init`` connection is used as it is.

    Returns the rows in grid order as a pandas DataFrame when pandas is importable, else as
    a list of dicts; either way the ``mocker sweep`` rows, column for column, equal between
    the two modes but for ``wall_ms`` (each point's wall time). A bad flag or axis raises
    ``ValueError`` with the CLI's message before anything runs.
    """
    if ray_address is not None:
        if not isinstance(ray_address, str):
            raise ValueError(f"ray_address: must be a Ray address string such as \"auto\" (got {ray_address!r})")
        if flags.get("jobs") is not None:
            raise ValueError("jobs: local sweeps only; a Ray sweep runs one task per point on the cluster's CPUs")
        try:
            import ray
        except ImportError as e:
            raise ImportError("ray_address: Ray is not installed (pip install './python[ray]', or ray)") from e
    plan = _native._sweep_plan(trace, flags)
    rows = plan.run() if ray_address is None else _ray_rows(ray, ray_address, plan)
    return _table(rows)


def _sweep_task(argv, index):
    """A Ray task's body: point ``index`` of the sweep ``argv`` stands for, natively."""
    return _native._sweep_point(argv, index)


# The Ray remote function, made once per process (Ray exports it to each cluster it meets).
_remote_sweep_task = None


def _ray_rows(ray, address, plan):
    """The plan's rows, one Ray task per point, in grid order."""
    global _remote_sweep_task
    if not ray.is_initialized():
        ray.init(address=address)
    if _remote_sweep_task is None:
        _remote_sweep_task = ray.remote(num_cpus=1)(_sweep_task)
    argv = ray.put(plan.argv)
    refs = [_remote_sweep_task.remote(argv, i) for i in range(len(plan))]
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as e:
        for ref in refs:
            ray.cancel(ref)
        # A point's own error, as a local sweep raises it (not wrapped in the task's traceback).
        if isinstance(e.cause, ValueError):
            raise ValueError(str(e.cause)) from None
        raise


def _table(rows):
    """Rows as a pandas DataFrame (columns in row order) when pandas is importable."""
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame.from_records(rows, columns=list(rows[0]))
