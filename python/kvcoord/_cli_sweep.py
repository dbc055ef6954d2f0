"""``kvcoord sweep``: every combination of the variant flags at several pool
sizes, replayed in this process or in ``--jobs`` worker processes (see
:mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
import multiprocessing
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvcoord._cli_base import (
    CliError,
    UsageError,
    _check_outputs,
    _describe,
    _sigint_ignored,
    _write_json,
    _write_output,
)
from kvcoord._cli_setup import _plan, _progress, _Setup, _setup, _sim_config

__all__ = ["_sweep"]


# --------------------------------------------------------------------------- sweep


@dataclass
class _Point:
    """One sweep point: a variant (model, host tier) at one pool size."""

    variant: str
    model: str | None
    host_memory: float | None
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
    from kvcoord.replay.report import summarize
    from kvcoord.replay.scheduler import simulate

    plan = _plan(args, st, model=point.model, host_memory=point.host_memory, **point.size)
    cfg = _sim_config(args, plan)
    res = simulate(st.workload, cfg)
    row = summarize(res, res.best, cfg, st.workload.name, plan)
    row["variant"] = point.variant
    return row


_WORKER_SETUP: _Setup | None = None


def _worker_init(st: _Setup) -> None:
    """A ``sweep --jobs`` worker: gets the parent's workload once; Ctrl-C is the parent's."""
    global _WORKER_SETUP
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_SETUP = st


def _worker_point(args: argparse.Namespace, point: _Point) -> dict[str, Any]:
    """`_sweep_point` in a worker; a failure comes back as one picklable line."""
    try:
        assert _WORKER_SETUP is not None, "worker started without its workload"
        return _sweep_point(args, point, _WORKER_SETUP)
    except Exception as e:
        raise CliError(f"{point.describe()}: {_describe(e)}") from None


def _stop_workers(ex: ProcessPoolExecutor) -> None:
    with _sigint_ignored():
        ex.shutdown(wait=False, cancel_futures=True)
        children = multiprocessing.active_children()
        for proc in children:
            proc.terminate()
        for proc in children:
            proc.join(5)


def _sweep_parallel(
    args: argparse.Namespace, st: _Setup, points: list[_Point], jobs: int, bar: Any
) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    # workers start with Ctrl-C ignored (inherited), so only this process reports it
    with _sigint_ignored():
        ex = ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=_worker_init, initargs=(st,)
        )
        futs: list[Future[dict[str, Any]]] = [ex.submit(_worker_point, args, p) for p in points]
    rows: list[dict[str, Any]] = []
    try:
        for f in futs:
            rows.append(f.result())
            bar.update(1)
    except BaseException:
        _stop_workers(ex)
        raise
    ex.shutdown()
    return rows


def _geometric(lo: float, hi: float, k: int) -> list[float]:
    if k == 1 or lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1 / (k - 1))
    return [lo * ratio**i for i in range(k)]


def _sweep_points(args: argparse.Namespace, st: _Setup) -> list[_Point]:
    """Every (model, host tier, size) combination the flags ask for, each checked."""
    from kvcoord.replay.plan import GiB, min_blocks

    points = []
    for model in args.models or [args.model]:
        base = _plan(args, st, model=model, host_memory=None, num_blocks=None,
                     capacity_tokens=None, kv_memory=None)  # fmt: skip
        for host in args.host_memories or [0.0]:
            name = base.model.name if args.layout is None else base.layout.name
            if host:
                name += f" + host {host / GiB:,.0f} GiB"
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
                pt = _Point(name, model, host or None, size)
                _plan(args, st, model=model, host_memory=pt.host_memory, **size)  # checks
                points.append(pt)
    return points


def _sweep(args: argparse.Namespace) -> int:
    from kvcoord.replay.plots import plot_sweep
    from kvcoord.replay.report import format_sweep

    _check_outputs(args)
    if (args.sizes or args.capacities or args.kv_memories) and (args.min_blocks or args.max_blocks):
        raise UsageError(
            "--min-blocks/--max-blocks make a range; do not combine with "
            "--sizes/--capacities/--kv-memories"
        )
    st = _setup(args)
    points = _sweep_points(args, st)
    jobs = min(args.jobs, len(points))
    rows: list[dict[str, Any]] = []
    with _progress(len(points), args.no_progress, "sweep") as bar:
        if jobs > 1:
            rows = _sweep_parallel(args, st, points, jobs, bar)
        else:
            for pt in points:
                rows.append(_sweep_point(args, pt, st))
                bar.update(1)
    print(f"{st.workload.name}: {len(points)} replays")
    print(format_sweep(rows))
    if args.json:
        _write_json(args.json, {"workload": st.workload.name, "rows": rows})
    if args.plot:
        _write_output(args.plot, lambda name: plot_sweep(rows, name))
    return 0
