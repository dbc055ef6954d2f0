"""vLLM's KV-cache zeroing hand-off (``KVCacheConfig.needs_kv_cache_zeroing``):
the ids of blocks newly allocated to attention groups, drained once per step
by the scheduler (``take_new_block_ids``) so that workers zero them before
use. Kept per group and drained in group order, as vLLM's single-type
managers keep and drain theirs; only attention groups record (Mamba and
other state groups never do)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

__all__ = ["ZeroingLog", "zeroed_group_ids"]


def zeroed_group_ids(kv_cache_config: Any) -> tuple[int, ...]:
    """Groups whose new blocks vLLM records for zeroing (none unless the
    configuration needs zeroing)."""
    if not getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        return ()
    attention = importlib.import_module("vllm.v1.kv_cache_interface").AttentionSpec
    return tuple(
        i
        for i, g in enumerate(kv_cache_config.kv_cache_groups)
        if isinstance(g.kv_cache_spec, attention)
    )


class ZeroingLog:
    """New block ids per group since the last :meth:`take`."""

    __slots__ = ("_groups", "_ids")

    def __init__(self, num_groups: int, group_ids: tuple[int, ...]) -> None:
        self._groups = frozenset(group_ids)
        self._ids: list[list[int]] = [[] for _ in range(num_groups)]

    def record_allocation(
        self,
        new: Sequence[Sequence[int]],
        held: Sequence[Any] | None,
        hits: Sequence[Sequence[int]],
        skip: Sequence[int],
    ) -> None:
        """Record one allocation as vLLM does, group by group: a new
        request's blocks for external tokens (``held``: its tables after the
        allocation, None without external tokens; skipped for the groups in
        ``skip``, whose blocks an async load writes), then the blocks for the
        new tokens (``new``; ``hits``: the hit lists it adopted)."""
        for g, (log, ids) in enumerate(zip(self._ids, new, strict=True)):
            if g not in self._groups:
                continue
            if held is not None and g not in skip:
                table = held[g]
                start = len(hits[g]) if hits else 0
                log.extend(int(i) for i in table[start : len(table) - len(ids)] if i)
            log.extend(ids)

    def record_table(self, held: Sequence[Any], block_sizes: Sequence[int], start: int) -> None:
        """Record a request's blocks from token ``start`` on (block-aligned
        in every group), null entries included, as vLLM re-records blocks a
        failed load left unwritten."""
        for g, (log, table, bs) in enumerate(zip(self._ids, held, block_sizes, strict=True)):
            if g not in self._groups:
                continue
            if start % bs:
                raise ValueError(f"start_token {start} is not a multiple of block size {bs}")
            log.extend(int(i) for i in table[start // bs :])

    def take(self) -> list[int]:
        """Every recorded id, group by group; the log is emptied."""
        out = [i for log in self._ids for i in log]
        for log in self._ids:
            log.clear()
        return out
