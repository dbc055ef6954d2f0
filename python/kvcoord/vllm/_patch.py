"""Switching kvcoord on inside vLLM: a process-wide, idempotent patch of the
``KVCacheManager`` name that vLLM's scheduler (and code importing it later)
resolves, and of ``get_request_block_hasher`` (kvcoord hashes requests; see
:mod:`kvcoord.vllm._hasher`).

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

__all__ = ["disable", "enable", "is_enabled", "original_manager_class", "register"]

# Modules whose global ``KVCacheManager`` is replaced.
_TARGETS = ("vllm.v1.core.kv_cache_manager", "vllm.v1.core.sched.scheduler")
_original: dict[str, Any] = {}
_original_hasher: dict[str, Any] = {}
_HASHER = "get_request_block_hasher"
_enabled = False


def original_manager_class() -> type:
    """vLLM's own ``KVCacheManager`` class (even while patched)."""
    if "vllm.v1.core.kv_cache_manager" in _original:
        cls: type = _original["vllm.v1.core.kv_cache_manager"]
        return cls
    module = importlib.import_module("vllm.v1.core.kv_cache_manager")
    original: type = getattr(module, "KVCacheManager")  # noqa: B009
    return original


def enable() -> None:
    """Make every ``KVCacheManager`` vLLM builds from now on kvcoord's
    (configurations kvcoord does not serve still get vLLM's own, with a log
    line). Idempotent; affects the whole process."""
    global _enabled
    if _enabled:
        return
    from kvcoord.vllm._hasher import make_block_hasher
    from kvcoord.vllm.manager import KVCacheManager

    for name in _TARGETS:
        module = importlib.import_module(name)
        _original[name] = getattr(module, "KVCacheManager")  # noqa: B009
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
    """Restore vLLM's own ``KVCacheManager`` (managers already built stay as they are)."""
    global _enabled
    if not _enabled:
        return
    for name, cls in _original.items():
        setattr(importlib.import_module(name), "KVCacheManager", cls)  # noqa: B010
    for name, fn in _original_hasher.items():
        setattr(importlib.import_module(name), _HASHER, fn)
    _original.clear()
    _original_hasher.clear()
    _enabled = False


def is_enabled() -> bool:
    return _enabled


def register() -> None:
    """vLLM general-plugin entry point: enables kvcoord when ``KVCOORD_VLLM=1``."""
    if os.environ.get("KVCOORD_VLLM", "") not in ("", "0"):
        enable()
