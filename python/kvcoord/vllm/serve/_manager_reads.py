"""What the views of a :class:`kvcoord.vllm.KVCacheManager` read of it.

The views (vLLM's coordinator and single-type managers as the scheduler and
vLLM's tests read them, :mod:`kvcoord.vllm.serve._views`, and the HiSparse
group views) hold a :class:`ManagerReads`, never the manager: each thing
they read is one method or property here, so the manager's attributes a
view depends on are this class's body and nothing else. The HiSparse
manager's views read more through a subclass
(:class:`kvcoord.vllm.hisparse._group_views.HiSparseReads`).
"""

from __future__ import annotations

from typing import Any

from kvcoord.vllm.serve._blocks import BlockView, KVCacheBlocks

__all__ = ["ManagerReads"]


class ManagerReads:
    """A manager as its views read it: request tables, per-group facts,
    lookups and predictions (read on each call, never copied)."""

    __slots__ = ("_manager",)

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    # ---- configuration ---------------------------------------------------

    @property
    def kv_cache_config(self) -> Any:
        """vLLM's ``KVCacheConfig`` the manager was built with."""
        return self._manager.kv_cache_config

    @property
    def caching(self) -> bool:
        return bool(self._manager.enable_caching)

    def block_size(self, group_id: int) -> int:
        """Tokens per block of vLLM's group ``group_id`` (scaled under DCP)."""
        return int(self._manager._block_sizes[group_id])

    @property
    def eagle_group_ids(self) -> tuple[int, ...]:
        return tuple(self._manager.eagle_group_ids)

    @property
    def drop_eagle_group_ids(self) -> tuple[int, ...]:
        return tuple(self._manager.drop_eagle_group_ids)

    def is_eagle_group(self, group_id: int) -> bool:
        """Whether the core treats ``group_id`` as an EAGLE group (vLLM's
        ``use_eagle`` of its single-type manager)."""
        return group_id in self._manager._core.eagle_groups

    @property
    def hit_alignment(self) -> int:
        """Tokens a hit ends on a multiple of."""
        return int(self._manager._core.hit_alignment)

    @property
    def partial_hits(self) -> bool:
        """Whether hits may end inside a block (sub-block Mamba hits)."""
        return bool(self._manager._core.partial_hits)

    @property
    def retention_interval(self) -> int | None:
        return self._manager._core.retention_interval  # type: ignore[no-any-return]

    def set_retention_interval(self, interval: int | None) -> None:
        self._manager._core.set_retention_interval(interval)

    @property
    def connector_group(self) -> int | None:
        """The group a connector's lookup reports beside Mamba groups."""
        return self._manager._connector_group  # type: ignore[no-any-return]

    # ---- pools and tables ------------------------------------------------

    @property
    def pool(self) -> Any:
        """kvcoord's pool of the manager's (device) groups."""
        return self._manager._pool

    @property
    def block_pool(self) -> Any:
        """vLLM's ``BlockPool`` as the manager shows it (``manager.block_pool``)."""
        return self._manager.block_pool

    def held(self, request_id: str) -> tuple[Any, ...] | None:
        """The block ids per vLLM group the request holds (None: unknown)."""
        return self._manager._held(request_id)  # type: ignore[no-any-return]

    def request_ids(self) -> list[str]:
        """The ids of the requests the manager knows, in registration order."""
        return list(self._manager._requests.ids())

    def num_requests(self) -> int:
        """Requests the core holds blocks for."""
        return int(self._manager._core.num_requests)

    def mamba_checkpoint(self, request_id: str, group_id: int) -> tuple[int, int] | None:
        """(token position, table index) of the prefill checkpoint the
        request's latest allocation reserved in Mamba group ``group_id``."""
        if self.held(request_id) is None:
            return None
        found = self._manager._core.request_mamba_checkpoint(request_id, group_id)
        return None if found is None else (int(found[0]), int(found[1]))

    # ---- lookups and predictions -----------------------------------------

    def hits_per_group(
        self, block_hashes: Any, max_cache_hit_length: int
    ) -> tuple[tuple[list[BlockView], ...], tuple[int, ...]]:
        """Each group's own longest hit for ``block_hashes`` (blocks, hit
        tokens per group): vLLM's ``find_longest_cache_hit_per_group``."""
        manager = self._manager
        probe = manager._requests.probe(block_hashes)
        blocks, hits = manager.find_hits_per_group(probe, max_cache_hit_length)
        return KVCacheBlocks(blocks.arrays(), manager._pool).blocks, hits

    def predict(
        self,
        request_id: str,
        num_tokens: int,
        hits: tuple[list[int], ...],
        total_computed: int,
        num_encoder_tokens: int,
        num_local: int,
        admission: bool,
        num_tokens_main_model: int | None,
        prefill_end: int,
    ) -> int:
        """vLLM's ``get_num_blocks_to_allocate`` for the request ``request_id``
        (see ``KVCacheManager._predict``); ``num_local`` of the computed
        tokens are local (the plain manager needs no split)."""
        manager = self._manager
        return int(
            manager._predict(
                manager._requests.peek(request_id),
                num_tokens,
                hits,
                total_computed,
                num_encoder_tokens,
                admission,
                num_tokens_main_model=num_tokens_main_model,
                prefill_end=prefill_end,
            )
        )
