"""Replay benchmark of the KV cache manager: kvcoord beside vLLM 0.33.0.

A deterministic chat workload (600 requests, shared system prompts, prompts up
to 3k tokens, 128 running at most) is driven through a small continuous-
batching scheduler. Only time inside manager calls is counted
(``get_computed_blocks``, ``allocate_slots``, ``free``); request bookkeeping
(constructing and hashing each request, and every step's progress update:
``num_computed_tokens`` and the sampled token) is timed separately, and the
ratio is printed for both. Each engine updates a step's requests its own
best way: vLLM one attribute at a time, kvcoord with one batched
``advance_requests`` call per step. Both engines see the same calls because kvcoord makes
the same decisions as vLLM (same hits, same refusals).

    python benches/bench_manager_replay.py [--layout full|hybrid] [--engine kvcoord|vllm]
        [--vllm-python /path/to/venv/bin/python]

With ``--vllm-python`` (an interpreter where ``vllm==0.33.0`` is importable;
install it in its own virtualenv, never beside kvcoord) the script also runs
the vLLM engine in that interpreter and prints both times and the ratio.
This file imports kvcoord only inside the kvcoord engine, so the vLLM run
needs nothing but vLLM.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

BLOCK = 16
NUM_REQUESTS = 600
MAX_RUNNING = 128
TOKEN_BUDGET = 8192
MAX_MODEL_LEN = 8192
LAYOUTS = {
    # name -> (groups as (kind, window) pairs, num_blocks)
    "full": ([("full", 0)], 12_000),
    "hybrid": ([("full", 0), ("swa", 1024)], 20_000),
}


def workload(seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt tokens, output length) per request, deterministic."""
    rng = random.Random(seed)
    systems = [[rng.randrange(32_000) for _ in range(rng.randrange(256, 1024))] for _ in range(8)]
    out = []
    for _ in range(NUM_REQUESTS):
        system = systems[rng.randrange(len(systems))]
        user = [rng.randrange(32_000) for _ in range(rng.randrange(32, 3072 - len(system)))]
        out.append((system + user, rng.randrange(16, 256)))
    return out


class Timer:
    """Wall time inside wrapped calls. The wrapper's own cost (two
    ``perf_counter`` calls and a Python frame, ~0.2 us) is measured on a no-op
    and subtracted per call, for both engines alike: it is not manager time,
    and left in it would flatter the slower engine."""

    def __init__(self) -> None:
        self.total = 0.0
        self.calls: dict[str, list[float]] = {}
        self.overhead = self._calibrate()

    @staticmethod
    def _calibrate(n: int = 200_000) -> float:
        def noop(*args: Any) -> None:
            return None

        samples: list[float] = []
        pc = time.perf_counter
        for _ in range(n):
            t = pc()
            noop(1, 2, 3, 4)
            samples.append(pc() - t)
        return statistics.median(samples)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        samples = self.calls.setdefault(name, [])

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            r = fn(*args, **kwargs)
            dt = time.perf_counter() - t - self.overhead
            samples.append(dt)
            self.total += dt
            return r

        return timed


# ---- engines: the same five operations over either manager -----------------


def kvcoord_engine(layout: str) -> dict[str, Any]:
    import kvcoord

    groups, num_blocks = LAYOUTS[layout]
    specs = [
        kvcoord.FullAttentionSpec(BLOCK) if k == "full" else kvcoord.SlidingWindowSpec(BLOCK, w)
        for k, w in groups
    ]
    config = kvcoord.KVCacheConfig(num_blocks, tuple(kvcoord.KVCacheGroup(s) for s in specs))
    mgr = kvcoord.KVCacheManager(config, max_model_len=MAX_MODEL_LEN)

    def new_request(rid: str, tokens: list[int]) -> Any:
        return kvcoord.Request(rid, tokens, hash_block_size=BLOCK)

    def allocate(req: Any, n: int, hit: int, blocks: Any) -> bool:
        return mgr.allocate_slots(req, n, hit, blocks) is not None

    def set_computed(req: Any, n: int) -> None:
        req.num_computed_tokens = n

    return {
        "advance": kvcoord.advance_requests,
        "new_request": new_request,
        "get_computed_blocks": mgr.get_computed_blocks,
        "allocate_slots": allocate,
        "free": mgr.free,
        "num_computed": lambda r: r.num_computed_tokens,
        "set_computed": set_computed,
        "num_tokens": lambda r: r.num_tokens,
        "append": lambda r, t: r.append_output_token_ids(t),
        "num_free_blocks": lambda: mgr.block_pool.num_free_blocks,
    }


