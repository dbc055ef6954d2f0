"""kvcoord: a fast KV-cache block manager for LLM inference schedulers.

The mechanism (block pool, free queue, prefix index, hashing, per-group
block tables) is Rust in :mod:`kvcoord._core`; policies and everything a
person touches are Python. Default decisions equal vLLM 0.33.0's.
"""

from __future__ import annotations

from kvcoord._core import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    __version__,
    validate_retention_interval,
)
from kvcoord.errors import (
    BlockStateError,
    BlockTableError,
    BlockTableIndexError,
    ConfigError,
    InvalidArgumentError,
    InvalidBlockIdError,
    InvalidHashError,
    InvariantError,
    KvCoordError,
    OutOfBlocksError,
    UnknownRequestError,
)

__all__ = [
    "AllBlocksCleared",
    "BlockPool",
    "BlockRemoved",
    "BlockStateError",
    "BlockStored",
    "BlockTableError",
    "BlockTableIndexError",
    "ConfigError",
    "InvalidArgumentError",
    "InvalidBlockIdError",
    "InvalidHashError",
    "InvariantError",
    "KvCoordError",
    "OutOfBlocksError",
    "UnknownRequestError",
    "__version__",
    "validate_retention_interval",
]
