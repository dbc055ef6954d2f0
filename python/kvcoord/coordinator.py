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

:func:`get_kv_cache_coordinator` picks the policy for a configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvcoord._core import BlockPool, CoordinatorCore, Request
from kvcoord.blocks import KVCacheBlocks
from kvcoord.config import (
    MAX_TOKENS,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    as_bool,
    as_int,
)
from kvcoord.errors import ConfigError

__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
]

BlockIdsPerGroup = tuple[list[int], ...]


def _spec_params(spec: KVCacheSpec) -> tuple[str, int, int]:
    """The (kind, block_size, parameter) triple the Rust core is built from."""
    param = getattr(spec, "sliding_window", 0) or getattr(spec, "attention_chunk_size", 0)
    if isinstance(spec, MambaSpec):
        param = spec.num_speculative_blocks
    return spec.kind, spec.block_size, param


class KVCacheCoordinator:
    """Base policy: owns the Rust core and answers hit lookups."""

    #: "unitary" (hits align to the group's block size) or "hybrid" (hits and
    #: cached tokens align to the scheduler block size, so that several groups
    #: agree on boundaries); None picks by the number of groups.
    arrangement: Literal["unitary", "hybrid"] | None = None

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        max_model_len: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_events: bool = False,
    ) -> None:
        max_model_len = as_int(max_model_len, "max_model_len", limit=MAX_TOKENS)
        hash_block_size = as_int(hash_block_size, "hash_block_size")
        enable_caching = as_bool(enable_caching, "enable_caching")
        enable_events = as_bool(enable_events, "enable_events")
        self.config = config
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.scheduler_block_size = config.scheduler_block_size
        if self.scheduler_block_size % hash_block_size:
            raise ConfigError(
                f"hash_block_size={hash_block_size} must divide the scheduler block size "
                f"({self.scheduler_block_size}, the LCM of the groups' block sizes)"
            )
        self.core = CoordinatorCore(
            config.num_blocks,
            [_spec_params(g.spec) for g in config.groups],
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            max_model_len=max_model_len,
            result_type=KVCacheBlocks,
            retention_interval=config.prefix_cache_retention_interval,
            arrangement=self.arrangement or ("unitary" if len(config.groups) == 1 else "hybrid"),
            enable_events=enable_events,
        )

    @property
    def block_pool(self) -> BlockPool:
        """The pool shared by every group."""
        pool: BlockPool = self.core.block_pool
        return pool

    @property
    def num_groups(self) -> int:
        return len(self.config.groups)

    def empty_hit(self) -> BlockIdsPerGroup:
        return tuple([] for _ in range(self.num_groups))

    def find_longest_cache_hit(
        self, request: Request, max_length: int
    ) -> tuple[BlockIdsPerGroup, int]:
        """Blocks per group for the longest cached prefix of at most
        ``max_length`` tokens, and its length in tokens."""
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Prefix caching off: any number of groups (none included); every lookup
    is empty."""

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        max_model_len: int,
        hash_block_size: int,
        enable_events: bool = False,
    ) -> None:
        super().__init__(
            config,
            max_model_len=max_model_len,
            enable_caching=False,
            hash_block_size=hash_block_size,
            enable_events=enable_events,
        )

    def find_longest_cache_hit(
        self, request: Request, max_length: int
    ) -> tuple[BlockIdsPerGroup, int]:
        return self.empty_hit(), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Exactly one group: the hit is that group's own scan."""

    arrangement: Literal["unitary", "hybrid"] | None = "unitary"

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        max_model_len: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_events: bool = False,
    ) -> None:
        if len(config.groups) != 1:
            raise ConfigError(
                "UnitaryKVCacheCoordinator needs exactly one KV cache group, "
                f"got {len(config.groups)}"
            )
        spec = config.groups[0].spec
        if enable_caching:
            _check_cacheable(spec)
            if hash_block_size != spec.block_size:
                raise ConfigError(
                    f"hash_block_size={hash_block_size} must equal the block size "
                    f"({spec.block_size}) when one group uses prefix caching"
                )
        super().__init__(
            config,
            max_model_len=max_model_len,
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            enable_events=enable_events,
        )
        self._block_size = spec.block_size

    def find_longest_cache_hit(
        self, request: Request, max_length: int
    ) -> tuple[BlockIdsPerGroup, int]:
        blocks, hit = self.core.find_longest_cache_hit([0], request, max_length, self._block_size)
        return (blocks[0],), hit


