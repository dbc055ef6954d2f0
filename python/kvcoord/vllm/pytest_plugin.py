"""pytest plugin: ``pytest -p kvcoord.vllm.pytest_plugin tests/v1/core`` runs
vLLM's own tests with kvcoord as the KV-cache manager.

Loaded with ``-p``, this module is imported before any test module, so
:func:`kvcoord.vllm.enable` has replaced vLLM's ``KVCacheManager`` by the
time test modules import it.

A test that passes only because vLLM's own machinery served it does not
count for kvcoord: the plugin counts, per test, the constructions of vLLM's
``BlockPool`` (every vLLM manager, coordinator and single-type manager sits
on one) and the fallbacks of :class:`kvcoord.vllm.KVCacheManager`. Each
test's junit record carries the property ``kvcoord_pure`` (``1`` when
neither happened), and the terminal summary splits the passes.

Tests that build vLLM's ``BlockPool`` themselves get kvcoord's
(:class:`kvcoord.vllm.BlockPool`) when listed in :data:`POOL_TESTS`: for the
duration of such a test the plugin rebinds the name ``BlockPool`` in its
test module, nowhere else. vLLM's own module keeps its class, so vLLM code
that subclasses or builds it (vLLM's fallback manager, HiSparse's
``SharedEventQueueBlockPool``, vLLM's single-type managers' imports) is
unchanged, and still counted as not pure.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Generator
from typing import Any

import pytest

import kvcoord.vllm as _kv

_kv.enable()

_vllm_pools = [0]
_passes = {"pure": 0, "vllm": 0}


def _count_vllm_pools() -> None:
    pool_cls: Any = importlib.import_module("vllm.v1.core.block_pool").BlockPool
    original = pool_cls.__init__

    def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _vllm_pools[0] += 1
        original(self, *args, **kwargs)

    pool_cls.__init__ = counted_init


_count_vllm_pools()


# Tests that build vLLM's ``BlockPool`` themselves and get kvcoord's, by
# test module (the last part of its name) and test function: each is checked
# to pass on kvcoord's pool (a test not listed, such as one a later vLLM
# adds, keeps vLLM's pool and counts as not pure). In test_prefix_caching
# these are all the tests that build a pool.
POOL_TESTS: dict[str, frozenset[str]] = {
    "test_prefix_caching": frozenset(
        {
            "test_cache_blocks",
            "test_cache_blocks_multi_group",
            "test_maybe_evict_cached_block",
            "test_null_parent_block_hash",
            "test_block_removed_event_group_idx",
            "test_emit_cached_block_events",
            "test_emit_cached_block_events_disabled",
            "test_emit_cached_block_events_zero_cached",
        }
    ),
}


def _pool_module(item: Any) -> Any:
    """The test module of ``item`` when the test gets kvcoord's ``BlockPool``."""
    module = getattr(item, "module", None)
    served = POOL_TESTS.get(getattr(module, "__name__", "").rsplit(".", 1)[-1], ())
    name = getattr(item, "originalname", None) or getattr(item, "name", "")
    if name not in served:
        return None
    vllm_pool = importlib.import_module("vllm.v1.core.block_pool").BlockPool
    return module if module.__dict__.get("BlockPool") is vllm_pool else None


def _mark() -> int:
    return _vllm_pools[0] + sum(_kv.fallbacks.values())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
    item._kvcoord_mark = _mark()
    item._kvcoord_pools = _vllm_pools[0]
    item._kvcoord_fallbacks = _kv.fallbacks.copy()
    module = _pool_module(item)
    if module is None:
        yield
        return
    from kvcoord.vllm._pool import BlockPool

    original = module.BlockPool
    module.BlockPool = BlockPool  # for this test only
    try:
        yield
    finally:
        module.BlockPool = original


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    pure = _mark() == getattr(item, "_kvcoord_mark", -1)
    item.user_properties.append(("kvcoord_pure", "1" if pure else "0"))
    if not pure:
        # Why not: vLLM pools built, and the fallback reasons, during this test.
        pools = _vllm_pools[0] - getattr(item, "_kvcoord_pools", 0)
        before = Counter(getattr(item, "_kvcoord_fallbacks", None) or {})
        reasons = Counter(_kv.fallbacks) - before
        item.user_properties.append(("kvcoord_vllm_pools", str(pools)))
        item.user_properties.append(("kvcoord_fallbacks", "; ".join(sorted(reasons))))
    report.user_properties = list(item.user_properties)
    if report.passed:
        _passes["pure" if pure else "vllm"] += 1


def pytest_report_header(config: Any) -> str:
    return "kvcoord.vllm: vLLM's KVCacheManager is kvcoord's (fallbacks are logged)"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    tr = terminalreporter
    tr.write_line(
        f"kvcoord.vllm: {_passes['pure']} passed on kvcoord alone, {_passes['vllm']} passed "
        f"only with vLLM's own BlockPool or a fallback; {_kv.served['managers']} managers "
        f"served by kvcoord, {sum(_kv.fallbacks.values())} fell back to vLLM's own"
    )
    for reason, count in _kv.fallbacks.most_common():
        tr.write_line(f"  fallback x{count}: {reason}")
