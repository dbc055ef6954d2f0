"""A host-memory tier below the GPU pool (``--host-memory``).

Modelled like the KV offloading connectors (LMCache, vLLM's CPU offload):
once a request's prompt has been computed, its KV is copied to host memory
in chunks of ``chunk_tokens`` tokens (write-through, so every block the GPU
pool later evicts is still on the host while the host tier keeps it). The
host tier is an LRU over chunks: a lookup or a store makes a chunk most
recent; when full, the least recently used chunks are dropped.

A later request first takes its GPU prefix hit; if the host tier holds a
longer prefix (whole chunks, the same prefix keys as the best-possible pass),
the difference is loaded over the host link instead of recomputed. The
scheduler charges ``tokens x bytes per token per GPU / host bandwidth``
seconds to the step that loads them (not overlapped with compute: an upper
bound on the transfer cost).

A disk tier (``--disk-memory``) is the same LRU of chunks, below the host
tier: also written through, looked up after it, and its extra tokens load at
:data:`DISK_BANDWIDTH`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from kvcoord.replay.bestcase import prefix_block_keys

__all__ = ["DEFAULT_CHUNK_TOKENS", "DISK_BANDWIDTH", "HostTier"]

#: Tokens per host-tier chunk (LMCache's default chunk size).
DEFAULT_CHUNK_TOKENS = 256
#: Read bandwidth of the disk tier per replica, bytes/s: one NVMe PCIe 4.0
#: SSD's sequential read (about 7 GB/s on the data sheets of current drives),
#: rounded down to 6 GB/s.
DISK_BANDWIDTH = 6e9


class HostTier:
    """LRU of prefix chunks, ``capacity_tokens`` tokens of KV in all."""

    def __init__(self, capacity_tokens: int, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> None:
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        if capacity_tokens < chunk_tokens:
            raise ValueError(
                f"a host tier of {capacity_tokens} tokens holds no {chunk_tokens}-token chunk"
            )
        self.chunk_tokens = chunk_tokens
        self.capacity_chunks = capacity_tokens // chunk_tokens
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def keys(self, tokens: Sequence[int] | np.ndarray, salt: str | None = None) -> np.ndarray:
        """One prefix key per whole chunk of ``tokens`` (the best-possible pass's keys)."""
        arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens, dtype=np.int64)
        return prefix_block_keys(arr, self.chunk_tokens, salt)

    def lookup(self, keys: np.ndarray) -> int:
        """Tokens of the longest prefix of ``keys`` (one per chunk) held; touches them."""
        lru = self._lru
        n = 0
        for k in keys.tolist():
            if k not in lru:
                break
            lru.move_to_end(k)
            n += 1
        return n * self.chunk_tokens

    def insert(self, keys: np.ndarray) -> None:
        """Store every chunk of ``keys`` (most recent last), evicting LRU chunks when full."""
        lru = self._lru
        for k in keys.tolist():
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        over = len(lru) - self.capacity_chunks
        for _ in range(max(0, over)):
            lru.popitem(last=False)
        self.evictions += max(0, over)