def vllm_engine(layout: str) -> dict[str, Any]:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.request import Request

    groups, num_blocks = LAYOUTS[layout]
    specs = [
        FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
        if k == "full"
        else SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=w
        )
        for k, w in groups
    ]
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
    )
    mgr = KVCacheManager(
        config,
        max_model_len=MAX_MODEL_LEN,
        scheduler_block_size=BLOCK,
        hash_block_size=BLOCK,
        enable_caching=True,
    )
    hash_fn = get_hash_fn_by_name("sha256_cbor")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK, hash_fn)
    params = SamplingParams(max_tokens=1 << 20)

    def new_request(rid: str, tokens: list[int]) -> Any:
        return Request(rid, tokens, params, None, block_hasher=hasher)

    def get_computed_blocks(req: Any) -> Any:
        res = mgr.get_computed_blocks(req)
        return res[0], res[1]

    def allocate(req: Any, n: int, hit: int, blocks: Any) -> bool:
        return mgr.allocate_slots(req, n, hit, blocks) is not None

    def set_computed(req: Any, n: int) -> None:
        req.num_computed_tokens = n

    def append(req: Any, tok: int) -> None:
        req.append_output_token_ids(tok)

    def advance(reqs: list[Any], ns: list[int], toks: list[int]) -> None:
        for req, n, tok in zip(reqs, ns, toks, strict=True):
            req.num_computed_tokens += n
            if tok >= 0:
                req.append_output_token_ids(tok)

    return {
        "advance": advance,
        "new_request": new_request,
        "get_computed_blocks": get_computed_blocks,
        "allocate_slots": allocate,
        "free": mgr.free,
        "num_computed": lambda r: r.num_computed_tokens,
        "set_computed": set_computed,
        "num_tokens": lambda r: r.num_tokens,
        "append": append,
        "num_free_blocks": lambda: mgr.block_pool.get_num_free_blocks(),
    }


# ---- the scheduler, identical for both engines ------------------------------


