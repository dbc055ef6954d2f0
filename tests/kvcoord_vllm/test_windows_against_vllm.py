"""Sliding-window and chunked-local groups served by kvcoord.vllm, beside
vLLM 0.33.0's own manager: random schedules with chunked prefill (blocks
leave the window while a prompt is prefilled), the full-sequence admission
check with vLLM's admission cap, retention intervals and shared-prefix
junctions. Every hit, junction, allocation, block table and the free queue
must be equal. Skipped without vLLM."""

from __future__ import annotations

import dataclasses
import random

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from vllm.v1.request import RequestStatus
from vllm_helpers import (
    BS,
    config,
    free_queue,
    full_spec,
    ids,
    make_request,
    manager_args,
    needs_lookup_cap,
    preempt,
)

import kvcoord.vllm as kv


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def swa_spec(window: int, block_size: int = BS, **kw: object) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=window,
        **kw,
    )


def swa_mla_spec(window: int, block_size: int = BS, **kw: object) -> SlidingWindowMLASpec:
    return SlidingWindowMLASpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=window,
        **kw,
    )


def chunked_spec(chunk: int, block_size: int = BS) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        attention_chunk_size=chunk,
    )


LAYOUTS = {
    "swa": lambda: [swa_spec(8)],
    "full+swa": lambda: [full_spec(), swa_spec(12)],
    "full+swa16": lambda: [full_spec(8), swa_spec(16)],
    "chunked": lambda: [chunked_spec(8)],
    "full+full8": lambda: [full_spec(), full_spec(8)],
    "full+chunked": lambda: [full_spec(), chunked_spec(16)],
    # Sliding-window MLA: vLLM's sliding-window manager, its own spec type in
    # the hybrid hit search (beside plain sliding window too).
    "full+swa_mla": lambda: [full_spec(), swa_mla_spec(12)],
    "swa+swa_mla": lambda: [swa_spec(8), swa_mla_spec(16)],
}

#: Layouts served with EAGLE (chunked local is not: vLLM asserts on its
#: EAGLE lookups), three spec groups among them (the hybrid fixed point
#: runs several rounds, with EAGLE drops re-done when a round shrinks).
EAGLE_LAYOUTS = {
    **{name: make for name, make in LAYOUTS.items() if "chunked" not in name},
    "full+swa+swa8": lambda: [full_spec(), swa_spec(12), swa_spec(20, block_size=8)],
    "swa+swa16": lambda: [swa_spec(8), swa_spec(16, block_size=8)],
}


