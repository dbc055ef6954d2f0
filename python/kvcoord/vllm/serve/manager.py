"""``kvcoord.vllm.KVCacheManager``: vLLM 0.33.0's ``KVCacheManager`` surface
(constructor, the methods and attributes its ``Scheduler`` uses) on
kvcoord's core.

It takes vLLM's own ``Request`` objects and returns what vLLM's scheduler and
workers accept unchanged (:class:`~kvcoord.vllm.serve._blocks.KVCacheBlocks`).
Decisions (hit lengths, block ids, eviction order, admission) equal vLLM's.

Construction decides, once, whether kvcoord serves the configuration (see
:mod:`kvcoord.vllm.serve._support`). When it does not, the constructor returns
vLLM's own ``KVCacheManager`` instead, logs one line naming the reason and
counts it in :data:`fallbacks`: never a silent fallback, never a switch
mid-run.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any, ClassVar

from kvcoord._core import DecodeFastPath
from kvcoord.config import FullAttentionSpec
from kvcoord.coordinator import get_kv_cache_coordinator, shared_prefix_boundary
from kvcoord.vllm.serve import _mamba
from kvcoord.vllm.serve._blocks import EmptyKVCacheBlocks, KVCacheBlocks, ids_of
from kvcoord.vllm.serve._construct import (
    bind_args,
    caller_reason,
    fall_back,
    fallbacks,
    is_checking,
    log_served,
    original_manager_class,
    served,
)
from kvcoord.vllm.serve._decode import DecodePath
from kvcoord.vllm.serve._events import event_metadata, pool_view
from kvcoord.vllm.serve._readouts import ManagerReadouts
from kvcoord.vllm.serve._requests import RequestRegistry
from kvcoord.vllm.serve._residency_metrics import ResidencyFeed
from kvcoord.vllm.serve._support import (
    check_retention,
    cross_attention_group_ids,
    eagle_groups,
    to_kvcoord_config,
    unsupported_reason,
)
from kvcoord.vllm.serve._versions import installed
from kvcoord.vllm.serve._views import coordinator_view
from kvcoord.vllm.serve._zeroing import ZeroingLog, zeroed_group_ids

__all__ = ["KVCacheManager", "fallbacks", "manager_class", "served"]


class KVCacheManager(DecodePath, ManagerReadouts, DecodeFastPath):
    """vLLM 0.33.0's ``KVCacheManager`` on kvcoord's core (same constructor).

    ``allocate_slots`` is :class:`kvcoord._core.DecodeFastPath`'s: a decode
    step that needs no new block and completes no block to cache (most steps
    of a running request) is answered there without the core (vLLM's
    manager changes nothing then and returns its empty blocks; the core's
    request catches up at the next call that reaches it), one that needs a
    block in a plain configuration is one ``CoordinatorCore.decode_slots``
    call, and every other call is :meth:`_allocate`.
    """

    _group_id_base = 0  # vLLM's id of the core's group 0 (HiSparse: 1)
    #: Subclasses serving a kind of configuration this class does not hold,
    #: each after the test that picks it (``class M(KVCacheManager, serves=...)``).
    _variants: ClassVar[list[tuple[Callable[[Any], bool], type[KVCacheManager]]]] = []

    def __init_subclass__(cls, serves: Callable[[Any], bool] | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if serves is not None:
            KVCacheManager._variants.append((serves, cls))

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        chosen = manager_class(cls, bind_args(args, kwargs), sys._getframe(1))
        if chosen is None:
            return original_manager_class()(*args, **kwargs)
        return super().__new__(chosen)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        a = bind_args(args, kwargs)
        cfg = a["kv_cache_config"]
        self.kv_cache_config = cfg
        self.max_model_len = int(a["max_model_len"])
        # vLLM's admission cap falls back to max_model_len when unset.
        in_flight = a.get("max_in_flight_tokens")
        self.max_in_flight_tokens = self.max_model_len if in_flight is None else int(in_flight)
        self.enable_caching = bool(a.get("enable_caching", True))
        self.enable_kv_cache_events = bool(a.get("enable_kv_cache_events", False))
        self.kv_cache_event_metadata = event_metadata(cfg)
        self.use_eagle = bool(a.get("use_eagle", False))
        # EAGLE groups and those whose hits drop their last block (the
        # coordinator's lookups drop it).
        self.eagle_group_ids, self.drop_eagle_group_ids = eagle_groups(cfg, self.use_eagle)
        self.log_stats = bool(a.get("log_stats", False))
        self.metrics_collector = a.get("metrics_collector")
        self.mamba_shared_prefix_checkpoint = False
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.num_kv_cache_groups = len(cfg.kv_cache_groups)
        self.hash_block_size = int(a["hash_block_size"])
        # Multi-module MTP re-prefills the last num_prefill_lookahead - 1
        # computed tokens: their KV is not final (the core decides, per
        # group, how much of them is held back from caching).
        reprefillable = max(0, int(a.get("num_prefill_lookahead", 0)) - 1)
        if (
            self.enable_caching
            and self.eagle_group_ids
            and reprefillable
            and int(a["scheduler_block_size"]) < reprefillable + 1
        ):
            raise ValueError(
                "Multi-module MTP with prefix caching needs scheduler_block_size >= "
                f"num_prefill_lookahead (scheduler_block_size {a['scheduler_block_size']}, "
                f"num_prefill_lookahead {reprefillable + 1})"
            )
        watermark = float(a.get("watermark", 0.0))
        self.watermark_blocks = int(watermark * cfg.num_blocks)
        check_retention(cfg, int(a["scheduler_block_size"]))
        kv_config = to_kvcoord_config(cfg, int(a.get("dcp_world_size", 1)))
        # Block sizes as vLLM's managers see them (scaled under DCP).
        self._block_sizes = tuple(g.spec.block_size for g in kv_config.groups)
        self._core_coordinator = get_kv_cache_coordinator(
            kv_config,
            max_model_len=self.max_model_len,
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
            enable_events=self.enable_kv_cache_events,
            num_reprefillable_tokens=reprefillable,
            eagle_group_ids=self.drop_eagle_group_ids,
            num_hash_lookahead_tokens=int(a.get("num_hash_lookahead_tokens", 0)),
            allow_partial_hits=True,
            rekey_keyed_prompt_tail=installed().rekeys_keyed_prompt_tail,
            eagle_junction_block=installed().eagle_retains_block_below_junction,
            context_parallel=int(a.get("dcp_world_size", 1)) > 1,
            # vLLM's scheduler adopts whatever blocks it is handed as hits.
            verify_hits=False,
            group_id_base=self._group_id_base,
        )
        self._core = self._core_coordinator.core
        self._pool = self._core_coordinator.block_pool
        self._requests = RequestRegistry(self.hash_block_size)
        self.block_pool, self._events = pool_view(self._pool, self._core, a)
        self.coordinator = coordinator_view(self, self._core_coordinator, a)
        # Mamba groups: state tables, not token-indexed KV (see _mamba).
        self._mamba_groups = _mamba.mamba_group_ids(cfg)
        # Groups whose whole table serves the computed tokens (vLLM clips
        # only the token-indexed attention groups).
        self._whole_table_groups = self._mamba_groups + cross_attention_group_ids(cfg)
        # vLLM answers connector lookups per group for these (see _mamba).
        self._connector_group = _mamba.connector_full_attention_group(cfg, self.enable_caching)
        # The decode fast path of allocate_slots: request id -> the room it
        # has, as one limit for steps of _room_lookahead speculative tokens
        # (see CoordinatorCore.decode_room): a step whose computed plus new
        # tokens stay below it needs no block and caches none. Only where a
        # step within it changes nothing in vLLM: full attention (no block
        # leaves a window), one held-back tail, and no watermark.
        self._decode_room: dict[str, int] = {}
        self._room_lookahead = 0
        plain = all(type(g.spec) is FullAttentionSpec for g in kv_config.groups)
        # Whether some group releases blocks behind its attention window.
        self._windowed = not plain
        self._rooms = bool(self._core.has_decode_room) and not self.watermark_blocks
        # vLLM zeroes the new blocks of attention groups (not Mamba's).
        zeroed = zeroed_group_ids(cfg)
        self._zeroing = ZeroingLog(self.num_kv_cache_groups, zeroed) if zeroed else None
        # What _decode_core reads: the registry's entries (vLLM request,
        # kvcoord request) by id and the core's fused decode step. One
        # attribute: past 30 instance attributes CPython 3.11 stops
        # specialising attribute reads, and every method here slows down.
        # None where a decode step has more to do (events to drain, blocks
        # to record for zeroing): those steps take _allocate.
        self._decode_fixed = (
            (self._requests._by_id, self._core.decode_slots)
            if self._events is None and self._zeroing is None
            else None
        )
        self.empty_kv_cache_blocks = EmptyKVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups)), self._pool
        )
        self.prefix_cache_stats: Any = self._new_stats() if self.log_stats else None
        self._residency = (
            None
            if self.metrics_collector is None
            else ResidencyFeed(self.metrics_collector, self._core)
        )
        self._checking = is_checking()
        self._init_fast_path(
            self._decode_room,
            self.empty_kv_cache_blocks,
            self._decode_fixed,
            KVCacheBlocks,
            self._pool,
        )
        served["managers"] += 1
        log_served(cfg)

    # ---- lookups ---------------------------------------------------------

    def get_computed_blocks(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """Longest cached prefix: (blocks per group, hit tokens, shared-prefix
        boundary; always 0 for full attention). Pins nothing."""
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        # vLLM looks up only the blocks its request has hashes for.
        max_cache_hit_length = min(
            max_cache_hit_length, len(request.block_hashes) * self.hash_block_size
        )
        mine = self._requests.get(request)
        blocks, hit, uncached = self._core_coordinator.find_longest_cache_hit(
            mine, max_cache_hit_length
        )
        per_group = blocks.arrays()
        boundary = shared_prefix_boundary(hit, uncached)
        if not hit:
            # A junction some group has not cached is reported even when
            # the reconciled hit is empty (sparse retention pins it).
            return self.empty_kv_cache_blocks, 0, boundary
        if self._events is not None:
            self._events.cached_hits(request, per_group, self.hash_block_size)
        return KVCacheBlocks(per_group, self._pool), hit, boundary

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """``get_computed_blocks`` and whether the hit runs past a lagging
        group's (beside Mamba groups, vLLM looks each group up on its own
        and reports the full-attention hit; see ``_mamba.connector_hit``)."""
        full_group = self._connector_group
        if full_group is None:
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0, False
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        blocks, hits = self.find_hits_per_group(self._requests.get(request), max_cache_hit_length)
        answer = _mamba.connector_hit(hits, full_group)
        if answer is None:
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        # A per-group lookup detects no uncached shared prefix.
        return KVCacheBlocks(blocks.arrays(), self._pool), answer[0], 0, answer[1]

    def find_hits_per_group(self, mine: Any, max_length: int) -> tuple[Any, tuple[int, ...]]:
        """Each group's own longest hit for kvcoord's request ``mine``
        (blocks, hit tokens per group): vLLM's
        ``find_longest_cache_hit_per_group``."""
        limit = min(max_length, mine.num_block_hashes * self.hash_block_size)
        find = self._core_coordinator.find_longest_cache_hit_per_group  # type: ignore[attr-defined]
        blocks, hits = find(mine, limit)
        return blocks, hits

    def _predict(
        self,
        mine: Any,
        num_tokens: int,
        hits: tuple[list[int], ...],
        total_computed: int,
        num_encoder_tokens: int = 0,
        admission: bool = False,
        *,
        num_tokens_main_model: int | None = None,
        prefill_end: int | None = None,
    ) -> int:
        """vLLM's ``get_num_blocks_to_allocate``, answered by the core: blocks
        still needed for ``num_tokens`` slots over all groups, plus the hit
        blocks that sit in the free queue (touching them takes them out of
        it). ``admission``: capped per group at the most blocks a request can
        hold there (the full-sequence admission check).
        ``num_tokens_main_model``: the slots that are not speculative
        (default: all); ``prefill_end``: where the prefill ends (default: the
        request's own)."""
        return int(
            self._core.num_blocks_to_allocate(
                mine,
                num_tokens,
                hits or None,
                total_computed,
                num_encoder_tokens,
                self.max_in_flight_tokens if admission else None,
                num_tokens_main_model=num_tokens_main_model,
                prefill_end=prefill_end,
            )
        )

    # ---- the per-step call -----------------------------------------------

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
        """vLLM's ``allocate_slots`` through the core: new blocks per group, or
        None (nothing changed); every call the fast path does not answer."""
        if (
            num_new_tokens == 0
            and num_external_computed_tokens == 0
            and num_new_computed_tokens == 0
        ):
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        hits: tuple[list[int], ...] = ()
        if (
            new_computed_blocks is not None
            and new_computed_blocks is not self.empty_kv_cache_blocks
        ):
            if isinstance(new_computed_blocks, KVCacheBlocks):
                if any(len(g) for g in new_computed_blocks.ids):
                    hits = tuple(ids_of(g) for g in new_computed_blocks.ids)
            elif any(new_computed_blocks.blocks):
                hits = tuple(ids_of(g) for g in new_computed_blocks.blocks)
        watermark = 0
        if self.watermark_blocks and has_scheduled_reqs:
            status = importlib.import_module("vllm.v1.request").RequestStatus
            if request.status in (status.WAITING, status.PREEMPTED):
                watermark = self.watermark_blocks
        rid = request.request_id
        num_local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local + num_external_computed_tokens, self.max_model_len)
        mine = self._requests.get(request)
        if self._windowed:
            # The junction a sparse-retention group keeps (set by vLLM's
            # scheduler from get_computed_blocks).
            mine.shared_prefix_boundary = request.shared_prefix_boundary
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            needed = self._predict(mine, full, hits, total_computed, num_encoder_tokens, True)
            if needed + watermark > self._pool.num_free_blocks:
                return None
        if watermark or reserved_blocks:
            if self._windowed:
                # vLLM releases out-of-window blocks before this check,
                # whether or not the step fits (the core does so again,
                # a no-op, when it allocates).
                self._core.remove_skipped_blocks(
                    rid,
                    max(0, total_computed - request.num_in_flight_tokens),
                    request.num_prompt_tokens,
                )
            need = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
            free = self._pool.num_free_blocks - reserved_blocks
            needed = self._predict(
                mine,
                need,
                hits,
                num_local + num_external_computed_tokens,
                num_encoder_tokens,
                num_tokens_main_model=total_computed + num_new_tokens,
            )
            if needed + watermark > free:
                return None
        # vLLM caches only blocks its request has hashes for; when those lag
        # (no hasher, or a hash-lookahead hasher waiting for its token),
        # caching is done here, clipped to them.
        num_tokens = mine.num_tokens  # vLLM's count, just synced
        hashed = len(request.block_hashes) * self.hash_block_size
        lagging = hashed < num_tokens - self.hash_block_size + 1
        # A new request's external tokens get blocks of their own (zeroed
        # apart); a running request's are allocated as new tokens.
        fresh_external = (
            num_external_computed_tokens
            if num_external_computed_tokens and self._held(rid) is None
            else 0
        )
        result = self._core.allocate_slots(
            mine,
            num_new_tokens,
            num_new_computed_tokens,
            hits or None,
            num_lookahead_tokens,
            num_encoder_tokens,
            delay_cache_blocks or lagging,
            num_external_computed_tokens,
        )
        if result is None:
            return None
        cached_to = min(total_computed + num_new_tokens, num_tokens)
        if lagging and not delay_cache_blocks and self.enable_caching:
            self._core.cache_blocks(mine, cached_to)
        if self._events is not None:
            self._events.drain(request)
        room = None
        if self._rooms and not delay_cache_blocks:
            need = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
            room = self._core.decode_room(need, cached_to, hashed, num_lookahead_tokens)
        if room is not None:
            if num_lookahead_tokens != self._room_lookahead:
                # Every limit is for one speculative-token count.
                self._decode_room.clear()
                self._room_lookahead = num_lookahead_tokens
            self._decode_room[rid] = room
        elif self._decode_room:
            self._decode_room.pop(rid, None)
        if self._zeroing is not None:
            held = self._held(rid) if fresh_external else None
            self._zeroing.record_allocation(
                result.get_block_ids(), held, hits, skip_zeroing_group_ids
            )
        if result.is_empty():
            return self.empty_kv_cache_blocks
        # The core returns what vLLM returns: for a new request, not the
        # blocks of the external (connector) tokens.
        new: tuple[Any, ...] = result.get_block_ids()  # fresh lists per group
        return KVCacheBlocks(new, self._pool)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        if self.enable_caching and self._held(request.request_id) is not None:
            mine = self._requests.get(request)
            if self._windowed:
                mine.shared_prefix_boundary = request.shared_prefix_boundary
            self._core.cache_blocks(mine, num_computed_tokens)
            if self._events is not None:
                self._events.drain(request)

    # ---- freeing ---------------------------------------------------------

    def free(self, request: Any) -> None:
        """Release the request's blocks, tail first (unknown ids: no-op)."""
        rid = request.request_id
        self._core.free(rid)
        self._requests.drop(rid)
        self._decode_room.pop(rid, None)
        if self._checking:
            self.check_invariants()

    def pop_blocks_for_free(self, request: Any) -> list[int]:
        """Forget the request and hand its blocks' references to the caller
        (the core counts them as the caller's), who frees the returned ids
        later through ``block_pool.free_blocks``, reversed: vLLM's order,
        each group tail first, the last group first."""
        rid = request.request_id
        self._decode_room.pop(rid, None)
        # vLLM 0.32 hands back the tables with their null blocks (the core
        # hands over the others' references; freeing a null block is a no-op).
        tables = self.get_block_ids(rid) if installed().pops_null_blocks else None
        groups = self._core.pop_request_to_caller(rid) or ()
        self._requests.drop(rid)
        if self._checking:
            self.check_invariants()
        if tables is not None and groups:
            return [i for g in tables for i in g]
        return [i for g in groups for i in g if i]

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Release the blocks that left every group's attention window
        (a no-op for full attention and unknown requests)."""
        if self._windowed:
            self._core.remove_skipped_blocks(
                request_id, processed_computed_tokens, num_prompt_tokens
            )

    def evict_blocks(self, block_ids: Any) -> None:
        self._decode_room.clear()
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        done = bool(self._core.reset_prefix_cache())
        if self._checking:
            self.check_invariants()
        if not done:
            return False
        self._decode_room.clear()
        if self._residency is not None:
            self._residency.reset()
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True


def manager_class(
    cls: type[KVCacheManager], args: dict[str, Any], caller: Any
) -> type[KVCacheManager] | None:
    """The class of the manager vLLM's constructor arguments ``args`` get,
    built from the frame ``caller``: ``cls``, or the subclass serving the
    configuration's kind (HiSparse's, :mod:`kvcoord.vllm.hisparse`); None
    when kvcoord does not serve it, the fallback recorded (logged and
    counted; raised in strict mode)."""
    cfg = args["kv_cache_config"]
    reason = unsupported_reason(cfg, args) or caller_reason(caller)
    if reason is not None:
        fall_back(reason)
        return None
    for serves, variant in cls._variants:
        if serves(cfg):
            return variant
    return cls
