"""The ``kvcoord`` command's flags: the argument parser of ``kvcoord replay`` and
``kvcoord sweep`` and the argument types only they use (see :mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
import os

from kvcoord._cli_base import (
    _block_list,
    _bounded,
    _int_list,
    _nonneg_float,
    _Parser,
    _pool_blocks,
    _pos_int,
    _shown,
)
from kvcoord._suggest import did_you_mean
from kvcoord.replay.workloads import MAX_REQUEST_TOKENS

__all__ = ["_parser"]


def _bytes(text: str, allow_zero: bool = False) -> float:
    """An argparse type: a size like ``40GiB`` (bytes)."""
    from kvcoord.replay.plan import parse_bytes

    try:
        v = parse_bytes(text, allow_zero=allow_zero)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v > 1 << 60:
        raise argparse.ArgumentTypeError(f"expected at most 1 EiB, got {_shown(text)}")
    return v


def _bytes_list(text: str) -> list[float]:
    out = [_bytes(p, allow_zero=True) for p in text.split(",") if p.strip()]  # 0: none
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of sizes")
    return list(dict.fromkeys(out))  # a value given twice is replayed once, as in _int_list


def _str_list(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    if not out:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return list(dict.fromkeys(out))  # a name given twice is replayed once, as in _int_list


def _path(text: str) -> str:
    """An argparse type: a file name (not the empty string, which names no file)."""
    if not text:
        raise argparse.ArgumentTypeError(f"expected a file name, got {_shown(text)}")
    return text


def _policy(text: str) -> str:
    """An argparse type: an eviction policy spec (the core checks it)."""
    from kvcoord import BlockPool
    from kvcoord._core import EVICTION_POLICIES

    spec = text.strip()
    try:
        BlockPool(2, eviction_policy=spec)
    except ValueError as e:
        name = spec.split(":", 1)[0].strip()
        hint = "" if name in EVICTION_POLICIES else did_you_mean(name, EVICTION_POLICIES)
        raise argparse.ArgumentTypeError(f"{e}{hint}") from None
    return spec


def _policy_list(text: str) -> list[str]:
    return [_policy(p) for p in _str_list(text)]


def _router(text: str) -> str:
    """An argparse type: a ``--router`` spec (checked by building one)."""
    from kvcoord.replay.routers import make_router

    spec = text.strip()
    try:
        make_router(spec, 1, block_size=16)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return spec


def _router_list(text: str) -> list[str]:
    return [_router(p) for p in _str_list(text)]


_POLICY_HELP = (
    "lru (vLLM's order, the default), lfu, prefix-depth, priority "
    "(a finished request that was served a prefix hit keeps its prompt at priority 1; "
    "one clock tick per step); "
    "parameters as NAME:key=value (docs/eviction.md)"
)
_ROUTER_HELP = (
    "round-robin (the default), least-loaded, prefix-aware[:balance=W] (index built "
    "from the engines' KV events; docs/cluster.md)"
)


def _add_cluster_args(g: argparse._ArgumentGroup, sweep: bool) -> None:
    if sweep:
        g.add_argument(
            "--policies",
            type=_policy_list,
            metavar="A,B,...",
            help=f"eviction policies to compare: {_POLICY_HELP}",
        )
        g.add_argument(
            "--instances",
            type=lambda t: _int_list(t, _bounded(256)),
            metavar="N,N,...",
            help="engine counts to compare (default 1: one engine, no router)",
        )
        g.add_argument(
            "--routers",
            type=_router_list,
            metavar="A,B,...",
            help=f"routers to compare when instances > 1: {_ROUTER_HELP}",
        )
        return
    g.add_argument(
        "--policy",
        type=_policy,
        default="lru",
        metavar="NAME",
        help=f"eviction policy: {_POLICY_HELP}",
    )
    g.add_argument(
        "--instances",
        type=_bounded(256),
        default=1,
        metavar="N",
        help="engines behind a router, each with the pool size given (default 1)",
    )
    g.add_argument(
        "--router", type=_router, default="round-robin", metavar="NAME", help=_ROUTER_HELP
    )


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--trace",
        type=_path,
        metavar="FILE",
        help="trace file (default: the bundled synthetic chat workload)",
    )
    g.add_argument(
        "--format",
        choices=("mooncake", "tokens"),
        help="trace format (default: guessed from the first line)",
    )
    g.add_argument(
        "--lenient-fields",
        action="store_true",
        help="ignore trace fields the format does not know (default: such a field is an "
        "error naming it, so a typo such as 'arival_time' is not read as a missing field)",
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
        "--model-config",
        type=_path,
        metavar="config.json",
        help="read the model from a Hugging Face config",
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


def _add_version(p: argparse.ArgumentParser) -> None:
    from kvcoord import __version__

    p.add_argument(
        "-V", "--version", action="version", version=f"kvcoord {__version__}",
        help="print kvcoord's version and exit",
    )  # fmt: skip


def _parser() -> _Parser:
    p = _Parser(
        prog="kvcoord",
        description="KV-cache workload simulator: replay a trace against kvcoord's KVCacheManager.",
    )
    _add_version(p)
    sub = p.add_subparsers(dest="command", metavar="{replay,sweep}")
    r = sub.add_parser("replay", help="replay one workload at one pool size (the default command)")
    p.commands["replay"] = r
    _add_version(r)
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
    g = r.add_argument_group("offload tiers")
    g.add_argument(
        "--host-memory",
        type=_bytes,
        metavar="SIZE",
        help="KV offload tier in host memory per replica, e.g. 256GiB (LRU; hits load over PCIe)",
    )
    g.add_argument(
        "--disk-memory",
        type=_bytes,
        metavar="SIZE",
        help="KV offload tier on disk per replica, below the host tier, e.g. 2TiB "
        "(LRU; hits load at 6 GB/s per GPU, one NVMe drive each)",
    )
    _add_cluster_args(r.add_argument_group("eviction and cluster"), sweep=False)
    g = r.add_argument_group("output")
    g.add_argument("--json", type=_path, metavar="FILE", help="write the summary as JSON")
    g.add_argument(
        "--plot",
        type=_path,
        metavar="FILE.png",
        help="PNG of pool occupancy, hit rate and TTFT over simulated time",
    )
    g.add_argument(
        "--find-size",
        action="store_true",
        help="then find the smallest pool within 1%% of the best hit rate, by a few more "
        "replays, and say it in a sentence (bare `kvcoord` does this)",
    )

    s = sub.add_parser(
        "sweep", help="replay one workload at several pool sizes x models x host tiers"
    )
    p.commands["sweep"] = s
    _add_version(s)
    _add_workload_args(s)
    g = s.add_argument_group("variants (every combination is replayed)")
    g.add_argument(
        "--models", type=_str_list, metavar="A,B,...", help="models to compare (default: --model)"
    )
    g.add_argument(
        "--layouts",
        type=_str_list,
        metavar="A,B,...",
        help="cache layouts to compare, presets or files as for --layout (default: --layout)",
    )
    g.add_argument(
        "--host-memories",
        type=_bytes_list,
        metavar="S,S,...",
        help="host tiers to compare, e.g. 0,256GiB (default: none)",
    )
    g.add_argument(
        "--disk-memories",
        type=_bytes_list,
        metavar="S,S,...",
        help="disk tiers to compare, e.g. 0,2TiB (default: none)",
    )
    _add_cluster_args(g, sweep=True)
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
        help="parallel processes with --executor local, or the CPUs of a fresh local Ray "
        "instance with --executor ray (default: the number of CPUs)",
    )
    from kvcoord.replay.executor import EXECUTORS

    g.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="where the replays run: local processes (--jobs; the default) or a Ray "
        "cluster (pip install 'kvcoord[ray]')",
    )
    g.add_argument(
        "--address",
        metavar="ADDR",
        help="the Ray cluster for --executor ray: 'auto' (the cluster this machine joined), "
        "ray://HOST:10001, or omitted for a fresh local Ray instance",
    )
    g = s.add_argument_group("output")
    g.add_argument("--json", type=_path, metavar="FILE", help="write the rows as JSON")
    g.add_argument(
        "--plot",
        type=_path,
        metavar="FILE.png",
        help="PNG of hit rate, TTFT p90 and throughput against KV memory, one line per variant",
    )
    return p
