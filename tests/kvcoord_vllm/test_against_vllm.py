"""kvcoord.vllm.KVCacheManager beside vLLM 0.33.0's own manager, both driven
with the same vLLM ``Request`` objects: every hit, every allocation result,
every block table and the free queue (eviction order) must be equal.

Skipped when vLLM is not installed (``make test-vllm`` runs it in a
virtualenv with vLLM 0.33.0).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import replace

import pytest

vllm = pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    KVCacheConfig,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm_helpers import (  # noqa: E402
    BS,
    admit_alike,
    block_hasher,
    config,
    drop_eagle_group_ids,
    free_queue,
    full_spec,
    ids,
    make_request,
    manager_args,
    preempt,
)

import kvcoord.vllm as kv  # noqa: E402


def managers(cfg: KVCacheConfig, **kw: object) -> tuple[object, object]:
    args = manager_args(
        **{"max_model_len": 512, "scheduler_block_size": BS, "hash_block_size": BS, **kw}
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    return theirs, ours


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("use_eagle", [False, True])
@pytest.mark.parametrize(("lookahead", "prefill_lookahead"), [(0, 0), (2, 0), (0, 3)])
@pytest.mark.parametrize("hisparse_fields", [False, True])
def test_random_schedule_matches_vllm(
    seed: int,
    groups: int,
    use_eagle: bool,
    lookahead: int,
    prefill_lookahead: int,
    hisparse_fields: bool,
) -> None:
    """``lookahead``: vLLM's hash-lookahead hasher (each block's hash also
    covers the next tokens, so it exists only once they do); kvcoord keys by
    those hashes as they are. ``prefill_lookahead``: multi-module MTP, whose
    last ``prefill_lookahead - 1`` computed tokens are never cached in one
    group or in EAGLE groups; other groups of a hybrid coordinator cache the
    aligned prefix (see test_lookahead_against_vllm). ``hisparse_fields``:
    every group ``host_resident`` and ``hisparse_host_num_blocks`` set, which
    vLLM's manager never reads (served as the plain configuration;
    kvcoord.vllm.serve._hisparse_support)."""
    if hisparse_fields and (use_eagle or lookahead or prefill_lookahead):
        pytest.skip("the HiSparse fields are checked on the plain schedule")
    rng = random.Random(seed)
    cfg = config(48, [full_spec() for _ in range(groups)])
    if hisparse_fields:
        host_groups = [replace(g, host_resident=True) for g in cfg.kv_cache_groups]
        cfg = replace(cfg, kv_cache_groups=host_groups, hisparse_host_num_blocks=16)
    theirs, ours = managers(
        cfg,
        watermark=rng.choice([0.0, 0.05]),
        use_eagle=use_eagle,
        num_hash_lookahead_tokens=lookahead,
        num_prefill_lookahead=prefill_lookahead,
    )
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(4, 30))] for _ in range(3)]
    waiting: list[Request] = []
    running: list[Request] = []
    for step in range(120):
        if rng.random() < 0.5:
            tokens = rng.choice(prefixes) + [
                rng.randrange(1000) for _ in range(rng.randrange(1, 12))
            ]
            waiting.append(make_request(f"r{step}", tokens, lookahead=lookahead))
        for req in list(running):  # decode: one token each, preempt the last on failure
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
            (ha, na, _), (hb, nb, _) = (
                theirs.get_computed_blocks(req),
                ours.get_computed_blocks(req),
            )
            assert (na, ids(ha)) == (nb, ids(hb))
            kwargs = {
                "num_new_computed_tokens": na,
                "full_sequence_must_fit": rng.random() < 0.7,
                "has_scheduled_reqs": bool(running),
                "reserved_blocks": rng.choice([0, 0, 3]),
            }
            a = theirs.allocate_slots(req, req.num_tokens - na, new_computed_blocks=ha, **kwargs)
            b = ours.allocate_slots(req, req.num_tokens - nb, new_computed_blocks=hb, **kwargs)
            assert ids(a) == ids(b)
            if a is None:
                break
            waiting.pop(0)
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
            running.append(req)
        for req in list(running):
            if rng.random() < 0.08:
                running.remove(req)
                for m in (theirs, ours):
                    m.free(req)
        assert theirs.block_pool.get_num_free_blocks() == ours.block_pool.get_num_free_blocks()
        assert free_queue(theirs) == free_queue(ours)
        for req in running:
            assert theirs.get_block_ids(req.request_id) == ours.get_block_ids(req.request_id)
            assert theirs.estimate_cached_tokens(req) == ours.estimate_cached_tokens(req)
        ours.check_invariants()
    assert theirs.usage == pytest.approx(ours.usage)


def test_pop_blocks_for_free_keeps_references_until_freed() -> None:
    cfg = config(16, [full_spec()])
    theirs, ours = managers(cfg)
    for m in (theirs, ours):
        req = make_request("a", list(range(10)))
        m.get_computed_blocks(req)
        m.allocate_slots(req, 10)
        popped = m.pop_blocks_for_free(req)
        assert m.block_pool.get_num_free_blocks() == 12
        assert m.get_block_ids("a") == ([],) or m is theirs
        m.block_pool.free_blocks(reversed(popped))
        assert m.block_pool.get_num_free_blocks() == 15
    assert free_queue(theirs) == free_queue(ours)


def test_external_tokens_allocate_like_vllm() -> None:
    cfg = config(32, [full_spec()])
    theirs, ours = managers(cfg)
    req = make_request("a", list(range(30)))
    a = theirs.allocate_slots(req, 6, num_external_computed_tokens=16)
    b = ours.allocate_slots(req, 6, num_external_computed_tokens=16)
    assert ids(a) == ids(b)
    assert theirs.get_block_ids("a") == ours.get_block_ids("a")


def test_unknown_request_and_zero_tokens_behave_like_vllm() -> None:
    cfg = config(16, [full_spec()])
    theirs, ours = managers(cfg)
    assert ours.get_block_ids("nope") == theirs.get_block_ids("nope") == ([],)
    req = make_request("a", list(range(5)))
    for m in (theirs, ours):
        with pytest.raises(ValueError, match="num_new_tokens"):
            m.allocate_slots(req, 0)
        m.free(req)  # never allocated: a no-op


def test_stats_are_vllms_record_per_scheduled_request() -> None:
    cfg = config(16, [full_spec()])
    theirs, ours = managers(cfg, log_stats=True)
    req = make_request("a", list(range(9)))
    for m in (theirs, ours):
        m.record_prefix_cache_stats(req, 4)
    a, b = theirs.make_prefix_cache_stats(), ours.make_prefix_cache_stats()
    assert (a.requests, a.queries, a.hits) == (b.requests, b.queries, b.hits) == (1, 9, 4)


def test_unserved_configuration_falls_back_with_one_log_line(caplog) -> None:
    # Sliding window is served; with MTP's retained tail it is not (yet).
    swa = SlidingWindowSpec(
        block_size=BS,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=8,
        extra_retained_tokens=2,
    )
    before = sum(kv.fallbacks.values())
    with caplog.at_level(logging.WARNING, logger="kvcoord.vllm"):
        m = kv.KVCacheManager(
            config(16, [full_spec(), swa]),
            max_model_len=64,
            scheduler_block_size=BS,
            hash_block_size=BS,
        )
    assert type(m) is kv.original_manager_class()
    assert sum(kv.fallbacks.values()) == before + 1
    assert [r.getMessage() for r in caplog.records if "SlidingWindowSpec" in r.getMessage()]
    # Decode context parallelism is served beside full attention only.
    m2 = kv.KVCacheManager(
        config(16, [dataclasses.replace(swa, extra_retained_tokens=0)]),
        max_model_len=64,
        scheduler_block_size=2 * BS,
        hash_block_size=2 * BS,
        dcp_world_size=2,
    )
    assert type(m2) is kv.original_manager_class()
    # EAGLE over a group of blocks above the hash unit is served (its
    # partial prompt-tail key is kept), as is EAGLE over several specs.
    m3 = kv.KVCacheManager(
        config(16, [full_spec(), full_spec(2 * BS)]),
        max_model_len=64,
        scheduler_block_size=2 * BS,
        hash_block_size=BS,
        use_eagle=True,
    )
    assert isinstance(m3, kv.KVCacheManager)


def test_enable_is_idempotent_and_patches_the_scheduler() -> None:
    import vllm.v1.core.kv_cache_manager as km
    import vllm.v1.core.sched.scheduler as sched

    was = kv.is_enabled()
    original = kv.original_manager_class()
    try:
        kv.enable()
        kv.enable()
        assert sched.KVCacheManager is kv.KVCacheManager is km.KVCacheManager
        assert kv.original_manager_class() is original
        kv.disable()
        assert sched.KVCacheManager is original
    finally:
        if was:
            kv.enable()


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash_cbor"])
def test_kvcoord_block_hasher_is_byte_identical(algo: str) -> None:
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import (
        MultiModalFeatureSpec,
        MultiModalKwargsItem,
        PlaceholderRange,
    )
    from vllm.utils import hashing

    from kvcoord.vllm.serve._hasher import make_block_hasher

    fn = getattr(hashing, algo)
    init_none_hash(fn)
    theirs = block_hasher(BS, fn)
    ours = block_hasher(BS, fn, original=make_block_hasher(get_request_block_hasher))
    mm = [
        MultiModalFeatureSpec(
            data=MultiModalKwargsItem.dummy(),
            mm_position=PlaceholderRange(offset=off, length=n),
            identifier=f"img{off}",
            modality="image",
        )
        for off, n in ((3, 6), (14, 2))
    ]
    variants = [
        {},
        {"cache_salt": "tenant"},
        {"lora_request": LoRARequest("ad", 1, "/path/ad")},
        {"mm_features": mm},
    ]
    rng = random.Random(0)
    for extra in variants:
        tokens = [rng.randrange(50000) for _ in range(23)]
        reqs = []
        for hasher in (theirs, ours):
            params = SamplingParams(max_tokens=100)
            params.update_from_generation_config({}, eos_token_id=100)
            reqs.append(
                Request(
                    request_id="r",
                    prompt_token_ids=list(tokens),
                    sampling_params=params,
                    pooling_params=None,
                    block_hasher=hasher,
                    **extra,
                )
            )
        for _ in range(9):
            token = rng.randrange(50000)
            for r in reqs:
                r.append_output_token_ids(token)
        assert len(reqs[1].block_hashes) == 8
        assert reqs[0].block_hashes == reqs[1].block_hashes, extra


def test_pickle_hashes_stay_vllms() -> None:
    from kvcoord.vllm.serve._hasher import make_block_hasher, stats

    before = stats["vllm_hashers"]
    hasher = block_hasher(BS, sha256, original=make_block_hasher(get_request_block_hasher))
    assert stats["vllm_hashers"] == before + 1
    params = SamplingParams(max_tokens=10)
    params.update_from_generation_config({}, eos_token_id=100)
    req = Request(
        request_id="a",
        prompt_token_ids=list(range(9)),
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )
    assert req.block_hashes == make_request("b", list(range(9))).block_hashes


def test_single_type_views_read_like_vllms() -> None:
    """``num_cached_block`` per request and the coordinator's retention interval
    and EAGLE groups, as vLLM's coordinator and single-type managers show them."""
    cfg = config(32, [full_spec()])
    theirs, ours = managers(cfg, use_eagle=True)
    for m in (theirs, ours):
        for rid, n in (("a", 10), ("b", 3)):
            req = make_request(rid, list(range(n)))
            hit, num, _ = m.get_computed_blocks(req)
            m.allocate_slots(req, n - num, num, hit)
    mine, vllms = ours.coordinator, theirs.coordinator
    assert dict(mine.single_type_managers[0].num_cached_block) == dict(
        vllms.single_type_managers[0].num_cached_block
    )
    assert mine.retention_interval == vllms.retention_interval
    assert set(mine.drop_eagle_group_ids) == drop_eagle_group_ids(vllms)
    assert mine.single_type_managers[0].use_eagle == vllms.single_type_managers[0].use_eagle


