"""Which KV connectors kvcoord's manager can serve.

A KV connector talks to the KV-cache manager through the scheduler's calls
(``get_computed_blocks_for_connector``, ``allocate_slots`` with external
tokens, ``block_pool.free_blocks`` of delayed frees), which kvcoord serves.
Some connectors also reach into vLLM's manager itself: they override
``bind_kv_cache_manager`` / ``bind_gpu_block_pool`` to keep its pool, or read
the bound manager's ``coordinator`` / ``block_pool`` later. Those bind to
vLLM's internals, so the scheduler that owns one keeps vLLM's own manager.

The decision reads the connector's classes (and a ``MultiConnector``'s
sub-connectors): any class below vLLM's connector base that defines a
``bind_*`` method or whose source names the bound manager or a block pool
makes the configuration fall back. It is conservative: a connector whose
source cannot be read falls back too.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["connector_reason"]

_BINDS = ("bind_kv_cache_manager", "bind_gpu_block_pool")
_INTERNALS = ("_kv_cache_manager", "block_pool", "coordinator")
_SAFE: dict[type, bool] = {}


def _reads_internals(cls: type) -> bool:
    """True when one of ``cls``'s own classes (not vLLM's connector base)
    binds to or reads vLLM's manager internals."""
    cached = _SAFE.get(cls)
    if cached is not None:
        return not cached
    reads = False
    for klass in cls.__mro__:
        if klass.__module__.endswith("kv_connector.v1.base") or klass is object:
            continue
        if any(name in vars(klass) for name in _BINDS):
            reads = True
            break
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            reads = True
            break
        if any(word in source for word in _INTERNALS):
            reads = True
            break
    _SAFE[cls] = not reads
    return reads


def connector_reason(connector: Any) -> str | None:
    """Why the scheduler's KV connector needs vLLM's own manager, or None."""
    subs = getattr(connector, "_connectors", None)
    if type(connector).__name__ == "MultiConnector" and isinstance(subs, list):
        for sub in subs:
            reason = connector_reason(sub)
            if reason is not None:
                return reason
        return None
    if _reads_internals(type(connector)):
        return f"KV connector {type(connector).__name__} (it binds to vLLM's manager internals)"
    return None
