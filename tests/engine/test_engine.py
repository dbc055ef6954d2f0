"""A real vLLM engine served by kvcoord gives vLLM's own tokens.

Every case runs the same workload twice, on vLLM's own KV-cache manager and
on kvcoord switched on by ``KVCOORD_VLLM=1`` (strict: a fallback would fail
the engine at start), and asserts identical token ids and identical engine
counters. The workload (rounds of shuffled prompts sharing long prefixes,
a 64-block cache) makes the engine evict cached prefixes and preempt
requests, which each case checks from the engine's own counters. A negative
control shows that the comparison catches one wrong block id.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from engine_run import EngineFailed, RunSettings, Workload, run_engine
from tiny_hybrid import HYBRID_ENGINE_ARGS

# (layout, prefix caching, hash, multiprocess engine core)
CASES = [
    ("llama", True, "sha256_cbor", False),
    ("llama", True, "sha256", False),
    ("llama", True, "sha256_cbor", True),
    ("llama", False, "sha256_cbor", False),
    ("llama-swa", True, "sha256_cbor", False),
    ("llama-swa", True, "sha256", True),
    # Gated DeltaNet (a Mamba state group, "align") beside full attention;
    # see tiny_hybrid.py for why not a Mamba2 hybrid.
    ("hybrid", True, "sha256_cbor", False),
    ("hybrid", False, "sha256_cbor", False),
]


def _settings(
    checkpoints: dict[str, str], layout: str, caching: bool, algo: str, mp: bool
) -> RunSettings:
    extra = HYBRID_ENGINE_ARGS if layout == "hybrid" else {}
    return RunSettings(
        model=checkpoints[layout],
        prefix_caching=caching,
        hash_algo=algo,
        multiprocess=mp,
        engine_args=dict(extra),
    )


def _differing(a: list[list[int]], b: list[list[int]]) -> int:
    assert len(a) == len(b)
    return sum(x != y for x, y in zip(a, b, strict=True))


def evicted_hit_tokens(result: dict[str, Any], block_size: int) -> int:
    """Prompt tokens the engine found no longer cached in a later round.

    Every round repeats the first round's prompts, whose full blocks were all
    computed and cached then; without eviction each later round's first
    lookups alone would hit at least ``(len - 1) // block_size`` blocks per
    prompt (re-lookups after a preemption only add hits). The shortfall of
    the engine's own hit counter below that is the evicted part."""
    lens = result["prompt_lens"]
    per_round = len(lens) // len(result["counters"])
    short = 0
    for r in range(1, len(result["counters"])):
        hits = (
            result["counters"][r]["prefix_cache_hits"]
            - result["counters"][r - 1]["prefix_cache_hits"]
        )
        possible = sum(
            (n - 1) // block_size * block_size for n in lens[r * per_round : (r + 1) * per_round]
        )
        short += max(0, int(possible - hits))
    return short


def served_lines(result: dict[str, Any]) -> int:
    """kvcoord's "serving" log lines in an engine's output; asserts there is
    no fallback line."""
    lines = result["log"].splitlines()
    assert not [ln for ln in lines if "is not served by kvcoord" in ln]
    return sum("kvcoord.vllm: serving the KV cache of this engine" in ln for ln in lines)


def _expected_series() -> str | None:
    return os.environ.get("KVCOORD_ENGINE_VLLM")