def test_deferred_free_of_a_request_readmitted_before_the_free() -> None:
    """Regression: parking popped blocks as a hit of a made-up request stopped
    working once the core verified hits (an uncached tail block is no hit).
    The core now hands the popped references to the caller; re-admitted
    under the same id before the deferred free, the request gets blocks of
    its own, and the free queue order after both frees equals vLLM's."""
    cfg = config(16, [full_spec()])
    theirs, ours = managers(cfg)
    for m in (theirs, ours):
        req = make_request("a", list(range(10)))
        hit, n, _ = m.get_computed_blocks(req)
        m.allocate_slots(req, 10 - n, n, hit)
        popped = m.pop_blocks_for_free(req)
        assert len(m.coordinator.single_type_managers[0].req_to_blocks) == 0
        req.num_computed_tokens = 0
        hit, n, _ = m.get_computed_blocks(req)
        assert n == 8
        m.allocate_slots(req, 10 - n, n, hit)
        m.block_pool.free_blocks(reversed(popped))
    assert theirs.get_block_ids("a") == ours.get_block_ids("a")
    assert free_queue(theirs) == free_queue(ours)
    for m in (theirs, ours):
        m.free(make_request("a", list(range(10))))
    assert free_queue(theirs) == free_queue(ours)


def test_async_scheduler_with_several_groups_is_served() -> None:
    """A scheduler that defers block frees gets kvcoord's manager with one
    group or several (it fell back to vLLM's own with several, whose
    deferred frees kvcoord could not order as vLLM does)."""

    class FakeScheduler:
        def __init__(self, cfg: KVCacheConfig) -> None:
            self.kv_cache_config = cfg
            self.defer_block_free = True
            self.connector = None
            self.kv_cache_manager = kv.KVCacheManager(
                cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS
            )

    before = sum(kv.fallbacks.values())
    for specs in ([full_spec()], [full_spec(), full_spec()]):
        assert isinstance(FakeScheduler(config(16, specs)).kv_cache_manager, kv.KVCacheManager)
    assert sum(kv.fallbacks.values()) == before


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["full+swa", "full+mamba", "full+swa+mamba"])
def test_deferred_frees_of_several_groups_match_vllm(seed: int, layout: str) -> None:
    """vLLM's scheduler frees a popped request's blocks, the groups
    concatenated, in reverse: the last group's tail first. Regression: with
    several groups kvcoord raised NotImplementedError mid-run. Requests are
    popped and freed later, beside admissions, frees and a re-admission of
    a popped id, on full attention beside a sliding window and Mamba."""
    from test_mamba_against_vllm import mamba_spec
    from test_windows_against_vllm import swa_spec

    rng = random.Random(seed)
    specs = {"full+swa": [full_spec(), swa_spec(8)], "full+mamba": [full_spec(), mamba_spec()]}
    specs["full+swa+mamba"] = [full_spec(), swa_spec(8), mamba_spec()]
    cfg = config(60, specs[layout])
    theirs, ours = managers(cfg)
    popped: list[tuple[list, list]] = []
    live: list = []
    for step in range(30):
        req = make_request(f"r{step % 7}", [rng.randrange(50) for _ in range(rng.randrange(4, 30))])
        if any(r.request_id == req.request_id for r in live):
            req = make_request(f"x{step}", list(range(rng.randrange(4, 20))))
        if admit_alike(theirs, ours, req):
            req.num_computed_tokens = req.num_tokens
            live.append(req)
        if live and rng.random() < 0.5:
            victim = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.7:
                pair = (theirs.pop_blocks_for_free(victim), ours.pop_blocks_for_free(victim))
                popped.append(pair)
            else:
                theirs.free(victim)
                ours.free(victim)
        if popped and rng.random() < 0.4:
            a_blocks, b_ids = popped.pop(0)
            assert [blk.block_id for blk in a_blocks] == list(b_ids)
            theirs.block_pool.free_blocks(reversed(a_blocks))
            ours.block_pool.free_blocks(reversed(b_ids))
        assert free_queue(theirs) == free_queue(ours)
        for r in live:
            assert theirs.get_block_ids(r.request_id) == ours.get_block_ids(r.request_id)
        ours.check_invariants()


