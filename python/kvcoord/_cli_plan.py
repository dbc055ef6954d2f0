"""``kvcoord plan``: the cheapest deployment that meets latency targets
(:mod:`kvcoord.planner`). Exit status 0 with an answer, 3 when no candidate
meets the targets (the closest is named), 2 for a bad flag, 1 for a failure
while running (see :mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvcoord._cli_base import (
    UsageError,
    _check_outputs,
    _say,
    _usage_errors,
    _write_json,
    _write_output,
)
from kvcoord._cli_setup import _progress, _setup

__all__ = ["WORKLOAD_FLAGS", "_plan_command", "workload_argv"]

#: Flags ``plan`` shares with ``replay`` that describe the workload and the
#: engine; the printed ``kvcoord replay`` command repeats them as typed.
WORKLOAD_FLAGS = (
    "--trace", "--format", "--limit", "--time-scale", "--model", "--model-config",
    "--gpu-memory-utilization", "--layout", "--block-size", "--max-running", "--token-budget",
    "--concurrency", "--max-concurrency", "--request-rate", "--input-len", "--output-len",
    "--num-requests", "--prefix-len", "--seed",
)  # fmt: skip
_WORKLOAD_SWITCHES = ("--lenient-fields",)


def workload_argv(argv: list[str]) -> list[str]:
    """The workload flags of ``argv`` (a ``plan`` command line), as typed."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name = a.split("=", 1)[0]
        if name in _WORKLOAD_SWITCHES:
            out.append(a)
        elif name in WORKLOAD_FLAGS:
            if "=" in a:
                out.append(a)
            elif i + 1 < len(argv):
                out += [a, argv[i + 1]]
                i += 1
        i += 1
    return out


def _targets(args: argparse.Namespace) -> Any:
    from kvcoord._cli_plan_args import TARGET_FLAGS
    from kvcoord.planner.bounds import Targets

    limits = {}
    for flag, key in TARGET_FLAGS.items():
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None:
            limits[key] = v
    goodput = _goodput(args)
    if not limits and goodput is None:
        raise UsageError(
            "give at least one latency target, e.g. --ttft-p90 2s --tpot-p90 50ms "
            f"(targets: {', '.join(TARGET_FLAGS)}, or --goodput with --goodput-min)"
        )
    return Targets(limits, goodput)


def _goodput(args: argparse.Namespace) -> Any:
    """The goodput target of ``--goodput`` and ``--goodput-min`` (None: none)."""
    from kvcoord.planner.goodput import Goodput

    if args.goodput is None and args.goodput_min is None:
        return None
    if args.goodput is None:
        raise UsageError(
            "--goodput-min needs --goodput: the limits of a good request, e.g. --goodput ttft:2s"
        )
    if args.goodput_min is None:
        raise UsageError(
            "--goodput needs --goodput-min: a share of requests that must be good (95%) or a "
            "rate of good requests (2.5req/s)"
        )
    limits: dict[str, float] = {}
    for metric, seconds in args.goodput:
        if metric in limits:
            raise UsageError(f"--goodput: {metric} given twice")
        limits[metric] = seconds
    kind, minimum = args.goodput_min
    return Goodput(limits, kind, minimum)


def _gpus(args: argparse.Namespace, prices: dict[str, Any], where: str) -> list[str]:
    """The GPUs to search: checked names (did-you-mean), each with a price."""
    from kvcoord.planner.prices import price_of
    from kvcoord.replay.hardware import HardwareError, load_gpu

    if args.gpus is None:
        return list(prices)
    out = []
    for name in args.gpus:
        try:
            gpu = load_gpu(name).name
        except HardwareError as e:
            raise UsageError(f"--gpus: {e}") from None
        price_of(prices, gpu, where)  # a GPU without a price: an error naming it
        out.append(gpu)
    return list(dict.fromkeys(out))


def _check_model(args: argparse.Namespace) -> None:
    """The model and every dtype to try, before any set-up (one error naming the flag)."""
    from kvcoord.replay.hf_config import load_model, read_hf_config
    from kvcoord.replay.models import ModelError
    from kvcoord.replay.plan import DEFAULT_MODEL

    if args.model is not None and args.model_config is not None:
        raise UsageError("--model and --model-config: give one")
    for kv in args.kv_dtype or [None]:
        for wd in args.weight_dtype or [None]:
            try:
                if args.model_config is not None:
                    read_hf_config(args.model_config, kv, wd)
                else:
                    load_model(args.model or DEFAULT_MODEL, kv, wd)
            except ModelError as e:
                flag = {"kv_dtype": "--kv-dtype", "weight_dtype": "--weight-dtype"}.get(
                    e.option or "", "--model-config" if args.model_config else "--model"
                )
                raise UsageError(f"{flag}: {e}") from None


def _plan_command(args: argparse.Namespace, argv: list[str]) -> int:
    from kvcoord.planner.pareto import plot_pareto
    from kvcoord.planner.prices import load_prices
    from kvcoord.planner.report import (
        EXIT_NO_DEPLOYMENT,
        format_table,
        plan_json,
        replay_command,
        sentence,
    )
    from kvcoord.planner.search import prune, replay_survivors, space_of
    from kvcoord.replay.executor import ExecutorUnavailable, make_executor

    if args.address is not None and args.executor != "ray":
        raise UsageError("--address is for --executor ray")
    with _usage_errors():  # everything before the replays checks the flags
        _check_outputs(args)
        targets = _targets(args)
        where, prices = load_prices(args.prices)
        gpus = _gpus(args, prices, where)
        _check_model(args)
        st = _setup(args)
        space = space_of(args, gpus)
        pruned = prune(args, st, targets, prices, where, space)
    try:
        ex = make_executor(args.executor, jobs=args.jobs, address=args.address)
    except (ValueError, ExecutorUnavailable) as e:
        raise UsageError(str(e)) from None
    quiet = args.no_progress
    if not quiet:
        _say(pruned.describe(targets))
    with _progress(len(pruned.survivors), quiet, "plan") as bar:

        def say(line: str) -> None:
            if quiet:
                return
            if hasattr(bar, "write"):  # tqdm: above the bar
                bar.write(line, file=sys.stderr)
            else:
                _say(line)

        res = replay_survivors(pruned, args, st, targets, ex, say, bar.update)
    wargv = workload_argv(argv)
    command = replay_command(wargv, res.chosen) if res.chosen is not None else None
    print(format_table(res))
    print(sentence(res, command))
    if args.json:
        _write_json(args.json, plan_json(res, st.workload.name, wargv, where))
    if args.plot:
        _write_output(args.plot, lambda name: plot_pareto(res, name))
    return 0 if res.chosen is not None else EXIT_NO_DEPLOYMENT