@pytest.mark.parametrize(("layout", "caching", "algo", "mp"), CASES)
def test_kvcoord_serves_with_vllms_tokens(engine, checkpoints, layout, caching, algo, mp) -> None:
    settings = _settings(checkpoints, layout, caching, algo, mp)
    reference = engine(settings, kvcoord=False)
    served = engine(settings, kvcoord=True)
    if _expected_series():
        assert served["vllm_version"].startswith(_expected_series())

    # kvcoord built the engine's only manager, and the reference run's is
    # vLLM's: kvcoord's log line (from the engine-core process, also when it
    # is a process of its own) and, in process, its status.
    assert served_lines(served) == 1 and served_lines(reference) == 0
    if not mp:
        assert reference["kvcoord"] is None or reference["kvcoord"]["served"] == 0
        status = served["kvcoord"]
        assert status["enabled"] and status["strict"]
        assert status["served"] == 1 and status["fallbacks"] == {}
        if algo == "sha256_cbor" and caching:
            assert status["hashing"].get("kvcoord_requests", 0) > 0  # kvcoord hashed prompts
        # The engine sets cache_hit_alignment_tokens; vLLM's manager derives
        # its own alignment, and so does kvcoord's core: they agree.
        alignment = served["hit_alignment"]
        assert alignment["engine"] is not None
        assert alignment["kvcoord"] == alignment["engine"]

    differing = _differing(reference["outputs"], served["outputs"])
    assert differing == 0, f"{differing} of {len(served['outputs'])} outputs differ"
    if not mp:
        # The same schedule step for step. (A multiprocess engine core starts
        # scheduling while requests still arrive, so its schedule, and with
        # it the preemption count, depends on timing, for vLLM's own manager
        # too; greedy tokens do not.)
        assert served["counters"] == reference["counters"]

    for run in (reference, served):
        counters = run["counters"][-1]
        assert counters["num_preemptions"] > 0
        if caching:
            assert counters["prefix_cache_hits"] > 0
            if layout != "hybrid":  # a state group's hits end on its own boundaries
                assert evicted_hit_tokens(run, settings.block_size) > 0
        else:
            assert counters.get("prefix_cache_hits", 0) == 0


def test_a_wrong_block_id_changes_tokens(engine, checkpoints) -> None:
    """Negative control: kvcoord handing the scheduler one wrong block in
    every hit of two or more blocks changes many outputs, so the token
    comparison above would catch a wrong block."""
    settings = _settings(checkpoints, "llama", True, "sha256_cbor", False)
    reference = engine(settings, kvcoord=False)
    corrupted = engine(dataclasses.replace(settings, corrupt_hits=True), kvcoord=True)
    differing = _differing(reference["outputs"], corrupted["outputs"])
    assert differing >= len(reference["outputs"]) // 4, differing


# What kvcoord does not serve, and an engine asks for: prefix-cache keys
# finer than the blocks (vLLM's prefix_match_unit) beside a sliding-window
# group, where vLLM hashes every 16 tokens and lands hits on 32-token blocks.
UNSERVED = "sub-block (partial) prefix hits: hash_block_size below every block size"


def test_strict_mode_stops_an_engine_kvcoord_does_not_serve(checkpoints) -> None:
    """A configuration kvcoord does not serve fails the engine at start in
    strict mode, naming the reason; without strict mode the engine runs on
    vLLM's own manager and the fallback is counted, logged and reported."""
    settings = RunSettings(
        model=checkpoints["llama-swa"],
        engine_args={"prefix_match_unit": 16},
        workload=Workload(rounds=1),
    )
    with pytest.raises(EngineFailed) as failed:
        run_engine(settings, kvcoord=True, strict=True)
    assert "NotServedError" in failed.value.log
    assert "sub-block (partial) prefix hits" in failed.value.log

    fell_back = run_engine(settings, kvcoord=True, strict=False)
    status = fell_back["kvcoord"]
    assert status["served"] == 0
    assert status["fallbacks"] == {UNSERVED: 1}
    warnings = [ln for ln in fell_back["log"].splitlines() if "is not served by kvcoord" in ln]
    assert len(warnings) == 1, warnings


def test_residency_metrics_are_served_with_vllms_counts(engine, checkpoints) -> None:
    """vLLM's KV-cache residency metrics (every block sampled) on kvcoord:
    served in strict mode, vLLM's tokens, and the engine's own residency
    histograms count the same block lives as on vLLM's manager (the
    counters compared include ``vllm:kv_block_lifetime_seconds``' count)."""
    settings = dataclasses.replace(
        _settings(checkpoints, "llama", True, "sha256_cbor", False),
        engine_args={"kv_cache_metrics": True, "kv_cache_metrics_sample": 1.0},
    )
    reference = engine(settings, kvcoord=False)
    served = engine(settings, kvcoord=True)
    assert served_lines(served) == 1
    assert served["kvcoord"]["fallbacks"] == {}
    assert _differing(reference["outputs"], served["outputs"]) == 0
    assert served["counters"] == reference["counters"]
    assert reference["counters"][-1]["kv_block_lives"] > 0