def test_single_type_views_find_cached_blocks_by_vllms_block_hash() -> None:
    # vLLM's auxiliary-output connector reads
    # coordinator.single_type_managers[g].block_pool.get_cached_block(hash, [g]).
    cfg = config(16, [full_spec()])
    theirs, ours = managers(cfg)
    req = make_request("a", list(range(10)))
    for m in (theirs, ours):
        m.get_computed_blocks(req)
        m.allocate_slots(req, 10)
    for i, h in enumerate(req.block_hashes):
        a = theirs.coordinator.single_type_managers[0].block_pool.get_cached_block(h, [0])
        b = ours.coordinator.single_type_managers[0].block_pool.get_cached_block(h, [0])
        assert [blk.block_id for blk in a] == [ids_of_view(x) for x in b] == [i + 1]
    other = make_request("b", [7] * 10)
    assert (
        ours.coordinator.single_type_managers[0].block_pool.get_cached_block(
            other.block_hashes[0], [0]
        )
        is None
    )


def ids_of_view(block: object) -> int:
    return int(getattr(block, "block_id", block))  # type: ignore[call-overload]


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("num_tokens", [8, 9, 12])
def test_eagle_hit_of_a_fully_cached_prompt_matches_vllm(groups: int, num_tokens: int) -> None:
    """vLLM's hybrid coordinator (several groups) matches one block past the
    lookup limit before its EAGLE drop, its single-group one does not: a
    fully cached 8-token prompt hits 4 tokens with two groups, none with one
    (kvcoord gave none with two groups)."""
    theirs, ours = managers(config(16, [full_spec()] * groups), use_eagle=True)
    for m in (theirs, ours):
        req = make_request("a", list(range(num_tokens)))
        m.allocate_slots(req, num_tokens)
        m.free(req)
    req = make_request("b", list(range(num_tokens)))
    (ha, na, _), (hb, nb, _) = theirs.get_computed_blocks(req), ours.get_computed_blocks(req)
    assert (nb, ids(hb)) == (na, ids(ha))


