"""Strict mode, checking mode, the fallback record and
``kvcoord.vllm.status()``, and the release check, against the installed vLLM."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_manager", reason="needs vLLM (kvcoord[vllm])")

from vllm_helpers import BS, UNSERVED_REASON, config, full_spec, unserved_manager

import kvcoord.vllm as kv
from kvcoord.errors import InvariantError, NotServedError
from kvcoord.vllm.serve import _construct, _versions

UNSERVED = UNSERVED_REASON


def _build(**kw: object) -> object:
    args: dict[str, object] = dict(max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    return kv.KVCacheManager(config(16, [full_spec()]), **{**args, **kw})


def _unserved() -> object:
    return unserved_manager()


@pytest.fixture
def restore_strict():
    before = _construct.is_strict(), _construct.is_checking()
    yield
    _construct.set_strict(before[0])
    _construct.set_checking(before[1])


def test_strict_mode_refuses_with_the_reason_and_counts_nothing(restore_strict) -> None:
    kv.enable(strict=True)
    before = dict(kv.fallbacks)
    with pytest.raises(NotServedError, match="sub-block"):
        _unserved()
    assert dict(kv.fallbacks) == before
    assert kv.status()["strict"] is True
    # What kvcoord serves is served in strict mode as before.
    served = kv.served["managers"]
    assert isinstance(_build(), kv.KVCacheManager)
    assert kv.served["managers"] == served + 1


def test_fallback_is_one_warning_a_count_and_a_status_entry(restore_strict, caplog) -> None:
    kv.enable(strict=False)
    before = kv.fallbacks[UNSERVED]
    with caplog.at_level(logging.WARNING, logger="kvcoord.vllm"):
        manager = _unserved()
    assert type(manager) is kv.original_manager_class()
    assert kv.fallbacks[UNSERVED] == before + 1
    lines = [r for r in caplog.records if "is not served by kvcoord" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    status = kv.status()
    assert status["strict"] is False and status["fallbacks"][UNSERVED] == before + 1
    assert status["vllm_version"] == _versions.installed().version


def test_strict_follows_the_environment_when_not_given(restore_strict, monkeypatch) -> None:
    monkeypatch.setenv("KVCOORD_VLLM_STRICT", "1")
    kv.enable()
    assert _construct.is_strict()
    monkeypatch.setenv("KVCOORD_VLLM_STRICT", "0")
    kv.enable()
    assert not _construct.is_strict()


def test_an_unserved_release_falls_back_with_its_reason(restore_strict, monkeypatch) -> None:
    real = _versions.installed()
    fake = _versions.VllmApi(**{**real.__dict__, "version": "0.99.0"})
    monkeypatch.setattr(_versions, "installed", lambda: fake)
    assert _versions.unsupported_reason() == "vLLM 0.99.0 (kvcoord.vllm serves 0.32.x, 0.33.x)"
    kv.enable(strict=True)
    with pytest.raises(NotServedError, match=r"vLLM 0\.99\.0"):
        _build()
    monkeypatch.setattr(_versions, "installed", lambda: real)
    assert _versions.unsupported_reason() is None


def test_disable_turns_strict_mode_off(restore_strict) -> None:
    kv.enable(strict=True)
    kv.disable()
    assert not kv.status()["strict"]
    # A manager built directly afterwards falls back instead of raising.
    assert type(_unserved()) is kv.original_manager_class()


class _BrokenCore:
    """The manager's core, whose invariant check fails once armed."""

    def __init__(self, core: object) -> None:
        self._inner, self.armed, self.checks = core, False, 0

    def check_invariants(self) -> None:
        self.checks += 1
        if self.armed:
            raise InvariantError("free queue: block 3 listed twice")

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class _Request:
    request_id = "r0"


@pytest.mark.parametrize("call", ["free", "pop_blocks_for_free", "reset_prefix_cache"])
def test_checking_mode_checks_invariants_after_every_release(restore_strict, call) -> None:
    kv.enable(check=True)
    assert kv.status()["checking"] is True
    manager = _build()
    core = manager._core = _BrokenCore(manager._core)
    args = () if call == "reset_prefix_cache" else (_Request(),)
    getattr(manager, call)(*args)
    assert core.checks == 1
    core.armed = True
    with pytest.raises(InvariantError, match="listed twice"):
        getattr(manager, call)(*args)


def test_checking_mode_is_off_by_default_and_after_disable(restore_strict, monkeypatch) -> None:
    monkeypatch.delenv("KVCOORD_VLLM_CHECK", raising=False)
    kv.enable()
    manager = _build()
    core = manager._core = _BrokenCore(manager._core)
    core.armed = True
    manager.free(_Request())  # not checked: nothing raised
    assert core.checks == 0
    monkeypatch.setenv("KVCOORD_VLLM_CHECK", "1")
    kv.enable()
    assert _construct.is_checking()
    kv.disable()
    assert not kv.status()["checking"]
