"""The ``kvcoord`` command: ``kvcoord replay`` (the default) and ``kvcoord sweep``.

``kvcoord`` with no arguments replays the bundled synthetic chat workload
with the default model and GPU (Llama-3.1-8B on one H100) and prints a
summary; the planner's set-up (model, GPU, pool size, tiers) is resolved by
:mod:`kvcoord.replay.plan`.

Every failure is one line on stderr, ``kvcoord <command>: error: ...``, and
an exit status: 2 for a bad flag, layout or trace (all checked before the
replay starts, output paths included), 1 for a failure while running
(``KVCOORD_TRACEBACK=1`` shows the traceback), 130 for Ctrl-C. ``--json`` and
``--plot`` files are written whole or not at all (a temporary file renamed
into place).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from kvcoord._cli_base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    MAX_POOL_BLOCKS,
    CliError,
    UsageError,
    _block_list,
    _bounded,
    _check_outputs,
    _describe,
    _int_list,
    _nonneg_float,
    _one_line,
    _Parser,
    _pool_blocks,
    _pos_int,
    _say,
    _shown,
    _sigint_ignored,
    _write_json,
    _write_output,
)
from kvcoord.replay.workloads import MAX_REQUEST_TOKENS

__all__ = ["main"]


def _bytes(text: str) -> float:
    """An argparse type: a size like ``40GiB`` (bytes)."""
    from kvcoord.replay.plan import parse_bytes

    try:
        v = parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v > 1 << 60:
        raise argparse.ArgumentTypeError(f"expected at most 1 EiB, got {_shown(text)}")
    return v


def _bytes_list(text: str) -> list[float]:
    out = [0.0 if p.strip() == "0" else _bytes(p) for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of sizes")
    return out


def _str_list(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return out


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--trace", metavar="FILE", help="trace file (default: the bundled synthetic chat workload)"
    )
    g.add_argument(
        "--format",
        choices=("mooncake", "tokens"),
        help="trace format (default: guessed from the first line)",
    )
    g.add_argument("--limit", type=_pos_int, metavar="N", help="replay only the first N requests")
    g.add_argument(
        "--time-scale",
        type=_nonneg_float,
        default=1.0,
        metavar="F",
        help="multiply every arrival time by F: 2 spreads the trace over twice the time "
        "(half the request rate), 0.5 doubles the rate, 0 makes every request arrive at "
        "once (a throughput test); TTFT and queueing delay are measured from the scaled "
        "arrival (default 1: the trace's own timing)",
    )
    from kvcoord.replay.hardware import GPUS
    from kvcoord.replay.models import MODELS

    g = p.add_argument_group("model and hardware (the KV bytes and the step-time model)")
    g.add_argument(
        "--model", metavar="NAME", help=f"model preset: {', '.join(MODELS)} (default llama-3.1-8b)"
    )
    g.add_argument(
        "--model-config", metavar="config.json", help="read the model from a Hugging Face config"
    )
    g.add_argument(
        "--kv-dtype",
        metavar="DTYPE",
        help="KV-cache dtype: bf16, fp16, fp8, fp32 (default: the model's)",
    )
    g.add_argument("--gpu", metavar="NAME", help=f"GPU preset: {', '.join(GPUS)} (default h100)")
    g.add_argument(
        "--tp", type=_bounded(1024), default=1, metavar="N", help="tensor-parallel GPUs (1)"
    )
    g = p.add_argument_group("cache layout and scheduler")
    g.add_argument(
        "--layout",
        metavar="NAME|FILE",
        help="replace the model's cache layout with a preset (full, sliding-window, "
        "chunked-local, mamba, hybrid-mamba, hybrid-mamba2, mla, hybrid-swa-mla, rswa, "
        "no-prefix-cache) or a .json/.toml layout file; the "
        "model's attention layers are split evenly among its groups",
    )
    g.add_argument(
        "--block-size",
        type=_bounded(MAX_REQUEST_TOKENS),
        metavar="B",
        help="block size of every group",
    )
    g.add_argument(
        "--max-running",
        type=_bounded(1 << 24),
        default=256,
        metavar="N",
        help="cap on running requests (256)",
    )
    g.add_argument(
        "--token-budget",
        type=_bounded(1 << 31),
        default=8192,
        metavar="N",
        help="tokens scheduled per step (8192)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kvcoord",
        description="KV-cache workload simulator: replay a trace against kvcoord's KVCacheManager.",
    )
    sub = p.add_subparsers(dest="command", metavar="{replay,sweep}")
    r = sub.add_parser("replay", help="replay one workload at one pool size (the default command)")
    _add_workload_args(r)
    g = r.add_argument_group(
        "pool size (one of; default: what vLLM leaves for KV on --gpu/--tp after the weights)"
    )
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--kv-memory", type=_bytes, metavar="SIZE", help="KV-cache memory per GPU, e.g. 40GiB"
    )
    m.add_argument(
        "--num-blocks",
        type=_pool_blocks,
        metavar="N",
        help="pool size in blocks (null block included)",
    )
    m.add_argument(
        "--capacity-tokens",
        type=_pos_int,
        metavar="T",
        help="pool size as tokens of context per group",
    )
    r.add_argument_group("host-memory tier").add_argument(
        "--host-memory",
        type=_bytes,
        metavar="SIZE",
        help="KV offload tier in host memory per replica, e.g. 256GiB (LRU; hits load over PCIe)",
    )
    g = r.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the summary as JSON")
    g.add_argument(
        "--plot",
        metavar="FILE.png",
        help="PNG of pool occupancy, hit rate and TTFT over simulated time",
    )

    s = sub.add_parser(
        "sweep", help="replay one workload at several pool sizes x models x host tiers"
    )
    _add_workload_args(s)
    g = s.add_argument_group("variants (every combination is replayed)")
    g.add_argument(
        "--models", type=_str_list, metavar="A,B,...", help="models to compare (default: --model)"
    )
    g.add_argument(
        "--host-memories",
        type=_bytes_list,
        metavar="S,S,...",
        help="host tiers to compare, e.g. 0,256GiB (default: none)",
    )
    g = s.add_argument_group("pool sizes (default: a geometric range of KV memory)")
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--kv-memories",
        type=_bytes_list,
        metavar="S,S,...",
        help="KV memory per GPU, e.g. 16GiB,32GiB",
    )
    m.add_argument("--sizes", type=_block_list, metavar="N,N,...", help="pool sizes in blocks")
    m.add_argument("--capacities", type=_int_list, metavar="T,T,...", help="pool sizes in tokens")
    g.add_argument(
        "--min-blocks", type=_pool_blocks, metavar="N", help="smallest pool of the range"
    )
    g.add_argument("--max-blocks", type=_pool_blocks, metavar="N", help="largest pool of the range")
    g.add_argument(
        "--points", type=_bounded(1000), default=6, metavar="K", help="pool sizes in the range (6)"
    )
    g.add_argument(
        "--jobs",
        type=_bounded(256),
        default=min(256, os.cpu_count() or 1),
        metavar="N",
        help="parallel processes (default: the number of CPUs)",
    )
    g = s.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    g.add_argument(
        "--plot",
        metavar="FILE.png",
        help="PNG of hit rate, TTFT p90 and throughput against KV memory, one line per variant",
    )
    return p


# --------------------------------------------------------------------------- validation


@dataclass
class _Setup:
    workload: Any
    layout: Any


def _setup(args: argparse.Namespace) -> _Setup:
    from kvcoord.replay.layouts import LayoutError, load_layout
    from kvcoord.replay.workloads import load_workload

    if args.format is not None and args.trace is None:
        raise UsageError("--format needs --trace FILE (the bundled workload has no format)")
    try:
        layout = load_layout(args.layout or "full")
        if args.block_size is not None:
            layout = layout.with_block_size(args.block_size)
    except LayoutError as e:
        raise UsageError(f"--layout: {e}") from None
    try:
        workload = load_workload(args.trace, args.format, args.limit)
    except ValueError as e:  # TraceFormatError names the file and line
        raise UsageError(f"--trace: {e}") from None
    if not workload.requests:
        raise UsageError(f"--trace {args.trace}: the trace has no requests")
    from kvcoord.replay.scheduler import make_manager

    try:  # what the manager itself refuses (sizes beyond its range), before any run
        make_manager(layout, 2, workload.max_sequence_len)
    except (ValueError, TypeError, OverflowError) as e:
        raise UsageError(f"--layout {args.layout or 'full'}: {e}") from None
    last = workload.requests[-1].arrival_s  # sorted by arrival
    if not math.isfinite(last * args.time_scale):
        raise UsageError(
            f"--time-scale {args.time_scale:g}: the last arrival ({last:g} s) "
            "scaled is beyond any finite time"
        )
    return _Setup(workload, layout)


def _plan(args: argparse.Namespace, st: _Setup, **size: Any) -> Any:
    """The planner's set-up (model, GPU, layout, pool size, host tier) from the flags."""
    from kvcoord.replay.plan import make_plan

    opts: dict[str, Any] = {
        "num_blocks": getattr(args, "num_blocks", None),
        "capacity_tokens": getattr(args, "capacity_tokens", None),
        "kv_memory": getattr(args, "kv_memory", None),
        "host_memory": getattr(args, "host_memory", None),
        "model": args.model,
    }
    opts.update(size)
    try:
        plan = make_plan(
            st.workload,
            model_config=args.model_config,
            kv_dtype=args.kv_dtype,
            gpu=args.gpu,
            tp=args.tp,
            layout=args.layout,
            block_size=args.block_size,
            **opts,
        )
    except ValueError as e:  # PlanError names the flag
        raise UsageError(str(e)) from None
    _check_pool(plan.layout, st.workload, plan.num_blocks, plan.size_flag)
    return plan


