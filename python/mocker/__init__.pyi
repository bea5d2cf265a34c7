"""mocker: a GPU-free simulator of LLM inference engines, from Python.

NVIDIA Dynamo mocker's replay calls, with the keywords, defaults and results of
``dynamo._core`` (ai-dynamo-runtime 1.6.1): ``import mocker as c`` in place of
``import dynamo._core as c`` gives the same numbers. ``replay`` takes ``mocker replay``'s own
flags, and ``sweep`` ``mocker sweep``'s, locally or as Ray tasks across a cluster. Every call
goes through the CLI's parser and checks: a mistake raises ``ValueError``
with the message ``mocker replay`` prints, and a keyword of the reference that asks for what
mocker does not do yet (AIS perf models, some trace options) is refused by name. Scaling
policies run in the loop and telemetry is sampled as in the reference. The interpreter is released while a replay runs.
"""

import os
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Union, overload

try:
    import pandas
except ImportError: ...

__version__: str

_EngineArgs = Union[Mapping[str, Any], str]
_Path = Union[str, "os.PathLike[str]"]

class KvRouterConfig:
    """KV router settings, with the reference's keywords and defaults.

    The settings mocker's router models act (``overlap_score_weight`` / ``prefill_load_scale``,
    ``overlap_score_credit``, ``overlap_score_credit_decay``, ``decode_active_request_weight``,
    ``router_temperature``, ``router_track_active_blocks``, ``router_assume_kv_reuse``,
    ``router_track_prefill_tokens``, ``router_queue_threshold``, ``router_queue_policy``;
    ``seed``, mocker's, seeds the tie-breaks). The others are accepted at the reference's
    default only; any other value raises ``ValueError`` naming the keyword.
    """

    def __init__(
        self,
        overlap_score_weight: Optional[float] = None,
        host_cache_hit_weight: float = 0.75,
        disk_cache_hit_weight: float = 0.25,
        router_temperature: float = 0.0,
        use_kv_events: bool = True,
        *,
        router_replica_sync: bool = False,
        router_track_active_blocks: bool = True,
        router_track_output_blocks: bool = False,
        router_assume_kv_reuse: bool = True,
        router_track_prefill_tokens: bool = True,
        router_prefill_load_model: str = "none",
        router_ttl_secs: float = 120.0,
        router_approximate_cache_policy: Literal["ttl", "lru"] = "ttl",
        router_queue_threshold: Optional[float] = None,
        router_event_threads: int = 4,
        router_queue_policy: str = "fcfs",
        use_remote_indexer: bool = False,
        serve_indexer: bool = False,
        enable_session_prefix_index: bool = False,
        shared_cache_multiplier: Optional[float] = None,
        shared_cache_type: str = "none",
        router_predicted_ttl_secs: Optional[float] = None,
        conditional_disagg_enabled: bool = False,
        conditional_disagg_policy: str = "isl_bounding",
        conditional_disagg_eff_isl_threshold: int = 2048,
        conditional_disagg_eff_isl_ratio_threshold: float = 0.7,
        conditional_disagg_prefill_busy_threshold: Optional[float] = None,
        conditional_disagg_decode_busy_threshold: Optional[float] = None,
        overlap_score_credit: float = 1.0,
        overlap_score_credit_decay: float = 0.0,
        prefill_load_scale: float = 1.0,
        decode_active_request_weight: float = 0.0,
        router_policy_config: Optional[str] = None,
        router_prefill_policy: Optional[str] = None,
        router_decode_policy: Optional[str] = None,
        router_tracking_hash: Literal["public-xxh3-v1", "keyed-xxh3-v1"] = "public-xxh3-v1",
        router_tracking_key_file: Optional[_Path] = None,
        router_tracking_key_id: Optional[str] = None,
        seed: int = 42,
    ) -> None:
        """Settings checked as ``mocker replay --router-config`` checks them.

        ``overlap_score_weight``, when given, is the prefill cost's scale and wins over
        ``prefill_load_scale``; 0 also zeroes the overlap credit, as in the reference.
        """
        ...
    @staticmethod
    def from_json(config_json: str) -> "KvRouterConfig":
        """Settings from ``--router-config`` JSON (mocker's keys; unknown keys refused)."""
        ...
    def to_json(self) -> str:
        """The settings as ``--router-config`` JSON."""
        ...
    def copy(self) -> "KvRouterConfig":
        """A copy (the config is immutable)."""
        ...
    @property
    def overlap_score_credit(self) -> float: ...
    @property
    def overlap_score_credit_decay(self) -> float: ...
    @property
    def prefill_load_scale(self) -> float: ...
    @property
    def overlap_score_weight(self) -> float: ...
    @property
    def decode_active_request_weight(self) -> float: ...
    @property
    def router_temperature(self) -> float: ...
    @property
    def router_queue_threshold(self) -> Optional[float]: ...

