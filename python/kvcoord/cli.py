"""The ``kvcoord`` command: ``kvcoord replay`` (the default) and ``kvcoord sweep``.

``kvcoord`` with no arguments replays the bundled synthetic chat workload
on a single full-attention layout and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["main"]


class UsageError(Exception):
    """A flag combination or value the CLI rejects (exit status 2)."""


def _pos_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return v


def _bytes(text: str) -> float:
    from kvcoord.replay.plan import parse_bytes

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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


def _int_list(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            out.append(_pos_int(part))
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of positive integers")
    return sorted(set(out))


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
        "--model",
        metavar="NAME",
        help=f"model preset: {', '.join(MODELS)} (default llama-3.1-8b)",
    )
    g.add_argument(
        "--model-config", metavar="config.json", help="read the model from a Hugging Face config"
    )
    g.add_argument(
        "--kv-dtype",
        metavar="DTYPE",
        help="KV-cache dtype: bf16, fp16, fp8, fp32 (default: model's)",
    )
    g.add_argument("--gpu", metavar="NAME", help=f"GPU preset: {', '.join(GPUS)} (default h100)")
    g.add_argument("--tp", type=_pos_int, default=1, metavar="N", help="tensor-parallel GPUs (1)")
    g = p.add_argument_group("cache layout and scheduler")
    g.add_argument(
        "--layout",
        metavar="NAME|FILE",
        help="override the model's cache layout with a preset (full, sliding-window, "
        "chunked-local, mamba, no-prefix-cache) or a .json/.toml layout file; the "
        "model's attention layers are split evenly among its groups",
    )
    g.add_argument("--block-size", type=_pos_int, metavar="B", help="block size of every group")
    g.add_argument(
        "--max-running",
        type=_pos_int,
        default=256,
        metavar="N",
        help="cap on running requests (256)",
    )
    g.add_argument(
        "--token-budget",
        type=_pos_int,
        default=8192,
        metavar="N",
        help="tokens scheduled per step (8192)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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
        "--num-blocks", type=_pos_int, metavar="N", help="pool size in blocks (null block included)"
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
    g.add_argument("--plot", metavar="FILE.png", help="PNG of pool usage and hit rate over time")

    s = sub.add_parser("sweep", help="replay one workload at several pool sizes")
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
        help="KV memory per GPU, e.g. 8GiB,16GiB",
    )
    m.add_argument("--sizes", type=_int_list, metavar="N,N,...", help="pool sizes in blocks")
    m.add_argument("--capacities", type=_int_list, metavar="T,T,...", help="pool sizes in tokens")
    g.add_argument("--min-blocks", type=_pos_int, metavar="N", help="smallest pool of the range")
    g.add_argument("--max-blocks", type=_pos_int, metavar="N", help="largest pool of the range")
    g.add_argument(
        "--points", type=_pos_int, default=6, metavar="K", help="pool sizes in the range (6)"
    )
    g.add_argument(
        "--jobs",
        type=_pos_int,
        default=os.cpu_count() or 1,
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


# --------------------------------------------------------------------------- validation helpers


def _check_output(path: str | None, flag: str, png: bool = False) -> None:
    if path is None:
        return
    if png and not path.lower().endswith(".png"):
        raise UsageError(f"{flag} {path!r}: the plot is a PNG, the file name must end in .png")
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path!r}: directory {str(parent)!r} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"{flag} {path!r} is a directory")
    if png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError(f"{flag} needs matplotlib: pip install 'kvcoord[plot]'") from None


@dataclass
class _Setup:
    workload: Any
    layout: Any


def _setup(args: argparse.Namespace) -> _Setup:
    from kvcoord.replay.layouts import LayoutError, load_layout
    from kvcoord.replay.workloads import TraceFormatError, load_workload

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
    except TraceFormatError as e:
        raise UsageError(f"--trace: {e}") from None
    if not workload.requests:
        raise UsageError(f"--trace {args.trace}: the trace has no requests")
    return _Setup(workload, layout)


def _plan(args: argparse.Namespace, st: _Setup, **size: Any) -> Any:
    """The planner's set-up (model, GPU, layout, pool size, host tier) from the flags."""
    from kvcoord.replay.plan import PlanError, make_plan

    opts: dict[str, Any] = {
        "num_blocks": getattr(args, "num_blocks", None),
        "capacity_tokens": getattr(args, "capacity_tokens", None),
        "kv_memory": getattr(args, "kv_memory", None),
        "host_memory": getattr(args, "host_memory", None),
        "model": args.model,
    }
    opts.update(size)
    try:
        return make_plan(
            st.workload,
            model_config=args.model_config,
            kv_dtype=args.kv_dtype,
            gpu=args.gpu,
            tp=args.tp,
            layout=args.layout,
            block_size=args.block_size,
            **opts,
        )
    except (PlanError, ValueError) as e:
        raise UsageError(str(e)) from None


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


# --------------------------------------------------------------------------- replay


def _progress(total: int, disable: bool, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="req", disable=disable or None, leave=False, file=sys.stderr
    )


