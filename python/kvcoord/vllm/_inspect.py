"""Read-only views of vLLM pool internals that vLLM's tests inspect: the
free list's sentinel ends and ``cached_block_hash_to_block``.

Each is built on demand from kvcoord's pool (for inspection, never on the
scheduler's path) and shows what vLLM's structure would hold in the same
state; none of them can change the pool.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["CachedBlockIndex", "FreeListEnd"]


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
        from kvcoord.vllm._blocks import BlockView

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


class CachedBlockIndex(Mapping[bytes, Any]):
    """``cached_block_hash_to_block``: cache key (digest + 4-byte big-endian
    group id, as :attr:`BlockView.block_hash` spells it) -> a cached block
    with that key. Rebuilt from the pool on each use (inspection only)."""

    __slots__ = ("_pool",)

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def _index(self) -> dict[bytes, int]:
        index: dict[bytes, int] = {}
        for block_id in self._pool.cached_mask().nonzero()[0].tolist():
            key = self._pool.block_hash(block_id)
            if key is not None:
                digest, group_id = key
                index.setdefault(bytes(digest) + int(group_id).to_bytes(4, "big"), block_id)
        return index

    def __getitem__(self, key: bytes) -> Any:
        from kvcoord.vllm._blocks import BlockView

        return BlockView(self._pool, self._index()[key])

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())
