"""A lockstep differential fuzz at the scheduler level: vLLM's real
``Scheduler`` run twice, A on vLLM's own ``KVCacheManager`` and B built while
``kvcoord.vllm.enable()`` is on (its manager is kvcoord's; a fallback fails
the test), fed the same seeded operations (see ``lockstep.py``): requests
whose prompts share prefixes, ``schedule()``, a synthetic model output
(the same sampled tokens for both), ``update_from_output``, aborts and
stops, ``reset_prefix_cache()`` (plain, and preempting every running
request).

After every operation the two must agree on: per request the scheduled
token count, the new block ids per KV-cache group and the computed tokens
(new and cached requests), resumed, preempted and finished request ids,
the common-prefix blocks, the blocks to zero, what ``update_from_output``
returned (tokens, finish reasons, prefill statistics, the step's scheduler
stats with its prefix-cache stats), every request's status and token
counts, ``finish_requests``' and ``reset_prefix_cache``'s results, and
``make_stats()`` (prefix-cache stats, KV-cache usage, queue lengths). A
difference fails with the config, the seed, the step, a field-by-field diff
and the shortest failing operation list found by delta debugging.

Configurations: small pools (preemption and eviction on most seeds; one
pool of 10 blocks for 8 sequences), block sizes 16 and 32, prefix caching on
and off, chunked prefill (a small token budget), and hybrid sliding-window +
full-attention groups (windows of 8 to 48 tokens; with and without caching
and chunking). Each configuration's run must reach preemptions, requests
hashed by kvcoord's hasher, prefix-cache hits (caching on) and partial
prefills (chunked).

Size: ``KVCOORD_FUZZ_SEEDS`` seeds per configuration (default 40) of
``KVCOORD_FUZZ_OPS`` operations each (default 240), starting at
``KVCOORD_FUZZ_SEED0`` (default 0); the default run takes well under two
minutes per vLLM release on 2 cores. A longer run, e.g.::

    KVCOORD_FUZZ_SEEDS=2000 KVCOORD_FUZZ_SEED0=1000 \\
        python -m pytest tests/kvcoord_vllm/test_lockstep_fuzz.py

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler", reason="needs vLLM (pip install kvcoord[vllm])")

import lockstep as ls

import kvcoord.vllm as kv

SEEDS = int(os.environ.get("KVCOORD_FUZZ_SEEDS", "40"))
SEED0 = int(os.environ.get("KVCOORD_FUZZ_SEED0", "0"))
N_OPS = int(os.environ.get("KVCOORD_FUZZ_OPS", "240"))

CONFIGS = [
    ls.Config("bs16-cache", block_size=16, num_blocks=20),
    ls.Config("bs32-cache", block_size=32, num_blocks=12, max_prompt_blocks=4),
    ls.Config("bs16-nocache", block_size=16, num_blocks=20, enable_caching=False),
    ls.Config(
        "bs32-nocache", block_size=32, num_blocks=12, enable_caching=False, max_prompt_blocks=4
    ),
    ls.Config("bs16-tight", block_size=16, num_blocks=10, max_num_seqs=8, max_prompt_blocks=4),
    ls.Config("bs16-chunked", block_size=16, num_blocks=24, max_num_batched_tokens=40),
    ls.Config(
        "bs32-chunked-nocache",
        block_size=32,
        num_blocks=14,
        max_num_batched_tokens=48,
        enable_caching=False,
        max_prompt_blocks=4,
    ),
    ls.Config("bs16-hybrid-swa32", block_size=16, num_blocks=40, sliding_window=32),
    ls.Config(
        "bs32-hybrid-swa48-chunked",
        block_size=32,
        num_blocks=24,
        sliding_window=48,
        max_num_batched_tokens=64,
        max_prompt_blocks=4,
    ),
    ls.Config(
        "bs32-hybrid-swa8", block_size=32, num_blocks=20, sliding_window=8, max_prompt_blocks=4
    ),
    ls.Config(
        "bs16-hybrid-swa24-nocache",
        block_size=16,
        num_blocks=40,
        sliding_window=24,
        enable_caching=False,
    ),
    ls.Config("bs16-metrics", block_size=16, num_blocks=20, kv_cache_metrics=True),
    ls.Config(
        "bs16-metrics-nocache",
        block_size=16,
        num_blocks=20,
        enable_caching=False,
        kv_cache_metrics=True,
    ),
]


@pytest.fixture(autouse=True)
def _kvcoord_off() -> Any:
    """Each run enables kvcoord only while scheduler B is built."""
    kv.disable()
    yield
    kv.disable()


def _fuzz(cfg: ls.Config, seeds: range) -> tuple[Counter[str], list[str]]:
    coverage: Counter[str] = Counter()
    failures = []
    for seed in seeds:
        ops = ls.generate_ops(cfg, seed, N_OPS)
        found = ls.run(cfg, ops, coverage=coverage)
        if found is not None:
            minimal, div = ls.shrink(cfg, ops)
            failures.append(ls.report(cfg, seed, ops, found, minimal, div))
    return coverage, failures


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_lockstep_matches_vllm(cfg: ls.Config) -> None:
    seeds = range(SEED0, SEED0 + SEEDS)
    coverage: Counter[str] = Counter()
    failures: list[str] = []
    for seed in seeds:
        cov, fails = _fuzz(cfg, range(seed, seed + 1))
        coverage.update(cov)
        failures.extend(fails)
        if len(failures) >= 3:
            break
    assert not failures, "\n\n".join(failures)
    # The fuzz must actually reach what it is for.
    assert coverage["steps"] > 0 and coverage["scheduled_tokens"] > 0
    assert coverage["preemptions"] > 0, coverage
    assert coverage["kvcoord_hashed"] > 0, coverage
    if cfg.enable_caching:
        assert coverage["hit_tokens"] > 0, coverage
    if cfg.kv_cache_metrics and cfg.enable_caching:
        assert coverage["lives_ended"] > 0 and coverage["lives_with_reuse_gaps"] > 0, coverage
    if cfg.max_num_batched_tokens < cfg.max_prompt_blocks * cfg.block_size:
        assert coverage["partial_prefills"] > 0, coverage


class _WrongFirstBlock:
    """An ``allocate_slots`` result whose first new block id is another one."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_block_ids(self, *args: Any, **kwargs: Any) -> Any:
        ids = self._inner.get_block_ids(*args, **kwargs)
        if ids is None:
            return ids
        ids = tuple(list(g) for g in ids)
        ids[0][0] += 1000
        return ids


