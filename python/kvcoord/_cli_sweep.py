"""``kvcoord sweep``: every combination of the variant flags at several pool
sizes, replayed in this process or in ``--jobs`` worker processes (see
:mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

from kvcoord._cli_base import (
    CliError,
    UsageError,
    _check_outputs,
    _describe,
    _usage_errors,
    _write_json,
    _write_output,
)
from kvcoord._cli_setup import SIZE_OPTIONS, _plan, _progress, _Setup, _setup, _sim_config

__all__ = ["_sweep"]


# --------------------------------------------------------------------------- sweep


@dataclass
class _Point:
    """One sweep point: a variant (see :mod:`kvcoord.replay.sweep`) at one pool size."""

    variant: str
    labels: dict[str, str]
    plan: dict[str, Any]
    run: dict[str, Any]
    size: dict[str, Any]

    def describe(self) -> str:
        from kvcoord.replay.plan import format_bytes

        k, v = next(iter(self.size.items()))
        if k == "num_blocks":
            what = f"pool of {v:,} blocks"
        elif k == "capacity_tokens":
            what = f"pool of {v:,} tokens per group"
        else:
            what = f"{format_bytes(v)} of KV per GPU"
        return f"{self.variant}, {what}"


def _sweep_point(args: argparse.Namespace, point: _Point, st: _Setup) -> dict[str, Any]:
    """One sweep point -> its summary row (the variant's own best case included)."""
    from kvcoord.replay import scheduler
    from kvcoord.replay.report import summarize

    plan = _plan(args, st, _sweep_flags(args), point.variant, **point.plan, **point.size)
    run = dict(point.run)
    instances, router = run.pop("instances", 1), run.pop("router", None)
    cfg = _sim_config(args, plan, run.pop("eviction_policy", None))
    if run:
        cfg = replace(cfg, **run)
    if instances > 1:
        from kvcoord.replay.cluster import simulate_cluster, summarize_cluster

        cres = simulate_cluster(st.workload, cfg, instances, router or "round-robin")
        row = summarize_cluster(cres, cfg, st.workload.name, plan)
    else:
        res = scheduler.simulate(st.workload, cfg)
        row = summarize(res, res.best, cfg, st.workload.name, plan)
        row.update(instances=1, router=None, eviction_policy=cfg.eviction_policy)
    row.update(plan.memory_keys())
    row["variant"] = point.variant
    row["axes"] = dict(point.labels)
    return row


def _worker_point(shared: tuple[argparse.Namespace, _Setup], point: _Point) -> dict[str, Any]:
    """`_sweep_point` on an executor's worker; a failure comes back as one picklable line."""
    args, st = shared
    try:
        return _sweep_point(args, point, st)
    except Exception as e:
        raise CliError(f"{point.describe()}: {_describe(e)}") from None


def _run_points(
    args: argparse.Namespace, st: _Setup, points: list[_Point], bar: Any
) -> list[dict[str, Any]]:
    """Every point, on the executor the flags ask for (in this process when
    ``--executor local --jobs 1`` or a single point)."""
    from kvcoord.replay.executor import ExecutorUnavailable, make_executor

    try:
        ex = make_executor(args.executor, jobs=args.jobs, address=args.address)
    except (ValueError, ExecutorUnavailable) as e:
        raise UsageError(str(e)) from None
    if args.executor == "local" and min(args.jobs, len(points)) <= 1:
        rows = []
        for pt in points:
            rows.append(_sweep_point(args, pt, st))
            bar.update(1)
        return rows
    try:
        return ex.map(_worker_point, (args, st), points, done=lambda _row: bar.update(1))
    except ExecutorUnavailable as e:
        raise CliError(str(e)) from None


def _geometric(lo: float, hi: float, k: int) -> list[float]:
    if k == 1 or lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1 / (k - 1))
    return [lo * ratio**i for i in range(k)]


