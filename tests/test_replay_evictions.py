"""``EvictionCounter``: the one place that reads evictions from the manager (stubs, no manager)."""

from __future__ import annotations

from typing import Any

from kvcoord import BlockRemoved, BlockStored
from kvcoord._core import BlockPool
from kvcoord.replay.scheduler import EvictionCounter


class _Mgr:
    def __init__(self, pool: Any) -> None:
        self.block_pool = pool

    def take_events(self) -> list[Any]:
        events: list[Any] = self.block_pool.take_events()
        return events


def test_counts_block_removed_events_of_a_real_pool() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=16, enable_events=True)
    mgr = _Mgr(pool)
    counter = EvictionCounter(mgr, enable_caching=True)
    ids = pool.get_new_blocks(3)
    pool.cache_full_blocks(ids, [bytes([i]) * 32 for i in range(3)], 0, 3, 0)
    pool.free_blocks(ids)
    counter.poll()
    assert counter.count == 0
    pool.get_new_blocks(7)  # the 4 never-used blocks, then the 3 cached ones
    events = pool.take_events()
    assert sum(isinstance(e, BlockRemoved) for e in events) == 3
    assert not any(isinstance(e, BlockStored) for e in events)
    # the same through the counter
    pool2 = BlockPool(8, enable_caching=True, hash_block_size=16, enable_events=True)
    counter2 = EvictionCounter(_Mgr(pool2), enable_caching=True)
    ids = pool2.get_new_blocks(3)
    pool2.cache_full_blocks(ids, [bytes([i]) * 32 for i in range(3)], 0, 3, 0)
    pool2.free_blocks(ids)
    pool2.get_new_blocks(7)
    counter2.poll()
    assert counter2.count == 3


def test_prefers_a_pool_counter() -> None:
    class Pool:
        num_evictions = 5

    pool = Pool()
    counter = EvictionCounter(_Mgr(pool), enable_caching=True)
    pool.num_evictions = 12
    counter.poll()
    assert counter.count == 7


def test_caching_off_and_unknown() -> None:
    class Pool:
        enable_events = False

    off = EvictionCounter(_Mgr(Pool()), enable_caching=False)
    off.poll()
    assert off.count == 0
    unknown = EvictionCounter(_Mgr(Pool()), enable_caching=True)
    unknown.poll()
    assert unknown.count is None
