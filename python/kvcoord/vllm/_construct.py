"""Construction of :class:`kvcoord.vllm.KVCacheManager`: vLLM 0.33.0's
constructor arguments bound by name, the serve-or-fall-back decision read
from the scheduler under construction, and the counters of both outcomes."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any

from kvcoord.vllm._connectors import connector_reason

__all__ = [
    "bind_args",
    "caller_reason",
    "fallbacks",
    "refusing",
    "served",
    "vllm_manager_class",
]

#: Constructions handed to vLLM's own manager, by reason.
fallbacks: Counter[str] = Counter()
#: Constructions served by kvcoord.
served: Counter[str] = Counter({"managers": 0})

# Why every manager built now must be vLLM's own (set by `refusing`), or None.
_REFUSAL: list[str | None] = [None]


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


_ARG_NAMES = (
    "kv_cache_config",
    "max_model_len",
    "scheduler_block_size",
    "hash_block_size",
    "max_in_flight_tokens",
    "enable_caching",
    "use_eagle",
    "num_hash_lookahead_tokens",
    "num_prefill_lookahead",
    "log_stats",
    "enable_kv_cache_events",
    "dcp_world_size",
    "pcp_world_size",
    "metrics_collector",
    "watermark",
    "enable_mamba_shared_prefix_checkpoint",
)


def bind_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM 0.33.0's constructor arguments by name (its TypeErrors for bad calls)."""
    if len(args) > len(_ARG_NAMES):
        raise TypeError(f"KVCacheManager takes at most {len(_ARG_NAMES)} arguments")
    bound = dict(zip(_ARG_NAMES, args, strict=False))
    for name, value in kwargs.items():
        if name not in _ARG_NAMES:
            raise TypeError(f"KVCacheManager got an unexpected keyword argument {name!r}")
        if name in bound:
            raise TypeError(f"KVCacheManager got multiple values for argument {name!r}")
        bound[name] = value
    for name in ("kv_cache_config", "max_model_len", "scheduler_block_size", "hash_block_size"):
        if name not in bound:
            raise TypeError(f"KVCacheManager missing required argument {name!r}")
    return bound


def caller_reason() -> str | None:
    """Why the vLLM scheduler building this manager needs vLLM's own (a KV
    connector binds to the manager's internals), or None. Read from the
    scheduler under construction, which sets its connector first."""
    if _REFUSAL[0] is not None:
        return _REFUSAL[0]
    frame: FrameType | None = sys._getframe(2)
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


def vllm_manager_class() -> type:
    from kvcoord.vllm import _patch

    return _patch.original_manager_class()
