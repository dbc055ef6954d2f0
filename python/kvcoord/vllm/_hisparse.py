"""HiSparse configurations of vLLM 0.33.0 and why kvcoord does not serve them yet.

vLLM's HiSparse keeps a model's KV on a host tier and only some pages on the
device: the source group (role ``hisparse_source``) allocates from a private
host pool of ``hisparse_host_num_blocks`` blocks, publishes its hashes only
once the host copies are durable, and resident / hot groups
(``HiSparseResidentSpec`` / ``HiSparseHotSpec``) track device pages that stay
readable after their reference is released until the pool reuses them
(``BlockPool.unpin_blocks`` with reuse callbacks). vLLM's ``HiSparseCoordinator``
finds these groups by the classes of vLLM's single-type managers.

kvcoord's core has one pool per manager, no released-but-readable blocks and
no HiSparse kinds yet, so every configuration with any HiSparse element falls
back, with a reason naming the element found. This module is where serving
them will live.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["hisparse_reason", "role_reason"]

_MISSING = "kvcoord has no host pool, unpinned resident pages or HiSparse kinds yet"


def hisparse_reason(kv_cache_config: Any) -> str | None:
    """Why a configuration with HiSparse elements is not served (None when it
    has none). Elements, in the order reported: a host pool size, a
    HiSparse resident or hot spec, a source group (role ``hisparse_source``),
    a host-resident group. An indexer group (role ``hisparse_indexer``) alone
    is plain full attention to vLLM's manager and is not one of them."""
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    hisparse_specs = tuple(
        getattr(interface, name)
        for name in ("HiSparseResidentSpec", "HiSparseHotSpec")
        if hasattr(interface, name)
    )
    found: str | None = None
    if getattr(kv_cache_config, "hisparse_host_num_blocks", None) is not None:
        found = "hisparse_host_num_blocks is set"
    for group in kv_cache_config.kv_cache_groups:
        if found is not None:
            break
        spec = group.kv_cache_spec
        role = str(getattr(getattr(group, "role", None), "value", "default"))
        if hisparse_specs and isinstance(spec, hisparse_specs):
            found = f"a {type(spec).__name__} group"
        elif role == "hisparse_source":
            found = "a group with role hisparse_source"
        elif getattr(group, "host_resident", False):
            found = "a host-resident group"
    if found is None:
        return None
    return f"HiSparse KV cache ({found}): {_MISSING}"


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
