"""kvcoord as the KV-cache manager of vLLM 0.33.0's own scheduler.

    import kvcoord.vllm
    kvcoord.vllm.enable()        # process-wide; idempotent

or ``KVCOORD_VLLM=1 vllm serve ...`` (general-plugin entry point), or
``--scheduler-cls kvcoord.vllm.scheduler.Scheduler``, or
``pytest -p kvcoord.vllm.pytest_plugin`` for vLLM's own tests. Needs the
``vllm`` extra (``pip install kvcoord[vllm]``, vLLM 0.33.0). See docs/vllm.md.
"""

from __future__ import annotations

from kvcoord.vllm._patch import disable, enable, is_enabled, original_manager_class
from kvcoord.vllm._pool import BlockPool
from kvcoord.vllm._requests import stats as request_stats
from kvcoord.vllm.manager import KVCacheManager, fallbacks, served

VLLM_VERSION = "0.33.0"

__all__ = [
    "VLLM_VERSION",
    "BlockPool",
    "KVCacheManager",
    "disable",
    "enable",
    "fallbacks",
    "is_enabled",
    "original_manager_class",
    "request_stats",
    "served",
]
