"""Type stubs and documentation of the compiled core, ``kvcoord._core``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from types import NotImplementedType
from typing import Any, ClassVar, Literal, Protocol, TypeAlias, final, overload

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

from kvcoord.coordinator import CoordinatorOptions

__all__ = [
    "EVICTION_POLICIES",
    "HASH_ALGOS",
    "MAX_TOKENS",
    "NUMBER_MAX",
    "AllBlocksCleared",
    "BlockHashGate",
    "BlockHashes",
    "BlockPool",
    "BlockPoolView",
    "BlockRemoved",
    "BlockStored",
    "CoordinatorCore",
    "CoordinatorKind",
    "DecodeFastPath",
    "GroupSpec",
    "HiSparsePair",
    "KVCacheBlocks",
    "PrefixIndex",
    "Request",
    "UnboundedPrefixCache",
    "__version__",
    "advance_requests",
    "batch_plan",
    "batch_step",
    "choose_coordinator",
    "compute_block_hashes",
    "default_hash_block_size",
    "int_arg",
    "mooncake_prompt_tokens",
    "none_hash",
    "scheduler_block_size",
    "validate_retention_interval",
]

__version__: str

BlockIds = Sequence[int] | npt.NDArray[np.integer]
"""Block ids: a list/tuple of ints or a 1-D integer numpy array."""

# ---------------------------------------------------------------- integers
#
# Every integer argument is of one kind, named by its annotation, with the
# range the core supports (README, "Bad input and limits"). A negative int,
# one past its kind's maximum or beyond 64 bits raises a kvcoord error that
# is a ``ValueError`` (``InvalidArgumentError``; ``InvalidBlockIdError`` for
# a block id; ``ConfigError`` for a configuration value: constructor sizes
# and limits, spec sizes, retention intervals), never ``OverflowError``, and
# changes nothing. A ``bool`` or a non-int raises ``ArgumentTypeError``
# (``ConfigTypeError``). Numpy integer scalars are ints.
#
# Memory: what a call allocates in proportion to the caller's objects (a
# pool's per-block arrays such as ``free_block_ids``, ``ref_counts`` and
# ``cached_mask``; a request's ``block_hashes_array``, token lists and
# digests; pool-sized state such as residency metrics or a new eviction
# policy) is reserved first: an allocation the system refuses raises
# ``OutOfMemoryError`` (a ``MemoryError``) and changes nothing.

TokenCount: TypeAlias = int
"""A token count or token position: ``0 <= n < 2**48`` (``MAX_TOKENS``)."""
BlockCount: TypeAlias = int
"""A count of blocks, or a position in a block table or in a request's
hashes: ``0 <= n < 2**32``."""
BlockId: TypeAlias = int
"""A block id: ``0 <= n < 2**32`` and, where a pool reads it, below its size."""
GroupId: TypeAlias = int
"""A KV cache group id: ``0 <= n < 2**32``, and a group of the callee."""
U32: TypeAlias = int
"""A 32-bit value (a size in tokens, a priority, clock ticks):
``0 <= n < 2**32``, then the callee's own rule."""
U64: TypeAlias = int
"""A 64-bit value (a clock reading): ``0 <= n < 2**64``."""
I64: TypeAlias = int
"""A signed 64-bit configuration value (``-2**63 <= n < 2**63``), then the
callee's own rule (a spec size, a retention interval)."""

NumberKind = Literal["tokens", "blocks", "block_id", "group_id", "u32", "u64"]

NUMBER_MAX: dict[NumberKind, int]
"""The largest value of each unsigned kind: ``"tokens"`` (``TokenCount``),
``"blocks"`` (``BlockCount``), ``"block_id"``, ``"group_id"``, ``"u32"``,
``"u64"``."""

MAX_TOKENS: int
"""Exclusive bound of every token count: ``2**48``."""

def int_arg(
    value: object,
    name: str,
    kind: NumberKind | Literal["i64"] | None = None,
    *,
    config: bool = False,
) -> int:
    """The core's conversion of one integer argument, for Python code that
    takes integers of its own: ``value`` as an int of ``kind`` (default
    ``"tokens"``; ``"i64"`` only with ``config``), refused as ``name``.

    Raises:
        InvalidArgumentError: out of the kind's range (``ConfigError`` with
            ``config``; ``InvalidBlockIdError`` for a block id).
        ArgumentTypeError: not an int (``ConfigTypeError`` with ``config``).
    """

