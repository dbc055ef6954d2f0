"""The ``kvcoord`` command: ``kvcoord replay`` (the default), ``kvcoord sweep`` and
``kvcoord plan`` (the cheapest deployment that meets latency targets).

``kvcoord`` with no arguments is ``kvcoord replay --find-size``: it replays
the bundled synthetic chat workload with the default model and GPU
(Llama-3.1-8B on one H100), prints a summary, then finds the pool the
workload needs for its best hit rate (:mod:`kvcoord.replay.sizing`) and says
it in a sentence; the planner's set-up (model, GPU, pool size, tiers) is resolved by
:mod:`kvcoord.replay.plan`.

Every failure is one line on stderr, ``kvcoord <command>: error: ...``, and
an exit status: 2 for a bad flag, layout or trace (all checked before the
replay starts, output paths included; every bad value the set-up meets is one),
1 for a failure while running (``KVCOORD_TRACEBACK=1`` shows the traceback),
3 when ``plan`` finds no deployment that meets its targets, 130 for Ctrl-C.
Errors name the flag as it was typed (flags are never abbreviated) and
suggest the name a misspelt flag, preset or field means.
``kvcoord --version`` prints the package's version. ``--json`` and
``--plot`` files are written whole or not at all (a temporary file renamed
into place).

The command is split by idea: its flags (:mod:`kvcoord._cli_args`), the
set-up the sub-commands share (:mod:`kvcoord._cli_setup`), the sweep
(:mod:`kvcoord._cli_sweep`), the plan (:mod:`kvcoord._cli_plan`) and the
plumbing (argument types, failures, output files: :mod:`kvcoord._cli_base`);
this module is ``replay`` and
:func:`main`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from kvcoord._cli_base import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UsageError,
    _check_outputs,
    _describe,
    _one_line,
    _say,
    _usage_errors,
    _write_json,
    _write_output,
)
from kvcoord._cli_parser import _parser
from kvcoord._cli_setup import SIZE_OPTIONS, _plan, _progress, _setup, _sim_config
from kvcoord._cli_sweep import _sweep

__all__ = ["main"]


# --------------------------------------------------------------------------- replay


def _replay(args: argparse.Namespace) -> int:
    from kvcoord.replay.plots import plot_replay
    from kvcoord.replay.report import format_summary, summarize
    from kvcoord.replay.scheduler import simulate

    with _usage_errors():  # everything before the run checks the flags
        _check_outputs(args)
        st = _setup(args)
        plan = _plan(args, st)
        cfg = _sim_config(args, plan)
    if args.instances > 1:
        if args.find_size:
            raise UsageError(
                "--find-size sizes one engine's pool; with --instances > 1 use "
                "`kvcoord sweep --instances ...`"
            )
        if args.plot:
            raise UsageError(
                "--plot draws one engine's time series; with --instances > 1 use "
                "`kvcoord sweep --instances ... --plot`"
            )
        return _replay_cluster(args, st, plan, cfg)
    with _progress(len(st.workload.requests), args.no_progress, "replay") as bar:
        res = simulate(st.workload, cfg, progress=bar.update)
    summary = summarize(res, res.best, cfg, st.workload.name, plan)
    summary.update(plan.memory_keys())
    print(format_summary(summary))
    if args.find_size:
        summary["sizing"] = _find_size(args, st, plan, cfg, res)
    if args.json:
        _write_json(args.json, summary)
    if args.plot:
        _write_output(args.plot, lambda name: plot_replay(res, summary, name))
    return 0


def _find_size(args: argparse.Namespace, st: Any, plan: Any, cfg: Any, res: Any) -> dict[str, Any]:
    """``--find-size``: the pool the workload needs, in a sentence (and in --json)."""
    from kvcoord._cli_base import MAX_POOL_BLOCKS
    from kvcoord.replay.plan import PlanError, format_bytes
    from kvcoord.replay.sizing import find_size

    try:  # what the deployment leaves for the KV cache: the default pool
        room: float | None = _plan(args, st, **dict.fromkeys(SIZE_OPTIONS)).kv_bytes_per_gpu
    except (UsageError, PlanError):  # no default pool here (the weights leave no room)
        room = None

    def say(p: Any) -> None:
        if not args.no_progress:
            _say(
                f"sizing: {format_bytes(p.kv_bytes_per_gpu)} per GPU "
                f"({p.num_blocks:,} blocks): hit rate {100 * p.hit_rate:.1f}%"
            )

    sizing = find_size(
        st.workload, cfg, plan, res, max_blocks=MAX_POOL_BLOCKS, room_bytes=room, progress=say
    )
    print(sizing.sentence())
    return sizing.to_json()


def _replay_cluster(args: argparse.Namespace, st: Any, plan: Any, cfg: Any) -> int:
    from kvcoord.replay.cluster import format_engines, simulate_cluster, summarize_cluster
    from kvcoord.replay.report import format_summary

    with _progress(len(st.workload.requests), args.no_progress, "replay") as bar:
        cres = simulate_cluster(st.workload, cfg, args.instances, args.router, progress=bar.update)
    summary = summarize_cluster(cres, cfg, st.workload.name, plan)
    summary.update(plan.memory_keys())
    print(format_summary(summary))
    print(format_engines(summary))
    if args.json:
        _write_json(args.json, summary)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvcoord`` console script; returns the exit status.

    The one place failures become a line on stderr: usage errors exit 2
    (``SystemExit``), failures while running 1, Ctrl-C 130.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # the main job: the bundled workload, then the pool it needs
        argv = ["replay", "--find-size"]
    elif argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
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
            raise UsageError(parser.commands[args.command].unrecognized(extra))
        if args.command == "replay":
            return _replay(args)
        if args.command == "plan":
            from kvcoord._cli_plan import _plan_command

            return _plan_command(args, argv)
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