def _sim_config(args: argparse.Namespace, plan: Any) -> Any:
    from kvcoord.replay.scheduler import SimConfig

    return SimConfig(
        layout=plan.layout,
        num_blocks=plan.num_blocks,
        max_running=args.max_running,
        token_budget=args.token_budget,
        time_scale=args.time_scale,
        step_model=plan.step_model,
        host_tier=plan.host_tier(),
        token_bytes_per_gpu=plan.footprint.token_bytes_per_gpu,
    )


def _check_pool(layout: Any, workload: Any, num_blocks: int, flag: str) -> None:
    if num_blocks < 2:
        raise UsageError(f"{flag}: a pool needs at least 2 blocks (block 0 is the null block)")
    if num_blocks > MAX_POOL_BLOCKS:
        raise UsageError(
            f"{flag}: a pool of {num_blocks:,} blocks is larger than the "
            f"{MAX_POOL_BLOCKS:,} the CLI builds"
        )
    from kvcoord.replay.scheduler import build_config

    del workload  # the planner already checked the longest request
    try:  # the manager's own checks, before the run rather than in it
        build_config(layout, num_blocks)
    except (ValueError, TypeError, OverflowError) as e:
        raise UsageError(f"{flag}: {e}") from None


# --------------------------------------------------------------------------- replay


