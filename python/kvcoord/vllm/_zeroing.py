"""Newly allocated blocks the worker must zero (vLLM 0.33.0's
``needs_kv_cache_zeroing``: models with Mamba layers, whose state is read
before it is fully written, and mixed-precision caches).

vLLM records, per attention group (Mamba and circular-buffer groups never),
the ids of the blocks each allocation takes from the pool, external-token
blocks included unless their group is in ``skip_zeroing_group_ids`` (an
async load writes them); ``take_new_block_ids`` drains them group after
group. The core's allocation result is exactly those blocks, so this log
only files them.
"""

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
    """Block ids recorded for zeroing since the last :meth:`take`, per group."""

    __slots__ = ("_groups", "_ids")

    def __init__(self, group_ids: tuple[int, ...]) -> None:
        self._groups = group_ids
        self._ids: dict[int, list[int]] = {g: [] for g in group_ids}

    def record(
        self, new: Sequence[Sequence[int]], num_external: Sequence[int], skip: tuple[int, ...]
    ) -> None:
        """File one allocation's new blocks per group (``new[g]``), whose first
        ``num_external[g]`` are external-token blocks (not filed for groups
        in ``skip``)."""
        for g in self._groups:
            ids = list(new[g])
            if g in skip:
                ids = ids[num_external[g] :]
            self._ids[g].extend(i for i in ids if i)

    def record_table(self, held: Sequence[Any], block_sizes: Sequence[int], start: int) -> None:
        """File a request's blocks from token ``start`` on (vLLM's
        ``record_blocks_for_zeroing``; ``start`` must be block-aligned)."""
        for g in self._groups:
            bs = block_sizes[g]
            if start % bs:
                raise ValueError(f"start_token {start} is not a multiple of block size {bs}")
            self._ids[g].extend(int(i) for i in held[g][start // bs :])

    def take(self) -> list[int]:
        """Drain the recorded ids, group after group."""
        out: list[int] = []
        for g in self._groups:
            out.extend(self._ids[g])
            self._ids[g] = []
        return out
