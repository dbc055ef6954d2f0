"""Encoder-decoder models (a ``CrossAttentionSpec`` group beside the decoder's
groups) on kvcoord.vllm.KVCacheManager beside vLLM 0.33.0's own manager:
random schedules with chunked prefills, encoder inputs of random lengths
(none for text-only requests), decode steps, preemption and frees; every
allocation, prediction, block table, free queue and cross-attention table
must be vLLM's.

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.single_type_kv_cache_manager import CrossAttentionManager
from vllm.v1.kv_cache_interface import CrossAttentionSpec, SlidingWindowSpec
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


def cross_spec(block_size: int = BS) -> CrossAttentionSpec:
    return CrossAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )


def window_spec() -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=2 * BS
    )


LAYOUTS = {
    "full+cross": lambda: [full_spec(), cross_spec()],
    "cross8+full": lambda: [cross_spec(2 * BS), full_spec()],
    "full+window+cross": lambda: [full_spec(), window_spec(), cross_spec()],
}


def managers(specs: list[Any], num_blocks: int, **kw: Any) -> tuple[Any, Any]:
    cfg = config(num_blocks, specs)
    args = manager_args(
        **{
            "max_model_len": 256,
            "scheduler_block_size": max(s.block_size for s in specs),
            "hash_block_size": BS,
            "enable_caching": False,
            **kw,
        }
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    return theirs, ours


def cross_tables(m: Any, req: Request) -> list[int]:
    """Blocks of each cross-attention group's table of ``req`` (found the way
    vLLM's tests find the group)."""
    return [
        len(s.req_to_blocks.get(req.request_id, []))
        for s in m.coordinator.single_type_managers
        if isinstance(s, CrossAttentionManager)
    ]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_random_encoder_decoder_schedule_matches_vllm(seed: int, layout: str) -> None:
    rng = random.Random(seed)
    specs = LAYOUTS[layout]()
    theirs, ours = managers(specs, 40, watermark=rng.choice([0.0, 0.05]))
    cross = [i for i, s in enumerate(specs) if isinstance(s, CrossAttentionSpec)]
    assert cross_tables(ours, make_request("none", [1])) == [0] * len(cross)
    encoder: dict[str, int] = {}
    waiting: list[Request] = []
    running: list[Request] = []
    for step in range(90):
        if rng.random() < 0.5:
            rid = f"r{step}"
            waiting.append(
                make_request(rid, [rng.randrange(50) for _ in range(rng.randrange(1, 20))])
            )
            encoder[rid] = rng.choice([0, rng.randrange(1, 40)])
        for req in list(running):  # decode, or the next prefill chunk
            left = req.num_tokens - req.num_computed_tokens
            if left == 0:
                req.append_output_token_ids(rng.randrange(50))
                left = 1
            chunk = rng.randrange(1, left + 1)
            lookahead = rng.choice([0, 0, 2])
            a = theirs.allocate_slots(req, chunk, num_lookahead_tokens=lookahead)
            b = ours.allocate_slots(req, chunk, num_lookahead_tokens=lookahead)
            assert ids(a) == ids(b)
            if a is None:
                preempt(req, (theirs, ours), running, waiting)
            else:
                req.num_computed_tokens += chunk
        while waiting:
            req = waiting[0]
            enc = encoder[req.request_id]
            chunk = rng.randrange(1, req.num_tokens + 1)
            kwargs = {
                "num_encoder_tokens": enc,
                "full_sequence_must_fit": rng.random() < 0.6,
                "has_scheduled_reqs": bool(running),
                "reserved_blocks": rng.choice([0, 0, 2]),
            }
            empty = tuple([] for _ in specs)
            full = bool(kwargs["full_sequence_must_fit"])
            predicted = [
                m.coordinator.get_num_blocks_to_allocate(
                    req.request_id,
                    chunk,
                    empty,
                    num_encoder_tokens=enc,
                    total_computed_tokens=0,
                    num_local_computed_tokens=0,
                    num_tokens_main_model=chunk,
                    apply_admission_cap=full,
                )
                for m in (theirs, ours)
            ]
            assert predicted[0] == predicted[1]
            a = theirs.allocate_slots(req, chunk, **kwargs)
            b = ours.allocate_slots(req, chunk, **kwargs)
            assert ids(a) == ids(b)
            if a is None:
                break
            waiting.pop(0)
            req.num_computed_tokens = chunk
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
            rid = req.request_id
            assert theirs.get_block_ids(rid) == ours.get_block_ids(rid)
            assert cross_tables(theirs, req) == cross_tables(ours, req)
            n = req.num_computed_tokens
            assert theirs.get_block_ids_for_computed_tokens(
                rid, n
            ) == ours.get_block_ids_for_computed_tokens(rid, n)
            assert theirs.estimate_cached_tokens(req) == ours.estimate_cached_tokens(req)
        ours.check_invariants()
    assert theirs.usage == pytest.approx(ours.usage)


def test_cross_attention_tables_are_sized_by_the_encoder() -> None:
    """vLLM's scheduler passes the encoder tokens on the step that schedules
    the encoder input only: one allocation of ``cdiv(encoder, block)``
    blocks, never grown by decoder steps."""
    theirs, ours = managers([full_spec(), cross_spec()], 64)
    for m in (theirs, ours):
        req = make_request("a", list(range(10)))
        assert m.allocate_slots(req, 10, num_encoder_tokens=4 * BS + 1) is not None
        assert cross_tables(m, req) == [5]
        req.num_computed_tokens = 10
        req.append_output_token_ids(7)
        assert m.allocate_slots(req, 1) is not None
        assert cross_tables(m, req) == [5]
        text = make_request("t", list(range(3)))
        assert m.allocate_slots(text, 3) is not None
        assert cross_tables(m, text) == [0]
    assert theirs.get_block_ids("a") == ours.get_block_ids("a")


def test_cross_attention_with_prefix_caching_falls_back() -> None:
    """vLLM's CrossAttentionManager refuses lookups and caching outright;
    such a configuration stays vLLM's own."""
    before = kv.fallbacks["cross-attention (CrossAttentionSpec) with prefix caching on"]
    m = kv.KVCacheManager(
        config(16, [full_spec(), cross_spec()]),
        max_model_len=64,
        scheduler_block_size=BS,
        hash_block_size=BS,
        enable_caching=True,
    )
    assert type(m) is kv.original_manager_class()
    assert kv.fallbacks["cross-attention (CrossAttentionSpec) with prefix caching on"] == before + 1
