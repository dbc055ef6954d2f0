"""`KVCacheManager`: the vLLM-shaped facade a scheduler drives every step.

    blocks, num_hit_tokens = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, num_new_tokens,
                                 num_new_computed_tokens=num_hit_tokens,
                                 new_computed_blocks=blocks)
    ...                                  # None: no room, nothing allocated
    manager.free(request)

Decisions (hit lengths, block ids, eviction order) equal vLLM 0.33.0's. A
decode step is one call into Rust whatever the number of groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from kvcoord._core import BlockPoolView, Request, advance_requests
from kvcoord.blocks import KVCacheBlocks
from kvcoord.config import KVCacheConfig, as_arg, as_bool, as_i64
from kvcoord.coordinator import (
    KVCacheCoordinator,
    get_kv_cache_coordinator,
    shared_prefix_boundary,
)
from kvcoord.errors import ArgumentTypeError, ConfigError, ConfigTypeError
from kvcoord.residency import EvictionRecord, ResidencySnapshot

__all__ = [
    "AllocateSlots",
    "KVCacheBlocks",
    "KVCacheManager",
    "KVCacheManagerOptions",
    "PrefixCacheStats",
]


class AllocateSlots(Protocol):
    """``KVCacheManager.allocate_slots``: the per-request, per-step call."""

    def __call__(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_encoder_tokens: int = 0,
        delay_cache_blocks: bool = False,
    ) -> KVCacheBlocks | None:
        """Make room for ``num_new_tokens`` more tokens of ``request`` in every
        group, adopting ``new_computed_blocks`` (from ``get_computed_blocks``)
        on its first allocation, releasing blocks that left a sliding window
        or local chunk, and caching the blocks that became full.

        Returns the newly allocated block ids per group (a shared empty
        :class:`KVCacheBlocks` when nothing was allocated), or ``None`` when
        the pool cannot hold them; then nothing was allocated or pinned.

        Raises:
            InvalidArgumentError: ``num_new_tokens`` is 0 with nothing to
                adopt, hits for a running request, more tokens than
                ``max_model_len``.
        """
        ...


@dataclass(frozen=True, slots=True)
class KVCacheManagerOptions:
    """How a :class:`KVCacheManager` runs (one frozen object instead of a row
    of flags).

    Attributes:
        enable_caching: prefix caching on/off.
        hash_block_size: tokens per hash unit; ``None`` for the core's
            default (:func:`kvcoord.default_hash_block_size`: the block size
            with one group, the GCD of the groups' block sizes with several).
        enable_events: record KV-cache events (see
            :meth:`KVCacheManager.take_events`).
        log_stats: keep prefix-cache hit statistics.
        residency_metrics: track every block's residency (lifetime, idle
            time before eviction, reuse gaps, hits; see :mod:`kvcoord.residency`).
        residency_records: with ``residency_metrics``, also keep one record
            per eviction for :meth:`KVCacheManager.drain_eviction_records`
            (``False``: the histograms only, for a long run that never drains
            them; its memory then does not grow with the evictions).
        eviction_policy: which cached free block the pool reuses first, a
            spec string of ``BlockPool(eviction_policy=...)`` (``"lru"``, vLLM's
            order and the default; ``"lfu"``, ``"prefix-depth"``,
            ``"priority"``, with parameters as in ``docs/eviction.md``).
    """

    enable_caching: bool = True
    hash_block_size: int | None = None
    enable_events: bool = False
    log_stats: bool = True
    residency_metrics: bool = False
    residency_records: bool = True
    eviction_policy: str = "lru"

    def __post_init__(self) -> None:
        for name in (
            "enable_caching",
            "enable_events",
            "log_stats",
            "residency_metrics",
            "residency_records",
        ):
            as_bool(getattr(self, name), f"KVCacheManagerOptions.{name}")
        h = self.hash_block_size
        if h is not None:
            # Type and 64-bit range here; the value's rules are the core's.
            h = as_i64(h, "KVCacheManagerOptions.hash_block_size")
            object.__setattr__(self, "hash_block_size", h)
        if not isinstance(self.eviction_policy, str):
            raise ConfigTypeError(
                "KVCacheManagerOptions.eviction_policy must be a str, "
                f"got {type(self.eviction_policy).__name__}"
            )


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups since the last :meth:`KVCacheManager.make_prefix_cache_stats`."""

    requests: int = 0
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # tokens served from the cache
    reset: bool = False

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Allocates and frees KV-cache blocks for requests, with prefix caching.

    ``allocate_slots`` (see :class:`AllocateSlots`) is bound to the Rust core
    at construction, so a decode step costs one call into Rust.

    Args:
        config: the pool size and KV cache groups.
        max_model_len: longest sequence a request may reach (tokens).
        options: caching, hash unit, events, statistics
            (:class:`KVCacheManagerOptions`; its defaults when omitted).
    """

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        max_model_len: int,
        options: KVCacheManagerOptions | None = None,
    ) -> None:
        if not isinstance(config, KVCacheConfig):
            raise ConfigTypeError(f"config must be a KVCacheConfig, got {type(config).__name__}")
        options = KVCacheManagerOptions() if options is None else options
        if not isinstance(options, KVCacheManagerOptions):
            raise ConfigTypeError(
                f"options must be a KVCacheManagerOptions, got {type(options).__name__}"
            )
        self.config = config
        self.options = options
        self.max_model_len = max_model_len
        self.coordinator: KVCacheCoordinator = get_kv_cache_coordinator(
            config,
            max_model_len=max_model_len,
            enable_caching=options.enable_caching,
            hash_block_size=options.hash_block_size,
            enable_events=options.enable_events,
        )
        self.enable_caching = options.enable_caching
        self.hash_block_size = self.coordinator.hash_block_size
        self._core = self.coordinator.core
        if options.eviction_policy != "lru":  # the spec's rules are the core's
            self._core.set_eviction_policy(options.eviction_policy)
        # The per-step call goes straight to Rust: one boundary crossing and
        # no Python frame (see `AllocateSlots` for its documentation).
        self.allocate_slots: AllocateSlots = self._core.allocate_slots
        self._pool = self._core.block_pool  # a read-only view, made once
        self._empty: KVCacheBlocks = self._core.empty
        self.prefix_cache_stats: PrefixCacheStats | None = (
            PrefixCacheStats() if options.log_stats else None
        )
        if options.residency_metrics:
            self._core.enable_residency(options.residency_records)

    # ---- the scheduler's four questions --------------------------------

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of ``request`` (blocks per group, tokens).

        At most ``num_tokens - 1`` tokens: the last prompt token is always
        recomputed to produce logits. Nothing is pinned until
        :meth:`allocate_slots` adopts the blocks.

        Also sets ``request.shared_prefix_boundary`` to vLLM's third result:
        the hit plus the tokens some group matched beyond it (a shared prefix
        that a sliding-window or Mamba group has not cached), or 0 when every
        group agreed. Sparse caching keeps the state at that boundary, and
        Mamba chunking (:func:`kvcoord.mamba_aligned_chunk`) stops there.
        """
        self._check_hash_block_size(_request(request))
        if not self.enable_caching or request.skip_reading_prefix_cache:
            request.shared_prefix_boundary = 0
            return self._empty, 0
        # A request without tokens has nothing to look up (no -1 bound).
        blocks, num_hit_tokens, uncached = self.coordinator.find_longest_cache_hit(
            request, max(request.num_tokens - 1, 0)
        )
        request.shared_prefix_boundary = shared_prefix_boundary(num_hit_tokens, uncached)
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.requests += 1
            self.prefix_cache_stats.queries += request.num_tokens
            self.prefix_cache_stats.hits += num_hit_tokens
        if not num_hit_tokens:
            return self._empty, 0
        return blocks, num_hit_tokens

    def new_step_starts(self) -> None:
        """Call at the top of every scheduler step: Mamba "align" states
        cached during the previous step become usable as hits (a hit on a
        state cached in the current step makes ``allocate_slots`` return
        ``None``). A no-op for the other kinds."""
        self.coordinator.new_step_starts()

    def free(self, request: Request) -> None:
        """Release every block of ``request`` (tail first, so its deepest
        cached blocks are evicted before its shallower ones). Freeing an
        unknown or already freed request is a no-op, as in vLLM."""
        self._core.free(_request(request).request_id)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's full blocks up to ``num_computed_tokens``
        (a no-op with caching off; the arguments are checked either way).

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        self._core.cache_blocks(request, num_computed_tokens)

    @staticmethod
    def advance_requests(
        requests: list[Request],
        num_computed: Sequence[int] | npt.NDArray[np.integer],
        new_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
    ) -> None:
        """One step's bookkeeping in one call: for each request,
        ``num_computed_tokens += num_computed[i]``, then append
        ``new_tokens[i]`` when it is given and ``>= 0`` (a request that
        sampled nothing this step passes ``-1``). All-or-nothing."""
        advance_requests(requests, num_computed, new_tokens)

    # ---- inspection --------------------------------------------------------

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's whole block table per group (0 marks null positions);
        ``.arrays()`` / ``.flat`` are the fast form.

        Raises:
            UnknownRequestError: the manager holds no blocks for this id.
        """
        blocks: KVCacheBlocks = self._core.blocks(_request_id(request_id))
        return blocks

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids per group as fresh lists (vLLM's return
        type; for hot paths use :meth:`get_blocks` and its arrays).

        Raises:
            UnknownRequestError: the manager holds no blocks for this id.
        """
        return self.get_blocks(request_id).get_block_ids()

    def get_num_common_prefix_blocks(self, request_id: str) -> list[int]:
        """Per group, how many leading blocks of this request are shared by
        every running request (usable for cascade attention). Only
        full-attention kinds (full, MLA, R-SWA) can share a prefix; the other
        groups report 0. (vLLM 0.33.0 removed cascade attention and always
        reports 0; kvcoord keeps the count.)"""
        return list(self._core.num_common_prefix_blocks(_request_id(request_id)))

    @property
    def num_running_requests(self) -> int:
        return int(self._core.num_requests)

    @property
    def block_pool(self) -> BlockPoolView:
        """The pool shared by every group, read-only (blocks move through
        the manager)."""
        return self._pool

    @property
    def usage(self) -> float:
        """Fraction of the pool in use (null block excluded)."""
        return float(self._pool.usage)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; refused (False) while blocks are in use."""
        ok = bool(self._core.reset_prefix_cache())
        if ok and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return ok

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Return the statistics gathered since the last call and start anew."""
        stats = self.prefix_cache_stats
        if stats is None:
            return None
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def set_residency_clock(self, now: int) -> None:
        """Move the residency metrics' clock to ``now`` (any unit: simulated
        microseconds, steps...; never backwards). A no-op when metrics are off."""
        self._core.set_residency_clock(now)

    def residency_snapshot(self) -> ResidencySnapshot | None:
        """The residency histograms so far (``None`` when metrics are off)."""
        raw = self._core.residency_snapshot()
        return None if raw is None else ResidencySnapshot.from_core(raw)

    def drain_eviction_records(self) -> list[EvictionRecord]:
        """Take the per-eviction records gathered since the last drain (the
        content of vLLM's ``KVCacheEvictionEvent``, for every block)."""
        return [
            EvictionRecord(b, life, idle, tuple(gaps), hits)
            for b, life, idle, gaps, hits in self._core.drain_eviction_records()
        ]

    def take_events(self) -> list[object]:
        """Drain the pool's KV-cache events (empty unless ``enable_events``)."""
        return list(self._core.take_events())

    def set_request_priority(self, request: Request, priority: int, num_tokens: int) -> None:
        """Give the blocks holding the first ``num_tokens`` tokens of
        ``request``, in every group, a retention priority (0-7; the
        ``priority`` eviction policy keeps them, once freed, behind every
        ordinary block until the retention expires; ignored by the other
        policies). Call it before :meth:`free`.

        Raises:
            UnknownRequestError: the manager holds no blocks for this request.
        """
        num_tokens = as_arg(num_tokens, "num_tokens")
        tables = self.get_blocks(_request(request).request_id).arrays()
        parts = []
        for g, ids in zip(self.config.groups, tables, strict=True):
            head = np.asarray(ids[: num_tokens // g.spec.block_size])
            parts.append(head[head != 0])  # 0: a position the group does not hold
        ids_all = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)
        self._core.set_priority(ids_all, priority)

    def advance_eviction_clock(self, ticks: int = 1) -> None:
        """Advance the eviction policy's clock (retention durations count its
        ticks; e.g. one per scheduler step)."""
        self._core.advance_clock(ticks)

    def evict_blocks(self, block_ids: Sequence[int] | npt.NDArray[np.integer]) -> None:
        """Drop these blocks from the prefix cache (e.g. after a failed KV load)."""
        self._core.evict_blocks(block_ids)

    def check_invariants(self) -> None:
        """Check pool and block-table invariants (tests and debugging)."""
        self._core.check_invariants()

    def _check_hash_block_size(self, request: Request) -> None:
        if self.enable_caching and request.hash_block_size != self.hash_block_size:
            raise ConfigError(
                f"request {request.request_id!r} is hashed in units of {request.hash_block_size} "
                f"tokens but this manager uses hash_block_size={self.hash_block_size}"
            )


def _request(request: object) -> Request:
    if not isinstance(request, Request):
        raise ArgumentTypeError(
            f"request must be a kvcoord.Request, got {type(request).__name__} {request!r}"
        )
    return request


def _request_id(request_id: object) -> str:
    if not isinstance(request_id, str):
        raise ArgumentTypeError(
            f"request_id must be a str, got {type(request_id).__name__} {request_id!r}"
        )
    return request_id
