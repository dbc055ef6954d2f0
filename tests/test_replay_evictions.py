"""Eviction accounting: the pool's counter and the replay's use of it."""

from __future__ import annotations

import kvcoord
from kvcoord.replay.layouts import PRESETS
from kvcoord.replay.scheduler import EvictionCounter, make_manager


def test_pool_counts_reused_cached_blocks() -> None:
    pool = kvcoord.BlockPool(4)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [bytes([i]) * 32 for i in range(3)], 0, 2, 0)
    pool.free_blocks(blocks[::-1])
    assert pool.num_evictions == 0
    pool.get_new_blocks(2)  # takes uncached block 3 first, then cached block 2
    assert pool.num_evictions == 1
    pool.evict_blocks([1])  # explicit eviction is not a reuse
    assert pool.num_evictions == 1


def test_counter_follows_the_manager_pool() -> None:
    mgr = make_manager(PRESETS["full"], num_blocks=3, max_model_len=64)
    counter = EvictionCounter(mgr)
    a = kvcoord.Request("a", [*range(16), 99], hash_block_size=16)
    assert mgr.allocate_slots(a, a.num_tokens) is not None
    a.num_computed_tokens = a.num_tokens
    mgr.free(a)
    assert counter.count == 0
    b = kvcoord.Request("b", list(range(100, 132)), hash_block_size=16)
    assert mgr.allocate_slots(b, b.num_tokens) is not None  # needs both blocks: evicts a's
    assert counter.count == 1


def test_no_evictions_without_caching() -> None:
    mgr = make_manager(PRESETS["no-prefix-cache"], num_blocks=3, max_model_len=64)
    counter = EvictionCounter(mgr)
    for rid in "ab":
        r = kvcoord.Request(rid, list(range(32)), hash_block_size=16)
        assert mgr.allocate_slots(r, r.num_tokens) is not None
        mgr.free(r)
    assert counter.count == 0
