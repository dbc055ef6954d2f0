"""pytest plugin: ``pytest -p kvcoord.vllm.pytest_plugin tests/v1/core`` runs
vLLM's own tests with kvcoord as the KV-cache manager.

Loaded with ``-p``, this module is imported before any test module, so
:func:`kvcoord.vllm.enable` has replaced vLLM's ``KVCacheManager`` by the
time test modules import it.

A test that passes only because vLLM's own machinery served it does not
count for kvcoord: the plugin counts, per test, the constructions of vLLM's
``BlockPool`` (every vLLM manager and coordinator sits on one) and of
vLLM's single-type managers (which decide on their own over any pool), and
the fallbacks of :class:`kvcoord.vllm.KVCacheManager`. Each test's junit
record carries the property ``kvcoord_pure`` (``1`` when none happened;
``kvcoord_vllm_pools`` counts the pools and single-type managers), and the
terminal summary splits the passes.

Tests that build vLLM's ``BlockPool`` (and single-type managers) themselves
get kvcoord's classes (:class:`kvcoord.vllm.BlockPool`, the hit search of
:mod:`kvcoord.vllm._hit_search`) when listed in :data:`POOL_TESTS`: for the
duration of such a test the plugin rebinds those names in its test module,
nowhere else. vLLM's own modules keep their classes, so vLLM code that
subclasses or builds them (vLLM's fallback manager, HiSparse's
``SharedEventQueueBlockPool``, vLLM's coordinators) is unchanged, and still
counted as not pure.
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
    # vLLM's single-type managers decide on their own over any pool, so
    # building one makes a test not pure either.
    managers: Any = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    base = managers.SingleTypeKVCacheManager
    base_init = base.__init__

    def counted_manager_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _vllm_pools[0] += 1
        base_init(self, *args, **kwargs)

    base.__init__ = counted_manager_init


_count_vllm_pools()


# Tests that build vLLM's ``BlockPool`` (and single-type managers) themselves
# and get kvcoord's, by test module (the last part of its name) and test
# function, with the names rebound in that module: each is checked to pass
# on kvcoord's classes (a test not listed, such as one a later vLLM adds,
# keeps vLLM's and counts as not pure). In test_prefix_caching these are all
# the tests that build a pool; in test_single_type_kv_cache_manager the three
# that only search for hits (kvcoord.vllm._hit_search).
_POOL = ("BlockPool",)
POOL_TESTS: dict[str, dict[str, tuple[str, ...]]] = {
    "test_prefix_caching": {
        "test_cache_blocks": _POOL,
        "test_cache_blocks_multi_group": _POOL,
        "test_maybe_evict_cached_block": _POOL,
        "test_null_parent_block_hash": _POOL,
        "test_block_removed_event_group_idx": _POOL,
        "test_emit_cached_block_events": _POOL,
        "test_emit_cached_block_events_disabled": _POOL,
        "test_emit_cached_block_events_zero_cached": _POOL,
    },
    "test_single_type_kv_cache_manager": {
        "test_chunked_local_attention_possible_cached_prefix": (
            *_POOL,
            "ChunkedLocalAttentionManager",
        ),
        "test_sliding_window_possible_cached_prefix": (*_POOL, "SlidingWindowManager"),
        "test_sliding_window_cache_hit_with_finer_hash_alignment": (
            *_POOL,
            "SlidingWindowManager",
        ),
    },
}

# Where each rebound name's vLLM class and kvcoord's class live.
_CLASSES = {
    "BlockPool": ("vllm.v1.core.block_pool", "kvcoord.vllm._pool"),
    "ChunkedLocalAttentionManager": (
        "vllm.v1.core.single_type_kv_cache_manager",
        "kvcoord.vllm._hit_search",
    ),
    "SlidingWindowManager": (
        "vllm.v1.core.single_type_kv_cache_manager",
        "kvcoord.vllm._hit_search",
    ),
}


def _rebindings(item: Any) -> tuple[Any, dict[str, Any]]:
    """The test module of ``item`` and kvcoord's class for each name to
    rebind there during the test (nothing for a test not listed, or a name
    the module does not bind to vLLM's class)."""
    module = getattr(item, "module", None)
    served = POOL_TESTS.get(getattr(module, "__name__", "").rsplit(".", 1)[-1], {})
    name = str(getattr(item, "originalname", None) or getattr(item, "name", ""))
    out = {}
    for attr in served.get(name, ()):
        theirs, ours = _CLASSES[attr]
        vllm_cls = getattr(importlib.import_module(theirs), attr)
        if module.__dict__.get(attr) is vllm_cls:
            out[attr] = getattr(importlib.import_module(ours), attr)
    return module, out


def _mark() -> int:
    return _vllm_pools[0] + sum(_kv.fallbacks.values())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
    item._kvcoord_mark = _mark()
    item._kvcoord_pools = _vllm_pools[0]
    item._kvcoord_fallbacks = _kv.fallbacks.copy()
    module, ours = _rebindings(item)
    originals = {attr: module.__dict__[attr] for attr in ours}
    for attr, cls in ours.items():
        setattr(module, attr, cls)  # for this test only
    try:
        yield
    finally:
        for attr, cls in originals.items():
            setattr(module, attr, cls)


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
