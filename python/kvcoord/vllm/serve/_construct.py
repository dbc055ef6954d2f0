"""Construction of :class:`kvcoord.vllm.KVCacheManager`: the installed vLLM's
constructor arguments bound by name, the serve-or-fall-back decision read
from the scheduler under construction, and the counters of both outcomes."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

from kvcoord.errors import NotServedError
from kvcoord.vllm.serve._connectors import connector_reason
from kvcoord.vllm.serve._versions import installed

__all__ = [
    "bind_args",
    "caller_reason",
    "fall_back",
    "fallbacks",
    "is_checking",
    "is_strict",
    "log_served",
    "original_manager_class",
    "refusing",
    "served",
    "set_checking",
    "set_strict",
    "set_vllm_manager_class",
]

logger = logging.getLogger("kvcoord.vllm")

#: Constructions handed to vLLM's own manager, by reason.
fallbacks: Counter[str] = Counter()
#: Constructions served by kvcoord.
served: Counter[str] = Counter({"managers": 0})

# Why every manager built now must be vLLM's own (set by `refusing`), or None.
_REFUSAL: list[str | None] = [None]
# Strict mode: a configuration kvcoord does not serve raises instead.
_STRICT = [False]
# Checking mode: managers check the core's invariants after every release.
_CHECKING = [False]
# vLLM's own KVCacheManager while the patch has replaced its name, or None.
_VLLM_CLASS: list[type | None] = [None]


def set_strict(strict: bool) -> None:
    """Strict mode on or off for managers built from now on."""
    _STRICT[0] = bool(strict)


def is_strict() -> bool:
    return _STRICT[0]


def set_checking(checking: bool) -> None:
    """Checking mode on or off for managers built from now on: each checks
    its core's invariants after every call that releases blocks (``free``,
    ``pop_blocks_for_free``, ``reset_prefix_cache``) and raises
    :class:`~kvcoord.errors.InvariantError` on the first broken one.
    It costs a walk of the pool per call: for tests and debugging."""
    _CHECKING[0] = bool(checking)


def is_checking() -> bool:
    return _CHECKING[0]


def _log_where_vllm_logs() -> None:
    """Send kvcoord's log lines (from INFO up) to vLLM's handlers once vLLM
    has set them up (it does so when it builds an engine), so that an
    engine's log says whether kvcoord serves it. Records still propagate
    to the root logger as before."""
    ours, theirs = logging.getLogger("kvcoord"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(theirs.level or logging.INFO)


def log_served(kv_cache_config: Any) -> None:
    """The one INFO line of a manager kvcoord serves."""
    _log_where_vllm_logs()
    groups = kv_cache_config.kv_cache_groups
    logger.info(
        "kvcoord.vllm: serving the KV cache of this engine (%d blocks; groups: %s; vLLM %s%s%s)",
        kv_cache_config.num_blocks,
        ", ".join(type(g.kv_cache_spec).__name__ for g in groups),
        installed().version,
        ", strict" if _STRICT[0] else "",
        ", checking invariants" if _CHECKING[0] else "",
    )


def fall_back(reason: str) -> None:
    """Record that a manager is handed to vLLM's own for ``reason``: one
    WARNING line and a count in :data:`fallbacks`; in strict mode a
    :class:`~kvcoord.errors.NotServedError` instead (nothing counted)."""
    if _STRICT[0]:
        raise NotServedError(
            f"kvcoord.vllm (strict mode) does not serve this KV-cache configuration: {reason}"
        )
    fallbacks[reason] += 1
    _log_where_vllm_logs()
    logger.warning(
        "kvcoord.vllm: %s is not served by kvcoord; this KVCacheManager is vLLM's own "
        "(fallback #%d)",
        reason,
        sum(fallbacks.values()),
    )


@contextlib.contextmanager
def refusing(reason: str | None) -> Iterator[None]:
    """Every manager built inside falls back to vLLM's own for ``reason``
    (``None``: no change). The pytest plugin uses it for a test that writes
    vLLM's manager internals by hand, which no drop-in can serve."""
    before = _REFUSAL[0]
    _REFUSAL[0] = reason or before
    try:
        yield
    finally:
        _REFUSAL[0] = before


def bind_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The installed vLLM's constructor arguments by name (its TypeErrors for bad calls)."""
    names = installed().manager_arg_names
    if len(args) > len(names):
        raise TypeError(f"KVCacheManager takes at most {len(names)} arguments")
    bound = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name not in names:
            raise TypeError(f"KVCacheManager got an unexpected keyword argument {name!r}")
        if name in bound:
            raise TypeError(f"KVCacheManager got multiple values for argument {name!r}")
        bound[name] = value
    for name in ("kv_cache_config", "max_model_len", "scheduler_block_size", "hash_block_size"):
        if name not in bound:
            raise TypeError(f"KVCacheManager missing required argument {name!r}")
    return bound


def caller_reason(frame: FrameType | None) -> str | None:
    """Why the vLLM scheduler building this manager needs vLLM's own (a KV
    connector binds to the manager's internals), or None. Read from the
    scheduler under construction, which sets its connector first: the
    object whose method is ``frame`` (the frame calling the constructor), or
    one of the three frames below it."""
    if _REFUSAL[0] is not None:
        return _REFUSAL[0]
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and hasattr(owner, "defer_block_free"):
            connector = getattr(owner, "connector", None)
            groups = getattr(getattr(owner, "kv_cache_config", None), "kv_cache_groups", ())
            if connector is not None:
                reason = connector_reason(connector)
                if reason is not None:
                    return reason
                if any(
                    type(g.kv_cache_spec).__name__ == "MambaSpec"
                    and g.kv_cache_spec.mamba_cache_mode != "align"
                    for g in groups
                ):
                    # External tokens would have to count a mode-"none"
                    # group's scratch blocks; not reproduced yet.
                    return "a KV connector beside Mamba groups in mode 'none' (external tokens)"
            return None
        frame = frame.f_back
    return None


def set_vllm_manager_class(cls: type | None) -> None:
    """Record vLLM's own ``KVCacheManager`` while the patch replaces its name
    (``None``: the name is vLLM's again). Fallbacks build this class."""
    _VLLM_CLASS[0] = cls


def original_manager_class() -> type:
    """vLLM's own ``KVCacheManager`` class (even while patched)."""
    cls = _VLLM_CLASS[0]
    if cls is not None:
        return cls
    module = importlib.import_module("vllm.v1.core.kv_cache_manager")
    original: type = getattr(module, "KVCacheManager")  # noqa: B009
    return original