class ReplayResult:
    """An offline replay's result, as the reference's (plus ``run``)."""

    @property
    def summary(self) -> Dict[str, Any]:
        """The report: the reference's keys in its order (``mean_ttft_ms``, ``p99_itl_ms``,
        ``duration_ms``, ``output_throughput_tok_s``, ``prefix_cache_reused_ratio``, ...)."""
        ...
    @property
    def per_request(self) -> Optional[List[Dict[str, Any]]]:
        """One dict per request (``mocker replay --report-jsonl``'s records: the reference's
        fields, then mocker's, such as every token time) when captured, else None."""
        ...
    @property
    def coverage(self) -> Dict[str, Any]:
        """``{"capture_per_request", "capture_planner_details", "per_request_records"}``;
        ``capture_planner_details`` is True only when a scaling policy ran with it."""
        ...
    @property
    def lifecycle_operations(self) -> List[Dict[str, Any]]:
        """Worker lifecycle changes a scaling policy made (start, ready, drain, removal); empty
        without a policy or with ``capture_planner_details=False``."""
        ...
    @property
    def telemetry(self) -> None:
        """Telemetry samples: None (mocker samples none yet)."""
        ...
    @property
    def run(self) -> Dict[str, Any]:
        """What the replay ran (mocker's): timing source, KV capacity, pools, router; the
        report file's ``run`` object."""
        ...

