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

DEFAULT_CAPACITY_TOKENS = 65536


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
        help="multiply arrival times by F (0: all requests arrive at once; default 1)",
    )
    g = p.add_argument_group("cache layout and scheduler")
    g.add_argument(
        "--layout",
        default="full",
        metavar="NAME|FILE",
        help="preset (full, sliding-window, chunked-local, mamba, hybrid-mamba, "
        "hybrid-mamba2, mla, hybrid-swa-mla, rswa, no-prefix-cache) "
        "or a .json/.toml layout file (default: full)",
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
    g = r.add_argument_group("pool size (one of)")
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--num-blocks", type=_pos_int, metavar="N", help="pool size in blocks (null block included)"
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
    m.add_argument("--sizes", type=_int_list, metavar="N,N,...", help="pool sizes in blocks")
    m.add_argument("--capacities", type=_int_list, metavar="T,T,...", help="pool sizes in tokens")
    g.add_argument("--min-blocks", type=_pos_int, metavar="N", help="smallest pool of the range")
    g.add_argument("--max-blocks", type=_pos_int, metavar="N", help="largest pool of the range")
    g.add_argument(
        "--points", type=_pos_int, default=6, metavar="K", help="pool sizes in the range (6)"
    )
    g.add_argument("--jobs", type=_pos_int, default=1, metavar="N", help="parallel processes (1)")
    g = s.add_argument_group("output")
    g.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    g.add_argument("--plot", metavar="FILE.png", help="PNG of hit rate against pool size")
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
        layout = load_layout(args.layout)
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
    from kvcoord.replay.layouts import num_blocks_for_capacity

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


# --------------------------------------------------------------------------- replay


def _progress(total: int, disable: bool, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="req", disable=disable or None, leave=False, file=sys.stderr
    )


def _replay(args: argparse.Namespace) -> int:
    from kvcoord.replay.layouts import num_blocks_for_capacity
    from kvcoord.replay.report import format_summary, plot_replay, summarize
    from kvcoord.replay.scheduler import SimulationError, simulate

    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", png=True)
    st = _setup(args)
    if args.num_blocks is not None:
        num_blocks, flag = args.num_blocks, "--num-blocks"
    else:
        cap = args.capacity_tokens or DEFAULT_CAPACITY_TOKENS
        num_blocks, flag = num_blocks_for_capacity(st.layout, cap), "--capacity-tokens"
    _check_pool(st.layout, st.workload, num_blocks, flag)
    cfg = _sim_config(args, st.layout, num_blocks)
    bar = _progress(len(st.workload.requests), args.no_progress, "replay")
    try:
        res = simulate(st.workload, cfg, progress=bar.update)
    except SimulationError as e:
        print(f"kvcoord replay: error: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
    summary = summarize(res, res.best, cfg, st.workload.name)
    print(format_summary(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot_replay(res, summary, args.plot)
    return 0


# --------------------------------------------------------------------------- sweep


def _sweep_point(
    args: argparse.Namespace, num_blocks: int, st: _Setup | None = None, track_best: bool = False
) -> tuple[dict[str, Any], Any]:
    """One sweep size -> (summary, best case or None); in a worker process when
    ``--jobs`` > 1 (``st`` None: the worker loads the workload itself)."""
    from kvcoord.replay.report import summarize
    from kvcoord.replay.scheduler import simulate

    if st is None:
        st = _setup(args)
    cfg = _sim_config(args, st.layout, num_blocks)
    cfg.track_best = track_best
    res = simulate(st.workload, cfg)
    return summarize(res, res.best, cfg, st.workload.name), res.best


def _geometric(lo: int, hi: int, k: int) -> list[int]:
    if k == 1 or lo >= hi:
        return [hi]
    ratio = (hi / lo) ** (1 / (k - 1))
    return sorted({round(lo * ratio**i) for i in range(k)})


def _sweep(args: argparse.Namespace) -> int:
    from kvcoord.replay.bestcase import best_possible_hits
    from kvcoord.replay.layouts import num_blocks_for_capacity
    from kvcoord.replay.report import format_sweep, plot_sweep
    from kvcoord.replay.scheduler import SimulationError

    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", png=True)
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
    bar = _progress(len(sizes), args.no_progress, "sweep")
    try:
        if jobs > 1:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as ex:
                futs = [ex.submit(_sweep_point, args, n) for n in sizes]
                # this process would only wait: compute the best case meanwhile
                best = best_possible_hits(st.workload, st.layout.block_size)
                for f in futs:
                    rows.append(f.result()[0])
                    bar.update(1)
        else:
            for i, n in enumerate(sizes):
                row, found = _sweep_point(args, n, st, track_best=i == 0)
                best = best or found
                rows.append(row)
                bar.update(1)
    except SimulationError as e:
        print(f"kvcoord sweep: error: {e}", file=sys.stderr)
        return 1
    finally:
        bar.close()
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