def _progress(total: int, disable: bool, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="req", disable=disable or None, leave=False, file=sys.stderr
    )


def _replay(args: argparse.Namespace) -> int:
    from kvcoord.replay.plots import plot_replay
    from kvcoord.replay.report import format_summary, summarize
    from kvcoord.replay.scheduler import simulate

    _check_outputs(args)
    st = _setup(args)
    plan = _plan(args, st)
    cfg = _sim_config(args, plan)
    with _progress(len(st.workload.requests), args.no_progress, "replay") as bar:
        res = simulate(st.workload, cfg, progress=bar.update)
    summary = summarize(res, res.best, cfg, st.workload.name, plan)
    print(format_summary(summary))
    if args.json:
        _write_json(args.json, summary)
    if args.plot:
        _write_output(args.plot, lambda name: plot_replay(res, summary, name))
    return 0


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvcoord`` console script; returns the exit status.

    The one place failures become a line on stderr: usage errors exit 2
    (``SystemExit``), failures while running 1, Ctrl-C 130.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["replay", *argv]  # `kvcoord [flags]` is `kvcoord replay [flags]`
    prog = "kvcoord"
    try:
        parser = _parser()
        args, extra = parser.parse_known_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        prog = f"kvcoord {args.command}"
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
        if args.command == "replay":
            return _replay(args)
        return _sweep(args)
    except UsageError as e:
        parser.exit(EXIT_USAGE, f"{prog}: error: {_one_line(str(e))}\n")
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # pragma: no cover - `kvcoord | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as e:
        if os.environ.get("KVCOORD_TRACEBACK"):
            raise
        _say(f"{prog}: error: {_describe(e)}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
