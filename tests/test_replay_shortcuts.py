"""The simulated scheduler's shortcuts change nothing it computes.

`kvcoord.replay.scheduler` skips ``allocate_slots`` for a running request
whose one new token neither needs nor fills a block (layouts that keep every
block: `steady_block_size`), reuses the blocked head's prefix lookup while
the cache is unchanged, and does the running requests' bookkeeping in arrays
(`kvcoord.replay.running`). Each test runs a workload with the shortcut on
and off and compares every result.
"""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np
import pytest

import kvcoord.replay.scheduler as scheduler
from kvcoord import Request
from kvcoord.replay.layouts import PRESETS, load_layout, parse_layout
from kvcoord.replay.pool import make_manager, steady_block_size
from kvcoord.replay.running import Live, RunningBatch
from kvcoord.replay.scheduler import SimConfig, simulate
from kvcoord.replay.timing import StepCost
from kvcoord.replay.workloads import WorkloadRequest, synthetic_chat

_TIMING = {"manager_seconds", "wall_seconds", "token_seconds", "best_seconds", "request_seconds"}


def _results(res: Any) -> dict[str, Any]:
    out = {}
    for k, v in vars(res).items():
        if k in _TIMING or k == "step_manager_s":
            continue
        if isinstance(v, array):
            v = [None if isinstance(x, float) and math.isnan(x) else x for x in v]
        out[k] = v
    return out


@pytest.mark.parametrize(
    ("layout", "blocks", "budget", "max_running", "policy"),
    [
        ("full", 700, 8192, 256, "lru"),  # preemptions, evictions
        ("full", 400, 300, 8, "lru"),  # budget-bound chunks, running cap
        ("full", 700, 8192, 256, "lfu"),  # a policy that counts accesses
        ("full", 700, 8192, 256, "priority"),  # priorities set before frees, a step clock
        ("mla", 300, 8192, 256, "lru"),  # 64-token blocks
        ("sliding-window", 900, 1024, 64, "lru"),  # no steady block size
        ("hybrid-mamba", 900, 700, 64, "lru"),  # chunk rule: request-by-request planning
    ],
)
def test_shortcuts_change_nothing(
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
    blocks: int,
    budget: int,
    max_running: int,
    policy: str,
) -> None:
    wl = synthetic_chat(num_conversations=12, seed=3)
    cfg = SimConfig(
        PRESETS[layout],
        num_blocks=blocks,
        token_budget=budget,
        max_running=max_running,
        time_scale=0.0,  # everything at once: a full pool
        eviction_policy=policy,
        prompt_priority=2 if policy == "priority" else 0,
    )
    fast = simulate(wl, cfg)
    monkeypatch.setattr(scheduler, "steady_block_size", lambda mgr, layout: 0)
    monkeypatch.setattr(scheduler, "_REUSE_LOOKUPS", False)
    slow = simulate(wl, cfg)
    assert _results(fast) == _results(slow)
    assert fast.num_finished == len(wl.requests)
    if layout == "full" and blocks == 700:
        assert fast.preemptions > 0 and fast.evictions > 0  # the case bites


def test_steady_block_size_from_the_kinds() -> None:
    def bs(name: str) -> int:
        lay = load_layout(name)
        return steady_block_size(make_manager(lay, 64, 4096), lay)

    assert bs("full") == 16
    assert bs("mla") == 64
    assert bs("no-prefix-cache") == 16
    for name in ("sliding-window", "chunked-local", "rswa", "mamba", "hybrid-mamba"):
        assert bs(name) == 0, name
    groups = [
        {"type": "full_attention", "block_size": 16},
        {"type": "mla_attention", "block_size": 32},
    ]
    mixed = parse_layout({"groups": groups})
    assert mixed.keeps_whole_context
    assert steady_block_size(make_manager(mixed, 64, 4096), mixed) == 0
    assert PRESETS["full"].keeps_whole_context and not PRESETS["full"].has_sparse_groups
    assert not PRESETS["rswa"].keeps_whole_context and PRESETS["rswa"].has_sparse_groups


def _live(i: int, computed: int, num_tokens: int, out_len: int) -> Live:
    wr = WorkloadRequest(f"r{i}", 0.0, num_tokens, out_len, lambda: ())
    live = Live(wr, i)
    live.computed = computed
    return live


def test_plan_matches_fcfs_budget_loop() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        k = int(rng.integers(0, 20))
        batch = RunningBatch(4)
        rems = []
        for i in range(k):
            c = int(rng.integers(0, 100))
            rem = int(rng.choice([1, 1, 1, int(rng.integers(1, 300))]))
            batch.append(_live(i, c, c + rem, 5))
            rems.append((c, rem))
        budget = int(rng.integers(1, 600))
        plan = batch.plan(budget, 16, None, budget)
        left, want, count = budget, [], 0
        for _c, rem in rems:  # the loop the arrays replace
            if left <= 0:
                break
            count += 1
            n = min(rem, left)
            want.append(n)
            left -= n
        assert plan.count == count
        assert plan.n[:count].tolist() == want
        edges = [
            i
            for i, (n, (c, _)) in enumerate(zip(want, rems, strict=False))
            if n != 1 or c % 16 == 0 or (c + 1) % 16 == 0
        ]
        assert plan.events == edges


def test_run_step_sums_match_step_cost() -> None:
    rng = np.random.default_rng(9)
    for window in (0, 48):
        batch = RunningBatch(2)
        cost = StepCost(window)
        ns = []
        for i in range(10):
            c = int(rng.integers(0, 200))
            n = int(rng.integers(0, 40))
            live = _live(i, c, c + max(n, 1), 3)
            live.out_base = batch.store_output(list(range(1000 + 10 * i, 1010 + 10 * i)))
            live.req = Request(f"r{i}", list(range(c + max(n, 1))), hash_block_size=16)
            batch.append(live)
            ns.append(n)
            if n:
                cost.add(c, n)
        n_arr = np.array(ns, dtype=np.int64)
        got = batch.run_step(n_arr, len(ns), window)
        tokens, pairs, wpairs, kv, wkv, seqs = got[:6]
        assert (tokens, seqs) == (sum(ns), sum(1 for n in ns if n))
        assert (pairs, kv) == (cost.full_pairs, cost.full_kv)
        assert (wpairs, wkv) == (cost.window_pairs, cost.window_kv)
        assert [lv.idx for lv in got[6]] == [i for i, n in enumerate(ns) if n]  # first tokens
        assert batch.out_pos[: len(ns)].tolist() == [1 if n else 0 for n in ns]
        # the sampled token is each request's first output token
        got_tokens = [lv.req.all_token_ids[-1] for lv in got[6]]
        assert got_tokens == [1000 + 10 * lv.idx for lv in got[6]]
