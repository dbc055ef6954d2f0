"""Generated bad input for every public call (issue 11): out-of-range,
wrong-typed and adversarial arguments. Each call must raise a
``kvcoord.errors`` exception that is also the builtin a caller expects, and
leave a full state snapshot (``tests/snapshot.py``) unchanged.

A longer run: ``HYPOTHESIS_PROFILE=long kvdev pytest tests/test_bad_input_fuzz.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import kvcoord
from kvcoord import (
    BlockPool,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KvCoordError,
    MambaSpec,
    Request,
    SlidingWindowSpec,
)
from snapshot import manager_state, pool_state, request_state

settings.register_profile(
    "long", max_examples=5000, suppress_health_check=[HealthCheck.too_slow], deadline=None
)
settings.register_profile(
    "bad_input", max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "bad_input"))

B = 4

#: Ints no count or id accepts (negative, or beyond 64 bits).
never_ints = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**64),
    st.sampled_from([-1, -(2**63), -(2**63) - 1, 2**64, 2**100]),
)
#: Ints that fit 64 bits but no pool or model could use.
huge_ints = st.sampled_from([2**48, 2**62, 2**63, 2**64 - 1, 6148914691236517206])
#: Values of the wrong type where an int is expected.
not_ints = st.sampled_from([None, "3", 3.0, 2.5, b"\x01", [1], {}, object(), 1j, np.float32(1)])
#: Block ids beyond any pool, or of the wrong type.
bad_ids = st.one_of(never_ints, huge_ints, st.integers(100, 2**32 - 1))


def raises(
    expected: type[BaseException], state: Callable[[], Any], call: Callable[[], Any]
) -> None:
    """``call`` raises a KvCoordError that is also ``expected``; ``state()``
    is unchanged."""
    before = state()
    with pytest.raises(KvCoordError) as info:
        call()
    assert isinstance(info.value, expected), repr(info.value)
    assert state() == before


def busy_pool() -> BlockPool:
    pool = BlockPool(16, hash_block_size=B)
    ids = pool.get_new_blocks(6)
    hashes = [bytes([i]) * 32 for i in range(1, 4)]
    pool.cache_full_blocks(ids, hashes, 0, 3, 0)
    pool.free_blocks(ids[:2][::-1])
    return pool


LAYOUTS = {
    "full": ((FullAttentionSpec(B),), True),
    "swa": ((FullAttentionSpec(B), SlidingWindowSpec(B, 8)), True),
    "local": ((FullAttentionSpec(B), ChunkedLocalAttentionSpec(B, 8)), True),
    "enc": ((FullAttentionSpec(B), CrossAttentionSpec(B), MambaSpec(B)), False),
}


def busy_manager(layout: str) -> tuple[KVCacheManager, list[Request]]:
    specs, caching = LAYOUTS[layout]
    mgr = KVCacheManager(
        KVCacheConfig(40, tuple(KVCacheGroup(s) for s in specs)),
        max_model_len=512,
        options=kvcoord.KVCacheManagerOptions(enable_caching=caching),
    )
    reqs = []
    for i, toks in enumerate([list(range(13)), [*list(range(9)), 50], [7] * 6]):
        r = Request(f"r{i}", toks, hash_block_size=B)
        blocks, hit = mgr.get_computed_blocks(r)
        assert mgr.allocate_slots(r, r.num_tokens - hit, hit, blocks, num_encoder_tokens=4)
        r.num_computed_tokens = r.num_tokens
        reqs.append(r)
    mgr.free(reqs.pop(1))  # leaves cached, evictable blocks
    return mgr, reqs


# ---- BlockPool ----------------------------------------------------------------


@given(n=st.one_of(never_ints, huge_ints, not_ints), which=st.sampled_from(["list", "array"]))
def test_pool_get_new_blocks(n: Any, which: str) -> None:
    pool = busy_pool()
    call = pool.get_new_blocks if which == "list" else pool.get_new_blocks_array
    expected = ValueError if isinstance(n, int) else TypeError
    raises(expected, lambda: pool_state(pool), lambda: call(n))


id_containers = st.sampled_from(["list", "tuple", "gen", "<i8", "<u8", ">i8"])


@given(
    bad=st.one_of(bad_ids, not_ints),
    good=st.lists(st.integers(1, 15), max_size=4),
    container=id_containers,
    op=st.sampled_from(["free_blocks", "touch", "evict_blocks"]),
)
def test_pool_block_id_arguments(bad: Any, good: list[int], container: str, op: str) -> None:
    pool = busy_pool()
    ids = [*good, bad]
    if container in ("<i8", "<u8", ">i8"):
        if (
            not isinstance(bad, int)
            or not np.iinfo(np.dtype(container)).min <= bad <= np.iinfo(np.dtype(container)).max
        ):
            return
        arg: Any = np.array(ids, dtype=container)
    elif container == "tuple":
        arg = tuple(ids)
    elif container == "gen":
        arg = (x for x in ids)
    else:
        arg = ids
    expected = ValueError if isinstance(bad, int) else TypeError
    raises(expected, lambda: pool_state(pool), lambda: getattr(pool, op)(arg))


@given(
    field=st.sampled_from(["num_cached", "num_full", "group", "hash", "mask"]),
    bad=st.one_of(never_ints, huge_ints, not_ints),
)
def test_pool_cache_full_blocks(field: str, bad: Any) -> None:
    pool = busy_pool()
    ids = pool.get_new_blocks(2)
    args: dict[str, Any] = {
        "num_cached": 0,
        "num_full": 2,
        "group": 0,
        "hash": [b"\x09" * 32, b"\x0a" * 32],
        "mask": None,
    }
    args[field] = bad if field != "hash" else [b"\x09" * 32, bad]
    if field == "mask":
        args["mask"] = [True, bad]
    if field == "num_cached" and isinstance(bad, int) and bad >= 2:
        return  # nothing newly full: a no-op, as in vLLM
    expected = (
        TypeError
        if not isinstance(bad, int) and field in ("num_cached", "num_full", "group")
        else ValueError
    )
    if field in ("hash", "mask"):
        expected = (TypeError, ValueError)  # type: ignore[assignment]
    raises(
        expected,
        lambda: pool_state(pool),
        lambda: pool.cache_full_blocks(
            ids, args["hash"], args["num_cached"], args["num_full"], args["group"], args["mask"]
        ),
    )


@given(bad=st.one_of(never_ints, huge_ints, not_ints))
def test_pool_block_hash_and_lookup(bad: Any) -> None:
    pool = busy_pool()
    expected = ValueError if isinstance(bad, int) else TypeError
    raises(expected, lambda: pool_state(pool), lambda: pool.block_hash(bad))
    raises(
        (TypeError, ValueError),  # type: ignore[arg-type]
        lambda: pool_state(pool),
        lambda: pool.get_cached_block(b"\x01" * 32, [bad]),
    )


@given(
    field=st.sampled_from(["num_blocks", "hash_block_size", "enable_caching", "enable_events"]),
    bad=st.one_of(never_ints, huge_ints, not_ints, st.sampled_from(["no", 1, 0])),
)
def test_pool_constructor(field: str, bad: Any) -> None:
    if field in ("num_blocks", "hash_block_size") and isinstance(bad, int) and 0 < bad < 2**32 - 2:
        return
    if field == "hash_block_size" and isinstance(bad, int) and 0 < bad < 2**32:
        return
    if bad is None:
        return  # None stands for the default
    kw: dict[str, Any] = {"num_blocks": 10, field: bad}
    with pytest.raises(KvCoordError) as info:
        BlockPool(**kw)
    expected = TypeError if not isinstance(bad, int) or field.startswith("enable") else ValueError
    assert isinstance(info.value, expected), repr(info.value)


# ---- KVCacheManager -------------------------------------------------------------


@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    arg=st.sampled_from(
        ["num_new_tokens", "num_new_computed_tokens", "num_lookahead_tokens", "num_encoder_tokens"]
    ),
    bad=st.one_of(never_ints, huge_ints, not_ints),
    running=st.booleans(),
)
def test_manager_allocate_slots_counts(layout: str, arg: str, bad: Any, running: bool) -> None:
    mgr, reqs = busy_manager(layout)
    if bad is None and arg != "num_new_tokens":
        return  # None stands for the default (0)
    r = reqs[0] if running else Request("new", list(range(6)), hash_block_size=B)
    if running:
        r.append_output_token_ids(3)
    kw: dict[str, Any] = {"num_new_tokens": 1}
    kw[arg] = bad
    state = lambda: manager_state(mgr, [*reqs, r])  # noqa: E731
    before = state()
    try:
        result = mgr.allocate_slots(r, **kw)
    except KvCoordError as e:
        expected = ValueError if isinstance(bad, int) else TypeError
        assert isinstance(e, expected), repr(e)
    else:
        # A huge count the pool cannot hold may also be "no room" (None).
        assert result is None, (arg, bad)
    if not running:
        assert state() == before
    mgr.check_invariants()


@given(
    layout=st.sampled_from(sorted(LAYOUTS)),
    hits=st.lists(st.lists(st.one_of(st.integers(0, 45), bad_ids), max_size=5), max_size=4),
    as_blocks=st.booleans(),
    hit=st.integers(0, 12),
)
def test_manager_adversarial_hits(
    layout: str, hits: list[list[int]], as_blocks: bool, hit: int
) -> None:
    mgr, reqs = busy_manager(layout)
    r = Request("new", [*list(range(13)), 99], hash_block_size=B)
    honest, honest_hit = mgr.get_computed_blocks(r)
    if hits == honest.get_block_ids() and hit == honest_hit:
        return
    arg: Any = hits
    if as_blocks:
        try:
            arg = KVCacheBlocks(hits)
        except KvCoordError:
            return
    state = lambda: manager_state(mgr, [*reqs, r])  # noqa: E731
    before = state()
    try:
        result = mgr.allocate_slots(r, r.num_tokens - hit, hit, arg)
    except KvCoordError as e:
        assert isinstance(e, ValueError | TypeError), repr(e)
        assert state() == before
    else:
        # Accepted only if every adopted block really holds this prefix.
        if result is not None and LAYOUTS[layout][1]:
            pool = mgr.block_pool
            for g, ids in enumerate(mgr.get_block_ids("new")):
                for i, b in enumerate(ids[: hit // B]):
                    assert b == 0 or pool.block_hash(b) == (r.block_hashes[i], g)
    mgr.check_invariants()


@given(
    bad=st.one_of(not_ints, st.sampled_from(["nope", 0])),
    call=st.sampled_from(
        ["free", "get_computed_blocks", "allocate_slots", "cache_blocks", "get_block_ids"]
    ),
)
def test_manager_request_arguments(bad: Any, call: str) -> None:
    mgr, reqs = busy_manager("swa")
    state = lambda: manager_state(mgr, reqs)  # noqa: E731
    calls = {
        "free": lambda: mgr.free(bad),
        "get_computed_blocks": lambda: mgr.get_computed_blocks(bad),
        "allocate_slots": lambda: mgr.allocate_slots(bad, 1),
        "cache_blocks": lambda: mgr.cache_blocks(bad, 4),
        "get_block_ids": lambda: mgr.get_block_ids(bad),
    }
    if call == "get_block_ids" and isinstance(bad, str):
        raises(KeyError, state, calls[call])
        return
    raises(TypeError, state, calls[call])


@given(
    field=st.sampled_from(
        ["max_model_len", "hash_block_size", "enable_caching", "enable_events", "log_stats"]
    ),
    bad=st.one_of(never_ints, huge_ints, not_ints, st.sampled_from(["no", 1, 0])),
)
def test_manager_constructor(field: str, bad: Any) -> None:
    valid = isinstance(bad, int) and 0 < bad < 2**48
    if valid and (field == "max_model_len" or (field == "hash_block_size" and bad in (1, 2, 4))):
        return
    if field == "hash_block_size" and bad is None:
        return  # None picks the default
    config = KVCacheConfig(10, (KVCacheGroup(FullAttentionSpec(B)),))
    with pytest.raises(KvCoordError) as info:
        if field == "max_model_len":
            KVCacheManager(config, max_model_len=bad)
        else:
            options = kvcoord.KVCacheManagerOptions(**{field: bad})
            KVCacheManager(config, max_model_len=100, options=options)
    expected = (
        TypeError
        if not isinstance(bad, int) or field in ("enable_caching", "enable_events", "log_stats")
        else ValueError
    )
    assert isinstance(info.value, expected), repr(info.value)


# ---- Request and hashing ----------------------------------------------------------


@given(
    bad=st.one_of(
        never_ints,
        st.integers(2**32, 2**64),
        not_ints.filter(lambda v: v is not None and not isinstance(v, list | bytes | dict)),
    ),
    where=st.integers(0, 5),
    form=st.sampled_from(["list", "tuple", "scalar", "gen"]),
)
def test_request_tokens(bad: Any, where: int, form: str) -> None:
    r = Request("a", [1, 2, 3, 4, 5], hash_block_size=B)
    toks = [9] * where + [bad]
    arg: Any = {"list": toks, "tuple": tuple(toks), "scalar": bad, "gen": (t for t in toks)}[form]
    expected = ValueError if isinstance(bad, int) else TypeError
    raises(expected, lambda: request_state(r), lambda: r.append_output_token_ids(arg))
    with pytest.raises(KvCoordError) as info:
        Request("b", toks, hash_block_size=B)
    assert isinstance(info.value, expected)
    with pytest.raises(KvCoordError):
        kvcoord.compute_block_hashes(toks, hash_block_size=B)


@given(bad=st.one_of(never_ints, not_ints, st.just(0)))
def test_request_numbers(bad: Any) -> None:
    r = Request("a", [1, 2, 3, 4, 5], hash_block_size=B)
    if bad != 0:
        expected = ValueError if isinstance(bad, int) else TypeError
        raises(expected, lambda: request_state(r), lambda: setattr(r, "num_computed_tokens", bad))
    with pytest.raises(KvCoordError):
        Request("b", [1], hash_block_size=bad)
    with pytest.raises(KvCoordError):
        kvcoord.compute_block_hashes([1, 2], hash_block_size=bad)


@given(algo=st.text(max_size=12).filter(lambda a: a not in kvcoord.HASH_ALGOS))
def test_unknown_hash_algorithms(algo: str) -> None:
    with pytest.raises(KvCoordError) as info:
        kvcoord.none_hash(algo)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    with pytest.raises(KvCoordError):
        Request("a", [1], hash_block_size=B, hash_algo=algo)  # type: ignore[arg-type]


# ---- KVCacheBlocks, specs and config ------------------------------------------------


@given(bad=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**31), not_ints))
def test_kv_cache_blocks_constructors(bad: Any) -> None:
    with pytest.raises(KvCoordError if isinstance(bad, int) else TypeError):
        KVCacheBlocks.from_lists([[1, 2], [bad]])


SPECS: dict[str, Callable[[Any], object]] = {
    "full.block_size": lambda v: FullAttentionSpec(v),
    "swa.block_size": lambda v: SlidingWindowSpec(v, 8),
    "swa.sliding_window": lambda v: SlidingWindowSpec(4, v),
    "local.attention_chunk_size": lambda v: ChunkedLocalAttentionSpec(4, v),
    "mamba.num_speculative_blocks": lambda v: MambaSpec(4, v),
    "cross.block_size": lambda v: CrossAttentionSpec(v),
    "config.num_blocks": lambda v: KVCacheConfig(v, (KVCacheGroup(FullAttentionSpec(4)),)),
    "config.retention": lambda v: KVCacheConfig(
        10, (KVCacheGroup(FullAttentionSpec(4)), KVCacheGroup(SlidingWindowSpec(4, 8))), v
    ),
}


@given(field=st.sampled_from(sorted(SPECS)), bad=st.one_of(never_ints, huge_ints, not_ints))
def test_specs_and_config(field: str, bad: Any) -> None:
    if field == "config.retention" and (bad is None or (isinstance(bad, int) and 0 < bad < 2**63)):
        return  # None is dense caching; a huge interval is valid, if useless
    if field == "mamba.num_speculative_blocks" and isinstance(bad, int) and 0 <= bad < 2**32:
        return
    with pytest.raises(KvCoordError) as info:
        SPECS[field](bad)
    expected = ValueError if isinstance(bad, int) else TypeError
    assert isinstance(info.value, expected), repr(info.value)