def _inject_wrong_block(sched: Any) -> None:
    """Wrap B's ``allocate_slots``: every result with a new block gets its
    first new block id changed. (For a request admitted from the waiting
    queue vLLM's scheduler reads the blocks back with ``get_blocks``, not
    from this result: the first result it uses is a running request's.)"""
    manager = sched.kv_cache_manager
    real = manager.allocate_slots

    def allocate_slots(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if result is None:
            return result
        ids = result.get_block_ids(allow_none=True)
        if ids is None or not ids[0]:
            return result
        return _WrongFirstBlock(result)

    manager.allocate_slots = allocate_slots


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[7]], ids=str)
def test_negative_control_wrong_block_id_is_caught(cfg: ls.Config) -> None:
    """A deliberately wrong block id in kvcoord's result must fail the fuzz,
    at a scheduled step, on a block-id field, and shrink to a short list."""
    ops = ls.generate_ops(cfg, 0, N_OPS)
    assert ls.run(cfg, ops) is None
    found = ls.run(cfg, ops, inject=_inject_wrong_block)
    assert found is not None, "the fuzz missed a wrong block id"
    assert found.op[0] == "step" and "block_ids" in found.first_field, str(found)
    minimal, div = ls.shrink(cfg, ops, inject=_inject_wrong_block)
    assert ls.run(cfg, minimal, inject=_inject_wrong_block) is not None
    assert len(minimal) < len(ops[: found.step + 1]) or len(minimal) <= 4, minimal
    assert "block_ids" in div.first_field, str(div)
    message = ls.report(cfg, 0, ops, found, minimal, div)
    assert "seed 0" in message and f"step {found.step}" in message and f"step {div.step}" in message


class _NeverHitLivesDropped:
    """B's sampled lives without those never hit (a block that was only
    allocated and reallocated): the rule of "a life ends when its cache
    entry does", which is not vLLM's."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def drain_life_samples(self) -> list[tuple[int, int, list[int]]]:
        return [s for s in self._core.drain_life_samples() if s[1] < s[0]]


def _inject_lost_lives(sched: Any) -> None:
    feed = sched.kv_cache_manager._residency
    feed._pool = _NeverHitLivesDropped(feed._pool)


def test_negative_control_a_lost_residency_sample_is_caught() -> None:
    """Residency samples lost on kvcoord's side must fail the fuzz on the
    eviction events of the scheduler stats."""
    cfg = next(c for c in CONFIGS if c.kv_cache_metrics and c.enable_caching)
    ops = ls.generate_ops(cfg, 0, N_OPS)
    assert ls.run(cfg, ops) is None
    found = ls.run(cfg, ops, inject=_inject_lost_lives)
    assert found is not None, "the fuzz missed lost residency samples"
    assert "kv_cache_evictions" in found.first_field, str(found)
