"""Views of a kvcoord HiSparse manager's groups with the surface of vLLM's
single-type managers, so that vLLM's own ``HiSparseCoordinator`` (built by
``get_hisparse_coordinator(manager)`` from
``manager.coordinator.single_type_managers``, recognising the groups by
``isinstance``) runs over kvcoord unchanged.

The source, resident and hot views are registered as virtual subclasses of
vLLM's ``HiSparseSourceManager``, ``HiSparseResidentManager`` and
``HiSparseHotManager`` (ABCs); nothing of vLLM's managers is built. Every
method maps onto a call of one of the two cores (see
:mod:`kvcoord.vllm._hisparse_manager`): the row state, the hot-region
demand and the reference accounting are the core's.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcoord.errors import UnknownRequestError
from kvcoord.vllm._blocks import BlockView, EmptyKVCacheBlocks, KVCacheBlocks, _as_list, ids_of
from kvcoord.vllm._views import _CachedCounts, _RequestTables

if TYPE_CHECKING:
    from kvcoord.vllm._hisparse_manager import HiSparseManager

__all__ = ["EmptySplitBlocks", "SplitBlocks", "coordinator_class", "group_views"]


class _Tables(_RequestTables):
    """``req_to_blocks`` of one group (vLLM group id ``group``) on the pool
    holding it (host or device): request id -> the table's block objects,
    read from the core on each access."""

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _GroupView:
    """What vLLM's coordinators and the HiSparse coordinator read of one
    single-type manager."""

    coordinator: Any = None
    dcp_world_size = 1
    pcp_world_size = 1
    use_eagle = False
    retains_longer_hit = False

    def __init__(self, manager: HiSparseManager, group: int, spec: Any, pool: Any) -> None:
        self._manager = manager
        self.kv_cache_group_id = group
        self.kv_cache_spec = spec
        self.block_size = int(spec.block_size)
        self.block_pool = pool
        self.enable_caching = manager.enable_caching and group < 2
        views = manager._host_views if group == 0 else manager._device_views
        self._views = views
        self.req_to_blocks = _Tables(manager, group, views.pool)
        self.num_cached_block = _CachedCounts(self.req_to_blocks)

    @property
    def _core_group(self) -> int:
        """The group's id in the device core."""
        return self.kv_cache_group_id - 1


class SourceView(_GroupView):
    """vLLM's ``HiSparseSourceManager``: the host core's only group."""

    retains_longer_hit = True
    records_new_block_ids = False

    def bind_host_pool(self, num_blocks: int) -> None:
        """The host pool exists from construction (its size checked here)."""
        if num_blocks != int(self.block_pool.num_gpu_blocks):
            raise ValueError(
                f"host pool of {self.block_pool.num_gpu_blocks} blocks, asked for {num_blocks}"
            )

    def take_new_block_ids(self) -> list[int]:
        return []

    def take_pending_cow_copies(self) -> list[Any]:
        return []

    def take_host_cow_copies(self) -> list[Any]:
        """The host core's copy-on-write pairs since the last call, as
        ``(source, copy)`` blocks, both ends held until the connector's
        release frees them. A served shape makes none: its hits end on
        scheduler blocks (sub-block hits need a Mamba "align" group, which
        vLLM's HiSparse shape has not), docs/hisparse.md."""
        pairs = self._manager._host_core.take_block_copies()
        return [(self._views(src), self._views(dst)) for src, dst in pairs]

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Any],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """0, or the device pool's size plus one when the host pool cannot
        back the request's new pages (vLLM's admission sentinel)."""
        manager = self._manager
        mine = manager._requests.peek(request_id)
        hits = ids_of(new_computed_blocks)
        return manager._host_prediction(
            mine, num_tokens, hits, total_computed_tokens, num_local_computed_tokens
        )

    def publish_blocks(
        self,
        request: Any,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Cache (publish) the request's host blocks up to ``num_tokens``."""
        self._manager._publish(request, num_tokens)


class IndexerView(_GroupView):
    """A device full-attention group (the indexer)."""


class ResidentView(_GroupView):
    """vLLM's ``HiSparseResidentManager`` over the device core's row state."""

    @property
    def max_admission_blocks_per_request(self) -> int:
        """The core's cap of the group (the in-flight window's pages)."""
        m = self._manager
        cap = m._pair.max_admission_blocks(self.kv_cache_group_id, m.max_in_flight_tokens)
        if cap is None:  # not a resident group: the core names no cap
            raise TypeError(f"group {self.kv_cache_group_id} is not a HiSparse resident group")
        return int(cap)

    def _block(self, block_id: int | None) -> BlockView | None:
        return None if block_id is None else self._views(int(block_id))

    def get_resident_page(self, request_id: str, block_idx: int) -> BlockView | None:
        core = self._manager._core
        try:
            got = core.resident_page(request_id, self._core_group, block_idx)
        except UnknownRequestError:
            return None
        return self._block(got)

    def get_residency_row(self, request_id: str, start: int = 0) -> list[BlockView]:
        core = self._manager._core
        try:
            row = core.residency_row(request_id, self._core_group, start)
        except UnknownRequestError:
            return []
        return self._views.many(row)

    def adopt_resident_page(self, request_id: str, block_idx: int, block: Any) -> bool:
        core = self._manager._core
        try:
            return bool(
                core.adopt_resident_page(
                    request_id, self._core_group, block_idx, int(block.block_id)
                )
            )
        except UnknownRequestError:
            return False

    def drop_resident_page(self, request_id: str, block_idx: int) -> BlockView | None:
        core = self._manager._core
        try:
            got = core.drop_resident_page(request_id, self._core_group, block_idx)
        except UnknownRequestError:
            return None
        return self._block(got)


class _HotRequired:
    """``hot_required`` of a hot group: the requests the core holds a
    hot-region demand for (membership and ``add`` only)."""

    def __init__(self, view: HotView) -> None:
        self._view = view

    def __contains__(self, request_id: object) -> bool:
        if not isinstance(request_id, str):
            return False
        return self._view._manager._hot_demanded(request_id, self._view._core_group)

    def add(self, request_id: str) -> None:
        self._view.require_hot(request_id)


class HotView(_GroupView):
    """vLLM's ``HiSparseHotManager`` over the device core's hot regions."""

    def __init__(self, manager: HiSparseManager, group: int, spec: Any, pool: Any) -> None:
        super().__init__(manager, group, spec, pool)
        self.blocks_per_request = int(spec.blocks_per_request)
        self.hot_required = _HotRequired(self)

    def require_hot(self, request_id: str) -> None:
        self._manager._require_hot(request_id, self._core_group)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int
    ) -> list[BlockView]:
        """vLLM's call on its own: grow the hot region when it is asked for."""
        manager = self._manager
        got = manager._core.allocate_hot(request_id, self._core_group)
        manager._watchers.fire()
        return self._views.many(got)

    def has_hot(self, request_id: str) -> bool:
        try:
            return bool(self._manager._core.has_hot(request_id, self._core_group))
        except UnknownRequestError:
            return False


