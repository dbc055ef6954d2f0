"""What vLLM's scheduler and its helpers read of vLLM's coordinator and
single-type managers, as views over a :class:`kvcoord.vllm.KVCacheManager`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kvcoord.coordinator import KVCacheCoordinator
from kvcoord.vllm._blocks import BlockView, PoolView, ids_of

if TYPE_CHECKING:
    from kvcoord.vllm.manager import KVCacheManager

__all__ = ["CoordinatorView"]


class _RequestTables(Mapping[str, list[BlockView]]):
    """``req_to_blocks`` of one group: request id -> block views (read-only;
    built from the core's table on each access, for inspection only)."""

    def __init__(self, manager: KVCacheManager, group_id: int) -> None:
        self._manager = manager
        self._group_id = group_id

    def __getitem__(self, request_id: str) -> list[BlockView]:
        held = self._manager._held(request_id)
        if held is None:
            raise KeyError(request_id)
        pool = self._manager._pool
        return [BlockView(pool, int(i)) for i in held[self._group_id]]

    def __iter__(self) -> Iterator[str]:
        return iter([r for r in self._manager._requests.ids() if r in self])

    def __len__(self) -> int:
        return int(self._manager._core.num_requests)

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and self._manager._held(request_id) is not None


class _SingleTypeView:
    """What the scheduler reads of each of vLLM's single-type managers."""

    __slots__ = ("block_size", "kv_cache_group_id", "kv_cache_spec", "req_to_blocks")

    def __init__(self, manager: KVCacheManager, group_id: int, spec: Any) -> None:
        self.kv_cache_group_id = group_id
        self.kv_cache_spec = spec
        self.block_size = int(spec.block_size)
        self.req_to_blocks = _RequestTables(manager, group_id)


class CoordinatorView:
    """What the scheduler and its helpers read of vLLM's coordinator."""

    enable_partial_hash_hits = False
    eagle_group_ids: tuple[int, ...] = ()
    num_reprefillable_tokens = 0

    def __init__(self, manager: KVCacheManager, core: KVCacheCoordinator) -> None:
        self._manager = manager
        self.core = core
        self.single_type_managers = [
            _SingleTypeView(manager, i, g.kv_cache_spec)
            for i, g in enumerate(manager.kv_cache_config.kv_cache_groups)
        ]

    @property
    def block_pool(self) -> PoolView:
        return self._manager.block_pool

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any,
        num_encoder_tokens: int = 0,
        total_computed_tokens: int = 0,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int = 0,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Blocks an allocation of ``num_tokens`` slots would take (full attention)."""
        hits = tuple(ids_of(g) for g in new_computed_blocks) if any(new_computed_blocks) else ()
        return self._manager._predict(request_id, num_tokens, hits)
