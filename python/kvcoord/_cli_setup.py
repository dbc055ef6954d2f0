"""The ``kvcoord`` command's set-up, shared by ``replay`` and ``sweep``: the
workload and layout from the flags, checked before any run; the planner's
set-up and the simulator's configuration (see :mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from kvcoord._cli_base import MAX_POOL_BLOCKS, UsageError

__all__ = ["SIZE_OPTIONS", "_Setup", "_plan", "_progress", "_setup", "_sim_config"]


# --------------------------------------------------------------------------- validation


@dataclass
class _Setup:
    workload: Any
    layout: Any


def _setup(args: argparse.Namespace) -> _Setup:
    from kvcoord.replay.layouts import LayoutError, load_layout

    if args.format is not None and args.trace is None:
        raise UsageError("--format needs --trace FILE (the bundled workload has no format)")
    if args.lenient_fields and args.trace is None:
        raise UsageError("--lenient-fields needs --trace FILE (the bundled workload has no fields)")
    # the flag a layout problem is blamed on: the one given (a sweep's --layouts
    # are each checked by the planner)
    layout_flag = "--layout" if args.layout else "--block-size"
    try:
        layout = load_layout(args.layout or "full")
        if args.block_size is not None:
            layout = layout.with_block_size(args.block_size)
    except LayoutError as e:
        raise UsageError(f"{layout_flag}: {e}") from None
    _check_concurrency(args)
    load = _load_flags(args)
    if load:
        workload = _random_load(args, load)
    else:
        if args.seed is not None:
            raise UsageError(
                "--seed seeds a synthetic load (--input-len, --output-len, ...); "
                "the bundled workload and traces have their own"
            )
        workload = _read_workload(args)
    if not workload.requests:
        raise UsageError(f"--trace {args.trace}: the trace has no requests")
    from kvcoord.replay.scheduler import make_manager

    try:  # what the manager itself refuses (sizes beyond its range), before any run
        make_manager(layout, 2, workload.max_sequence_len)
    except (ValueError, TypeError, OverflowError) as e:
        if args.layout is None and args.block_size is None:
            what = ", ".join(load) if load else "--trace"
            raise UsageError(
                f"{what}: its longest request ({workload.max_sequence_len:,} tokens): {e}"
            ) from None
        raise UsageError(f"{layout_flag} {args.layout or args.block_size}: {e}") from None
    last = workload.requests[-1].arrival_s  # sorted by arrival
    if not math.isfinite(last * args.time_scale):
        raise UsageError(
            f"--time-scale {args.time_scale:g}: the last arrival ({last:g} s) "
            "scaled is beyond any finite time"
        )
    return _Setup(workload, layout)


def _read_workload(args: argparse.Namespace) -> Any:
    """The bundled workload or ``--trace``'s."""
    from kvcoord.replay.workloads import UnknownFieldError, load_workload

    try:
        return load_workload(
            args.trace, args.format, args.limit, lenient_fields=args.lenient_fields
        )
    except UnknownFieldError as e:
        raise UsageError(
            f"--trace: {e} (--lenient-fields ignores fields the format does not know)"
        ) from None
    except ValueError as e:  # TraceFormatError names the file, line and column
        raise UsageError(f"--trace: {e}") from None


def _load_flags(args: argparse.Namespace) -> list[str]:
    """The synthetic-load flags given (``LOAD_FLAGS``)."""
    from kvcoord._cli_args import LOAD_FLAGS

    return [f for f in LOAD_FLAGS if getattr(args, f[2:].replace("-", "_"), None) is not None]


def _random_load(args: argparse.Namespace, given: list[str]) -> Any:
    """The synthetic load of ``given`` (the load flags on the command line)."""
    from kvcoord.replay.loads import DEFAULT_NUM_REQUESTS, random_load

    for flag, value in (("--trace", args.trace), ("--limit", args.limit)):
        if value is not None:
            instead = "give one or the other" if flag == "--trace" else "use --num-requests"
            raise UsageError(f"{given[0]} makes a synthetic load, {flag} is for a trace: {instead}")
    try:
        return random_load(
            num_requests=args.num_requests or DEFAULT_NUM_REQUESTS,
            input_len=args.input_len,
            output_len=args.output_len,
            prefix_len=args.prefix_len or 0,
            request_rate=args.request_rate if args.request_rate is not None else math.inf,
            seed=args.seed or 0,
        )
    except ValueError as e:
        raise UsageError(f"{', '.join(given)}: {e}") from None


def _check_concurrency(args: argparse.Namespace) -> None:
    """``--concurrency`` is the clients' cap on one engine: a cluster's router
    would need it over all engines together (not modelled)."""
    if args.concurrency is None:
        return
    n = getattr(args, "instances", None)  # kvcoord plan: --replicas, checked there
    most = max(n) if isinstance(n, list) else (n or 1)
    if most > 1:
        raise UsageError(
            f"--concurrency caps the clients of one engine; --instances {most} puts engines "
            "behind a router (a cap over a cluster is not modelled): give one or the other"
        )


