"""vLLM 0.33.0's HiSparse configurations on two kvcoord cores (off with
``KVCOORD_VLLM_HISPARSE=0``, see :mod:`kvcoord.vllm.serve._hisparse_support`).

A HiSparse configuration's source group (group 0, role ``hisparse_source``)
keeps its blocks on a private host pool of ``hisparse_host_num_blocks``
blocks; every other group (the indexer, resident and hot groups) shares the
device pool. :class:`HiSparseManager` holds them on two cores: the *host
core* (one full-attention group on the host pool) and the *device core*
(the other groups, the kinds ``HiSparseResident`` / ``HiSparseHot`` among
them, on the device pool), and composes each of vLLM's manager calls from
the two, group 0 first as vLLM's coordinator runs its managers:

* lookups: the host group and the indexer each search their own pool; the
  hit is the shorter, and the host group keeps its longer hit in the
  returned blocks (vLLM's ``retains_longer_hit``);
* admission: the host group counts 0 against the device pool, or the
  device pool's size plus one (a sure refusal) when the host pool cannot
  back the request's new pages (the core's ``HiSparsePair`` counts it);
* allocation, freeing and the deferred free change both cores in one
  transaction of the core's ``HiSparsePair``: both change, or neither;
* caching: the host group never caches on allocation; it hands vLLM's
  ``HiSparseCoordinator`` a pending publication (``publish_when_ready``),
  which publishes (the source view's ``publish_blocks``: the host core's
  ``cache_blocks`` up to a token count) only the pages whose host copies are
  durable;
* the coordinator's hooks run where vLLM's managers call them
  (``commit_computed_blocks`` on a new request's adoption,
  ``record_pending_host_import`` for its external tokens, ``free`` before
  the request's blocks go), and the reuse callbacks of unpinned device
  blocks fire right after each call that hands device blocks out.

vLLM's ``HiSparseCoordinator`` itself runs unchanged over the group views of
:mod:`kvcoord.vllm.hisparse._group_views`; no vLLM pool or manager is built.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import numpy as np

from kvcoord._arith import cdiv
from kvcoord._core import HiSparsePair
from kvcoord.config import FullAttentionSpec, KVCacheConfig, KVCacheGroup
from kvcoord.coordinator import get_kv_cache_coordinator, shared_prefix_boundary
from kvcoord.errors import UnknownRequestError
from kvcoord.vllm.hisparse._group_views import (
    EmptySplitBlocks,
    HiSparseReads,
    SplitBlocks,
    group_views,
)
from kvcoord.vllm.hisparse._pools import (
    DevicePoolView,
    HostPoolView,
    ResidentPoolView,
    ViewCache,
    Watchers,
)
from kvcoord.vllm.serve._blocks import KVCacheBlocks, ids_of
from kvcoord.vllm.serve._construct import bind_args
from kvcoord.vllm.serve._events import EventLog, event_metadata
from kvcoord.vllm.serve._hisparse_support import device_config, is_hisparse
from kvcoord.vllm.serve._views import coordinator_view
from kvcoord.vllm.serve.manager import KVCacheManager

__all__ = ["HiSparseManager"]

_EMPTY = np.zeros(0, dtype=np.int32)


class HiSparseManager(KVCacheManager, serves=is_hisparse):
    """vLLM's ``KVCacheManager`` for a HiSparse configuration, on a host core
    and a device core (see the module docstring)."""

    _group_id_base = 1  # the device core's groups are vLLM's groups 1..

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        a = bind_args(args, kwargs)
        cfg = a["kv_cache_config"]
        super().__init__(**{**a, "kv_cache_config": device_config(cfg)})
        self.kv_cache_config = cfg
        self.num_kv_cache_groups = len(cfg.kv_cache_groups)
        self._scheduler_block_size = int(a["scheduler_block_size"])
        source = cfg.kv_cache_groups[0]
        bs = int(source.kv_cache_spec.block_size)
        host_config = KVCacheConfig(
            num_blocks=int(cfg.hisparse_host_num_blocks),
            groups=(KVCacheGroup(FullAttentionSpec(block_size=bs), tuple(source.layer_names)),),
        )
        # The host group caches exactly what the coordinator publishes (its
        # hybrid rule, applied here: no re-prefillable tail held back).
        self._host_coordinator = get_kv_cache_coordinator(
            host_config,
            max_model_len=self.max_model_len,
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
            allow_partial_hits=True,
            verify_hits=False,
            enable_events=self.enable_kv_cache_events,
            event_medium="CPU",
        )
        self._host_core = self._host_coordinator.core
        self._host_pool = self._host_coordinator.block_pool
        # The calls that change both cores go through the pair, each one
        # transaction (both cores change, or neither).
        self._pair = HiSparsePair(self._host_core, self._core)
        self._host_views = ViewCache(self._host_pool)
        self._device_views = ViewCache(self._pool)
        self._watchers = Watchers(self._core, self._device_views)
        self._device_block_pool = DevicePoolView(
            self._pool, self._core, self._device_views, self._watchers
        )
        self.block_pool = self._device_block_pool
        self._host_block_pool = HostPoolView(self._host_pool, self._host_core, self._host_views)
        # Events: both cores' go into the device pool's queue (as vLLM's host
        # pool shares the device pool's), each core's drained right after
        # each call on it, so the queue keeps the order they happened in.
        self._host_events: EventLog | None = None
        if self._events is not None:
            self._events.metadata = event_metadata(cfg)
            device_log = self._events
            self._host_events = EventLog(
                self._host_core, device_log.view, cfg, int(a.get("num_hash_lookahead_tokens", 0))
            )
            device_log.view._log = device_log
        self._host_block_pool.log = self._host_events
        self._device_block_pool.log = self._events
        self._device_block_pool.other = self._host_block_pool
        self._host_block_pool.other = self.block_pool
        self._resident_pools: dict[int, ResidentPoolView] = {}
        self._block_sizes = (bs, *self._block_sizes)
        self._whole_table_groups = tuple(g + 1 for g in self._whole_table_groups)
        self._group_views = (self._host_views,) + (self._device_views,) * (
            self.num_kv_cache_groups - 1
        )
        self.retained_hit_group_ids = (0,)
        # No decode fast path: every step goes through both cores.
        self._rooms = False
        self._decode_fixed = None
        self._decode_room.clear()
        self.empty_kv_cache_blocks = EmptySplitBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups)), self._group_views
        )
        # The fast path answers nothing here (no decode rooms): every call
        # reaches _allocate; it still compares against this manager's empty.
        self._init_fast_path(
            self._decode_room, self.empty_kv_cache_blocks, None, KVCacheBlocks, self._pool
        )
        # The coordinator's view reads this manager through HiSparseReads,
        # over one view per vLLM group (what vLLM's HiSparseCoordinator finds).
        reads = HiSparseReads(self)
        self.coordinator = coordinator_view(
            self, self._core_coordinator, a, reads, group_views(reads)
        )

    # ---- the two cores ---------------------------------------------------

    def _resident_pool(self, core_group: int) -> ResidentPoolView:
        pool = self._resident_pools.get(core_group)
        if pool is None:
            pool = self._resident_pools[core_group] = ResidentPoolView(
                self._device_block_pool, core_group
            )
        return pool

    def _hisparse(self) -> Any:
        """vLLM's ``HiSparseCoordinator`` bound to this manager's views (None
        before ``get_hisparse_coordinator`` built it)."""
        views: Any = self.coordinator.single_type_managers
        return views[0].coordinator

    def _device_held(self, request_id: str) -> tuple[Any, ...] | None:
        try:
            blocks = self._core.blocks(request_id)
        except UnknownRequestError:
            return None
        return tuple(blocks.arrays())

    def _held(self, request_id: str) -> tuple[Any, ...] | None:
        device = self._device_held(request_id)
        try:
            host = self._host_core.blocks(request_id).arrays()[0]
        except UnknownRequestError:
            host = None
        if device is None and host is None:
            return None
        if device is None:
            device = tuple(_EMPTY for _ in range(self.num_kv_cache_groups - 1))
        return (_EMPTY if host is None else host, *device)

    def create_kv_cache_blocks(self, blocks: Any) -> KVCacheBlocks:
        if not any(len(g) for g in blocks):
            return self.empty_kv_cache_blocks
        return SplitBlocks(tuple(ids_of(g) for g in blocks), self._group_views)

    def _require_hot(self, request_id: str, core_group: int) -> None:
        with contextlib.suppress(UnknownRequestError):
            self._core.require_hot(request_id, core_group)

    def _hot_demanded(self, request_id: str, core_group: int) -> bool:
        try:
            return bool(self._core.hot_required(request_id, core_group))
        except UnknownRequestError:
            return False

    def _host_prediction(
        self,
        mine: Any,
        num_tokens: int,
        hits: list[int],
        total_computed: int,
        num_local: int | None = None,
    ) -> int:
        """The source group's admission count (the core's: 0, or the device
        pool's size plus one when the host pool cannot back the new pages).
        ``num_local`` of ``total_computed`` are local: a hit ending inside a
        block there needs its copy-on-write block."""
        return int(
            self._pair.host_admission_blocks(
                mine, num_tokens, hits or None, total_computed, num_local
            )
        )

    def _predict(
        self,
        mine: Any,
        num_tokens: int,
        hits: tuple[list[int], ...],
        total_computed: int,
        num_encoder_tokens: int = 0,
        admission: bool = False,
        num_local: int | None = None,
        *,
        num_tokens_main_model: int | None = None,
        prefill_end: int | None = None,
    ) -> int:
        """Both cores' prediction (the core's ``HiSparsePair``); ``num_local``
        of ``total_computed`` are local (the rest an import, which the
        HiSparse groups tell apart);
        ``num_tokens_main_model`` of ``num_tokens`` are not speculative;
        ``prefill_end``: where the prefill ends (default: the request's own)."""
        return int(
            self._pair.num_blocks_to_allocate(
                mine,
                num_tokens,
                list(hits[0]) if hits else None,
                [list(g) for g in hits[1:]] if hits else None,
                total_computed,
                num_encoder_tokens,
                self.max_in_flight_tokens if admission else None,
                num_local,
                num_tokens_main_model,
                prefill_end,
            )
        )

    # ---- lookups ---------------------------------------------------------

    def get_computed_blocks(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The host group's hit, then the indexer's up to it: the hit is the
        indexer's; the host group keeps its longer one."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        max_cache_hit_length = min(
            max_cache_hit_length, len(request.block_hashes) * self.hash_block_size
        )
        mine = self._requests.get(request)
        host, host_hit, _ = self._host_coordinator.find_longest_cache_hit(
            mine, max_cache_hit_length
        )
        device, hit, uncached = self._core_coordinator.find_longest_cache_hit(mine, host_hit)
        groups = (*host.arrays(), *device.arrays())
        boundary = shared_prefix_boundary(hit, uncached + host_hit - hit)
        return self.create_kv_cache_blocks(groups), hit, boundary

    def find_hits_per_group(self, mine: Any, max_length: int) -> tuple[Any, tuple[int, ...]]:
        """Each group's own longest hit: the host group's in the host pool,
        the device groups' in the device pool (resident and hot: none)."""
        limit = min(max_length, mine.num_block_hashes * self.hash_block_size)
        host, host_hit, _ = self._host_coordinator.find_longest_cache_hit(mine, limit)
        per_group = getattr(self._core_coordinator, "find_longest_cache_hit_per_group", None)
        if per_group is None:  # caching off: no group has a hit
            n = self.num_kv_cache_groups - 1
            device: tuple[Any, ...] = tuple(_EMPTY for _ in range(n))
            hits: tuple[int, ...] = (0,) * n
        else:
            blocks, hits = per_group(mine, limit)
            device = tuple(blocks.arrays())
        return SplitBlocks((*host.arrays(), *device), self._group_views), (host_hit, *hits)

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        return (*self.get_computed_blocks(request, max_cache_hit_length), False)

    # ---- allocation ------------------------------------------------------

    def _allocate(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: Any,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
        num_encoder_tokens: int,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
        has_scheduled_reqs: bool,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        external = num_external_computed_tokens
        if num_new_tokens == 0 and external == 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        groups: tuple[list[int], ...] = ()
        if new_computed_blocks is not None and new_computed_blocks is not (
            self.empty_kv_cache_blocks
        ):
            source = (
                new_computed_blocks.ids
                if isinstance(new_computed_blocks, KVCacheBlocks)
                else new_computed_blocks.blocks
            )
            if any(len(g) for g in source):
                groups = tuple(ids_of(g) for g in source)
        rid = request.request_id
        bs = self._block_sizes[0]
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total = min(num_local + external, self.max_model_len)
        # The host group keeps the blocks of its (longer) hit that the hit
        # and the external tokens cover together (vLLM's retained hit).
        host_hits = groups[0][: cdiv(num_new_computed_tokens + external, bs)] if groups else []
        device_hits = groups[1:] if groups else ()
        any_hit = bool(host_hits) or any(device_hits)
        watermark = 0
        if self.watermark_blocks and has_scheduled_reqs:
            status = importlib.import_module("vllm.v1.request").RequestStatus
            if request.status in (status.WAITING, status.PREEMPTED):
                watermark = self.watermark_blocks
        mine = self._requests.get(request)
        free = int(self._pool.num_free_blocks)
        hits = (host_hits, *device_hits) if any_hit else ()
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            needed = self._predict(mine, full, hits, total, num_encoder_tokens, True, num_local)
            if needed + watermark > free:
                return None
        need = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        needed = self._predict(
            mine, need, hits, num_local + external, num_encoder_tokens, False, num_local
        )
        if needed + watermark > free - reserved_blocks:
            return None
        fresh = self._device_held(rid) is None
        self._drain_device(None)
        # Both cores allocate, or neither (the source group publishes through
        # the coordinator; the device groups are cached below, after it).
        both = self._pair.allocate_slots(
            mine,
            num_new_tokens,
            num_new_computed_tokens,
            host_hits if host_hits else None,
            [list(g) for g in device_hits] if any(device_hits) else None,
            num_lookahead_tokens,
            num_encoder_tokens,
            True,
            external,
        )
        self._drain_host(request)
        self._drain_device(request)
        if both is None:
            return None
        coordinator = self._hisparse()
        if coordinator is not None and fresh and external > 0:
            coordinator.record_pending_host_import(rid, num_local + external)
        num_tokens = mine.num_tokens
        if coordinator is not None and fresh and (any_hit or external > 0):
            for _ in coordinator.resident_managers:  # vLLM: once per resident group
                coordinator.commit_computed_blocks(rid, cdiv(num_local, bs))
        self._watchers.fire()
        cached_to = min(total + num_new_tokens, num_tokens)
        if not delay_cache_blocks and self.enable_caching:
            # vLLM caches group by group: the source group first.
            self._publish_when_ready(request, cached_to)
            self._core.cache_blocks(mine, cached_to)
            self._drain_device(request)
        new = tuple(both.get_block_ids())
        if not any(new):
            return self.empty_kv_cache_blocks
        return SplitBlocks(new, self._group_views)

    # ---- caching ---------------------------------------------------------

    def _publish_when_ready(self, request: Any, num_tokens: int) -> None:
        """vLLM's caching of the source group: a pending publication for the
        coordinator, which publishes the durable prefix (vLLM's hybrid rule:
        the scheduler-block-aligned tokens)."""
        coordinator = self._hisparse()
        if not self.enable_caching or coordinator is None:
            return
        sbs = self._scheduler_block_size
        boundaries = importlib.import_module("vllm.v1.core.kv_cache_coordinator").replay_boundaries(
            request.num_prompt_tokens, sbs, use_eagle=False
        )
        coordinator.publish_when_ready(
            request,
            num_tokens // sbs * sbs,
            getattr(self.kv_cache_config, "prefix_cache_retention_interval", None),
            replay_boundaries=boundaries,
        )

    def _publish(self, request: Any, num_tokens: int) -> None:
        """The source group's ``publish_blocks``: cache its host blocks up to
        ``num_tokens``."""
        if self._host_core_holds(request.request_id):
            self._host_core.cache_blocks(self._requests.get(request), num_tokens)
            self._drain_host(request)

    def _drain_host(self, request: Any) -> None:
        """Queue the host core's events (``request``: whose call cached)."""
        if self._host_events is not None:
            self._host_events.drain(request)

    def _drain_device(self, request: Any) -> None:
        if self._events is not None:
            self._events.drain(request)

    def take_events(self) -> list[Any]:
        self._drain_host(None)
        return super().take_events()

    def _host_core_holds(self, request_id: str) -> bool:
        try:
            self._host_core.blocks(request_id)
        except UnknownRequestError:
            return False
        return True

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        if self.enable_caching and self._held(request.request_id) is not None:
            self._publish_when_ready(request, num_computed_tokens)
            if self._device_held(request.request_id) is not None:
                self._core.cache_blocks(self._requests.get(request), num_computed_tokens)
                self._drain_device(request)

    # ---- freeing ---------------------------------------------------------

    def free(self, request: Any) -> None:
        """The coordinator detaches the request first (it unpins its clean
        pages), then both cores free it, tail first."""
        rid = request.request_id
        coordinator = self._hisparse()
        if coordinator is not None:
            coordinator.free(rid)
        self._pair.free(rid)
        self._requests.drop(rid)
        if self._checking:
            self.check_invariants()

    def pop_blocks_for_free(self, request: Any) -> list[Any]:
        """vLLM's deferred free: the coordinator detaches the request, both
        cores forget it and hand its references to the caller, who frees the
        returned blocks (group by group, allocation order) later through
        ``block_pool.free_blocks`` (reversed), in one call as vLLM does."""
        rid = request.request_id
        coordinator = self._hisparse()
        if coordinator is not None:
            coordinator.free(rid)
        self._decode_room.pop(rid, None)
        out: list[Any] = []
        popped = self._pair.pop_request_to_caller(rid) or ()
        for views, group in zip(self._group_views, popped, strict=False):
            out.extend(views.many(group))
        self._requests.drop(rid)
        if self._checking:
            self.check_invariants()
        return out

    def reset_prefix_cache(self) -> bool:
        """vLLM's rule: each pool with no block in use forgets its cache on
        its own; True when both did."""
        host, device = self._pair.reset_prefix_cache()
        if device:
            self._watchers.fire()
            if self._residency is not None:  # vLLM's device pool holds the collector
                self._residency.reset()
        if self._checking:
            self.check_invariants()
        if not (host and device):
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: Any) -> None:
        self.block_pool.evict_blocks(block_ids)

    def check_invariants(self) -> None:
        self._pair.check_invariants()
