"""Adversarial input for the manager-level surface: configuration objects,
coordinators, ``KVCacheManager`` calls and the Mamba chunk rule. Each
refusal is a ``kvcoord.errors`` exception (also the builtin a caller
expects) that leaves the state exactly as it was; each accepted call keeps
the invariants. Ends with a seeded random driver mixing valid and invalid
calls over layouts the other suites do not generate (HiSparse, Mamba
"align" hybrids, MLA, R-SWA, mixed block sizes, tiny pools)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kvcoord
from kvcoord import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KVCacheManagerOptions,
    KvCoordError,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    mamba_aligned_chunk,
    mamba_chunk_rule,
)
from kvcoord._core import CoordinatorCore, CoordinatorKind
from kvcoord.config import HiSparseHotSpec, HiSparseResidentSpec
from kvcoord.coordinator import (
    CoordinatorOptions,
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from snapshot import manager_state

B = 4


def refused(
    expected: type[BaseException], state: Callable[[], Any], call: Callable[[], Any]
) -> KvCoordError:
    before = state()
    with pytest.raises(KvCoordError) as info:
        call()
    assert isinstance(info.value, expected), repr(info.value)
    assert state() == before
    return info.value


def manager(specs: list[Any], num_blocks: int, *, caching: bool = True) -> KVCacheManager:
    config = KVCacheConfig(num_blocks, tuple(KVCacheGroup(s) for s in specs))
    options = KVCacheManagerOptions(enable_caching=caching)
    return KVCacheManager(config, max_model_len=64, options=options)


# ---- HiSparse resident groups: the prediction covers the allocation ---------


@pytest.mark.parametrize(
    "specs",
    [
        [FullAttentionSpec(B), HiSparseResidentSpec(B)],
        [FullAttentionSpec(B), HiSparseResidentSpec(B), HiSparseHotSpec(B, 2)],
    ],
    ids=["resident", "resident+hot"],
)
def test_resident_group_past_its_pages_gives_none_not_a_half_allocation(specs: list[Any]) -> None:
    # 20 tokens: 5 blocks per group, 1 block left free. The scheduler then
    # moves num_computed_tokens past the blocks (23): the next token needs
    # a 6th block in both groups, 2 in all. The resident group's prediction
    # counted the computed tokens as host pages (0 blocks), so the pool ran
    # dry between the groups: OutOfBlocksError with a block taken.
    mgr = manager(specs, 12)
    req = Request("a", list(range(20)), hash_block_size=B)
    assert mgr.allocate_slots(req, 20) is not None
    req.num_computed_tokens = 20
    for _ in range(3):
        req.append_output_token_ids(5)
    req.num_computed_tokens = 23
    before = manager_state(mgr, [req])
    assert mgr.allocate_slots(req, 1) is None
    assert manager_state(mgr, [req]) == before
    mgr.check_invariants()


def test_resident_group_past_its_pages_grows_when_the_pool_has_room() -> None:
    mgr = manager([FullAttentionSpec(B), HiSparseResidentSpec(B)], 20)
    req = Request("a", list(range(20)), hash_block_size=B)
    assert mgr.allocate_slots(req, 20) is not None
    for _ in range(9):
        req.append_output_token_ids(5)
    req.num_computed_tokens = 28
    new = mgr.allocate_slots(req, 1)
    assert new is not None
    assert [len(g) for g in mgr.get_block_ids("a")] == [8, 8]
    mgr.check_invariants()


# ---- configuration objects ----------------------------------------------------


@pytest.mark.parametrize("names", [0, 3.5, None, True, object(), b"ab", "l0"])
def test_layer_names_that_are_not_a_sequence_of_str(names: Any) -> None:
    with pytest.raises(kvcoord.ConfigTypeError, match="layer_names"):
        KVCacheGroup(FullAttentionSpec(B), names)


@pytest.mark.parametrize("names", [[1], ["a", None], [b"a"]])
def test_layer_names_of_the_wrong_type(names: Any) -> None:
    with pytest.raises(kvcoord.ConfigTypeError, match="layer_names"):
        KVCacheGroup(FullAttentionSpec(B), names)


@pytest.mark.parametrize("names", [("a", "a"), ("",), ("a", "b", "a")])
def test_duplicate_or_empty_layer_names(names: tuple[str, ...]) -> None:
    with pytest.raises(kvcoord.ConfigError, match="layer_names"):
        KVCacheGroup(FullAttentionSpec(B), names)


def test_a_layer_in_two_groups() -> None:
    a = KVCacheGroup(FullAttentionSpec(B), ("l0", "l1"))
    b = KVCacheGroup(SlidingWindowSpec(B, 8), ("l2", "l1"))
    with pytest.raises(kvcoord.ConfigError, match=r"groups\[1\].*l1"):
        KVCacheConfig(10, (a, b))


def test_wrong_types_in_config_objects_are_type_errors() -> None:
    with pytest.raises(kvcoord.ConfigTypeError, match=r"KVCacheGroup\.spec"):
        KVCacheGroup("full")  # type: ignore[arg-type]
    with pytest.raises(kvcoord.ConfigTypeError, match=r"groups\[0\]"):
        KVCacheConfig(10, (FullAttentionSpec(B),))  # type: ignore[arg-type]


# ---- coordinators -------------------------------------------------------------

COORDINATORS = [
    UnitaryKVCacheCoordinator,
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
]


@pytest.mark.parametrize("cls", COORDINATORS)
@pytest.mark.parametrize("config", [None, object(), "cfg", {"num_blocks": 10}])
def test_coordinator_of_a_non_config(cls: Any, config: Any) -> None:
    with pytest.raises(kvcoord.ConfigTypeError, match="KVCacheConfig"):
        cls(config, max_model_len=64)


def test_get_kv_cache_coordinator_of_a_non_config() -> None:
    with pytest.raises(kvcoord.ConfigTypeError, match="KVCacheConfig"):
        get_kv_cache_coordinator(None, max_model_len=64, enable_caching=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", COORDINATORS)
@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"allow_partial_hits": 1}, TypeError),
        ({"context_parallel": None}, TypeError),
        ({"verify_hits": "yes"}, TypeError),
        ({"enable_events": 0}, TypeError),
        ({"group_id_base": -1}, ValueError),
        ({"group_id_base": 2**40}, ValueError),
        ({"group_id_base": "0"}, TypeError),
        ({"event_medium": None}, TypeError),
        ({"event_medium": 3}, TypeError),
    ],
)
def test_coordinator_keywords_of_the_wrong_type_or_range(
    cls: Any, kw: dict[str, Any], expected: type[BaseException]
) -> None:
    groups = (KVCacheGroup(FullAttentionSpec(B)),)
    if cls is not UnitaryKVCacheCoordinator:
        groups = (*groups, KVCacheGroup(SlidingWindowSpec(B, 8)))
    with pytest.raises(KvCoordError) as info:
        cls(KVCacheConfig(10, groups), max_model_len=64, **kw)
    assert isinstance(info.value, expected), repr(info.value)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, None),  # the control: every field as CoordinatorOptions has it
        ({"allow_partial_hits": 1}, TypeError),
        ({"verify_hits": None}, TypeError),
        ({"enable_events": "no"}, TypeError),
        ({"context_parallel": 2.0}, TypeError),
        ({"hash_block_size": "8"}, TypeError),
        ({"num_reprefillable_tokens": -1}, ValueError),
        ({"eagle_group_ids": "0"}, TypeError),
        ({"group_id_base": -1}, ValueError),
        ({"group_id_base": 2**64}, ValueError),
        ({"event_medium": b"GPU"}, TypeError),
        ({"event_medium": "gpu"}, ValueError),
        ({"retention_interval": 2**64}, ValueError),
        ({"retention_interval": "8"}, TypeError),
        ({"retention_interval": True}, TypeError),
    ],
)
def test_coordinator_core_options(kw: dict[str, Any], expected: type[BaseException] | None) -> None:
    """The core reads every option itself (an object with CoordinatorOptions'
    attributes whose values its own checks never saw) and refuses each bad
    one as a kvcoord error."""
    retention = {k: kw.pop(k) for k in list(kw) if k == "retention_interval"}
    options = SimpleNamespace(**{**asdict(CoordinatorOptions()), **kw})

    def build() -> CoordinatorCore:
        return CoordinatorCore(
            10,
            [FullAttentionSpec(B).core],
            kind=CoordinatorKind.Unitary,
            max_model_len=64,
            options=options,
            **retention,
        )

    if expected is None:
        assert build().verify_hits is True
        return
    with pytest.raises(KvCoordError) as info:
        build()
    assert isinstance(info.value, expected), repr(info.value)


def test_coordinator_core_options_missing_a_field() -> None:
    fields = asdict(CoordinatorOptions())
    del fields["verify_hits"]
    with pytest.raises(kvcoord.ArgumentTypeError, match="without verify_hits"):
        CoordinatorCore(
            10,
            [FullAttentionSpec(B).core],
            kind=CoordinatorKind.Unitary,
            max_model_len=64,
            options=SimpleNamespace(**fields),
        )


def test_coordinator_options_object_and_keywords() -> None:
    """``options=`` and the keywords name the same fields; a keyword replaces
    the object's field, and an unknown keyword is a TypeError as before."""
    config = KVCacheConfig(10, (KVCacheGroup(FullAttentionSpec(B)),))
    off = CoordinatorOptions(verify_hits=False, hash_block_size=B)
    c = UnitaryKVCacheCoordinator(config, max_model_len=64, options=off)
    assert (c.core.verify_hits, c.hash_block_size) == (False, B)
    c = UnitaryKVCacheCoordinator(config, max_model_len=64, options=off, verify_hits=True)
    assert (c.core.verify_hits, c.options.hash_block_size) == (True, B)
    assert UnitaryKVCacheCoordinator(config, max_model_len=64).core.verify_hits is True
    with pytest.raises(TypeError, match="verify_hit"):
        UnitaryKVCacheCoordinator(config, max_model_len=64, verify_hit=False)
    with pytest.raises(kvcoord.ConfigTypeError, match="CoordinatorOptions"):
        UnitaryKVCacheCoordinator(config, max_model_len=64, options={"verify_hits": False})
    with pytest.raises(kvcoord.ConfigTypeError, match="verify_hits must be a bool"):
        CoordinatorOptions(verify_hits=np.bool_(True))  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        off.verify_hits = True  # type: ignore[misc]


