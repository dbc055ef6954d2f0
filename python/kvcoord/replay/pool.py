"""The replay's manager: its construction and what the scheduler reads from its pool.

The scheduler (:mod:`kvcoord.replay.scheduler`) and this module are the only
parts of ``kvcoord.replay`` that touch :class:`kvcoord.KVCacheManager`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvcoord.config import KVCacheConfig
from kvcoord.hashing import HashAlgoName
from kvcoord.manager import KVCacheManager, KVCacheManagerOptions
from kvcoord.replay.layouts import Layout

__all__ = [
    "REPLAY_HASH_ALGO",
    "EvictionCounter",
    "build_config",
    "make_manager",
    "occupancy",
    "steady_block_size",
]

#: Hash algorithm of the simulated requests: only prefix equality matters
#: here, so the fastest one.
REPLAY_HASH_ALGO: HashAlgoName = "xxh3_native"


def build_config(layout: Layout, num_blocks: int) -> KVCacheConfig:
    """The ``kvcoord.KVCacheConfig`` for ``layout`` with a pool of ``num_blocks``."""
    return KVCacheConfig(num_blocks=num_blocks, groups=layout.groups)


def make_manager(
    layout: Layout,
    num_blocks: int,
    max_model_len: int,
    *,
    eviction_policy: str = "lru",
    enable_events: bool = False,
) -> KVCacheManager:
    """A ``KVCacheManager`` for the layout with a pool of ``num_blocks``."""
    return KVCacheManager(
        build_config(layout, num_blocks),
        max_model_len=max_model_len,
        options=KVCacheManagerOptions(
            enable_caching=layout.enable_caching,
            residency_metrics=True,
            # histograms only: a replay evicts millions of blocks and never
            # drains the per-eviction records
            residency_records=False,
            eviction_policy=eviction_policy,
            enable_events=enable_events,
        ),
    )


class EvictionCounter:
    """Counts cached blocks whose cache entry was dropped to reuse the block,
    from the pool's own counter (``BlockPool.num_evictions``; always 0 with
    prefix caching off)."""

    def __init__(self, mgr: KVCacheManager) -> None:
        self._pool = mgr.block_pool
        self._base = self._pool.num_evictions

    @property
    def count(self) -> int:
        return int(self._pool.num_evictions - self._base)


def occupancy(pool: Any) -> tuple[int, int, int]:
    """Exact (referenced, cached-but-free, empty) block counts of the pool (null block excluded)."""
    refs = np.asarray(pool.ref_counts())[1:]
    cached = np.asarray(pool.cached_mask())[1:]
    referenced = int(np.count_nonzero(refs))
    cached_free = int(np.count_nonzero(cached & (refs == 0)))
    return referenced, cached_free, refs.shape[0] - referenced - cached_free


def steady_block_size(mgr: KVCacheManager, layout: Layout) -> int:
    """``bs`` when an allocation that neither needs a new block nor fills one is a no-op, else 0.

    That holds when every group keeps all of a running request's blocks until
    it is freed (:attr:`Layout.keeps_whole_context`, from the kinds' facts)
    and all groups and the hash unit share one block size ``bs``. A running
    request with ``c`` computed tokens that schedules one more token then
    holds ``ceil(c / bs)`` blocks and has cached ``floor(c / bs)``; unless
    ``c`` or ``c + 1`` is a multiple of ``bs``, ``allocate_slots`` would
    allocate nothing, cache nothing and touch no block, so the scheduler may
    skip the call (exactly the same pool afterwards).
    """
    sizes = {g.spec.block_size for g in layout.groups}
    if not layout.keeps_whole_context or len(sizes) != 1:
        return 0
    (bs,) = sizes
    return bs if mgr.hash_block_size == bs else 0
