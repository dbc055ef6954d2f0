"""The read side of :class:`kvcoord.vllm.KVCacheManager`: prefix-cache
statistics, block tables and ids as vLLM's scheduler and workers read them,
and the per-step hand-offs (events, zeroing, Mamba states).

Written as a base class of the manager so that the manager module holds the
decisions (lookups, allocation, freeing) and this one what is read back;
the attributes below are set by the manager's constructor.
"""

from __future__ import annotations

import importlib
from typing import Any

from kvcoord._arith import cdiv
from kvcoord.errors import UnknownRequestError
from kvcoord.vllm.serve import _mamba
from kvcoord.vllm.serve._blocks import BlockView, KVCacheBlocks, ids_of
from kvcoord.vllm.serve._events import EventLog
from kvcoord.vllm.serve._requests import RequestRegistry
from kvcoord.vllm.serve._residency_metrics import ResidencyFeed
from kvcoord.vllm.serve._zeroing import ZeroingLog

__all__ = ["ManagerReadouts"]

# vLLM's PrefixCacheStats class, imported once (make_prefix_cache_stats runs every step).
_STATS_CLASS: dict[str, Any] = {}


class ManagerReadouts:
    """What a kvcoord-served vLLM ``KVCacheManager`` answers without deciding."""

    enable_caching: bool
    log_stats: bool
    prefix_cache_stats: Any
    num_kv_cache_groups: int
    empty_kv_cache_blocks: KVCacheBlocks
    _core: Any
    _residency: ResidencyFeed | None
    _pool: Any
    _requests: RequestRegistry
    _events: EventLog | None
    _zeroing: ZeroingLog | None
    _mamba_groups: tuple[int, ...]
    _whole_table_groups: tuple[int, ...]
    _block_sizes: tuple[int, ...]

    # ---- statistics ------------------------------------------------------

    @staticmethod
    def _new_stats() -> Any:
        cls = _STATS_CLASS.get("cls")
        if cls is None:
            cls = _STATS_CLASS["cls"] = importlib.import_module(
                "vllm.v1.metrics.stats"
            ).PrefixCacheStats
        return cls()

    @property
    def usage(self) -> float:
        return float(self._pool.usage)

    def make_prefix_cache_stats(self) -> Any:
        # vLLM's scheduler drains the residency collector right after this.
        if self._residency is not None:
            self._residency.feed()
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = self._new_stats()
        return stats

    def prefix_cache_lookup_enabled(self, request: Any) -> bool:
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Any, num_hits: int) -> None:
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        stats: Any = self.prefix_cache_stats
        stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    def _held(self, request_id: str) -> tuple[Any, ...] | None:
        """The request's block table per group (read-only int32 arrays), or None."""
        try:
            blocks = self._core.blocks(request_id)
        except UnknownRequestError:
            return None
        arrays: tuple[Any, ...] = blocks.arrays()
        return arrays

    # ---- inspection --------------------------------------------------------

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[Any]:
        """vLLM's KV-cache events since the last call (empty unless enabled)."""
        return [] if self._events is None else self._events.take()

    def create_kv_cache_blocks(self, blocks: Any) -> KVCacheBlocks:
        if not any(len(g) for g in blocks):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(tuple(ids_of(g) for g in blocks), self._pool)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        held = self._held(request_id)
        return self.empty_kv_cache_blocks if held is None else self.create_kv_cache_blocks(held)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        held = self._held(request_id)
        if held is None:
            return tuple([] for _ in range(self.num_kv_cache_groups))
        return tuple(g.tolist() for g in held)

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        ids = self.get_block_ids(request_id)
        return tuple(
            g if i in self._whole_table_groups else g[: cdiv(num_computed_tokens, bs)]
            for i, (g, bs) in enumerate(zip(ids, self._block_sizes, strict=True))
        )

    def estimate_cached_tokens(self, request: Any) -> int:
        """Tokens covered by the request's cached blocks (min over groups).

        The last cached block is looked for from the tail: a few single-block
        lookups (a running request's last full block is usually cached), the
        pool's whole cached mask only when those find none."""
        held = self._held(request.request_id)
        if held is None or not self.enable_caching:
            return 0
        cached: Any = None
        block_hash = self._pool.block_hash
        result: int | None = None
        for g, bs in zip(held, self._block_sizes, strict=True):
            tokens = 0
            ids = g.tolist()
            index = len(ids) - 1
            stop = max(index - 4, -1)
            while index > stop:
                if ids[index] and block_hash(ids[index]) is not None:
                    tokens = (index + 1) * bs
                    break
                index -= 1
            else:
                if index >= 0:
                    if cached is None:
                        cached = self._pool.cached_mask()
                    while index >= 0:
                        if ids[index] and cached[ids[index]]:
                            tokens = (index + 1) * bs
                            break
                        index -= 1
            result = tokens if result is None else min(result, tokens)
        return result or 0

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> KVCacheBlocks:
        """The lookup result cut at ``num_computed_tokens`` (a multiple of
        every group's block size; every group but Mamba's must reach it).
        A cut that breaks either rule raises ``AssertionError``, as vLLM's
        assertions do."""
        groups = blocks.ids if isinstance(blocks, KVCacheBlocks) else blocks.blocks
        out = []
        for i, (g, bs) in enumerate(zip(groups, self._block_sizes, strict=True)):
            if num_computed_tokens % bs:
                raise AssertionError(f"{num_computed_tokens} tokens is not a multiple of {bs}")
            n = num_computed_tokens // bs
            if i in self._mamba_groups:
                # An external hit may supply the final Mamba state.
                n = min(n, len(g))
            elif n > len(g):
                raise AssertionError(f"cannot truncate {len(g)} blocks to {n}")
            out.append(ids_of(g)[:n])
        return self.create_kv_cache_blocks(tuple(out))

    # ---- per-step hand-offs (Mamba states; nothing else for served kinds) --

    def take_new_block_ids(self) -> list[int]:
        """Blocks allocated since the last call, for zeroing (group by group;
        empty unless the config needs KV-cache zeroing)."""
        return [] if self._zeroing is None else self._zeroing.take()

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Record the request's blocks from ``start_token`` on for zeroing
        again (blocks a failed async load left unwritten)."""
        if self._zeroing is None:
            return
        held = self._held(request_id)
        if held is None:
            held = tuple(() for _ in self._block_sizes)
        self._zeroing.record_table(held, self._block_sizes, start_token)

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        """vLLM's copies of Mamba states at sub-block boundaries made since
        the last call (``KVCacheBlockCopy`` each) and their ends, retained
        until the caller frees them through ``block_pool.free_blocks`` once
        the copies ran (empty without sub-block Mamba hits)."""
        if not self._mamba_groups:
            return [], []
        pairs = self._core.take_block_copies()
        if not pairs:
            return [], []
        utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
        copies = [utils.KVCacheBlockCopy(src_block_id=s, dst_block_id=d) for s, d in pairs]
        pool = self._pool
        return copies, [BlockView(pool, b) for pair in pairs for b in pair]

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """The Mamba states committed since the last call, per request:
        ``(group, block_id, tokens)`` each (empty without Mamba groups)."""
        if not self._mamba_groups:
            return {}
        return _mamba.boundary_offloads(self._core)

    def finalize_partial_tail_offloads(self, request: Any) -> list[tuple[int, int, int]]:
        """A finishing request's own prompt-tail states at sub-block
        boundaries that no later token was computed into: ``(group,
        block_id, tokens)`` each (vLLM's ``finalize_partial_tail_offloads``)."""
        if not self._mamba_groups:
            return []
        return [
            (g, b, t)
            for g, b, t in self._core.finalize_partial_tail_offloads(
                request.request_id, request.num_computed_tokens, request.num_in_flight_tokens
            )
        ]

    def new_step_starts(self) -> None:
        """A scheduler step begins: Mamba states cached during the previous
        step become usable as hits."""
        if self._mamba_groups:
            self._core.new_step_starts()

    def check_invariants(self) -> None:
        self._core.check_invariants()
