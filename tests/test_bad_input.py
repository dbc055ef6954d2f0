"""Regression tests for issue 11, one per reported example, grouped by class:
every bad input raises a ``kvcoord.errors`` exception that is also the
builtin a caller expects, and leaves all state exactly as it was
(``tests/snapshot.py``). The generated bad-input suite is
``test_bad_input_fuzz.py``; threads are ``test_bad_input_threads.py``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import kvcoord
from kvcoord import (
    BlockPool,
    ConfigError,
    CrossAttentionSpec,
    FullAttentionSpec,
    InvalidArgumentError,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KvCoordError,
    Request,
    SlidingWindowSpec,
)
from snapshot import manager_state, pool_state

B = 4


def manager(*specs: object, num_blocks: int = 20, **kw: object) -> KVCacheManager:
    groups = tuple(KVCacheGroup(s) for s in (specs or (FullAttentionSpec(B),)))  # type: ignore[arg-type]
    fields = ("enable_caching", "hash_block_size", "enable_events", "log_stats")
    options = kvcoord.KVCacheManagerOptions(**{k: kw.pop(k) for k in fields if k in kw})  # type: ignore[arg-type]
    kw = {"max_model_len": 1000, **kw}
    return KVCacheManager(KVCacheConfig(num_blocks, groups), options=options, **kw)  # type: ignore[arg-type]


def req(rid: str, tokens: object, hbs: int = B) -> Request:
    return Request(rid, tokens, hash_block_size=hbs)  # type: ignore[arg-type]


def admit(mgr: KVCacheManager, r: Request) -> None:
    blocks, hit = mgr.get_computed_blocks(r)
    assert mgr.allocate_slots(r, r.num_tokens - hit, hit, blocks) is not None
    r.num_computed_tokens = r.num_tokens


def refused(
    exc: type[BaseException], builtin: type[BaseException], state: object, call: object
) -> str:
    """Run ``call``; it must raise ``exc`` (a KvCoordError and ``builtin``)
    and leave ``state()`` unchanged. Returns the message."""
    before = state()  # type: ignore[operator]
    with pytest.raises(exc) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, KvCoordError), repr(info.value)
    assert isinstance(info.value, builtin), repr(info.value)
    assert state() == before  # type: ignore[operator]
    return str(info.value)


# ---- class 1: unchecked arithmetic ---------------------------------------


def test_encoder_tokens_that_wrap_the_block_sum_are_refused() -> None:
    # Three cross-attention groups of block size 1: 3 * 6148914691236517206
    # wraps to 2 in 64 bits, so an unchecked sum "fits" a 20-block pool.
    mgr = manager(
        FullAttentionSpec(1), *(CrossAttentionSpec(1) for _ in range(3)), enable_caching=False
    )
    r = req("a", [1, 2, 3], hbs=1)
    state = lambda: manager_state(mgr, [r])  # noqa: E731
    before = state()
    result = None
    try:
        result = mgr.allocate_slots(r, 3, num_encoder_tokens=6148914691236517206)
    except KvCoordError as e:
        assert isinstance(e, ValueError)
    assert result is None
    assert state() == before
    mgr.check_invariants()
    # The next request inherits nothing.
    r2 = req("b", [1, 2, 3], hbs=1)
    new = mgr.allocate_slots(r2, 3, num_encoder_tokens=2)
    assert new is not None and [len(g) for g in new.get_block_ids()] == [3, 2, 2, 2]
    mgr.check_invariants()


def test_max_model_len_beyond_the_supported_range_is_a_config_error() -> None:
    for bad in (2**64 - 1, 2**63, 2**49):
        with pytest.raises(ConfigError):
            manager(max_model_len=bad)


def test_huge_computed_counts_are_refused_not_wrapped() -> None:
    mgr = manager(max_model_len=2**40)
    r = req("a", list(range(9)))
    state = lambda: manager_state(mgr, [r])  # noqa: E731
    for n in (2**64 - 3, 2**63, 2**48):
        refused(
            InvalidArgumentError,
            ValueError,
            state,
            lambda n=n: mgr.allocate_slots(r, 3, num_new_computed_tokens=n),
        )
    # The request's own counts are token counts too: refused when set.
    with pytest.raises(InvalidArgumentError, match="num_computed_tokens"):
        r.num_computed_tokens = 2**63 - 1
    assert r.num_computed_tokens == 0
    assert mgr.num_running_requests == 0


# ---- class 2: integers outside the supported range -------------------------


@pytest.mark.parametrize("bad", [2**63, 2**64, -(2**63) - 1, 2**100])
def test_free_blocks_with_a_huge_id(bad: int) -> None:
    pool = BlockPool(10)
    ids = pool.get_new_blocks(3)
    msg = refused(
        kvcoord.InvalidBlockIdError,
        ValueError,
        lambda: pool_state(pool),
        lambda: pool.free_blocks([*ids, bad]),
    )
    assert str(bad) in msg


@pytest.mark.parametrize("call", ["get_new_blocks", "get_new_blocks_array"])
@pytest.mark.parametrize("bad", [2**63, 2**64, -1, -(2**70)])
def test_pool_counts_out_of_range(call: str, bad: int) -> None:
    pool = BlockPool(10)
    # Beyond the pool (2**63) is OutOfBlocksError; not a count at all is
    # InvalidArgumentError naming the argument.
    msg = refused(
        ValueError, ValueError, lambda: pool_state(pool), lambda: getattr(pool, call)(bad)
    )
    assert "num_blocks" in msg or "blocks" in msg


def test_block_size_beyond_32_bits_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="block_size"):
        FullAttentionSpec(2**32)
    with pytest.raises(ConfigError, match="sliding_window"):
        SlidingWindowSpec(4, 2**40)


def test_zero_hash_block_size_with_two_groups_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="hash_block_size"):
        manager(FullAttentionSpec(B), SlidingWindowSpec(B, 8), hash_block_size=0)


@pytest.mark.parametrize("bad", [None, "a", 3, object()])
def test_manager_free_of_a_non_request(bad: object) -> None:
    mgr = manager()
    r = req("a", list(range(9)))
    admit(mgr, r)
    refused(TypeError, TypeError, lambda: manager_state(mgr, [r]), lambda: mgr.free(bad))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [2**64, -1, 2**70])
def test_manager_int_arguments_out_of_range(bad: int) -> None:
    mgr = manager()
    r = req("a", list(range(9)))
    state = lambda: manager_state(mgr, [r])  # noqa: E731
    for kw in ("num_new_tokens", "num_lookahead_tokens", "num_encoder_tokens"):
        args = {"num_new_tokens": 9, kw: bad}
        msg = refused(
            InvalidArgumentError, ValueError, state, lambda a=args: mgr.allocate_slots(r, **a)
        )
        assert kw in msg
    with pytest.raises(InvalidArgumentError, match="num_computed_tokens"):
        r.num_computed_tokens = bad


def test_big_pool_sizes_are_config_errors() -> None:
    for bad in (2**32, 2**63, 2**64, 2**70):
        with pytest.raises(ConfigError, match="num_blocks"):
            BlockPool(bad)


# ---- class 3: memory exhaustion ----------------------------------------------


_UNDER_LIMIT = """
import resource, numpy as np, kvcoord
resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, resource.RLIM_INFINITY))
for make in (
    lambda: kvcoord.BlockPool(2**32 - 3),
    lambda: kvcoord.Request("r", np.broadcast_to(np.uint32(1), (2**33,)), hash_block_size=16),
    lambda: kvcoord.Request("r", [1], hash_block_size=16).append_output_token_ids(
        np.broadcast_to(np.int64(1), (2**33,))
    ),
):
    try:
        make()
    except MemoryError as e:
        assert isinstance(e, kvcoord.KvCoordError), repr(e)
        print("MemoryError:", e)
    else:
        raise SystemExit("no MemoryError")
