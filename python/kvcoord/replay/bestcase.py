"""Best possible prefix-cache hit rate: an unbounded cache, computed from the tokens alone.

Independent of the manager: requests are taken in arrival order; a request
hits the longest run of leading full blocks (at the layout's hit
granularity) that some earlier request has computed, capped like vLLM's
lookup at ``prompt_len - 1`` tokens (the last prompt token is always
recomputed). A finished request has computed its prompt and all but its last
output token, and all those full blocks stay cached forever.

Prefixes are identified by a 64-bit key per block: a position-dependent mix
of the block's tokens, summed over the prefix (numpy, no per-token Python).
Keys of earlier prefixes go into one set; because every prefix of a stored
prefix is stored too, a request's hit length is found by binary search.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    """Feed requests in arrival order; keeps the unbounded cache's prefix keys."""

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self._seen: set[int] = set()
        self.prompt_tokens = 0
        self.hit_tokens = 0

    def add(
        self,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        salt: str | None = None,
    ) -> int:
        """Account one request (its prompt and all its output tokens); returns its hit tokens."""
        bs = self.block_size
        p = np.asarray(prompt, dtype=np.int64)
        n_prompt = p.shape[0]
        n_out = len(output)
        # computed tokens at the end: the prompt and all but the last output token
        computed = np.concatenate([p, np.asarray(output, dtype=np.int64)])[: n_prompt + n_out - 1]
        keys = prefix_block_keys(computed, bs, salt)
        seen = self._seen
        lo, hi = 0, min((n_prompt - 1) // bs, keys.shape[0])
        # largest m <= hi with keys[:m] all seen (the seen set is prefix-closed)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(keys[mid - 1]) in seen:
                lo = mid
            else:
                hi = mid - 1
        seen.update(keys[lo:].tolist())
        self.prompt_tokens += n_prompt
        self.hit_tokens += lo * bs
        return lo * bs

    def result(self) -> BestCase:
        return BestCase(self.prompt_tokens, self.hit_tokens)


def best_possible_hits(workload: Workload, block_size: int) -> BestCase:
    """Prompt tokens an unbounded prefix cache with blocks of ``block_size`` could serve."""
    tracker = BestCaseTracker(block_size)
    for r in workload.requests:
        tracker.add(r.make_prompt(), r.output_tokens(), r.cache_salt)
    return tracker.result()
