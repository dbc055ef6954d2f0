"""``kvcoord.vllm.KVCacheManager``: vLLM 0.33.0's ``KVCacheManager`` surface
(constructor, the methods and attributes its ``Scheduler`` uses) on
kvcoord's core.

It takes vLLM's own ``Request`` objects and returns what vLLM's scheduler and
workers accept unchanged (:class:`~kvcoord.vllm._blocks.KVCacheBlocks`).
Decisions (hit lengths, block ids, eviction order, admission) equal vLLM's.

Construction decides, once, whether kvcoord serves the configuration (see
:mod:`kvcoord.vllm._support`). When it does not, the constructor returns
vLLM's own ``KVCacheManager`` instead, logs one line naming the reason and
counts it in :data:`fallbacks`: never a silent fallback, never a switch
mid-run.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from kvcoord.config import FullAttentionSpec
from kvcoord.coordinator import get_kv_cache_coordinator, shared_prefix_boundary
from kvcoord.errors import UnknownRequestError
from kvcoord.vllm._blocks import EmptyKVCacheBlocks, KVCacheBlocks, PoolView, ids_of
from kvcoord.vllm._construct import (
    bind_args,
    caller_reason,
    fallbacks,
    served,
    vllm_manager_class,
)
from kvcoord.vllm._parking import Parking
from kvcoord.vllm._requests import RequestRegistry
from kvcoord.vllm._support import to_kvcoord_config, unsupported_reason
from kvcoord.vllm._views import CoordinatorView

__all__ = ["KVCacheManager", "fallbacks", "served"]

logger = logging.getLogger("kvcoord.vllm")


# vLLM's PrefixCacheStats class, imported once (make_prefix_cache_stats runs every step).
_STATS_CLASS: dict[str, Any] = {}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """vLLM 0.33.0's ``KVCacheManager`` on kvcoord's core (same constructor)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        bound = bind_args(args, kwargs)
        reason = unsupported_reason(bound["kv_cache_config"], bound) or caller_reason()
        if reason is None:
            return super().__new__(cls)
        fallbacks[reason] += 1
        logger.warning(
            "kvcoord.vllm: %s is not served by kvcoord; this KVCacheManager is vLLM's own "
            "(fallback #%d)",
            reason,
            sum(fallbacks.values()),
        )
        return vllm_manager_class()(*args, **kwargs)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        a = bind_args(args, kwargs)
        cfg = a["kv_cache_config"]
        self.kv_cache_config = cfg
        self.max_model_len = int(a["max_model_len"])
        self.enable_caching = bool(a.get("enable_caching", True))
        self.enable_kv_cache_events = False
        self.use_eagle = bool(a.get("use_eagle", False))
        # EAGLE groups (flagged, else all when use_eagle) and those whose hits
        # drop their last block: every group here shares one spec.
        flagged = tuple(
            i for i, g in enumerate(cfg.kv_cache_groups) if getattr(g, "is_eagle_group", False)
        )
        if self.use_eagle and not flagged:
            flagged = tuple(range(len(cfg.kv_cache_groups)))
        self.eagle_group_ids = flagged
        self.drop_eagle_group_ids = flagged if self.use_eagle else ()
        self.log_stats = bool(a.get("log_stats", False))
        self.metrics_collector = None
        self.mamba_shared_prefix_checkpoint = False
        self.retained_hit_group_ids: tuple[int, ...] = ()
        self.num_kv_cache_groups = len(cfg.kv_cache_groups)
        self.hash_block_size = int(a["hash_block_size"])
        # Multi-module MTP re-prefills the last num_prefill_lookahead - 1
        # computed tokens: their KV is not final, so they are never cached.
        self.num_reprefillable_tokens = max(0, int(a.get("num_prefill_lookahead", 0)) - 1)
        if (
            self.enable_caching
            and self.eagle_group_ids
            and self.num_reprefillable_tokens
            and int(a["scheduler_block_size"]) < self.num_reprefillable_tokens + 1
        ):
            raise ValueError(
                "Multi-module MTP with prefix caching needs scheduler_block_size >= "
                f"num_prefill_lookahead (scheduler_block_size {a['scheduler_block_size']}, "
                f"num_prefill_lookahead {self.num_reprefillable_tokens + 1})"
            )
        watermark = float(a.get("watermark", 0.0))
        self.watermark_blocks = int(watermark * cfg.num_blocks)
        kv_config = to_kvcoord_config(cfg)
        self._core_coordinator = get_kv_cache_coordinator(
            kv_config,
            max_model_len=self.max_model_len,
            enable_caching=self.enable_caching,
            hash_block_size=self.hash_block_size,
        )
        self._core = self._core_coordinator.core
        self._pool = self._core_coordinator.block_pool
        self._requests = RequestRegistry(self.hash_block_size)
        self._parking = Parking(self._core, self._requests)
        self.block_pool = PoolView(self._pool, self._core, self._parking.free)
        self.coordinator = CoordinatorView(self, self._core_coordinator)
        self._block_sizes = tuple(int(g.kv_cache_spec.block_size) for g in cfg.kv_cache_groups)
        # The decode fast path of allocate_slots: request id -> what it holds
        # (see _room). Only where a step within it changes nothing in vLLM:
        # full attention (no block leaves a window) and no watermark.
        self._decode_room: dict[str, tuple[int, int]] = {}
        plain = all(type(g.spec) is FullAttentionSpec for g in kv_config.groups)
        sizes = tuple(sorted(set(self._block_sizes)))
        self._room_sizes = sizes if plain and not self.watermark_blocks else ()
        # What _decode_core reads: the registry's entries (vLLM request,
        # kvcoord request) by id, the core's shared empty result (an
        # allocation that added no block) and the block size when there is
        # one. One attribute: past 30 instance attributes CPython 3.11 stops
        # specialising attribute reads, and every method here slows down.
        self._decode_fixed = (
            self._requests._by_id,
            self._core.empty,
            self._room_sizes[0] if len(self._room_sizes) == 1 else 0,
        )
        self.empty_kv_cache_blocks = EmptyKVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups)), self._pool
        )
        self.prefix_cache_stats: Any = self._new_stats() if self.log_stats else None
        served["managers"] += 1

    # ---- statistics ------------------------------------------------------

    @staticmethod
    def _new_stats() -> Any:
        cls = _STATS_CLASS.get("cls")
        if cls is None:
            cls = _STATS_CLASS["cls"] = importlib.import_module(
                "vllm.v1.metrics.stats"
            ).PrefixCacheStats
        return cls()

    @property
    def usage(self) -> float:
        return float(self._pool.usage)

    def make_prefix_cache_stats(self) -> Any:
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = self._new_stats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        stats: Any = self.prefix_cache_stats
        stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

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
        if hit and self.drop_eagle_group_ids:
            # EAGLE recomputes the block before the generation point.
            bs = self._block_sizes[0]
            hit -= bs
            per_group = tuple(g[: hit // bs] for g in per_group)
        if not hit:
            return self.empty_kv_cache_blocks, 0, 0
        boundary = shared_prefix_boundary(hit, uncached)
        return KVCacheBlocks(per_group, self._pool), hit, boundary

    def get_computed_blocks_for_connector(
        self, request: Any, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        return (*self.get_computed_blocks(request, max_cache_hit_length), False)

    def _held(self, request_id: str) -> tuple[Any, ...] | None:
        """The request's block table per group (read-only int32 arrays), or None."""
        try:
            blocks = self._core.blocks(self._requests.core_id(request_id))
        except UnknownRequestError:
            return None
        arrays: tuple[Any, ...] = blocks.arrays()
        return arrays

    def _predict(self, request_id: str, num_tokens: int, hits: tuple[list[int], ...]) -> int:
        """vLLM's block prediction for full-attention groups: blocks still
        needed for ``num_tokens`` slots, plus the hit blocks that sit in the
        free queue (touching them takes them out of it)."""
        held = self._held(request_id)
        total = 0
        ref_counts = None
        for g, bs in enumerate(self._block_sizes):
            required = _cdiv(num_tokens, bs)
            if held is not None:
                total += max(required - len(held[g]), 0)
                continue
            group_hits = hits[g] if hits else []
            total += max(required - len(group_hits), 0)
            if group_hits:
                if ref_counts is None:
                    ref_counts = self._pool.ref_counts()
                total += int((ref_counts[group_hits] == 0).sum())
        return total

    # ---- the per-step call -----------------------------------------------

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """vLLM's ``allocate_slots``: new blocks per group, or None (nothing changed).

        A decode step that needs no new block and completes no block to cache
        (most steps of a running request) is answered here without the core:
        vLLM's manager changes nothing then and returns its empty blocks. The
        core's request catches up with vLLM's at the next call that reaches it.
        """
        room = self._decode_room.get(request.request_id)
        if (
            room is not None
            and (new_computed_blocks is None or new_computed_blocks is self.empty_kv_cache_blocks)
            and num_new_tokens > 0
            and not (
                num_new_computed_tokens
                or num_external_computed_tokens
                or num_encoder_tokens
                or full_sequence_must_fit
                or reserved_blocks
            )
        ):
            done = request.num_computed_tokens + num_new_tokens
            if done + num_lookahead_tokens <= room[0] and done < room[1]:
                return self.empty_kv_cache_blocks
            if not delay_cache_blocks:
                return self._decode_core(request, num_new_tokens, num_lookahead_tokens)
        return self._allocate(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
            full_sequence_must_fit,
            reserved_blocks,
            has_scheduled_reqs,
        )

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
    ) -> KVCacheBlocks | None:
        """``allocate_slots`` through the core (every call the fast path cannot answer)."""
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
        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if self._predict(rid, full, hits) + watermark > self._pool.num_free_blocks:
                return None
        if watermark or reserved_blocks:
            need = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
            free = self._pool.num_free_blocks - reserved_blocks
            if self._predict(rid, need, hits) + watermark > free:
                return None
        mine = self._requests.get(request)
        # vLLM caches only blocks its request has hashes for; when those lag
        # (no hasher, or a hash-lookahead hasher waiting for its token),
        # caching is done here, clipped to them.
        num_tokens = mine.num_tokens  # vLLM's count, just synced
        hashed = len(request.block_hashes) * self.hash_block_size
        lagging = (
            hashed < num_tokens - self.hash_block_size + 1 or self.num_reprefillable_tokens > 0
        )
        result = self._core.allocate_slots(
            mine,
            num_new_tokens + num_external_computed_tokens,
            num_new_computed_tokens,
            hits or None,
            num_lookahead_tokens,
            num_encoder_tokens,
            delay_cache_blocks or lagging,
        )
        if result is None:
            return None
        cached_to = min(total_computed + num_new_tokens, num_tokens)
        if lagging and not delay_cache_blocks and self.enable_caching:
            cached_to = max(min(cached_to - self.num_reprefillable_tokens, hashed), 0)
            self._core.cache_blocks(mine, cached_to)
        if self._room_sizes and not delay_cache_blocks:
            need = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
            self._decode_room[rid] = self._room(need, cached_to)
        elif self._decode_room:
            self._decode_room.pop(rid, None)
        if result.is_empty():
            return self.empty_kv_cache_blocks
        new: tuple[Any, ...] = result.get_block_ids()  # fresh lists per group
        if num_external_computed_tokens:
            # vLLM returns the blocks past the external (connector) tokens only.
            new = self._past_external(new, num_local, num_local + num_external_computed_tokens)
        return KVCacheBlocks(new, self._pool)

    def _decode_core(
        self, request: Any, num_new_tokens: int, num_lookahead_tokens: int
    ) -> KVCacheBlocks | None:
        """``_allocate`` for a running request of a plain configuration (it has
        a decode room) with no hit, external, encoder or reserved tokens and
        caching not delayed: the same core calls, without the general checks
        (no watermark, no hits, no prediction), and the request synced in
        place when only its computed-token count moved."""
        registered, core_empty, bs = self._decode_fixed
        num_hashes = len(request.block_hashes)
        entry = registered.get(request.request_id)
        if entry is not None and entry[0] is request:
            mine = entry[1]
            num_tokens = mine.num_tokens
            if num_tokens == request.num_tokens and mine.num_block_hashes >= num_hashes:
                mine.num_computed_tokens = request.num_computed_tokens
            else:
                mine = self._requests.get(request)
                num_tokens = mine.num_tokens
        else:
            mine = self._requests.get(request)
            num_tokens = mine.num_tokens
        hbs = self.hash_block_size
        hashed = num_hashes * hbs
        reprefill = self.num_reprefillable_tokens
        lagging = hashed < num_tokens - hbs + 1 or reprefill > 0
        result = self._core.allocate_slots(
            mine, num_new_tokens, 0, None, num_lookahead_tokens, 0, lagging
        )
        if result is None:
            return None
        computed = request.num_computed_tokens
        if computed > self.max_model_len:
            computed = self.max_model_len
        cached_to = computed + num_new_tokens
        if cached_to > num_tokens:
            cached_to = num_tokens
        if lagging and self.enable_caching:
            cached_to = max(min(cached_to - reprefill, hashed), 0)
            self._core.cache_blocks(mine, cached_to)
        need = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if bs:
            # _room for one block size, inline.
            self._decode_room[request.request_id] = (
                -(-need // bs) * bs,
                (cached_to // bs + 1) * bs + reprefill if self.enable_caching else sys.maxsize,
            )
        else:
            self._decode_room[request.request_id] = self._room(need, cached_to)
        if result is core_empty:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(result.get_block_ids(), self._pool)

    def _past_external(self, new: Any, local: int, computed: int) -> tuple[Any, ...]:
        out = []
        for g, bs in enumerate(self._block_sizes):
            skip = _cdiv(computed, bs) - _cdiv(local, bs)
            out.append(new[g][max(skip, 0) :])
        return tuple(out)

    def _room(self, need: int, cached_to: int) -> tuple[int, int]:
        """What a request holds after an allocation for ``need`` slots that
        cached its full blocks up to ``cached_to`` tokens, as (slots it has,
        first token count that completes a block not yet cached), each the
        smallest over groups. Lower bounds: a later step within both needs no
        block and caches none (any other step goes to the core)."""
        sizes = self._room_sizes
        bs = sizes[0]
        slots = -(-need // bs) * bs
        next_block = (cached_to // bs + 1) * bs
        if len(sizes) > 1:
            for bs in sizes[1:]:
                slots = min(slots, -(-need // bs) * bs)
                next_block = min(next_block, (cached_to // bs + 1) * bs)
        # A block is cached once the tokens past the re-prefillable tail fill it.
        next_block += self.num_reprefillable_tokens
        return slots, next_block if self.enable_caching else sys.maxsize

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        if self.enable_caching and self._held(request.request_id) is not None:
            hashed = len(request.block_hashes) * self.hash_block_size
            cacheable = max(num_computed_tokens - self.num_reprefillable_tokens, 0)
            self._core.cache_blocks(self._requests.get(request), min(cacheable, hashed))

    # ---- freeing ---------------------------------------------------------

    def free(self, request: Any) -> None:
        """Release the request's blocks, tail first (unknown ids: no-op)."""
        rid = request.request_id
        self._core.free(self._requests.core_id(rid))
        self._requests.drop(rid)
        self._decode_room.pop(rid, None)

    def pop_blocks_for_free(self, request: Any) -> list[int]:
        """Forget the request but keep its blocks' references; the caller frees
        the returned ids later through ``block_pool.free_blocks`` (reversed),
        which frees them tail first as vLLM does (see :mod:`kvcoord.vllm._parking`)."""
        rid = request.request_id
        held = self._held(rid)
        self._decode_room.pop(rid, None)
        if held is None:
            self._requests.drop(rid)
            return []
        ids = [i for g in held for i in g.tolist() if i]
        if not ids:
            self.free(request)
            return []
        if sum(1 for g in held if len(g)) > 1:
            # vLLM frees them last group first; the core frees groups in order.
            raise NotImplementedError(
                "kvcoord: pop_blocks_for_free of a request holding blocks in several groups"
            )
        self._parking.park(rid, ids)
        self._requests.drop(rid)
        return ids

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Full attention skips no blocks: nothing to release."""

    def evict_blocks(self, block_ids: Any) -> None:
        self._decode_room.clear()
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        if not self._core.reset_prefix_cache():
            return False
        self._decode_room.clear()
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    # ---- inspection --------------------------------------------------------

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[Any]:
        return []

    def create_kv_cache_blocks(self, blocks: Any) -> KVCacheBlocks:
        if not any(len(g) for g in blocks):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(tuple(ids_of(g) for g in blocks), self._pool)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        held = self._held(request_id)
        return self.empty_kv_cache_blocks if held is None else self.create_kv_cache_blocks(held)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        held = self._held(request_id)
        if held is None:
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return tuple(g.tolist() for g in held)

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        ids = self.get_block_ids(request_id)
        return tuple(
            g[: _cdiv(num_computed_tokens, bs)]
            for g, bs in zip(ids, self._block_sizes, strict=True)
        )

    def estimate_cached_tokens(self, request: Any) -> int:
        """Tokens covered by the request's cached blocks (min over groups).

        The last cached block is looked for from the tail: a few single-block
        lookups (a running request's last full block is usually cached), the
        pool's whole cached mask only when those find none."""
        held = self._held(request.request_id)
        if held is None or not self.enable_caching:
            return 0
        cached: Any = None
        block_hash = self._pool.block_hash
        result: int | None = None
        for g, bs in zip(held, self._block_sizes, strict=True):
            tokens = 0
            ids = g.tolist()
            index = len(ids) - 1
            stop = max(index - 4, -1)
            while index > stop:
                if ids[index] and block_hash(ids[index]) is not None:
                    tokens = (index + 1) * bs
                    break
                index -= 1
            else:
                if index >= 0:
                    if cached is None:
                        cached = self._pool.cached_mask()
                    while index >= 0:
                        if ids[index] and cached[ids[index]]:
                            tokens = (index + 1) * bs
                            break
                        index -= 1
            result = tokens if result is None else min(result, tokens)
        return result or 0

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> KVCacheBlocks:
        groups = blocks.ids if isinstance(blocks, KVCacheBlocks) else blocks.blocks
        out = []
        for g, bs in zip(groups, self._block_sizes, strict=True):
            if num_computed_tokens % bs:
                raise ValueError(f"{num_computed_tokens} tokens is not a multiple of {bs}")
            n = num_computed_tokens // bs
            if n > len(g):
                raise ValueError(f"cannot truncate {len(g)} blocks to {n}")
            out.append(ids_of(g)[:n])
        return self.create_kv_cache_blocks(tuple(out))

    # ---- per-step hand-offs (none for full attention) ----------------------

    def take_new_block_ids(self) -> list[int]:
        return []

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """No group records blocks for zeroing in a served configuration."""

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[int]]:
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        return []

    def new_step_starts(self) -> None:
        """Nothing is step-scoped for full attention."""

    def check_invariants(self) -> None:
        self._core.check_invariants()
