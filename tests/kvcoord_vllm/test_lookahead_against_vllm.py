"""Multi-module MTP (``num_prefill_lookahead``) over several KV cache groups
and context parallelism (``dcp_world_size`` / ``pcp_world_size``), served by
kvcoord.vllm beside vLLM 0.33.0's own manager: random schedules with chunked
prefill and speculative decode slots. Every hit, allocation, block table,
the set of cached blocks and the free queue must be equal. Skipped
without vLLM."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowSpec
from vllm.v1.request import Request, RequestStatus
from vllm_helpers import (
    BS,
    config,
    free_queue,
    full_spec,
    ids,
    make_request,
    manager_args,
    preempt,
)

import kvcoord.vllm as kv


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def swa_spec(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=window
    )


def mla_spec(dcp_sharded: bool) -> MLAAttentionSpec:
    return MLAAttentionSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, dcp_sharded=dcp_sharded
    )


#: Layouts served with num_prefill_lookahead over several groups; the ones
#: named "eagle" flag their last group as an EAGLE (draft) group.
LAYOUTS = {
    "full+full": lambda: [full_spec(), full_spec()],
    "full+full-eagle": lambda: [full_spec(), full_spec()],
    "full+full8": lambda: [full_spec(), full_spec(2 * BS)],
    "full+swa": lambda: [full_spec(), swa_spec(12)],
    "full+full+swa": lambda: [full_spec(), full_spec(2 * BS), swa_spec(8)],
}


def pair(cfg: object, **kw: object) -> tuple[object, object]:
    """vLLM's manager and kvcoord's for ``cfg``, with vLLM's scheduler block
    size (the LCM of the block sizes managers see)."""
    dcp = int(kw.get("dcp_world_size", 1))
    sizes = [
        g.kv_cache_spec.block_size * (dcp if g.kv_cache_spec.dcp_sharded else 1)
        for g in cfg.kv_cache_groups
    ]
    args = manager_args(
        **{
            "max_model_len": 512,
            "scheduler_block_size": math.lcm(*sizes),
            "hash_block_size": min(sizes) if len(sizes) > 1 else sizes[0],
            **kw,
        }
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager), kv.fallbacks
    return theirs, ours


def cached_block_ids(manager: object) -> list[int]:
    """The blocks that hold a prefix-cache key, on either engine."""
    return [b.block_id for b in manager.block_pool.blocks if b.block_hash is not None]


def run_schedule(theirs: object, ours: object, rng: random.Random, *, unit: int, spec: int) -> None:
    """A random schedule on both managers: chunked prefill, decode steps of
    up to ``spec + 1`` tokens with ``spec`` lookahead slots, preemption on
    failure, random frees. Requests are hashed in units of ``unit``."""
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(6, 50))] for _ in range(3)]
    waiting: list[Request] = []
    running: list[Request] = []
    for step in range(90):
        if rng.random() < 0.5:
            tokens = rng.choice(prefixes) + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 30))
            ]
            waiting.append(make_request(f"r{step}", tokens, unit))
        for req in list(running):
            if req.num_computed_tokens >= req.num_tokens:  # decode (accepted drafts)
                for _ in range(rng.randint(1, spec + 1)):
                    req.append_output_token_ids(rng.randrange(1000))
            n = min(req.num_tokens - req.num_computed_tokens, rng.choice([3, 5, 8, 13]))
            a = theirs.allocate_slots(req, n, num_lookahead_tokens=spec)
            b = ours.allocate_slots(req, n, num_lookahead_tokens=spec)
            assert ids(a) == ids(b)
            if a is None:
                preempt(req, (theirs, ours), running, waiting)
            else:
                req.num_computed_tokens += n
        while waiting:
            req = waiting[0]
            (ha, na, ja), (hb, nb, jb) = (
                theirs.get_computed_blocks(req),
                ours.get_computed_blocks(req),
            )
            assert (na, ja, ids(ha)) == (nb, jb, ids(hb))
            req.shared_prefix_boundary = ja
            n = min(req.num_tokens - na, rng.choice([5, 11, 16, 100]))
            kwargs = {
                "num_new_computed_tokens": na,
                "num_lookahead_tokens": spec,
                "full_sequence_must_fit": rng.random() < 0.7,
                "has_scheduled_reqs": bool(running),
                "reserved_blocks": rng.choice([0, 0, 2]),
                "delay_cache_blocks": rng.random() < 0.1,
            }
            a = theirs.allocate_slots(req, n, new_computed_blocks=ha, **kwargs)
            b = ours.allocate_slots(req, n, new_computed_blocks=hb, **kwargs)
            assert ids(a) == ids(b)
            if a is None:
                break
            if kwargs["delay_cache_blocks"]:
                for m in (theirs, ours):
                    m.cache_blocks(req, na + n)
            waiting.pop(0)
            req.num_computed_tokens = na + n
            req.status = RequestStatus.RUNNING
            running.append(req)
        for req in list(running):
            if rng.random() < 0.08:
                running.remove(req)
                for m in (theirs, ours):
                    m.free(req)
        assert free_queue(theirs) == free_queue(ours)
        assert cached_block_ids(theirs) == cached_block_ids(ours)
        for req in running:
            assert theirs.get_block_ids(req.request_id) == ours.get_block_ids(req.request_id)
        ours.check_invariants()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("layout", "use_eagle"),
    # EAGLE is served over groups of one spec only.
    [(layout, False) for layout in sorted(LAYOUTS)]
    + [("full+full", True), ("full+full-eagle", True)],
)
@pytest.mark.parametrize("prefill_lookahead", [2, 4])
def test_prefill_lookahead_over_groups_matches_vllm(
    seed: int, layout: str, prefill_lookahead: int, use_eagle: bool
) -> None:
    """vLLM's hybrid coordinator caches the scheduler-block-aligned prefix in
    every group, whatever the re-prefillable tail, except in its EAGLE
    groups: those hold the tail back and cache up to one block past the
    aligned prefix. kvcoord's core decides the same per group."""
    cfg = config(48, LAYOUTS[layout]())
    if "eagle" in layout:
        cfg.kv_cache_groups[-1] = dataclasses.replace(cfg.kv_cache_groups[-1], is_eagle_group=True)
    theirs, ours = pair(cfg, use_eagle=use_eagle, num_prefill_lookahead=prefill_lookahead)
    views = zip(
        theirs.coordinator.single_type_managers, ours.coordinator.single_type_managers, strict=True
    )
    assert ours.coordinator.num_reprefillable_tokens == prefill_lookahead - 1
    for t, o in views:
        assert (t.block_size, t.use_eagle) == (o.block_size, o.use_eagle)
    rng = random.Random(seed)
    run_schedule(theirs, ours, rng, unit=BS, spec=prefill_lookahead - 1)


