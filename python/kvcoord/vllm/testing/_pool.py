"""vLLM 0.33.0's ``BlockPool`` over kvcoord's core pool.

:class:`BlockPool` takes vLLM's constructor and answers vLLM's pool API
(``get_new_blocks``, ``free_blocks``, ``touch``, ``cache_full_blocks``,
``get_cached_block``, ``evict_blocks``, ``reset_prefix_cache``,
``take_events``, ...) for code that builds a pool itself, vLLM's tests
among it. Every decision (which ids are handed out, free-queue order,
eviction, the prefix index, what events say) is made by
:class:`kvcoord.BlockPool` in the Rust core; this class converts vLLM's
block objects to ids and back, and vLLM's requests to the block hashes the
core keys by.

Blocks come back as :class:`PoolBlock` objects, which read their
reference count, key and free-queue links from the core. The pool accepts
them and plain ids. It also accepts vLLM's own ``KVCacheBlock`` objects
that a caller made (vLLM's tests do): kvcoord's blocks are their ids, so
such an object stands for the pool's block of its id, and caching it keys
that block as vLLM's pool keys the object (``_insert_block_hash``: a block
already keyed gains a second key; the null block's id is keyed when the
object is not flagged null) and sets the object's own hash, as vLLM does.

vLLM's keys are any bytes; the core stores 16- or 32-byte digests. A digest
of another length that a caller sets by hand (``set_block_hash``, an insert
into ``cached_block_hash_to_block``) is stored under a 32-byte stand-in
(SHA-256 of it) and read back as given; such keys are refused with events
on, whose hashes the core reports.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from kvcoord._core import BlockPool as CorePool
from kvcoord.errors import BlockStateError, ConfigError, InvalidArgumentError
from kvcoord.vllm.serve._blocks import BlockView, ids_of
from kvcoord.vllm.serve._events import EventLog, EventPoolView
from kvcoord.vllm.serve._inspect import CachedBlockIndex, _split_key

__all__ = ["BlockPool", "PoolBlock"]

_GPU = "GPU"  # vLLM's MEDIUM_GPU


def _stand_in(digest: bytes) -> bytes:
    """The digest the core stores for vLLM's ``digest``: itself when 16 or
    32 bytes long, else a 32-byte stand-in."""
    if len(digest) in (16, 32):
        return digest
    return hashlib.sha256(b"kvcoord.vllm digest " + digest).digest()


class PoolBlock(BlockView):
    """A block of a :class:`BlockPool`, vLLM's ``KVCacheBlock`` shape: its
    reference count, key and free-queue links read from the core."""

    __slots__ = ("_owner",)

    def __init__(self, owner: BlockPool, block_id: int) -> None:
        super().__init__(owner.pool, block_id)
        self._owner = owner

    @property
    def block_hash(self) -> bytes | None:
        """The primary cache key as vLLM spells it (digest + 4-byte group id)."""
        key = self._pool.block_hash(self.block_id)
        return None if key is None else self._owner._vllm_key(bytes(key[0]), int(key[1]))

    def set_block_hash(self, block_hash: bytes, num_tokens: int | None = None) -> None:
        """vLLM's ``set_block_hash``: the block gets its key. kvcoord's keys
        live in the prefix index only, so the block is keyed there at once
        (the insert into ``cached_block_hash_to_block`` vLLM's callers make
        next finds it there). Refused for a block that has a key."""
        if self._pool.block_hash(self.block_id) is not None:
            raise BlockStateError(f"block {self.block_id} already has a cache key")
        self._owner._insert_key(self.block_id, block_hash, num_tokens)


class _PoolIndex(CachedBlockIndex):
    """``cached_block_hash_to_block`` of a :class:`BlockPool`: editable, with
    the pool's blocks as values and its key spelling."""

    __slots__ = ("_owner",)

    def __init__(self, owner: BlockPool) -> None:
        super().__init__(owner.pool, owner)
        self._owner = owner

    def _view(self, block_id: int) -> Any:
        return PoolBlock(self._owner, block_id)

    def _split(self, key: object) -> tuple[bytes, int]:
        digest, group_id = super()._split(key)
        return self._owner._core_digest(digest), group_id

    def _vllm_key(self, digest: bytes, group_id: int) -> bytes:
        return self._owner._vllm_key(digest, group_id)

    def _editable(self) -> Any:
        if self._owner._log is not None:
            # vLLM's dict edits record no KV-cache event; dropping keys would.
            raise NotImplementedError(
                "kvcoord: editing cached_block_hash_to_block with KV-cache events on"
            )
        return self._owner


