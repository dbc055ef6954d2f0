"""vLLM's ``cached_block_hash_to_block`` as vLLM's tests inspect and edit it.

It is built on demand from kvcoord's pool (for inspection, never on the
scheduler's path) and shows what vLLM's structure would hold in the same
state; its edits, which vLLM's tests make to hide cached blocks from a
lookup, go through the manager's core (see :class:`CachedBlockIndex`). The
free list's sentinel ends are :class:`~kvcoord.vllm.serve._blocks.FreeListEnd`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from kvcoord.vllm.serve._blocks import BlockView

__all__ = ["CacheEntries", "CachedBlockIndex"]


def _split_key(key: object) -> tuple[bytes, int]:
    """(digest, group id) of a vLLM cache key: the digest followed by the
    group id in 4 bytes, big-endian (vLLM's ``BlockHashWithGroupId``)."""
    if not isinstance(key, bytes | bytearray) or len(key) < 5:
        raise KeyError(key)
    return bytes(key[:-4]), int.from_bytes(key[-4:], "big")


def _block_ids(value: Any) -> list[int]:
    """Block ids of an index entry as vLLM holds it: one block, or a dict
    block id -> block."""
    if isinstance(value, Mapping):
        return [int(b.block_id) for b in value.values()]
    return [int(value.block_id)]


class CachedBlockIndex(Mapping[bytes, Any]):
    """``cached_block_hash_to_block``: cache key (digest + 4-byte big-endian
    group id, as :attr:`BlockView.block_hash` spells it) -> the blocks cached
    under it, rebuilt from the pool on each use.

    As a mapping it reads one block per key (the one a lookup finds). It also
    answers vLLM's ``BlockHashToBlockMap`` methods (``get_one_block``,
    ``contain``, ``insert``, ``pop(key, block_id)``) and its ``_cache`` dict
    (:class:`CacheEntries`). Edits are served on a manager's pool only, each
    one call into the core, which validates it and changes only cache keys
    (reference counts and free-queue positions stay): removing an entry drops
    the keys of its blocks, inserting one keys uncached blocks again.
    """

    __slots__ = ("_core", "_pool")

    def __init__(self, pool: Any, core: Any = None) -> None:
        self._pool = pool
        self._core = core  # the manager's CoordinatorCore; None: read-only

    def _entries(self) -> dict[bytes, list[int]]:
        """Every key -> its blocks, the one lookups find first."""
        pool = self._pool
        index: dict[bytes, list[int]] = {}
        for block_id in pool.cached_mask().nonzero()[0].tolist():
            for digest, group_id in pool.cache_keys(block_id):
                index.setdefault(self._vllm_key(bytes(digest), int(group_id)), []).append(block_id)
        for key, ids in index.items():
            if len(ids) > 1:
                digest, group_id = self._split(key)
                first = pool.get_cached_block(digest, [group_id])[0]
                ids.remove(first)
                ids.insert(0, first)
        return index

    def _split(self, key: object) -> tuple[bytes, int]:
        """(digest as the core holds it, group id) of a vLLM key."""
        return _split_key(key)

    def _vllm_key(self, digest: bytes, group_id: int) -> bytes:
        """vLLM's key of the core's ``(digest, group id)``."""
        return digest + group_id.to_bytes(4, "big")

    def _editable(self) -> Any:
        if self._core is None:
            raise TypeError("this pool's cached_block_hash_to_block is read-only")
        if self._pool.enable_events:
            # vLLM's dict edits record no KV-cache event; the core's key
            # changes would.
            raise NotImplementedError(
                "kvcoord: editing cached_block_hash_to_block with KV-cache events on"
            )
        return self._core

    def _view(self, block_id: int) -> Any:
        return BlockView(self._pool, block_id)

    def _one(self, block_id: int) -> Any:
        """An entry's value when one block is under the key: the block, also
        equal to vLLM's one-entry dict ``{block_id: block}`` (vLLM keeps that
        form once a key had two blocks; kvcoord's index has no such history)."""
        return _OneBlock(self._view(block_id))

    def __getitem__(self, key: bytes) -> Any:
        return self._view(self._entries()[key][0])

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())

    # ---- vLLM's BlockHashToBlockMap ---------------------------------------

    def get_one_block(self, key: bytes) -> Any:
        ids = self._entries().get(key)
        return None if ids is None else self._view(ids[0])

    def contain(self, key: bytes, block_id: int) -> bool:
        return int(block_id) in self._entries().get(key, ())

    def insert(self, key: bytes, block: Any) -> None:
        """Key ``block`` (uncached) under ``key``, after the blocks already
        there; a no-op when it is already there (as in vLLM's dict)."""
        if self.contain(key, int(block.block_id)):
            return
        digest, group_id = self._split(key)
        self._editable().insert_cache_key(digest, group_id, [int(block.block_id)])

    def pop(self, key: bytes, block_id: int) -> Any:
        """Drop ``block_id``'s key if it is cached under ``key`` (its view), else None."""
        if not self.contain(key, block_id):
            return None
        self._editable().evict_blocks([int(block_id)])
        return self._view(int(block_id))

    @property
    def _cache(self) -> CacheEntries:
        return CacheEntries(self)


class CacheEntries(MutableMapping[bytes, Any]):
    """vLLM's ``BlockHashToBlockMap._cache``: key -> its block, or a dict
    block id -> block when several blocks share the key. Deleting or popping
    a key drops the keys of all its blocks; assigning a key that is not in
    the index keys the given (uncached) blocks under it, in order, which
    restores a popped entry. ``copy.copy`` gives a plain dict snapshot."""

    __slots__ = ("_index",)

    def __init__(self, index: CachedBlockIndex) -> None:
        self._index = index

    def _value(self, ids: list[int]) -> Any:
        if len(ids) == 1:
            return self._index._one(ids[0])
        view = self._index._view
        return {i: view(i) for i in ids}

    def __getitem__(self, key: bytes) -> Any:
        return self._value(self._index._entries()[key])

    def __setitem__(self, key: bytes, value: Any) -> None:
        core = self._index._editable()
        if key in self._index._entries():
            raise NotImplementedError(
                "kvcoord: replacing an entry of cached_block_hash_to_block (pop it first)"
            )
        digest, group_id = self._index._split(key)
        core.insert_cache_key(digest, group_id, _block_ids(value))

    def __delitem__(self, key: bytes) -> None:
        ids = self._index._entries()[key]
        self._index._editable().evict_blocks(ids)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._index._entries())

    def __len__(self) -> int:
        return len(self._index._entries())

    def copy(self) -> dict[bytes, Any]:
        return {k: self._value(ids) for k, ids in self._index._entries().items()}

    __copy__ = copy


class _OneBlock:
    """The value of a key with one block in :class:`CacheEntries`: reads as
    that block (``block_id``, ``ref_cnt``, ...) and compares equal to it and
    to vLLM's one-entry dict of it."""

    __slots__ = ("_block",)

    def __init__(self, block: Any) -> None:
        self._block = block

    def __getattr__(self, name: str) -> Any:
        return getattr(self._block, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return len(other) == 1 and other.get(self._block.block_id) == self._block
        return bool(self._block == other)

    def __hash__(self) -> int:
        return hash(self._block)

    def __repr__(self) -> str:
        return repr(self._block)
