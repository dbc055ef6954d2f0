"""KV-cache layout: what kinds of layers a model has and how big its pool is.

Frozen, validated dataclasses. Each spec describes one group of layers that
share a block table; a :class:`KVCacheConfig` lists the groups that share one
pool of ``num_blocks`` blocks. Invalid values raise :class:`ConfigError`
(a ``ValueError``) naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal, TypeAlias

from kvcoord._core import GroupSpec, int_arg, validate_retention_interval
from kvcoord._core import scheduler_block_size as _scheduler_block_size
from kvcoord.errors import ConfigError, ConfigTypeError, InvalidArgumentError

__all__ = [
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "KVCacheConfig",
    "KVCacheGroup",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "RSWASpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
]


#: The kinds of integer the core converts (``kvcoord._core.NUMBER_MAX``
#: holds the largest value of each unsigned one; README, "Bad input and
#: limits"); ``"i64"`` is a signed 64-bit value whose rules are the core's.
NumberKind: TypeAlias = Literal["tokens", "blocks", "block_id", "group_id", "u32", "u64", "i64"]


def as_int(value: object, name: str, *, minimum: int = 1, kind: NumberKind = "u32") -> int:
    """A configuration value as a plain int of ``kind``, converted by the
    core's one conversion (numpy integer scalars count as ints, bools do
    not), and at least ``minimum``.

    Raises:
        ConfigTypeError: not an int (also a ``TypeError``).
        ConfigError: out of range (names ``name``).
    """
    n = int_arg(value, name, kind, config=True)
    if n < minimum:
        raise ConfigError(f"invalid {name}={n}: must be at least {minimum}")
    return n


def as_arg(value: object, name: str, *, minimum: int = 0, kind: NumberKind = "tokens") -> int:
    """An argument (not a configuration value) as a plain int of ``kind``
    (by default a token count), converted by the core's one conversion, and
    at least ``minimum``.

    Raises:
        ArgumentTypeError: not an int (also a ``TypeError``).
        InvalidArgumentError: out of range (names ``name``).
    """
    n = int_arg(value, name, kind)
    if n < minimum:
        raise InvalidArgumentError(f"invalid {name}: {n} (must be at least {minimum})")
    return n


def as_i64(value: object, name: str) -> int:
    """``value`` as a plain int that crosses into the core as a signed
    64-bit integer (whose own rules then apply)."""
    return int_arg(value, name, "i64", config=True)


def as_bool(value: object, name: str) -> bool:
    """``value`` if it is a bool.

    Raises:
        ConfigTypeError: anything else (``"no"`` is not ``False``).
    """
    if not isinstance(value, bool):
        raise ConfigTypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _int_field(owner: object, name: str, value: object) -> None:
    """Type check and normalise (numpy integer scalars become ints); the
    value's rules and their messages are the core's. Values beyond 64 bits
    are refused here, naming the field, rather than overflowing on the way."""
    n = as_i64(value, f"{type(owner).__name__}.{name}")
    object.__setattr__(owner, name, n)


def _set_core(owner: object, core: GroupSpec) -> None:
    object.__setattr__(owner, "core", core)


class _Spec:
    """Base of the spec classes: a spec pickles as its constructor arguments,
    so the core spec is rebuilt (and validated again) where it is loaded, for
    instance in a ``kvcoord sweep`` worker process."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        args = tuple(getattr(self, f.name) for f in fields(self) if f.init)  # type: ignore[arg-type]
        return type(self), args