CONTEXT_PARALLEL = {
    "full-dcp2": (lambda: [full_spec()], {"dcp_world_size": 2}),
    "full-dcp4-mtp": (lambda: [full_spec()], {"dcp_world_size": 4, "num_prefill_lookahead": 3}),
    "full+mla-draft-dcp2": (
        lambda: [full_spec(), mla_spec(dcp_sharded=False)],
        {"dcp_world_size": 2},
    ),
    "full+mla-dcp2-mtp": (
        lambda: [full_spec(), mla_spec(dcp_sharded=True)],
        {"dcp_world_size": 2, "num_prefill_lookahead": 2},
    ),
    "full+full-pcp2": (lambda: [full_spec(), full_spec()], {"pcp_world_size": 2}),
}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", sorted(CONTEXT_PARALLEL))
def test_context_parallel_schedule_matches_vllm(seed: int, layout: str) -> None:
    """DCP shards a block's token positions over the ranks of a
    ``dcp_sharded`` spec: vLLM's managers see blocks ``dcp_world_size``
    times the spec's block size (hits, allocation, hashing); PCP changes no
    block decision. kvcoord serves both by scaling the block sizes."""
    make_specs, kw = CONTEXT_PARALLEL[layout]
    cfg = config(48, make_specs())
    theirs, ours = pair(cfg, **kw)
    views = zip(
        theirs.coordinator.single_type_managers, ours.coordinator.single_type_managers, strict=True
    )
    for t, o in views:
        assert (t.block_size, t.dcp_world_size, t.pcp_world_size) == (
            o.block_size,
            o.dcp_world_size,
            o.pcp_world_size,
        )
    spec = max(0, int(kw.get("num_prefill_lookahead", 0)) - 1)
    unit = ours.hash_block_size
    run_schedule(theirs, ours, random.Random(seed), unit=unit, spec=spec)


@pytest.mark.parametrize(
    ("specs", "kw", "reason"),
    [
        (lambda: [swa_spec(8)], {"dcp_world_size": 2}, "SlidingWindowSpec"),
    ],
)
def test_context_parallel_left_to_vllm(specs: object, kw: dict, reason: str) -> None:
    """Context parallelism beside window groups (vLLM's window lookup
    asserts on it; a hybrid layout with one is refused at construction)
    stays with vLLM's own manager, with its reason. (With KV-cache events it
    is served: test_events_vs_vllm.py.)"""
    before = sum(kv.fallbacks.values())
    cfg = config(16, specs())
    args = manager_args(
        **{"max_model_len": 64, "scheduler_block_size": 2 * BS, "hash_block_size": 2 * BS, **kw}
    )
    if len(cfg.kv_cache_groups) > 1:
        args["hash_block_size"] = BS
    m = kv.KVCacheManager(cfg, **args)
    assert type(m) is kv.original_manager_class()
    assert sum(kv.fallbacks.values()) == before + 1
    assert any(reason in r and "context parallelism" in r for r in kv.fallbacks)
