"""Which vLLM 0.33.0 manager configurations kvcoord serves, and their
translation into a :class:`kvcoord.KVCacheConfig`.

:func:`unsupported_reason` returns ``None`` for a configuration kvcoord serves
with vLLM's exact decisions, otherwise a one-line reason; the manager then
hands the configuration to vLLM's own ``KVCacheManager`` (see
:mod:`kvcoord.vllm.serve.manager`). Every check here is a construction-time
decision: nothing falls back mid-run.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

from kvcoord.config import (
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheSpec,
)
from kvcoord.vllm.serve import _hisparse_support, _mamba, _windows
from kvcoord.vllm.serve._hisparse_support import hisparse_reason, role_reason
from kvcoord.vllm.serve._versions import installed
from kvcoord.vllm.serve._versions import unsupported_reason as version_reason

__all__ = [
    "check_retention",
    "cross_attention_group_ids",
    "eagle_groups",
    "kv_block_size",
    "to_kvcoord_config",
    "unsupported_reason",
]


def eagle_groups(kv_cache_config: Any, use_eagle: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """vLLM's EAGLE groups (those flagged ``is_eagle_group``, else every
    group when ``use_eagle``) and those whose hits drop EAGLE's block (the
    EAGLE groups; since vLLM 0.33 only when ``use_eagle``)."""
    groups = kv_cache_config.kv_cache_groups
    flagged = tuple(i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False))
    if use_eagle and not flagged:
        flagged = tuple(range(len(groups)))
    if installed().eagle_drop_needs_use_eagle and not use_eagle:
        return flagged, ()
    return flagged, flagged


def kv_block_size(spec: Any, dcp_world_size: int) -> int:
    """Tokens per block of a group as vLLM's managers see it: decode context
    parallelism shards a block's token positions over the ranks of a
    ``dcp_sharded`` spec, so such a block spans ``dcp_world_size`` times the
    spec's block size."""
    sharded = bool(getattr(spec, "dcp_sharded", False))
    return int(spec.block_size) * (dcp_world_size if sharded else 1)


def _context_parallel_reason(groups: list[Any], args: Mapping[str, Any]) -> str | None:
    """Why decode/prefill context parallelism is not served here, or None.
    Served over full-attention and MLA groups only (the block sizes scaled,
    nothing else changes): vLLM's window managers assert on it, and beside
    an align-mode Mamba group it turns on sub-block hits (a Mamba block
    equal to the hash unit is enough then). Also served only with
    the scheduler block size vLLM is given equal to the LCM of the scaled
    block sizes (the core derives it). KV-cache events are served as vLLM
    emits them: stored blocks at the scaled block size, prefix-hit reports
    at the spec's (see ``_events.EventLog.cached_hits``)."""
    dcp = int(args.get("dcp_world_size", 1))
    pcp = int(args.get("pcp_world_size", 1))
    if dcp == 1 and pcp == 1:
        return None
    what = f"context parallelism (dcp_world_size={dcp}, pcp_world_size={pcp})"
    if dcp < 1 or pcp < 1:
        return f"{what}: world sizes below 1"
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    plain = (interface.FullAttentionSpec, interface.MLAAttentionSpec)
    served = {c.__name__ for c in plain}
    if pcp == 1 and all(
        type(g.kv_cache_spec) is not interface.MambaSpec
        or g.kv_cache_spec.mamba_cache_mode == "align"
        for g in groups
    ):
        # Align-mode Mamba groups (never sharded) beside DCP: sub-block hits
        # on the scaled attention blocks (CoordinatorConfig::context_parallel).
        served.add("MambaSpec")
    others = sorted({type(g.kv_cache_spec).__name__ for g in groups} - served)
    if others:
        return f"{what} beside {', '.join(others)} groups"
    sizes = [kv_block_size(g.kv_cache_spec, dcp) for g in groups]
    if int(args["scheduler_block_size"]) != math.lcm(*sizes):
        return f"{what} with scheduler_block_size other than the LCM of the block sizes {sizes}"
    return None


