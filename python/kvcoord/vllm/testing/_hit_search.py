"""The hit search of vLLM 0.33.0's single-type managers, over a
:class:`kvcoord.vllm.BlockPool`.

vLLM's ``FullAttentionManager``, ``SlidingWindowManager`` and
``ChunkedLocalAttentionManager`` each have a class method
``find_longest_cache_hit(block_hashes, max_length, kv_cache_group_ids,
block_pool, kv_cache_spec, drop_eagle_block, alignment_tokens, ...)``: the
longest cached prefix of one spec over a pool. The classes here take vLLM's
constructor and answer that method with the core's per-spec finder
(``kvcoord.BlockPool.find_longest_cache_hit``, the one a coordinator runs
for a group of that spec); the blocks come back as the pool's blocks.

Only the hit search is served: a request's tables, allocation, caching and
release (``allocate_new_blocks``, ``remove_skipped_blocks``, ``free``, ...)
are a coordinator's, which owns its pool, and are not served over a
standalone pool (docs/vllm.md, "vLLM's BlockPool"). Those attributes raise
``AttributeError`` naming what is served.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, ClassVar

from kvcoord.vllm.serve._windows import spec_reason, window_spec
from kvcoord.vllm.testing._pool import BlockPool, PoolBlock, _stand_in

__all__ = ["ChunkedLocalAttentionManager", "FullAttentionManager", "SlidingWindowManager"]


def _interface() -> Any:
    return importlib.import_module("vllm.v1.kv_cache_interface")


class _HitSearch:
    """A vLLM single-type manager whose hit search is the core's."""

    #: vLLM's spec class names this manager's search serves (exact types).
    _specs: ClassVar[tuple[str, ...]] = ()

    # What these classes stand for, for the pytest plugin's rule
    # (kvcoord.vllm.testing._lending): each subclass names its vLLM class; what is
    # served is the constructor, the hit search and the attributes set here.
    vllm_class: ClassVar[str] = ""
    #: Attributes vLLM's manager copies from its spec (served, as here).
    _spec_attributes: ClassVar[tuple[str, ...]] = ()
    vllm_hands_out: ClassVar[dict[str, str]] = {}
    vllm_needs: ClassVar[tuple[str, ...]] = ("vllm.v1.core.block_pool:BlockPool",)
    vllm_serves: ClassVar[frozenset[str]] = frozenset(
        {
            "find_longest_cache_hit",
            "kv_cache_spec",
            "block_pool",
            "block_size",
            "kv_cache_group_id",
            "enable_caching",
            "scheduler_block_size",
            "max_admission_blocks_per_request",
        }
    )

    def __init__(
        self, kv_cache_spec: Any, block_pool: Any, kv_cache_group_id: int = 0, **kwargs: Any
    ) -> None:
        self._core_spec(kv_cache_spec)
        self._check_pool(block_pool)
        self.kv_cache_spec = kv_cache_spec
        self.block_pool = block_pool
        self.block_size = int(kv_cache_spec.block_size)
        self.kv_cache_group_id = int(kv_cache_group_id)
        self.enable_caching = bool(kwargs.get("enable_caching", True))
        self.scheduler_block_size = kwargs.get("scheduler_block_size", self.block_size)
        self.max_admission_blocks_per_request = kwargs.get("max_admission_blocks_per_request")
        for name in self._spec_attributes:
            setattr(self, name, getattr(kv_cache_spec, name))

    @staticmethod
    def _check_pool(block_pool: Any) -> None:
        if not isinstance(block_pool, BlockPool):
            raise TypeError(
                f"kvcoord.vllm: the hit search runs over a kvcoord.vllm.BlockPool, "
                f"not {type(block_pool).__name__}"
            )

    @classmethod
    def _core_spec(cls, kv_cache_spec: Any) -> Any:
        """The core's spec of ``kv_cache_spec`` (refused unless served here)."""
        kind = type(kv_cache_spec).__name__
        if kind not in cls._specs or type(kv_cache_spec) is not getattr(_interface(), kind):
            raise NotImplementedError(f"kvcoord.vllm: {cls.__name__} over a {kind}")
        if kind == "FullAttentionSpec":
            from kvcoord.config import FullAttentionSpec

            return FullAttentionSpec(block_size=int(kv_cache_spec.block_size)).core
        reason = spec_reason(kv_cache_spec)
        if reason is not None:
            raise NotImplementedError(f"kvcoord.vllm: {reason}")
        return window_spec(kv_cache_spec).core

    @classmethod
    def _refuse(cls, kv_cache_spec: Any, alignment_tokens: int, drop_eagle_block: bool) -> None:
        """Lookups this class does not serve (vLLM refuses some of them too)."""

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: Sequence[int],
        block_pool: Any,
        kv_cache_spec: Any,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[tuple[list[PoolBlock], ...], int]:
        """vLLM's longest cache hit of ``block_hashes`` (hash units) for the
        groups ``kv_cache_group_ids`` of this spec: per group the blocks (the
        null block in skipped positions) and the hit in tokens."""
        cls._check_pool(block_pool)
        spec = cls._core_spec(kv_cache_spec)
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise NotImplementedError("kvcoord.vllm: a hit search with context parallelism")
        cls._refuse(kv_cache_spec, int(alignment_tokens), bool(drop_eagle_block))
        lists, hit = block_pool.pool.find_longest_cache_hit(
            spec,
            [int(g) for g in kv_cache_group_ids],
            [_stand_in(bytes(h)) for h in block_hashes],
            int(max_length),
            int(alignment_tokens),
            drop_eagle=bool(drop_eagle_block),
        )
        return tuple([PoolBlock(block_pool, i) for i in ids] for ids in lists), int(hit)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"kvcoord.vllm.{type(self).__name__}.{name}: only the constructor and "
            "find_longest_cache_hit are served over a standalone pool"
        )


