"""A cluster in the planner: N independent engines behind a router.

Each engine is the single-engine replay of :mod:`.scheduler` (its own
``KVCacheManager``, scheduler loop and simulated clock, driven one step at a
time through :func:`~kvcoord.replay.scheduler.run_engine`). Requests are
taken in arrival order; before routing one that arrives at time ``t`` every
engine is stepped until its clock reaches ``t`` (or it runs out of work),
so the router decides on the state each engine would have at that moment.
The router (:mod:`.routers`) sees what a real one sees: what it sent where,
what has finished, and, for the prefix-aware router, each engine's KV
events (``KVCacheManager.take_events()``, drained before every decision).

:func:`summarize_cluster` reports the totals (the single-engine summary's
keys over all requests: hit rates, TTFT percentiles, throughput), each
engine's share, and the load imbalance.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import numpy as np

from kvcoord.replay.bestcase import BestCase, best_possible_hits
from kvcoord.replay.routers import Router, block_keys, make_router
from kvcoord.replay.scheduler import (
    REPLAY_HASH_ALGO,
    EngineFeed,
    SimConfig,
    SimResult,
    make_manager,
    run_engine,
)
from kvcoord.replay.workloads import Workload

__all__ = [
    "ClusterResult",
    "cluster_axis",
    "format_engines",
    "policy_axis",
    "prompt_priority",
    "simulate_cluster",
    "summarize_cluster",
]


@dataclass
class ClusterResult:
    """Raw accounting of a cluster replay."""

    router: str
    engines: list[SimResult]
    #: Engine of each request, in arrival order.
    assignment: np.ndarray
    #: All engines' accounting merged (per-request arrays in engine order).
    total: SimResult
    #: One unbounded cache shared by every engine (the routing-free best).
    best: BestCase | None = None
    #: Best possible hits of each engine alone on the requests it was sent.
    engine_best: list[BestCase | None] = field(default_factory=list)
    #: KV events the router applied (prefix-aware only).
    events_seen: int = 0
    #: Prompt tokens the router's index promised as cached (prefix-aware only).
    predicted_hit_tokens: int = 0
    #: The router, after the last engine's final events.
    router_state: Router | None = None
    #: The engines' managers (only with ``keep_managers``; for inspection).
    managers: list[Any] = field(default_factory=list)


def _merge(engines: list[SimResult], num_blocks: int) -> SimResult:
    """One SimResult over every engine: counters summed, per-request arrays
    and per-step manager times concatenated; the occupancy series are per
    engine (:func:`summarize_cluster` aggregates them) and left empty."""
    t = SimResult(num_blocks=num_blocks)
    for name in (
        "num_requests", "num_finished", "prompt_tokens", "hit_tokens", "output_tokens",
        "computed_tokens", "preemptions", "evictions", "steps", "busy_seconds",
        "manager_seconds", "token_seconds", "best_seconds",
        "request_seconds", "leaked_blocks", "host_hit_tokens", "host_transfer_seconds",
        "disk_hit_tokens", "disk_transfer_seconds", "saturated_seconds", "saturated_finished",
    ):  # fmt: skip
        setattr(t, name, sum(getattr(e, name) for e in engines))
    t.sim_seconds = max((e.sim_seconds for e in engines), default=0.0)
    for name in (
        "req_arrival", "req_offered", "req_admit", "req_first", "req_finish", "req_output",
        "req_prompt", "req_gpu_hit", "req_host_hit", "req_disk_hit", "step_manager_s",
        "step_later_tokens", "step_itl",
    ):  # fmt: skip
        arr = getattr(t, name)
        for e in engines:
            arr.extend(getattr(e, name))
    return t


def simulate_cluster(
    workload: Workload,
    cfg: SimConfig,
    instances: int,
    router: str | Router,
    progress: Callable[[int], None] | None = None,
    track_global_best: bool = True,
    keep_managers: bool = False,
    engine_results: Sequence[SimResult] | None = None,
) -> ClusterResult:
    """Replay ``workload`` on ``instances`` engines, each configured by ``cfg``
    (its pool is one engine's), behind ``router`` (a ``--router`` spec or a
    :class:`~kvcoord.replay.routers.Router`). ``engine_results``: one empty
    :class:`SimResult` per engine for the engines to fill in (a caller that
    watches the run; see :func:`~kvcoord.replay.scheduler.run_engine`)."""
    from kvcoord import Request

    if cfg.max_concurrency is not None:
        # the cap is the clients' (all engines together); each engine's loop
        # would apply it to its own requests only
        raise ValueError("a concurrency cap (max_concurrency) needs a single engine")
    wall0 = perf_counter()
    layout = cfg.layout
    max_model_len = cfg.max_model_len or workload.max_sequence_len
    rt = (
        router
        if isinstance(router, Router)
        else make_router(router, instances, block_size=layout.block_size)
    )
    if rt.num_engines != instances:
        raise ValueError(f"router built for {rt.num_engines} engines, cluster has {instances}")
    mgrs = [
        make_manager(
            layout,
            cfg.num_blocks,
            max_model_len,
            eviction_policy=cfg.eviction_policy,
            enable_events=rt.uses_events,
        )
        for _ in range(instances)
    ]
    feeds = [EngineFeed(deque(), closed=False, finished=[]) for _ in range(instances)]
    if engine_results is not None and len(engine_results) != instances:
        raise ValueError(f"{len(engine_results)} results given for {instances} engines")
    fill = list(engine_results) if engine_results is not None else [None] * instances
    runs = [
        run_engine(workload, cfg, progress, m, f, r)
        for m, f, r in zip(mgrs, feeds, fill, strict=True)
    ]
    state: list[float | None] = [None] * instances  # last yield: clock, or None when idle
    results: list[SimResult | None] = [None] * instances
    hash_bs = mgrs[0].hash_block_size

    def advance(k: int, t: float) -> None:
        """Step engine ``k`` until its clock reaches ``t`` or it has nothing to do."""
        feed = feeds[k]
        while results[k] is None:
            st = state[k]
            if st is None and not feed.pending and not feed.closed:
                return  # idle, waiting for the router
            if st is not None and st >= t:
                return
            try:
                state[k] = next(runs[k])
            except StopIteration as stop:
                results[k] = stop.value

    def settle(k: int) -> None:
        done = feeds[k].finished
        assert done is not None
        for wr in done:
            rt.finished(k, wr)
        done.clear()

    scale = cfg.time_scale
    assignment = np.zeros(len(workload.requests), dtype=np.int64)
    for i, wr in enumerate(workload.requests):
        t = wr.arrival_s * scale
        for k in range(instances):
            advance(k, t)
            settle(k)
            if rt.uses_events:
                rt.observe_manager(k, mgrs[k])
        hashes: list[int] | None = None
        if rt.uses_events:
            req = Request(
                wr.request_id,
                wr.make_prompt(),
                hash_block_size=hash_bs,
                hash_algo=REPLAY_HASH_ALGO,
                cache_salt=wr.cache_salt,
            )
            hashes = block_keys(req)
        k = rt.route(wr, hashes)
        if not 0 <= k < instances:
            raise ValueError(f"router {rt.describe()} picked engine {k} of {instances}")
        assignment[i] = k
        rt.routed(k, wr)
        feeds[k].pending.append(wr)
        if state[k] is None:  # wake an idle engine at the arrival
            state[k] = -math.inf
    for k in range(instances):
        feeds[k].closed = True
    for k in range(instances):
        advance(k, math.inf)
        settle(k)
        if rt.uses_events:
            rt.observe_manager(k, mgrs[k])
    engines = [r for r in results if r is not None]
    assert len(engines) == instances
    best = best_possible_hits(workload, layout.block_size) if track_global_best else None
    total = _merge(engines, cfg.num_blocks * instances)
    total.wall_seconds = perf_counter() - wall0  # the engines' own spans overlap
    predicted = int(getattr(rt, "predicted_hit_tokens", 0))
    index = getattr(rt, "index", None)
    return ClusterResult(
        router=rt.describe(),
        engines=engines,
        assignment=assignment,
        total=total,
        best=best,
        engine_best=[e.best for e in engines],
        events_seen=int(index.events_seen) if index is not None else 0,
        predicted_hit_tokens=predicted,
        router_state=rt,
        managers=mgrs if keep_managers else [],
    )


def _imbalance(x: list[float]) -> float:
    """max / mean (1.0: perfectly even; N: everything on one of N engines)."""
    mean = sum(x) / len(x) if x else 0.0
    return max(x) / mean if mean > 0 else 1.0


def summarize_cluster(
    cres: ClusterResult,
    cfg: SimConfig,
    workload_name: str,
    plan: Any = None,
) -> dict[str, Any]:
    """The cluster's numbers as a JSON-ready dict: the single-engine summary's
    keys over all requests (pool sizes are per engine), plus ``instances``,
    ``router``, ``eviction_policy``, the load imbalance and an ``engines``
    list with each engine's share (docs/cluster.md)."""
    from kvcoord.replay.report import latency_metrics, occupancy_metrics, summarize

    s = summarize(cres.total, cres.best, cfg, workload_name, plan, instances=len(cres.engines))
    # occupancy: each engine's own series; peaks the highest, means the average
    occ = [occupancy_metrics(e) for e in cres.engines]
    for key in occ[0]:
        vals = [o[key] for o in occ if key in o]
        if key.endswith("_peak") or key == "peak_usage":
            s[key] = max(vals)
        elif key.endswith("_min"):
            s[key] = min(vals)
        elif key != "occupancy_samples":
            s[key] = sum(vals) / len(vals)
    n = len(cres.engines)
    engines = []
    for k, e in enumerate(cres.engines):
        lat = latency_metrics(e)
        eb = cres.engine_best[k] if k < len(cres.engine_best) else None
        engines.append(
            {
                "engine": k,
                "num_requests": e.num_requests,
                "prompt_tokens": e.prompt_tokens,
                "prefix_hit_tokens": e.hit_tokens,
                "prefix_hit_rate": e.hit_tokens / e.prompt_tokens if e.prompt_tokens else 0.0,
                "best_possible_hit_rate": eb.hit_rate if eb is not None else None,
                "computed_tokens": e.computed_tokens,
                "busy_seconds": e.busy_seconds,
                "evictions": e.evictions,
                "preemptions": e.preemptions,
                "ttft_p50_s": lat["ttft_p50_s"],
                "ttft_p90_s": lat["ttft_p90_s"],
            }
        )
    work = [float(e["computed_tokens"]) for e in engines]
    s.update(
        {
            "instances": n,
            "router": cres.router,
            "eviction_policy": cfg.eviction_policy,
            "num_blocks_per_engine": cfg.num_blocks,
            "load_imbalance_requests": _imbalance([float(e["num_requests"]) for e in engines]),
            "load_imbalance_computed_tokens": _imbalance(work),
            "load_imbalance_busy_seconds": _imbalance([float(e["busy_seconds"]) for e in engines]),
            "router_events_seen": cres.events_seen,
            "router_predicted_hit_tokens": cres.predicted_hit_tokens,
            "engines": engines,
        }
    )
    s["num_blocks"] = cfg.num_blocks
    return s


