"""The pools vLLM's ``HiSparseCoordinator`` and vLLM's HiSparse tests reach
through a kvcoord HiSparse manager (:mod:`kvcoord.vllm.hisparse._manager`).

Two kvcoord cores hold a HiSparse configuration: the host core (the source
group, on a pool of ``hisparse_host_num_blocks`` blocks) and the device core
(every other group, on the device pool). Their block objects are
:class:`~kvcoord.vllm.serve._blocks.BlockView`\\ s, one per pool and id, kept by a
:class:`ViewCache` so that the same block is the same object wherever it is
read (vLLM's tests compare blocks by identity). A view's pool decides which
core a free goes to, as vLLM's blocks carry the pool they came from.

* :class:`HostPoolView`: the source manager's ``block_pool`` (vLLM's
  ``BlockPool`` API over the host core: touch, free, get_new_blocks,
  cache_full_blocks, evict_blocks...).
* :class:`DevicePoolView`: the manager's ``block_pool``. Handing blocks out
  (``get_new_blocks``) reports the unpinned blocks it reused to the
  callbacks ``unpin_blocks`` registered, as vLLM's pool does.
* :class:`ResidentPoolView`: a resident group's ``block_pool``: ``touch`` is
  the core's ``touch_resident_blocks``, ``unpin_blocks`` its
  ``unpin_resident_block`` (the callback kept until the core reports the
  block reused), ``free_blocks`` releases caller references.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvcoord.vllm.serve._blocks import BlockView, ids_of
from kvcoord.vllm.serve._pool_view import PoolView

__all__ = ["DevicePoolView", "HostPoolView", "ResidentPoolView", "ViewCache", "Watchers"]


class ViewCache:
    """One :class:`BlockView` per block id of one pool, made on first use."""

    __slots__ = ("_views", "pool")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._views: dict[int, BlockView] = {}

    def __call__(self, block_id: int) -> BlockView:
        view = self._views.get(block_id)
        if view is None:
            view = self._views[block_id] = BlockView(self.pool, int(block_id))
        return view

    def many(self, ids: Iterable[int]) -> list[BlockView]:
        return [self(int(i)) for i in ids]


class Watchers:
    """The reuse callbacks of unpinned device blocks (vLLM's pool keeps them
    per block): fired, and dropped, when the device core reports the block
    handed out again (``take_reused_watched``) after a call that hands blocks
    out."""

    __slots__ = ("_callbacks", "_core", "_views")

    def __init__(self, core: Any, views: ViewCache) -> None:
        self._core = core
        self._views = views
        self._callbacks: dict[int, Callable[[Any], None]] = {}

    def watch(self, block_id: int, callback: Callable[[Any], None]) -> None:
        self._callbacks[block_id] = callback

    def fire(self) -> None:
        """Call the callbacks of the blocks reused since the last call."""
        reused = self._core.take_reused_watched()
        for b in reused:
            callback = self._callbacks.pop(int(b), None)
            if callback is not None:
                callback(self._views(int(b)))


def _split(blocks: Iterable[Any], pool: Any) -> tuple[list[int], list[Any]]:
    """Ids of the blocks of ``pool`` and the block views of other pools, in order."""
    mine: list[int] = []
    others: list[Any] = []
    for b in blocks:
        other = getattr(b, "_pool", None)
        if other is not None and other is not pool:
            others.append(b)
        else:
            mine.append(int(b) if isinstance(b, int) else int(b.block_id))
    return mine, others


class _CachedPoolView(PoolView):
    """A pool view whose block objects come from a :class:`ViewCache`; its
    core's events are queued (``log``) right after each call."""

    __slots__ = ("_views", "log", "other")

    #: vLLM's residency sampler of the pool: none here (the manager feeds
    #: vLLM's collector from the core; see ``serve._residency_metrics``).
    metrics_collector: Any = None

    def __init__(self, pool: Any, core: Any, views: ViewCache) -> None:
        super().__init__(pool, core)
        self._views = views
        #: The other core's pool view, for blocks of that pool freed here.
        self.other: _CachedPoolView | None = None
        #: The event log of this view's core (None without events).
        self.log: Any = None

    def _queued(self, request: Any = None) -> None:
        if self.log is not None:
            self.log.drain(request)

    @property
    def null_block(self) -> BlockView:
        return self._views(0)

    @property
    def blocks(self) -> list[BlockView]:
        return self._views.many(range(int(self.pool.num_blocks)))

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        got = self._views.many(self._core.get_caller_blocks(num_blocks))
        self._queued()
        return got

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        super().evict_blocks(block_ids)
        self._queued()

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()
        self._queued()
        return done

    def _cached_by(self, request: Any) -> None:
        self._queued(request)

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        """Release one reference of each block, first = evicted first; a
        block of the other core's pool goes to that pool (vLLM routes a
        block to the pool it came from)."""
        mine, others = _split(ordered_blocks, self.pool)
        if others and self.other is not None:
            self.other.free_blocks(others)
        if mine:
            super().free_blocks(mine)

    def touch(self, blocks: Iterable[Any]) -> None:
        """vLLM's ``touch``: one more reference each (the caller's), taking
        free blocks out of the free queue; null blocks are skipped."""
        ids = [i for i in ids_of(blocks) if i]
        if ids:
            self._core.touch_caller_blocks(ids)


class HostPoolView(_CachedPoolView):
    """The source group's host pool with vLLM's ``BlockPool`` API."""

    __slots__ = ()


class DevicePoolView(_CachedPoolView):
    """The device pool with vLLM's ``BlockPool`` API; handing blocks out fires
    the reuse callbacks of unpinned blocks."""

    __slots__ = ("watchers",)

    def __init__(self, pool: Any, core: Any, views: ViewCache, watchers: Watchers) -> None:
        super().__init__(pool, core, views)
        self.watchers = watchers

    def get_new_blocks(self, num_blocks: int) -> list[BlockView]:
        got = super().get_new_blocks(num_blocks)
        self.watchers.fire()
        return got

    def reset_prefix_cache(self) -> bool:
        done = super().reset_prefix_cache()
        self.watchers.fire()
        return done


class ResidentPoolView:
    """A resident group's ``block_pool``: the device pool, with vLLM's
    HiSparse reference calls mapped onto the core's resident accounting."""

    __slots__ = ("_device", "_group")

    def __init__(self, device: DevicePoolView, core_group: int) -> None:
        self._device = device
        self._group = core_group

    def touch(self, blocks: Iterable[Any]) -> None:
        ids = [i for i in ids_of(blocks) if i]
        if ids:
            self._device._core.touch_resident_blocks(self._group, ids)

    def unpin_blocks(self, blocks: Iterable[Any], on_reuse: Callable[[Any], None]) -> None:
        """Give up one reference of each block; the block stays readable and
        ``on_reuse`` fires when the pool hands it out again."""
        core = self._device._core
        for b in ids_of(blocks):
            core.unpin_resident_block(self._group, b)
            self._device.watchers.watch(b, on_reuse)

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        self._device.free_blocks(ordered_blocks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._device, name)
