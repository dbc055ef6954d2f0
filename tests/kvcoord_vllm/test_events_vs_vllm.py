"""KV-cache events (``enable_kv_cache_events=True``) of
kvcoord.vllm.KVCacheManager beside vLLM 0.33.0's own manager: driven with the
same vLLM ``Request`` objects, every ``take_events()`` must return equal
events (vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``,
every field).

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
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import (
    MultiModalFeatureSpec,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from vllm.sampling_params import SamplingParams
from vllm.utils import hashing
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.request import Request, RequestStatus
from vllm_helpers import block_hasher, manager_args, needs_hash_lookahead

import kvcoord.vllm as kv
from kvcoord.vllm.serve._hasher import make_block_hasher

BS = 4


def config(num_blocks: int, block_sizes: list[int]) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                [f"l{i}"],
                FullAttentionSpec(block_size=b, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
            for i, b in enumerate(block_sizes)
        ],
    )


def managers(cfg: KVCacheConfig, **kw: Any) -> tuple[Any, Any]:
    args = manager_args(
        **{
            "max_model_len": 512,
            "scheduler_block_size": max(g.kv_cache_spec.block_size for g in cfg.kv_cache_groups),
            "hash_block_size": BS,
            "enable_kv_cache_events": True,
            **kw,
        }
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    return theirs, ours


def features(rng: random.Random, n: int) -> list[MultiModalFeatureSpec]:
    out, offset = [], rng.randrange(0, 6)
    while offset + 3 < n:
        length = rng.randrange(1, 7)
        out.append(
            MultiModalFeatureSpec(
                data=MultiModalKwargsItem.dummy(),
                mm_position=PlaceholderRange(offset=offset, length=min(length, n - offset)),
                identifier=f"img{rng.randrange(3)}",
                modality="image",
            )
        )
        offset += length + rng.randrange(1, 9)
    return out


def make_request(rid: str, tokens: list[int], hasher: Any, rng: random.Random) -> Request:
    extra: dict[str, Any] = {}
    kind = rng.randrange(6)
    if kind == 1:
        extra["lora_request"] = LoRARequest(f"ad{rng.randrange(2)}", 7, "/path")
    elif kind == 2:
        extra["cache_salt"] = rng.choice(["s0", "s1"])
    elif kind == 3:
        extra["mm_features"] = features(rng, len(tokens))
    elif kind == 4:
        extra["session_id"] = f"session-{rng.randrange(3)}"
    params = SamplingParams(
        max_tokens=1000,
        extra_args={"kv_cache_report_mode": rng.choice(["full", "incremental"])},
    )
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
        **extra,
    )


def same_events(theirs: Any, ours: Any) -> int:
    a, b = theirs.take_events(), ours.take_events()
    assert [type(e) for e in b] == [type(e) for e in a]
    assert b == a
    return len(a)


def admit_both(theirs: Any, ours: Any, req: Request) -> bool:
    """Look ``req`` up and admit it on both managers alike; False when both
    refused it (no room), or both raised the same ``AssertionError`` on the
    lookup (vLLM cannot report that hit as events)."""
    try:
        ha, na, _ = theirs.get_computed_blocks(req)
    except AssertionError:
        with pytest.raises(AssertionError):
            ours.get_computed_blocks(req)
        return False
    hb, nb, _ = ours.get_computed_blocks(req)
    assert (na, ha.get_block_ids()) == (nb, hb.get_block_ids())
    new = req.num_tokens - na
    a = theirs.allocate_slots(req, new, num_new_computed_tokens=na, new_computed_blocks=ha)
    b = ours.allocate_slots(req, new, num_new_computed_tokens=nb, new_computed_blocks=hb)
    assert (a is None) == (b is None)
    return a is not None


def drive(theirs: Any, ours: Any, hasher: Any, rng: random.Random, num_blocks: int) -> int:
    """80 random steps on both managers (admissions with shared prefixes,
    decode steps, frees, ``evict_blocks``, prefix-cache resets), their events
    compared after every step; the number of events seen."""
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 30))] for _ in range(3)]
    running: list[Request] = []
    seen = 0
    for step in range(80):
        if rng.random() < 0.6:
            tokens = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(12))]
            req = make_request(f"r{step}", tokens, hasher, rng)
            if admit_both(theirs, ours, req):
                req.num_computed_tokens = req.num_tokens
                req.status = RequestStatus.RUNNING
                running.append(req)
        for req in list(running):
            req.append_output_token_ids(rng.randrange(1000))
            a = theirs.allocate_slots(req, 1)
            b = ours.allocate_slots(req, 1)
            assert (a is None) == (b is None)
            if a is None or rng.random() < 0.1:
                running.remove(req)
                theirs.free(req)
                ours.free(req)
            else:
                req.num_computed_tokens = req.num_tokens
        if rng.random() < 0.05:
            victims = rng.sample(range(1, num_blocks), 3)
            theirs.evict_blocks(set(victims))
            ours.evict_blocks(set(victims))
        if rng.random() < 0.04:
            for req in running:
                theirs.free(req)
                ours.free(req)
            running.clear()
            assert theirs.reset_prefix_cache() and ours.reset_prefix_cache()
        seen += same_events(theirs, ours)
    return seen


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_sizes", [[BS], [BS, BS], [BS, 2 * BS], [3 * BS, BS]])
@pytest.mark.parametrize(
    ("algo", "lookahead"), [("sha256", 0), ("sha256_cbor", 0), ("sha256", 2), ("xxhash", 1)]
)
@pytest.mark.parametrize("int_hashes", [True, False])
def test_random_schedule_events_match_vllm(
    seed: int,
    block_sizes: list[int],
    algo: str,
    lookahead: int,
    int_hashes: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stores (with LoRA, cache salt, multimodal items, session ids, lookahead
    tokens, ``"full"`` hit reports), removals on reuse and ``evict_blocks``,
    and clears, in vLLM's order; ``sha256_cbor`` goes through kvcoord's own
    hasher, the others through vLLM's (keys supplied by the request). A group
    whose blocks span several hash units also stores, reports and removes
    the partial key of its prompt-tail block (with EAGLE on a block that may
    not be full yet)."""
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1" if int_hashes else "0")
    rng = random.Random(seed)
    fn = getattr(hashing, algo)
    init_none_hash(fn)
    ours_hasher = make_block_hasher(get_request_block_hasher)
    hasher = block_hasher(BS, fn, lookahead, original=ours_hasher)
    # Odd seeds: EAGLE's last-block drop (``"full"`` reports follow the dropped hit).
    theirs, ours = managers(
        config(40, block_sizes), num_hash_lookahead_tokens=lookahead, use_eagle=seed % 2 == 1
    )
    assert drive(theirs, ours, hasher, rng, num_blocks=40) > 20


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dcp", [2, 4])
def test_context_parallel_events_match_vllm(seed: int, dcp: int) -> None:
    """Decode context parallelism: each block spans ``dcp`` times the spec's
    block size, and so does the hash unit (vLLM's one-group coordinator
    requires it). Stored and removed events come at that size. A ``"full"``
    hit report is at the spec's size, below the hash unit: vLLM cannot
    report it and asserts on the lookup; so does kvcoord, on the same
    lookup, and every other event matches."""
    rng = random.Random(seed)
    init_none_hash(hashing.sha256_cbor)
    hash_bs = BS * dcp
    hasher = block_hasher(
        hash_bs, hashing.sha256_cbor, original=make_block_hasher(get_request_block_hasher)
    )
    theirs, ours = managers(
        config(48, [BS]),
        scheduler_block_size=BS * dcp,
        hash_block_size=hash_bs,
        dcp_world_size=dcp,
    )
    assert drive(theirs, ours, hasher, rng, num_blocks=48) > 10