# ---- KVCacheManager.set_request_priority ----------------------------------------


@pytest.mark.parametrize(
    ("num_tokens", "expected"),
    [
        ("4", TypeError),
        (4.0, TypeError),
        (None, TypeError),
        (True, TypeError),
        (-1, ValueError),
        (-(2**70), ValueError),
        (2**48, ValueError),
        (2**70, ValueError),
    ],
)
def test_set_request_priority_num_tokens(num_tokens: Any, expected: type[BaseException]) -> None:
    mgr = manager([FullAttentionSpec(B), SlidingWindowSpec(B, 8)], 20)
    req = Request("a", list(range(10)), hash_block_size=B)
    assert mgr.allocate_slots(req, 10) is not None
    mgr2 = KVCacheManager(
        mgr.config, max_model_len=64, options=KVCacheManagerOptions(eviction_policy="priority")
    )
    assert mgr2.allocate_slots(req, 10) is not None
    for m in (mgr, mgr2):
        refused(
            expected,
            lambda m=m: manager_state(m, [req]),  # type: ignore[misc]
            lambda m=m: m.set_request_priority(req, 3, num_tokens),  # type: ignore[misc]
        )
    mgr2.set_request_priority(req, 3, np.int64(8))


# ---- the Mamba chunk rule -----------------------------------------------------------

