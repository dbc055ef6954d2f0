"""What vLLM's scheduler, workers and tests read from block results and the
pool, served from kvcoord's integer ids.

:class:`KVCacheBlocks` holds one id list per KV cache group and answers
vLLM's ``KVCacheBlocks`` interface (``get_block_ids``, ``+``, ``new_empty``,
``get_unhashed_block_ids``...). Its ``blocks`` attribute, which vLLM code
outside the hot path reads block by block, is built on demand from
:class:`BlockView` objects: one Python object per block only when asked for.

:class:`PoolView` wraps kvcoord's :class:`~kvcoord.BlockPool` with the
methods of vLLM's ``BlockPool`` that the scheduler calls
(``free_blocks`` of popped blocks, ``get_num_free_blocks``, ``get_usage``...).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from kvcoord.errors import InvalidArgumentError
from kvcoord.vllm.serve._inspect import CachedBlockIndex, FreeListEnd

__all__ = ["BlockView", "EmptyKVCacheBlocks", "KVCacheBlocks", "PoolView", "ids_of"]

_NDARRAY = np.ndarray

#: The live block views, by (id of their pool, block id).
_LIVE_VIEWS: weakref.WeakValueDictionary[tuple[int, int], BlockView] = weakref.WeakValueDictionary()


def _as_list(ids: Any) -> list[int]:
    """A fresh list of ints from a list, tuple or numpy array of ids."""
    if isinstance(ids, np.ndarray):
        out: list[int] = ids.tolist()
        return out
    return list(ids)


def ids_of(group: Any) -> list[int]:
    """Ids of one group given as ints, numpy ids or block objects (``block_id``)."""
    if isinstance(group, np.ndarray):
        out: list[int] = group.tolist()
        return out
    items = list(group)
    if items and not isinstance(items[0], int | np.integer):
        return [int(b.block_id) for b in items]
    return [int(i) for i in items]


class BlockView:
    """A read-only stand-in for vLLM's ``KVCacheBlock``: ``block_id`` plus the
    pool's live reference count and cache key. Made only on inspection paths.

    One view per (pool, block) while any is alive, as vLLM has one
    ``KVCacheBlock`` per block: code comparing blocks with ``is`` (vLLM's
    tests do) sees the same object for the same block."""

    __slots__ = ("__weakref__", "_pool", "block_id")
    _pool: Any
    block_id: int

    def __new__(cls, pool: Any, block_id: int) -> BlockView:
        if cls is not BlockView:
            # Subclasses (kvcoord.vllm.BlockPool's blocks) are not shared.
            return super().__new__(cls)
        key = (id(pool), block_id)
        view = _LIVE_VIEWS.get(key)
        # A live view keeps its pool alive, so its id names that pool.
        if view is None or view._pool is not pool:
            view = super().__new__(cls)
            _LIVE_VIEWS[key] = view
        return view

    def __init__(self, pool: Any, block_id: int) -> None:
        self._pool = pool
        self.block_id = block_id

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    @property
    def ref_cnt(self) -> int:
        return int(self._pool.ref_counts()[self.block_id])

    @property
    def block_hash(self) -> bytes | None:
        """The cache key as vLLM spells it: digest + 4-byte big-endian group id."""
        key = self._pool.block_hash(self.block_id)
        if key is None:
            return None
        digest, group_id = key
        return bytes(digest) + int(group_id).to_bytes(4, "big")

    @property
    def _block_hash(self) -> bytes | None:
        """vLLM's private spelling of :attr:`block_hash` (tests read it)."""
        return self.block_hash

    @property
    def block_hash_num_tokens(self) -> int | None:
        """vLLM's ``block_hash_num_tokens``: the prefix the primary key stands
        for (a partial key's own count; the block's end for a full key)."""
        return self._pool.key_num_tokens(self.block_id)  # type: ignore[no-any-return]

    def _free_neighbour(self, side: int) -> Any:
        """The free queue's entry on ``side`` (0: front, 1: back) of this
        block, read from the pool's links: a view, the queue's end sentinel,
        or None when the block is not free."""
        links = self._pool.free_neighbours(self.block_id)
        if links is None:
            return None
        other = links[side]
        if other < 0:
            return FreeListEnd.pair(self._pool)[side]
        return BlockView(self._pool, other)

    @property
    def prev_free_block(self) -> Any:
        """vLLM's free-list link towards the front (the head sentinel for the first)."""
        return self._free_neighbour(0)

    @property
    def next_free_block(self) -> Any:
        """vLLM's free-list link towards the back (the tail sentinel for the last)."""
        return self._free_neighbour(1)

    def __eq__(self, other: object) -> bool:
        other_id = getattr(other, "block_id", None)
        return other_id is not None and other_id == self.block_id

    def __hash__(self) -> int:
        return hash(self.block_id)

    def __repr__(self) -> str:
        return f"BlockView(block_id={self.block_id})"


