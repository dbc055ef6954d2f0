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

Measurement: each engine runs ``--repeat`` times (default 5), its runs
interleaved with the other's, back to back (the vLLM engine waits in its own
process for the next turn). Every call is timed on its own; the figure kept
for a call is its fastest run, and those are summed (the replay is
deterministic, so call ``i`` does the same work in every run). On a shared
machine a process loses the CPU for milliseconds at a time, and such a pause
inside one of 80k sub-microsecond calls used to decide kvcoord's total; the
per-call minimum drops it, for both engines by the same rule. The median of
the runs' plain totals is printed beside it in brackets. The garbage
collector is off while timing (see :func:`run`).
"""

from __future__ import annotations

import argparse
import gc
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
    """Wall time of each wrapped call, kept per call in call order.

    The wrapper's own cost (two ``perf_counter`` calls and a Python frame) is
    measured on a no-op with the same estimator as the calls (see
    :func:`per_call_min`) and subtracted per call, for both engines alike: it
    is not manager time, and left in it would flatter the slower engine."""

    def __init__(self, overhead: float) -> None:
        self.calls: dict[str, list[float]] = {}
        self.overhead = overhead

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        samples = self.calls.setdefault(name, [])
        pc = time.perf_counter
        overhead = self.overhead

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = pc()
            r = fn(*args, **kwargs)
            samples.append(pc() - t - overhead)
            return r

        return timed


def calibrate(repeat: int, n: int = 100_000) -> float:
    """The timing wrapper's own cost per call: the median over ``n`` no-op
    calls of each call's minimum over ``repeat`` rounds."""

    def noop(*args: Any) -> None:
        return None

    timer = Timer(0.0)
    wrapped = timer.wrap("noop", noop)
    rounds = []
    for _ in range(repeat):
        timer.calls["noop"].clear()
        for _ in range(n):
            wrapped(1, 2, 3, 4)
        rounds.append(list(timer.calls["noop"]))
    return statistics.median(min(c) for c in zip(*rounds, strict=True))


def per_call_min(runs: list[list[float]]) -> float:
    """Sum over calls of each call's fastest time across repeated runs.

    The replay is deterministic, so call ``i`` does the same work in every
    run; a descheduling by another process on a loaded machine (several ms)
    or a stray page fault lands on one run's call, not on all of them, and
    the minimum drops it. Summed over calls this estimates the run without
    interference, for both engines by the same rule."""
    if len({len(r) for r in runs}) != 1:
        raise RuntimeError(
            "runs made different numbers of calls: the schedule is not deterministic"
        )
    return sum(min(c) for c in zip(*runs, strict=True))


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

    def set_computed(req: Any, n: int) -> None:
        req.num_computed_tokens = n

    return {
        "advance": kvcoord.advance_requests,
        "new_request": new_request,
        "get_computed_blocks": mgr.get_computed_blocks,
        "allocate_slots": mgr.allocate_slots,
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
        "allocate_slots": mgr.allocate_slots,
        "free": mgr.free,
        "num_computed": lambda r: r.num_computed_tokens,
        "set_computed": set_computed,
        "num_tokens": lambda r: r.num_tokens,
        "append": append,
        "num_free_blocks": lambda: mgr.block_pool.get_num_free_blocks(),
    }


# ---- the scheduler, identical for both engines ------------------------------


MANAGER_CALLS = ("get_computed_blocks", "allocate_slots", "free")
BOOKKEEPING_CALLS = ("new_request", "advance")


def run(engine: dict[str, Any], overhead: float) -> dict[str, Any]:
    """One replay; every manager and bookkeeping call timed on its own.

    The garbage collector is off while it runs (and a full collection runs
    before): a collection is triggered by allocations anywhere, the
    benchmark's own scheduler loop included, and charges its whole pause to
    whichever timed call happens to allocate next. That is noise, not the
    cost of either engine's call."""
    timer = Timer(overhead)
    get_hit = timer.wrap("get_computed_blocks", engine["get_computed_blocks"])
    # The manager's own bound method, not a lambda around it: a Python frame
    # per call (~40 ns) is not manager time, and it is half of kvcoord's
    # decode call.
    allocate = timer.wrap("allocate_slots", engine["allocate_slots"])
    free = timer.wrap("free", engine["free"])
    new_request = timer.wrap("new_request", engine["new_request"])
    advance = timer.wrap("advance", engine["advance"])
    num_computed, set_computed = engine["num_computed"], engine["set_computed"]
    num_tokens = engine["num_tokens"]
    work = workload()
    gc.collect()
    gc.disable()
    try:
        result = _replay(
            work,
            get_hit,
            allocate,
            free,
            new_request,
            advance,
            num_computed,
            set_computed,
            num_tokens,
        )
    finally:
        gc.enable()
    result["samples"] = timer.calls
    result["free_blocks_at_end"] = engine["num_free_blocks"]()
    return result


def _replay(
    work: list[tuple[list[int], int]],
    get_hit: Callable[..., Any],
    allocate: Callable[..., Any],
    free: Callable[..., Any],
    new_request: Callable[..., Any],
    advance: Callable[..., Any],
    num_computed: Callable[..., Any],
    set_computed: Callable[..., Any],
    num_tokens: Callable[..., Any],
) -> dict[str, Any]:
    waiting: deque[tuple[Any, int]] = deque()
    for i, (prompt, out_len) in enumerate(work):
        req = new_request(f"r{i}", prompt)
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
            while allocate(req, n, 0, None) is None:
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
            if allocate(req, n, hit, blocks) is None:
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
        advance(reqs, ns, toks)
        for (req, _, target), tok in zip(scheduled, toks, strict=True):
            if tok >= 0 and num_tokens(req) >= target:
                free(req)
                finished.add(id(req))
        running = [(r, t) for r, t in running if id(r) not in finished]
    return {"steps": steps, "preemptions": preemptions, "hit_tokens": hit_tokens}


