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
get kvcoord's stand-ins (:class:`kvcoord.vllm.BlockPool`, the hit search of
:mod:`kvcoord.vllm.testing._hit_search`) by a rule applied to every test, with no
test named anywhere (:func:`kvcoord.vllm.testing._lending.decide`): each stand-in
declares vLLM's class it stands for and the names of vLLM's surface it
serves; the plugin reads the test's code (its function and nested code, its
class, the fixtures it requests, its parameters, and the functions,
classes and modules of the test tree these reach by name) and lends the
stand-ins for the names its module binds to vLLM's classes when every name
of vLLM's surface the code uses is served, none is assigned, every
stand-in a lent one needs is lent too, and the code reaches no other vLLM
code that stands on a pool (a manager or coordinator with no stand-in, a
function taking a ``block_pool``). Otherwise the test keeps vLLM's
classes and counts as not pure. For the duration of a lent test the names
are rebound in its module, nowhere else: vLLM's own modules keep their
classes, so vLLM code that subclasses or builds them (vLLM's fallback
manager, HiSparse's ``SharedEventQueueBlockPool``, vLLM's coordinators) is
unchanged, and still counted as not pure. The junit record says what was
lent (``kvcoord_stand_ins``) or why a named stand-in was not
(``kvcoord_stand_ins_refused``).
"""

from __future__ import annotations

import functools
import importlib
from collections import Counter
from collections.abc import Generator
from typing import Any

import pytest

import kvcoord.vllm as _kv
from kvcoord.vllm.serve import _construct
from kvcoord.vllm.testing import _lending

_kv.enable()

_vllm_pools = [0]
_passes = {"pure": 0, "vllm": 0}


def _count_vllm_pools() -> None:
    pool_cls: Any = importlib.import_module("vllm.v1.core.block_pool").BlockPool
    original = pool_cls.__init__

    @functools.wraps(original)  # the rule reads vLLM's own __init__ through it
    def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _vllm_pools[0] += 1
        original(self, *args, **kwargs)

    pool_cls.__init__ = counted_init
    # vLLM's single-type managers decide on their own over any pool, so
    # building one makes a test not pure either.
    managers: Any = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    base = managers.SingleTypeKVCacheManager
    base_init = base.__init__

    @functools.wraps(base_init)
    def counted_manager_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _vllm_pools[0] += 1
        base_init(self, *args, **kwargs)

    base.__init__ = counted_manager_init


_count_vllm_pools()


def _fixture_functions(item: Any) -> list[Any]:
    """The functions of the fixtures ``item`` requests, and of those they
    request, recursively (autouse fixtures the test does not name can hand
    it nothing)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    out, todo, seen = [], list(getattr(info, "argnames", ())), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for fixturedef in info.name2fixturedefs.get(name, ()):
            out.append(fixturedef.func)
            todo.extend(getattr(fixturedef, "argnames", ()))
    return out


def scan_item(item: Any) -> _lending.Scan:
    """What ``item``'s code does (:func:`kvcoord.vllm.testing._lending.scan`): its
    function, its class, the fixtures it requests and its parameters."""
    obj = getattr(item, "obj", None)
    roots = [getattr(obj, "__func__", obj), getattr(item, "cls", None), *_fixture_functions(item)]
    callspec = getattr(item, "callspec", None)
    values = list(callspec.params.values()) if callspec is not None else []
    names = getattr(item, "fixturenames", ())
    return _lending.scan([r for r in roots if r is not None], values, item.config.rootpath, names)


def _rebindings(item: Any) -> tuple[Any, dict[str, Any], str, str]:
    """The test module of ``item``, kvcoord's class for each name to rebind
    there during the test (:func:`kvcoord.vllm.testing._lending.decide`), why none
    is when one might have been, and the vLLM manager state the test writes
    (:func:`kvcoord.vllm.testing._lending.writes_manager_state`)."""
    module = getattr(item, "module", None)
    if module is None or getattr(item, "obj", None) is None:
        return module, {}, "", ""
    found = scan_item(item)
    lent, why = _lending.decide(module, found)
    return module, lent, why, _lending.writes_manager_state(found)


def _mark() -> int:
    return _vllm_pools[0] + sum(_kv.fallbacks.values())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Generator[None, None, None]:
    item._kvcoord_mark = _mark()
    item._kvcoord_pools = _vllm_pools[0]
    item._kvcoord_fallbacks = _kv.fallbacks.copy()
    module, ours, why, written = _rebindings(item)
    refusal = f"the test writes vLLM's manager state ({written})" if written else None
    if ours:
        item.user_properties.append(("kvcoord_stand_ins", ",".join(sorted(ours))))
    elif why:
        item.user_properties.append(("kvcoord_stand_ins_refused", why))
    originals = {attr: module.__dict__[attr] for attr in ours}
    for attr, cls in ours.items():
        setattr(module, attr, cls)  # for this test only
    try:
        with _construct.refusing(refusal):
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