class SplitBlocks(KVCacheBlocks):
    """``KVCacheBlocks`` whose groups live in different pools: ``_pool`` is
    one :class:`~kvcoord.vllm._hisparse_pools.ViewCache` per group."""

    __slots__ = ()

    @property
    def blocks(self) -> tuple[list[Any], ...]:
        return tuple(views.many(_as_list(g)) for views, g in zip(self._pool, self.ids, strict=True))

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        out = []
        for views, g in zip(self._pool, self.ids, strict=True):
            ids = _as_list(g)
            cached = views.pool.cached_mask() if ids else None
            out.append([i for i in ids if i and not (cached is not None and cached[i])])
        return out

    def new_empty(self) -> KVCacheBlocks:
        return EmptySplitBlocks(tuple(() for _ in self.ids), self._pool)

    def __add__(self, other: Any) -> KVCacheBlocks:
        other_ids = other.ids if isinstance(other, KVCacheBlocks) else other.blocks
        return SplitBlocks(
            tuple(_as_list(a) + ids_of(b) for a, b in zip(self.ids, other_ids, strict=True)),
            self._pool,
        )


class EmptySplitBlocks(SplitBlocks, EmptyKVCacheBlocks):
    """No block in any group (the HiSparse manager's ``empty_kv_cache_blocks``)."""

    __slots__ = ()


_COORDINATOR_CLASSES: dict[str, type] = {}


def coordinator_class(base: type) -> type:
    """The coordinator view of a HiSparse manager: ``base`` (named, and
    registered, after vLLM's coordinator class) with per-group lookups whose
    blocks come from each group's own pool."""

    def find_longest_cache_hit_per_group(
        self: Any, block_hashes: Any, max_cache_hit_length: int
    ) -> tuple[tuple[list[Any], ...], tuple[int, ...]]:
        manager = self._manager
        probe = manager._requests.probe(block_hashes)
        blocks, hits = manager.find_hits_per_group(probe, max_cache_hit_length)
        return blocks.blocks, hits

    def get_num_blocks_to_allocate(
        self: Any,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any,
        num_encoder_tokens: int = 0,
        total_computed_tokens: int = 0,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        manager = self._manager
        groups = tuple(ids_of(g) for g in new_computed_blocks)
        return int(
            manager._predict(
                manager._requests.peek(request_id),
                num_tokens,
                groups if any(groups) else (),
                total_computed_tokens,
                num_encoder_tokens,
                apply_admission_cap,
                num_local_computed_tokens,
                num_tokens_main_model=num_tokens_main_model,
                prefill_end=prefill_end,
            )
        )

    known = _COORDINATOR_CLASSES.get(base.__qualname__)
    if known is not None and known.__bases__ == (base,):
        return known
    cls = _COORDINATOR_CLASSES[base.__qualname__] = type(
        base.__name__,
        (base,),
        {
            "__doc__": base.__doc__,
            "find_longest_cache_hit_per_group": find_longest_cache_hit_per_group,
            "get_num_blocks_to_allocate": get_num_blocks_to_allocate,
        },
    )
    return cls


@functools.cache
def _registered() -> dict[str, type[_GroupView]]:
    """The view classes, each registered once as a virtual subclass of the
    vLLM manager class it stands for."""
    managers: Any = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    out: dict[str, type[_GroupView]] = {}
    for name, cls in (
        ("HiSparseSourceManager", SourceView),
        ("HiSparseResidentManager", ResidentView),
        ("HiSparseHotManager", HotView),
        ("FullAttentionManager", IndexerView),
    ):
        getattr(managers, name).register(cls)
        out[name] = cls
    return out


def group_views(manager: HiSparseManager) -> list[_GroupView]:
    """One view per vLLM group of ``manager``'s configuration, in order."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    classes = _registered()
    out: list[_GroupView] = []
    for g, group in enumerate(manager.kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if g == 0:
            out.append(classes["HiSparseSourceManager"](manager, g, spec, manager._host_block_pool))
        elif type(spec) is interface.HiSparseResidentSpec:
            pool = manager._resident_pool(g - 1)
            out.append(classes["HiSparseResidentManager"](manager, g, spec, pool))
        elif type(spec) is interface.HiSparseHotSpec:
            out.append(classes["HiSparseHotManager"](manager, g, spec, manager.block_pool))
        else:
            out.append(classes["FullAttentionManager"](manager, g, spec, manager.block_pool))
    return out