def run(engine: dict[str, Any]) -> dict[str, Any]:
    timer = Timer()
    get_hit = timer.wrap("get_computed_blocks", engine["get_computed_blocks"])
    allocate = timer.wrap("allocate_slots", engine["allocate_slots"])
    free = timer.wrap("free", engine["free"])
    num_computed, set_computed = engine["num_computed"], engine["set_computed"]
    num_tokens, advance = engine["num_tokens"], engine["advance"]

    hash_seconds = 0.0
    waiting: deque[tuple[Any, int]] = deque()
    for i, (prompt, out_len) in enumerate(workload()):
        t = time.perf_counter()
        req = engine["new_request"](f"r{i}", prompt)
        hash_seconds += time.perf_counter() - t
        waiting.append((req, len(prompt) + out_len))
    running: list[tuple[Any, int]] = []
    steps = preemptions = hit_tokens = 0
    next_token = 1
    while waiting or running:
        steps += 1
        budget = TOKEN_BUDGET
        scheduled: list[tuple[Any, int, int]] = []
        i = 0
        preempted = False
        while i < len(running) and budget > 0:
            req, target = running[i]
            n = min(max(num_tokens(req) - num_computed(req), 1), budget)
            while not allocate(req, n, 0, None):
                victim, vtarget = running.pop()
                free(victim)
                set_computed(victim, 0)
                waiting.appendleft((victim, vtarget))
                preemptions += 1
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, n, target))
                budget -= n
                i += 1
                continue
            break
        while not preempted and waiting and len(running) < MAX_RUNNING and budget > 0:
            req, target = waiting[0]
            blocks, hit = get_hit(req)
            n = min(num_tokens(req) - hit, budget)
            if not allocate(req, n, hit, blocks):
                break
            waiting.popleft()
            hit_tokens += hit
            set_computed(req, hit)
            running.append((req, target))
            scheduled.append((req, n, target))
            budget -= n
        finished = set()
        # One step's progress: tokens computed, and a sampled token for each
        # request whose known tokens are now all computed (-1: none).
        reqs, ns, toks = [], [], []
        for req, n, _ in scheduled:
            reqs.append(req)
            ns.append(n)
            if num_computed(req) + n == num_tokens(req):
                toks.append(next_token)
                next_token = next_token % 31_999 + 1
            else:
                toks.append(-1)
        t = time.perf_counter()
        advance(reqs, ns, toks)
        hash_seconds += time.perf_counter() - t
        for (req, _, target), tok in zip(scheduled, toks, strict=True):
            if tok >= 0 and num_tokens(req) >= target:
                free(req)
                finished.add(id(req))
        running = [(r, t) for r, t in running if id(r) not in finished]
    alloc = timer.calls["allocate_slots"]
    return {
        "manager_seconds": timer.total,
        "timer_overhead_ns": 1e9 * timer.overhead,
        "hash_seconds": hash_seconds,
        "steps": steps,
        "preemptions": preemptions,
        "hit_tokens": hit_tokens,
        "calls": {k: len(v) for k, v in timer.calls.items()},
        "allocate_slots_mean_us": 1e6 * statistics.fmean(alloc),
        "allocate_slots_median_us": 1e6 * statistics.median(alloc),
        "get_computed_blocks_mean_us": 1e6 * statistics.fmean(timer.calls["get_computed_blocks"]),
        "free_blocks_at_end": engine["num_free_blocks"](),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="full")
    ap.add_argument("--engine", choices=["kvcoord", "vllm"], default="kvcoord")
    ap.add_argument("--vllm-python", help="interpreter with vllm==0.33.0 importable")
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine; the fastest is kept")
    ap.add_argument("--json", action="store_true", help="print one JSON line (used internally)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    engine = kvcoord_engine if args.engine == "kvcoord" else vllm_engine
    result = min(
        (run(engine(args.layout)) for _ in range(args.repeat)),
        key=lambda r: r["manager_seconds"],
    )
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [("kvcoord" if args.engine == "kvcoord" else "vllm", result)]
    if args.vllm_python:
        out = (
            subprocess.run(
                [
                    args.vllm_python,
                    __file__,
                    "--engine",
                    "vllm",
                    "--layout",
                    args.layout,
                    "--repeat",
                    str(args.repeat),
                    "--json",
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        rows.append(("vllm 0.33.0", json.loads(out)))
    print(
        f"layout={args.layout}: {NUM_REQUESTS} requests, <= {MAX_RUNNING} running "
        f"(timer overhead {rows[0][1]['timer_overhead_ns']:.0f} ns/call subtracted)"
    )
    for name, r in rows:
        print(
            f"  {name:12s} manager {r['manager_seconds']:.3f} s "
            f"(allocate_slots mean {r['allocate_slots_mean_us']:.2f} us, "
            f"median {r['allocate_slots_median_us']:.2f} us; "
            f"get_computed_blocks mean {r['get_computed_blocks_mean_us']:.1f} us), "
            f"bookkeeping {r['hash_seconds']:.3f} s, steps {r['steps']}, "
            f"preemptions {r['preemptions']}, hit tokens {r['hit_tokens']}"
        )
    if len(rows) == 2:
        a, b = rows[0][1], rows[1][1]
        same = all(a[k] == b[k] for k in ("steps", "preemptions", "hit_tokens", "calls"))
        both = (b["manager_seconds"] + b["hash_seconds"]) / (
            a["manager_seconds"] + a["hash_seconds"]
        )
        print(
            f"  vLLM / kvcoord manager time: {b['manager_seconds'] / a['manager_seconds']:.1f}x; "
            f"manager + request bookkeeping: {both:.1f}x  (identical schedule: {same})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
