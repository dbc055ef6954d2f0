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

Blocks come back as :class:`~kvcoord.vllm._blocks.BlockView` objects, which
read their reference count, key and free-queue links from the core. The
pool accepts them, plain ids, or any object with a ``block_id`` taken from
this pool; vLLM's ``is_null`` flag of an object is honoured (a null object
is skipped as vLLM skips it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvcoord._core import BlockPool as CorePool
from kvcoord.errors import ConfigError, InvalidArgumentError
from kvcoord.vllm._blocks import BlockView, ids_of
from kvcoord.vllm._events import EventLog, EventPoolView

__all__ = ["BlockPool"]

_GPU = "GPU"  # vLLM's MEDIUM_GPU


def _range_ids(blocks: Sequence[Any], lo: int, hi: int) -> tuple[list[int], list[bool]]:
    """Ids of ``blocks[lo:hi]`` (the only entries vLLM's caching reads) and,
    per entry, whether vLLM would cache it (False for a null block)."""
    ids: list[int] = []
    live: list[bool] = []
    for b in blocks[lo:hi]:
        if isinstance(b, int):
            ids.append(b)
            live.append(b != 0)
        else:
            ids.append(int(b.block_id))
            live.append(not b.is_null)
    return ids, live


class BlockPool(EventPoolView):
    """vLLM's ``BlockPool`` (same constructor, same answers), backed by a
    standalone :class:`kvcoord.BlockPool`.

    ``metrics_collector`` (vLLM's residency metrics) is not supported: pass
    None (kvcoord's own residency metrics are on the core pool,
    ``pool.enable_residency()``). ``medium`` is the medium its KV-cache
    events report.
    """

    __slots__ = (
        "_watchers",
        "enable_kv_cache_events",
        "medium",
        "metrics_collector",
        "num_hash_lookahead_tokens",
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
        super().__init__(pool, None, None)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.metrics_collector = None
        self.num_hash_lookahead_tokens = int(num_hash_lookahead_tokens)
        self.medium = medium
        self._watchers: dict[int, Callable[[Any], None]] = {}
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
        return [BlockView(self.pool, i) for i in ids]

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
                watcher(BlockView(self.pool, b))

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
        ids, live = _range_ids(blocks, num_cached_blocks, num_full_blocks)
        if block_mask is not None:
            if len(block_mask) != len(ids):
                raise InvalidArgumentError(
                    f"block_mask has {len(block_mask)} entries for {len(ids)} new full blocks"
                )
            live = [bool(m) and v for m, v in zip(block_mask, live, strict=True)]
        hashes = list(request.block_hashes[:num_full_blocks])
        self.pool.cache_full_blocks(
            [0] * num_cached_blocks + ids,
            hashes,
            num_cached_blocks,
            num_full_blocks,
            kv_cache_group_id,
            None if all(live) else live,
        )
        self._cached_by(request)

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
