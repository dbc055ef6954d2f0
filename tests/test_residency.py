"""Residency metrics (lifetime, idle time before eviction, reuse gaps, hits
per block) checked against a brute-force recount from the outside of a
replay: every allocation's new blocks, every adopted hit and the pool's
cached mask before each allocation say when a block was born, accessed and
evicted."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

import kvcoord
from conformance import DATA, read_trace
from kvcoord.residency import Histogram
from manager_replayer import manager_for


def bucket(v: int) -> int:
    return v.bit_length()


def hist(values: list[int]) -> Histogram:
    buckets = [0] * 65
    for v in values:
        buckets[bucket(v)] += 1
    return Histogram(tuple(buckets), len(values), sum(values), max(values, default=0))


@pytest.mark.parametrize(
    "name", ["manager-full-s5.jsonl.gz", "manager-hybrid_mamba_align-s1.jsonl.gz"]
)
def test_histograms_equal_a_brute_force_recount(name: str) -> None:
    header, ops = read_trace(DATA / name)
    m = manager_for(header, residency_metrics=True)
    hbs = header["hash_block_size"]
    requests: dict[str, kvcoord.Request] = {}
    last_hit: dict[str, kvcoord.KVCacheBlocks] = {}
    born: dict[int, int] = {}
    accesses: dict[int, list[int]] = defaultdict(list)
    hits: dict[int, int] = defaultdict(int)
    lifetimes: list[int] = []
    idles: list[int] = []
    gaps: list[int] = []
    per_block_hits: list[int] = []
    records: list[tuple[int, int, int, tuple[int, ...], int]] = []
    now = 0
    for _, op in ops:
        kind = op["op"]
        if kind == "new_step":
            now = 10 * op["step"] + 3  # any non-trivial clock
            m.new_step_starts()
            m.set_residency_clock(now)
        elif kind == "add_request":
            requests[op["req"]] = kvcoord.Request(
                op["req"], op["prompt"], hash_block_size=hbs, cache_salt=op.get("cache_salt")
            )
        elif kind == "get_computed_blocks":
            last_hit[op["req"]] = m.get_computed_blocks(requests[op["req"]])[0]
        elif kind == "allocate_slots":
            req = requests[op["req"]]
            hit = last_hit.pop(op["req"], None) if op["use_computed"] else None
            cached_before = np.array(m.block_pool.cached_mask(), copy=True)
            new = m.allocate_slots(req, op["num_new_tokens"], op["num_new_computed_tokens"], hit)
            if new is None:
                continue
            for b in (b for g in (hit.get_block_ids() if hit else ()) for b in g if b):
                gaps.append(now - accesses[b][-1])
                hits[b] += 1
                accesses[b].append(now)
            for b in (b for g in new.get_block_ids() for b in g if b):
                if cached_before[b]:
                    life, idle = now - born[b], now - accesses[b][-1]
                    lifetimes.append(life)
                    idles.append(idle)
                    per_block_hits.append(hits[b])
                    last4 = accesses[b][-4:]
                    steps = tuple(y - x for x, y in pairwise(last4))
                    records.append((b, life, idle, steps, hits[b]))
                born[b], accesses[b], hits[b] = now, [now], 0
        elif kind == "advance":
            requests[op["req"]].num_computed_tokens += op["n"]
        elif kind == "append_token":
            requests[op["req"]].append_output_token_ids(op["token"])
        elif kind == "preempt":
            m.free(requests[op["req"]])
            requests[op["req"]].num_computed_tokens = 0
        elif kind == "finish":
            m.free(requests.pop(op["req"]))
    snap = m.residency_snapshot()
    assert snap is not None
    assert len(lifetimes) > 50, "the trace must evict cached blocks"
    assert snap.lifetime == hist(lifetimes)
    assert snap.idle_before_eviction == hist(idles)
    assert snap.reuse_gap == hist(gaps)
    assert snap.hits_per_block == hist(per_block_hits)
    drained = [
        (r.block_id, r.lifetime, r.idle, r.reuse_gaps, r.hits) for r in m.drain_eviction_records()
    ]
    assert drained == records
    assert m.drain_eviction_records() == []


def test_off_by_default_and_vllm_event_fields(tmp_path: Path) -> None:
    cfg = kvcoord.KVCacheConfig(
        num_blocks=3, groups=(kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(4)),)
    )
    m = kvcoord.KVCacheManager(cfg, max_model_len=100)
    assert m.residency_snapshot() is None and m.drain_eviction_records() == []
    m = kvcoord.KVCacheManager(
        cfg, max_model_len=100, options=kvcoord.KVCacheManagerOptions(residency_metrics=True)
    )
    a = kvcoord.Request("a", [1, 2, 3, 4, 5], hash_block_size=4)
    m.allocate_slots(a, 5)
    m.free(a)
    m.set_residency_clock(7)
    b = kvcoord.Request("b", [1, 2, 3, 4, 9], hash_block_size=4)
    blocks, hit = m.get_computed_blocks(b)
    m.allocate_slots(b, 1, hit, blocks)  # block 1 hit at t=7
    m.free(b)
    m.set_residency_clock(20)
    c = kvcoord.Request("c", list(range(50, 58)), hash_block_size=4)
    m.allocate_slots(c, 8)  # reuses both blocks: block 1 (cached) is evicted
    (rec,) = m.drain_eviction_records()
    assert (rec.block_id, rec.lifetime, rec.idle, rec.reuse_gaps, rec.hits) == (1, 20, 13, (7,), 1)
    assert rec.as_vllm_event(0.5) == {
        "lifetime_seconds": 10.0,
        "idle_seconds": 6.5,
        "reuse_gaps_seconds": (3.5,),
    }
    snap = m.residency_snapshot()
    assert snap is not None and snap.reuse_gap.count == 1 and snap.lifetime.quantile(0.5) == 20


@pytest.mark.parametrize("records", [True, False])
def test_histograms_without_records(records: bool) -> None:
    """``residency_records=False`` (the replay's choice) keeps the same
    histograms and no per-eviction record."""
    cfg = kvcoord.KVCacheConfig(
        num_blocks=4, groups=(kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(4)),)
    )
    opts = kvcoord.KVCacheManagerOptions(residency_metrics=True, residency_records=records)
    m = kvcoord.KVCacheManager(cfg, max_model_len=100, options=opts)
    for t, name in enumerate("abcd"):
        m.set_residency_clock(10 * t)
        r = kvcoord.Request(name, [t] * 8 + [9], hash_block_size=4)
        m.allocate_slots(r, 9)
        m.free(r)
    snap = m.residency_snapshot()
    # each request reuses the previous one's two cached blocks
    assert snap is not None and snap.lifetime.count == 6
    assert snap.lifetime.quantile(0.5) == 10
    assert len(m.drain_eviction_records()) == (6 if records else 0)
    with pytest.raises(kvcoord.ArgumentTypeError, match="records"):
        kvcoord.BlockPool(4).enable_residency(records=1)  # type: ignore[arg-type]


def test_replay_summary_reports_residency() -> None:
    from kvcoord.replay.layouts import PRESETS
    from kvcoord.replay.report import format_summary, summarize
    from kvcoord.replay.scheduler import SimConfig, simulate
    from kvcoord.replay.workloads import synthetic_chat

    wl = synthetic_chat(seed=1, num_conversations=30)
    # a pool a little larger than the longest request: it evicts
    cfg = SimConfig(PRESETS["full"], num_blocks=wl.max_sequence_len // 16 + 64)
    res = simulate(wl, cfg)
    assert res.residency is not None
    s = summarize(res, res.best, cfg, wl.name)
    # In a replay every eviction is a reallocation of a cached block, which
    # the pool also counts.
    assert s["residency_evicted_blocks"] == res.evictions > 0
    assert s["residency_lifetime_s_p50"] >= s["residency_idle_before_eviction_s_p50"] >= 0
    assert "block residency" in format_summary(s)