@pytest.mark.parametrize("num_groups", [1, 2])
def test_coordinator_view_is_an_instance_of_vllms_coordinator_class(num_groups: int) -> None:
    """Code beside the scheduler (vLLM's connector tests among it) tells
    layouts apart by ``isinstance`` on vLLM's coordinator classes; the view
    answers as the class of its own name (it failed for every hybrid layout)."""
    from vllm.v1.core import kv_cache_coordinator as coordinators

    specs = [full_spec(), full_spec(2 * BS)][:num_groups]
    theirs, ours = managers(config(16, specs), scheduler_block_size=num_groups * BS)
    want = type(theirs.coordinator)
    assert type(ours.coordinator).__name__ == want.__name__
    assert isinstance(ours.coordinator, want)
    assert isinstance(ours.coordinator, coordinators.KVCacheCoordinator)
    others = {coordinators.UnitaryKVCacheCoordinator, coordinators.HybridKVCacheCoordinator} - {
        want
    }
    assert not any(isinstance(ours.coordinator, c) for c in others)


def test_truncate_computed_blocks_refuses_as_vllm_does() -> None:
    """A cut past a group's hit or off its block size is vLLM's
    AssertionError on both engines (kvcoord raised ValueError)."""
    theirs, ours = managers(config(16, [full_spec(), full_spec(8)]), scheduler_block_size=8)
    req = make_request("a", list(range(17)))
    for m in (theirs, ours):
        m.allocate_slots(req, 17)
    probe = make_request("b", list(range(17)))
    found = [m.get_computed_blocks(probe) for m in (theirs, ours)]
    assert [n for _, n, _ in found] == [16, 16]
    for m, (blocks, _, _) in zip((theirs, ours), found, strict=True):
        assert ids(m.truncate_computed_blocks(blocks, 8)) == ([1, 2], [6])
        for cut in (4, 24):
            with pytest.raises(AssertionError):
                m.truncate_computed_blocks(blocks, cut)


def test_req_to_blocks_is_a_live_list_as_in_vllm() -> None:
    """Code holding ``req_to_blocks[rid]`` sees later allocations (vLLM's is
    the manager's own list), and keeps the last blocks once the request is
    freed. Regression: kvcoord handed out a snapshot."""
    theirs, ours = managers(config(16, [full_spec()]))
    req = make_request("a", list(range(6)))
    held = []
    for m in (theirs, ours):
        m.allocate_slots(req, 6)
        held.append(m.coordinator.single_type_managers[0].req_to_blocks["a"])
    req.num_computed_tokens = 6
    req.append_output_token_ids([1, 2, 3])
    for m in (theirs, ours):
        m.allocate_slots(req, 3)
    a, b = held
    assert len(a) == len(b) == 3
    assert [x.block_id for x in a] == [x.block_id for x in b] == [1, 2, 3]
    assert b == a and b[-1].block_id == 3 and [x.block_id for x in b[1:]] == [2, 3]
    for m in (theirs, ours):
        m.free(req)
    assert [x.block_id for x in a] == [x.block_id for x in b] == [1, 2, 3]