@needs_hash_lookahead
def test_lookahead_events_rebuild_the_requests_hashes() -> None:
    """With hash lookahead, each stored block carries the tokens its hash
    covers past the block; stores follow the hashes the request has."""
    init_none_hash(hashing.sha256)
    hasher = block_hasher(2, hashing.sha256, 1)
    ours = kv.KVCacheManager(
        config(20, [2]),
        **manager_args(
            max_model_len=64,
            scheduler_block_size=2,
            hash_block_size=2,
            num_hash_lookahead_tokens=1,
            enable_kv_cache_events=True,
        ),
    )
    assert isinstance(ours, kv.KVCacheManager)
    req = make_request("a", [10, 11, 12, 13, 14], hasher, random.Random(5))
    assert len(req.block_hashes) == 2
    ours.allocate_slots(req, req.num_tokens)
    (stored,) = ours.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.token_ids == [10, 11, 12, 13]
    assert stored.lookahead_token_ids == [[12], [14]]
    assert stored.kv_cache_spec_kind == "full_attention"
    assert ours.block_pool.kv_event_queue == []


def test_partial_prompt_tail_keys_are_stored_and_removed() -> None:
    """A group of 8-token blocks over 4-token hash units keys its prompt-tail
    block at the prompt's last hash boundary (a partial key, one hash unit
    long in its event, beside the block's full key once full) and reports
    both keys when the block is reused, as vLLM's pool does."""
    init_none_hash(hashing.sha256)
    hasher = block_hasher(BS, hashing.sha256)
    theirs, ours = managers(config(12, [BS, 2 * BS]))
    for m in (theirs, ours):
        req = make_request("a", list(range(15)), hasher, random.Random(0))
        assert m.allocate_slots(req, req.num_tokens) is not None
        req.num_computed_tokens = req.num_tokens
        req.append_output_token_ids(99)
        assert m.allocate_slots(req, 1) is not None
        m.free(req)
        other = make_request("b", list(range(500, 528)), hasher, random.Random(1))
        assert m.allocate_slots(other, 28) is not None
    a, b = theirs.take_events(), ours.take_events()
    assert b == a
    # The partial key of group 1 (8-token blocks) at 12: one hash unit long,
    # stored, then removed with the block's full key when the block is reused.
    stored = [e for e in a if isinstance(e, BlockStored) and e.group_idx == 1]
    partial = [e for e in stored if e.block_size == BS]
    assert [e.token_ids for e in partial] == [[8, 9, 10, 11]]
    removed = [e for e in a if isinstance(e, BlockRemoved) and e.group_idx == 1]
    assert partial[0].block_hashes[0] in [h for e in removed for h in e.block_hashes]
    ours.check_invariants()


def test_events_off_leave_the_queue_empty() -> None:
    ours = kv.KVCacheManager(
        config(8, [BS]), max_model_len=64, scheduler_block_size=BS, hash_block_size=BS
    )
    init_none_hash(hashing.sha256)
    req = make_request("a", list(range(9)), block_hasher(BS, hashing.sha256), random.Random(0))
    ours.allocate_slots(req, req.num_tokens)
    ours.free(req)
    ours.reset_prefix_cache()
    assert ours.take_events() == []


def test_removed_and_cleared_events_without_a_request() -> None:
    """Removals from ``evict_blocks`` and the clear of ``reset_prefix_cache``
    are taken without any request at hand."""
    theirs, ours = managers(config(8, [BS]))
    init_none_hash(hashing.sha256)
    req = make_request("a", list(range(9)), block_hasher(BS, hashing.sha256), random.Random(0))
    for m in (theirs, ours):
        m.allocate_slots(req, req.num_tokens)
    assert same_events(theirs, ours) == 1
    for m in (theirs, ours):
        m.evict_blocks({1})
        m.free(req)
        assert m.reset_prefix_cache()
    events = ours.take_events()
    assert [type(e) for e in events] == [BlockRemoved, AllBlocksCleared]
    assert events == theirs.take_events()
