"""What vLLM's scheduler, workers and tests read from block results and the
pool, served from kvcoord's integer ids.

:class:`KVCacheBlocks` holds one id list per KV cache group and answers
vLLM's ``KVCacheBlocks`` interface (``get_block_ids``, ``+``, ``new_empty``,
``get_unhashed_block_ids``...). Its ``blocks`` attribute, which vLLM code
outside the hot path reads block by block, is built on demand from
:class:`BlockView` objects: one Python object per block only when asked for.
A block's free-queue links lead to other views or to the queue's ends
(:class:`FreeListEnd`); the pool's own surface is
:mod:`kvcoord.vllm.serve._pool_view`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["BlockView", "EmptyKVCacheBlocks", "FreeListEnd", "KVCacheBlocks", "ids_of"]

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


class FreeListEnd:
    """``fake_free_list_head`` / ``fake_free_list_tail`` of vLLM's free queue:
    the head's ``next_free_block`` is the first free block (the tail when the
    queue is empty), the tail's ``prev_free_block`` the last (or the head)."""

    __slots__ = ("_is_head", "_other", "_pool", "block_id")

    def __init__(self, pool: Any, is_head: bool) -> None:
        self._pool = pool
        self._is_head = is_head
        self._other: FreeListEnd | None = None
        self.block_id = -1

    @staticmethod
    def pair(pool: Any) -> tuple[FreeListEnd, FreeListEnd]:
        head, tail = FreeListEnd(pool, True), FreeListEnd(pool, False)
        head._other, tail._other = tail, head
        return head, tail

    def _end(self, first: bool) -> Any:
        ids = self._pool.free_block_ids()
        if len(ids) == 0:
            return self._other
        return BlockView(self._pool, int(ids[0] if first else ids[-1]))

    @property
    def next_free_block(self) -> Any:
        return self._end(first=True) if self._is_head else None

    @property
    def prev_free_block(self) -> Any:
        return None if self._is_head else self._end(first=False)