GOOD = {"start": 1, "num_tokens": 10, "num_prompt_tokens": 10, "block_size": 4}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({"num_new_tokens": -5}, ValueError),
        ({"num_new_tokens": "5"}, TypeError),
        ({"num_new_tokens": 5.5}, TypeError),
        ({"num_new_tokens": True}, TypeError),
        ({"start": -3}, ValueError),
        ({"start": None}, TypeError),
        ({"num_tokens": -1}, ValueError),
        ({"num_prompt_tokens": None}, TypeError),
        ({"start": 2**70}, ValueError),
        ({"block_size": 0}, ValueError),
        ({"block_size": -4}, ValueError),
        ({"block_size": "4"}, TypeError),
        ({"hash_block_size": 0}, ValueError),
        ({"checkpoint_alignment": 0}, ValueError),
        ({"checkpoint_blocks": 1}, TypeError),
        ({"shared_prefix_boundary": -8}, ValueError),
        ({"max_chunk_tokens": -1}, ValueError),
    ],
)
def test_mamba_aligned_chunk_bad_arguments(
    kw: dict[str, Any], expected: type[BaseException]
) -> None:
    args = {"num_new_tokens": 5, **GOOD, **kw}
    n = args.pop("num_new_tokens")
    with pytest.raises(KvCoordError) as info:
        mamba_aligned_chunk(n, **args)
    assert isinstance(info.value, expected), repr(info.value)


