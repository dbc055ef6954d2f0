"""Switching kvcoord on inside vLLM: a process-wide, idempotent patch of the
``KVCacheManager`` name that vLLM's scheduler (and code importing it later)
resolves, and of ``get_request_block_hasher`` (kvcoord hashes requests; see
:mod:`kvcoord.vllm.serve._hasher`).

vLLM's ``Scheduler`` looks ``KVCacheManager`` up in its module's globals when
it is built, so replacing that name (and the one in
``vllm.v1.core.kv_cache_manager``) is enough; nothing else in vLLM changes.
:func:`disable` restores vLLM's class.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from kvcoord.vllm.serve import _construct, _hasher, _versions
from kvcoord.vllm.serve._construct import set_checking, set_strict, set_vllm_manager_class
from kvcoord.vllm.serve._hasher import make_block_hasher
from kvcoord.vllm.serve.manager import KVCacheManager

__all__ = ["disable", "enable", "is_enabled", "register", "status"]

#: Environment variables: switch kvcoord on in every vLLM process (the
#: plugin), make a fallback an error, check the core's invariants.
ENABLE_ENV = "KVCOORD_VLLM"
STRICT_ENV = "KVCOORD_VLLM_STRICT"
CHECK_ENV = "KVCOORD_VLLM_CHECK"

# Modules whose global ``KVCacheManager`` is replaced.
_TARGETS = ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.sched.scheduler")
_original: dict[str, Any] = {}
_original_hasher: dict[str, Any] = {}
_HASHER = "get_request_block_hasher"
_enabled = False


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def enable(strict: bool | None = None, check: bool | None = None) -> None:
    """Make every ``KVCacheManager`` vLLM builds from now on kvcoord's.
    Idempotent; affects the whole process.

    A configuration kvcoord does not serve gets vLLM's own manager, with one
    WARNING line, a count, and the reason in :func:`status`; with
    ``strict`` (default: ``KVCOORD_VLLM_STRICT=1``) building it raises
    :class:`~kvcoord.errors.NotServedError` naming the reason instead, so an
    engine fails at start rather than run without kvcoord. With ``check``
    (default: ``KVCOORD_VLLM_CHECK=1``) every manager checks its core's
    invariants after each call that releases blocks and raises
    :class:`~kvcoord.errors.InvariantError` at the first broken one (a walk
    of the pool per call: for tests and debugging)."""
    global _enabled
    _versions.installed()  # a clear ModuleNotFoundError without vLLM
    set_strict(_env_flag(STRICT_ENV) if strict is None else bool(strict))
    set_checking(_env_flag(CHECK_ENV) if check is None else bool(check))
    if _enabled:
        return
    for name in _TARGETS:
        module = importlib.import_module(name)
        _original[name] = getattr(module, "KVCacheManager")  # noqa: B009
    set_vllm_manager_class(_original["vllm.v1.core.kv_cache_manager"])
    for name in _TARGETS:
        setattr(importlib.import_module(name), "KVCacheManager", KVCacheManager)  # noqa: B010
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    _original_hasher[utils.__name__] = getattr(utils, _HASHER)
    fast = make_block_hasher(getattr(utils, _HASHER))
    setattr(utils, _HASHER, fast)
    engine = sys.modules.get("vllm.v1.engine.core")
    if engine is None:
        try:
            engine = importlib.import_module("vllm.v1.engine.core")
        except Exception:  # engine not importable here (e.g. a bare CPU test venv)
            engine = None
    if engine is not None:
        _original_hasher[engine.__name__] = getattr(engine, _HASHER)
        setattr(engine, _HASHER, fast)
    _enabled = True


def disable() -> None:
    """Restore vLLM's own ``KVCacheManager`` (managers already built stay as
    they are) and turn strict mode off."""
    global _enabled
    set_strict(False)
    set_checking(False)
    if not _enabled:
        return
    for name, cls in _original.items():
        setattr(importlib.import_module(name), "KVCacheManager", cls)  # noqa: B010
    for name, fn in _original_hasher.items():
        setattr(importlib.import_module(name), _HASHER, fn)
    _original.clear()
    set_vllm_manager_class(None)
    _original_hasher.clear()
    _enabled = False


def is_enabled() -> bool:
    return _enabled


def register() -> None:
    """vLLM general-plugin entry point: enables kvcoord when ``KVCOORD_VLLM=1``
    (strict when ``KVCOORD_VLLM_STRICT=1``, checking invariants when
    ``KVCOORD_VLLM_CHECK=1``)."""
    if _env_flag(ENABLE_ENV):
        enable()


def status() -> dict[str, Any]:
    """What kvcoord did in this process: whether it is switched on,
    strict and checking, the vLLM release, how many KV-cache managers it served and which
    fell back to vLLM's own (by reason), and how many requests each hasher
    hashed. (vLLM's multiprocess engine core builds its manager in its own
    process: this one's counts stay 0 there.)"""
    there = _versions.available()
    return {
        "enabled": _enabled,
        "strict": _construct.is_strict(),
        "checking": _construct.is_checking(),
        "vllm_version": _versions.installed().version if there else None,
        "unsupported_version": _versions.unsupported_reason() if there else _versions.MISSING,
        "served": _construct.served["managers"],
        "fallbacks": dict(_construct.fallbacks),
        "hashing": dict(_hasher.stats),
    }
