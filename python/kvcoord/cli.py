"""The ``kvcoord`` command: ``kvcoord replay`` (the default) and ``kvcoord sweep``.

``kvcoord`` with no arguments replays the bundled synthetic chat workload
on a single full-attention layout and prints a summary.

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
    _sigint_ignored,
    _write_json,
    _write_output,
)
from kvcoord.replay.workloads import MAX_REQUEST_TOKENS

__all__ = ["main"]

DEFAULT_CAPACITY_TOKENS = 65536


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
        help="multiply arrival times by F (0: all requests arrive at once; default 1)",
    )
    g = p.add_argument_group("cache layout and scheduler")
    g.add_argument(
        "--layout",
        default="full",
        metavar="NAME|FILE",
        help="preset (full, sliding-window, chunked-local, mamba, no-prefix-cache) "
        "or a .json/.toml layout file (default: full)",
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
    g = r.add_argument_group("pool size (one of)")
    m = g.add_mutually_exclusive_group()
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
        help=f"pool size as tokens of context per group (default {DEFAULT_CAPACITY_TOKENS})",
    )
    g = r.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the summary as JSON")
    g.add_argument("--plot", metavar="FILE.png", help="PNG of pool usage and hit rate over time")

    s = sub.add_parser("sweep", help="replay one workload at several pool sizes")
    _add_workload_args(s)
    g = s.add_argument_group("pool sizes (default: a geometric range)")
    m = g.add_mutually_exclusive_group()
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
        "--jobs", type=_bounded(256), default=1, metavar="N", help="parallel processes (1)"
    )
    g = s.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    g.add_argument("--plot", metavar="FILE.png", help="PNG of hit rate against pool size")
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
        layout = load_layout(args.layout)
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
        raise UsageError(f"--layout {args.layout}: {e}") from None
    last = workload.requests[-1].arrival_s  # sorted by arrival
    if not math.isfinite(last * args.time_scale):
        raise UsageError(
            f"--time-scale {args.time_scale:g}: the last arrival ({last:g} s) "
            "scaled is beyond any finite time"
        )
    return _Setup(workload, layout)


def _sim_config(args: argparse.Namespace, layout: Any, num_blocks: int) -> Any:
    from kvcoord.replay.scheduler import SimConfig

    return SimConfig(
        layout=layout,
        num_blocks=num_blocks,
        max_running=args.max_running,
        token_budget=args.token_budget,
        time_scale=args.time_scale,
    )


def _check_pool(layout: Any, workload: Any, num_blocks: int, flag: str) -> None:
    if num_blocks < 2:
        raise UsageError(f"{flag}: a pool needs at least 2 blocks (block 0 is the null block)")
    if num_blocks > MAX_POOL_BLOCKS:
        raise UsageError(
            f"{flag}: a pool of {num_blocks:,} blocks is larger than the "
            f"{MAX_POOL_BLOCKS:,} the CLI builds"
        )
    from kvcoord.replay.layouts import num_blocks_for_capacity
    from kvcoord.replay.scheduler import build_config

    need = num_blocks_for_capacity(layout, workload.max_sequence_len)
    if layout.has_sparse_groups:
        need = num_blocks_for_capacity(
            layout.__class__(layout.name, layout.groups[:1]), workload.max_sequence_len
        )
    if num_blocks < need:
        raise UsageError(
            f"{flag}: {num_blocks} blocks cannot hold the longest request "
            f"({workload.max_sequence_len} tokens needs about {need} blocks)"
        )
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
    from kvcoord.replay.layouts import num_blocks_for_capacity
    from kvcoord.replay.report import format_summary, plot_replay, summarize
    from kvcoord.replay.scheduler import simulate

    _check_outputs(args)
    st = _setup(args)
    if args.num_blocks is not None:
        num_blocks, flag = args.num_blocks, "--num-blocks"
    else:
        cap = args.capacity_tokens or DEFAULT_CAPACITY_TOKENS
        num_blocks, flag = num_blocks_for_capacity(st.layout, cap), "--capacity-tokens"
    _check_pool(st.layout, st.workload, num_blocks, flag)
    cfg = _sim_config(args, st.layout, num_blocks)
    with _progress(len(st.workload.requests), args.no_progress, "replay") as bar:
        res = simulate(st.workload, cfg, progress=bar.update)
    summary = summarize(res, res.best, cfg, st.workload.name)
    print(format_summary(summary))
    if args.json:
        _write_json(args.json, summary)
    if args.plot:
        _write_output(args.plot, lambda name: plot_replay(res, summary, name))
    return 0


# --------------------------------------------------------------------------- sweep


def _sweep_point(
    args: argparse.Namespace, num_blocks: int, st: _Setup, track_best: bool = False
) -> tuple[dict[str, Any], Any]:
    """One sweep size -> (summary, best case or None)."""
    from kvcoord.replay.report import summarize
    from kvcoord.replay.scheduler import simulate

    cfg = _sim_config(args, st.layout, num_blocks)
    cfg.track_best = track_best
    res = simulate(st.workload, cfg)
    return summarize(res, res.best, cfg, st.workload.name), res.best


_WORKER_SETUP: _Setup | None = None


def _worker_init(st: _Setup) -> None:
    """A ``sweep --jobs`` worker: gets the parent's workload once; Ctrl-C is the parent's."""
    global _WORKER_SETUP
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_SETUP = st


def _worker_point(args: argparse.Namespace, num_blocks: int) -> tuple[dict[str, Any], Any]:
    """`_sweep_point` in a worker; a failure comes back as one picklable line."""
    try:
        assert _WORKER_SETUP is not None, "worker started without its workload"
        return _sweep_point(args, num_blocks, _WORKER_SETUP)
    except Exception as e:
        raise CliError(f"pool of {num_blocks:,} blocks: {_describe(e)}") from None


def _stop_workers(ex: ProcessPoolExecutor) -> None:
    with _sigint_ignored():
        ex.shutdown(wait=False, cancel_futures=True)
        children = multiprocessing.active_children()
        for proc in children:
            proc.terminate()
        for proc in children:
            proc.join(5)


def _sweep_parallel(
    args: argparse.Namespace, st: _Setup, sizes: list[int], jobs: int, bar: Any
) -> tuple[list[dict[str, Any]], Any]:
    from kvcoord.replay.bestcase import best_possible_hits

    ctx = multiprocessing.get_context("spawn")
    # workers start with Ctrl-C ignored (inherited), so only this process reports it
    with _sigint_ignored():
        ex = ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=_worker_init, initargs=(st,)
        )
        futs: list[Future[tuple[dict[str, Any], Any]]] = [
            ex.submit(_worker_point, args, n) for n in sizes
        ]
    rows: list[dict[str, Any]] = []
    try:
        # this process would only wait: compute the best case meanwhile
        best = best_possible_hits(st.workload, st.layout.block_size)
        for f in futs:
            rows.append(f.result()[0])
            bar.update(1)
    except BaseException:
        _stop_workers(ex)
        raise
    ex.shutdown()
    return rows, best


def _geometric(lo: int, hi: int, k: int) -> list[int]:
    if k == 1 or lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1 / (k - 1))
    return sorted({round(lo * ratio**i) for i in range(k)})


def _sweep(args: argparse.Namespace) -> int:
    from kvcoord.replay.layouts import num_blocks_for_capacity
    from kvcoord.replay.report import format_sweep, plot_sweep

    _check_outputs(args)
    if (args.sizes or args.capacities) and (args.min_blocks or args.max_blocks):
        raise UsageError(
            "--min-blocks/--max-blocks make a range; do not combine with --sizes/--capacities"
        )
    st = _setup(args)
    if args.sizes:
        sizes, flag = args.sizes, "--sizes"
    elif args.capacities:
        sizes = sorted({num_blocks_for_capacity(st.layout, c) for c in args.capacities})
        flag = "--capacities"
    else:
        one = num_blocks_for_capacity(st.layout, st.workload.max_sequence_len)
        total = sum(r.prompt_len + r.output_len for r in st.workload.requests)
        hi = args.max_blocks or min(
            max(num_blocks_for_capacity(st.layout, total), 2 * one), 1 << 22
        )
        lo = args.min_blocks or max(2 * one, hi // 64)
        if lo > hi:
            raise UsageError(f"--min-blocks {lo} is larger than --max-blocks {hi}")
        sizes, flag = _geometric(lo, hi, args.points), "--min-blocks"
    for n in sizes:
        _check_pool(st.layout, st.workload, n, flag)

    jobs = min(args.jobs, len(sizes))
    rows: list[dict[str, Any]] = []
    best = None
    with _progress(len(sizes), args.no_progress, "sweep") as bar:
        if jobs > 1:
            rows, best = _sweep_parallel(args, st, sizes, jobs, bar)
        else:
            for i, n in enumerate(sizes):
                row, found = _sweep_point(args, n, st, track_best=i == 0)
                best = best or found
                rows.append(row)
                bar.update(1)
    assert best is not None
    for r in rows:
        r["best_possible_hit_rate"] = best.hit_rate
    print(f"{st.workload.name} on {st.layout.name}: {st.layout.describe()}")
    print(format_sweep(rows))
    if args.json:
        doc = {
            "workload": st.workload.name,
            "layout": st.layout.name,
            "best_possible_hit_rate": best.hit_rate,
            "rows": rows,
        }
        _write_json(args.json, doc)
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
