"""Which vLLM 0.33.0 manager configurations kvcoord serves, and their
translation into a :class:`kvcoord.KVCacheConfig`.

:func:`unsupported_reason` returns ``None`` for a configuration kvcoord serves
with vLLM's exact decisions, otherwise a one-line reason; the manager then
hands the configuration to vLLM's own ``KVCacheManager`` (see
:mod:`kvcoord.vllm.manager`). Every check here is a construction-time
decision: nothing falls back mid-run.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from kvcoord.config import FullAttentionSpec, KVCacheConfig, KVCacheGroup

__all__ = ["to_kvcoord_config", "unsupported_reason"]

# Constructor arguments whose non-default values kvcoord does not serve yet,
# with the reason given in the fallback log line.
_UNSERVED_ARGS: tuple[tuple[str, object, str], ...] = (
    ("dcp_world_size", 1, "decode context parallelism (dcp_world_size > 1)"),
    ("pcp_world_size", 1, "prefill context parallelism (pcp_world_size > 1)"),
    ("metrics_collector", None, "KV-cache residency metrics (metrics_collector)"),
    ("enable_kv_cache_events", False, "KV-cache events (enable_kv_cache_events=True)"),
    (
        "enable_mamba_shared_prefix_checkpoint",
        False,
        "Mamba shared-prefix checkpoints",
    ),
)


def _spec_reason(spec: Any) -> str | None:
    """Why a vLLM spec is not served, or None. Served: plain full attention
    (``FullAttentionSpec``, and MLA without DeepSeek-V4 fields), whose block
    management does not depend on the attention variant."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    VFull, MLAAttentionSpec = interface.FullAttentionSpec, interface.MLAAttentionSpec
    kind = type(spec).__name__
    if type(spec) is VFull:
        pass
    elif type(spec) is MLAAttentionSpec:
        if spec.model_version is not None or spec.alignment is not None:
            return f"{kind} with DeepSeek-V4 fields"
    else:
        return f"KV cache spec {kind} (only full attention is served yet)"
    if not spec.prefix_cacheable:
        return f"{kind} that is not prefix-cacheable"
    return None


def unsupported_reason(kv_cache_config: Any, args: Mapping[str, Any]) -> str | None:
    """None when kvcoord serves this manager configuration exactly; otherwise
    the reason it does not (one line)."""
    for name, default, why in _UNSERVED_ARGS:
        if args.get(name, default) != default:
            return why
    if args.get("watermark", 0.0) < 0:
        return "negative watermark"
    groups = list(kv_cache_config.kv_cache_groups)
    if not groups:
        return "a KV cache config without groups"
    for group in groups:
        reason = _spec_reason(group.kv_cache_spec)
        if reason is not None:
            return reason
    for field, what in (
        ("cache_hit_alignment_tokens", "cache-hit alignment"),
        ("hisparse_host_num_blocks", "HiSparse host pools"),
    ):
        if getattr(kv_cache_config, field, None) is not None:
            return f"{what} ({field} is set)"
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        return "KV-cache zeroing of new blocks (needs_kv_cache_zeroing)"
    if args.get("num_prefill_lookahead", 0) > 0 and len(groups) > 1:
        # Served with one group: vLLM's hybrid coordinator aligns the
        # re-prefillable tail to its scheduler block and EAGLE block.
        return "num_prefill_lookahead > 0 over several KV cache groups"
    specs = [g.kv_cache_spec for g in groups]
    if args.get("use_eagle", False) and any(s != specs[0] for s in specs[1:]):
        return "EAGLE's last-block drop over groups of different specs (use_eagle=True)"
    hash_block_size = args["hash_block_size"]
    block_sizes = {g.kv_cache_spec.block_size for g in groups}
    if args.get("enable_caching", True) and any(b % hash_block_size for b in block_sizes):
        return f"hash_block_size={hash_block_size} not dividing the block sizes {block_sizes}"
    caching = args.get("enable_caching", True)
    if caching and len(groups) == 1 and hash_block_size != groups[0].kv_cache_spec.block_size:
        return "sub-block (partial) prefix hits: hash_block_size below the block size"
    if args.get("enable_caching", True) and len(groups) > 1 and hash_block_size not in block_sizes:
        return "sub-block (partial) prefix hits: hash_block_size below every block size"
    return None


def to_kvcoord_config(kv_cache_config: Any) -> KVCacheConfig:
    """The kvcoord configuration of a served vLLM ``KVCacheConfig``."""
    return KVCacheConfig(
        num_blocks=int(kv_cache_config.num_blocks),
        groups=tuple(
            KVCacheGroup(
                FullAttentionSpec(block_size=int(g.kv_cache_spec.block_size)),
                tuple(g.layer_names),
            )
            for g in kv_cache_config.kv_cache_groups
        ),
        prefix_cache_retention_interval=getattr(
            kv_cache_config, "prefix_cache_retention_interval", None
        ),
    )
