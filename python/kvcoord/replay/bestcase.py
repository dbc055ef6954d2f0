"""Best possible prefix-cache hit rate: an unbounded cache, computed from the tokens alone.

Independent of the manager: requests are taken in arrival order; a request
hits the longest run of leading full blocks (at the layout's hit
granularity) that some earlier request has computed, capped like vLLM's
lookup at ``prompt_len - 1`` tokens (the last prompt token is always
recomputed). A finished request has computed its prompt and all but its last
output token, and all those full blocks stay cached forever.

The unbounded cache itself is the core's ``UnboundedPrefixCache`` (chained
64-bit block keys in a Rust hash set, no Python object per block).
:func:`prefix_block_keys` is the numpy form of such keys, used by the host
and disk tiers to name prefix chunks.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvcoord._core import UnboundedPrefixCache
from kvcoord.replay.workloads import Workload, _splitmix64

__all__ = [
    "BestCase",
    "BestCaseTracker",
    "best_possible_hits",
    "prefix_block_keys",
]


_MAX_BLOCK = 4096
# one odd 64-bit weight per position in a block (fixed: keys are comparable across calls)
_WEIGHTS = _splitmix64(np.arange(_MAX_BLOCK, dtype=np.uint64) + np.uint64(0xB10C)) | np.uint64(1)


def prefix_block_keys(tokens: np.ndarray, block_size: int, salt: str | None = None) -> np.ndarray:
    """One uint64 key per full block: equal keys iff equal token prefixes (up to 2**-64)."""
    nb = tokens.shape[0] // block_size
    if nb == 0:
        return np.zeros(0, dtype=np.uint64)
    t = np.asarray(tokens[: nb * block_size], dtype=np.uint64).reshape(nb, block_size)
    with np.errstate(over="ignore"):
        if block_size <= _MAX_BLOCK:
            w = _WEIGHTS[:block_size]
        else:
            w = _splitmix64(np.arange(block_size, dtype=np.uint64) + np.uint64(0xB10C)) | np.uint64(
                1
            )
        # a random linear form of the block's tokens, then mixed with its index and the salt
        content = (t * w[None, :]).sum(axis=1, dtype=np.uint64)
        seed = np.uint64(zlib.crc32(salt.encode()) + 1 if salt is not None else 0)
        idx = np.arange(nb, dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93)
        per_block = _splitmix64(content ^ idx ^ (seed * np.uint64(0xFF51AFD7ED558CCD)))
        prefix = np.cumsum(per_block, dtype=np.uint64)
        return _splitmix64(prefix + idx)


@dataclass
class BestCase:
    prompt_tokens: int
    hit_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class BestCaseTracker:
    """Feed requests in arrival order; an unbounded cache of their computed prefixes."""

    def __init__(self, block_size: int) -> None:
        self._cache = UnboundedPrefixCache(block_size)  # checks block_size

    @property
    def block_size(self) -> int:
        return self._cache.block_size

    def add(
        self,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        salt: str | None = None,
    ) -> int:
        """Account one request (its prompt and all its output tokens); returns its hit tokens."""
        return self._cache.add(prompt, output, salt)

    @property
    def prompt_tokens(self) -> int:
        return self._cache.prompt_tokens

    @property
    def hit_tokens(self) -> int:
        return self._cache.hit_tokens

    def result(self) -> BestCase:
        return BestCase(self.prompt_tokens, self.hit_tokens)


def best_possible_hits(workload: Workload, block_size: int) -> BestCase:
    """Prompt tokens an unbounded prefix cache with blocks of ``block_size`` could serve."""
    tracker = BestCaseTracker(block_size)
    for r in workload.requests:
        tracker.add(r.make_prompt(), r.output_tokens(), r.cache_salt)
    return tracker.result()