def test_mamba_aligned_chunk_zero_checkpoint_alignment_is_refused_not_a_zero_division() -> None:
    with pytest.raises(kvcoord.InvalidArgumentError, match="checkpoint_alignment"):
        mamba_aligned_chunk(
            100,
            start=4,
            num_tokens=50,
            num_prompt_tokens=50,
            block_size=4,
            checkpoint_blocks=True,
            checkpoint_alignment=0,
        )


def test_mamba_chunk_rule_bad_arguments() -> None:
    config = KVCacheConfig(
        10,
        (KVCacheGroup(FullAttentionSpec(B)), KVCacheGroup(MambaSpec(B, mamba_cache_mode="align"))),
    )
    with pytest.raises(kvcoord.ArgumentTypeError, match="KVCacheConfig"):
        mamba_chunk_rule(None, 4)  # type: ignore[arg-type]
    for bad, expected in (("4", TypeError), (0, ValueError), (-4, ValueError), (None, TypeError)):
        with pytest.raises(KvCoordError) as info:
            mamba_chunk_rule(config, bad)  # type: ignore[arg-type]
        assert isinstance(info.value, expected)
    rule = mamba_chunk_rule(config, 4)
    assert rule is not None
    with pytest.raises(kvcoord.ArgumentTypeError):
        rule("5", start=1, num_tokens=10, num_prompt_tokens=10)  # type: ignore[arg-type]
    assert rule(np.int64(5), start=np.int32(1), num_tokens=10, num_prompt_tokens=10) == 3


# ---- a seeded random driver over many layouts ------------------------------------------

LAYOUTS: dict[str, tuple[list[Any], bool]] = {
    "full": ([FullAttentionSpec(B)], True),
    "swa": ([FullAttentionSpec(B), SlidingWindowSpec(B, 8)], True),
    "swa_wide": ([FullAttentionSpec(B), SlidingWindowSpec(B, 1000)], True),
    "local": ([FullAttentionSpec(B), ChunkedLocalAttentionSpec(B, 8)], True),
    "mamba": ([FullAttentionSpec(B), MambaSpec(B, mamba_cache_mode="align")], True),
    "mamba_mtp": (
        [FullAttentionSpec(B), MambaSpec(B, num_speculative_blocks=1, mamba_cache_mode="align")],
        True,
    ),
    "full_swa_mamba": (
        [FullAttentionSpec(B), SlidingWindowSpec(B, 8), MambaSpec(B, mamba_cache_mode="align")],
        True,
    ),
    "mla": ([MLAAttentionSpec(B), SlidingWindowMLASpec(B, 8)], True),
    "rswa": ([FullAttentionSpec(B), RSWASpec(B, 8)], True),
    "rswa_only": ([RSWASpec(B, 4)], True),
    "mixed": ([FullAttentionSpec(4), SlidingWindowSpec(8, 16)], True),
    "mixed3": (
        [FullAttentionSpec(2), SlidingWindowSpec(4, 8), ChunkedLocalAttentionSpec(8, 16)],
        True,
    ),
    "hisparse": ([FullAttentionSpec(B), HiSparseResidentSpec(B), HiSparseHotSpec(B, 2)], True),
    "hisparse_resident": ([FullAttentionSpec(B), HiSparseResidentSpec(B)], True),
    "cross": ([FullAttentionSpec(B), CrossAttentionSpec(B)], False),
    "mamba_none": ([FullAttentionSpec(B), MambaSpec(B, num_speculative_blocks=2)], False),
    "swa_only": ([SlidingWindowSpec(B, 8)], True),
    "two_full": ([FullAttentionSpec(B), FullAttentionSpec(B)], True),
}
BAD_VALUES: list[Any] = [-1, 2**48, 2**64, "3", 3.0, None, True, np.float32(1)]