def _spec_reason(spec: Any) -> str | None:
    """Why a vLLM spec is not served, or None. Served: plain full attention
    (``FullAttentionSpec``, and MLA without DeepSeek-V4 fields), whose block
    management does not depend on the attention variant, sliding window and
    chunked local (see :mod:`kvcoord.vllm.serve._windows`), Mamba, and
    cross-attention (one allocation sized by the encoder tokens, never
    cached)."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    VFull, MLAAttentionSpec = interface.FullAttentionSpec, interface.MLAAttentionSpec
    kind = type(spec).__name__
    if type(spec) is VFull:
        pass
    elif _windows.is_window_spec(spec):
        reason = _windows.spec_reason(spec)
        if reason is not None:
            return reason
    elif _mamba.is_mamba_spec(spec):
        return None  # checked with the configuration (_mamba.config_reason)
    elif type(spec) is interface.CrossAttentionSpec:
        return None  # never cached; caching is checked with the configuration
    elif _hisparse_support.device_spec(spec) is not None:
        return None  # only reached for the device part of a served shape
    elif type(spec) is MLAAttentionSpec:
        if spec.model_version is not None or spec.alignment is not None:
            return f"{kind} with DeepSeek-V4 fields"
    else:
        return f"KV cache spec {kind} (not served yet)"
    if not spec.prefix_cacheable:
        return f"{kind} that is not prefix-cacheable"
    return None


def unsupported_reason(
    kv_cache_config: Any, args: Mapping[str, Any], *, hisparse_device: bool = False
) -> str | None:
    """None when kvcoord serves this manager configuration exactly; otherwise
    the reason it does not (one line). ``hisparse_device``: the configuration
    is the device part of a HiSparse one (its resident and hot specs served)."""
    reason = version_reason()
    if reason is not None:
        return reason
    if args.get("watermark", 0.0) < 0:
        return "negative watermark"
    groups = list(kv_cache_config.kv_cache_groups)
    if not groups:
        return "a KV cache config without groups"
    reason = None if hisparse_device else hisparse_reason(kv_cache_config)
    if reason is not None and installed().pops_null_blocks:
        # 0.32's HiSparse managers hand back popped rows with their null
        # blocks, which kvcoord's HiSparse pools do not keep.
        return (
            f"{reason.split(':')[0]} on vLLM {installed().version} (its managers hand back "
            "popped rows with their null blocks; not reproduced)"
        )
    if reason is not None:
        if not _hisparse_support.enabled():
            return reason
        shape = _hisparse_support.shape_reason(kv_cache_config, args)
        if shape is not None:
            return f"{reason.split(':')[0]}: {shape}"
        # The source group lives on a core of its own (plain full
        # attention); the device groups must be served as they are.
        return unsupported_reason(
            _hisparse_support.device_config(kv_cache_config), args, hisparse_device=True
        )
    for group in groups:
        reason = _spec_reason(group.kv_cache_spec) or role_reason(group)
        if reason is not None:
            return reason
    caching = args.get("enable_caching", True)
    if caching and any(_is_cross_attention(g.kv_cache_spec) for g in groups):
        # vLLM's CrossAttentionManager refuses lookups and caching outright
        # (vLLM turns prefix caching off for encoder-decoder models).
        return "cross-attention (CrossAttentionSpec) with prefix caching on"
    reason = _context_parallel_reason(groups, args)
    if reason is not None:
        return reason
    specs = [g.kv_cache_spec for g in groups]
    use_eagle = bool(args.get("use_eagle", False))
    _, dropping = eagle_groups(kv_cache_config, use_eagle)
    if dropping and not use_eagle and any(_mamba.is_mamba_spec(s) for s in specs):
        # vLLM 0.32: groups flagged is_eagle_group drop their block without
        # use_eagle, while Mamba checkpoints stay off EAGLE's replay boundary
        # (set only under use_eagle); the core moves both together.
        return "EAGLE groups flagged without use_eagle beside Mamba groups (vLLM 0.32)"
    # Equal specs are looked up together: they share the EAGLE drop.
    eagle_specs = [s for s in specs if any(s == specs[i] for i in dropping)]
    caching_on = bool(args.get("enable_caching", True))
    reason = _windows.config_reason(specs, eagle_specs, caching_on)
    if reason is not None:
        return reason
    reason = _mamba.config_reason(specs, args)
    if reason is not None:
        return reason
    hash_block_size = args["hash_block_size"]
    dcp = int(args.get("dcp_world_size", 1))
    block_sizes = {kv_block_size(g.kv_cache_spec, dcp) for g in groups}
    if args.get("enable_caching", True) and any(b % hash_block_size for b in block_sizes):
        return f"hash_block_size={hash_block_size} not dividing the block sizes {block_sizes}"
    if caching and len(groups) == 1 and {hash_block_size} != block_sizes:
        return "sub-block (partial) prefix hits: hash_block_size below the block size"
    if (
        args.get("enable_caching", True)
        and len(groups) > 1
        and hash_block_size not in block_sizes
        and not _mamba.sub_block_served(specs, args)
    ):
        return "sub-block (partial) prefix hits: hash_block_size below every block size"
    return None


def _is_cross_attention(spec: Any) -> bool:
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    return type(spec) is interface.CrossAttentionSpec


def cross_attention_group_ids(kv_cache_config: Any) -> tuple[int, ...]:
    """Ids of the cross-attention groups of a vLLM ``KVCacheConfig``."""
    return tuple(
        i
        for i, g in enumerate(kv_cache_config.kv_cache_groups)
        if _is_cross_attention(g.kv_cache_spec)
    )


def _spec(spec: Any, dcp_world_size: int) -> KVCacheSpec:
    """The kvcoord spec of a served vLLM spec (context parallelism is
    served beside full attention only)."""
    if _is_cross_attention(spec):
        return CrossAttentionSpec(block_size=int(spec.block_size))
    if _windows.is_window_spec(spec):
        return _windows.window_spec(spec)
    if _mamba.is_mamba_spec(spec):
        return _mamba.mamba_spec(spec)
    hisparse = _hisparse_support.device_spec(spec)
    if hisparse is not None:
        return hisparse
    return FullAttentionSpec(block_size=kv_block_size(spec, dcp_world_size))


def check_retention(kv_cache_config: Any, scheduler_block_size: int) -> None:
    """Refuse a retention interval as vLLM's coordinator does, with its
    message (ValueError); the core checks the same rules again."""
    interval = getattr(kv_cache_config, "prefix_cache_retention_interval", None)
    if interval is None:
        return
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    sparse = (interface.SlidingWindowSpec, interface.MambaSpec)
    if not any(isinstance(g.kv_cache_spec, sparse) for g in kv_cache_config.kv_cache_groups):
        if interval == 0:
            return
        raise ValueError(
            "prefix_cache_retention_interval is set but this model has no sliding-window "
            "or Mamba KV cache group, so retention has no effect"
        )
    if interval < 0 or interval % scheduler_block_size:
        raise ValueError(
            f"prefix_cache_retention_interval ({interval}) must be non-negative and a "
            f"multiple of scheduler_block_size ({scheduler_block_size})."
        )


def to_kvcoord_config(kv_cache_config: Any, dcp_world_size: int = 1) -> KVCacheConfig:
    """The kvcoord configuration of a served vLLM ``KVCacheConfig``."""
    return KVCacheConfig(
        num_blocks=int(kv_cache_config.num_blocks),
        groups=tuple(
            KVCacheGroup(
                _spec(g.kv_cache_spec, dcp_world_size),
                tuple(g.layer_names),
            )
            for g in kv_cache_config.kv_cache_groups
        ),
        prefix_cache_retention_interval=getattr(
            kv_cache_config, "prefix_cache_retention_interval", None
        ),
    )
