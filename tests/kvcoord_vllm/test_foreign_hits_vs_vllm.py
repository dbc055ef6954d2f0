"""Hits that are not the request's own prefix, handed to kvcoord.vllm beside
vLLM 0.33.0's own manager: vLLM adopts whatever blocks ``allocate_slots``
gets as ``new_computed_blocks`` (a free block leaves the free queue, every
block gains a reference), and its tests and connectors rely on that (e.g.
``test_cache_hit_local_and_external*``, which take blocks from the head of
the free queue). kvcoord.vllm builds its core with ``verify_hits=False`` to
do the same; kvcoord's own manager keeps refusing such hits
(tests/test_bad_input.py).

Random schedules mix ordinary admissions (vLLM's lookup) with admissions
whose hits are arbitrary blocks (free uncached, free cached under another
prefix, in use by a running request, one block twice), with and without
external connector tokens; every allocation, block table and the free queue
must be equal.
Skipped without vLLM."""

from __future__ import annotations

import random

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import SlidingWindowSpec
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


LAYOUTS = {
    "full": lambda: [full_spec()],
    # A window of three blocks: hits before it are dropped (nulls).
    "full+swa": lambda: [full_spec(), swa_spec(12)],
    # vLLM's test_cache_hit_local_and_external_three_groups shape (one full
    # group, two equal wide windows).
    "full+swa+swa": lambda: [full_spec(), swa_spec(400), swa_spec(400)],
}

NUM_BLOCKS = 40


def pair(layout: str, use_eagle: bool) -> tuple[object, object]:
    cfg = config(NUM_BLOCKS, LAYOUTS[layout]())
    args = manager_args(
        max_model_len=512, scheduler_block_size=BS, hash_block_size=BS, use_eagle=use_eagle
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    return theirs, ours


def foreign_hits(
    rng: random.Random, theirs: object, num_groups: int, num_blocks: int, skipped: list[int]
) -> list[list[int | None]]:
    """Per group ``num_blocks`` block ids (None: the null block, only where
    group ``g`` skips ``skipped[g]`` leading blocks): the head of the free
    queue (as vLLM's test does) or any blocks of the pool, now and then one
    of them twice."""
    wanted = num_groups * num_blocks
    if rng.random() < 0.5:
        picked = free_queue(theirs)[:wanted]
    else:
        picked = rng.sample(range(1, NUM_BLOCKS), min(wanted, NUM_BLOCKS - 1))
    if len(picked) < wanted:
        return []
    out: list[list[int | None]] = []
    for g in range(num_groups):
        group: list[int | None] = list(picked[g * num_blocks : (g + 1) * num_blocks])
        for i in range(min(skipped[g], num_blocks)):
            if rng.random() < 0.5:
                group[i] = None
        out.append(group)
    if rng.random() < 0.2:
        # One block twice (in one group or in two): vLLM pins it twice.
        g, h = rng.randrange(num_groups), rng.randrange(num_groups)
        i, j = rng.randrange(num_blocks), rng.randrange(num_blocks)
        if (g, i) != (h, j) and out[g][i] is not None and out[h][j] is not None:
            out[h][j] = out[g][i]
    return out


def as_blocks(manager: object, hits: list[list[int | None]]) -> KVCacheBlocks:
    pool = manager.block_pool  # type: ignore[attr-defined]
    return KVCacheBlocks(
        tuple([pool.null_block if b is None else pool.blocks[b] for b in g] for g in hits)
    )


def kind(theirs: object, block: int | None) -> str:
    """What a hit block holds on vLLM's side."""
    if block is None:
        return "null"
    b = theirs.block_pool.blocks[block]  # type: ignore[attr-defined]
    if b.ref_cnt:
        return "in use"
    return "free cached" if b.block_hash is not None else "free"


def skipped_blocks(layout: str, total: int) -> list[int]:
    """Leading blocks each group's window skips after ``total`` computed tokens."""
    out = []
    for spec in LAYOUTS[layout]():
        window = getattr(spec, "sliding_window", None)
        out.append(0 if window is None else max(0, total - window + 1) // BS)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("use_eagle", [False, True])
def test_foreign_hits_match_vllm(seed: int, layout: str, use_eagle: bool) -> None:
    rng = random.Random(seed)
    theirs, ours = pair(layout, use_eagle)
    num_groups = len(LAYOUTS[layout]())
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 24))] for _ in range(3)]
    waiting: list[Request] = []
    running: list[Request] = []
    kinds: set[str] = set()
    for step in range(80):
        if rng.random() < 0.6:
            tokens = rng.choice(prefixes) + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 16))
            ]
            waiting.append(make_request(f"r{step}", tokens))
        for req in list(running):
            req.append_output_token_ids(rng.randrange(1000))
            a = theirs.allocate_slots(req, 1)
            b = ours.allocate_slots(req, 1)
            assert ids(a) == ids(b)
            if a is None:
                preempt(req, (theirs, ours), running, waiting)
            else:
                req.num_computed_tokens = req.num_tokens
        while waiting:
            req = waiting[0]
            full_blocks = (req.num_tokens - 1) // BS
            if full_blocks and rng.random() < 0.5:
                # Hits that are not this request's prefix, maybe followed by
                # external tokens.
                k = rng.randrange(1, full_blocks + 1)
                external = BS * rng.randrange(0, full_blocks - k + 1)
                local = k * BS
                hits = foreign_hits(rng, theirs, num_groups, k, skipped_blocks(layout, local))
                if not hits:
                    break
                ha, hb = as_blocks(theirs, hits), as_blocks(ours, hits)
                na = nb = local
                kinds.update(kind(theirs, b) for g in hits for b in g)
                flat = [b for g in hits for b in g if b is not None]
                if len(set(flat)) < len(flat):
                    kinds.add("twice")
            else:
                external = 0
                (ha, na, _), (hb, nb, _) = (
                    theirs.get_computed_blocks(req),
                    ours.get_computed_blocks(req),
                )
                assert (na, ids(ha)) == (nb, ids(hb))
            kwargs = {
                "num_new_computed_tokens": na,
                "num_external_computed_tokens": external,
                "full_sequence_must_fit": rng.random() < 0.5,
                "has_scheduled_reqs": bool(running),
            }
            new = req.num_tokens - na - external
            a = theirs.allocate_slots(req, new, new_computed_blocks=ha, **kwargs)
            b = ours.allocate_slots(req, new, new_computed_blocks=hb, **kwargs)
            assert ids(a) == ids(b)
            if a is None:
                break
            assert theirs.get_block_ids(req.request_id) == ours.get_block_ids(req.request_id)
            waiting.pop(0)
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
            running.append(req)
        for req in list(running):
            if rng.random() < 0.1:
                running.remove(req)
                for m in (theirs, ours):
                    m.free(req)
        assert theirs.block_pool.get_num_free_blocks() == ours.block_pool.get_num_free_blocks()
        assert free_queue(theirs) == free_queue(ours)
        for req in running:
            assert theirs.get_block_ids(req.request_id) == ours.get_block_ids(req.request_id)
        ours.check_invariants()
    assert {"free", "free cached", "in use", "twice"} <= kinds
