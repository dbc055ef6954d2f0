"""End-to-end replay benchmark on a synthetic stand-in for Mooncake's conversation trace.

Not a timed test: run it as a script::

    .venv/bin/python benches/bench_replay.py [--requests 12000] [--capacity-tokens 2000000]

The stand-in has the published trace's shape (12,000 requests over one
hour, about 12k-token prompts, about 343 output tokens, shared prefixes):
sessions start from one of a few long shared system blocks and every
follow-up turn repeats its session's previous prompt blocks before adding
new ones. Prompts are synthesised from 512-token hash ids exactly like the
Mooncake reader does. Prints the total wall time and where it goes: the
best-possible pass, time inside the manager, and the rest of the loop.
"""

from __future__ import annotations

import argparse
import sys
from time import perf_counter

import numpy as np
from kvcoord.replay.layouts import load_layout, num_blocks_for_capacity
from kvcoord.replay.report import format_summary, summarize
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.workloads import (
    MOONCAKE_BLOCK_TOKENS,
    Workload,
    WorkloadRequest,
    mooncake_prompt_tokens,
)


def conversation_like(
    num_requests: int = 12_000, seed: int = 0, duration_s: float = 3600.0
) -> Workload:
    """A Mooncake-conversation-shaped workload (hash-id prompts, ~12k tokens, shared prefixes)."""
    rng = np.random.default_rng(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    systems = [fresh(int(rng.integers(2, 8))) for _ in range(16)]
    sessions: list[list[int]] = []
    reqs: list[WorkloadRequest] = []
    times = np.sort(rng.uniform(0.0, duration_s, num_requests))
    for i, t in enumerate(times):
        if sessions and rng.random() < 0.45:
            k = int(rng.integers(len(sessions)))
            ids = sessions[k] + fresh(int(rng.integers(2, 10)))
            sessions[k] = ids
        else:
            body = int(rng.gamma(2.0, 8.0)) + 1
            ids = list(systems[int(rng.integers(len(systems)))]) + fresh(body)
            sessions.append(ids)
            if len(sessions) > 400:
                sessions.pop(0)
        if len(ids) > 120:  # keep prompts within a 64k context
            ids = ids[:120]
        n_in = len(ids) * MOONCAKE_BLOCK_TOKENS - int(rng.integers(0, MOONCAKE_BLOCK_TOKENS))
        n_out = max(1, int(rng.gamma(2.0, 170.0)))
        hids = tuple(ids)
        reqs.append(
            WorkloadRequest(
                f"conv-{i}",
                float(t),
                n_in,
                n_out,
                lambda h=hids, n=n_in: mooncake_prompt_tokens(h, n),
            )
        )
    return Workload(f"conversation-like({num_requests})", reqs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=12_000)
    p.add_argument("--capacity-tokens", type=int, default=2_000_000)
    p.add_argument("--layout", default="full")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--token-budget", type=int, default=8192)
    args = p.parse_args(argv)

    t0 = perf_counter()
    wl = conversation_like(args.requests)
    t_gen = perf_counter() - t0
    layout = load_layout(args.layout)
    n_prompt = wl.num_prompt_tokens
    print(
        f"workload: {len(wl.requests):,} requests, {n_prompt:,} prompt tokens "
        f"(mean {n_prompt / len(wl.requests):,.0f}), mean output "
        f"{sum(r.output_len for r in wl.requests) / len(wl.requests):,.0f}",
        flush=True,
    )
    cfg = SimConfig(
        layout,
        num_blocks_for_capacity(layout, args.capacity_tokens),
        max_running=args.max_running,
        token_budget=args.token_budget,
    )
    res = simulate(wl, cfg)
    print(format_summary(summarize(res, res.best, cfg, wl.name)))
    total = perf_counter() - t0
    other = (
        res.wall_seconds
        - res.manager_seconds
        - res.request_seconds
        - res.token_seconds
        - res.best_seconds
    )
    print()
    print(f"total wall time        {total:8.2f} s")
    print(f"  workload build       {t_gen:8.2f} s")
    print(f"  replay               {res.wall_seconds:8.2f} s")
    print(f"    inside manager     {res.manager_seconds:8.2f} s")
    print(f"    kvcoord.Request    {res.request_seconds:8.2f} s  (construction: block hashing)")
    print(f"    token synthesis    {res.token_seconds:8.2f} s  (hash ids -> token lists)")
    print(f"    best-possible pass {res.best_seconds:8.2f} s")
    print(f"    scheduler loop     {other:8.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
