"""kvcoord as the KV-cache manager of vLLM's own scheduler (0.32.x, 0.33.0).

    import kvcoord.vllm
    kvcoord.vllm.enable()        # process-wide; idempotent

or ``KVCOORD_VLLM=1 vllm serve ...`` (general-plugin entry point), or
``--scheduler-cls kvcoord.vllm.scheduler.Scheduler``, or
``pytest -p kvcoord.vllm.pytest_plugin`` for vLLM's own tests. Needs the
``vllm`` extra (``pip install kvcoord[vllm]``). ``KVCOORD_VLLM_STRICT=1`` or
``enable(strict=True)`` makes a fallback to vLLM's own manager an error;
:func:`status` reports what was served. See docs/vllm.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Imported for its class statement: the HiSparse manager registers itself
# with KVCacheManager, which picks it for HiSparse configurations (nothing
# in serve/ imports it). Importing any module of kvcoord.vllm runs this first.
from kvcoord.vllm.hisparse import _manager as _hisparse_manager  # noqa: F401
from kvcoord.vllm.serve._construct import original_manager_class
from kvcoord.vllm.serve._patch import disable, enable, is_enabled, status
from kvcoord.vllm.serve._requests import stats as request_stats
from kvcoord.vllm.serve._versions import SUPPORTED as SUPPORTED_VLLM
from kvcoord.vllm.serve.manager import KVCacheManager, fallbacks, served

if TYPE_CHECKING:
    from kvcoord.vllm.testing._pool import BlockPool

__all__ = [
    "SUPPORTED_VLLM",
    "BlockPool",
    "KVCacheManager",
    "disable",
    "enable",
    "fallbacks",
    "is_enabled",
    "original_manager_class",
    "request_stats",
    "served",
    "status",
]


def __getattr__(name: str) -> Any:
    # vLLM's BlockPool stand-in is for tests: an engine, which imports this
    # package, loads nothing of kvcoord.vllm.testing.
    if name == "BlockPool":
        from kvcoord.vllm.testing._pool import BlockPool

        return BlockPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