def summary(runs: list[dict[str, Any]], overhead: float) -> dict[str, Any]:
    """Both estimators over repeated runs of one engine: the per-call
    minimum (the headline figure) and the median of the runs' totals."""
    first = runs[0]
    for r in runs[1:]:
        if any(r[k] != first[k] for k in ("steps", "preemptions", "hit_tokens")):
            raise RuntimeError("repeated runs made different schedules")

    def by_call(name: str) -> list[list[float]]:
        return [r["samples"][name] for r in runs]

    def totals(names: tuple[str, ...]) -> list[float]:
        return [sum(sum(r["samples"][n]) for n in names) for r in runs]

    alloc = [min(c) for c in zip(*by_call("allocate_slots"), strict=True)]
    return {
        "manager_seconds": sum(per_call_min(by_call(n)) for n in MANAGER_CALLS),
        "bookkeeping_seconds": sum(per_call_min(by_call(n)) for n in BOOKKEEPING_CALLS),
        "manager_median_total": statistics.median(totals(MANAGER_CALLS)),
        "bookkeeping_median_total": statistics.median(totals(BOOKKEEPING_CALLS)),
        "timer_overhead_ns": 1e9 * overhead,
        "steps": first["steps"],
        "preemptions": first["preemptions"],
        "hit_tokens": first["hit_tokens"],
        "calls": {k: len(v) for k, v in first["samples"].items()},
        "allocate_slots_mean_us": 1e6 * statistics.fmean(alloc),
        "allocate_slots_median_us": 1e6 * statistics.median(alloc),
        "get_computed_blocks_mean_us": 1e6
        * statistics.fmean(min(c) for c in zip(*by_call("get_computed_blocks"), strict=True)),
        "free_blocks_at_end": first["free_blocks_at_end"],
    }


ENGINES = {"kvcoord": kvcoord_engine, "vllm": vllm_engine}


def serve(layout: str, engine_name: str, repeat: int) -> int:
    """Child mode (``--serve``): one run per line read from stdin, its raw
    result printed as one JSON line, so that the parent can interleave this
    engine's runs with its own."""
    overhead = calibrate(repeat)
    print(json.dumps({"overhead": overhead}), flush=True)
    for _ in sys.stdin:
        print(json.dumps(run(ENGINES[engine_name](layout), overhead)), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="full")
    ap.add_argument("--engine", choices=sorted(ENGINES), default="kvcoord")
    ap.add_argument("--vllm-python", help="interpreter with vllm==0.33.0 importable")
    ap.add_argument("--repeat", type=int, default=5, help="runs per engine, interleaved")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.serve:
        return serve(args.layout, args.engine, args.repeat)
    overhead = calibrate(args.repeat)
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    child = None
    if args.vllm_python:
        child = subprocess.Popen(
            [
                *(args.vllm_python, __file__, "--engine", "vllm", "--layout", args.layout),
                *("--repeat", str(args.repeat), "--serve"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        child_overhead = json.loads(child.stdout.readline())["overhead"]

    def other() -> None:
        assert child is not None and child.stdin is not None and child.stdout is not None
        child.stdin.write("run\n")
        child.stdin.flush()
        theirs.append(json.loads(child.stdout.readline()))

    def own() -> None:
        mine.append(run(ENGINES[args.engine](args.layout), overhead))

    for r in range(args.repeat):
        # Back to back, alternating which engine goes first.
        for step in (own, other) if r % 2 == 0 else (other, own):
            if step is own or child is not None:
                step()
    rows = [(args.engine, summary(mine, overhead))]
    if child is not None:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
        rows.append(("vllm 0.33.0", summary(theirs, child_overhead)))
    print(
        f"layout={args.layout}: {NUM_REQUESTS} requests, <= {MAX_RUNNING} running; "
        f"{args.repeat} interleaved runs per engine, GC off while timing; each call's "
        f"fastest run, summed (median of run totals in brackets); timer overhead "
        f"{rows[0][1]['timer_overhead_ns']:.0f} ns/call subtracted"
    )
    for name, r in rows:
        print(
            f"  {name:12s} manager {r['manager_seconds']:.3f} s [{r['manager_median_total']:.3f}] "
            f"(allocate_slots mean {r['allocate_slots_mean_us']:.2f} us, "
            f"median {r['allocate_slots_median_us']:.2f} us; "
            f"get_computed_blocks mean {r['get_computed_blocks_mean_us']:.1f} us), "
            f"bookkeeping {r['bookkeeping_seconds']:.3f} s [{r['bookkeeping_median_total']:.3f}], "
            f"steps {r['steps']}, preemptions {r['preemptions']}, hit tokens {r['hit_tokens']}"
        )
    if len(rows) == 2:
        a, b = rows[0][1], rows[1][1]
        same = all(a[k] == b[k] for k in ("steps", "preemptions", "hit_tokens", "calls"))

        def ratios(m: str, k: str) -> tuple[float, float]:
            return b[m] / a[m], (b[m] + b[k]) / (a[m] + a[k])

        best = ratios("manager_seconds", "bookkeeping_seconds")
        med = ratios("manager_median_total", "bookkeeping_median_total")
        print(
            f"  vLLM / kvcoord manager time: {best[0]:.1f}x [{med[0]:.1f}x]; "
            f"manager + request bookkeeping: {best[1]:.1f}x [{med[1]:.1f}x]  "
            f"(identical schedule: {same})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
