"""vLLM's KV-cache zeroing hand-off (``KVCacheConfig.needs_kv_cache_zeroing``):
the ids of blocks newly allocated to attention groups, drained once per step
by the scheduler (``take_new_block_ids``) so that workers zero them before
use. Kept per group and drained in group order, as vLLM's single-type
managers keep and drain theirs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ZeroingLog"]


class ZeroingLog:
    """New block ids per group since the last :meth:`take`."""

    __slots__ = ("_ids",)

    def __init__(self, num_groups: int) -> None:
        self._ids: list[list[int]] = [[] for _ in range(num_groups)]

    def record(self, new: Sequence[Sequence[int]], skip: Sequence[int]) -> None:
        """Record one allocation's new ids per group, less the first
        ``skip[g]`` of group ``g`` (blocks an async KV load writes, which
        zeroing would race)."""
        for log, ids, n in zip(self._ids, new, skip, strict=True):
            log.extend(ids[n:])

    def record_table(self, held: Sequence[Any], block_sizes: Sequence[int], start: int) -> None:
        """Record a request's blocks from token ``start`` on (block-aligned
        in every group), null entries included, as vLLM re-records blocks a
        failed load left unwritten."""
        for log, table, bs in zip(self._ids, held, block_sizes, strict=True):
            if start % bs:
                raise ValueError(f"start_token {start} is not a multiple of block size {bs}")
            log.extend(int(i) for i in table[start // bs :])

    def take(self) -> list[int]:
        """Every recorded id, group by group; the log is emptied."""
        out = [i for log in self._ids for i in log]
        for log in self._ids:
            log.clear()
        return out
