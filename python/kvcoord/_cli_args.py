"""The ``kvcoord`` command's flags: the argument parser of ``kvcoord replay`` and
``kvcoord sweep`` and the argument types only they use (see :mod:`kvcoord.cli`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

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

__all__ = ["LOAD_FLAGS", "_replay_sweep_parser"]


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


def _share(text: str) -> float:
    """An argparse type: a share in (0, 1], such as ``0.9``."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in (0, 1] such as 0.9, got {_shown(text)}"
        ) from None
    if not 0 < v <= 1:  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"expected a share of the GPU's memory in (0, 1] such as 0.9, got {_shown(text)}"
        )
    return v


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


def _lengths(text: str) -> object:
    """An argparse type: a length distribution (``kvcoord.replay.loads.parse_lengths``)."""
    from kvcoord.replay.loads import parse_lengths

    try:
        return parse_lengths(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tokens(text: str) -> int:
    """An argparse type: a token count >= 0 (at most a request's)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a token count >= 0, got {_shown(text)}"
        ) from None
    if not 0 <= v <= MAX_REQUEST_TOKENS:
        raise argparse.ArgumentTypeError(
            f"expected a token count in [0, {MAX_REQUEST_TOKENS:,}], got {_shown(text)}"
        )
    return v


def _rate(text: str) -> float:
    """An argparse type: requests per second, > 0 (``inf``: all at once)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected requests per second (a number > 0, or inf), got {_shown(text)}"
        ) from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a rate > 0 (or inf), got {_shown(text)}")
    return v


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {_shown(text)}") from None
    if not 0 <= v < 1 << 63:
        raise argparse.ArgumentTypeError(f"expected a seed in [0, 2**63), got {_shown(text)}")
    return v


#: The flags that ask for a random load (instead of --trace or the bundled workload).
LOAD_FLAGS = ("--input-len", "--output-len", "--num-requests", "--prefix-len", "--request-rate")


def _add_load_args(p: argparse.ArgumentParser) -> None:
    from kvcoord.replay.loads import (
        DEFAULT_INPUT_LEN,
        DEFAULT_NUM_REQUESTS,
        DEFAULT_OUTPUT_LEN,
        LENGTH_GRAMMAR,
    )

    g = p.add_argument_group(
        "synthetic load (like `vllm bench serve`'s random dataset; any of "
        f"{', '.join(LOAD_FLAGS)} replaces --trace and the bundled workload)"
    )
    g.add_argument(
        "--concurrency",
        "--max-concurrency",
        dest="concurrency",
        type=_bounded(1 << 24),
        metavar="N",
        help="clients' cap on requests in flight, as `vllm bench serve --max-concurrency`: a "
        "request is sent at its arrival time or, with N in flight, when one finishes "
        "(with an infinite --request-rate, N clients each send their next request when "
        "their last finishes: a closed loop); applies to a trace too",
    )
    g.add_argument(
        "--request-rate",
        type=_rate,
        metavar="R",
        help="Poisson arrivals at R requests per second (the first at 0); inf (the default): "
        "all at once",
    )
    g.add_argument(
        "--input-len",
        type=_lengths,
        metavar="L",
        help=f"prompt tokens after the shared prefix: {LENGTH_GRAMMAR}, rounded and clipped "
        f"to at least 1 (default {DEFAULT_INPUT_LEN})",
    )
    g.add_argument(
        "--output-len",
        type=_lengths,
        metavar="L",
        help="output tokens, exactly that many per request (vLLM's ignore_eos), as for "
        f"--input-len (default {DEFAULT_OUTPUT_LEN})",
    )
    g.add_argument(
        "--num-requests",
        type=_bounded(1 << 24),
        metavar="N",
        help=f"requests of the load (default {DEFAULT_NUM_REQUESTS})",
    )
    g.add_argument(
        "--prefix-len",
        type=_tokens,
        metavar="T",
        help="tokens every prompt starts with, like vLLM's --random-prefix-len (default 0: "
        "random prompts share nothing)",
    )
    g.add_argument(
        "--seed", type=_seed, metavar="S", help="seed of the random load's lengths, "
        "arrivals and tokens (default 0)",
    )  # fmt: skip


_KV_DTYPE_HELP = "bf16, fp16, fp8, fp32, auto (default: the model's compute dtype)"


def _weight_dtype_help() -> str:
    from kvcoord.replay.dtypes import WEIGHT_DTYPES

    return (
        f"{', '.join(WEIGHT_DTYPES)} (default: the checkpoint's, e.g. fp8 for deepseek-v3, "
        "mxfp4 experts for gpt-oss-120b; embeddings stay in bf16 when quantized)"
    )


