"""KV-cache layout: what kinds of layers a model has and how big its pool is.

Frozen, validated dataclasses. Each spec describes one group of layers that
share a block table; a :class:`KVCacheConfig` lists the groups that share one
pool of ``num_blocks`` blocks. Invalid values raise :class:`ConfigError`
(a ``ValueError``) naming the field.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from kvcoord._core import validate_retention_interval
from kvcoord.errors import ConfigError, ConfigTypeError

__all__ = [
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroup",
    "KVCacheSpec",
    "MambaSpec",
    "SlidingWindowSpec",
]


#: Exclusive upper bound of sizes in tokens or blocks that the core stores
#: in 32 bits (block sizes, windows, chunks, pool sizes).
LIMIT_32 = 2**32
#: Exclusive upper bound of token counts (``max_model_len``), as in the core.
MAX_TOKENS = 2**48


def as_int(value: object, name: str, *, minimum: int = 1, limit: int = LIMIT_32) -> int:
    """``value`` as a plain int in ``[minimum, limit)``; numpy integer
    scalars count as ints, bools do not.

    Raises:
        ConfigTypeError: not an int (also a ``TypeError``).
        ConfigError: out of range (names ``name``).
    """
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ConfigTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    n = operator.index(value)  # type: ignore[call-overload]
    if not minimum <= n < limit:
        raise ConfigError(f"{name} must be in [{minimum}, {limit}), got {n}")
    return n


def as_bool(value: object, name: str) -> bool:
    """``value`` if it is a bool.

    Raises:
        ConfigTypeError: anything else (``"no"`` is not ``False``).
    """
    if not isinstance(value, bool):
        raise ConfigTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _positive_int(owner: object, name: str, *, minimum: int = 1) -> None:
    value = as_int(getattr(owner, name), f"{type(owner).__name__}.{name}", minimum=minimum)
    object.__setattr__(owner, name, value)


@dataclass(frozen=True, slots=True)
class FullAttentionSpec:
    """Layers attending to every previous token: every block is kept."""

    block_size: int
    kind: Literal["full_attention"] = field(default="full_attention", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive_int(self, "block_size")


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    """Layers attending to the last ``sliding_window`` tokens: blocks that fall
    out of the window are released and replaced by the null block."""

    block_size: int
    sliding_window: int
    kind: Literal["sliding_window"] = field(default="sliding_window", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive_int(self, "block_size")
        _positive_int(self, "sliding_window")


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec:
    """Layers attending within fixed chunks of ``attention_chunk_size`` tokens:
    blocks before the current chunk are released."""

    block_size: int
    attention_chunk_size: int
    kind: Literal["chunked_local"] = field(default="chunked_local", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive_int(self, "block_size")
        _positive_int(self, "attention_chunk_size")


@dataclass(frozen=True, slots=True)
class MambaSpec:
    """State-space (Mamba) layers: one state block per request, plus
    ``num_speculative_blocks`` scratch blocks. Prefix caching of Mamba state
    is not supported yet; such a model runs with caching off."""

    block_size: int
    num_speculative_blocks: int = 0
    kind: Literal["mamba"] = field(default="mamba", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive_int(self, "block_size")
        _positive_int(self, "num_speculative_blocks", minimum=0)


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec:
    """Encoder-decoder cross-attention: one static allocation sized by the
    encoder's token count, never prefix-cached."""

    block_size: int
    kind: Literal["cross_attention"] = field(default="cross_attention", init=False, repr=False)

    def __post_init__(self) -> None:
        _positive_int(self, "block_size")


KVCacheSpec: TypeAlias = (
    FullAttentionSpec
    | SlidingWindowSpec
    | ChunkedLocalAttentionSpec
    | MambaSpec
    | CrossAttentionSpec
)
_SPEC_TYPES = (
    FullAttentionSpec,
    SlidingWindowSpec,
    ChunkedLocalAttentionSpec,
    MambaSpec,
    CrossAttentionSpec,
)


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers sharing one block table (and so one spec)."""

    spec: KVCacheSpec
    layer_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.spec, _SPEC_TYPES):
            raise ConfigError(f"KVCacheGroup.spec must be a KV cache spec, got {self.spec!r}")
        names = self.layer_names
        if not isinstance(names, str) and isinstance(names, Iterable):
            names = tuple(names)  # a generator is read once, here
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"KVCacheGroup.layer_names must be a sequence of str, got {names!r}")
        object.__setattr__(self, "layer_names", tuple(names))


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    """The pool size and the groups that share it.

    ``prefix_cache_retention_interval``: ``None`` caches densely; ``0`` keeps
    only the latest prefix boundary of sliding-window groups; ``R > 0`` keeps
    one every ``R`` tokens (a multiple of the scheduler block size).
    """

    num_blocks: int
    groups: tuple[KVCacheGroup, ...]
    prefix_cache_retention_interval: int | None = None

    def __post_init__(self) -> None:
        _positive_int(self, "num_blocks")
        groups: Iterable[KVCacheGroup] = self.groups
        if not isinstance(groups, Iterable) or isinstance(groups, str | KVCacheGroup):
            raise ConfigTypeError(f"KVCacheConfig.groups must be a sequence of KVCacheGroup, got {groups!r}")
        object.__setattr__(self, "groups", tuple(groups))
        for i, g in enumerate(self.groups):
            if not isinstance(g, KVCacheGroup):
                raise ConfigError(f"KVCacheConfig.groups[{i}] must be a KVCacheGroup, got {g!r}")
        r = self.prefix_cache_retention_interval
        if r is not None:
            # The sign rule and its message are the core's (below).
            r = as_int(
                r, "KVCacheConfig.prefix_cache_retention_interval", minimum=-(2**63), limit=MAX_TOKENS
            )
            object.__setattr__(self, "prefix_cache_retention_interval", r)
        if self.scheduler_block_size >= LIMIT_32:
            raise ConfigError(
                f"KVCacheConfig: the LCM of the groups' block sizes ({self.scheduler_block_size}) "
                "must be below 2^32"
            )
        validate_retention_interval(r, self.scheduler_block_size, self.has_sparse_groups)

    @property
    def scheduler_block_size(self) -> int:
        """LCM of the groups' block sizes: the granularity at which every
        group agrees on block boundaries."""
        return math.lcm(*(g.spec.block_size for g in self.groups)) if self.groups else 1

    @property
    def has_sparse_groups(self) -> bool:
        """Whether some group is sliding-window or Mamba (retention applies)."""
        return any(isinstance(g.spec, SlidingWindowSpec | MambaSpec) for g in self.groups)
