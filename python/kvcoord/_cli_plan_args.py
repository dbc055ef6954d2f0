"""The flags of ``kvcoord plan``: the workload and scheduler flags ``replay``
has (:mod:`kvcoord._cli_args`, shared), latency targets, the search space,
prices and the executor (see :mod:`kvcoord._cli_plan`)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from kvcoord._cli_args import (
    _add_executor_args,
    _add_workload_args,
    _bytes_list,
    _path,
    _policy_list,
    _router_list,
)
from kvcoord._cli_base import _shown

__all__ = ["MAX_REPLICAS", "TARGET_FLAGS", "add_plan_parser"]

#: The latency targets: flag -> (metric, percentile).
TARGET_FLAGS: dict[str, tuple[str, int]] = {
    f"--{m}-p{q}": (m, q) for m in ("ttft", "tpot") for q in (50, 90, 99)
}
#: Largest replica count searched.
MAX_REPLICAS = 256


def _duration(text: str) -> float:
    """An argparse type: a duration with its unit (seconds)."""
    from kvcoord.replay.plan import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _goodput_limit(text: str) -> tuple[str, float]:
    """An argparse type: ``ttft:2s`` (a per-request limit of ``--goodput``)."""
    from kvcoord.planner.goodput import parse_goodput_limit

    try:
        return parse_goodput_limit(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _goodput_min(text: str) -> tuple[str, float]:
    """An argparse type: ``95%`` or ``2.5req/s`` (``--goodput-min``)."""
    from kvcoord.planner.goodput import parse_goodput_min

    try:
        return parse_goodput_min(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _replicas(text: str) -> list[int]:
    """An argparse type: ``8`` (1 to 8), ``2-6`` (a range) or ``1,2,4`` (a list)."""
    t = text.strip()
    try:
        if re.fullmatch(r"\d+", t):
            out = list(range(1, int(t) + 1))
        elif m := re.fullmatch(r"(\d+)\s*-\s*(\d+)", t):
            out = list(range(int(m.group(1)), int(m.group(2)) + 1))
        else:
            out = sorted({int(p) for p in t.split(",") if p.strip()})
    except ValueError:
        out = []
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(
            f"expected the most replicas (8), a range (2-6) or a list (1,2,4), got {_shown(text)}"
        )
    if out[-1] > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(
            f"expected at most {MAX_REPLICAS} replicas, got {_shown(text)}"
        )
    return out


def add_plan_parser(sub: Any) -> Any:
    """The ``plan`` sub-command's parser (``sub``: the top-level sub-parsers)."""
    p = sub.add_parser(
        "plan",
        help="the cheapest deployment (GPUs, TP, replicas, dtypes, host tier) that meets "
        "latency targets on a workload",
    )
    _add_workload_args(p, search=True)
    g = p.add_argument_group(
        "targets (at least one; a duration with its unit, e.g. --ttft-p90 2s --tpot-p90 50ms)"
    )
    for flag, (metric, q) in TARGET_FLAGS.items():
        what = "time to first token" if metric == "ttft" else "time per output token"
        g.add_argument(flag, type=_duration, metavar="DURATION", help=f"p{q} {what} at most")
    g.add_argument(
        "--goodput",
        type=_goodput_limit,
        nargs="+",
        metavar="METRIC:DURATION",
        help="per-request limits of a good request, as vllm bench serve --goodput: ttft, tpot "
        "and e2el (end-to-end), e.g. --goodput ttft:2s tpot:50ms (needs --goodput-min)",
    )
    g.add_argument(
        "--goodput-min",
        type=_goodput_min,
        metavar="SHARE%|RATEreq/s",
        help="the goodput required: a share of all requests that are good (95%%) or a rate "
        "of good requests over the makespan (2.5req/s)",
    )
    g = p.add_argument_group("search space (every combination is a candidate)")
    g.add_argument(
        "--replicas",
        type=_replicas,
        metavar="N|A-B|A,B,...",
        help="engine replicas behind the router: the most (8 means 1 to 8), a range or a "
        "list (default 16)",
    )
    g.add_argument(
        "--host-memory",
        type=_bytes_list,
        default=[0.0],
        metavar="S,S,...",
        help="host-memory KV tiers per replica to try, e.g. 0,256GiB (default 0: none; priced "
        "at nothing, as GPU instances come with host memory)",
    )
    g.add_argument(
        "--router",
        type=_router_list,
        default=["prefix-aware"],
        metavar="A,B,...",
        help="routers to try with more than one replica (default prefix-aware; "
        "round-robin, least-loaded)",
    )
    g.add_argument(
        "--eviction",
        type=_policy_list,
        default=["lru"],
        metavar="A,B,...",
        help="eviction policies to try (default lru; lfu, prefix-depth, priority)",
    )
    g.add_argument(
        "--prices",
        type=_path,
        metavar="FILE.csv",
        help="GPU prices (columns gpu, usd_per_gpu_hour, source, date) instead of the shipped "
        "kvcoord/replay/data/gpu_prices.csv",
    )
    _add_executor_args(g)
    g = p.add_argument_group("output")
    g.add_argument("--json", type=_path, metavar="FILE", help="write the plan as JSON")
    g.add_argument(
        "--plot",
        type=_path,
        metavar="FILE.png",
        help="PNG of cost against TTFT p90 for every candidate replayed, with the target "
        "and the chosen deployment",
    )
    return p