@dataclass(frozen=True, slots=True)
class FullAttentionSpec(_Spec):
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
class SlidingWindowSpec(_Spec):
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
class ChunkedLocalAttentionSpec(_Spec):
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
class MambaSpec(_Spec):
    """State-space (Mamba) layers.

    ``mamba_cache_mode="none"`` (default): one state block per request plus
    ``num_speculative_blocks`` scratch blocks, no prefix caching (build the
    manager with ``enable_caching=False``).

    ``mamba_cache_mode="align"``: states are cached at block boundaries, so
    prefix caching works; a hit must agree with the attention groups' hit.
    The scheduler must end prefill chunks where a state should be cached:
    clip every prefill chunk with :func:`kvcoord.mamba_aligned_chunk` and
    call :meth:`kvcoord.KVCacheManager.new_step_starts` at the top of each
    step. ``num_prefill_checkpoint_blocks > 0`` lets a chunk export the state
    at the prompt's last cacheable boundary into a reserved block (Mamba2),
    when ``prefill_checkpoint_alignment`` (tokens, relative to the chunk
    start) allows it; ``None`` means the backend cannot export one.
    ``num_speculative_blocks`` (MTP) keeps that many scratch blocks after
    the running state. Align mode supports ``hash_block_size == block_size``.
    """

    block_size: int
    num_speculative_blocks: int = 0
    mamba_cache_mode: Literal["none", "align"] = "none"
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None
    kind: ClassVar[str] = "mamba"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        for name in ("num_speculative_blocks", "num_prefill_checkpoint_blocks"):
            _int_field(self, name, getattr(self, name))
        a = self.prefill_checkpoint_alignment
        if a is not None:
            _int_field(self, "prefill_checkpoint_alignment", a)
        mode = self.mamba_cache_mode
        if not isinstance(mode, str):
            raise ConfigTypeError(
                f"MambaSpec.mamba_cache_mode must be a str, got {type(mode).__name__} {mode!r}"
            )
        if mode == "none":
            if self.num_prefill_checkpoint_blocks:
                raise ConfigError(
                    "MambaSpec.num_prefill_checkpoint_blocks needs mamba_cache_mode='align', "
                    f"got {self.num_prefill_checkpoint_blocks} with mode 'none'"
                )
            _set_core(self, GroupSpec.mamba(self.block_size, self.num_speculative_blocks))
        elif mode == "align":
            _set_core(
                self,
                GroupSpec.mamba_align(
                    self.block_size,
                    self.num_speculative_blocks,
                    self.num_prefill_checkpoint_blocks,
                    a,
                ),
            )
        else:
            raise ConfigError(f"MambaSpec.mamba_cache_mode must be 'none' or 'align', got {mode!r}")

    @property
    def prefix_cacheable(self) -> bool:
        """Whether states are prefix-cached (mode "align"; the core's fact)."""
        return bool(self.core.prefix_cacheable)


@dataclass(frozen=True, slots=True)
class CrossAttentionSpec(_Spec):
    """Encoder-decoder cross-attention: one static allocation sized by the
    encoder's token count, never prefix-cached."""

    block_size: int
    kind: ClassVar[str] = "cross_attention"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _set_core(self, GroupSpec.cross_attention(self.block_size))


@dataclass(frozen=True, slots=True)
class MLAAttentionSpec(_Spec):
    """Multi-head latent attention (one latent vector per token, DeepSeek
    style): managed exactly like full attention, but a spec of its own (a
    hybrid model looks MLA groups up apart from plain full attention)."""

    block_size: int
    kind: ClassVar[str] = "mla_attention"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _set_core(self, GroupSpec.mla_attention(self.block_size))


@dataclass(frozen=True, slots=True)
class SlidingWindowMLASpec(_Spec):
    """Sliding-window MLA layers (DeepSeek-V4 style): managed exactly like
    :class:`SlidingWindowSpec`, a spec of its own."""

    block_size: int
    sliding_window: int
    kind: ClassVar[str] = "sliding_window_mla"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _int_field(self, "sliding_window", self.sliding_window)
        _set_core(self, GroupSpec.sliding_window_mla(self.block_size, self.sliding_window))


@dataclass(frozen=True, slots=True)
class RSWASpec(_Spec):
    """Reference sliding-window attention: the prompt stays fully visible,
    only the last ``rswa_window`` generated tokens do. Every allocation frees
    the decode gap between the prompt's last block and the window; freed gap
    blocks keep their cache keys (with prefix caching on, a later request
    whose prompt covers them can hit them although their KV was computed
    under the window). Lookups count it as full attention."""

    block_size: int
    rswa_window: int
    kind: ClassVar[str] = "rswa"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _int_field(self, "rswa_window", self.rswa_window)
        _set_core(self, GroupSpec.rswa(self.block_size, self.rswa_window))


@dataclass(frozen=True, slots=True)
class HiSparseResidentSpec(_Spec):
    """vLLM 0.33.0's HiSparse resident pages: device copies of KV whose home
    is a host tier. A request's table is append-only, with null entries for
    pages read from the host; a residency overlay (see
    :meth:`kvcoord._core.CoordinatorCore.residency_row`) records pages
    adopted from copies and pages given back. Never prefix-cached (lookups
    skip the group). kvcoord.vllm serves vLLM's HiSparse configurations
    unless ``KVCOORD_VLLM_HISPARSE=0`` (docs/hisparse.md)."""

    block_size: int
    kind: ClassVar[str] = "hisparse_resident"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _set_core(self, GroupSpec.hisparse_resident(self.block_size))