def pair(
    layout: str,
    num_blocks: int,
    retention: int | None,
    zeroing=False,
    eagle_groups: tuple[int, ...] = (),
    **kw: object,
):
    specs = {**LAYOUTS, **EAGLE_LAYOUTS}[layout]()
    if zeroing and len(specs) > 1:
        # Mixed precisions make vLLM zero new blocks (needs_kv_cache_zeroing).
        specs[-1] = dataclasses.replace(specs[-1], dtype=torch.float16)
    cfg = config(num_blocks, specs)
    cfg.prefix_cache_retention_interval = retention
    assert cfg.needs_kv_cache_zeroing == (zeroing and len(specs) > 1)
    for g in eagle_groups:
        cfg.kv_cache_groups[g].is_eagle_group = True
    sbs = max(g.kv_cache_spec.block_size for g in cfg.kv_cache_groups)
    args = manager_args(
        **{"max_model_len": 512, "scheduler_block_size": sbs, "hash_block_size": BS, **kw}
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    return theirs, ours


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("retention", [None, 0, 16])
def test_windowed_schedule_matches_vllm(seed: int, layout: str, retention: int | None) -> None:
    if retention and "swa" not in layout:
        retention = None  # vLLM accepts a positive interval only with SWA/Mamba groups
    rng = random.Random(seed)
    theirs, ours = pair(
        layout,
        40,
        retention,
        zeroing=seed % 2 == 1,
        max_in_flight_tokens=rng.choice([8, 16, 64, None]),
    )
    run_schedule(theirs, ours, rng)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", sorted(EAGLE_LAYOUTS))
@pytest.mark.parametrize("retention", [None, 0, 16])
@pytest.mark.parametrize("flagged", ["all", "last"])
def test_eagle_windowed_schedule_matches_vllm(
    seed: int, layout: str, retention: int | None, flagged: str
) -> None:
    # EAGLE's block drop inside the window scans and the hybrid fixed point,
    # the tails it caches and pins: every group drafting (use_eagle, none
    # flagged), or only the last group flagged (is_eagle_group).
    specs = EAGLE_LAYOUTS[layout]()
    if retention and "swa" not in layout:
        retention = None  # vLLM accepts a positive interval only with SWA/Mamba groups
    eagle_groups = (len(specs) - 1,) if flagged == "last" else ()
    if flagged == "last" and len(specs) == 1:
        pytest.skip("one group: flagging it is the same as use_eagle alone")
    rng = random.Random(seed)
    theirs, ours = pair(
        layout,
        48,
        retention,
        zeroing=seed % 2 == 1,
        eagle_groups=eagle_groups,
        use_eagle=True,
        max_in_flight_tokens=rng.choice([8, 16, 64, None]),
    )
    run_schedule(theirs, ours, rng)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_async_windowed_schedule_matches_vllm(seed: int, layout: str) -> None:
    # Async scheduling: each step is scheduled before the previous one's
    # output is back, so windows release blocks on the processed basis
    # (num_computed_tokens - num_in_flight_tokens). Requests also arrive
    # with their prompt already computed elsewhere (a disaggregated decode
    # worker), as computed tokens with no blocks behind them.
    rng = random.Random(seed)
    theirs, ours = pair(layout, 48, None, max_in_flight_tokens=rng.choice([16, 64, None]))
    run_schedule(theirs, ours, rng, in_flight=True)


def run_schedule(theirs, ours, rng: random.Random, in_flight: bool = False) -> None:
    """Random admissions, chunked prefills, decodes, preemptions and frees on
    both managers; after every step everything observable must be equal.
    With ``in_flight``, a scheduled step's tokens stay in flight until the
    next step's schedule of the request, and some requests arrive computed."""
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(8, 60))] for _ in range(3)]
    waiting = []
    running = []
    for step in range(100):
        if rng.random() < 0.5:
            tokens = rng.choice(prefixes) + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 40))
            ]
            waiting.append(make_request(f"r{step}", tokens))
        # Computed elsewhere (some or all but the last prompt token). vLLM
        # may count fewer blocks than it then takes for such a request (its
        # windows count the computed tokens as skipped; its allocation does
        # not), so only where every block it could take is free.
        req = make_request(f"d{step}", [rng.randrange(1000) for _ in range(rng.randrange(2, 50))])
        room = len(theirs.coordinator.single_type_managers) * (req.num_tokens // BS + 2)
        if in_flight and rng.random() < 0.15 and theirs.block_pool.get_num_free_blocks() > room:
            n = 1 if rng.random() < 0.5 else rng.randrange(1, req.num_tokens)
            if rng.random() < 0.5:
                req.num_computed_tokens = req.num_tokens - n
                kwargs = {}
            else:  # as new computed tokens that come with no blocks
                kwargs = {"num_new_computed_tokens": req.num_tokens - n}
            a = theirs.allocate_slots(req, n, **kwargs)
            b = ours.allocate_slots(req, n, **kwargs)
            assert ids(a) == ids(b)
            if a is not None:
                req.num_computed_tokens = req.num_tokens
                req.num_in_flight_tokens = n
                req.status = RequestStatus.RUNNING
                running.append(req)
        for req in list(running):
            if req.num_computed_tokens >= req.num_tokens:  # decode one token
                req.append_output_token_ids(rng.randrange(1000))
            n = min(req.num_tokens - req.num_computed_tokens, rng.choice([4, 8, 13]))
            a = theirs.allocate_slots(req, n)
            b = ours.allocate_slots(req, n)
            assert ids(a) == ids(b)
            if a is None:
                preempt(req, (theirs, ours), running, waiting)
                req.num_in_flight_tokens = 0
            else:
                req.num_computed_tokens += n
                if in_flight:
                    req.num_in_flight_tokens = n if rng.random() < 0.7 else 0
        while waiting:
            req = waiting[0]
            (ha, na, ja), (hb, nb, jb) = (
                theirs.get_computed_blocks(req),
                ours.get_computed_blocks(req),
            )
            assert (na, ja, ids(ha)) == (nb, jb, ids(hb))
            req.shared_prefix_boundary = ja
            n = min(req.num_tokens - na, rng.choice([8, 16, 100]))
            kwargs = {
                "num_new_computed_tokens": na,
                "full_sequence_must_fit": rng.random() < 0.8,
                "has_scheduled_reqs": bool(running),
                "reserved_blocks": rng.choice([0, 0, 2]),
            }
            a = theirs.allocate_slots(req, n, new_computed_blocks=ha, **kwargs)
            b = ours.allocate_slots(req, n, new_computed_blocks=hb, **kwargs)
            assert ids(a) == ids(b)
            if a is None:
                break
            waiting.pop(0)
            req.num_computed_tokens = na + n
            if in_flight:
                req.num_in_flight_tokens = n
            req.status = RequestStatus.RUNNING
            running.append(req)
        for req in list(running):
            if rng.random() < 0.08:
                running.remove(req)
                for m in (theirs, ours):
                    m.free(req)
            elif rng.random() < 0.3:
                processed = req.num_computed_tokens - req.num_in_flight_tokens
                args = (req.request_id, processed, req.num_prompt_tokens)
                theirs.remove_skipped_blocks(*args)
                ours.remove_skipped_blocks(*args)
        assert theirs.block_pool.get_num_free_blocks() == ours.block_pool.get_num_free_blocks()
        assert free_queue(theirs) == free_queue(ours)
        assert theirs.take_new_block_ids() == ours.take_new_block_ids()
        for req in running[:2]:  # the pool by vLLM's block hash, per group
            for h in req.block_hashes:
                for g, m in enumerate(theirs.coordinator.single_type_managers):
                    if m.block_size != BS:
                        continue  # keyed by the hash unit only (see docs/vllm.md)
                    a = theirs.block_pool.get_cached_block(h, kv_cache_group_ids=[g])
                    b = ours.block_pool.get_cached_block(h, kv_cache_group_ids=[g])
                    assert (a and [x.block_id for x in a]) == (b and [x.block_id for x in b])
        for req in running:
            assert theirs.get_block_ids(req.request_id) == ours.get_block_ids(req.request_id)
            for cap in (False, True):
                kwargs = {
                    "request_id": req.request_id,
                    "num_tokens": req.num_tokens + 30,
                    "new_computed_blocks": theirs.empty_kv_cache_blocks.blocks,
                    "num_encoder_tokens": 0,
                    "total_computed_tokens": req.num_computed_tokens,
                    "num_local_computed_tokens": req.num_computed_tokens,
                    "num_tokens_main_model": req.num_tokens + 30,
                    "apply_admission_cap": cap,
                }
                assert theirs.coordinator.get_num_blocks_to_allocate(
                    **kwargs
                ) == ours.coordinator.get_num_blocks_to_allocate(**kwargs)
        ours.check_invariants()


def test_admission_cap_admits_a_prompt_longer_than_the_pool() -> None:
    # 30 blocks of 4 tokens, SWA window 8, 16 tokens in flight: a 400-token
    # prompt needs 100 blocks uncapped but holds at most cdiv(7 + 16, 4) + 1.
    theirs, ours = pair("swa", 30, None, max_in_flight_tokens=16)
    results = []
    for m in (theirs, ours):
        req = make_request("long", list(range(400)))
        results.append(ids(m.allocate_slots(req, 16, full_sequence_must_fit=True)))
    assert results[0] == results[1] and results[0] is not None
    theirs, ours = pair("full+swa", 30, None, max_in_flight_tokens=16)
    for m in (theirs, ours):
        req = make_request("long", list(range(400)))
        assert m.allocate_slots(req, 16, full_sequence_must_fit=True) is None


@pytest.mark.parametrize(
    ("specs", "kw", "reason"),
    [
        ([full_spec(), chunked_spec(8)], {"use_eagle": True}, "EAGLE with chunked-local"),
        ([chunked_spec(8)], {"use_eagle": True}, "EAGLE with chunked-local"),
        ([swa_spec(8, extra_retained_tokens=2)], {}, "extra_retained_tokens"),
        ([full_spec(8), chunked_spec(16)], {}, "chunked-local attention beside"),
        ([swa_mla_spec(8, model_version="deepseek_v4")], {}, "DeepSeek-V4 fields"),
        ([swa_mla_spec(8, bounded_replay=True)], {}, "bounded_replay"),
        ([swa_mla_spec(8, extra_retained_tokens=2)], {}, "extra_retained_tokens"),
    ],
)
def test_unserved_windowed_configurations_fall_back(specs, kw, reason) -> None:
    before = sum(v for k, v in kv.fallbacks.items() if reason in k)
    cfg = config(16, specs)
    sbs = max(s.block_size for s in specs)
    m = kv.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=sbs, hash_block_size=BS, **kw)
    assert not isinstance(m, kv.KVCacheManager)
    assert sum(v for k, v in kv.fallbacks.items() if reason in k) == before + 1


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("local", [0, 1, 3])
@pytest.mark.parametrize("external", [4, 24, 40])
@pytest.mark.parametrize("skip", [(), (0,), (1,)])
@needs_lookup_cap
def test_external_tokens_and_zeroing_match_vllm(layout, local, external, skip) -> None:
    # A primed prefix gives `local` hit blocks (of the scheduler block
    # size); `external` connector tokens follow; new blocks are zeroed
    # except the external ones of the groups in `skip`.
    theirs, ours = pair(layout, 60, None, zeroing=True)
    sbs = max(s.block_size for s in LAYOUTS[layout]())
    prompt = list(range(200))
    results = []
    for m in (theirs, ours):
        primer = make_request("primer", prompt[:96])
        assert m.allocate_slots(primer, 96) is not None
        m.free(primer)
        m.take_new_block_ids()
        req = make_request("r", prompt)
        hits, n, _ = m.get_computed_blocks(req, max_cache_hit_length=local * sbs)
        new = m.allocate_slots(
            req,
            16,
            num_new_computed_tokens=n,
            new_computed_blocks=hits,
            num_external_computed_tokens=external,
            skip_zeroing_group_ids=skip,
        )
        got = [n, ids(new), m.take_new_block_ids(), m.get_block_ids("r")]
        m.record_blocks_for_zeroing("r", 0)
        results.append([*got, m.take_new_block_ids()])
    assert results[0] == results[1]
