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
    BlockRemoved,
    BlockStored,
    Request,
    __version__,
    compute_block_hashes,
    none_hash,
    validate_retention_interval,
)
from kvcoord.errors import (
    BlockStateError,
    ConfigError,
    InvalidBlockIdError,
    InvalidHashError,
    InvalidTokenError,
    InvariantError,
    KvCoordError,
    OutOfBlocksError,
    UnknownRequestError,
)
from kvcoord.hashing import HashAlgoName, LoRA, MultiModalFeature

__all__ = [
    "HASH_ALGOS",
    "AllBlocksCleared",
    "BlockHashes",
    "BlockPool",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "ConfigError",
    "HashAlgoName",
    "InvalidBlockIdError",
    "InvalidHashError",
    "InvalidTokenError",
    "InvariantError",
    "KvCoordError",
    "LoRA",
    "MultiModalFeature",
    "OutOfBlocksError",
    "Request",
    "UnknownRequestError",
    "__version__",
    "compute_block_hashes",
    "none_hash",
    "validate_retention_interval",
]

# The hash view is a read-only sequence (len, index, slice, iteration).
_abc.Sequence.register(BlockHashes)