def drive(seed: int, steps: int = 120) -> None:
    rng = random.Random(seed)
    name = sorted(LAYOUTS)[seed % len(LAYOUTS)]
    specs, caching = LAYOUTS[name]
    num_blocks = rng.choice([1, 2, 3, 5, 8, 13, 24])
    retention = 8 if name == "swa" and rng.random() < 0.5 else None
    config = KVCacheConfig(num_blocks, tuple(KVCacheGroup(s) for s in specs), retention)
    options = KVCacheManagerOptions(
        enable_caching=caching,
        enable_events=rng.random() < 0.5,
        residency_metrics=rng.random() < 0.3,
        eviction_policy=rng.choice(["lru", "lfu", "prefix-depth", "priority"]),
    )
    mgr = KVCacheManager(config, max_model_len=rng.choice([16, 64, 200]), options=options)
    hbs = mgr.hash_block_size
    reqs: list[Request] = []
    lookups: dict[int, tuple[Any, int]] = {}
    prefixes = [list(range(1, 17)), [9] * 8, []]
    for step in range(steps):
        if rng.random() < 0.3:
            mgr.new_step_starts()
        if rng.random() < 0.15 or not reqs:
            # Mostly fresh ids; sometimes a second live object with an old id.
            rid = f"r{len(reqs)}" if rng.random() < 0.9 or not reqs else rng.choice(reqs).request_id
            tail = [rng.randrange(50) for _ in range(rng.randrange(1, 30))]
            reqs.append(Request(rid, rng.choice(prefixes) + tail, hash_block_size=hbs))
            continue
        i = rng.randrange(len(reqs))
        req = reqs[i]
        before = manager_state(mgr, reqs)
        what: tuple[Any, ...] = ()
        try:
            op = rng.random()
            if op < 0.25:
                what = ("lookup", req.request_id)
                lookups[i] = mgr.get_computed_blocks(req)
            elif op < 0.7:
                blocks, hit = lookups.pop(i, (None, 0))
                if lookups and rng.random() < 0.2:  # another request's hits
                    blocks, hit = rng.choice(list(lookups.values()))
                rest = max(req.num_tokens - req.num_computed_tokens - hit, 0)
                n: Any = rng.choice([rest, 1, rng.randrange(rest + 2), rest + rng.randrange(5)])
                kw: dict[str, Any] = {}
                if rng.random() < 0.2:
                    kw["num_lookahead_tokens"] = rng.choice([0, 1, 3, 10, 2**47])
                if rng.random() < 0.1:
                    kw["num_encoder_tokens"] = rng.choice([0, 4, 9, 2**47])
                if rng.random() < 0.1:
                    kw["delay_cache_blocks"] = rng.choice([True, False, 1, None])
                if rng.random() < 0.05:
                    n = rng.choice(BAD_VALUES)
                if rng.random() < 0.05:
                    hit = rng.choice([*BAD_VALUES, hit + 4, max(hit - 4, 0)])
                if rng.random() < 0.1:
                    blocks = rng.choice([None, [[1]], [[]] * len(specs), "x"])
                what = ("allocate", req.request_id, n, hit, blocks, kw)
                new = mgr.allocate_slots(req, n, hit, blocks, **kw)
                if new is not None and rng.random() < 0.9:
                    req.num_computed_tokens = min(req.num_computed_tokens + hit + n, req.num_tokens)
                    if req.num_computed_tokens == req.num_tokens and req.num_tokens < 190:
                        req.append_output_token_ids(rng.randrange(60))
            elif op < 0.8:
                what = ("free", req.request_id)
                mgr.free(req)
                if rng.random() < 0.8:
                    req.num_computed_tokens = 0
            elif op < 0.84:
                what = ("reset",)
                mgr.reset_prefix_cache()
            elif op < 0.88:
                what = ("priority",)
                mgr.set_request_priority(
                    req, rng.choice([0, 3, 7, 8, -1]), rng.choice([0, 4, 100, -1, 2**60])
                )
            elif op < 0.92:
                what = ("common prefix",)
                mgr.get_num_common_prefix_blocks(req.request_id)
            elif op < 0.95:
                what = ("evict",)
                mgr.evict_blocks([rng.randrange(num_blocks + 2)])
            elif op < 0.97:
                what = ("cache_blocks",)
                mgr.cache_blocks(req, rng.choice([0, 4, req.num_computed_tokens, 10**6, -1]))
            else:
                what = ("inspect",)
                mgr.take_events()
                _ = mgr.usage
                mgr.make_prefix_cache_stats()
                mgr.advance_eviction_clock(1)
                mgr.set_residency_clock(step)
                mgr.residency_snapshot()
                mgr.drain_eviction_records()
        except KvCoordError as e:
            assert manager_state(mgr, reqs) == before, (seed, name, step, what, e)
        mgr.check_invariants()