pool = kvcoord.BlockPool(10)
assert pool.num_free_blocks == 9
print("ok")
"""


def test_allocation_failure_is_memory_error_not_abort() -> None:
    # Under an address-space limit, pool metadata and token buffers sized by
    # the caller cannot be reserved: MemoryError, and the process lives on.
    import os
    import subprocess
    import sys

    pytest.importorskip("resource")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("MemoryError:") == 3 and out.stdout.endswith("ok\n")


# ---- class 4: untrusted hits -------------------------------------------------


def _two_requests() -> tuple[KVCacheManager, Request, Request]:
    mgr = manager()
    a = req("a", list(range(9)))  # blocks 1, 2 cached, 3 partial
    admit(mgr, a)
    b = req("b", list(range(100, 109)))
    return mgr, a, b


@pytest.mark.parametrize(
    "hits",
    [
        [[1, 2]],  # cached, but for another prefix
        [[0, 2]],  # null block at a position full attention never skips
        [[3, 4]],  # another request's half-written block, then a free one
        [[5, 6]],  # free blocks that were never cached
        [[1, 1]],  # the same block twice
    ],
)
def test_hits_that_do_not_match_the_request_are_refused(hits: list[list[int]]) -> None:
    mgr, a, b = _two_requests()
    state = lambda: manager_state(mgr, [a, b])  # noqa: E731
    refused(
        InvalidArgumentError,
        ValueError,
        state,
        lambda: mgr.allocate_slots(b, 1, 8, KVCacheBlocks(hits)),
    )
    mgr.check_invariants()


def test_hits_of_the_same_prefix_are_accepted_and_a_wrong_order_is_not() -> None:
    mgr, a, _ = _two_requests()
    c = req("c", [*list(range(9)), 50])
    state = lambda: manager_state(mgr, [a, c])  # noqa: E731
    refused(
        InvalidArgumentError,
        ValueError,
        state,
        lambda: mgr.allocate_slots(c, 2, 8, KVCacheBlocks([[2, 1]])),
    )
    blocks, hit = mgr.get_computed_blocks(c)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    assert mgr.allocate_slots(c, 2, 8, blocks) is not None
    mgr.check_invariants()


def test_null_hits_only_where_the_window_skips() -> None:
    mgr = manager(FullAttentionSpec(B), SlidingWindowSpec(B, 4))
    a = req("a", list(range(17)))
    admit(mgr, a)
    b = req("b", [*list(range(17)), 9])
    blocks, hit = mgr.get_computed_blocks(b)
    full, swa = blocks.get_block_ids()
    assert hit == 16 and swa[0] == 0
    assert swa[:3] == [0, 0, 0] and swa[3] != 0
    bad = KVCacheBlocks([full, [*swa[:3], 0]])  # null inside the window
    refused(
        InvalidArgumentError,
        ValueError,
        lambda: manager_state(mgr, [a, b]),
        lambda: mgr.allocate_slots(b, 2, hit, bad),
    )
    assert mgr.allocate_slots(b, 2, hit, blocks) is not None
    mgr.check_invariants()


def test_free_head_blocks_as_hits_are_refused_by_kvcoords_own_manager() -> None:
    # vLLM's test_cache_hit_local_and_external* shape: free, never cached
    # blocks from the head of the free queue as hits of a full and a
    # sliding-window group, then external tokens. kvcoord.vllm adopts them
    # as vLLM does (verify_hits off, tests/kvcoord_vllm/
    # test_foreign_hits_vs_vllm.py); kvcoord's own manager keeps verifying.
    mgr = manager(FullAttentionSpec(B), SlidingWindowSpec(B, 400), num_blocks=31)
    assert mgr.coordinator.core.verify_hits
    head = [int(b) for b in mgr.block_pool.free_block_ids()[:10]]
    r = req("r", [0] * (8 * B))
    message = refused(
        InvalidArgumentError,
        ValueError,
        lambda: manager_state(mgr, [r]),
        lambda: mgr.allocate_slots(
            r, B, 5 * B, KVCacheBlocks([head[:5], head[5:]]), num_external_computed_tokens=2 * B
        ),
    )
    assert "not cached for this request's prefix" in message
    mgr.check_invariants()


def test_verify_hits_is_a_coordinator_option() -> None:
    config = KVCacheConfig(20, (KVCacheGroup(FullAttentionSpec(B)),))
    on = kvcoord.coordinator.get_kv_cache_coordinator(
        config, max_model_len=100, enable_caching=True
    )
    off = kvcoord.coordinator.get_kv_cache_coordinator(
        config, max_model_len=100, enable_caching=True, verify_hits=False
    )
    assert on.core.verify_hits and not off.core.verify_hits
    with pytest.raises(TypeError):
        kvcoord.coordinator.get_kv_cache_coordinator(
            config, max_model_len=100, enable_caching=True, verify_hits=1
        )
    # Off, free uncached blocks are adopted (each gains a reference) and
    # what the tables cannot hold is still refused.
    r = req("r", list(range(13)))
    hits = KVCacheBlocks([[5, 6]])
    assert off.core.allocate_slots(r, 5, 8, hits) is not None
    assert off.core.blocks(r.request_id).get_block_ids()[0][:2] == [5, 6]
    off.core.check_invariants()
    for bad in ([[0, 7]], [[7]], [[7, 99]]):
        s = req("s", list(range(13)))
        with pytest.raises(InvalidArgumentError):
            off.core.allocate_slots(s, 5, 8, KVCacheBlocks(bad))
        off.core.check_invariants()


# ---- class 5: stale or mismatched requests ---------------------------------


def test_freed_request_coming_back_with_computed_tokens_is_refused() -> None:
    mgr = manager()
    a = req("a", list(range(9)))
    admit(mgr, a)
    mgr.free(a)
    assert a.num_computed_tokens == 9
    a.append_output_token_ids([7, 7, 7])
    refused(
        InvalidArgumentError,
        ValueError,
        lambda: manager_state(mgr, [a]),
        lambda: mgr.allocate_slots(a, 3),
    )
    a.num_computed_tokens = 0
    assert mgr.allocate_slots(a, a.num_tokens) is not None


@pytest.mark.parametrize("call", ["allocate_slots", "cache_blocks"])
def test_request_hashed_in_another_unit_is_refused(call: str) -> None:
    mgr = manager(FullAttentionSpec(8), SlidingWindowSpec(8, 16))  # hash unit 8
    good = req("g", list(range(20)), hbs=8)
    admit(mgr, good)
    odd = req("o", list(range(20)), hbs=4)
    state = lambda: manager_state(mgr, [good, odd])  # noqa: E731
    if call == "allocate_slots":
        refused(ConfigError, ValueError, state, lambda: mgr.allocate_slots(odd, 20))
    else:
        twin = req("g", list(range(20)), hbs=4)  # same id, other unit
        refused(ConfigError, ValueError, state, lambda: mgr.cache_blocks(twin, 16))


# ---- class 6: results -------------------------------------------------------


def test_the_nothing_new_result_cannot_be_changed() -> None:
    mgr = manager()
    r = req("a", [1])
    admit(mgr, r)
    r.append_output_token_ids(9)
    empty = mgr.allocate_slots(r, 1)
    assert empty is not None and empty.is_empty()
    empty.get_block_ids()[0].append(5)  # a fresh list: changes nothing shared
    with pytest.raises(ValueError):
        empty.flat[:1] = 1  # read-only numpy view
    with pytest.raises(AttributeError):
        empty._flat = np.zeros(3, np.int32)  # type: ignore[misc]
    r.num_computed_tokens = 2
    r.append_output_token_ids(9)
    again = mgr.allocate_slots(r, 1)
    assert again is not None and again.get_block_ids() == ([],)
    blocks, _ = mgr.get_computed_blocks(req("b", [1, 2, 3]))
    assert blocks.get_block_ids() == ([],)


# ---- class 8: consistent acceptance --------------------------------------------


@pytest.mark.parametrize("bad", ["no", 1, None, 0.0])
@pytest.mark.parametrize("option", ["enable_caching", "enable_events", "log_stats"])
def test_bool_options_reject_non_bools(option: str, bad: object) -> None:
    with pytest.raises(TypeError) as info:
        manager(**{option: bad})
    assert isinstance(info.value, KvCoordError)


@pytest.mark.parametrize("option", ["enable_caching", "enable_events"])
def test_pool_bool_options_reject_non_bools(option: str) -> None:
    with pytest.raises(TypeError) as info:
        BlockPool(10, **{option: "no"})  # type: ignore[arg-type]
    assert isinstance(info.value, KvCoordError)


def test_layer_names_from_a_generator_are_kept() -> None:
    g = KVCacheGroup(FullAttentionSpec(B), (n for n in ["l0", "l1"]))  # type: ignore[arg-type]
    assert g.layer_names == ("l0", "l1")


@pytest.mark.parametrize("dtype", [">i8", ">u4", ">i2", "<i8", "=u2"])
def test_non_native_integer_arrays_are_accepted(dtype: str) -> None:
    pool = BlockPool(10)
    ids = pool.get_new_blocks(3)
    pool.free_blocks(np.array(ids, dtype=dtype))
    assert pool.num_free_blocks == 9
    r = req("a", np.array([1, 2, 3, 4, 5], dtype=dtype))
    r.append_output_token_ids(np.array([6, 7, 8], dtype=dtype))
    assert r.all_token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert r.block_hashes == req("b", list(range(1, 9))).block_hashes


@pytest.mark.parametrize("scalar", [np.int64(7), np.uint32(7), np.int8(7), np.uint64(7)])
def test_numpy_integer_scalars_are_ints(scalar: object) -> None:
    r = req("a", [1, 2, 3])
    r.append_output_token_ids(scalar)  # type: ignore[arg-type]
    assert r.all_token_ids == [1, 2, 3, 7]
    assert FullAttentionSpec(np.int64(4)) == FullAttentionSpec(4)  # type: ignore[arg-type]
    assert KVCacheConfig(np.int32(10), (KVCacheGroup(FullAttentionSpec(4)),)).num_blocks == 10  # type: ignore[arg-type]
    mgr = manager(max_model_len=np.int64(100))  # type: ignore[arg-type]
    assert mgr.allocate_slots(r, np.int64(4)) is not None  # type: ignore[arg-type]
    pool = BlockPool(np.int64(10))  # type: ignore[arg-type]
    assert len(pool.get_new_blocks(np.uint8(2))) == 2  # type: ignore[arg-type]


def test_block_hashes_is_a_full_sequence() -> None:
    r = req("a", list(range(12)))
    hashes = r.block_hashes
    assert hashes.index(hashes[1]) == 1
    assert hashes.count(hashes[2]) == 1
    assert hashes.count(b"nope") == 0
    with pytest.raises(ValueError):
        hashes.index(b"nope")
    assert list(reversed(hashes)) == list(hashes)[::-1]
    assert hashes[1] in hashes


def test_block_hashes_slices_are_lists_slices() -> None:
    # Slices build only their own items (a hasher reads the newest few of a
    # long request); every slice equals the list's.
    hashes = req("a", list(range(40))).block_hashes
    whole = list(hashes)
    bounds = [None, -12, -11, -3, -1, 0, 1, 3, 9, 10, 11, 100]
    for lo in bounds:
        for hi in bounds:
            for step in (None, 1, 2, -1, -2, 3):
                assert hashes[lo:hi:step] == whole[lo:hi:step], (lo, hi, step)
    with pytest.raises(ValueError):
        hashes[::0]


def test_hit_tokens_without_hit_blocks_are_refused() -> None:
    # Found by the generated suite: claiming hit tokens without passing their
    # blocks would cache fresh blocks as holding tokens never computed.
    mgr, a, b = _two_requests()
    state = lambda: manager_state(mgr, [a, b])  # noqa: E731
    refused(InvalidArgumentError, ValueError, state, lambda: mgr.allocate_slots(b, 1, 8))
    refused(
        InvalidArgumentError,
        ValueError,
        state,
        lambda: mgr.allocate_slots(b, 1, 8, KVCacheBlocks([[]])),
    )


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: kvcoord.Request(7, [1, 2], hash_block_size=16), "request_id"),
        (lambda: kvcoord.Request("r", [1], hash_block_size=16, hash_algo=b"x"), "hash_algo"),
        (lambda: kvcoord.Request("r", [1], hash_block_size=16, hash_seed=1), "hash_seed"),
        (lambda: kvcoord.Request("r", [1], hash_block_size=16, cache_salt=5), "cache_salt"),
        (lambda: kvcoord.compute_block_hashes([1], hash_block_size=16, cache_salt=5), "cache_salt"),
        (lambda: kvcoord.BlockPool(4, eviction_policy=3), "eviction_policy"),
        (lambda: kvcoord._core.UnboundedPrefixCache(2).add([1, 2], [3], 5), "salt"),
    ],
)
def test_non_str_for_a_str_argument_is_a_kvcoord_type_error(
    call: Callable[[], object], argument: str
) -> None:
    """Regression: str parameters raised a bare TypeError, not a kvcoord error."""
    with pytest.raises(kvcoord.errors.ArgumentTypeError, match="expected a str") as info:
        call()
    assert isinstance(info.value, TypeError)
    assert any(argument in note for note in getattr(info.value, "__notes__", []))
