"""``--scheduler-cls kvcoord.vllm.scheduler.Scheduler``: vLLM 0.33.0's own
scheduler, built with kvcoord as its KV-cache manager."""

from __future__ import annotations

import importlib
from typing import Any

from kvcoord.vllm.serve._patch import enable

_VllmScheduler: Any = importlib.import_module("vllm.v1.core.sched.scheduler").Scheduler

__all__ = ["Scheduler"]


class Scheduler(_VllmScheduler):  # type: ignore[misc]
    """vLLM's ``Scheduler`` with :func:`kvcoord.vllm.enable` applied first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        enable()
        super().__init__(*args, **kwargs)
