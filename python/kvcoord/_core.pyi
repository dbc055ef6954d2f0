"""Type stubs and documentation of the compiled core, ``kvcoord._core``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import numpy as np
import numpy.typing as npt

__all__ = [
    "AllBlocksCleared",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "__version__",
    "validate_retention_interval",
]

__version__: str

BlockIds = Sequence[int] | npt.NDArray[np.integer]
"""Block ids: a list/tuple of ints or a 1-D integer numpy array."""

@final
class BlockPool:
    """The KV-cache block pool: block metadata, the free queue (front is handed
    out next, back is kept longest) and the prefix index from
    ``(block hash, group id)`` to cached blocks.

    Decisions (ids handed out, eviction order) equal vLLM 0.33.0's
    ``BlockPool``. Block 0 is the null block: never handed out, never
    counted, skipped silently by :meth:`free_blocks` and :meth:`touch`.

    Every method validates its whole input first: a call that raises leaves
    the pool exactly as it was. One owner thread: the pool is not
    synchronised (concurrent use from several threads raises ``RuntimeError``
    from PyO3's borrow check rather than corrupting state).
    """

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int = 16,
        enable_events: bool = False,
    ) -> None:
        """Create a pool of ``num_blocks`` blocks (the null block included).

        Raises:
            ConfigError: ``num_blocks < 1`` or ``hash_block_size < 1``.
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
    def enable_caching(self) -> bool:
        """Whether prefix caching is on."""
    @property
    def hash_block_size(self) -> int:
        """Tokens per hash unit."""
    @property
    def enable_events(self) -> bool:
        """Whether KV-cache events are recorded."""
    @property
    def metadata_bytes(self) -> int:
        """Heap bytes of per-block metadata (16 per block), prefix index excluded."""
    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the front of the free queue, each with
        one reference. A taken block that was still cached is evicted.

        Raises:
            OutOfBlocksError: more blocks requested than are free (a ``ValueError``).
            InvalidArgumentError: ``num_blocks`` is negative.
        """
    def get_new_blocks_array(self, num_blocks: int) -> npt.NDArray[np.uint32]:
        """Like :meth:`get_new_blocks`, returning a ``uint32`` numpy array."""
    def free_blocks(self, block_ids: BlockIds) -> None:
        """Release one reference of each block, given in eviction-priority order
        (first = evicted first). Blocks reaching zero references go to the
        front of the free queue when uncached, to the back when cached.

        Raises:
            BlockStateError: a block would drop below zero references (double free).
            InvalidBlockIdError: an id is negative or not below ``num_blocks``.
        """
    def touch(self, block_ids: BlockIds) -> None:
        """Add one reference to each block; free blocks leave the free queue."""
    def cache_full_blocks(
        self,
        block_ids: BlockIds,
        block_hashes: Sequence[bytes] | npt.NDArray[np.uint8],
        num_cached_blocks: int,
        num_full_blocks: int,
        group_id: int,
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
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix. Returns False (logging a warning on the
        ``kvcoord`` logger) unless only the null block is in use."""
    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """Drain the recorded events (always empty when events are off)."""
    def free_block_ids(self) -> npt.NDArray[np.uint32]:
        """The free queue, front (handed out next) to back."""
    def ref_counts(self) -> npt.NDArray[np.uint32]:
        """Reference count of every block, indexed by id."""
    def cached_mask(self) -> npt.NDArray[np.bool_]:
        """Whether each block carries a cache key, indexed by id."""
    def block_hash(self, block_id: int) -> tuple[bytes, int] | None:
        """The ``(hash, group_id)`` key a block is cached under, if any."""
    def check_invariants(self) -> None:
        """Check every internal invariant (O(num_blocks)); raises
        ``InvariantError`` on a violation. For tests and debugging."""

@final
class BlockStored:
    """One ``cache_full_blocks`` call registered blocks in the prefix cache."""

    @property
    def block_hashes(self) -> list[bytes]: ...
    @property
    def block_ids(self) -> list[int]: ...
    @property
    def parent_block_hash(self) -> bytes | None:
        """Hash of the block logically before the first one; None at block 0."""
    @property
    def group_id(self) -> int: ...

@final
class BlockRemoved:
    """A key left the prefix cache (its last block was evicted or reused)."""

    @property
    def block_hash(self) -> bytes: ...
    @property
    def group_id(self) -> int: ...

@final
class AllBlocksCleared:
    """``reset_prefix_cache`` dropped every key."""

def validate_retention_interval(
    interval: int | None, scheduler_block_size: int, has_sparse_groups: bool
) -> None:
    """Check a prefix-cache retention interval: ``None`` (dense) is always
    accepted; without sliding-window or Mamba groups only 0; otherwise a
    non-negative multiple of ``scheduler_block_size``.

    Raises:
        ConfigError: naming the value and the rule it breaks.
    """