@pytest.mark.parametrize("seed", range(60))
def test_random_valid_and_invalid_calls(seed: int) -> None:
    drive(seed)


@pytest.mark.parametrize(
    "kw",
    [
        {"num_new_computed_tokens": None},
        {"num_lookahead_tokens": None},
        {"num_encoder_tokens": None},
        {"delay_cache_blocks": None},
        {"num_lookahead_tokens": 1.0},
        {"delay_cache_blocks": 0},
    ],
)
def test_allocate_slots_none_for_a_count_or_flag_is_a_type_error(kw: dict[str, Any]) -> None:
    # `None` used to stand for the omitted default (0 / False) and was taken
    # silently; the signature says int / bool.
    mgr = manager([FullAttentionSpec(B), SlidingWindowSpec(B, 8)], 20)
    req = Request("a", list(range(10)), hash_block_size=B)
    err = refused(
        kvcoord.ArgumentTypeError,
        lambda: manager_state(mgr, [req]),
        lambda: mgr.allocate_slots(req, 10, **kw),
    )
    assert next(iter(kw)) in str(err)
    assert mgr.allocate_slots(req, 10) is not None


@pytest.mark.parametrize("layout", ["full", "swa", "mamba", "hisparse"])
def test_lookup_of_a_request_without_tokens_is_an_empty_hit(layout: str) -> None:
    # Its bound used to be num_tokens - 1 = -1: "invalid max_length: -1".
    specs, _ = LAYOUTS[layout]
    mgr = manager(specs, 20)
    req = Request("e", [], hash_block_size=mgr.hash_block_size)
    before = manager_state(mgr, [req])
    blocks, hit = mgr.get_computed_blocks(req)
    assert hit == 0 and not any(blocks.get_block_ids())
    assert manager_state(mgr, [req]) == before


@pytest.mark.parametrize("request_arg", [None, "r", 3])
def test_coordinator_lookup_of_a_non_request(request_arg: Any) -> None:
    mgr = manager([FullAttentionSpec(B), SlidingWindowSpec(B, 8)], 20)
    with pytest.raises(kvcoord.ArgumentTypeError, match=r"kvcoord\.Request"):
        mgr.coordinator.find_longest_cache_hit(request_arg, 8)
    with pytest.raises(kvcoord.ArgumentTypeError, match=r"kvcoord\.Request"):
        mgr.coordinator.core.find_longest_cache_hit([0], request_arg, 8, 4)


def test_coordinator_core_lookup_drop_eagle_must_be_a_bool() -> None:
    mgr = manager([FullAttentionSpec(B)], 20)
    req = Request("r", list(range(9)), hash_block_size=B)
    with pytest.raises(kvcoord.ArgumentTypeError, match="drop_eagle"):
        mgr.coordinator.core.find_longest_cache_hit([0], req, 8, 4, drop_eagle=1)


