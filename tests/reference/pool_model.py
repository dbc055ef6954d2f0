"""A deliberately simple model of the block pool: lists and dicts, O(n)
operations, no cleverness. The hypothesis state machine drives it in lockstep
with the Rust pool; any divergence is a bug in one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class ModelError(Exception):
    """The model refused an operation (the real pool must refuse it too)."""


@dataclass
class PoolModel:
    num_blocks: int
    enable_caching: bool = True
    free: list[int] = field(default_factory=list)  # front .. back
    ref: list[int] = field(default_factory=list)
    key: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # block -> key
    index: dict[tuple[bytes, int], list[int]] = field(default_factory=dict)  # key -> blocks

    def __post_init__(self) -> None:
        self.free = list(range(1, self.num_blocks))
        self.ref = [0] * self.num_blocks

    def _check_ids(self, ids: list[int]) -> None:
        for b in ids:
            if not 0 <= b < self.num_blocks:
                raise ModelError(f"id {b}")

    def _drop_key(self, b: int) -> None:
        k = self.key.pop(b, None)
        if k is not None:
            self.index[k].remove(b)
            if not self.index[k]:
                del self.index[k]

    def get_new_blocks(self, n: int) -> list[int]:
        if n < 0 or n > len(self.free):
            raise ModelError("out of blocks")
        out, self.free = self.free[:n], self.free[n:]
        for b in out:
            self._drop_key(b)
            self.ref[b] = 1
        return out

    def free_blocks(self, ids: list[int]) -> None:
        self._check_ids(ids)
        counts: dict[int, int] = {}
        for b in ids:
            if b:
                counts[b] = counts.get(b, 0) + 1
        if any(self.ref[b] < c for b, c in counts.items()):
            raise ModelError("underflow")
        front: list[int] = []
        back: list[int] = []
        for b in ids:
            if not b:
                continue
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (back if b in self.key else front).append(b)
        self.free = front + self.free + back

    def touch(self, ids: list[int]) -> None:
        self._check_ids(ids)
        for b in ids:
            if not b:
                continue
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    def cache_full_blocks(
        self,
        ids: list[int],
        hashes: list[bytes],
        num_cached: int,
        num_full: int,
        group: int,
        mask: list[bool] | None = None,
    ) -> None:
        if num_cached >= num_full:
            return
        if num_full > len(ids) or num_full > len(hashes):
            raise ModelError("range")
        if mask is not None and len(mask) != num_full - num_cached:
            raise ModelError("mask")
        if any(len(h) not in (16, 32) for h in hashes):
            raise ModelError("hash length")
        self._check_ids(ids[num_cached:num_full])
        if not self.enable_caching:
            return
        chosen = [
            (i, ids[i])
            for i in range(num_cached, num_full)
            if ids[i] and (mask is None or mask[i - num_cached])
        ]
        seen: set[int] = set()
        for _, b in chosen:
            if b in self.key or b in seen:
                raise ModelError("already cached")
            seen.add(b)
        for i, b in chosen:
            k = (hashes[i], group)
            self.key[b] = k
            self.index.setdefault(k, []).append(b)

    def get_cached_block(self, h: bytes, groups: list[int]) -> list[int] | None:
        if not self.enable_caching:
            return None
        out = []
        for g in groups:
            blocks = self.index.get((h, g))
            if not blocks:
                return None
            out.append(blocks[0])
        return out

    def evict_blocks(self, ids: list[int]) -> None:
        self._check_ids(ids)
        for b in ids:
            self._drop_key(b)

    def reset_prefix_cache(self) -> bool:
        if self.num_blocks - len(self.free) != 1:
            return False
        self.key.clear()
        self.index.clear()
        return True

    def cached_mask(self) -> list[bool]:
        return [b in self.key for b in range(self.num_blocks)]
