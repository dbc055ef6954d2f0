"""What vLLM's scheduler and its helpers read of vLLM's coordinator and
single-type managers, as views over a :class:`kvcoord.vllm.KVCacheManager`,
which they read through :class:`~kvcoord.vllm.serve._manager_reads.ManagerReads`."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

from kvcoord.coordinator import KVCacheCoordinator
from kvcoord.vllm.serve._blocks import BlockView, ids_of
from kvcoord.vllm.serve._manager_reads import ManagerReads
from kvcoord.vllm.serve._pool_view import PoolView

__all__ = ["CoordinatorView", "coordinator_view"]


class _LiveTable(Sequence[BlockView]):
    """``req_to_blocks[request_id]``: the request's block list as vLLM keeps
    it, one object that later allocations and releases show through (read
    from the core's table on each access; code holding vLLM's list sees it
    grow). Once the request holds no blocks it keeps the blocks it held
    last, as vLLM's list does after the manager dropped it. Inspection only."""

    __slots__ = ("_last", "_request_id", "_tables")

    def __init__(self, tables: _RequestTables, request_id: str, ids: list[int]) -> None:
        self._tables = tables
        self._request_id = request_id
        self._last = ids

    def _ids(self) -> list[int]:
        held = self._tables._reads.held(self._request_id)
        if held is not None:
            self._last = held[self._tables._group_id].tolist()
        return self._last

    @overload
    def __getitem__(self, index: int) -> BlockView: ...
    @overload
    def __getitem__(self, index: slice) -> list[BlockView]: ...
    def __getitem__(self, index: int | slice) -> BlockView | list[BlockView]:
        pool = self._tables._pool
        if isinstance(index, slice):
            return [BlockView(pool, i) for i in self._ids()[index]]
        return BlockView(pool, self._ids()[index])

    def __len__(self) -> int:
        return len(self._ids())

    def __iter__(self) -> Iterator[BlockView]:
        pool = self._tables._pool
        return iter([BlockView(pool, i) for i in self._ids()])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as vLLM's list

    def __add__(self, other: Sequence[Any]) -> list[Any]:
        return [*self, *other]

    def __radd__(self, other: Sequence[Any]) -> list[Any]:
        return [*other, *self]

    def __repr__(self) -> str:
        return repr(list(self))


class _RequestTables(Mapping[str, _LiveTable]):
    """``req_to_blocks`` of one group: request id -> its live block list
    (read-only; read from the core's table, for inspection only)."""

    def __init__(self, reads: ManagerReads, group_id: int, pool: Any = None) -> None:
        self._reads = reads
        self._group_id = group_id
        # The pool holding the group's blocks (the manager's, unless a
        # manager keeps some groups on a pool of their own, as HiSparse does).
        self._pool = reads.pool if pool is None else pool

    def __getitem__(self, request_id: str) -> _LiveTable:
        held = self._reads.held(request_id)
        if held is None:
            raise KeyError(request_id)
        return _LiveTable(self, request_id, held[self._group_id].tolist())

    def __iter__(self) -> Iterator[str]:
        return iter([r for r in self._reads.request_ids() if r in self])

    def __len__(self) -> int:
        return self._reads.num_requests()

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and self._reads.held(request_id) is not None