def format_engines(summary: dict[str, Any]) -> str:
    """The per-engine table of a cluster summary."""
    rows = [
        f"{'engine':>6} {'requests':>9} {'hit rate':>9} {'best':>7} {'computed tok':>13} "
        f"{'busy s':>9} {'TTFT p90':>10}"
    ]
    for e in summary["engines"]:
        best = e["best_possible_hit_rate"]
        p90 = e["ttft_p90_s"]
        rows.append(
            f"{e['engine']:>6} {e['num_requests']:>9,} {100 * e['prefix_hit_rate']:>8.1f}% "
            f"{'n/a' if best is None else f'{100 * best:.1f}%':>7} {e['computed_tokens']:>13,} "
            f"{e['busy_seconds']:>9.1f} {'n/a' if p90 is None else f'{p90:.3f} s':>10}"
        )
    rows.append(
        f"router {summary['router']}, {summary['instances']} engines, eviction "
        f"{summary['eviction_policy']}: load imbalance (max/mean) requests "
        f"{summary['load_imbalance_requests']:.2f}, computed tokens "
        f"{summary['load_imbalance_computed_tokens']:.2f}, busy time "
        f"{summary['load_imbalance_busy_seconds']:.2f}"
    )
    return "\n".join(rows)


# --------------------------------------------------------------------------- sweep axes