@overload
def run_mocker_trace_replay(
    trace_files: Sequence[_Path],
    *args: Any,
    replay_mode: Literal["offline"] = "offline",
    **kwargs: Any,
) -> ReplayResult: ...
@overload
def run_mocker_trace_replay(
    trace_files: Sequence[_Path],
    *args: Any,
    replay_mode: Literal["online"],
    **kwargs: Any,
) -> Dict[str, Any]: ...
@overload
def run_mocker_trace_replay(
    trace_files: Sequence[_Path],
    extra_engine_args: Optional[_EngineArgs] = None,
    prefill_engine_args: Optional[_EngineArgs] = None,
    decode_engine_args: Optional[_EngineArgs] = None,
    router_config: Optional[KvRouterConfig] = None,
    ais_perf_config: None = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    replay_concurrency: Optional[int] = None,
    replay_mode: Literal["offline", "online"] = "offline",
    router_mode: Literal["round_robin", "kv_router"] = "round_robin",
    arrival_speedup_ratio: float = 1.0,
    trace_block_size: Optional[int] = None,
    trace_format: str = "mooncake",
    trace_shared_prefix_ratio: float = 0.0,
    trace_num_prefix_groups: int = 0,
    report_jsonl_path: Optional[_Path] = None,
    max_sim_time_ms: Optional[float] = None,
    model_name: None = None,
    sla_ttft_ms: Optional[float] = None,
    sla_itl_ms: Optional[float] = None,
    sla_e2e_ms: Optional[float] = None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    scaling_policy: Optional[Any] = None,
    agentic_lanes: Optional[int] = None,
    execution_model: Optional[str] = None,
    weka_nested_timestamp_basis: Optional[Literal["auto", "absolute", "relative"]] = None,
    capture_telemetry: bool = False,
    telemetry_sample_interval_ms: float = 1_000.0,
    telemetry_callback: Optional[Callable[[Dict[str, Any]], Any]] = None,
    telemetry_jsonl_path: Optional[_Path] = None,
    kv_event_lag_ms: Optional[float] = None,
) -> Union[ReplayResult, Dict[str, Any]]:
    """Replay one trace file (``mocker replay TRACE``) and return the report.

    Offline (the default) returns a ``ReplayResult``; ``replay_mode="online"`` runs live
    engines on the wall clock and returns the summary dict. Keywords map onto the CLI's
    flags: ``extra_engine_args`` (a mapping, flat or ``{"engine": {...}}``, or JSON text)
    is ``--engine-args``, ``prefill_engine_args``/``decode_engine_args`` make a
    disaggregated run, ``replay_concurrency`` is ``--concurrency`` (closed loop; without it
    first turns arrive at their timestamps divided by ``arrival_speedup_ratio``),
    ``router_mode`` is ``--router``, ``trace_block_size`` (default 512, or the trace's own)
    and ``trace_format`` as their flags, ``report_jsonl_path`` writes the per-request
    records, ``max_sim_time_ms`` stops the simulated clock, ``sla_*_ms`` add the
    ``goodput_*`` keys, ``capture_per_request`` keeps the records in ``per_request``,
    ``kv_event_lag_ms`` delays the KV router's view of stored and removed blocks
    (``--kv-event-lag-ms``; kv_router only), ``scaling_policy`` (an object with
    ``initial_tick_ms()`` and ``on_tick(snapshot)``) scales the pools on simulated-time ticks.
    ``capture_telemetry`` keeps samples on ``.telemetry``, ``telemetry_callback`` is given
    each sample, ``telemetry_jsonl_path`` writes them (``--telemetry-jsonl``), every
    ``telemetry_sample_interval_ms`` of simulated time (another interval without a sink is
    refused). Agentic and Weka traces: ``agentic_lanes`` (``--agentic-lanes``: plays run N at
    a time), ``execution_model`` (``--execution-model``: the target model every source model
    is projected onto; required for agentic traces), ``weka_nested_timestamp_basis``
    (``--weka-nested-timestamp-basis``).

    Refused by name (``ValueError``) unless left at their defaults: ``ais_perf_config``,
    ``model_name``, ``trace_shared_prefix_ratio`` and ``trace_num_prefix_groups``. Exactly
    one trace file.
    """
    ...

@overload
def run_mocker_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *args: Any,
    replay_mode: Literal["offline"] = "offline",
    **kwargs: Any,
) -> ReplayResult: ...
@overload
def run_mocker_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    *args: Any,
    replay_mode: Literal["online"],
    **kwargs: Any,
) -> Dict[str, Any]: ...
@overload
def run_mocker_synthetic_trace_replay(
    input_tokens: int,
    output_tokens: int,
    request_count: int,
    extra_engine_args: Optional[_EngineArgs] = None,
    prefill_engine_args: Optional[_EngineArgs] = None,
    decode_engine_args: Optional[_EngineArgs] = None,
    router_config: Optional[KvRouterConfig] = None,
    ais_perf_config: None = None,
    num_workers: int = 1,
    num_prefill_workers: int = 1,
    num_decode_workers: int = 1,
    replay_concurrency: Optional[int] = None,
    replay_mode: Literal["offline", "online"] = "offline",
    router_mode: Literal["round_robin", "kv_router"] = "round_robin",
    arrival_speedup_ratio: float = 1.0,
    request_rate: Optional[float] = None,
    arrival_interval_ms: Optional[float] = None,
    arrival_seed: int = 42,
    turns_per_session: int = 1,
    shared_prefix_ratio: float = 0.0,
    num_prefix_groups: int = 0,
    inter_turn_delay_ms: float = 0.0,
    model_name: None = None,
    sla_ttft_ms: Optional[float] = None,
    sla_itl_ms: Optional[float] = None,
    sla_e2e_ms: Optional[float] = None,
    capture_per_request: bool = False,
    capture_planner_details: bool = True,
    scaling_policy: Optional[Any] = None,
    capture_telemetry: bool = False,
    telemetry_sample_interval_ms: float = 1_000.0,
    telemetry_callback: Optional[Callable[[Dict[str, Any]], Any]] = None,
    telemetry_jsonl_path: Optional[_Path] = None,
    kv_event_lag_ms: Optional[float] = None,
) -> Union[ReplayResult, Dict[str, Any]]:
    """Replay a synthetic workload (``mocker replay --input-tokens ...``) and return the report.

    The load is one of ``replay_concurrency`` (closed loop), ``request_rate`` (Poisson,
    seeded by ``arrival_seed``) or ``arrival_interval_ms``; with none, as on the CLI,
    ``replay_concurrency=64`` (the reference refuses a call without one). Sessions:
    ``turns_per_session``, ``inter_turn_delay_ms``, ``shared_prefix_ratio``,
    ``num_prefix_groups``. The other keywords act and are refused as in
    ``run_mocker_trace_replay``.
    """
    ...

