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
from dataclasses import dataclass

import numpy as np

from kvcoord.replay.workloads import Workload, _splitmix64

__all__ = ["BestCase", "best_possible_hits", "prefix_block_keys"]


def prefix_block_keys(tokens: np.ndarray, block_size: int, salt: str | None = None) -> np.ndarray:
    """One uint64 key per full block: equal keys iff equal token prefixes (up to 2**-64)."""
    nb = tokens.shape[0] // block_size
    if nb == 0:
        return np.zeros(0, dtype=np.uint64)
    t = np.asarray(tokens[: nb * block_size], dtype=np.uint64).reshape(nb, block_size)
    with np.errstate(over="ignore"):
        pos = np.arange(1, block_size + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        cell = _splitmix64(t * np.uint64(0xC2B2AE3D27D4EB4F) + pos[None, :])
        content = cell.sum(axis=1, dtype=np.uint64)
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


def best_possible_hits(workload: Workload, block_size: int) -> BestCase:
    """Prompt tokens an unbounded prefix cache with blocks of ``block_size`` could serve."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    seen: set[int] = set()
    total = hits = 0
    for r in workload.requests:
        prompt = np.asarray(r.make_prompt(), dtype=np.int64)
        out = np.asarray(r.output_tokens(), dtype=np.int64)
        computed = np.concatenate([prompt, out])[: r.prompt_len + r.output_len - 1]
        keys = prefix_block_keys(computed, block_size, r.cache_salt)
        max_hit = (r.prompt_len - 1) // block_size
        lo, hi = 0, min(max_hit, keys.shape[0])
        # largest m <= hi with keys[:m] all seen (the seen set is prefix-closed)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if int(keys[mid - 1]) in seen:
                lo = mid
            else:
                hi = mid - 1
        total += r.prompt_len
        hits += lo * block_size
        seen.update(keys[lo:].tolist())
    return BestCase(total, hits)
