"""vLLM 0.33.0's ``MambaSpec`` groups as kvcoord specs, the Mamba
configurations kvcoord does not serve yet, and the Mamba parts of the
manager's per-step hand-offs.

The rules (the state kept per request, the prefill checkpoint, which states
are cached and when a hit on one may be used, sparse retention) are the
core's Mamba managers; this module only translates.

Served: ``mamba_cache_mode="align"`` with the hash unit equal to the Mamba
block size (every hit and every cached state on a block boundary), with or
without prefill checkpoint blocks and speculative (MTP) scratch blocks, hash
lookahead beside other groups, multi-module MTP's ``num_prefill_lookahead``;
sub-block hits (a hash unit below the Mamba block size, see
:func:`sub_block_served`); ``mamba_cache_mode="none"`` with prefix caching
off; EAGLE (``use_eagle``) without prefill checkpoint blocks.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from math import lcm
from typing import Any

from kvcoord.config import MambaSpec

__all__ = [
    "boundary_offloads",
    "config_reason",
    "connector_full_attention_group",
    "connector_hit",
    "is_mamba_spec",
    "mamba_group_ids",
    "mamba_spec",
    "spec_reason",
    "sub_block_served",
]


def _interface() -> Any:
    return importlib.import_module("vllm.v1.kv_cache_interface")


def is_mamba_spec(spec: Any) -> bool:
    """Whether ``spec`` is exactly vLLM's ``MambaSpec``."""
    return type(spec) is _interface().MambaSpec


def spec_reason(spec: Any, caching: bool) -> str | None:
    """Why a vLLM ``MambaSpec`` group is not served, or None."""
    mode = spec.mamba_cache_mode
    if mode not in ("none", "align"):
        return f"MambaSpec with mamba_cache_mode={mode!r}"
    if mode == "none" and caching:
        # vLLM refuses it too (Mamba prefix caching needs align mode).
        return "MambaSpec in mode 'none' with prefix caching on"
    return None


def config_reason(specs: Sequence[Any], args: Mapping[str, Any]) -> str | None:
    """Why a configuration with Mamba groups is not served, or None."""
    mambas = [s for s in specs if is_mamba_spec(s)]
    if not mambas:
        return None
    caching = bool(args.get("enable_caching", True))
    for spec in mambas:
        reason = spec_reason(spec, caching)
        if reason is not None:
            return reason
    if not caching:
        return None
    hash_block_size = int(args["hash_block_size"])
    if any(s.block_size != hash_block_size for s in mambas) and not sub_block_served(specs, args):
        return (
            "Mamba prefix caching with hash_block_size below the Mamba block size "
            "(sub-block partial state hits and their copy-on-write)"
        )
    if args.get("use_eagle", False) and any(
        int(m.num_prefill_checkpoint_blocks) > 0 for m in mambas
    ):
        return (
            "EAGLE beside Mamba prefill checkpoint blocks (the checkpoint at EAGLE's "
            "replay boundary differs from vLLM's in random schedules)"
        )
    if args.get("num_hash_lookahead_tokens", 0) and len(specs) == 1:
        # vLLM's lone-group lookup scans blocks past the request's hashes
        # (a prompt's last block has none under lookahead) and raises.
        return "hash lookahead beside a lone Mamba group (vLLM's own lookup raises there)"
    if args.get("enable_mamba_shared_prefix_checkpoint", False) and (
        args.get("use_eagle", False)
        or any(getattr(g, "is_eagle_group", False) for g in args["kv_cache_config"].kv_cache_groups)
    ):
        return "enable_mamba_shared_prefix_checkpoint beside EAGLE groups"
    # Block sizes as vLLM's managers see them (DCP scales sharded specs).
    dcp = int(args.get("dcp_world_size", 1))
    sizes = [int(s.block_size) * (dcp if getattr(s, "dcp_sharded", False) else 1) for s in specs]
    if int(args["scheduler_block_size"]) != lcm(*sizes):
        # Mamba hits and checkpoints align to the scheduler block, which
        # kvcoord's core derives from the block sizes.
        return (
            f"scheduler_block_size={args['scheduler_block_size']} other than the LCM of "
            f"the block sizes beside Mamba groups"
        )
    return None