class BlockPool(EventPoolView):
    """vLLM's ``BlockPool`` (same constructor, same answers), backed by a
    standalone :class:`kvcoord.BlockPool`.

    ``metrics_collector`` (vLLM's residency metrics) is not supported: pass
    None (kvcoord's own residency metrics are on the core pool,
    ``pool.enable_residency()``). ``medium`` is the medium its KV-cache
    events report.
    """

    __slots__ = (
        "_aliases",
        "_watchers",
        "enable_kv_cache_events",
        "medium",
        "metrics_collector",
        "num_hash_lookahead_tokens",
    )

    # What this class stands for, for the pytest plugin's rule
    # (kvcoord.vllm.testing._lending): vLLM's class, those of the objects it hands
    # out, and the names of their surface served here (to read or call).
    # Not served: metrics_collector (None only), cached_block_hashes_by_block,
    # cache_partial_block, move_block_hashes, vLLM's private helpers, the
    # free queue's edits (popleft, append, remove, ...), a block's reset_hash.
    vllm_class: ClassVar[str] = "vllm.v1.core.block_pool:BlockPool"
    # vLLM's class of each object handed out -> the one attribute that
    # hands it out ("": several calls do): a test that never reads that
    # attribute cannot use the object's names (the free queue's ``append``
    # is then a list's).
    vllm_hands_out: ClassVar[dict[str, str]] = {
        "vllm.v1.core.kv_cache_utils:KVCacheBlock": "",
        "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue": "free_block_queue",
        "vllm.v1.core.block_pool:BlockHashToBlockMap": "cached_block_hash_to_block",
    }
    vllm_needs: ClassVar[tuple[str, ...]] = ()
    vllm_serves: ClassVar[frozenset[str]] = frozenset(
        {
            # the pool
            "num_gpu_blocks",
            "enable_caching",
            "hash_block_size",
            "num_hash_lookahead_tokens",
            "enable_kv_cache_events",
            "medium",
            "blocks",
            "null_block",
            "free_block_queue",
            "cached_block_hash_to_block",
            "kv_event_queue",
            "get_new_blocks",
            "touch",
            "free_blocks",
            "is_block_writable",
            "unpin_blocks",
            "cache_full_blocks",
            "get_cached_block",
            "emit_cached_block_events",
            "_maybe_evict_cached_block",
            "evict_blocks",
            "reset_prefix_cache",
            "get_num_free_blocks",
            "get_usage",
            "take_events",
            # its blocks (PoolBlock)
            "block_id",
            "ref_cnt",
            "block_hash",
            "block_hash_num_tokens",
            "set_block_hash",
            "prev_free_block",
            "next_free_block",
            "is_null",
            # its free queue (FreeQueueView: inspection)
            "num_free_blocks",
            "fake_free_list_head",
            "fake_free_list_tail",
            "get_all_free_blocks",
            # its cache index (_PoolIndex)
            "_cache",
            "get_one_block",
            "contain",
            "insert",
            "pop",
        }
    )

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = _GPU,
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or isinstance(num_gpu_blocks, bool):
            raise ConfigError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if num_gpu_blocks < 1:
            raise ConfigError(f"num_gpu_blocks must be positive, got {num_gpu_blocks}")
        if metrics_collector is not None:
            raise NotImplementedError(
                "kvcoord.vllm.BlockPool: vLLM's metrics_collector is not supported "
                "(kvcoord's residency metrics: BlockPool.pool.enable_residency())"
            )
        pool = CorePool(
            num_gpu_blocks,
            enable_caching=bool(enable_caching),
            hash_block_size=int(hash_block_size),
            enable_events=bool(enable_kv_cache_events),
        )
        super().__init__(pool, None)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.metrics_collector = None
        self.num_hash_lookahead_tokens = int(num_hash_lookahead_tokens)
        self.medium = medium
        self._watchers: dict[int, Callable[[Any], None]] = {}
        self._aliases: dict[bytes, bytes] = {}  # stand-in digest -> vLLM's
        if self.enable_kv_cache_events:
            EventLog(pool, self, None, self.num_hash_lookahead_tokens, medium)

    # ---- allocation ----------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        """``num_blocks`` blocks from the front of the free queue, one
        reference each; a cached one loses its key (a ``BlockRemoved`` event).
        Raises ``ValueError`` (kvcoord's ``OutOfBlocksError``) when fewer are free."""
        ids = self.pool.get_new_blocks(num_blocks)
        if self._watchers:
            self._notify_reuse()
        return [PoolBlock(self, i) for i in ids]

    def touch(self, blocks: Iterable[Any]) -> None:
        """One more reference to each block (a free one leaves the free queue);
        the null block is skipped."""
        self.pool.touch(ids_of(blocks))

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Release one reference of each block, first = evicted first: those
        reaching zero go to the front of the free queue when uncached, to the
        back when cached (the core's rule, vLLM's order)."""
        self.pool.free_blocks(ids_of(ordered_blocks))

    def is_block_writable(self, block: Any) -> bool:
        """vLLM's test: not null, one reference, no cache key."""
        b = int(block.block_id)
        return b != 0 and int(self.pool.ref_counts()[b]) == 1 and self.pool.block_hash(b) is None

    def unpin_blocks(self, blocks: Iterable[Any], on_reuse: Callable[[Any], None]) -> None:
        """Release references while the contents stay readable: the blocks
        join the back of the free queue (the core's ``unpin_blocks``) and
        ``on_reuse(block)`` runs once when the pool hands one out again or a
        reset forgets it."""
        ids = ids_of(blocks)
        self.pool.unpin_blocks(ids)
        for b in ids:
            self._watchers[b] = on_reuse

    def _notify_reuse(self) -> None:
        for b in self.pool.take_reused_watched().tolist():
            watcher = self._watchers.pop(b, None)
            if watcher is not None:
                watcher(PoolBlock(self, b))

    # ---- the prefix cache ----------------------------------------------------

    def cache_full_blocks(
        self,
        request: Any,
        blocks: Sequence[Any],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Key ``blocks[num_cached_blocks:num_full_blocks]`` under ``request``'s
        block hashes in group ``kv_cache_group_id`` (null and masked-out
        blocks skipped); with events on, one ``BlockStored`` for the call.
        ``block_size`` must be the hash unit (``hash_block_size``)."""
        if num_cached_blocks >= num_full_blocks:
            return
        if block_size != self.pool.hash_block_size:
            raise InvalidArgumentError(
                f"block_size {block_size}: kvcoord.vllm.BlockPool caches blocks of one hash "
                f"unit ({self.pool.hash_block_size} tokens)"
            )
        entries = list(blocks[num_cached_blocks:num_full_blocks])
        if block_mask is not None and len(block_mask) != len(entries):
            raise InvalidArgumentError(
                f"block_mask has {len(block_mask)} entries for {len(entries)} new full blocks"
            )
        mask = [True] * len(entries) if block_mask is None else [bool(m) for m in block_mask]
        hashes = list(request.block_hashes[:num_full_blocks])
        mine = [isinstance(b, int) or self._is_mine(b) for b in entries]
        if not all(mine):
            if any(mine):
                raise NotImplementedError(
                    "kvcoord.vllm.BlockPool: caching this pool's blocks and block objects "
                    "it did not make in one call"
                )
            self._cache_detached(
                entries, mask, hashes, num_cached_blocks, block_size, kv_cache_group_id
            )
            return
        ids = [b if isinstance(b, int) else int(b.block_id) for b in entries]
        self.pool.cache_full_blocks(
            [0] * num_cached_blocks + ids,
            hashes,
            num_cached_blocks,
            num_full_blocks,
            kv_cache_group_id,
            None if block_mask is None else mask,
        )
        self._cached_by(request)

    def _is_mine(self, block: Any) -> bool:
        return isinstance(block, PoolBlock) and block._owner is self

    def _cache_detached(
        self,
        entries: list[Any],
        mask: list[bool],
        hashes: list[bytes],
        first: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """``cache_full_blocks`` of vLLM block objects a caller made: each
        one not flagged null nor masked out keys the pool's block of its id
        (a second key when that block has one) and, when the key is new to
        that block, gets it set on the object, as vLLM's pool does."""
        if self._log is not None:
            raise NotImplementedError(
                "kvcoord.vllm.BlockPool: caching block objects it did not make, with events on"
            )
        todo = []
        for i, (b, keep) in enumerate(zip(entries, mask, strict=True)):
            if b.is_null or not keep:
                continue
            if b.block_hash is not None:
                raise NotImplementedError(
                    f"kvcoord.vllm.BlockPool: caching a block object it did not make "
                    f"(block {b.block_id}) that already has a hash"
                )
            todo.append((b, hashes[first + i], (first + i + 1) * block_size))
        for b, digest, tokens in todo:
            key = self._vllm_key(digest, group_id)
            if self.pool.insert_key(int(b.block_id), digest, group_id):
                b.set_block_hash(key, num_tokens=tokens)

    # ---- keys set by hand (vLLM's index edits and set_block_hash) -------------

    def _core_digest(self, digest: bytes) -> bytes:
        """The digest the core stores for vLLM's ``digest`` (a stand-in,
        remembered, for a length the core does not keep)."""
        alias = _stand_in(digest)
        if alias is not digest:
            if self._log is not None:
                raise NotImplementedError(
                    f"kvcoord.vllm.BlockPool: a {len(digest)}-byte digest with events on "
                    f"(the core keeps 16- or 32-byte digests)"
                )
            self._aliases[alias] = digest
        return alias

    def _vllm_key(self, digest: bytes, group_id: int) -> bytes:
        """vLLM's key (digest + 4-byte big-endian group id) of a core key."""
        return self._aliases.get(digest, digest) + int(group_id).to_bytes(4, "big")

    def _insert_key(self, block_id: int, key: bytes, num_tokens: int | None = None) -> None:
        """Key ``block_id`` under vLLM's ``key`` (a second key if it has one)."""
        digest, group_id = _split_key(key)
        self.pool.insert_key(block_id, self._core_digest(digest), group_id, num_tokens)

    def insert_cache_key(self, digest: bytes, group_id: int, block_ids: Sequence[int]) -> None:
        """The index's edit: key each block under ``(digest, group_id)``."""
        for b in block_ids:
            self.pool.insert_key(int(b), digest, group_id)

    @property
    def cached_block_hash_to_block(self) -> _PoolIndex:
        """vLLM's index from key to cached blocks, built from the core on each
        use; its edits key blocks by hand (:meth:`insert_cache_key`) or drop
        their keys."""
        return _PoolIndex(self)

    @property
    def null_block(self) -> PoolBlock:
        return PoolBlock(self, 0)

    @property
    def blocks(self) -> list[BlockView]:
        """Every block, indexed by id (one object each: for inspection)."""
        return [PoolBlock(self, i) for i in range(self.pool.num_blocks)]

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[BlockView] | None:
        """One cached block per group (the first under the key), or None
        when any group misses."""
        digest = _stand_in(bytes(block_hash))
        found = self.pool.get_cached_block(digest, list(kv_cache_group_ids))
        return None if found is None else [PoolBlock(self, int(i)) for i in found]

    def emit_cached_block_events(
        self, request: Any, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """vLLM's events for a prefix hit: one ``BlockStored`` for the first
        ``num_cached_blocks`` blocks of ``request`` (nothing in the pool
        changes); nothing when events are off or the hit is empty."""
        if self._log is None or not num_cached_blocks:
            return
        self._log.prefix_stored(
            request, kv_cache_group_id, num_cached_blocks, block_size, self.pool.hash_block_size
        )

    def _maybe_evict_cached_block(self, block: Any) -> bool:
        """Drop ``block``'s cache keys (``BlockRemoved`` events); whether it had any."""
        b = int(block.block_id)
        if self.pool.block_hash(b) is None:
            return False
        self.pool.evict_blocks([b])
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False, a warning) while any
        block but the null block is in use."""
        done = bool(self.pool.reset_prefix_cache())
        if done and self._watchers:
            self._notify_reuse()
        return done

    def __repr__(self) -> str:
        return (
            f"kvcoord.vllm.BlockPool(num_gpu_blocks={self.pool.num_blocks}, "
            f"free={self.pool.num_free_blocks}, cached={self.pool.num_cached_blocks})"
        )
