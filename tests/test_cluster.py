"""The cluster in the planner: routers, the event-built prefix index, the
cluster simulator, and the eviction-policy choice of the manager and replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kvcoord
from kvcoord import KVCacheManager, KVCacheManagerOptions, Request
from kvcoord.replay.cluster import simulate_cluster, summarize_cluster
from kvcoord.replay.layouts import load_layout
from kvcoord.replay.routers import (
    LeastLoadedRouter,
    PrefixAwareRouter,
    PrefixIndex,
    RoundRobinRouter,
    block_keys,
    make_router,
)
from kvcoord.replay.scheduler import (
    REPLAY_HASH_ALGO,
    SimConfig,
    build_config,
    make_manager,
    simulate,
)
from kvcoord.replay.workloads import Workload, WorkloadRequest, load_workload

BS = 16
FULL = load_layout("full")


def _mgr(num_blocks: int = 64, policy: str = "lru", events: bool = True) -> KVCacheManager:
    return make_manager(FULL, num_blocks, 4096, eviction_policy=policy, enable_events=events)


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, hash_block_size=BS, hash_algo=REPLAY_HASH_ALGO)


def _run(mgr: KVCacheManager, req: Request, free: bool = True) -> None:
    """Admit ``req`` with its hit, compute its whole prompt, cache, optionally free."""
    blocks, hit = mgr.get_computed_blocks(req)
    n = req.num_tokens - hit
    assert mgr.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks)
    req.num_computed_tokens = req.num_tokens
    mgr.cache_blocks(req, req.num_tokens)
    if free:
        mgr.free(req)


def _pool_keys(mgr: KVCacheManager, group: int = 0) -> set[int]:
    """The engine's cached keys, in the events' integer form."""
    pool = mgr.block_pool
    out = set()
    for b in np.flatnonzero(np.asarray(pool.cached_mask())):
        key = pool.block_hash(int(b))
        assert key is not None
        if key[1] == group:
            out.add(int.from_bytes(key[0][-8:], "big"))
    return out


# --------------------------------------------------------------------------- eviction policy


def test_manager_option_selects_policy() -> None:
    for spec in ("lru", "lfu", "prefix-depth:half_life=64", "priority:retention=5"):
        mgr = KVCacheManager(
            build_config(FULL, 32),
            max_model_len=512,
            options=KVCacheManagerOptions(eviction_policy=spec),
        )
        assert mgr.block_pool.eviction_policy == spec.split(":")[0] or ":" in spec
    assert KVCacheManagerOptions().eviction_policy == "lru"


def test_manager_option_rejects_bad_policy() -> None:
    with pytest.raises(ValueError, match="bogus"):
        KVCacheManager(
            build_config(FULL, 32),
            max_model_len=512,
            options=KVCacheManagerOptions(eviction_policy="bogus"),
        )
    with pytest.raises(TypeError, match="eviction_policy"):
        KVCacheManagerOptions(eviction_policy=3)  # type: ignore[arg-type]


def test_request_priority_protects_prompt_blocks() -> None:
    # A (4 blocks) is marked priority 1 and freed first; B is ordinary and freed
    # after. Under LRU A's blocks are evicted first; under priority B's are.
    order = {}
    for policy in ("lru", "priority"):
        mgr = _mgr(32, policy, events=False)
        a = _req("a", list(range(64)))
        b = _req("b", list(range(1000, 1064)))
        _run(mgr, a, free=False)
        _run(mgr, b, free=False)
        a_ids = set(mgr.get_blocks("a").arrays()[0].tolist())
        mgr.set_request_priority(a, 1, 64)
        mgr.free(a)
        mgr.free(b)
        cached = np.asarray(mgr.block_pool.cached_mask())
        queue = [int(x) for x in mgr.block_pool.free_block_ids() if cached[x]]
        order[policy] = [x in a_ids for x in queue]
        mgr.advance_eviction_clock(1)
        mgr.check_invariants()
    assert order["lru"] == [True] * 4 + [False] * 4
    assert order["priority"] == [False] * 4 + [True] * 4


def test_replay_default_policy_is_lru_and_policies_differ_only_in_eviction() -> None:
    wl = load_workload(None, None, 120)
    base = simulate(wl, SimConfig(layout=FULL, num_blocks=400))
    lru = simulate(wl, SimConfig(layout=FULL, num_blocks=400, eviction_policy="lru"))
    key = ("hit_tokens", "evictions", "steps", "preemptions")
    assert [getattr(base, k) for k in key] == [getattr(lru, k) for k in key]
    for policy, prio in (("lfu", 0), ("prefix-depth", 0), ("priority", 1)):
        r = simulate(
            wl,
            SimConfig(layout=FULL, num_blocks=400, eviction_policy=policy, prompt_priority=prio),
        )
        assert r.num_finished == base.num_finished == len(wl.requests)
        assert r.prompt_tokens == base.prompt_tokens
        assert r.leaked_blocks == 0


# --------------------------------------------------------------------------- routers


def _w(rid: str, t: float, tokens: list[int], out: int = 4) -> WorkloadRequest:
    return WorkloadRequest(rid, t, len(tokens), out, make_prompt=lambda: tokens)


def _wr(i: int, prompt: int = 64, out: int = 4) -> WorkloadRequest:
    return _w(f"r{i}", float(i), list(range(prompt)), out)


def test_round_robin_cycles() -> None:
    r = RoundRobinRouter(3)
    assert [r.route(_wr(i), None) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_follows_outstanding_work() -> None:
    r = LeastLoadedRouter(3)
    picks = []
    for i in range(3):
        k = r.route(_wr(i), None)
        r.routed(k, _wr(i))
        picks.append(k)
    assert picks == [0, 1, 2]
    r.finished(1, _wr(1))
    assert r.route(_wr(9), None) == 1
    r.routed(1, _wr(9, prompt=1000))
    r.routed(2, _wr(10, prompt=10))
    r.finished(0, _wr(0))
    r.routed(0, _wr(11, prompt=500))
    # 0: one request of 504 tokens, 1: one of 1004, 2: two -> 0
    assert r.route(_wr(12), None) == 0


def test_prefix_index_longest_contiguous_prefix() -> None:
    mgrs = [_mgr() for _ in range(3)]
    idx = PrefixIndex(3)
    toks = list(range(200))
    _run(mgrs[1], _req("x", toks[:96]))  # 6 blocks on engine 1
    _run(mgrs[2], _req("y", toks[:48]))  # 3 blocks on engine 2
    for k, m in enumerate(mgrs):
        idx.apply(k, m.take_events())
    probe = _req("p", toks[:160])
    assert idx.matched_blocks(block_keys(probe)) == [0, 6, 3]
    assert idx.matched_blocks([]) == [0, 0, 0]
    other = _req("q", [7, *toks[1:160]])
    assert idx.matched_blocks(block_keys(other)) == [0, 0, 0]


def test_prefix_aware_picks_longest_prefix_then_balances() -> None:
    mgrs = [_mgr() for _ in range(3)]
    toks = list(range(300))
    _run(mgrs[2], _req("x", toks[:256]))
    r = PrefixAwareRouter(3, block_size=BS)
    for k, m in enumerate(mgrs):
        r.observe(k, m.take_events())
    wr = _w("n", 0.0, toks[:272])
    hashes = block_keys(_req("n", toks[:272]))
    assert r.route(wr, hashes) == 2
    # engine 2 is now far busier than the 256 cached tokens are worth
    r.routed(2, _w("busy", 0.0, [1] * 5000, 0))
    assert r.route(wr, hashes) == 0
    # pure affinity ignores load
    r0 = PrefixAwareRouter(3, block_size=BS, balance=0.0)
    r0.index = r.index
    r0.routed(2, _w("busy", 0.0, [1] * 5000, 0))
    assert r0.route(wr, hashes) == 2


def test_prefix_index_from_events_matches_pool_under_evictions() -> None:
    # a small pool: stored, evicted and re-stored keys; after every request the
    # index built only from events equals each engine's cached keys
    rng = np.random.default_rng(7)
    mgrs = [_mgr(24) for _ in range(2)]
    idx = PrefixIndex(2)
    prefixes = [list(rng.integers(0, 50_000, 64)) for _ in range(5)]
    for i in range(60):
        k = int(rng.integers(0, 2))
        toks = [int(t) for t in prefixes[int(rng.integers(0, 5))]]
        toks += [int(t) for t in rng.integers(0, 50_000, int(rng.integers(1, 80)))]
        _run(mgrs[k], _req(f"r{i}", toks))
        for j, m in enumerate(mgrs):
            idx.apply(j, m.take_events())
            assert idx.keys(j) == _pool_keys(m)
    assert all(m.block_pool.num_evictions > 0 for m in mgrs)
    mgrs[0].reset_prefix_cache()
    idx.apply(0, mgrs[0].take_events())
    assert idx.keys(0) == set() and idx.keys(1) == _pool_keys(mgrs[1])


def test_make_router_specs() -> None:
    assert isinstance(make_router("round-robin", 2, block_size=BS), RoundRobinRouter)
    r = make_router("prefix-aware:balance=0.5", 2, block_size=BS)
    assert isinstance(r, PrefixAwareRouter) and r.balance == 0.5
    for bad, msg in (
        ("nope", "unknown router"),
        ("prefix-aware:x=1", "unknown parameter"),
        ("prefix-aware:balance=-1", "balance"),
        ("prefix-aware:balance=abc", "balance"),
        ("least-loaded:a=1", "no parameters"),
        ("prefix-aware:balance", "key=value"),
    ):
        with pytest.raises(ValueError, match=msg):
            make_router(bad, 2, block_size=BS)


# --------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def workload() -> Workload:
    return load_workload(None, None, 150)


def test_one_engine_cluster_equals_single_replay(workload: Workload) -> None:
    cfg = SimConfig(layout=FULL, num_blocks=500)
    single = simulate(workload, cfg)
    for router in ("round-robin", "prefix-aware"):
        c = simulate_cluster(workload, cfg, 1, router)
        e = c.engines[0]
        assert (e.hit_tokens, e.evictions, e.steps, e.preemptions) == (
            single.hit_tokens,
            single.evictions,
            single.steps,
            single.preemptions,
        )
        assert list(e.req_first) == list(single.req_first)


@pytest.mark.parametrize("router", ["round-robin", "least-loaded", "prefix-aware"])
def test_cluster_serves_every_request_once(workload: Workload, router: str) -> None:
    cfg = SimConfig(layout=FULL, num_blocks=300)
    c = simulate_cluster(workload, cfg, 3, router, keep_managers=True)
    n = len(workload.requests)
    assert sum(e.num_requests for e in c.engines) == n
    assert sum(e.num_finished for e in c.engines) == n
    assert np.bincount(c.assignment, minlength=3).tolist() == [e.num_requests for e in c.engines]
    assert c.total.prompt_tokens == sum(r.prompt_len for r in workload.requests)
    assert all(e.leaked_blocks == 0 for e in c.engines)
    if router == "round-robin":
        assert c.assignment.tolist() == [i % 3 for i in range(n)]
    if router == "prefix-aware":
        rt = c.router_state
        assert isinstance(rt, PrefixAwareRouter)
        for k, m in enumerate(c.managers):
            assert rt.index.keys(k) == _pool_keys(m)
        assert c.events_seen > 0
    s = summarize_cluster(c, cfg, workload.name)
    assert s["instances"] == 3 and len(s["engines"]) == 3
    assert s["prefix_hit_tokens"] == sum(e["prefix_hit_tokens"] for e in s["engines"])
    assert s["load_imbalance_requests"] >= 1.0
    assert s["ttft_p90_s"] is not None


def test_prefix_aware_beats_round_robin_on_shared_prefixes() -> None:
    # 7 conversations of 6 turns each, each turn's prompt extends the last: a
    # router that follows the cached prefix keeps every conversation on one
    # engine; round-robin scatters the turns over 4 engines (7 and 4 coprime).
    reqs = []
    rng = np.random.default_rng(3)
    convs = [list(rng.integers(0, 50_000, 128)) for _ in range(7)]
    t = 0.0
    for turn in range(6):
        for c, toks in enumerate(convs):
            toks += [int(x) for x in rng.integers(0, 50_000, 64)]
            reqs.append(_w(f"c{c}t{turn}", t, list(toks), 2))
            t += 0.5
    wl = Workload("convs", reqs)
    cfg = SimConfig(layout=FULL, num_blocks=2000)
    rates = {}
    for router in ("round-robin", "prefix-aware:balance=0"):
        c = simulate_cluster(wl, cfg, 4, router)
        rates[router] = c.total.hit_tokens / c.total.prompt_tokens
    assert rates["prefix-aware:balance=0"] > rates["round-robin"] + 0.2


def test_cluster_rejects_mismatched_router(workload: Workload) -> None:
    with pytest.raises(ValueError, match="2 engines"):
        simulate_cluster(workload, SimConfig(layout=FULL, num_blocks=300), 3, RoundRobinRouter(2))


def test_block_keys_are_the_events_integer_hashes() -> None:
    mgr = _mgr()
    req = _req("k", list(range(100)))
    _run(mgr, req)
    (stored,) = [e for e in mgr.take_events() if isinstance(e, kvcoord.BlockStored)]
    assert stored.block_hashes.tolist() == block_keys(req)[:6]


def test_replay_priority_rule_keeps_reused_conversations() -> None:
    # A conversation (turn 2 hits turn 1) then a flood of one-off prompts that
    # overflows the pool: LRU evicts the conversation, the priority rule keeps
    # turn 2's prompt (it was served a hit), so turn 3 hits it.
    rng = np.random.default_rng(11)
    conv = [int(x) for x in rng.integers(0, 50_000, 64)]
    reqs = [_w("a1", 0.0, conv, 1)]
    conv = conv + [int(x) for x in rng.integers(0, 50_000, 64)]
    reqs.append(_w("a2", 1.0, list(conv), 1))
    for i in range(12):
        reqs.append(_w(f"f{i}", 2.0 + i, [int(x) for x in rng.integers(0, 50_000, 64)], 1))
    reqs.append(_w("a3", 20.0, conv + [int(x) for x in rng.integers(0, 50_000, 32)], 1))
    wl = Workload("flood", reqs)
    hits = {}
    for policy, prio in (("lru", 0), ("priority", 1)):
        cfg = SimConfig(layout=FULL, num_blocks=41, eviction_policy=policy, prompt_priority=prio)
        res = simulate(wl, cfg)
        hits[policy] = list(res.req_gpu_hit)
    assert hits["lru"][1] == hits["priority"][1] == 64  # turn 2 hits turn 1 under both
    assert hits["lru"][-1] == 0
    assert hits["priority"][-1] == 128


def test_cluster_comparison_plot(tmp_path: Path, workload: Workload) -> None:
    from kvcoord.replay.cluster_plots import plot_cluster_comparison

    rows = []
    for policy in ("lru", "lfu"):
        for nb in (300, 500):
            cfg = SimConfig(layout=FULL, num_blocks=nb, eviction_policy=policy)
            s = summarize_cluster(simulate_cluster(workload, cfg, 2, "least-loaded"), cfg, "w")
            s["kv_memory_gib_per_gpu"] = nb / 100
            rows.append(s)
    path = tmp_path / "c.png"
    labels = plot_cluster_comparison({"bundled": rows}, str(path))
    assert labels == ["lru / least-loaded", "lfu / least-loaded"]
    assert path.stat().st_size > 10_000
