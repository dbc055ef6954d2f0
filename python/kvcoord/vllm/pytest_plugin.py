"""pytest plugin: ``pytest -p kvcoord.vllm.pytest_plugin tests/v1/core`` runs
vLLM's own tests with kvcoord as the KV-cache manager.

Loaded with ``-p``, this module is imported before any test module, so
:func:`kvcoord.vllm.enable` has replaced vLLM's ``KVCacheManager`` by the
time test modules import it. At the end of the session it reports how many
managers kvcoord served and how many configurations fell back to vLLM's own.
"""

from __future__ import annotations

from typing import Any

import kvcoord.vllm as _kv

_kv.enable()


def pytest_report_header(config: Any) -> str:
    return "kvcoord.vllm: vLLM's KVCacheManager is kvcoord's (fallbacks are logged)"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    tr = terminalreporter
    tr.write_line(
        f"kvcoord.vllm: {_kv.served['managers']} managers served by kvcoord, "
        f"{sum(_kv.fallbacks.values())} fell back to vLLM's own"
    )
    for reason, count in _kv.fallbacks.most_common():
        tr.write_line(f"  fallback x{count}: {reason}")
