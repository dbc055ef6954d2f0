"""kvcoord.vllm's classes take vLLM 0.33.0's arguments: every public method
of vLLM's ``KVCacheManager``, ``KVCacheBlocks`` and ``BlockPool`` (and the
coordinator's prediction, which vLLM's scheduler calls) exists on kvcoord's
counterpart with vLLM's parameters, positional ones in vLLM's order, and
none required that vLLM lets a caller omit.

A class-level guard: an argument vLLM's callers pass that kvcoord does not
take is a ``TypeError`` mid-run, and one kvcoord makes required breaks
callers that omit it. ``KNOWN`` lists the gaps there are, each with why.

Skipped when vLLM is not installed (``make test-vllm`` runs it).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

from vllm.v1.core import block_pool, kv_cache_coordinator, kv_cache_manager

import kvcoord.vllm as kv
from kvcoord.vllm.hisparse._manager import HiSparseManager
from kvcoord.vllm.serve._blocks import KVCacheBlocks
from kvcoord.vllm.serve._pool_view import PoolView
from kvcoord.vllm.serve._views import CoordinatorView
from kvcoord.vllm.testing._pool import BlockPool

# (kvcoord class, method): why it differs from vLLM's.
KNOWN = {
    # The manager's pool is read by the scheduler; a request's blocks are
    # cached and freed through the manager. Code that drives the pool by
    # hand (vLLM's own single-type managers, the HiSparse coordinator,
    # connectors that bind it) keeps vLLM's pool (the pytest plugin's
    # lending rule) or falls back at construction (docs/vllm.md).
    ("PoolView", "cache_full_blocks"): "no block_mask: only vLLM's own managers pass one",
    ("PoolView", "cache_partial_block"): "vLLM's managers only",
    ("PoolView", "emit_cached_block_events"): "vLLM's managers only",
    ("PoolView", "is_block_writable"): "vLLM's managers only",
    ("PoolView", "move_block_hashes"): "vLLM's managers only",
    ("PoolView", "touch"): "connectors binding the pool: vLLM's pool there",
    ("PoolView", "unpin_blocks"): "the HiSparse coordinator: its own views",
    ("BlockPool", "cache_partial_block"): "sub-block hits are the core's, not the pool's",
    ("BlockPool", "move_block_hashes"): "sub-block hits are the core's, not the pool's",
}


def _parameters(f: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(f).parameters.values())
    except (TypeError, ValueError):
        return None


def differences(theirs: type, ours: type, names: tuple[str, ...] = ()) -> list[str]:
    """How ``ours``' public methods differ from ``theirs``' (``names``: only
    these), as ``"method: what"`` lines."""
    out: list[str] = []
    for name, theirs_fn in inspect.getmembers(theirs):
        if name.startswith("_") or not callable(theirs_fn) or (names and name not in names):
            continue
        if isinstance(inspect.getattr_static(theirs, name), type):
            continue  # a nested class, not a method
        if (ours.__name__, name) in KNOWN:
            continue
        ours_fn = getattr(ours, name, None)
        if ours_fn is None:
            out.append(f"{name}: missing")
            continue
        vllm_params, our_params = _parameters(theirs_fn), _parameters(ours_fn)
        if vllm_params is None or our_params is None:
            out.append(f"{name}: no signature to compare")
            continue
        by_name = {p.name: p for p in our_params}
        takes_any = any(p.kind is p.VAR_KEYWORD for p in our_params)
        for i, p in enumerate(vllm_params):
            q = by_name.get(p.name)
            if q is None:
                if not takes_any:
                    out.append(f"{name}: no parameter {p.name}")
                continue
            positional = (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)
            if p.kind in positional and (i >= len(our_params) or our_params[i].name != p.name):
                out.append(f"{name}: {p.name} is not positional {i}")
            if p.kind is p.POSITIONAL_OR_KEYWORD and q.kind is q.KEYWORD_ONLY:
                out.append(f"{name}: {p.name} is keyword-only")
            if p.default is not p.empty and q.default is q.empty:
                out.append(f"{name}: {p.name} is required (vLLM: {p.default!r})")
            # kvcoord's Rust methods take None for "not passed".
            if q.default not in (q.empty, None, p.default) and p.default is not p.empty:
                out.append(f"{name}: {p.name} defaults to {q.default!r} (vLLM: {p.default!r})")
    return out


@pytest.mark.parametrize(
    ("theirs", "ours", "names"),
    [
        pytest.param(kv.original_manager_class(), kv.KVCacheManager, (), id="KVCacheManager"),
        # What KVCacheManager(...) is for a HiSparse configuration.
        pytest.param(kv.original_manager_class(), HiSparseManager, (), id="HiSparse manager"),
        pytest.param(kv_cache_manager.KVCacheBlocks, KVCacheBlocks, (), id="KVCacheBlocks"),
        pytest.param(block_pool.BlockPool, BlockPool, (), id="BlockPool"),
        pytest.param(block_pool.BlockPool, PoolView, (), id="the manager's pool"),
        # What vLLM's scheduler calls on `kv_cache_manager.coordinator`
        # (the rest runs inside vLLM's own manager).
        pytest.param(
            kv_cache_coordinator.KVCacheCoordinator,
            CoordinatorView,
            ("get_num_blocks_to_allocate",),
            id="coordinator",
        ),
    ],
)
def test_methods_take_vllms_arguments(theirs: type, ours: type, names: tuple[str, ...]) -> None:
    assert differences(theirs, ours, names) == []


def test_the_guard_sees_a_missing_argument() -> None:
    class Theirs:
        def call(self, request: Any, n: int, *, flag: bool = False) -> None: ...
        def other(self) -> None: ...

    class Ours:
        def call(self, n: int, request: Any, *, flag: bool) -> None: ...

    assert differences(Theirs, Ours) == [
        "call: request is not positional 1",
        "call: n is not positional 2",
        "call: flag is required (vLLM: False)",
        "other: missing",
    ]