#: The make_plan keywords that set the pool size.
SIZE_OPTIONS = ("kv_memory", "num_blocks", "capacity_tokens")


def _plan(
    args: argparse.Namespace,
    st: _Setup,
    flags: dict[str, str] | None = None,
    variant: str | None = None,
    **options: Any,
) -> Any:
    """The planner's set-up (model, GPU, layout, pool size, host tier) from the
    flags; ``options`` (a sweep point's size and variant) override them. A
    problem names the flag the user typed: ``flags`` maps a make_plan keyword
    to it where that is not replay's own (a sweep's ``--models``); ``variant``
    is named beside a size flag."""
    from kvcoord.replay.plan import PlanError, flag_of, make_plan

    opts: dict[str, Any] = {
        "num_blocks": getattr(args, "num_blocks", None),
        "capacity_tokens": getattr(args, "capacity_tokens", None),
        "kv_memory": getattr(args, "kv_memory", None),
        "host_memory": getattr(args, "host_memory", None),
        "disk_memory": getattr(args, "disk_memory", None),
        "model": args.model,
        "model_config": args.model_config,
        "kv_dtype": args.kv_dtype,
        "weight_dtype": args.weight_dtype,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_num_seqs": args.max_running,
        "max_num_batched_tokens": args.token_budget,
        "gpu": getattr(args, "gpu", None),  # kvcoord plan: --gpus, given as an option
        "tp": args.tp,
        "layout": args.layout,
        "block_size": args.block_size,
    }
    opts.update(options)
    try:
        plan = make_plan(st.workload, **opts)
        _check_pool(plan.layout, plan.num_blocks, plan.size_option)
    except PlanError as e:
        flag = (flags or {}).get(e.option or "") or flag_of(e.option)
        if flag is not None and variant not in (None, "default") and e.option in SIZE_OPTIONS:
            flag = f"{flag} ({variant})"
        raise UsageError(e.worded(flag)) from None
    return plan


def _sim_config(args: argparse.Namespace, plan: Any, policy: str | None = None) -> Any:
    from kvcoord.replay.cluster import prompt_priority
    from kvcoord.replay.scheduler import SimConfig

    policy = policy or getattr(args, "policy", None) or "lru"
    return SimConfig(
        eviction_policy=policy,
        prompt_priority=prompt_priority(policy),
        layout=plan.layout,
        num_blocks=plan.num_blocks,
        max_running=args.max_running,
        token_budget=args.token_budget,
        time_scale=args.time_scale,
        step_model=plan.step_model,
        host_tier=plan.host_tier(),
        disk_tier=plan.disk_tier(),
        token_bytes_per_gpu=plan.footprint.token_bytes_per_gpu,
        max_concurrency=args.concurrency,
    )


def _check_pool(layout: Any, num_blocks: int, option: str | None) -> None:
    """What the CLI and the manager refuse of a pool the planner accepted (a
    `PlanError` for ``option``, the make_plan keyword that set the size)."""
    from kvcoord.replay.plan import PlanError
    from kvcoord.replay.scheduler import build_config

    whose = "" if option is not None else "the default pool: "
    if num_blocks > MAX_POOL_BLOCKS:
        raise PlanError(
            option,
            f"{whose}a pool of {num_blocks:,} blocks is larger than the {MAX_POOL_BLOCKS:,} "
            "the CLI builds",
        )
    try:  # the manager's own checks, before the run rather than in it
        build_config(layout, num_blocks)
    except (ValueError, TypeError, OverflowError) as e:
        raise PlanError(option, f"{whose}{e}") from None


def _progress(total: int, disable: bool, desc: str) -> Any:
    """A progress bar on a terminal; elsewhere (a log file, CI, a pipe) one
    line at each tenth of the work or each 30 s; nothing with ``disable``."""
    if not disable and not sys.stderr.isatty():
        return _LineProgress(total, desc)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", disable=disable, leave=False, file=sys.stderr)


class _LineProgress:
    """Progress as plain lines on stderr, for output that is not a terminal."""

    def __init__(self, total: int, desc: str, every_s: float = 30.0) -> None:
        self.total, self.desc, self.every_s = max(0, total), desc, every_s
        self.n = 0
        self._start = self._last = time.monotonic()
        self._next_tenth = 1

    def __enter__(self) -> _LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and self.total:
            self._line(f"done, {self.n:,} in {time.monotonic() - self._start:,.0f} s")

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        tenth = self.n * 10 // self.total if self.total else 0
        if self.n < self.total and (tenth >= self._next_tenth or now - self._last >= self.every_s):
            self._next_tenth = tenth + 1
            self._last = now
            pct = 100 * self.n / self.total
            self._line(f"{self.n:,}/{self.total:,} ({pct:.0f}%), {now - self._start:,.0f} s")

    def _line(self, text: str) -> None:
        print(f"{self.desc}: {text}", file=sys.stderr, flush=True)
