"""``kvcoord.vllm`` where vLLM is not installed (the default install): a
clear error from ``enable()``, and a status that says why."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here"
)


def test_enable_says_vllm_is_needed() -> None:
    import kvcoord.vllm as kv

    with pytest.raises(ModuleNotFoundError, match=r"pip install 'kvcoord\[vllm\]'") as raised:
        kv.enable()
    assert raised.value.name == "vllm"
    assert not kv.is_enabled()


def test_status_without_vllm() -> None:
    import kvcoord.vllm as kv

    status = kv.status()
    assert status["enabled"] is False and status["vllm_version"] is None
    assert "needs vLLM" in status["unsupported_version"]