@final
class BlockPool:
    """The KV-cache block pool: block metadata, the free queue (front is handed
    out next, back is kept longest) and the prefix index from
    ``(block hash, group id)`` to cached blocks.

    Decisions (ids handed out, eviction order) equal vLLM 0.33.0's
    ``BlockPool``. Block 0 is the null block: never handed out, never
    counted, skipped silently by :meth:`free_blocks` and :meth:`touch`.

    Every method validates its whole input first: a call that raises leaves
    the pool exactly as it was. Calls are serialised: one from another
    thread waits (without the GIL) for the running one; a call re-entering
    the pool on the same thread (from Python code an argument runs) raises
    ``RuntimeError`` and changes nothing (README, "Threads").
    """

    def __init__(
        self,
        num_blocks: BlockCount,
        *,
        enable_caching: bool = True,
        hash_block_size: U32 = 16,
        enable_events: bool = False,
        eviction_policy: str = "lru",
    ) -> None:
        """Create a pool of ``num_blocks`` blocks (the null block included).

        ``eviction_policy`` orders the reuse of cached free blocks: ``"lru"``
        (vLLM's order, the default), ``"lfu"``, ``"prefix-depth"`` or
        ``"priority"``, optionally with its parameter
        (``"lfu:half_life=N"``, ``"prefix-depth:half_life=N"``,
        ``"priority:retention=N"``); see ``docs/eviction.md``.

        Raises:
            ConfigError: ``num_blocks < 1``, ``hash_block_size < 1`` or an
                unknown ``eviction_policy``.
        """
    @property
    def num_blocks(self) -> int:
        """Number of blocks, the null block included."""
    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (evictable cached blocks included)."""
    @property
    def usage(self) -> float:
        """Fraction of usable blocks (null block excluded) in use, in ``[0, 1]``."""
    @property
    def num_cached_blocks(self) -> int:
        """Number of distinct keys in the prefix index."""
    @property
    def num_evictions(self) -> int:
        """Cached blocks handed out again for new data since construction
        (each a prefix-cache eviction; ``evict_blocks`` is not counted)."""
    @property
    def enable_caching(self) -> bool:
        """Whether prefix caching is on."""
    @property
    def hash_block_size(self) -> int:
        """Tokens per hash unit."""
    @property
    def enable_events(self) -> bool:
        """Whether KV-cache events are recorded."""
    @property
    def eviction_policy(self) -> str:
        """The eviction policy's spec string (``"lru"`` by default)."""
    def set_priority(self, block_ids: BlockIds, priority: U32) -> None:
        """Mark blocks as held by a request of ``priority`` (0, ordinary, to 7).
        Only the ``"priority"`` policy acts on it: a cached block released
        with priority ``p > 0`` is reused after every ordinary free block
        until its retention expires (see :meth:`advance_clock`).

        Raises:
            InvalidBlockIdError: an id is out of range.
            InvalidArgumentError: ``priority`` is outside ``0..7``.
        """
    def advance_clock(self, ticks: U32) -> None:
        """Advance the clock of time-based eviction policies by ``ticks``
        (for example one per scheduler step); expired retentions apply now.

        Raises:
            InvalidArgumentError: ``ticks`` is negative or above ``2**31 - 1``.
        """
    @property
    def metadata_bytes(self) -> int:
        """Heap bytes of per-block metadata (16 per block), prefix index excluded."""
    def get_new_blocks(self, num_blocks: BlockCount) -> list[int]:
        """Take ``num_blocks`` blocks from the front of the free queue, each with
        one reference. A taken block that was still cached is evicted.

        Raises:
            OutOfBlocksError: more blocks requested than are free (a ``ValueError``).
            InvalidArgumentError: ``num_blocks`` is negative.
        """
    def get_new_blocks_array(self, num_blocks: BlockCount) -> npt.NDArray[np.uint32]:
        """Like :meth:`get_new_blocks`, returning a ``uint32`` numpy array.

        The fastest round trip: passing that array back to :meth:`free_blocks`
        or :meth:`touch` copies the ids out in one ``memcpy`` instead of
        converting one Python ``int`` per block.
        """
    def free_blocks(self, block_ids: BlockIds) -> None:
        """Release one reference of each block, given in eviction-priority order
        (first = evicted first). Blocks reaching zero references go to the
        front of the free queue when uncached, to the back when cached, in the
        order given; a block listed several times takes the place of its last
        occurrence. On any error nothing is released.

        Raises:
            BlockStateError: a block would drop below zero references (double free).
            InvalidBlockIdError: an id is negative or not below ``num_blocks``.
        """
    def touch(self, block_ids: BlockIds) -> None:
        """Add one reference to each block; free blocks leave the free queue."""
    def unpin_blocks(self, block_ids: BlockIds) -> None:
        """Release one reference of each block while its contents stay readable
        until the pool hands it out again (vLLM's ``BlockPool.unpin_blocks``,
        used by HiSparse for device pages whose host copy is durable). Blocks
        reaching zero join the back of the free queue, cached or not; every
        listed block is watched until :meth:`get_new_blocks` hands it out or a
        successful :meth:`reset_prefix_cache` forgets the pool's contents, then
        reported once by :meth:`take_reused_watched`. On any error nothing
        changes.

        Raises:
            BlockStateError: a block is listed more often than it has references.
            InvalidBlockIdError: an id is negative or not below ``num_blocks``.
            InvalidArgumentError: the null block, or a pool with a ranked
                eviction policy.
        """
    def take_reused_watched(self) -> npt.NDArray[np.uint32]:
        """The watched blocks (:meth:`unpin_blocks`) handed out or forgotten since
        the last call, in that order; each is reported once."""
    @property
    def num_watched(self) -> int:
        """Blocks watched by :meth:`unpin_blocks` and not reused yet."""
    def cache_full_blocks(
        self,
        block_ids: BlockIds,
        block_hashes: Sequence[bytes] | npt.NDArray[np.uint8],
        num_cached_blocks: BlockCount,
        num_full_blocks: BlockCount,
        group_id: GroupId,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Register ``block_ids[num_cached_blocks:num_full_blocks]`` in the prefix
        index under ``block_hashes[i]`` salted with ``group_id``.

        ``block_hashes`` holds at least ``num_full_blocks`` 16- or 32-byte
        digests (a list of bytes or an ``(n, digest_len)`` uint8 array).
        ``block_mask`` (one entry per new block) skips blocks marked False.
        A no-op when caching is off or ``num_cached_blocks >= num_full_blocks``.

        Raises:
            BlockStateError: a selected block is already cached.
            InvalidHashError: a hash is not 16 or 32 bytes.
            InvalidArgumentError: ranges or mask length inconsistent.
        """
    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None:
        """One cached block per group (the earliest cached under the key), or
        ``None`` when any group misses. Pure lookup: nothing is pinned."""
    def evict_blocks(self, block_ids: BlockIds) -> None:
        """Drop these blocks' cache keys; reference counts and queue positions
        are unchanged."""
    def insert_key(
        self, block_id: BlockId, block_hash: bytes, group_id: GroupId, num_tokens: U32 | None = None
    ) -> bool:
        """Key one block under ``(block_hash, group_id)`` by hand, as vLLM's
        pool does for a caller's insert into its index or ``set_block_hash``:
        a no-op when the block holds that key already; its primary key when
        it has none (``num_tokens``: the prefix a partial key stands for,
        None: the whole block), a secondary key otherwise. The null block is
        keyed too when asked (the pool's own caching never keys it).
        Reference counts and queue positions do not change; no event is
        recorded (removing the key later is reported as usual). Returns
        whether the key was added (False with caching off).

        Raises:
            InvalidBlockIdError: the id is out of range.
            InvalidHashError: the hash is not 16 or 32 bytes.
            InvalidArgumentError: a pool with a ranked eviction policy.
        """
    def find_longest_cache_hit(
        self,
        spec: GroupSpec,
        group_ids: Sequence[int],
        block_hashes: Sequence[bytes] | npt.NDArray[np.uint8],
        max_length: TokenCount,
        alignment: TokenCount,
        *,
        drop_eagle: bool = False,
    ) -> tuple[list[list[int]], int]:
        """The longest cached prefix of ``block_hashes`` (hash units of this
        pool's ``hash_block_size``) for groups ``group_ids`` of one ``spec``:
        the search a coordinator runs for a group of that spec, at most
        ``max_length`` tokens, ending on a multiple of ``alignment``. Per
        group the blocks (0 in positions the spec skips) and the hit in
        tokens. ``drop_eagle``: the hit loses its last block (EAGLE). Pins
        nothing.

        Raises:
            InvalidArgumentError: ``alignment`` is 0, ``max_length`` reaches
                past the hashes where the spec's search reads every block
                (chunked local), an EAGLE drop on a chunked-local search.
            InvalidHashError: a hash is not 16 or 32 bytes.
        """
    def enable_residency(self, records: bool = True) -> None:
        """Start tracking residency metrics for every block (45 bytes per
        block; clock at 0). Enabling again keeps the data gathered so far.
        ``records=False`` keeps the histograms only: evictions then add no
        record for :meth:`drain_eviction_records` (whose memory would grow
        with every eviction of a long replay that never drains them)."""
    @property
    def residency_enabled(self) -> bool:
        """Whether residency metrics are tracked."""
    def set_residency_clock(self, now: U64) -> None:
        """Move the residency clock to ``now`` (ignored when metrics are off
        or when ``now`` is earlier than the clock)."""
    def residency_snapshot(self) -> dict[str, tuple[list[int], int, int, int]] | None:
        """Histograms ``lifetime``, ``idle_before_eviction``, ``reuse_gap``,
        ``hits_per_block`` as ``(log2 buckets, count, sum, max)``; ``None``
        when metrics are off."""
    def drain_eviction_records(self) -> list[tuple[int, int, int, list[int], int]]:
        """Take the eviction records since the last drain: ``(block_id,
        lifetime, idle, reuse_gaps, hits)`` per evicted block."""
    def enable_sampled_lives(self, sample_rate: float, seed: U64) -> None:
        """Start vLLM's sampled residency metrics (``--kv-cache-metrics``):
        follow a ``sample_rate`` share (``0 < sample_rate <= 1``) of block
        lives, drawn from ``seed``. A life starts at allocation, counts each
        hit, and ends when the block is handed out again (caching on) or
        named by :meth:`evict_blocks`; a prefix-cache reset forgets every
        life. Enabling again starts over.

        Raises:
            ConfigError: ``sample_rate`` outside ``(0, 1]``.
        """
    def drain_life_samples(self) -> list[tuple[int, int, list[int]]]:
        """Take the sampled lives ended since the last drain, oldest first:
        ``(lifetime, idle, reuse_gaps)`` in nanoseconds (vLLM's
        ``KVCacheEvictionEvent``); empty when the sampled metrics are off."""
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix. Returns False (logging a warning on the
        ``kvcoord`` logger) unless only the null block is in use."""
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """Drain the recorded events (always empty when events are off)."""
    def free_block_ids(self) -> npt.NDArray[np.uint32]:
        """The free queue, front (handed out next) to back."""
    def free_neighbours(self, block_id: BlockId) -> tuple[int, int] | None:
        """``(prev, next)``: the free-queue entries either side of a free block,
        front side first (-1 at an end of the queue); None if it is not free."""
    def ref_counts(self) -> npt.NDArray[np.uint32]:
        """Reference count of every block, indexed by id."""
    def cached_mask(self) -> npt.NDArray[np.bool_]:
        """Whether each block carries a cache key, indexed by id."""
    def block_hash(self, block_id: BlockId) -> tuple[bytes, int] | None:
        """The ``(hash, group_id)`` key a block is cached under, if any."""
    def primary_key_tokens(self, block_id: BlockId) -> int | None:
        """Tokens behind the block's primary key when it is a partial
        (sub-block) key; None for a full-block key or no key."""
    def key_num_tokens(self, block_id: BlockId) -> int | None:
        """Tokens behind the block's primary key (vLLM's
        ``block_hash_num_tokens``): the block's end for a full-block key, a
        partial key's own count; None without a key."""
    def cache_keys(self, block_id: BlockId) -> list[tuple[bytes, int]]:
        """Every ``(hash, group_id)`` key the block is cached under: the
        primary key first, then its secondary keys in insertion order."""
    def check_invariants(self) -> None:
        """Check every internal invariant (O(num_blocks)); raises
        ``InvariantError`` on a violation. For tests and debugging."""

@final
class BlockStored:
    """One ``cache_full_blocks`` call registered blocks in the prefix cache
    (vLLM 0.33.0's ``BlockStored``, field for field; per-block data as numpy
    arrays, so taking events makes one object per event, never per block).
    Hashes are in vLLM's default integer form: the digest's last 8 bytes as
    a big-endian unsigned integer. See docs/events.md."""

    @property
    def block_hashes(self) -> npt.NDArray[np.uint64]:
        """Integer hashes of the stored blocks (null and masked blocks of the
        range are not listed)."""
    @property
    def block_hash_digests(self) -> list[bytes]:
        """Full digests of the stored blocks (built on each access)."""
    @property
    def block_ids(self) -> npt.NDArray[np.uint32]:
        """Ids of the stored blocks, aligned with ``block_hashes``."""
    @property
    def parent_block_hash(self) -> int | None:
        """Integer hash of the block before the range; None when it starts at 0."""
    @property
    def parent_block_digest(self) -> bytes | None:
        """Full digest of the block before the range; None when it starts at 0."""
    @property
    def token_ids(self) -> npt.NDArray[np.uint32]:
        """The request's tokens of the whole range, skipped blocks included
        (empty when a bare :class:`BlockPool` cached the blocks)."""
    @property
    def block_size(self) -> int:
        """Tokens per block of the group."""
    @property
    def first_block(self) -> int:
        """Position (in blocks) of the range's first block."""
    @property
    def num_blocks(self) -> int:
        """Blocks in the range, skipped (null or masked) ones included: the
        range covers tokens ``first_block * block_size`` to
        ``(first_block + num_blocks) * block_size``."""
    @property
    def positions(self) -> npt.NDArray[np.uint32]:
        """Positions (in blocks) of the stored blocks, aligned with ``block_ids``."""
    @property
    def group_idx(self) -> int:
        """The KV-cache group."""
    @property
    def medium(self) -> str:
        """``"GPU"``, ``"CPU"`` or ``"STORAGE"``."""
    @property
    def lora_name(self) -> str | None:
        """The request's LoRA adapter name."""
    @property
    def kv_cache_spec_kind(self) -> str | None:
        """The group's spec kind in vLLM's spelling (``"full_attention"``...;
        None from a bare :class:`BlockPool`)."""
    @property
    def kv_cache_spec_sliding_window(self) -> int | None:
        """The group's sliding window, when it has one."""
    @property
    def extra_keys(self) -> list[tuple[str | tuple[str, int], ...] | None] | None:
        """Per stored block, its untagged extra keys (LoRA name,
        ``(mm_identifier, offset)`` pairs, cache salt) or None; None when no
        block was stored."""
    def __len__(self) -> int:
        """Number of stored blocks."""

@final
class BlockRemoved:
    """A block lost its cache key (evicted or reused); one per block, as vLLM
    reports them, even when another block still holds the same key."""

    @property
    def block_hash(self) -> int:
        """The removed key's hash, integer form."""
    @property
    def block_hashes(self) -> list[int]:
        """vLLM's list form, ``[block_hash]``."""
    @property
    def block_hash_digest(self) -> bytes:
        """The removed key's full digest."""
    @property
    def group_idx(self) -> int: ...
    @property
    def medium(self) -> str: ...

@final
class AllBlocksCleared:
    """``reset_prefix_cache`` dropped every key."""

def validate_retention_interval(
    interval: I64 | None, scheduler_block_size: U32, has_sparse_groups: bool
) -> None:
    """Check a prefix-cache retention interval: ``None`` (dense) is always
    accepted; without sliding-window or Mamba groups only 0; otherwise a
    non-negative multiple of ``scheduler_block_size``.

    Raises:
        ConfigError: naming the value and the rule it breaks.
    """

# ---------------------------------------------------------------- hashing

HashAlgoName = Literal["sha256_cbor", "xxhash_cbor", "xxh3_native", "supplied"]

HASH_ALGOS: tuple[HashAlgoName, ...]
"""The accepted ``hash_algo`` names:
``("sha256_cbor", "xxhash_cbor", "xxh3_native", "supplied")``."""

EVICTION_POLICIES: tuple[str, ...]
"""The built-in eviction policies' names (what an ``eviction_policy`` spec
starts with): ``("lru", "lfu", "prefix-depth", "priority")``."""

TokenIds = Sequence[int] | npt.NDArray[np.integer]
"""Token ids: a list/tuple of ints or a 1-D integer numpy array (uint32 is
copied in one slice). Each must be in ``[0, 2**32)``."""

class _LoRALike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...

class _MultiModalLike(Protocol):
    @property
    def identifier(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def length(self) -> int: ...

LoRAArg = tuple[str, str] | _LoRALike
"""``(name, path)``, or an object with ``name`` and ``path`` (``kvcoord.LoRA``)."""

MultiModalArg = tuple[str, int, int] | _MultiModalLike
"""``(identifier, offset, length)`` in prompt-token positions, or an object
with those attributes (``kvcoord.MultiModalFeature``)."""

@final
class Request:
    """A request's token ids (prompt then outputs) and the chained hashes of
    its full blocks, as vLLM 0.33.0's ``Request`` keeps them.

    Block ``i`` covers tokens ``[i*B, (i+1)*B)`` with ``B = hash_block_size``;
    only full blocks are hashed. Hashes are computed on creation and extended
    by :meth:`append_output_token_ids`; earlier hashes are never recomputed.
    Hashing a long prompt (4096+ new tokens) releases the GIL.

    Algorithms: ``"sha256_cbor"`` and ``"xxhash_cbor"`` are byte-identical to
    vLLM 0.33.0 (SHA-256 / XXH3-128 over canonical CBOR of
    ``[parent, [tokens...], extra_keys | null]``); ``"xxh3_native"`` is
    kvcoord's own faster format (XXH3-128 over the parent digest, the tokens
    as little-endian u32 and length-prefixed extra keys; frozen as version
    1, not vLLM-compatible). ``"supplied"`` computes nothing: the caller
    hands over each full block's digest with :meth:`supply_block_hashes`
    (16 or 32 bytes, e.g. the digests a scheduler computed with a hash kvcoord
    does not implement); the request may hold fewer digests than full blocks,
    and lookups and caching stop where they end.

    Seed: ``hash_seed`` sets the root ``NONE_HASH = H(seed)``. When it is
    None, ``sha256_cbor`` uses vLLM's ``"vllm-none-hash"`` and the other
    algorithms a random seed drawn once per process: XXH3 is not collision
    resistant, so a predictable seed would let an attacker precompute token
    sequences that collide with another tenant's cached prefix. Pass an
    explicit, secret seed only when several processes must agree on digests.
    (Unlike vLLM, the ``PYTHONHASHSEED`` environment variable is not read.)

    Extra keys, in vLLM's order: ``("lora", name, path)`` on every block;
    ``("mm", identifier, offset - block_start)`` on every block a multimodal
    item overlaps (negative when the item began earlier; items are sorted by
    offset); ``("cache_salt", salt)`` on block 0 only (an empty salt is no
    salt).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: TokenIds,
        *,
        hash_block_size: U32,
        hash_algo: HashAlgoName = "sha256_cbor",
        hash_seed: str | None = None,
        cache_salt: str | None = None,
        lora: LoRAArg | None = None,
        mm_features: Iterable[MultiModalArg] | None = None,
    ) -> None:
        """Raises:
        InvalidTokenError: a token id is negative or >= 2**32 (the message
            gives its position).
        ConfigError: unknown ``hash_algo`` (the message lists the allowed
            names) or ``hash_block_size < 1``.
        ValueError: a multimodal offset or length outside ``[0, 2**32)``.
        TypeError: arguments of the wrong type.
        """

    def append_output_token_ids(self, token_ids: int | TokenIds) -> None:
        """Append one token or many and hash the blocks they complete.
        All-or-nothing: on an invalid token nothing is appended."""

    def catch_up(self, token_ids: list[int], start: BlockCount) -> list[bytes] | None:
        """Catch up with ``token_ids``, a list extending this request's tokens
        (a scheduler's request, all its tokens so far): append those past
        :attr:`num_tokens` (hashing the blocks they complete) and return the
        block hashes from ``start`` on. None (nothing changed) when this
        request holds more tokens than ``token_ids``; all-or-nothing on an
        invalid token (``InvalidTokenError``)."""
    def supply_block_hashes(self, block_hashes: Sequence[bytes] | npt.NDArray[np.uint8]) -> None:
        """Append the digests of the next full blocks (``hash_algo="supplied"``
        only): a sequence of bytes or a ``(n, digest_len)`` uint8 array.
        All-or-nothing.

        Raises:
            ConfigError: the request computes its own hashes.
            InvalidHashError: a digest is not 16 or 32 bytes.
            InvalidArgumentError: a digest's length differs from the request's earlier
                ones, or the digests would outnumber the full blocks.
        """

    @property
    def request_id(self) -> str: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV is computed (set by the scheduler; starts at 0)."""
    @num_computed_tokens.setter
    def num_computed_tokens(self, value: TokenCount) -> None: ...
    skip_reading_prefix_cache: bool
    @property
    def shared_prefix_boundary(self) -> int:
        """The shared-prefix boundary of the last prefix-cache lookup
        (``KVCacheManager.get_computed_blocks`` sets it; vLLM's third lookup
        result): 0, or where some group matched beyond the reconciled hit."""
    @shared_prefix_boundary.setter
    def shared_prefix_boundary(self, value: TokenCount) -> None: ...
    @property
    def num_in_flight_tokens(self) -> int:
        """Tokens of ``num_computed_tokens`` in steps whose output is not back
        yet (async scheduling; starts at 0). Windows release blocks on the
        processed basis, ``num_computed_tokens - num_in_flight_tokens``."""
    @num_in_flight_tokens.setter
    def num_in_flight_tokens(self, value: TokenCount) -> None: ...
    """When True, ``KVCacheManager.get_computed_blocks`` reports no hit (e.g.
    the request wants prompt logprobs, which cached tokens cannot give)."""
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def all_token_ids(self) -> list[int]: ...
    def token_ids_array(self) -> npt.NDArray[np.uint32]:
        """All token ids as a new 1-D uint32 array."""
    @property
    def hash_block_size(self) -> int: ...
    @property
    def hash_algo(self) -> HashAlgoName: ...
    @property
    def digest_len(self) -> int:
        """Bytes per block hash: 32 for sha256_cbor, 16 otherwise."""
    @property
    def cache_salt(self) -> str | None: ...
    @property
    def lora(self) -> tuple[str, str] | None: ...
    @property
    def mm_features(self) -> list[tuple[str, int, int]]:
        """The multimodal items, sorted by offset."""
    @property
    def block_hashes(self) -> BlockHashes:
        """A live read-only sequence view of the full blocks' hashes (each
        item a new ``bytes``). For hot paths prefer
        :meth:`block_hashes_array` or :meth:`block_hashes_bytes`."""
    @property
    def num_block_hashes(self) -> int: ...
    def block_hashes_array(self) -> npt.NDArray[np.uint8]:
        """The hashes as a new ``(num_block_hashes, digest_len)`` uint8 array."""
    def block_hashes_bytes(self) -> bytes:
        """The hashes concatenated (``num_block_hashes * digest_len`` bytes)."""

@final
class BlockHashes(Sequence[bytes]):
    """Read-only, live view of a :class:`Request`'s block hashes."""

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int, /) -> bytes: ...
    @overload
    def __getitem__(self, index: slice, /) -> list[bytes]: ...
    def __iter__(self) -> Iterator[bytes]: ...
    def __reversed__(self) -> Iterator[bytes]: ...
    def __contains__(self, value: object, /) -> bool: ...
    def index(self, value: object, start: int = 0, stop: int | None = None) -> int:
        """Position of the first equal hash (``ValueError`` if none)."""
    def count(self, value: object) -> int:
        """Number of equal hashes."""
    def __eq__(self, other: object, /) -> bool:
        """Equal to another view or any sequence of the same bytes."""

def compute_block_hashes(
    token_ids: TokenIds,
    *,
    hash_block_size: U32,
    hash_algo: HashAlgoName = "sha256_cbor",
    hash_seed: str | None = None,
    cache_salt: str | None = None,
    lora: LoRAArg | None = None,
    mm_features: Iterable[MultiModalArg] | None = None,
) -> list[bytes]:
    """Hashes of every full block of ``token_ids`` at once: the same values a
    :class:`Request` with these arguments holds. Errors as for ``Request``;
    ``"supplied"`` raises ``ConfigError`` (its digests come from the caller)."""

def none_hash(hash_algo: HashAlgoName = "sha256_cbor", hash_seed: str | None = None) -> bytes:
    """The root digest (parent of block 0) for an algorithm and seed; the
    seed defaults as for :class:`Request`. ``"supplied"`` raises
    ``ConfigError`` (kvcoord computes no digest for it)."""

# ---------------------------------------------------------------- coordination

@final
class CoordinatorCore:
    """The mechanism under every coordinator policy: one pool shared by one
    manager per KV cache group, every request's per-group block tables and
    the registry of live requests (by request id). Python policies
    (``kvcoord.coordinator``) decide which lookups to run;
    :class:`kvcoord.KVCacheManager` is the public facade.

    ``groups`` are the core specs of the groups (``spec.core`` of the Python
    spec dataclasses); ``kind`` is the policy. Every configuration rule is
    checked here (``ConfigError``).
    """

    def __init__(
        self,
        num_blocks: BlockCount,
        groups: Sequence[GroupSpec],
        *,
        kind: CoordinatorKind,
        max_model_len: TokenCount,
        retention_interval: I64 | None = None,
        options: CoordinatorOptions | None = None,
    ) -> None:
        """``options``: how the core is built
        (:class:`kvcoord.coordinator.CoordinatorOptions`, whose fields say
        what each option does; read by attribute, each refused as the keyword
        of its name; the core's defaults when omitted)."""
    @property
    def hash_block_size(self) -> int:
        """Tokens per hash unit."""
    @property
    def scheduler_block_size(self) -> int:
        """LCM of the groups' block sizes."""
    @property
    def num_reprefillable_tokens(self) -> int:
        """Multi-module MTP's re-prefillable tail."""
    @property
    def verify_hits(self) -> bool:
        """Whether ``allocate_slots`` checks each hit against the prefix index."""
    @property
    def eagle_groups(self) -> list[int]:
        """The groups whose hits drop the EAGLE block, those of equal spec
        included."""
    @property
    def held_back_tokens(self) -> list[int]:
        """Per group, the re-prefillable tokens it holds back from caching
        (all of them with one caching group and in a hybrid coordinator's
        EAGLE groups, none in its other groups)."""
    def num_cacheable_tokens(self, group: GroupId, num_computed_tokens: TokenCount) -> int:
        """How many of ``num_computed_tokens`` ``group`` may cache (vLLM's
        ``get_num_cacheable_tokens``); ``InvalidArgumentError`` for an unknown
        group."""
    @property
    def empty(self) -> KVCacheBlocks:
        """The shared result with no block in any group."""
    @property
    def block_pool(self) -> BlockPoolView:
        """A read-only view of the shared pool (the same state, not a copy)."""
    @property
    def num_requests(self) -> int:
        """Requests currently holding blocks."""
    @property
    def eagle_margins(self) -> list[int | None]:
        """Per group: ``None`` unless its hits drop EAGLE's block, else the
        tokens a hybrid lookup lets it match past the candidate hit before
        dropping them (a block; 0 for Mamba, whose finder never drops)."""
    def find_longest_cache_hit(
        self,
        group_ids: Sequence[int],
        request: Request,
        max_length: TokenCount,
        alignment: TokenCount,
        *,
        drop_eagle: bool = False,
    ) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix for groups sharing one spec, at most
        ``max_length`` tokens, a multiple of ``alignment``: the blocks (one
        group per entry of ``group_ids``, 0 in skipped positions) and the hit
        in tokens. ``drop_eagle`` (EAGLE groups only): the hit drops its last
        block. Pins nothing."""
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: TokenCount,
        num_new_computed_tokens: TokenCount = 0,
        new_computed_blocks: KVCacheBlocks | Sequence[BlockIds] | None = None,
        num_lookahead_tokens: TokenCount = 0,
        num_encoder_tokens: TokenCount = 0,
        delay_cache_blocks: bool = False,
        num_external_computed_tokens: TokenCount = 0,
    ) -> KVCacheBlocks | None:
        """One scheduler step for ``request`` in every group: release blocks
        that left the window, adopt the hits (first allocation), allocate,
        cache the newly full blocks. New ids per group (:attr:`empty` when no
        group got a new block); ``None`` when the pool cannot hold them
        (nothing changed)."""
    @property
    def has_decode_room(self) -> bool:
        """Whether decode steps have rooms (:meth:`decode_room`): every group
        full attention, all holding back the same re-prefillable tail."""
    def decode_room(
        self,
        need: TokenCount,
        cached_to: TokenCount,
        hashed: TokenCount,
        num_lookahead_tokens: TokenCount,
    ) -> int | None:
        """The room a request has after an allocation for ``need`` slots that
        cached the full blocks of ``cached_to`` tokens, ``hashed`` of them
        with hashes, as one limit for steps of ``num_lookahead_tokens``
        speculative tokens: a later such step whose computed plus new tokens
        stay below it needs no block and caches none. None where decode steps
        have no room (:attr:`has_decode_room`)."""
    def decode_slots(
        self,
        request: Any,
        mine: Request,
        request_id: str,
        num_new_tokens: TokenCount,
        num_lookahead_tokens: TokenCount,
        rooms: dict[str, int],
    ) -> tuple[list[int], ...] | NotImplementedType | None:
        """One decode step of vLLM 0.33.0's running ``request`` (the fast path
        of :mod:`kvcoord.vllm`): ``mine``, its kvcoord request, is brought up
        to date from it (new output tokens, vLLM's new block hashes, the
        computed-token count, read from the request once), then
        ``allocate_slots`` of ``num_new_tokens`` new and
        ``num_lookahead_tokens`` speculative tokens (no hits, no external or
        encoder tokens), the caching vLLM does (clipped to vLLM's hashes),
        and ``rooms[request_id]`` set to the room afterwards (the
        :meth:`decode_room` limit). Returns the new block ids per group
        (``()`` when no group got one), ``None`` when the pool cannot hold
        the step (nothing allocated), or ``NotImplemented`` (nothing changed)
        when ``mine`` needs the adapter's registry to sync it (another kind
        of request object, placeholder token ids, ``mine`` ahead of
        ``request``, vLLM hashes a computing request lacks)."""
    def num_blocks_to_allocate(
        self,
        request: Request,
        num_tokens: TokenCount,
        new_computed_blocks: KVCacheBlocks | Sequence[BlockIds] | None = None,
        total_computed_tokens: TokenCount | None = None,
        num_encoder_tokens: TokenCount | None = None,
        max_in_flight_tokens: TokenCount | None = None,
        num_local_computed_tokens: TokenCount | None = None,
        num_tokens_main_model: TokenCount | None = None,
        prefill_end: TokenCount | None = None,
    ) -> int:
        """Blocks an allocation of ``num_tokens`` slots would pull from the
        pool (vLLM's ``get_num_blocks_to_allocate``); with
        ``max_in_flight_tokens``, capped per group at the most blocks a
        request can hold (sliding window, chunked local, HiSparse resident
        pages: vLLM's full-sequence admission check).
        ``num_local_computed_tokens``: of ``total_computed_tokens``, those
        computed locally (default: all; HiSparse groups tell an import
        apart). ``num_tokens_main_model``: of ``num_tokens``, the main
        model's (default: all); Mamba groups hold no state for the
        speculative rest. ``prefill_end``: where the prefill ends, as vLLM's
        coordinator takes it (default: the request's own,
        ``max(num_prompt_tokens, num_tokens - 1)``); only sparse retention
        reads it. Changes nothing."""
    def remove_skipped_blocks(
        self,
        request_id: str,
        num_computed_tokens: TokenCount,
        num_prompt_tokens: TokenCount | None = None,
    ) -> bool:
        """Release the request's blocks that left every group's attention
        window; False for an unknown id (nothing held)."""
    def cache_blocks(self, request: Request, num_tokens: TokenCount) -> None:
        """Cache the request's full blocks within its first ``num_tokens`` tokens."""
    def new_step_starts(self) -> None:
        """A scheduler step begins: Mamba "align" states cached during the
        previous step become usable as hits."""
    def take_boundary_state_offloads(self) -> list[tuple[str, int, int, int]]:
        """Drain the Mamba "align" states committed since the last call:
        ``(request_id, group, block_id, num_tokens)`` each, in the order they
        were cached; a freed request's are dropped. Nothing is pinned."""
    @property
    def partial_hits(self) -> bool:
        """Whether sub-block (partial) hits are on (vLLM's
        ``enable_partial_hash_hits``)."""
    @property
    def retention_interval(self) -> int | None:
        """The prefix-cache retention interval (None: dense)."""
    @property
    def hit_alignment(self) -> int:
        """Tokens a hit ends on a multiple of: the hash unit with sub-block
        (partial) Mamba hits, else the scheduler block size."""
    def request_mamba_checkpoint(self, request_id: str, group: GroupId) -> tuple[int, int] | None:
        """The prefill checkpoint a live request's latest allocation reserved
        in a Mamba "align" group: ``(token_position, table_index)``, or None."""
    def set_retention_interval(self, interval: I64 | None) -> None:
        """Change the prefix-cache retention interval between steps (None:
        dense); refused as at construction."""
    def take_block_copies(self) -> list[tuple[int, int]]:
        """Drain the copy-on-write copies made since the last call:
        ``(src_block_id, dst_block_id)`` each (Mamba states at sub-block
        boundaries); both ends stay held by the caller until freed through
        :meth:`free_caller_blocks`."""
    def finalize_partial_tail_offloads(
        self, request_id: str, num_computed_tokens: TokenCount, num_in_flight_tokens: TokenCount
    ) -> list[tuple[int, int, int]]:
        """A finishing request's own sub-block prompt-tail states that no
        later token was computed into: ``(group, block_id, num_tokens)``
        each; forgotten either way."""
    def enable_residency(self, records: bool = True) -> None:
        """Start tracking residency metrics of the pool's blocks (see
        :meth:`BlockPool.enable_residency`)."""
    def set_residency_clock(self, now: U64) -> None:
        """Move the residency clock (see :meth:`BlockPool.set_residency_clock`)."""
    def residency_snapshot(self) -> dict[str, tuple[list[int], int, int, int]] | None:
        """The residency histograms (see :meth:`BlockPool.residency_snapshot`)."""
    def drain_eviction_records(self) -> list[tuple[int, int, int, list[int], int]]:
        """The eviction records since the last drain (see
        :meth:`BlockPool.drain_eviction_records`)."""
    def enable_sampled_lives(self, sample_rate: float, seed: U64) -> None:
        """Start vLLM's sampled residency metrics on the pool (see
        :meth:`BlockPool.enable_sampled_lives`)."""
    def drain_life_samples(self) -> list[tuple[int, int, list[int]]]:
        """The sampled lives ended since the last drain (see
        :meth:`BlockPool.drain_life_samples`)."""
    def free(self, request_id: str) -> bool:
        """Release the request's blocks (tail first); False for an unknown id."""
    def pop_request_to_caller(self, request_id: str) -> list[list[int]] | None:
        """Forget the request and hand its blocks' references to the caller
        (vLLM's ``pop_blocks_for_free``): per group, its ids in allocation
        order, leading nulls trimmed (a HiSparse resident group's row with
        its overlay applied); None for an unknown id. No reference count
        changes; release them with :meth:`free_caller_blocks`."""
    def blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's block table per group (raises ``UnknownRequestError``)."""
    def num_common_prefix_blocks(self, request_id: str) -> list[int]:
        """Per group, leading blocks shared by every running request."""
    def resident_page(self, request_id: str, group: GroupId, page: BlockCount) -> int | None:
        """The block a live request's page is read from in a HiSparse
        resident group (its residency overlay applied); None when the page is
        read from the host or lies past the table.

        Raises:
            InvalidArgumentError: ``group`` is not a resident group.
            UnknownRequestError: no live request has this id.
        """
    def residency_row(
        self, request_id: str, group: GroupId, start: BlockCount | None = None
    ) -> list[int]:
        """A live request's row in a resident group from page ``start``
        (default 0), overlay applied; 0 marks host-only pages. The block
        table itself (:meth:`blocks`) stays append-only."""
    def adopt_resident_page(
        self, request_id: str, group: GroupId, page: BlockCount, block_id: BlockId
    ) -> bool:
        """Point a host-only page at ``block_id``, a device copy of its
        contents (vLLM's ``adopt_resident_page``). The page holds no
        reference until the next :meth:`touch_resident_blocks` of the block
        in that group takes it. False (nothing changed) when the page is
        resident already or past the table."""
    def touch_resident_blocks(self, group: GroupId, block_ids: BlockIds) -> None:
        """vLLM's ``touch`` on a resident group's pool: one reference on each
        block, which backs the oldest adoption of it waiting for one, else is
        a caller reference (released with :meth:`free_caller_blocks`)."""
    def unpin_resident_block(self, group: GroupId, block_id: BlockId) -> None:
        """Give up one reference on a block of a resident group while the
        pages reading it keep doing so (vLLM's ``unpin_blocks`` on that
        group's pool): the block may count as free, and is reported by
        :meth:`take_reused_watched` once the pool hands it out. The reference
        is anonymous, as in vLLM: a later :meth:`drop_resident_page` of a
        page reading the block consumes it.

        Raises:
            InvalidArgumentError: no request holds a reference on the block
                beyond the caller's, or the block is null or out of range.
        """
    def unpin_resident_page(self, request_id: str, group: GroupId, page: BlockCount) -> int | None:
        """:meth:`unpin_resident_block` of the block a page is read from;
        returns it (None, nothing changed, for a host-only page)."""
    def drop_resident_page(self, request_id: str, group: GroupId, page: BlockCount) -> int | None:
        """Make a page host-only (vLLM's ``drop_resident_page``), consuming a
        reference given up on its block; returns the block it was read from
        (None for a host-only page).

        Raises:
            InvalidArgumentError: no reference on the block was given up, or
                the page's adoption is not backed by a touch yet.
        """
    def require_hot(self, request_id: str, group: GroupId) -> None:
        """Ask for a live request's hot region in a HiSparse hot group: its
        next allocation (and prediction) includes it."""
    def has_hot(self, request_id: str, group: GroupId) -> bool:
        """Whether a live request holds its whole hot region in a hot group."""
    def allocate_hot(self, request_id: str, group: GroupId) -> list[int]:
        """Grow the request's hot region in hot group ``group`` to its whole
        size when it has been asked for (vLLM's
        ``HiSparseHotManager.allocate_new_blocks``); the new block ids (none
        when not asked for or already held). Refused, unchanged, when the
        pool has too few free blocks."""
    def hot_required(self, request_id: str, group: GroupId) -> bool:
        """Whether the request's hot region in hot group ``group`` has been
        asked for (:meth:`require_hot`, an import, a resumed host prefix)."""
    def touch_caller_blocks(self, block_ids: BlockIds) -> None:
        """Take one caller reference on each block (vLLM's ``BlockPool.touch``
        from outside the manager; a free block leaves the free queue), released
        with :meth:`free_caller_blocks`. The null block is skipped."""
    def take_reused_watched(self) -> list[int]:
        """Unpinned blocks the pool handed out, or forgot on a reset, since
        the last call, in that order (each reported once)."""
    def evict_blocks(self, block_ids: BlockIds) -> None:
        """Drop these blocks' prefix-cache keys (they stay allocated)."""
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; False (and a warning) while blocks are in use."""
    def set_eviction_policy(self, spec: str) -> None:
        """Switch the pool's eviction policy (a ``BlockPool`` spec string);
        refused while any block is in use."""
    def set_priority(self, block_ids: BlockIds, priority: U32) -> None:
        """Mark blocks with a retention priority (the ``priority`` policy)."""
    def advance_clock(self, ticks: U32) -> None:
        """Advance the pool's eviction clock by ``ticks``."""
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """Drain the pool's KV-cache events."""
    def check_invariants(self) -> None:
        """Check every block-table and pool invariant (raises ``InvariantError``)."""
    def get_caller_blocks(self, num_blocks: BlockCount) -> list[int]:
        """Take ``num_blocks`` blocks from the front of the free queue for the
        caller: one reference each, held outside every request table (counted
        by :meth:`check_invariants`) until :meth:`free_caller_blocks`.

        Raises:
            OutOfBlocksError: more blocks requested than are free.
        """
    def free_caller_blocks(self, block_ids: BlockIds) -> None:
        """Release one caller reference of each block, first = evicted first
        (null block skipped). On any error nothing is released.

        Raises:
            BlockStateError: a block is listed more often than the caller holds it.
            InvalidBlockIdError: an id is out of range.
        """
    @property
    def num_caller_references(self) -> int:
        """References the caller holds outside every request table."""
    def cache_caller_blocks(
        self,
        block_ids: BlockIds,
        block_hashes: Sequence[bytes] | npt.NDArray[np.uint8],
        num_cached_blocks: BlockCount,
        num_full_blocks: BlockCount,
        group_id: GroupId,
        block_size: U32,
    ) -> None:
        """Register the caller's blocks ``block_ids[num_cached_blocks:num_full_blocks]``
        in group ``group_id``'s prefix index under ``block_hashes[i]`` (as
        :meth:`BlockPool.cache_full_blocks`).

        Raises:
            BlockStateError: a block of the range is not held by the caller,
                or is already cached.
            InvalidArgumentError: an unknown group, ``block_size`` other than
                the group's block size and the hash unit, inconsistent ranges.
            InvalidHashError: a hash is not 16 or 32 bytes.
        """
    def insert_cache_key(self, block_hash: bytes, group_id: GroupId, block_ids: BlockIds) -> None:
        """Put uncached blocks, in order, in the prefix index under
        ``(block_hash, group_id)``: the way back for a key dropped with
        :meth:`evict_blocks`. Reference counts and queue positions do not change.

        Raises:
            BlockStateError: a block is already cached or listed twice.
            InvalidArgumentError: the null block, or an unknown group.
        """

@final
class HiSparsePair:
    """The host and device halves of a HiSparse manager (docs/hisparse.md):
    ``host`` holds the source group alone (one full-attention group, group
    ids from 0), ``device`` every other group (``group_id_base=1``), so the
    pair's group ids are vLLM's. The calls here change both halves or
    neither: each is one transaction of the core's ``HiSparsePair`` (the
    host half planned, the device half allocated, then the host half).
    Every other call goes to one half's :class:`CoordinatorCore`.

    Raises:
        ConfigError: the halves do not have the pair's shape.
        InvalidArgumentError: ``host`` and ``device`` are one core.
    """

    def __init__(self, host: CoordinatorCore, device: CoordinatorCore) -> None: ...
    @property
    def host(self) -> CoordinatorCore: ...
    @property
    def device(self) -> CoordinatorCore: ...
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: TokenCount,
        num_new_computed_tokens: TokenCount | None = None,
        host_hits: BlockIds | None = None,
        device_hits: KVCacheBlocks | Sequence[BlockIds] | None = None,
        num_lookahead_tokens: TokenCount | None = None,
        num_encoder_tokens: TokenCount | None = None,
        delay_cache_blocks: bool | None = None,
        num_external_computed_tokens: TokenCount | None = None,
    ) -> KVCacheBlocks | None:
        """One step of ``request`` in both halves (:meth:`CoordinatorCore.allocate_slots`
        of each): the host half adopts ``host_hits``, takes no encoder tokens
        and never caches on allocation; the device half adopts
        ``device_hits`` and caches unless ``delay_cache_blocks``. The new
        ids of every group, the host's first; ``None`` when either pool
        cannot hold the step. A refusal or an error of either half leaves
        both exactly as they were."""
    def num_blocks_to_allocate(
        self,
        request: Request,
        num_tokens: TokenCount,
        host_hits: BlockIds | None = None,
        device_hits: KVCacheBlocks | Sequence[BlockIds] | None = None,
        total_computed_tokens: TokenCount | None = None,
        num_encoder_tokens: TokenCount | None = None,
        max_in_flight_tokens: TokenCount | None = None,
        num_local_computed_tokens: TokenCount | None = None,
        num_tokens_main_model: TokenCount | None = None,
        prefill_end: TokenCount | None = None,
    ) -> int:
        """Blocks a step would pull from the device pool over every group:
        the device half's :meth:`CoordinatorCore.num_blocks_to_allocate`
        plus :meth:`host_admission_blocks`. Changes nothing."""
    def host_admission_blocks(
        self,
        request: Request,
        num_tokens: TokenCount,
        host_hits: BlockIds | None = None,
        total_computed_tokens: TokenCount | None = None,
        num_local_computed_tokens: TokenCount | None = None,
    ) -> int:
        """The source group's admission count (vLLM's
        ``HiSparseSourceManager``): 0, or the device pool's size plus one (a
        sure refusal) when the host pool cannot back the step's new pages.
        Changes nothing."""
    def free(self, request_id: str) -> bool:
        """Free the request in both halves (the host's first); False when
        neither held it."""
    def pop_request_to_caller(self, request_id: str) -> list[list[int]] | None:
        """Forget the request in both halves and hand its references to the
        caller (:meth:`CoordinatorCore.pop_request_to_caller` of each): per
        group, the host's first, its ids; None when neither held it."""
    def reset_prefix_cache(self) -> tuple[bool, bool]:
        """Forget the cached prefixes of each pool with no block in use (the
        host's first; a block held in one pool does not keep the other's
        cache, as in vLLM): which halves reset, as ``(host, device)``."""
    def max_admission_blocks(self, group: GroupId, max_in_flight_tokens: TokenCount) -> int | None:
        """The most blocks one request can hold in ``group`` (vLLM's group
        id) with ``max_in_flight_tokens`` in flight; None: no cap."""
    def check_invariants(self) -> None:
        """Check both halves' invariants and the pair's (both track the same
        requests); raises ``InvariantError`` on a violation."""

@final
class BlockHashGate:
    """vLLM's request block hasher in front of ``hasher`` (kvcoord.vllm's,
    which hashes in the core or hands the request to vLLM's own): vLLM's
    ``Request`` calls the hasher on every token append, and an append that
    completes no block (``(len(block_hashes) + 1) * block_size >
    len(_all_token_ids)``) is answered with an empty tuple without calling
    ``hasher``. With ``hashes_attr``, an append that completes a block of a
    request whose attribute ``hashes_attr`` is already a :class:`Request`
    (kvcoord's hashing request for it) is answered by that request's
    ``catch_up(request._all_token_ids, len(request.block_hashes))``. Every
    other call, every case ``catch_up`` refuses, and a request without vLLM
    0.33.0's ``_all_token_ids`` list, is ``hasher(request)``."""

    def __init__(self, block_size: U32, hasher: Any, hashes_attr: str | None = None) -> None: ...
    @property
    def block_size(self) -> int: ...
    def hash_request(self, request: Any) -> Sequence[bytes]:
        """The block hashes ``request``'s new tokens completed (what
        ``hasher`` returns; the empty tuple when they complete none)."""

@disjoint_base
class DecodeFastPath:
    """The base class of :class:`kvcoord.vllm.KVCacheManager`: its
    ``allocate_slots``.

    A decode step of a running request that has a room (see
    :meth:`CoordinatorCore.decode_room`), with no hits, external, encoder or
    reserved tokens, no full-sequence check and as many speculative tokens
    as the rooms are for, is answered here: inside the room, the manager's
    empty blocks (nothing changes); past it, with caching not delayed and a
    registry/core pair set, one :meth:`CoordinatorCore.decode_slots` call.
    Every other call is the subclass's ``_allocate(...)`` with all twelve
    arguments (``_decode_core(request, num_new_tokens,
    num_lookahead_tokens)`` where the registry must sync kvcoord's request
    first). An argument passed as None counts as not passed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...
    _room_lookahead: int
    """The speculative-token count the room limits are for."""
    def _init_fast_path(
        self,
        rooms: dict[str, int],
        empty: Any,
        fixed: tuple[dict[str, tuple[Any, Request]], Any] | None,
        blocks_type: Any,
        pool: Any,
    ) -> None:
        """Set what ``allocate_slots`` reads (again: replaced): the room
        limits by request id, the empty result, the registry's entries by id
        (vLLM request, kvcoord request) and the
        :meth:`CoordinatorCore.decode_slots` that decode steps past a room
        call (None: they take ``_allocate``), the result type, called as
        ``blocks_type(ids, pool)``, and the pool."""
    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: TokenCount,
        num_new_computed_tokens: TokenCount = 0,
        new_computed_blocks: Any = None,
        num_lookahead_tokens: TokenCount = 0,
        num_external_computed_tokens: TokenCount = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: TokenCount = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: BlockCount = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """vLLM 0.33.0's ``allocate_slots``: new blocks per group, or None
        (nothing changed)."""

@final
class KVCacheBlocks:
    """Block ids per KV cache group, immutable (see ``kvcoord.blocks``)."""

    def __init__(self, per_group: Iterable[BlockIds]) -> None:
        """Validated: one sequence of ints or integer array per group."""
    @classmethod
    def from_lists(cls, per_group_lists: Iterable[Sequence[int]]) -> KVCacheBlocks:
        """Raises ``InvalidBlockIdError`` (negative / not 32-bit) or
        ``ArgumentTypeError`` (a ``TypeError``: not an int, or a bool)."""
    @classmethod
    def from_arrays(cls, per_group_arrays: Iterable[npt.NDArray[np.integer]]) -> KVCacheBlocks:
        """Raises ``InvalidBlockIdError`` or ``ArgumentTypeError`` (a
        ``TypeError``: not a 1-D integer array)."""
    @classmethod
    def gather(cls, picks: Sequence[tuple[KVCacheBlocks, int, int]]) -> KVCacheBlocks:
        """Group ``g`` is group ``picks[g][1]`` of ``picks[g][0]``, cut to its
        first ``picks[g][2]`` blocks (no id is re-validated)."""
    @classmethod
    def empty(cls, num_groups: U32) -> KVCacheBlocks:
        """No block in any of ``num_groups`` groups (below 2^20)."""
    @property
    def num_groups(self) -> int: ...
    @property
    def flat(self) -> npt.NDArray[np.int32]:
        """All groups' ids, group 0 first (read-only)."""
    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """Group ``g`` is ``flat[offsets[g]:offsets[g+1]]``."""
    def arrays(self) -> tuple[npt.NDArray[np.int32], ...]:
        """One read-only ``int32`` array per group (views of :attr:`flat`)."""
    def get_block_ids(self) -> tuple[list[int], ...]:
        """Fresh lists per group (vLLM's shape; not for hot paths)."""
    def is_empty(self) -> bool: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __add__(self, value: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def __radd__(self, value: KVCacheBlocks, /) -> KVCacheBlocks: ...
    def __reduce__(self) -> tuple[Any, tuple[tuple[list[int], ...]]]:
        """Pickles as its ids per group (rebuilt by :meth:`from_lists`)."""

def mooncake_prompt_tokens(
    hash_ids: Sequence[int], input_length: TokenCount
) -> npt.NDArray[np.uint32]:
    """Prompt tokens of a Mooncake request: the 512-token blocks named by
    ``hash_ids``, cut at ``input_length`` (fewer ids give a shorter prompt);
    see :func:`kvcoord.replay.workloads.mooncake_prompt_tokens`."""

@final
class UnboundedPrefixCache:
    """An unbounded, never-evicting prefix cache (the planner's best possible hit rate)."""

    def __init__(self, block_size: U32) -> None: ...
    def add(
        self,
        prompt: TokenIds,
        output: TokenIds,
        salt: str | None = None,
    ) -> int:
        """Account one request in arrival order; returns its hit in tokens."""
    @property
    def block_size(self) -> int: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def hit_tokens(self) -> int: ...
    def __len__(self) -> int: ...

@final
class PrefixIndex:
    """A cluster router's view of which engine caches which block, built from
    the engines' KV events alone (``kvcoord.replay.routers``)."""

    def __init__(self, num_engines: U32, group_idx: U32 | None = None) -> None:
        """An index of ``num_engines`` engines (1 to 65,536) for the events of
        group ``group_idx`` (0 by default)."""
    def apply(
        self, engine: U32, events: Iterable[BlockStored | BlockRemoved | AllBlocksCleared]
    ) -> None:
        """Apply ``engine``'s events (as ``take_events()`` returns them) in order."""
    def drain(self, engine: U32, coordinator: CoordinatorCore) -> None:
        """Drain ``coordinator``'s events into the index (``apply(engine,
        coordinator.take_events())`` without a Python object per event)."""
    def matched_blocks(self, block_hashes: Iterable[U64]) -> list[int]:
        """Per engine, the longest run of leading blocks of ``block_hashes``
        (vLLM's integer form) it caches."""
    def keys(self, engine: U32) -> set[int]:
        """The block hashes the index says ``engine`` caches."""
    @property
    def num_engines(self) -> int: ...
    @property
    def group_idx(self) -> int: ...
    @property
    def events_seen(self) -> int: ...

def batch_plan(
    computed: npt.NDArray[np.int64],
    num_tokens: npt.NDArray[np.int64],
    budget: TokenCount,
    steady_block_size: U32,
    n: npt.NDArray[np.int64],
) -> tuple[int, list[int]]:
    """Tokens per running request of one step, first come first served under
    ``budget``, written to ``n``; returns how many requests the budget reached
    and those whose allocation may change the pool
    (``kvcoord.replay.running``)."""

def batch_step(
    n: npt.NDArray[np.int64],
    count: U32,
    window: TokenCount,
    computed: npt.NDArray[np.int64],
    num_tokens: npt.NDArray[np.int64],
    out_pos: npt.NDArray[np.int64],
    out_len: npt.NDArray[np.int64],
    out_base: npt.NDArray[np.int64],
    out_tokens: npt.NDArray[np.int64],
    requests: list[Request],
) -> tuple[tuple[int, int, int, int, int, int], int, list[int], list[int]]:
    """One step of the first ``count`` running requests: the arrays and
    ``requests[:count]`` advance; returns the step-time model's sums
    ``(tokens, full_pairs, window_pairs, full_kv, window_kv, seqs)``, the
    tokens sampled after a request's first, and the indices that sampled
    their first token and that finished (``kvcoord.replay.running``)."""

@final
class BlockPoolView:
    """A manager's pool, read-only: its blocks move through the manager."""

    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...
    @property
    def num_cached_blocks(self) -> int: ...
    @property
    def eviction_policy(self) -> str: ...
    @property
    def num_evictions(self) -> int: ...
    @property
    def enable_caching(self) -> bool: ...
    @property
    def hash_block_size(self) -> int: ...
    @property
    def enable_events(self) -> bool: ...
    @property
    def metadata_bytes(self) -> int: ...
    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[int] | None: ...
    def free_block_ids(self) -> npt.NDArray[np.uint32]: ...
    def free_neighbours(self, block_id: BlockId) -> tuple[int, int] | None: ...
    def ref_counts(self) -> npt.NDArray[np.uint32]: ...
    def cached_mask(self) -> npt.NDArray[np.bool_]: ...
    def block_hash(self, block_id: BlockId) -> tuple[bytes, int] | None: ...
    def primary_key_tokens(self, block_id: BlockId) -> int | None: ...
    def key_num_tokens(self, block_id: BlockId) -> int | None: ...
    def cache_keys(self, block_id: BlockId) -> list[tuple[bytes, int]]: ...
    def check_invariants(self) -> None: ...

def advance_requests(
    requests: list[Request],
    num_computed: Sequence[int] | npt.NDArray[np.integer],
    new_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
) -> None:
    """One step's bookkeeping for many requests: ``num_computed_tokens +=
    num_computed[i]``, then append ``new_tokens[i]`` where given and >= 0.
    Everything is checked before any request changes."""

@final
class GroupSpec:
    """One KV cache group's spec as the core holds it, built by one
    constructor per kind (each Python spec dataclass calls its own, once,
    as ``spec.core``). Out-of-range values raise ``ConfigError`` naming the
    public field. The properties are the kind's facts, written once in the
    core."""

    @staticmethod
    def full_attention(block_size: I64) -> GroupSpec: ...
    @staticmethod
    def sliding_window(block_size: I64, sliding_window: I64) -> GroupSpec: ...
    @staticmethod
    def chunked_local(block_size: I64, attention_chunk_size: I64) -> GroupSpec: ...
    @staticmethod
    def mamba(block_size: I64, num_speculative_blocks: I64) -> GroupSpec: ...
    @staticmethod
    def cross_attention(block_size: I64) -> GroupSpec: ...
    @staticmethod
    def mla_attention(block_size: I64) -> GroupSpec: ...
    @staticmethod
    def sliding_window_mla(block_size: I64, sliding_window: I64) -> GroupSpec: ...
    @staticmethod
    def rswa(block_size: I64, rswa_window: I64) -> GroupSpec: ...
    @staticmethod
    def hisparse_resident(block_size: I64) -> GroupSpec:
        """vLLM's HiSparse resident pages (not yet served by kvcoord.vllm)."""
    @staticmethod
    def hisparse_hot(block_size: I64, blocks_per_request: I64) -> GroupSpec:
        """vLLM's HiSparse hot region (not yet served by kvcoord.vllm)."""
    @staticmethod
    def mamba_align(
        block_size: I64,
        num_speculative_blocks: I64,
        num_prefill_checkpoint_blocks: I64,
        prefill_checkpoint_alignment: I64 | None,
    ) -> GroupSpec:
        """Mamba with ``mamba_cache_mode="align"`` (states cached at block
        boundaries; ``num_speculative_blocks`` MTP scratch blocks follow the
        running state)."""
    @property
    def block_size(self) -> int: ...
    @property
    def spec_name(self) -> str:
        """Name of the public spec type (``"SlidingWindowSpec"``)."""
    @property
    def prefix_cacheable(self) -> bool:
        """Whether its blocks may enter the prefix cache."""
    @property
    def sparse(self) -> bool:
        """Whether retention intervals (sparse caching) apply."""
    @property
    def prefix_closed_hits(self) -> bool:
        """Whether hits are prefix-closed (full attention)."""
    @property
    def interior_nulls(self) -> bool:
        """Whether a request's table may hold null entries after real blocks
        (R-SWA decode gaps, Mamba "align" skipped states)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class CoordinatorKind:
    """Which coordinator policy serves a configuration."""

    NoPrefixCache: ClassVar[CoordinatorKind]
    Unitary: ClassVar[CoordinatorKind]
    Hybrid: ClassVar[CoordinatorKind]
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def choose_coordinator(num_groups: U32, enable_caching: bool) -> CoordinatorKind:
    """vLLM's choice: caching off -> NoPrefixCache; one group -> Unitary;
    otherwise Hybrid."""

def scheduler_block_size(groups: Sequence[GroupSpec]) -> int:
    """LCM of the groups' block sizes."""

def default_hash_block_size(groups: Sequence[GroupSpec], enable_caching: bool) -> int:
    """The hash unit requests must be hashed with (vLLM's choice: the GCD of
    the caching groups' block sizes, else the scheduler block size)."""