class FullAttentionManager(_HitSearch):
    """vLLM's ``FullAttentionManager`` hit search (whole blocks only: an
    ``alignment_tokens`` below the block size, vLLM's sub-block hits, is not
    served)."""

    _specs = ("FullAttentionSpec",)
    vllm_class = "vllm.v1.core.single_type_kv_cache_manager:FullAttentionManager"

    @classmethod
    def _refuse(cls, kv_cache_spec: Any, alignment_tokens: int, drop_eagle_block: bool) -> None:
        if alignment_tokens < int(kv_cache_spec.block_size):
            raise NotImplementedError(
                "kvcoord.vllm: a full-attention hit search at a finer alignment than the block"
            )


class SlidingWindowManager(_HitSearch):
    """vLLM's ``SlidingWindowManager`` hit search."""

    _specs = ("SlidingWindowSpec",)
    vllm_class = "vllm.v1.core.single_type_kv_cache_manager:SlidingWindowManager"
    _spec_attributes = ("sliding_window",)
    vllm_serves = _HitSearch.vllm_serves | {"sliding_window"}


class ChunkedLocalAttentionManager(_HitSearch):
    """vLLM's ``ChunkedLocalAttentionManager`` hit search (vLLM refuses an
    EAGLE drop and an alignment other than the block size; so does this)."""

    _specs = ("ChunkedLocalAttentionSpec",)
    vllm_class = "vllm.v1.core.single_type_kv_cache_manager:ChunkedLocalAttentionManager"
    _spec_attributes = ("attention_chunk_size",)
    vllm_serves = _HitSearch.vllm_serves | {"attention_chunk_size"}

    @classmethod
    def _refuse(cls, kv_cache_spec: Any, alignment_tokens: int, drop_eagle_block: bool) -> None:
        if drop_eagle_block or alignment_tokens != int(kv_cache_spec.block_size):
            raise ValueError(
                "chunked local attention: no EAGLE drop, and alignment_tokens must be "
                "the block size"
            )