def sub_block_served(specs: Sequence[Any], args: Mapping[str, Any]) -> bool:
    """Whether sub-block (partial) Mamba state hits are served here (some
    Mamba block above the hash unit): beside plain full-attention groups,
    Mamba groups without speculative blocks, dense retention and no
    KV-cache events. The core then aligns hits to the hash unit, caches
    unrounded, keys the prompt's last hash boundary inside the running
    state's block (and a full-attention prompt tail inside its block),
    re-keys a prefill checkpoint block at the hash-unit boundary it exports,
    and copies a state or block hit inside it into a private one
    (``take_kv_cache_block_copies``), as vLLM does."""
    mambas = [s for s in specs if is_mamba_spec(s)]
    hash_block_size = int(args["hash_block_size"])
    full = _interface().FullAttentionSpec
    cfg = args.get("kv_cache_config")
    return (
        any(int(m.block_size) > hash_block_size for m in mambas)
        and all(
            is_mamba_spec(s) or (type(s) is full and int(s.block_size) % hash_block_size == 0)
            for s in specs
        )
        and len(specs) > 1
        and all(int(m.num_speculative_blocks) == 0 for m in mambas)
        and getattr(cfg, "prefix_cache_retention_interval", None) is None
        and not args.get("enable_kv_cache_events", False)
        and int(args.get("dcp_world_size", 1)) == 1
    )


def mamba_spec(spec: Any) -> MambaSpec:
    """The kvcoord spec of a served vLLM ``MambaSpec``."""
    alignment = spec.prefill_checkpoint_alignment
    return MambaSpec(
        block_size=int(spec.block_size),
        num_speculative_blocks=int(spec.num_speculative_blocks),
        mamba_cache_mode=spec.mamba_cache_mode,
        num_prefill_checkpoint_blocks=int(spec.num_prefill_checkpoint_blocks),
        prefill_checkpoint_alignment=None if alignment is None else int(alignment),
    )


def mamba_group_ids(kv_cache_config: Any) -> tuple[int, ...]:
    """Ids of the Mamba groups of a vLLM ``KVCacheConfig``."""
    return tuple(
        i for i, g in enumerate(kv_cache_config.kv_cache_groups) if is_mamba_spec(g.kv_cache_spec)
    )


def connector_full_attention_group(kv_cache_config: Any, caching: bool) -> int | None:
    """The group whose hit vLLM's ``get_computed_blocks_for_connector``
    reports when it looks each group up on its own (Mamba groups beside
    full attention under the hybrid coordinator: its
    ``full_attention_group_id``, the first full-attention group); None when
    it answers with ``get_computed_blocks``."""
    groups = kv_cache_config.kv_cache_groups
    full = _interface().FullAttentionSpec
    if not (caching and len(groups) > 1 and mamba_group_ids(kv_cache_config)):
        return None
    return next((i for i, g in enumerate(groups) if isinstance(g.kv_cache_spec, full)), None)


def connector_hit(hits: Sequence[int], full_group: int) -> tuple[int, bool] | None:
    """vLLM's reading of per-group hits for a connector: the full-attention
    hit and whether some group lags behind it (the connector must then
    supply that group's state), or None when some group hit deeper than
    full attention (its attention blocks were evicted: the reconciled hit
    is used instead)."""
    local = hits[full_group]
    if any(h > local for h in hits):
        return None
    return local, min(hits) < local


def boundary_offloads(core: Any) -> dict[str, list[tuple[int, int, int]]]:
    """vLLM's ``take_boundary_state_offloads``: the states the core committed
    since the last call, as ``{request_id: [(group, block_id, tokens), ...]}``."""
    offloads: dict[str, list[tuple[int, int, int]]] = {}
    for request_id, group, block, tokens in core.take_boundary_state_offloads():
        offloads.setdefault(request_id, []).append((group, block, tokens))
    for entries in offloads.values():
        # vLLM drains group by group (stable: cache order within a group).
        entries.sort(key=lambda e: e[0])
    return offloads
