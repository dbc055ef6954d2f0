"""The decode fast path of kvcoord.vllm.KVCacheManager.allocate_slots: a step
that needs no new block and completes no block to cache is answered without
the core. Checked beside vLLM 0.33.0's own manager on random decode schedules
(draft tokens, lookahead slots, delayed caching, explicit cache_blocks, one or
two block sizes, vLLM's and kvcoord's block hasher): every result, block
table, the free queue and the prefix hits a new request would get must be
equal, and the fast path must actually be taken.

Skipped when vLLM is not installed (``make test-vllm`` runs it).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256, sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request, RequestStatus
from vllm_helpers import admit_alike, block_hasher, free_queue, ids, manager_args

import kvcoord.vllm as kv
from kvcoord.vllm.serve._blocks import KVCacheBlocks
from kvcoord.vllm.serve._hasher import make_block_hasher

HBS = 4


class CountingCore:
    """The manager's core with its allocations counted: ``allocate_slots``
    calls and the fused decode steps (``decode_slots`` calls that reached
    the core, not those that left the sync to the registry)."""

    def __init__(self, core: Any) -> None:
        self._inner = core
        self.allocations = 0

    def allocate_slots(self, *args: Any) -> Any:
        self.allocations += 1
        return self._inner.allocate_slots(*args)

    def decode_slots(self, *args: Any) -> Any:
        out = self._inner.decode_slots(*args)
        if out is not NotImplemented:
            self.allocations += 1
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def managers(block_sizes: tuple[int, ...], num_blocks: int) -> tuple[Any, Any, CountingCore]:
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                [f"l{i}"],
                FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
            for i, bs in enumerate(block_sizes)
        ],
    )
    scheduler_block_size = math.lcm(HBS, *block_sizes)
    args = manager_args(
        max_model_len=1024, scheduler_block_size=scheduler_block_size, hash_block_size=HBS
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    counting = CountingCore(ours._core)
    ours._core = counting
    if ours._decode_fixed is not None:  # the fused step, bound at construction
        ours._decode_fixed = (ours._decode_fixed[0], counting.decode_slots)
    ours._init_fast_path(
        ours._decode_room, ours.empty_kv_cache_blocks, ours._decode_fixed, KVCacheBlocks, ours._pool
    )
    return theirs, ours, counting


def hasher_for(kind: str) -> Any:
    if kind == "kvcoord":
        init_none_hash(sha256_cbor)
        ours = make_block_hasher(get_request_block_hasher)
        return block_hasher(HBS, sha256_cbor, original=ours)
    init_none_hash(sha256)
    return block_hasher(HBS, sha256)


def make_request(rid: str, tokens: list[int], hasher: Any) -> Request:
    params = SamplingParams(max_tokens=10_000)
    params.update_from_generation_config({}, eos_token_id=100_000)
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )


def probe_hits(theirs: Any, ours: Any, tokens: list[int], hasher: Any) -> None:
    """A new request with ``tokens`` gets the same hit from both (so both
    cached the same blocks at the same step)."""
    probe = make_request("probe", tokens, hasher)
    (ha, na, _), (hb, nb, _) = theirs.get_computed_blocks(probe), ours.get_computed_blocks(probe)
    assert (na, ids(ha)) == (nb, ids(hb))
    ours.free(probe)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_sizes", [(4,), (8, 4)])
@pytest.mark.parametrize("hasher_kind", ["vllm", "kvcoord"])
def test_decode_schedule_matches_vllm(
    seed: int, block_sizes: tuple[int, ...], hasher_kind: str
) -> None:
    rng = random.Random(seed)
    hasher = hasher_for(hasher_kind)
    theirs, ours, counting = managers(block_sizes, num_blocks=80)
    prefix = [rng.randrange(1, 1000) for _ in range(rng.randrange(3, 14))]
    running: list[Request] = []
    calls = 0
    for step in range(90):
        if len(running) < 4 and rng.random() < 0.3:
            tokens = prefix + [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 9))]
            req = make_request(f"r{step}", tokens, hasher)
            if admit_alike(theirs, ours, req):
                req.num_computed_tokens = req.num_tokens
                req.status = RequestStatus.RUNNING
                req.append_output_token_ids(rng.randrange(1, 1000))  # its first sample
                running.append(req)
        for req in list(running):
            drafts = rng.choice([0, 0, 0, 1, 3])
            lookahead = rng.choice([0, 0, 0, 2])
            delay = rng.random() < 0.05
            a = theirs.allocate_slots(
                req, 1 + drafts, num_lookahead_tokens=lookahead, delay_cache_blocks=delay
            )
            b = ours.allocate_slots(
                req, 1 + drafts, num_lookahead_tokens=lookahead, delay_cache_blocks=delay
            )
            calls += 1
            assert ids(a) == ids(b), (step, req.request_id)
            if a is None:
                for m in (theirs, ours):
                    m.free(req)
                running.remove(req)
                continue
            accepted = rng.randrange(drafts + 1)
            req.num_computed_tokens += 1 + accepted
            req.append_output_token_ids([rng.randrange(1, 1000) for _ in range(1 + accepted)])
            if rng.random() < 0.05:
                for m in (theirs, ours):
                    m.cache_blocks(req, req.num_computed_tokens)
        for req in list(running):
            if rng.random() < 0.03:
                running.remove(req)
                for m in (theirs, ours):
                    m.free(req)
        assert free_queue(theirs) == free_queue(ours)
        for req in running:
            assert theirs.get_block_ids(req.request_id) == ours.get_block_ids(req.request_id)
        for req in running:
            probe_hits(theirs, ours, [*req.all_token_ids, 0], hasher)
        ours.check_invariants()
    # Most decode steps were answered without the core.
    assert calls > 50
    assert counting.allocations < calls


def test_mid_block_decode_step_skips_the_core() -> None:
    hasher = hasher_for("kvcoord")
    theirs, ours, counting = managers((4,), num_blocks=16)
    req = make_request("r", [1, 2, 3, 4, 5], hasher)
    for m in (theirs, ours):
        assert ids(m.allocate_slots(req, 5)) is not None
    req.num_computed_tokens = 5
    req.append_output_token_ids(6)  # 6 tokens, 5 computed: slot 6 is in block 2
    before = counting.allocations
    a, b = theirs.allocate_slots(req, 1), ours.allocate_slots(req, 1)
    assert ids(a) == ids(b) == ([],)
    assert b is ours.empty_kv_cache_blocks
    assert b.get_block_ids(allow_none=True) is None
    assert counting.allocations == before
    req.num_computed_tokens = 6
    req.append_output_token_ids(7)
    req.num_computed_tokens = 7
    req.append_output_token_ids(8)  # slot 8 completes block 2: it is cached
    a, b = theirs.allocate_slots(req, 1), ours.allocate_slots(req, 1)
    assert ids(a) == ids(b)
    assert counting.allocations == before + 1
    probe_hits(theirs, ours, [*range(1, 9), 99], hasher)


def test_placeholder_output_token_on_a_core_step_keeps_vllms_hashes() -> None:
    # Regression: a placeholder id (< 0) appended on a decode step that reaches
    # the core before its block completes reached kvcoord's hashing request
    # taken modulo 2**32, so the block it completed got a digest vLLM never
    # computes (and lost the hits vLLM finds).
    ours_hasher = hasher_for("kvcoord")  # sha256_cbor: kvcoord hashes
    vllm_hasher = block_hasher(HBS, sha256_cbor)
    theirs, ours, counting = managers((4,), num_blocks=32)
    a = make_request("r", [1, 2, 3, 4, 5], vllm_hasher)
    b = make_request("r", [1, 2, 3, 4, 5], ours_hasher)
    for m, req in ((theirs, a), (ours, b)):
        assert ids(m.allocate_slots(req, 5)) is not None
        req.num_computed_tokens = 5
        req.status = RequestStatus.RUNNING
    for token in (6, 7, 8, -1, 10, 11, 12, 13):
        before = counting.allocations
        for m, req in ((theirs, a), (ours, b)):
            req.append_output_token_ids(token)
            assert ids(m.allocate_slots(req, 1)) is not None
            req.num_computed_tokens += 1
        if token == -1:
            assert counting.allocations == before + 1  # the step reached the core
        assert a.block_hashes == b.block_hashes
        assert theirs.get_block_ids("r") == ours.get_block_ids("r")
    tokens = [*a.all_token_ids, 0]
    probe_a = make_request("probe", tokens, vllm_hasher)
    probe_b = make_request("probe", tokens, ours_hasher)
    (ha, na, _), (hb, nb, _) = (
        theirs.get_computed_blocks(probe_a),
        ours.get_computed_blocks(probe_b),
    )
    assert na == nb == 12
    assert ids(ha) == ids(hb)
    ours.check_invariants()
