"""HiSparse configurations of vLLM 0.33.0: which parts are plain to vLLM's
manager (served), and why the rest is not served yet.

vLLM's HiSparse keeps a model's KV on a host tier and only some pages on the
device: the source group (role ``hisparse_source``) allocates from a private
host pool of ``hisparse_host_num_blocks`` blocks, publishes its hashes only
once the host copies are durable, and resident / hot groups
(``HiSparseResidentSpec`` / ``HiSparseHotSpec``) track device pages that stay
readable after their reference is released until the pool reuses them. All
of it is driven by vLLM's ``HiSparseCoordinator``, which finds these groups by
the classes of vLLM's single-type managers; vLLM's tests and its HiSparse
connector reach it through ``get_hisparse_coordinator(manager)``. The
semantics, and how kvcoord will hold them, are in ``docs/hisparse.md``.

Two HiSparse fields are plain to vLLM's ``KVCacheManager``, which never reads
them: a group's ``host_resident`` flag (it only places the group's tensors on
the host when the worker allocates them) and ``hisparse_host_num_blocks``
(read by ``HiSparseCoordinator`` alone, and by the scheduler for its own
decisions). A configuration whose only HiSparse elements are these is served
as the configuration it is without them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["hisparse_reason", "role_reason"]

_MISSING = (
    "vLLM drives these groups with its HiSparseCoordinator, which finds them by "
    "vLLM's manager classes; kvcoord's core has the resident and hot kinds but "
    "not the host tier of the source group, and nothing lets that coordinator "
    "run over kvcoord's managers yet (docs/hisparse.md)"
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