@dataclass(frozen=True, slots=True)
class HiSparseHotSpec(_Spec):
    """vLLM 0.33.0's HiSparse hot region: ``blocks_per_request`` blocks a
    request holds once it reads from the host tier (an import, a resumed
    host prefix, or on demand: :meth:`kvcoord._core.CoordinatorCore.require_hot`).
    Never prefix-cached."""

    block_size: int
    blocks_per_request: int
    kind: ClassVar[str] = "hisparse_hot"
    core: GroupSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _int_field(self, "block_size", self.block_size)
        _int_field(self, "blocks_per_request", self.blocks_per_request)
        _set_core(self, GroupSpec.hisparse_hot(self.block_size, self.blocks_per_request))


KVCacheSpec: TypeAlias = (
    FullAttentionSpec
    | SlidingWindowSpec
    | ChunkedLocalAttentionSpec
    | MambaSpec
    | CrossAttentionSpec
    | MLAAttentionSpec
    | SlidingWindowMLASpec
    | RSWASpec
    | HiSparseResidentSpec
    | HiSparseHotSpec
)
_SPEC_TYPES = (
    FullAttentionSpec,
    SlidingWindowSpec,
    ChunkedLocalAttentionSpec,
    MambaSpec,
    CrossAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    RSWASpec,
    HiSparseResidentSpec,
    HiSparseHotSpec,
)


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers sharing one block table (and so one spec). Layer names are
    distinct and non-empty; a layer belongs to one group of a config."""

    spec: KVCacheSpec
    layer_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.spec, _SPEC_TYPES):
            raise ConfigTypeError(f"KVCacheGroup.spec must be a KV cache spec, got {self.spec!r}")
        names = self.layer_names
        if isinstance(names, str | bytes) or not isinstance(names, Iterable):
            raise ConfigTypeError(
                f"KVCacheGroup.layer_names must be a sequence of str, got {names!r}"
            )
        names = tuple(names)  # a generator is read once, here
        if not all(isinstance(n, str) for n in names):
            raise ConfigTypeError(
                f"KVCacheGroup.layer_names must be a sequence of str, got {names!r}"
            )
        seen: set[str] = set()
        for n in names:
            if not n or n in seen:
                raise ConfigError(
                    "KVCacheGroup.layer_names must be distinct, non-empty names, "
                    f"got {n!r} in {names!r}"
                )
            seen.add(n)
        object.__setattr__(self, "layer_names", names)


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
        n = as_int(self.num_blocks, "KVCacheConfig.num_blocks", kind="blocks")
        object.__setattr__(self, "num_blocks", n)
        groups: Iterable[KVCacheGroup] = self.groups
        if not isinstance(groups, Iterable) or isinstance(groups, str | KVCacheGroup):
            raise ConfigTypeError(
                f"KVCacheConfig.groups must be a sequence of KVCacheGroup, got {groups!r}"
            )
        object.__setattr__(self, "groups", tuple(groups))
        for i, g in enumerate(self.groups):
            if not isinstance(g, KVCacheGroup):
                raise ConfigTypeError(
                    f"KVCacheConfig.groups[{i}] must be a KVCacheGroup, got {g!r}"
                )
        seen: set[str] = set()
        for i, g in enumerate(self.groups):
            dup = seen.intersection(g.layer_names)
            if dup:
                raise ConfigError(
                    f"KVCacheConfig.groups[{i}]: layer name(s) {sorted(dup)} "
                    "already belong to an earlier group"
                )
            seen.update(g.layer_names)
        r = self.prefix_cache_retention_interval
        if r is not None:
            # The sign rule and its message are the core's (below).
            r = as_i64(r, "KVCacheConfig.prefix_cache_retention_interval")
            object.__setattr__(self, "prefix_cache_retention_interval", r)
        sbs = self.scheduler_block_size  # saturates at 2^32 - 1 in the core
        if any(sbs % g.spec.block_size for g in self.groups):
            raise ConfigError(
                "KVCacheConfig: the LCM of the groups' block sizes "
                f"{[g.spec.block_size for g in self.groups]} must be below 2^32"
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
