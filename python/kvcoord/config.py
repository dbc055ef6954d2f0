"""KV-cache layout: what kinds of layers a model has and how big its pool is.

Frozen, validated dataclasses. Each spec describes one group of layers that
share a block table; a :class:`KVCacheConfig` lists the groups that share one
pool of ``num_blocks`` blocks. Invalid values raise :class:`ConfigError`
(a ``ValueError``) naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from kvcoord._core import GroupSpec, validate_retention_interval
from kvcoord._core import scheduler_block_size as _scheduler_block_size
from kvcoord.errors import ConfigError

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


def _int_field(owner: object, name: str, value: object) -> None:
    """Type check only; the value's rules (and their messages) are the core's."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{type(owner).__name__}.{name} must be a positive int, got {value!r}")


def _set_core(owner: object, core: GroupSpec) -> None:
    object.__setattr__(owner, "core", core)


@dataclass(frozen=True, slots=True)
class FullAttentionSpec:
    """Layers attending to every previous token: every block is kept."""

    block_size: int
    #: Display name only; every fact about the kind comes from :attr:`core`.
    kind: ClassVar[str] = "full_attention"
    #: The core's spec (its facts: ``prefix_cacheable``, ``sparse``, ...).
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _set_core(self, GroupSpec.full_attention(self.block_size))


@dataclass(frozen=True, slots=True)
class SlidingWindowSpec:
    """Layers attending to the last ``sliding_window`` tokens: blocks that fall
    out of the window are released and replaced by the null block."""

    block_size: int
    sliding_window: int
    kind: ClassVar[str] = "sliding_window"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _int_field(self, "sliding_window", self.sliding_window)
        _set_core(self, GroupSpec.sliding_window(self.block_size, self.sliding_window))


@dataclass(frozen=True, slots=True)
class ChunkedLocalAttentionSpec:
    """Layers attending within fixed chunks of ``attention_chunk_size`` tokens:
    blocks before the current chunk are released."""

    block_size: int
    attention_chunk_size: int
    kind: ClassVar[str] = "chunked_local"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _int_field(self, "attention_chunk_size", self.attention_chunk_size)
        _set_core(self, GroupSpec.chunked_local(self.block_size, self.attention_chunk_size))


@dataclass(frozen=True, slots=True)
class MambaSpec:
    """State-space (Mamba) layers: one state block per request, plus
    ``num_speculative_blocks`` scratch blocks. Prefix caching of Mamba state
    is not supported yet; such a model runs with caching off."""

    block_size: int
    num_speculative_blocks: int = 0
    kind: ClassVar[str] = "mamba"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        n = self.num_speculative_blocks
        if isinstance(n, bool) or not isinstance(n, int):
            raise ConfigError(f"MambaSpec.num_speculative_blocks must be an int >= 0, got {n!r}")
        _set_core(self, GroupSpec.mamba(self.block_size, n))


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec:
    """Encoder-decoder cross-attention: one static allocation sized by the
    encoder's token count, never prefix-cached."""

    block_size: int
    kind: ClassVar[str] = "cross_attention"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _set_core(self, GroupSpec.cross_attention(self.block_size))


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
        n = self.num_blocks
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ConfigError(f"KVCacheConfig.num_blocks must be a positive int, got {n!r}")
        groups: Iterable[KVCacheGroup] = self.groups
        object.__setattr__(self, "groups", tuple(groups))
        for i, g in enumerate(self.groups):
            if not isinstance(g, KVCacheGroup):
                raise ConfigError(f"KVCacheConfig.groups[{i}] must be a KVCacheGroup, got {g!r}")
        r = self.prefix_cache_retention_interval
        if r is not None and (isinstance(r, bool) or not isinstance(r, int)):
            raise ConfigError(
                f"KVCacheConfig.prefix_cache_retention_interval must be an int or None, got {r!r}"
            )
        validate_retention_interval(r, self.scheduler_block_size, self.retention_applies)

    @property
    def specs(self) -> list[GroupSpec]:
        """The core specs of the groups, by group id."""
        return [g.spec.core for g in self.groups]

    @property
    def scheduler_block_size(self) -> int:
        """LCM of the groups' block sizes: the granularity at which every
        group agrees on block boundaries (computed by the core)."""
        return int(_scheduler_block_size(self.specs))

    @property
    def retention_applies(self) -> bool:
        """Whether some group caches sparsely, so that a retention interval
        applies (sliding window, Mamba; the core's kind facts decide)."""
        return any(g.spec.core.sparse for g in self.groups)