#: Under the ``priority`` policy the replay marks the prompt blocks of a
#: finished request that was served a prefix hit with this priority before
#: freeing them (its generated tokens stay ordinary): a conversation or
#: template that has been reused once is kept for the retention window.
PROMPT_PRIORITY = 1


def prompt_priority(policy: str) -> int:
    """``SimConfig.prompt_priority`` for an eviction policy spec."""
    return PROMPT_PRIORITY if policy.split(":")[0].strip() == "priority" else 0


def policy_axis(policies: Sequence[str], label: bool = True) -> Any:
    """Eviction policies (``SimConfig.eviction_policy``; under ``priority`` the
    replay marks finished prompts, ``SimConfig.prompt_priority``); unlabelled
    when ``label`` is false (the default policy, not compared)."""
    from kvcoord.replay.sweep import Axis, AxisValue

    def value(p: str) -> AxisValue:
        run = {"eviction_policy": p, "prompt_priority": prompt_priority(p)}
        return AxisValue(p if label else "", run=run)

    return Axis("policy", tuple(value(p) for p in policies))


def cluster_axis(instances: Sequence[int], routers: Sequence[str]) -> Any:
    """Engine counts, each above 1 with every router (``N x ROUTER``; one
    engine is unlabelled and has no router)."""
    from kvcoord.replay.sweep import Axis, AxisValue

    values = []
    for n in instances:
        if n == 1:
            values.append(AxisValue("", run={"instances": 1, "router": None}))
        else:
            values.extend(
                AxisValue(f"{n}x {r}", run={"instances": n, "router": r}) for r in routers
            )
    return Axis("cluster", tuple(values))