def _add_hardware_args(g: argparse._ArgumentGroup) -> None:
    """One deployment's dtypes and GPUs (``replay``, ``sweep``)."""
    from kvcoord.replay.hardware import GPUS

    g.add_argument("--kv-dtype", metavar="DTYPE", help=f"KV-cache dtype: {_KV_DTYPE_HELP}")
    g.add_argument(
        "--weight-dtype",
        metavar="DTYPE",
        help=f"weight format as vLLM loads it: {_weight_dtype_help()}",
    )
    g.add_argument("--gpu", metavar="NAME", help=f"GPU preset: {', '.join(GPUS)} (default h100)")
    g.add_argument(
        "--tp", type=_bounded(1024), default=1, metavar="N", help="tensor-parallel GPUs (1)"
    )


def _add_search_hardware_args(g: argparse._ArgumentGroup) -> None:
    """The same choices as lists to search (``plan``)."""
    from kvcoord.replay.hardware import GPUS

    g.add_argument(
        "--kv-dtype",
        type=_str_list,
        metavar="A,B,...",
        help=f"KV-cache dtypes to try: {_KV_DTYPE_HELP}",
    )
    g.add_argument(
        "--weight-dtype",
        type=_str_list,
        metavar="A,B,...",
        help=f"weight formats to try: {_weight_dtype_help()}",
    )
    g.add_argument(
        "--gpus",
        type=_str_list,
        metavar="A,B,...",
        help=f"GPU presets to try: {', '.join(GPUS)} (default: every one with a price)",
    )
    g.add_argument(
        "--tp",
        type=lambda t: _int_list(t, _bounded(1024)),
        default=[1, 2, 4, 8],
        metavar="N,N,...",
        help="tensor-parallel degrees to try (default 1,2,4,8)",
    )


def _add_workload_args(p: argparse.ArgumentParser, search: bool = False) -> None:
    """The workload, model, hardware and scheduler flags; with ``search`` (``plan``)
    the dtypes, GPUs and TP degree are lists of choices."""
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
    from kvcoord.replay.memory import DEFAULT_GPU_MEMORY_UTILIZATION
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
    if search:
        _add_search_hardware_args(g)
    else:
        _add_hardware_args(g)
    g.add_argument(
        "--gpu-memory-utilization",
        type=_share,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        metavar="F",
        help="share of each GPU's memory vLLM may use, in (0, 1]: the default pool is this "
        "share less weights, activation and non-torch memory "
        f"(default {DEFAULT_GPU_MEMORY_UTILIZATION}, vLLM's)",
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
        help="cap on running requests (256): vLLM's max_num_seqs, also the requests its "
        "start-up profile samples when sizing the default pool",
    )
    g.add_argument(
        "--token-budget",
        type=_bounded(1 << 31),
        default=8192,
        metavar="N",
        help="tokens scheduled per step (8192): vLLM's max_num_batched_tokens, also the "
        "forward pass its start-up profile runs when sizing the default pool",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_load_args(p)


def _add_executor_args(g: argparse._ArgumentGroup) -> None:
    """Where many replays run (``sweep``, ``plan``)."""
    from kvcoord.replay.executor import EXECUTORS

    g.add_argument(
        "--jobs",
        type=_bounded(256),
        default=min(256, os.cpu_count() or 1),
        metavar="N",
        help="parallel processes with --executor local, or the CPUs of a fresh local Ray "
        "instance with --executor ray (default: the number of CPUs)",
    )
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


def _add_version(p: argparse.ArgumentParser) -> None:
    from kvcoord import __version__

    p.add_argument(
        "-V", "--version", action="version", version=f"kvcoord {__version__}",
        help="print kvcoord's version and exit",
    )  # fmt: skip


def _replay_sweep_parser() -> tuple[_Parser, Any]:
    """The top-level parser with ``replay`` and ``sweep``, and its sub-parsers
    (:mod:`kvcoord._cli_parser` adds ``plan``)."""
    p = _Parser(
        prog="kvcoord",
        description="KV-cache workload simulator: replay a trace against kvcoord's KVCacheManager.",
    )
    _add_version(p)
    sub = p.add_subparsers(dest="command", metavar="{replay,sweep,plan}")
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
    _add_executor_args(g)
    g = s.add_argument_group("output")
    g.add_argument("--json", type=_path, metavar="FILE", help="write the rows as JSON")
    g.add_argument(
        "--plot",
        type=_path,
        metavar="FILE.png",
        help="PNG of hit rate, TTFT p90 and throughput against KV memory, one line per variant",
    )
    return p, sub