class _CachedCounts(Mapping[str, int]):
    """``num_cached_block`` of one group: request id -> how many of its
    leading blocks are in the prefix cache, for requests with at least one
    (as vLLM records them; read-only, for inspection)."""

    def __init__(self, tables: _RequestTables) -> None:
        self._tables = tables

    def _count(self, request_id: str) -> int:
        tables = self._tables
        held = tables._reads.held(request_id)
        if held is None:
            return 0
        cached = tables._pool.cached_mask()
        ids = held[tables._group_id]
        n = 0
        while n < len(ids) and ids[n] and cached[ids[n]]:
            n += 1
        return n

    def __getitem__(self, request_id: str) -> int:
        n = self._count(request_id)
        if not n:
            raise KeyError(request_id)
        return n

    def __iter__(self) -> Iterator[str]:
        return iter([r for r in self._tables if self._count(r)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and self._count(request_id) > 0


class _SingleTypeView:
    """What the scheduler reads of each of vLLM's single-type managers."""

    __slots__ = (
        "block_pool",
        "block_size",
        "cache_hit_alignment_tokens",
        "dcp_world_size",
        "kv_cache_group_id",
        "kv_cache_spec",
        "num_cached_block",
        "pcp_world_size",
        "req_to_blocks",
        "use_eagle",
    )

    def __init__(
        self, reads: ManagerReads, group_id: int, spec: Any, args: Mapping[str, Any]
    ) -> None:
        self.kv_cache_group_id = group_id
        self.kv_cache_spec = spec
        self.block_size = reads.block_size(group_id)
        # vLLM shards only dcp_sharded specs over the context-parallel ranks.
        sharded = bool(getattr(spec, "dcp_sharded", False))
        self.dcp_world_size = int(args.get("dcp_world_size", 1)) if sharded else 1
        self.pcp_world_size = int(args.get("pcp_world_size", 1)) if sharded else 1
        self.req_to_blocks = _RequestTables(reads, group_id)
        self.num_cached_block = _CachedCounts(self.req_to_blocks)
        # vLLM's use_eagle: set on every group of a spec with an EAGLE
        # group, by a caching coordinator only.
        self.use_eagle = reads.caching and reads.is_eagle_group(group_id)
        # Auxiliary-output connectors look blocks up by vLLM's block hash
        # here; kvcoord's keys are vLLM's hashes (see kvcoord.vllm.serve._requests).
        self.block_pool = reads.block_pool
        # Tokens a hit ends on a multiple of (vLLM sets it on every manager).
        self.cache_hit_alignment_tokens = reads.hit_alignment

    @property
    def _null_block(self) -> BlockView:
        """vLLM's ``_null_block``: the view of block 0 of the group's pool
        (the entries of ``req_to_blocks`` a window released are this view
        while it is alive, as vLLM's are its one null block)."""
        return BlockView(self.req_to_blocks._pool, 0)


class _MambaCheckpoints(Mapping[str, tuple[int, int]]):
    """``_checkpoints`` of a Mamba "align" group: request id -> (token
    position, table index) of the prefill checkpoint its latest allocation
    reserved (read-only, from the core)."""

    def __init__(self, reads: ManagerReads, group_id: int) -> None:
        self._reads = reads
        self._group_id = group_id

    def __getitem__(self, request_id: str) -> tuple[int, int]:
        found = self._reads.mamba_checkpoint(request_id, self._group_id)
        if found is None:
            raise KeyError(request_id)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter([r for r in self._reads.request_ids() if r in self])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, request_id: object) -> bool:
        try:
            self[request_id]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True


class _MambaView(_SingleTypeView):
    """The view of a Mamba group: also its reserved prefill checkpoints."""

    __slots__ = ("_checkpoints",)

    def __init__(
        self, reads: ManagerReads, group_id: int, spec: Any, args: Mapping[str, Any]
    ) -> None:
        super().__init__(reads, group_id, spec, args)
        self._checkpoints = _MambaCheckpoints(reads, group_id)


class _CrossAttentionView(_SingleTypeView):
    """The view of a cross-attention group. Registered as a virtual subclass
    of vLLM's ``CrossAttentionManager`` (an ABC), since code that reads the
    coordinator finds that group by ``isinstance``; it reads only what
    :class:`_SingleTypeView` has (``req_to_blocks``: the encoder blocks of
    each request, allocated once by the core)."""

    __slots__ = ()


_CrossAttentionView.__name__ = _CrossAttentionView.__qualname__ = "CrossAttentionManager"


@functools.cache
def _cross_attention_view() -> type[_SingleTypeView]:
    managers: Any = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    managers.CrossAttentionManager.register(_CrossAttentionView)
    return _CrossAttentionView


def _view_class(spec: Any) -> type[_SingleTypeView]:
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    if type(spec) is interface.CrossAttentionSpec:
        return _cross_attention_view()
    if type(spec) is interface.MambaSpec:
        return _MambaView
    return _SingleTypeView


class CoordinatorView:
    """What the scheduler and its helpers read of vLLM's coordinator."""

    def __init__(
        self,
        reads: ManagerReads,
        core: KVCacheCoordinator,
        args: Mapping[str, Any],
        single_type_managers: list[Any] | None = None,
    ) -> None:
        self._reads = reads
        self.core = core
        self.num_reprefillable_tokens = core.core.num_reprefillable_tokens
        self.scheduler_block_size = int(core.core.scheduler_block_size)
        self.hash_block_size = int(core.core.hash_block_size)
        self.dcp_world_size = int(args.get("dcp_world_size", 1))
        self.pcp_world_size = int(args.get("pcp_world_size", 1))
        self.eagle_group_ids = reads.eagle_group_ids
        self.drop_eagle_group_ids = reads.drop_eagle_group_ids
        if single_type_managers is None:
            groups = reads.kv_cache_config.kv_cache_groups
            single_type_managers = [
                _view_class(g.kv_cache_spec)(reads, i, g.kv_cache_spec, args)
                for i, g in enumerate(groups)
            ]
        self.single_type_managers = single_type_managers

    @property
    def block_pool(self) -> PoolView:
        return self._reads.block_pool  # type: ignore[no-any-return]

    @property
    def enable_partial_hash_hits(self) -> bool:
        """Whether hits may end inside a block (sub-block Mamba hits)."""
        return self._reads.partial_hits

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        """Tokens a hit ends on a multiple of (the core's hit alignment)."""
        return self._reads.hit_alignment

    @property
    def retention_interval(self) -> int | None:
        """The prefix-cache retention interval (None: dense). vLLM's
        coordinator reads it on every call, so setting it between steps
        changes the core's."""
        return self._reads.retention_interval

    @retention_interval.setter
    def retention_interval(self, interval: int | None) -> None:
        self._reads.set_retention_interval(interval)

    @property
    def full_attention_group_id(self) -> int | None:
        """The group a connector's lookup reports beside Mamba groups."""
        return self._reads.connector_group

    def find_longest_cache_hit_per_group(
        self, block_hashes: Any, max_cache_hit_length: int
    ) -> tuple[tuple[list[BlockView], ...], tuple[int, ...]]:
        """vLLM's per-group lookup (hybrid layouts): each group's own
        longest hit for ``block_hashes``, without agreeing on one length."""
        return self._reads.hits_per_group(block_hashes, max_cache_hit_length)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Any,
        num_encoder_tokens: int = 0,
        total_computed_tokens: int = 0,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """vLLM's prediction: blocks an allocation of ``num_tokens`` slots
        would take (``apply_admission_cap``: capped per group at the most
        blocks a request can hold there). ``num_tokens_main_model`` (vLLM
        requires it; None: all ``num_tokens``) of the slots are the main
        model's; ``prefill_end`` is where the request's prefill ends, as
        vLLM's coordinator takes it (under sparse retention a Mamba group
        reserves its prefill checkpoint on the chunk reaching it)."""
        hits = tuple(ids_of(g) for g in new_computed_blocks)
        return self._reads.predict(
            request_id,
            num_tokens,
            hits if any(hits) else (),
            total_computed_tokens,
            num_encoder_tokens,
            num_local_computed_tokens,
            apply_admission_cap,
            num_tokens_main_model,
            prefill_end,
        )


# vLLM's coordinator classes share the names of kvcoord's policies; the view
# of a manager's coordinator is a class of the same name (code and tests
# read ``type(manager.coordinator).__name__``).
_VIEW_CLASSES: dict[str, type[CoordinatorView]] = {
    name: type(name, (CoordinatorView,), {"__doc__": f"CoordinatorView of a {name} policy."})
    for name in (
        "KVCacheCoordinatorNoPrefixCache",
        "UnitaryKVCacheCoordinator",
        "HybridKVCacheCoordinator",
    )
}


def coordinator_view(
    manager: Any,
    core: KVCacheCoordinator,
    args: Mapping[str, Any],
    reads: ManagerReads | None = None,
    single_type_managers: list[Any] | None = None,
) -> CoordinatorView:
    """The coordinator view of ``manager`` (built with vLLM's constructor
    arguments ``args``), its class named after the policy. It reads the
    manager through ``reads`` (default: a :class:`ManagerReads` of it); its
    single-type managers are ``single_type_managers`` (default: one view
    per group)."""
    reads = ManagerReads(manager) if reads is None else reads
    name = type(core).__name__
    cls = _registered_view_class(name) if name in _VIEW_CLASSES else CoordinatorView
    return cls(reads, core, args, single_type_managers)


@functools.cache
def _registered_view_class(name: str) -> type[CoordinatorView]:
    """The view class named ``name``, registered (once) as a virtual subclass
    of vLLM's coordinator class of that name (an ABC): code beside the
    scheduler, vLLM's connector tests among it, tells hybrid layouts apart by
    ``isinstance(manager.coordinator, HybridKVCacheCoordinator)``."""
    coordinators: Any = importlib.import_module("vllm.v1.core.kv_cache_coordinator")
    cls = _VIEW_CLASSES[name]
    getattr(coordinators, name).register(cls)
    return cls