def _replay(args: argparse.Namespace) -> int:
    from kvcoord.replay.plots import plot_replay
    from kvcoord.replay.report import format_summary, summarize
    from kvcoord.replay.scheduler import SimulationError, simulate

    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", png=True)
    st = _setup(args)
    plan = _plan(args, st)
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    cfg = _sim_config(args, plan)
    bar = _progress(len(st.workload.requests), args.no_progress, "replay")
    try:
        res = simulate(st.workload, cfg, progress=bar.update)
    except SimulationError as e:
        print(f"kvcoord replay: error: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    summary = summarize(res, res.best, cfg, st.workload.name, plan)
    print(format_summary(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot_replay(res, summary, args.plot)
    return 0


# --------------------------------------------------------------------------- sweep


@dataclass
class _Point:
    """One sweep point: a variant (model, host tier) at one pool size."""

    variant: str
    model: str | None
    host_memory: float | None
    size: dict[str, Any]


def _sweep_point(
    args: argparse.Namespace, point: _Point, st: _Setup | None = None
) -> dict[str, Any]:
    """One sweep point -> its summary row; in a worker process when ``--jobs`` > 1
    (``st`` None: the worker loads the workload itself)."""
    from kvcoord.replay.report import summarize
    from kvcoord.replay.scheduler import simulate

    if st is None:
        st = _setup(args)
    plan = _plan(args, st, model=point.model, host_memory=point.host_memory, **point.size)
    cfg = _sim_config(args, plan)
    res = simulate(st.workload, cfg)
    row = summarize(res, res.best, cfg, st.workload.name, plan)
    row["variant"] = point.variant
    return row


def _geometric(lo: float, hi: float, k: int) -> list[float]:
    if k == 1 or lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1 / (k - 1))
    return [lo * ratio**i for i in range(k)]


def _sweep_points(args: argparse.Namespace, st: _Setup) -> list[_Point]:
    from kvcoord.replay.plan import GiB, min_blocks

    models = args.models or [args.model]
    hosts = args.host_memories or [0.0]
    points = []
    for model in models:
        base = _plan(args, st, model=model, host_memory=None)
        for host in hosts:
            name = base.model.name if args.layout is None else base.layout.name
            if host:
                name += f" + host {host / GiB:,.0f} GiB"
            if args.kv_memories:
                sizes = [{"kv_memory": m} for m in args.kv_memories]
            elif args.sizes:
                sizes = [{"num_blocks": n} for n in args.sizes]
            elif args.capacities:
                sizes = [{"capacity_tokens": c} for c in args.capacities]
            else:
                fp = base.footprint
                need = fp.memory_for_blocks(2 * min_blocks(base.layout, st.workload))
                hi = (
                    fp.memory_for_blocks(args.max_blocks)
                    if args.max_blocks
                    else base.kv_bytes_per_gpu
                )
                lo = (
                    fp.memory_for_blocks(args.min_blocks) if args.min_blocks else max(need, hi / 64)
                )
                if lo > hi:
                    raise UsageError(
                        f"--min-blocks {args.min_blocks or fp.blocks_for_memory(lo)} is larger "
                        f"than --max-blocks {args.max_blocks or fp.blocks_for_memory(hi)}"
                    )
                sizes = [{"kv_memory": m} for m in _geometric(lo, hi, args.points)]
            for size in sizes:
                points.append(_Point(name, model, host or None, size))
    return points


def _sweep(args: argparse.Namespace) -> int:
    from kvcoord.replay.plots import plot_sweep
    from kvcoord.replay.report import format_sweep
    from kvcoord.replay.scheduler import SimulationError

    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", png=True)
    if (args.sizes or args.capacities or args.kv_memories) and (args.min_blocks or args.max_blocks):
        raise UsageError(
            "--min-blocks/--max-blocks make a range; do not combine with "
            "--sizes/--capacities/--kv-memories"
        )
    st = _setup(args)
    points = _sweep_points(args, st)
    for pt in points:  # every size is checked before anything runs
        _plan(args, st, model=pt.model, host_memory=pt.host_memory, **pt.size)

    jobs = min(args.jobs, len(points))
    rows: list[dict[str, Any]] = []
    bar = _progress(len(points), args.no_progress, "sweep")
    try:
        if jobs > 1:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
                futs = [ex.submit(_sweep_point, args, pt) for pt in points]
                for f in futs:
                    rows.append(f.result())
                    bar.update(1)
        else:
            for pt in points:
                rows.append(_sweep_point(args, pt, st))
                bar.update(1)
    except SimulationError as e:
        print(f"kvcoord sweep: error: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    print(f"{st.workload.name}: {len(points)} replays")
    print(format_sweep(rows))
    if args.json:
        doc = {"workload": st.workload.name, "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot_sweep(rows, args.plot)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvcoord`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["replay", *argv]  # `kvcoord [flags]` is `kvcoord replay [flags]`
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "replay":
            return _replay(args)
        return _sweep(args)
    except UsageError as e:
        parser.exit(2, f"kvcoord {args.command}: error: {e}\n")
    except BrokenPipeError:  # pragma: no cover - `kvcoord | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