class KVCacheBlocks:
    """Block ids per KV cache group with vLLM 0.33.0's ``KVCacheBlocks`` interface."""

    __slots__ = ("_pool", "ids")

    def __init__(self, ids: Sequence[Any], pool: Any = None) -> None:
        self.ids: tuple[Any, ...] = tuple(ids)
        self._pool = pool

    @property
    def blocks(self) -> tuple[list[BlockView], ...]:
        """Per group, one :class:`BlockView` per id (built on each access)."""
        pool = self._pool
        if pool is None:
            raise AttributeError("these KVCacheBlocks carry ids only (no pool to describe blocks)")
        return tuple([BlockView(pool, i) for i in _as_list(g)] for g in self.ids)

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        groups = self.ids if group_ids is None else tuple(self.ids[g] for g in group_ids)
        if len(groups) == 1:
            # The scheduler calls this per request and step; one group needs
            # no comprehension (a frame of its own in CPython 3.11).
            g = groups[0]
            one = g.tolist() if type(g) is _NDARRAY else list(g)
            return None if allow_none and not one else (one,)
        out = tuple([_as_list(g) for g in groups])
        if allow_none and not any(out):
            return None
        return out

    def get_unhashed_block_ids(self) -> list[int]:
        if len(self.ids) != 1:
            raise ValueError("get_unhashed_block_ids supports one KV cache group only")
        return self._unhashed(self.ids[0], skip_null=False)

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        return [self._unhashed(g, skip_null=True) for g in self.ids]

    def _unhashed(self, group: Any, *, skip_null: bool) -> list[int]:
        ids = _as_list(group)
        if self._pool is None or not ids:
            return [i for i in ids if i or not skip_null]
        cached = self._pool.cached_mask()
        return [i for i in ids if not cached[i] and (i or not skip_null)]

    def new_empty(self) -> KVCacheBlocks:
        return EmptyKVCacheBlocks(tuple(() for _ in self.ids), self._pool)

    def __add__(self, other: Any) -> KVCacheBlocks:
        other_ids = other.ids if isinstance(other, KVCacheBlocks) else other.blocks
        return KVCacheBlocks(
            tuple(_as_list(a) + ids_of(b) for a, b in zip(self.ids, other_ids, strict=True)),
            self._pool,
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KVCacheBlocks):
            return self.get_block_ids() == other.get_block_ids()
        blocks = getattr(other, "blocks", None)
        if blocks is None:
            return NotImplemented
        return self.get_block_ids() == tuple(ids_of(g) for g in blocks)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()!r})"


class EmptyKVCacheBlocks(KVCacheBlocks):
    """No block in any group (a manager's ``empty_kv_cache_blocks``, the
    result of most decode steps): the scheduler's per-step
    ``get_block_ids(allow_none=True)`` is answered without looking."""

    __slots__ = ()

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        if allow_none:
            return None
        return tuple([] for _ in (self.ids if group_ids is None else group_ids))


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
        :class:`~kvcoord.vllm._inspect.CachedBlockIndex`)."""
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
