"""kvcoord: a fast KV-cache block manager for LLM inference schedulers.

The mechanism (block pool, free queue, prefix index, hashing, per-group
block tables) is Rust in :mod:`kvcoord._core`; policies and everything a
person touches are Python. Default decisions equal vLLM 0.33.0's.
"""

from __future__ import annotations

import collections.abc as _abc

from kvcoord._core import (
    HASH_ALGOS,
    AllBlocksCleared,
    BlockHashes,
    BlockPool,
    BlockPoolView,
    BlockRemoved,
    BlockStored,
    CoordinatorKind,
    GroupSpec,
    Request,
    __version__,
    advance_requests,
    compute_block_hashes,
    default_hash_block_size,
    none_hash,
    validate_retention_interval,
)
from kvcoord.blocks import KVCacheBlocks
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from kvcoord.coordinator import (
    CoordinatorOptions,
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvcoord.errors import (
    ArgumentTypeError,
    BlockStateError,
    BlockTableError,
    BlockTableIndexError,
    ConfigError,
    ConfigTypeError,
    EventTypeError,
    HashTypeError,
    InvalidArgumentError,
    InvalidBlockIdError,
    InvalidEventError,
    InvalidHashError,
    InvalidTokenError,
    InvariantError,
    KvCoordError,
    NotServedError,
    OutOfBlocksError,
    OutOfMemoryError,
    UnknownRequestError,
)
from kvcoord.hashing import HashAlgoName, LoRA, MultiModalFeature
from kvcoord.manager import (
    AllocateSlots,
    KVCacheManager,
    KVCacheManagerOptions,
    PrefixCacheStats,
)
from kvcoord.residency import EvictionRecord, ResidencySnapshot
from kvcoord.scheduling import MambaChunkRule, mamba_aligned_chunk, mamba_chunk_rule

__all__ = [
    "HASH_ALGOS",
    "AllBlocksCleared",
    "AllocateSlots",
    "ArgumentTypeError",
    "BlockHashes",
    "BlockPool",
    "BlockPoolView",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "BlockTableError",
    "BlockTableIndexError",
    "ChunkedLocalAttentionSpec",
    "ConfigError",
    "ConfigTypeError",
    "CoordinatorKind",
    "CoordinatorOptions",
    "CrossAttentionSpec",
    "EventTypeError",
    "EvictionRecord",
    "FullAttentionSpec",
    "GroupSpec",
    "HashAlgoName",
    "HashTypeError",
    "HybridKVCacheCoordinator",
    "InvalidArgumentError",
    "InvalidBlockIdError",
    "InvalidEventError",
    "InvalidHashError",
    "InvalidTokenError",
    "InvariantError",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "KVCacheGroup",
    "KVCacheManager",
    "KVCacheManagerOptions",
    "KVCacheSpec",
    "KvCoordError",
    "LoRA",
    "MLAAttentionSpec",
    "MambaChunkRule",
    "MambaSpec",
    "MultiModalFeature",
    "NotServedError",
    "OutOfBlocksError",
    "OutOfMemoryError",
    "PrefixCacheStats",
    "RSWASpec",
    "Request",
    "ResidencySnapshot",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UnitaryKVCacheCoordinator",
    "UnknownRequestError",
    "__version__",
    "advance_requests",
    "compute_block_hashes",
    "default_hash_block_size",
    "get_kv_cache_coordinator",
    "mamba_aligned_chunk",
    "mamba_chunk_rule",
    "none_hash",
    "validate_retention_interval",
]

# The hash view is a read-only sequence (len, index, slice, iteration).
_abc.Sequence.register(BlockHashes)