def _axes(args: argparse.Namespace, st: _Setup) -> list[Any]:
    """The variant axes the flags ask for (kvcoord.replay.sweep)."""
    from kvcoord.replay.cluster import cluster_axis, policy_axis
    from kvcoord.replay.sweep import disk_axis, host_axis, layout_axis, model_axis

    flags = _sweep_flags(args)
    nosize = dict.fromkeys(SIZE_OPTIONS)
    default = _plan(args, st, flags, model=None, **nosize)
    for one, many in (("model", "models"), ("layout", "layouts")):
        if getattr(args, one) is not None and getattr(args, many):
            raise UsageError(f"--{one} and --{many}: give one (--{many} replaces --{one})")
    if args.routers and not any(n > 1 for n in args.instances or [1]):
        raise UsageError("--routers needs --instances with a count above 1")
    return [
        model_axis(args.models or [args.model], default.model.name),
        layout_axis(args.layouts or [args.layout]),
        host_axis(args.host_memories or [0.0]),
        disk_axis(args.disk_memories or [0.0]),
        policy_axis(args.policies or ["lru"], label=bool(args.policies)),
        cluster_axis(args.instances or [1], args.routers or ["round-robin"]),
    ]


def _sweep_points(args: argparse.Namespace, st: _Setup) -> list[_Point]:
    """Every (variant, size) combination the flags ask for, each checked."""
    from kvcoord.replay.plan import min_blocks
    from kvcoord.replay.sweep import SweepError, variants

    try:
        vs = variants(_axes(args, st))
    except SweepError as e:
        raise UsageError(str(e)) from None
    points = []
    flags = _sweep_flags(args)
    nosize = dict.fromkeys(SIZE_OPTIONS)
    for v in vs:
        base = _plan(args, st, flags, v.name, **{**v.plan, **nosize})
        sizes: list[dict[str, Any]]
        if args.kv_memories:
            sizes = [{"kv_memory": m} for m in args.kv_memories]
        elif args.sizes:
            sizes = [{"num_blocks": n} for n in args.sizes]
        elif args.capacities:
            sizes = [{"capacity_tokens": c} for c in args.capacities]
        else:
            fp = base.footprint
            need = fp.memory_for_blocks(2 * min_blocks(base.layout, st.workload))
            hi = fp.memory_for_blocks(args.max_blocks or base.num_blocks)
            lo = fp.memory_for_blocks(args.min_blocks) if args.min_blocks else need
            if not args.min_blocks:  # the default range: never above its top
                lo = min(max(lo, hi / 64), hi)
            if lo > hi:
                raise UsageError(
                    f"--min-blocks {fp.blocks_for_memory(lo)} is larger than "
                    f"--max-blocks {fp.blocks_for_memory(hi)}"
                )
            sizes = [{"kv_memory": m} for m in _geometric(lo, hi, args.points)]
        for size in sizes:
            _plan(args, st, flags, v.name, **v.plan, **size)  # checks
            points.append(_Point(v.name, dict(v.labels), dict(v.plan), dict(v.run), size))
    return points


def _sweep_flags(args: argparse.Namespace) -> dict[str, str]:
    """The flag of each make_plan keyword a sweep sets through its own flags
    (its axes and pool sizes), so an error names what the user typed."""
    if args.kv_memories:
        size = "--kv-memories"
    elif args.sizes:
        size = "--sizes"
    elif args.capacities:
        size = "--capacities"
    else:
        size = "--min-blocks/--max-blocks" if args.min_blocks or args.max_blocks else "the range"
    flags = dict.fromkeys(SIZE_OPTIONS, size)
    flags["host_memory"] = "--host-memories"
    flags["disk_memory"] = "--disk-memories"
    if args.models:
        flags["model"] = "--models"
    if args.layouts:
        flags["layout"] = "--layouts"
    return flags


def _sweep(args: argparse.Namespace) -> int:
    from kvcoord.replay.plots import plot_sweep
    from kvcoord.replay.report import format_sweep
    from kvcoord.replay.sizing import sweep_sentences

    _check_outputs(args)
    if (args.sizes or args.capacities or args.kv_memories) and (args.min_blocks or args.max_blocks):
        raise UsageError(
            "--min-blocks/--max-blocks make a range; do not combine with "
            "--sizes/--capacities/--kv-memories"
        )
    if args.address is not None and args.executor != "ray":
        raise UsageError("--address is for --executor ray")
    with _usage_errors():  # everything before the runs checks the flags
        st = _setup(args)
        points = _sweep_points(args, st)
    with _progress(len(points), args.no_progress, "sweep") as bar:
        rows = _run_points(args, st, points, bar)
    print(f"{st.workload.name}: {len(points)} replays")
    print(format_sweep(rows))
    print("\n".join(sweep_sentences(rows)))
    if args.json:
        _write_json(args.json, {"workload": st.workload.name, "rows": rows})
    if args.plot:
        _write_output(args.plot, lambda name: plot_sweep(rows, name))
    return 0