@pytest.mark.parametrize("caching", [True, False])
def test_hot_region_of_an_admission_without_resident_groups_is_predicted(caching: bool) -> None:
    # No resident group: a new request that adopts its lookup's (empty) hit
    # gets its whole hot region (8 blocks) at admission. The prediction
    # counted none of it: 2 + 0 <= 9 free, then the hot group ran out after
    # the full-attention group took its 2 blocks (OutOfBlocksError, state
    # changed). Now the step does not fit: None, nothing changed.
    mgr = manager([FullAttentionSpec(B), HiSparseHotSpec(B, 8)], 10, caching=caching)
    req = Request("a", list(range(8)), hash_block_size=mgr.hash_block_size)
    blocks, hit = mgr.get_computed_blocks(req)
    before = manager_state(mgr, [req])
    assert mgr.allocate_slots(req, 8 - hit, hit, blocks) is None
    assert manager_state(mgr, [req]) == before
    mgr.check_invariants()
    # With room for both groups it is admitted with its region.
    roomy = manager([FullAttentionSpec(B), HiSparseHotSpec(B, 8)], 11, caching=caching)
    blocks, hit = roomy.get_computed_blocks(req)
    assert roomy.allocate_slots(req, 8 - hit, hit, blocks) is not None
    assert [len(g) for g in roomy.get_block_ids("a")] == [2, 8]
    roomy.check_invariants()


class _RaisingIndex:
    def __index__(self) -> int:
        raise RuntimeError("no index")


class _StrIndex:
    def __index__(self) -> Any:
        return "3"


def test_a_broken_index_is_not_an_int_not_out_of_range() -> None:
    # Such an object used to be refused as "must be below 2^64".
    mgr = manager([FullAttentionSpec(B)], 20)
    req = Request("a", list(range(10)), hash_block_size=B)
    bad = _StrIndex()
    for call in (
        lambda: mgr.allocate_slots(req, bad),
        lambda: mgr.allocate_slots(req, 4, num_lookahead_tokens=bad),
    ):
        err = refused(kvcoord.ArgumentTypeError, lambda: manager_state(mgr, [req]), call)
        assert "must be an int" in str(err)


def test_an_index_that_raises_passes_its_own_exception_on() -> None:
    # The caller's own exception, as Python's conversions pass it on (the
    # README's "Bad input and limits"), with nothing changed.
    mgr = manager([FullAttentionSpec(B)], 20)
    req = Request("a", list(range(10)), hash_block_size=B)
    bad = _RaisingIndex()
    for call in (
        lambda: mgr.allocate_slots(req, bad),
        lambda: mgr.allocate_slots(req, 4, num_lookahead_tokens=bad),
    ):
        before = manager_state(mgr, [req])
        with pytest.raises(RuntimeError, match="no index"):
            call()
        assert manager_state(mgr, [req]) == before
        mgr.check_invariants()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("r", 4), TypeError),
        ((None, 4), TypeError),
        (("req", "4"), TypeError),
        (("req", -1), ValueError),
        (("unknown", 4), KeyError),
    ],
)
def test_cache_blocks_checks_its_arguments_with_caching_off(
    args: tuple[Any, Any], expected: type[BaseException]
) -> None:
    # With caching off the call used to return before anything was checked.
    mgr = manager([FullAttentionSpec(B), MambaSpec(B)], 20, caching=False)
    req = Request("a", list(range(10)), hash_block_size=B)
    assert mgr.allocate_slots(req, 10) is not None
    objects = {"req": req, "unknown": Request("u", [1, 2], hash_block_size=B)}
    target = objects.get(args[0], args[0]) if isinstance(args[0], str) else args[0]
    refused(expected, lambda: manager_state(mgr, [req]), lambda: mgr.cache_blocks(target, args[1]))
    mgr.cache_blocks(req, 8)  # a no-op


@pytest.mark.parametrize("mode", [None, 1, ["align"], b"align"])
def test_mamba_cache_mode_of_the_wrong_type(mode: Any) -> None:
    with pytest.raises(kvcoord.ConfigTypeError, match="mamba_cache_mode"):
        MambaSpec(B, mamba_cache_mode=mode)
