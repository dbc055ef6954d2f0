"""HiSparse configurations of vLLM 0.33.0: which parts are plain to vLLM's
manager (served), which shape the HiSparse manager serves
(:mod:`kvcoord.vllm.hisparse._manager`; ``KVCOORD_VLLM_HISPARSE=0`` turns
it off), and why the rest falls back.

vLLM's HiSparse keeps a model's KV on a host tier and only some pages on the
device: the source group (role ``hisparse_source``) allocates from a private
host pool of ``hisparse_host_num_blocks`` blocks, publishes its hashes only
once the host copies are durable, and resident / hot groups
(``HiSparseResidentSpec`` / ``HiSparseHotSpec``) track device pages that stay
readable after their reference is released until the pool reuses them. All
of it is driven by vLLM's ``HiSparseCoordinator``, which finds these groups by
the classes of vLLM's single-type managers; vLLM's tests and its HiSparse
connector reach it through ``get_hisparse_coordinator(manager)``. The
semantics, and how kvcoord holds them, are in ``docs/hisparse.md``.

Two HiSparse fields are plain to vLLM's ``KVCacheManager``, which never reads
them: a group's ``host_resident`` flag (it only places the group's tensors on
the host when the worker allocates them) and ``hisparse_host_num_blocks``
(read by ``HiSparseCoordinator`` alone, and by the scheduler for its own
decisions). A configuration whose only HiSparse elements are these is served
as the configuration it is without them.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Mapping
from typing import Any

from kvcoord.config import HiSparseHotSpec, HiSparseResidentSpec, KVCacheSpec

__all__ = [
    "SWITCH",
    "device_config",
    "device_spec",
    "enabled",
    "hisparse_reason",
    "is_hisparse",
    "role_reason",
    "shape_reason",
]

#: The environment variable that turns serving HiSparse off (``0``); on by
#: default since every vLLM HiSparse test kvcoord can be given passes on it
#: (docs/hisparse.md).
SWITCH = "KVCOORD_VLLM_HISPARSE"


def is_hisparse(kv_cache_config: Any) -> bool:
    """Whether a configuration has HiSparse groups (a source group or a
    resident or hot spec; see :func:`hisparse_reason`): the HiSparse
    manager serves it, when it is served at all."""
    return hisparse_reason(kv_cache_config) is not None


def enabled() -> bool:
    """Whether HiSparse configurations are served (unless
    ``KVCOORD_VLLM_HISPARSE=0``)."""
    return os.environ.get(SWITCH, "1") != "0"


def _role(group: Any) -> str:
    return str(getattr(getattr(group, "role", None), "value", "default"))


def shape_reason(kv_cache_config: Any, args: Mapping[str, Any]) -> str | None:
    """Why a HiSparse configuration is not the shape kvcoord serves, or None.
    Served: group 0 is the source (role ``hisparse_source``, full attention),
    every other group is a device group (full attention, a resident or a hot
    spec), the host pool is sized, and the constructor asks for nothing the
    two-core composition does not hold yet (EAGLE, context parallelism,
    zeroing)."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    groups = list(kv_cache_config.kv_cache_groups)
    if getattr(kv_cache_config, "hisparse_host_num_blocks", None) is None:
        return "no hisparse_host_num_blocks"
    if _role(groups[0]) != "hisparse_source":
        return "the source group is not group 0"
    if type(groups[0].kv_cache_spec) is not interface.FullAttentionSpec:
        return "a source group that is not plain full attention"
    for g in groups[1:]:
        if _role(g) == "hisparse_source":
            return "several source groups"
        if g.host_resident:
            return "a host-resident device group"
    if args.get("use_eagle", False):
        return "EAGLE"
    if int(args.get("dcp_world_size", 1)) != 1 or int(args.get("pcp_world_size", 1)) != 1:
        return "context parallelism"
    if getattr(kv_cache_config, "needs_kv_cache_zeroing", False):
        return "KV-cache zeroing"
    return None


def device_config(kv_cache_config: Any) -> Any:
    """vLLM's configuration of the device groups alone (groups 1.., roles
    dropped, no host pool): what kvcoord's device core holds."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    default = interface.KVCacheGroupRole.DEFAULT
    groups = [
        dataclasses.replace(g, role=default, host_resident=False)
        for g in kv_cache_config.kv_cache_groups[1:]
    ]
    return dataclasses.replace(
        kv_cache_config, kv_cache_groups=groups, hisparse_host_num_blocks=None
    )


def device_spec(spec: Any) -> KVCacheSpec | None:
    """kvcoord's spec of a vLLM HiSparse resident or hot spec (None for others)."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    if type(spec) is getattr(interface, "HiSparseResidentSpec", None):
        return HiSparseResidentSpec(block_size=int(spec.block_size))
    if type(spec) is getattr(interface, "HiSparseHotSpec", None):
        return HiSparseHotSpec(
            block_size=int(spec.block_size), blocks_per_request=int(spec.blocks_per_request)
        )
    return None


_MISSING = (
    "not served with KVCOORD_VLLM_HISPARSE=0 (which turns kvcoord's two-core "
    "HiSparse manager off, docs/hisparse.md)"
)


def hisparse_reason(kv_cache_config: Any) -> str | None:
    """Why a configuration with HiSparse groups is not served (None when it
    has none). The first such group is named: a source group (role
    ``hisparse_source``) or a HiSparse resident or hot spec. An indexer group
    (role ``hisparse_indexer``), a ``host_resident`` flag and
    ``hisparse_host_num_blocks`` alone are plain to vLLM's manager and are not
    among them."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    hisparse_specs = tuple(
        getattr(interface, name)
        for name in ("HiSparseResidentSpec", "HiSparseHotSpec")
        if hasattr(interface, name)
    )
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        role = str(getattr(getattr(group, "role", None), "value", "default"))
        if hisparse_specs and isinstance(spec, hisparse_specs):
            return f"HiSparse KV cache (a {type(spec).__name__} group): {_MISSING}"
        if role == "hisparse_source":
            return f"HiSparse KV cache (a group with role hisparse_source): {_MISSING}"
    return None


def role_reason(group: Any) -> str | None:
    """Why a group whose role selects a manager class of its own in vLLM's
    registry (over the one of its spec) is not served, or None."""
    role = getattr(group, "role", None)
    if role is None or str(getattr(role, "value", role)) == "default":
        return None
    registry: Any = importlib.import_module("vllm.v1.kv_cache_spec_registry")
    reg = registry.KVCacheSpecRegistry
    spec = group.kv_cache_spec
    by_role = reg.get_manager_class(spec, role)
    if by_role is reg.get_manager_class(spec, None):
        return None
    name = getattr(by_role, "__name__", repr(by_role))
    return f"KV cache group role {role.value} (vLLM manages it with {name})"
