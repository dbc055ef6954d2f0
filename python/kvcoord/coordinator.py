"""Coordinator policies: how a request's prefix-cache hit is found across the
KV cache groups of a model.

The mechanism (per-group block tables, hit scans, allocation, caching,
freeing) is one Rust object, :class:`kvcoord._core.CoordinatorCore`, shared by
every policy. A policy decides, once per new request, which lookups to run
and how to reconcile their results:

* :class:`KVCacheCoordinatorNoPrefixCache`: caching off; no lookups at all.
* :class:`UnitaryKVCacheCoordinator`: one group; one scan.
* :class:`HybridKVCacheCoordinator`: several groups; groups with equal specs
  are looked up together, full attention first, and the candidate hit length
  shrinks until every spec group agrees (a fixed point).

:func:`get_kv_cache_coordinator` picks the policy for a configuration;
:class:`CoordinatorOptions` holds how the core is built, and crosses into it
as one object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from kvcoord._arith import cdiv
from kvcoord._core import (
    MAX_TOKENS,
    BlockPoolView,
    CoordinatorCore,
    CoordinatorKind,
    KVCacheBlocks,
    Request,
    choose_coordinator,
)
from kvcoord.config import KVCacheConfig, KVCacheSpec, as_arg, as_bool, as_i64
from kvcoord.errors import ConfigTypeError

__all__ = [
    "CoordinatorOptions",
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
]

#: A lookup's result: blocks per group (built by the core from the ids the
#: pool returned, so never re-validated), the hit in tokens, and the tokens
#: some spec group matched beyond that hit (vLLM's
#: ``num_uncached_common_prefix_tokens``; 0 when every group agreed).
CacheHit = tuple[KVCacheBlocks, int, int]


def shared_prefix_boundary(num_hit_tokens: int, num_uncached: int) -> int:
    """vLLM's ``shared_prefix_boundary`` for a lookup that hit ``num_hit_tokens``
    while some spec group matched ``num_uncached`` tokens further: the end of
    that longest single-group match (a junction sparse retention must keep),
    or 0 when every group stopped at the hit."""
    return num_hit_tokens + num_uncached if num_uncached else 0


@dataclass(frozen=True, slots=True)
class CoordinatorOptions:
    """How a coordinator's core is built, beyond the configuration and
    ``max_model_len``: one frozen object that the bindings read once (each
    field is also a keyword of every coordinator and of
    :func:`get_kv_cache_coordinator`).

    Attributes:
        hash_block_size: tokens per hash unit; ``None`` for the core's
            default (:func:`kvcoord.default_hash_block_size`).
        enable_events: record KV-cache events in the pool.
        num_reprefillable_tokens: multi-module MTP's re-prefillable tail
            (vLLM's ``num_prefill_lookahead - 1``), never cached.
        eagle_group_ids: groups serving an EAGLE drafter (vLLM's
            ``drop_eagle_group_ids``; groups of equal spec join them): a
            hybrid coordinator caches them one block past its aligned prefix.
        num_hash_lookahead_tokens: tokens after each hash unit its hash
            covers (vLLM's ``num_hash_lookahead_tokens``): a Mamba prefill
            checkpoint leaves that many after it.
        allow_partial_hits: sub-block (partial) Mamba hits may be turned on;
            the caller drains the core's ``take_block_copies`` and frees both
            ends of each copy once it ran (``kvcoord.vllm`` does).
        context_parallel: decode context parallelism is on (vLLM's
            ``dcp_world_size > 1``; block sizes already scaled): a Mamba
            block equal to the hash unit is enough for partial hits.
        verify_hits: refuse a hit block not cached under the request's hash
            of its position (a stale hit; the default), and computed tokens
            of a new request that come without blocks. ``False`` takes both
            as vLLM does: hits whatever the blocks hold, computed tokens with
            fresh blocks (vLLM's adapter).
        group_id_base: added to every group id the pool reports (a core
            holding groups ``base..`` of a larger configuration).
        event_medium: the medium the pool's events report (``"GPU"``,
            ``"CPU"`` or ``"STORAGE"``).
        rekey_keyed_prompt_tail: a Mamba state already keyed at the prompt's
            last hash-unit boundary is keyed again when a chunk ends there,
            as vLLM 0.32 does (it counts as cached this step).
        eagle_junction_block: under a retention interval, EAGLE groups also
            retain the block below the shared-prefix junction (vLLM 0.33,
            the default; 0.32 does not).
    """

    hash_block_size: int | None = None
    enable_events: bool = False
    num_reprefillable_tokens: int = 0
    eagle_group_ids: Sequence[int] = ()
    num_hash_lookahead_tokens: int = 0
    allow_partial_hits: bool = False
    context_parallel: bool = False
    verify_hits: bool = True
    group_id_base: int = 0
    event_medium: str = "GPU"
    rekey_keyed_prompt_tail: bool = False
    eagle_junction_block: bool = True

    def __post_init__(self) -> None:
        # Type checks and the 64-bit crossing here; the values' rules (and
        # the other fields' types) are the core's, which reads every field.
        if self.hash_block_size is not None:
            h = as_i64(self.hash_block_size, "hash_block_size")
            object.__setattr__(self, "hash_block_size", h)
        for f in fields(self):
            if f.type == "bool":  # annotations are strings in this module
                as_bool(getattr(self, f.name), f.name)


class KVCacheCoordinator:
    """Base policy: owns the Rust core and answers hit lookups.

    Every rule on the configuration (cacheable kinds, hash unit, block
    sizes, ``max_model_len``) is checked once, by the core, with its
    messages; a policy only says which :class:`CoordinatorKind` it is.

    Args:
        config: the pool size and KV cache groups.
        max_model_len: longest sequence a request may reach (tokens).
        options: how the core is built (:class:`CoordinatorOptions`; its
            defaults when omitted).
        **keywords: fields of :class:`CoordinatorOptions` by name, in place
            of those of ``options`` (``verify_hits=False``, ...).
    """

    #: Which policy this class is (decides caching and hit alignment).
    kind: ClassVar[CoordinatorKind]

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        max_model_len: int,
        options: CoordinatorOptions | None = None,
        **keywords: Any,
    ) -> None:
        # Type checks and the 64-bit crossing here; the rules are the core's.
        config = _config(config)
        max_model_len = as_i64(max_model_len, "max_model_len")
        self.config = config
        self.options = _options(options, keywords)
        self.core = CoordinatorCore(
            config.num_blocks,
            config.specs,
            kind=self.kind,
            max_model_len=max_model_len,
            retention_interval=config.prefix_cache_retention_interval,
            options=self.options,
        )
        self.enable_caching = self.kind != CoordinatorKind.NoPrefixCache
        # Per group: None, or the tokens an EAGLE lookup matches past the
        # candidate hit before it drops them (hybrid only).
        self.eagle_margins: tuple[int | None, ...] = tuple(self.core.eagle_margins)
        self.hash_block_size: int = self.core.hash_block_size
        self.scheduler_block_size: int = self.core.scheduler_block_size

    @property
    def block_pool(self) -> BlockPoolView:
        """The pool shared by every group (read-only)."""
        pool: BlockPoolView = self.core.block_pool
        return pool

    @property
    def num_groups(self) -> int:
        return len(self.config.groups)

    def empty_hit(self) -> KVCacheBlocks:
        """No block in any group (one shared, immutable object)."""
        empty: KVCacheBlocks = self.core.empty
        return empty

    def new_step_starts(self) -> None:
        """A scheduler step begins (Mamba "align" states cached during the
        previous step become usable as hits)."""
        self.core.new_step_starts()

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        """Blocks per group for the longest cached prefix of at most
        ``max_length`` tokens, its length in tokens, and how many tokens some
        spec group matched beyond it (0 unless hybrid)."""
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Prefix caching off: any number of groups (none included); every lookup
    is empty."""

    kind = CoordinatorKind.NoPrefixCache

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        as_arg(max_length, "max_length")  # refused as by the other policies
        return self.empty_hit(), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Exactly one caching group: the hit is that group's own scan."""

    kind = CoordinatorKind.Unitary

    def __init__(self, config: KVCacheConfig, *, max_model_len: int, **keywords: Any) -> None:
        super().__init__(config, max_model_len=max_model_len, **keywords)
        self._block_size = config.groups[0].spec.block_size
        # EAGLE: the hit drops its last block (no margin: one group).
        self._drop_eagle = self.eagle_margins[0] is not None

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        blocks, hit = self.core.find_longest_cache_hit(
            [0], request, max_length, self._block_size, drop_eagle=self._drop_eagle
        )
        return blocks, hit, 0


@dataclass(frozen=True)
class SpecGroup:
    """Groups with equal specs, looked up together (one scan, all groups must hit)."""

    spec: KVCacheSpec
    group_ids: tuple[int, ...]

    @property
    def is_full_attention(self) -> bool:
        """Whether hits are prefix-closed (the core's kind fact)."""
        return bool(self.spec.core.prefix_closed_hits)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups sharing one pool, with prefix caching.

    Groups with equal specs form one :class:`SpecGroup`. Full attention is
    looked up first: its hit set is closed under prefixes, so its cheap
    left-to-right scan bounds what the other kinds can hit. Sliding-window
    and chunked-local scans may then find a shorter hit; the candidate length
    shrinks and the other spec groups are asked again at that length, until
    every spec group agrees. Hits land on multiples of the scheduler block
    size so that every group sees whole blocks.

    A spec group serving EAGLE drops the last block of its hit: it is asked
    for one margin (a block) past the candidate and lands back on it. It
    drops once per candidate length: a later look at the same candidate
    does not drop again, until a non-dropping lookup shrinks the candidate
    (vLLM's rule, so that hits equal its own).
    """

    kind = CoordinatorKind.Hybrid

    def __init__(self, config: KVCacheConfig, *, max_model_len: int, **keywords: Any) -> None:
        super().__init__(config, max_model_len=max_model_len, **keywords)
        buckets: list[SpecGroup] = []
        for gid, g in enumerate(config.groups):
            if not g.spec.core.prefix_cacheable:
                # Never looked up (vLLM 0.33.0 leaves such groups out of the
                # search; their hit is empty): HiSparse's device groups.
                continue
            for i, b in enumerate(buckets):
                if b.spec == g.spec:
                    buckets[i] = SpecGroup(b.spec, (*b.group_ids, gid))
                    break
            else:
                buckets.append(SpecGroup(g.spec, (gid,)))
        # Stable: full attention first, otherwise configuration order.
        self.spec_groups: tuple[SpecGroup, ...] = tuple(
            sorted(buckets, key=lambda b: not b.is_full_attention)
        )
        # The scheduler block, or the hash unit with sub-block hits (the core's rule).
        self._alignment: int = self.core.hit_alignment
        # With exactly two spec groups led by full attention one pass suffices:
        # the second scan already ran at the full-attention bound.
        self._single_pass = len(self.spec_groups) == 2 and self.spec_groups[0].is_full_attention
        # Per spec group, computed once: (group ids as the core takes them,
        # prefix-closed?, block size, EAGLE margin or None). Groups of one
        # spec share the core's EAGLE decision.
        self._scans = tuple(
            (
                list(sg.group_ids),
                sg.is_full_attention,
                sg.spec.block_size,
                self.eagle_margins[sg.group_ids[0]],
            )
            for sg in self.spec_groups
        )

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        # Each spec group's latest lookup (its groups in `group_ids` order);
        # the first pass assigns every one.
        parts: list[KVCacheBlocks] = [self.core.empty] * len(self._scans)
        full_lengths: dict[int, int] = {}
        candidate = as_arg(max_length, "max_length")
        # The longest hit any spec group reported on the way: beyond the
        # reconciled hit it marks a shared prefix some group has not cached.
        longest = 0
        # Spec groups whose EAGLE drop is done at the current candidate.
        dropped: set[int] = set()
        while True:
            length = candidate
            for index, (group_ids, prefix_closed, _, margin) in enumerate(self._scans):
                if prefix_closed and index in full_lengths:
                    # Full-attention hits are prefix-closed: never re-scan, cut later.
                    length = min(length, full_lengths[index])
                    continue
                drop = margin is not None and index not in dropped
                parts[index], found = self.core.find_longest_cache_hit(
                    group_ids,
                    request,
                    _past(length, margin) if drop and margin else length,
                    self._alignment,
                    drop_eagle=drop,
                )
                if drop:
                    dropped.add(index)
                elif found < length:
                    dropped.clear()
                length = found
                if prefix_closed:
                    full_lengths[index] = length
                longest = max(longest, length)
            if length >= candidate:
                break
            candidate = length
            if self._single_pass:
                break
        # Every group keeps the blocks of the agreed hit (only full-attention
        # lookups may have run longer); no id is converted or re-validated.
        picks: list[tuple[KVCacheBlocks, int, int]] = [(parts[0], 0, 0)] * self.num_groups
        for index, (group_ids, _, block_size, _) in enumerate(self._scans):
            keep = cdiv(candidate, block_size)
            for i, gid in enumerate(group_ids):
                picks[gid] = (parts[index], i, keep)
        return KVCacheBlocks.gather(picks), candidate, longest - candidate

    def find_longest_cache_hit_per_group(
        self, request: Request, max_length: int
    ) -> tuple[KVCacheBlocks, tuple[int, ...]]:
        """Each spec group's own longest hit of at most ``max_length`` tokens,
        without agreeing on one length: the blocks per group and each
        group's hit in tokens (a KV connector may supply what a lagging
        group misses)."""
        max_length = as_arg(max_length, "max_length")
        picks: list[tuple[KVCacheBlocks, int, int]] = [(self.core.empty, 0, 0)] * self.num_groups
        lengths = [0] * self.num_groups
        for group_ids, _, block_size, margin in self._scans:
            # An EAGLE spec group looks one margin further, then drops, as in
            # the reconciled search (the core caps the lookup at the hashes).
            blocks, length = self.core.find_longest_cache_hit(
                group_ids,
                request,
                _past(max_length, margin) if margin else max_length,
                self._alignment,
                drop_eagle=margin is not None,
            )
            for i, gid in enumerate(group_ids):
                picks[gid] = (blocks, i, cdiv(length, block_size))
                lengths[gid] = length
        return KVCacheBlocks.gather(picks), tuple(lengths)


def _past(length: int, margin: int) -> int:
    """An EAGLE lookup's length, ``margin`` tokens past ``length``, kept a
    token count (the core caps every lookup at the request's hashes, which
    never reach the bound)."""
    return min(length + margin, MAX_TOKENS - 1)


_POLICIES: dict[CoordinatorKind, type[KVCacheCoordinator]] = {
    CoordinatorKind.NoPrefixCache: KVCacheCoordinatorNoPrefixCache,
    CoordinatorKind.Unitary: UnitaryKVCacheCoordinator,
    CoordinatorKind.Hybrid: HybridKVCacheCoordinator,
}


def get_kv_cache_coordinator(
    config: KVCacheConfig,
    *,
    max_model_len: int,
    enable_caching: bool,
    **keywords: Any,
) -> KVCacheCoordinator:
    """The policy the core chooses (:func:`kvcoord._core.choose_coordinator`):
    caching off -> NoPrefixCache; one group -> Unitary; otherwise Hybrid.
    ``keywords`` are the policy's own (``options``, or
    :class:`CoordinatorOptions` fields by name)."""
    policy = _POLICIES[
        choose_coordinator(len(_config(config).groups), as_bool(enable_caching, "enable_caching"))
    ]
    return policy(config, max_model_len=max_model_len, **keywords)


def _config(config: object) -> KVCacheConfig:
    if not isinstance(config, KVCacheConfig):
        raise ConfigTypeError(f"config must be a KVCacheConfig, got {type(config).__name__}")
    return config


def _options(options: CoordinatorOptions | None, keywords: dict[str, Any]) -> CoordinatorOptions:
    """``options`` (the defaults when ``None``) with ``keywords`` in place of
    its fields; a keyword that is no field is a ``TypeError``, as any
    unknown keyword is."""
    if options is None:
        return CoordinatorOptions(**keywords)
    if not isinstance(options, CoordinatorOptions):
        raise ConfigTypeError(f"options must be a CoordinatorOptions, got {type(options).__name__}")
    return replace(options, **keywords) if keywords else options
