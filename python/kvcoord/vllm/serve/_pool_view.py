"""vLLM's ``BlockPool`` as the scheduler and vLLM's tests read it, over
kvcoord's pool: :class:`PoolView` wraps :class:`~kvcoord.BlockPool` with the
methods the scheduler calls (``free_blocks`` of popped blocks,
``get_num_free_blocks``, ``get_usage``...) and the inspection attributes
(``blocks``, ``free_block_queue``, ``cached_block_hash_to_block``), each
built on demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvcoord.errors import InvalidArgumentError
from kvcoord.vllm.serve._blocks import BlockView, FreeListEnd, ids_of
from kvcoord.vllm.serve._inspect import CachedBlockIndex

__all__ = ["FreeQueueView", "PoolView"]


class FreeQueueView:
    """What vLLM code reads of its free queue, live over kvcoord's pool."""

    __slots__ = ("_ends", "_pool")

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._ends: tuple[FreeListEnd, FreeListEnd] | None = None

    def _sentinels(self) -> tuple[FreeListEnd, FreeListEnd]:
        if self._ends is None:
            self._ends = FreeListEnd.pair(self._pool)
        return self._ends

    @property
    def fake_free_list_head(self) -> FreeListEnd:
        return self._sentinels()[0]

    @property
    def fake_free_list_tail(self) -> FreeListEnd:
        return self._sentinels()[1]

    @property
    def num_free_blocks(self) -> int:
        return int(self._pool.num_free_blocks)

    def get_all_free_blocks(self) -> list[BlockView]:
        return [BlockView(self._pool, int(i)) for i in self._pool.free_block_ids()]


class PoolView:
    """vLLM ``BlockPool`` methods the scheduler calls, over kvcoord's pool."""

    __slots__ = ("_core", "pool")

    def __init__(self, pool: Any, core: Any = None) -> None:
        self.pool = pool
        self._core = core  # the manager's CoordinatorCore; None for a plain pool

    @property
    def num_gpu_blocks(self) -> int:
        return int(self.pool.num_blocks)

    @property
    def enable_caching(self) -> bool:
        return bool(self.pool.enable_caching)

    @property
    def hash_block_size(self) -> int:
        return int(self.pool.hash_block_size)

    @property
    def null_block(self) -> BlockView:
        return BlockView(self.pool, 0)

    @property
    def blocks(self) -> list[BlockView]:
        """Every block, indexed by id (one view each: for inspection only)."""
        return [BlockView(self.pool, i) for i in range(self.pool.num_blocks)]

    @property
    def cached_block_hash_to_block(self) -> CachedBlockIndex:
        """vLLM's index from cache key to cached blocks, built from the pool
        on each use; on a manager's pool its edits go through the core (see
        :class:`~kvcoord.vllm.serve._inspect.CachedBlockIndex`)."""
        return CachedBlockIndex(self.pool, self._core)

    @property
    def free_block_queue(self) -> FreeQueueView:
        """Live ``num_free_blocks`` and the blocks front to back (inspection only)."""
        return FreeQueueView(self.pool)

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[BlockView] | None:
        """vLLM's lookup by block hash: one cached block per group (the first
        cached under the key), or None when any group misses (inspection)."""
        found = self.pool.get_cached_block(block_hash, list(kv_cache_group_ids))
        return None if found is None else [BlockView(self.pool, int(i)) for i in found]

    def get_num_free_blocks(self) -> int:
        return int(self.pool.num_free_blocks)

    def get_usage(self) -> float:
        return float(self.pool.usage)

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Release one reference of each block (ids or block objects), first =
        evicted first. On a manager's pool these are the blocks of one
        ``pop_blocks_for_free`` call, or blocks taken with
        :meth:`get_new_blocks` (the core refuses any other block, with
        ``BlockStateError``, and releases nothing)."""
        ids = ids_of(ordered_blocks)
        if self._core is not None:
            self._core.free_caller_blocks(ids)
            return
        self.pool.free_blocks(ids)

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        """vLLM's ``get_new_blocks``: blocks from the front of the free queue,
        one reference each (a cached one loses its key). On a manager's pool
        they belong to no request: the core counts them as the caller's until
        :meth:`free_blocks` releases them (for code that drives vLLM's pool
        interface directly, such as vLLM's tests)."""
        take = self.pool.get_new_blocks if self._core is None else self._core.get_caller_blocks
        return [BlockView(self.pool, i) for i in take(num_blocks)]

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """vLLM's ``cache_full_blocks`` of ``blocks[num_cached_blocks:num_full_blocks]``
        under the vLLM request's block hashes, in group ``kv_cache_group_id``.
        On a manager's pool only blocks taken with :meth:`get_new_blocks` are
        cached this way (a request's are cached through the manager), and
        ``block_size`` must be the hash unit."""
        ids = ids_of(blocks)
        hashes = list(request.block_hashes[:num_full_blocks])
        if self._core is None:
            if block_size != self.pool.hash_block_size:
                raise InvalidArgumentError(
                    f"block_size {block_size}: a plain pool caches blocks of one hash unit "
                    f"({self.pool.hash_block_size} tokens)"
                )
            self.pool.cache_full_blocks(
                ids, hashes, num_cached_blocks, num_full_blocks, kv_cache_group_id
            )
        else:
            self._core.cache_caller_blocks(
                ids, hashes, num_cached_blocks, num_full_blocks, kv_cache_group_id, block_size
            )
        self._cached_by(request)

    def _cached_by(self, request: Any) -> None:
        """Hook after a caching call for ``request`` (events drain here)."""

    def _owner(self) -> Any:
        return self.pool if self._core is None else self._core

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        # In the caller's iteration order, as vLLM evicts (its removal events
        # follow that order).
        self._owner().evict_blocks([int(i) for i in block_ids])

    def reset_prefix_cache(self) -> bool:
        return bool(self._owner().reset_prefix_cache())

    def take_events(self) -> list[Any]:
        return list(self._owner().take_events())

    def __getattr__(self, name: str) -> Any:
        # Anything else (num_blocks, ref_counts, cached_mask...) is kvcoord's own.
        return getattr(self.pool, name)