@dataclass(frozen=True)
class SpecGroup:
    """Groups with equal specs, looked up together (one scan, all groups must hit)."""

    spec: KVCacheSpec
    group_ids: tuple[int, ...]

    @property
    def is_full_attention(self) -> bool:
        return isinstance(self.spec, FullAttentionSpec)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups sharing one pool, with prefix caching.

    Groups with equal specs form one :class:`SpecGroup`. Full attention is
    looked up first: its hit set is closed under prefixes, so its cheap
    left-to-right scan bounds what the other kinds can hit. Sliding-window
    and chunked-local scans may then find a shorter hit; the candidate length
    shrinks and the other spec groups are asked again at that length, until
    every spec group agrees. Hits land on multiples of the scheduler block
    size so that every group sees whole blocks.
    """

    arrangement: Literal["unitary", "hybrid"] | None = "hybrid"

    def __init__(
        self,
        config: KVCacheConfig,
        *,
        max_model_len: int,
        enable_caching: bool = True,
        hash_block_size: int,
        enable_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> None:
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ConfigError(
                "context parallelism is not supported by the hybrid coordinator: "
                f"dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size} (both must be 1)"
            )
        if not config.groups:
            raise ConfigError("prefix caching needs at least one KV cache group")
        hash_block_size = as_int(hash_block_size, "hash_block_size")
        for g in config.groups:
            _check_cacheable(g.spec)
            if g.spec.block_size % hash_block_size:
                sizes = [x.spec.block_size for x in config.groups]
                raise ConfigError(
                    f"every group's block size must be a multiple of hash_block_size="
                    f"{hash_block_size}; block sizes are {sizes}"
                )
        super().__init__(
            config,
            max_model_len=max_model_len,
            enable_caching=True,
            hash_block_size=hash_block_size,
            enable_events=enable_events,
        )
        buckets: list[SpecGroup] = []
        for gid, g in enumerate(config.groups):
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
        self._alignment = self.scheduler_block_size
        # With exactly two spec groups led by full attention one pass suffices:
        # the second scan already ran at the full-attention bound.
        self._single_pass = len(self.spec_groups) == 2 and self.spec_groups[0].is_full_attention

    def find_longest_cache_hit(
        self, request: Request, max_length: int
    ) -> tuple[BlockIdsPerGroup, int]:
        hit_blocks: list[list[int]] = [[] for _ in range(self.num_groups)]
        full_lengths: dict[int, int] = {}
        candidate = max_length
        while True:
            length = candidate
            for index, sg in enumerate(self.spec_groups):
                if sg.is_full_attention and index in full_lengths:
                    # Full-attention hits are prefix-closed: never re-scan, truncate later.
                    length = min(length, full_lengths[index])
                    continue
                blocks, length = self.core.find_longest_cache_hit(
                    list(sg.group_ids), request, length, self._alignment
                )
                for gid, ids in zip(sg.group_ids, blocks, strict=True):
                    hit_blocks[gid] = ids
                if sg.is_full_attention:
                    full_lengths[index] = length
            if length >= candidate:
                break
            candidate = length
            if self._single_pass:
                break
        for index in full_lengths:
            sg = self.spec_groups[index]
            keep = -(-candidate // sg.spec.block_size)
            for gid in sg.group_ids:
                del hit_blocks[gid][keep:]
        return tuple(hit_blocks), candidate


def _check_cacheable(spec: KVCacheSpec) -> None:
    if isinstance(spec, MambaSpec):
        raise ConfigError(
            "prefix caching of Mamba state is not supported; build the manager with "
            "enable_caching=False for models with Mamba layers"
        )
    if isinstance(spec, CrossAttentionSpec):
        raise ConfigError(
            "cross-attention blocks are never prefix-cached; build the manager with "
            "enable_caching=False for encoder-decoder models"
        )


def default_hash_block_size(config: KVCacheConfig, enable_caching: bool) -> int:
    """vLLM's choice: one group (or caching off) hashes at the scheduler block
    size; several caching groups at the GCD of their block sizes."""
    if not enable_caching or len(config.groups) <= 1:
        return config.scheduler_block_size
    return math.gcd(*(g.spec.block_size for g in config.groups))


def get_kv_cache_coordinator(
    config: KVCacheConfig,
    *,
    max_model_len: int,
    enable_caching: bool,
    hash_block_size: int | None = None,
    enable_events: bool = False,
    dcp_world_size: int = 1,
    pcp_world_size: int = 1,
) -> KVCacheCoordinator:
    """Caching off -> NoPrefixCache; one group -> Unitary; otherwise Hybrid."""
    enable_caching = as_bool(enable_caching, "enable_caching")
    if hash_block_size is not None:
        hash_block_size = as_int(hash_block_size, "hash_block_size")
    if hash_block_size is None:
        hash_block_size = default_hash_block_size(config, enable_caching)
    if (dcp_world_size, pcp_world_size) != (1, 1):
        raise ConfigError(
            "context parallelism is not supported: "
            f"dcp_world_size={dcp_world_size}, pcp_world_size={pcp_world_size} (both must be 1)"
        )
    common = {
        "max_model_len": max_model_len,
        "hash_block_size": hash_block_size,
        "enable_events": enable_events,
    }
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(config, **common)  # type: ignore[arg-type]
    if len(config.groups) == 1:
        return UnitaryKVCacheCoordinator(config, enable_caching=True, **common)  # type: ignore[arg-type]
    return HybridKVCacheCoordinator(config, enable_caching=True, **common)  # type: ignore[arg-type]