def replay(
    trace: Optional[_Path] = None,
    *,
    per_request: bool = False,
    **flags: Any,
) -> ReplayResult:
    """Run ``mocker replay`` with its own flags as keywords, and return the result.

    A keyword is a flag with ``_`` for ``-`` (``num_workers=4`` is ``--num-workers 4``,
    ``router="kv"``, ``engine_args={"block_size": 64}``, ``model="Qwen/Qwen3-8B"``,
    ``report_json="report.json"``, ``plot="plots"``): True passes a switch (``strict=True``),
    None or False leaves the flag out, a dict or list is passed as JSON, anything else as its
    ``str``. ``trace`` is the trace file; without it the workload is synthetic.
    ``per_request=True`` keeps the per-request records in ``.per_request``. Online runs
    (``mode="online"``) return a ``ReplayResult`` too. Example::

        import mocker
        r = mocker.replay(input_tokens=3000, output_tokens=300, request_rate=4,
                          request_count=200, model="Qwen/Qwen3-14B", gpu="l40s")
        print(r.summary["mean_ttft_ms"], r.run["timing"])
    """
    ...

def sweep(
    trace: Optional[_Path] = None,
    *,
    ray_address: Optional[str] = None,
    **flags: Any,
) -> Union["pandas.DataFrame", List[Dict[str, Any]]]:
    """Run ``mocker sweep``: one offline replay per point of a grid, one summary row each.

    Keywords are ``mocker sweep``'s flags with ``_`` for ``-``, as in ``replay``: the base
    replay's, and the axes ``sweep_engine_args`` (a list of engine args, dicts or JSON text,
    each laid over ``engine_args``), ``sweep_num_workers``, ``sweep_num_prefill_workers``,
    ``sweep_num_decode_workers`` and ``sweep_router`` (lists, or the CLI's comma text). The
    grid is engine args × worker counts × routers (aggregated), or prefill × decode worker
    counts × routers (disaggregated: give ``prefill_engine_args`` and ``decode_engine_args``).
    ``jobs`` caps the points run at once locally. ``trace`` is the trace file; without it the
    workload is synthetic. ``output_csv`` and ``output_json`` are refused: the table is the
    result.

    Without ``ray_address`` the points run on this machine's cores with the interpreter
    released, as ``mocker sweep`` runs them. With one (``"auto"``, ``"ray://head:10001"``,
    ``"head:6379"``) each point is a Ray task (one CPU) running the native replay on some node
    (``pip install './python[ray]'``; ``mocker`` installed on every node, files the flags name
    readable there); an existing ``ray.init`` connection is used as it is.

    Returns the rows in grid order, a pandas DataFrame when pandas is importable, else a list
    of dicts: ``point``, ``engine_args``, the worker counts, ``router``, the summary's figures
    (and ``goodput_*`` with an SLA) and ``wall_ms``; equal between the two modes but for
    ``wall_ms``. A bad flag or axis raises ``ValueError`` with the CLI's message. Example::

        import mocker
        table = mocker.sweep(input_tokens=3000, output_tokens=300, request_rate=8,
                             request_count=400, sweep_num_workers=[1, 2, 4],
                             sweep_router=["round-robin", "kv"])
        print(table[["num_workers", "router", "p99_ttft_ms"]])
    """
    ...
