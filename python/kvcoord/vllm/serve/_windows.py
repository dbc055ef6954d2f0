"""vLLM 0.33.0's windowed attention specs (``SlidingWindowSpec``,
``SlidingWindowMLASpec``, ``ChunkedLocalAttentionSpec``) as kvcoord specs,
and the configurations of them kvcoord does not serve yet.

Their rules (hit search, released blocks, sparse caching under a retention
interval, the admission cap of the full-sequence check) are the core's
sliding-window and chunked-local managers; this module only translates.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    KVCacheSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

__all__ = ["config_reason", "is_window_spec", "spec_reason", "window_spec"]


def _interface() -> Any:
    return importlib.import_module("vllm.v1.kv_cache_interface")


def is_window_spec(spec: Any) -> bool:
    """Whether ``spec`` is exactly vLLM's sliding-window, sliding-window MLA
    or chunked-local spec (other subclasses are other kinds)."""
    interface = _interface()
    return type(spec) in (
        interface.SlidingWindowSpec,
        interface.SlidingWindowMLASpec,
        interface.ChunkedLocalAttentionSpec,
    )


def spec_reason(spec: Any) -> str | None:
    """Why a windowed vLLM spec is not served, or None. Sliding-window MLA is
    managed by vLLM's sliding-window manager, as a spec type of its own in
    the hybrid hit search; only its DeepSeek-V4 fields change that."""
    interface = _interface()
    kind = type(spec).__name__
    if type(spec) is interface.SlidingWindowMLASpec:
        if spec.model_version is not None or spec.alignment is not None:
            return f"{kind} with DeepSeek-V4 fields"
        if spec.bounded_replay:
            return f"{kind} with bounded_replay (replayed window prefixes)"
    if isinstance(spec, interface.SlidingWindowSpec) and spec.extra_retained_tokens:
        return (
            f"{kind} with extra_retained_tokens > 0 (multi-module MTP's "
            "retained tail below the window)"
        )
    return None


def config_reason(
    specs: Sequence[Any], eagle_specs: Sequence[Any], enable_caching: bool
) -> str | None:
    """Why a configuration with windowed groups is not served, or None.
    ``eagle_specs``: the specs of the groups whose hits drop EAGLE's block."""
    windowed = [s for s in specs if is_window_spec(s)]
    if not windowed:
        return None
    chunked = _interface().ChunkedLocalAttentionSpec
    has_chunked = any(type(s) is chunked for s in windowed)
    if enable_caching and any(type(s) is chunked for s in eagle_specs):
        # vLLM's chunked-local finder asserts that no EAGLE drop is asked.
        return "EAGLE with chunked-local groups and prefix caching (vLLM asserts on the lookup)"
    if has_chunked and len({s.block_size for s in specs}) > 1:
        # vLLM's chunked-local scan requires the hit alignment to be its block size.
        return "chunked-local attention beside groups of other block sizes"
    return None


def window_spec(spec: Any) -> KVCacheSpec:
    """The kvcoord spec of a served windowed vLLM spec."""
    interface = _interface()
    if type(spec) is interface.SlidingWindowMLASpec:
        return SlidingWindowMLASpec(
            block_size=int(spec.block_size), sliding_window=int(spec.sliding_window)
        )
    if type(spec) is interface.SlidingWindowSpec:
        return SlidingWindowSpec(
            block_size=int(spec.block_size), sliding_window=int(spec.sliding_window)
        )
    return ChunkedLocalAttentionSpec(
        block_size=int(spec.block_size), attention_chunk_size=int(spec.attention_chunk_size)
    )
