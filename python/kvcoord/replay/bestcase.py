"""Best possible prefix-cache hit rate: an unbounded cache, computed from the tokens alone.

Independent of the manager: requests are taken in arrival order; a request
hits the longest run of leading full blocks (at the layout's hit
granularity) that some earlier request has computed, capped like vLLM's
lookup at ``prompt_len - 1`` tokens (the last prompt token is always
recomputed). A finished request has computed its prompt and all but its last
output token, and all those full blocks stay cached forever.

Prefixes are identified by a 64-bit key per block: a position-dependent mix
of the block's tokens, summed over the prefix (numpy, no per-token Python).
A request's hit is its leading run of keys that an earlier request also
produced, found for all requests at once (:meth:`BestCaseTracker.hits`).
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
    """Feed requests in arrival order; the hits are resolved in one numpy pass at the end.

    ``add`` only computes the request's prefix keys (numpy). :meth:`result`
    concatenates them, finds each key's first request with one ``np.unique``
    and gives every request the leading run of keys some earlier request
    produced: the same answer as a growing set of seen keys, without a
    Python set of millions of integers.
    """

    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self._keys: list[np.ndarray] = []
        self._caps: list[int] = []
        self.prompt_tokens = 0

    def add(
        self,
        prompt: Sequence[int] | np.ndarray,
        output: Sequence[int] | np.ndarray,
        salt: str | None = None,
    ) -> None:
        """Account one request (its prompt and all its output tokens)."""
        bs = self.block_size
        p = np.asarray(prompt, dtype=np.int64)
        n_prompt = p.shape[0]
        n_out = len(output)
        # computed tokens at the end: the prompt and all but the last output token
        computed = np.concatenate([p, np.asarray(output, dtype=np.int64)])[: n_prompt + n_out - 1]
        keys = prefix_block_keys(computed, bs, salt)
        self._keys.append(keys)
        self._caps.append(min((n_prompt - 1) // bs, keys.shape[0]))
        self.prompt_tokens += n_prompt

    def hits(self) -> np.ndarray:
        """Hit tokens per request, in the order added."""
        n = len(self._keys)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        lens = np.fromiter((k.shape[0] for k in self._keys), dtype=np.int64, count=n)
        caps = np.asarray(self._caps, dtype=np.int64)
        if lens.sum() == 0:
            return np.zeros(n, dtype=np.int64)
        keys = np.concatenate(self._keys)
        owner = np.repeat(np.arange(n, dtype=np.int64), lens)
        _, first_pos, inverse = np.unique(keys, return_index=True, return_inverse=True)
        # seen before: the key's first occurrence belongs to an earlier request
        seen = owner[first_pos][inverse] < owner
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        pos = np.arange(keys.shape[0], dtype=np.int64) - starts[owner]
        # first unseen position per request (its length when all are seen)
        miss = np.where(seen, np.int64(1 << 62), pos)
        first_miss = lens.copy()
        nonempty = lens > 0
        first_miss[nonempty] = np.minimum(
            np.minimum.reduceat(miss, starts[nonempty]), lens[nonempty]
        )
        out: np.ndarray = np.minimum(first_miss, caps) * self.block_size
        return out

    def result(self) -> BestCase:
        return BestCase(self.prompt_tokens, int(self.hits().sum()))


def best_possible_hits(workload: Workload, block_size: int) -> BestCase:
    """Prompt tokens an unbounded prefix cache with blocks of ``block_size`` could serve."""
    tracker = BestCaseTracker(block_size)
    for r in workload.requests:
        tracker.add(r.make_prompt(), r.output_tokens(), r.cache_salt)
    return tracker.result()
