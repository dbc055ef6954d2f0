"""Adversarial inputs to the low-level surface (``BlockPool``, ``Request``,
the hashing helpers, ``KVCacheBlocks``): each refusal is a
``kvcoord.errors`` class that is also the builtin a caller expects, and
leaves the pool or request exactly as it was (``tests/snapshot.py``)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvcoord
from kvcoord import (
    ArgumentTypeError,
    BlockPool,
    ConfigTypeError,
    HashTypeError,
    InvalidArgumentError,
    InvalidHashError,
    KVCacheBlocks,
    KvCoordError,
    Request,
)
from snapshot import pool_state, request_state

H = b"\x01" * 32


def refused(exc: type[BaseException], state: Callable[[], Any], call: Callable[[], Any]) -> str:
    """``call()`` raises ``exc`` and leaves ``state()`` as it was."""
    before = state()
    with pytest.raises(exc) as info:
        call()
    assert state() == before
    return str(info.value)


def pool_with_blocks(n: int = 16) -> tuple[BlockPool, list[int]]:
    pool = BlockPool(n, enable_caching=True)
    return pool, pool.get_new_blocks(4)


def request(n: int = 8, **kw: Any) -> Request:
    return Request("r", list(range(n)), hash_block_size=4, **kw)


# ---- bools are not counts, ids or tokens ----------------------------------


def test_bools_are_not_counts_or_block_ids() -> None:
    pool, ids = pool_with_blocks()
    state = lambda: pool_state(pool)  # noqa: E731
    for call in (
        lambda: pool.get_new_blocks(True),
        lambda: pool.get_new_blocks_array(False),
        lambda: pool.free_blocks([True]),
        lambda: pool.touch([ids[0], True]),
        lambda: pool.block_hash(True),
        lambda: pool.advance_clock(True),
        lambda: pool.cache_full_blocks([ids[0]], [H], 0, True, 0),
    ):
        err = refused(ArgumentTypeError, state, call)
        assert "bool" in err
    with pytest.raises(ConfigTypeError):
        BlockPool(True)
    with pytest.raises(ConfigTypeError):
        BlockPool(8, hash_block_size=True)
    pool.check_invariants()


def test_bools_are_not_request_counts_but_are_token_ids() -> None:
    """Counts set on a request refuse a bool like every count; token ids
    (and ``advance_requests``' per-step ints) take it as the int it is, as
    ``test_token_lists.py`` documents."""
    r = request()
    state = lambda: request_state(r)  # noqa: E731
    for attr in ("num_computed_tokens", "num_in_flight_tokens", "shared_prefix_boundary"):
        refused(ArgumentTypeError, state, lambda a=attr: setattr(r, a, True))
    with pytest.raises(ConfigTypeError):
        Request("x", [1, 2], hash_block_size=True)
    r.append_output_token_ids([True, False])
    assert r.all_token_ids[-2:] == [1, 0]


# ---- objects that are not ints, and __index__ that raises ------------------


def test_one_element_and_2d_arrays_are_not_ints() -> None:
    pool, _ = pool_with_blocks()
    refused(ArgumentTypeError, lambda: pool_state(pool), lambda: pool.get_new_blocks(np.array([1])))
    r = request()
    for bad in (np.zeros((2, 2), np.int64), [np.array([1, 2])]):
        err = refused(
            ArgumentTypeError, lambda: request_state(r), lambda b=bad: r.append_output_token_ids(b)
        )
        assert "must be an int" in err
    with pytest.raises(ArgumentTypeError):
        Request("x", np.zeros((2, 2), np.int64), hash_block_size=4)


class RaisingIndex:
    def __index__(self) -> int:
        raise ZeroDivisionError("from __index__")


def test_an_index_that_raises_is_passed_on_and_changes_nothing() -> None:
    pool, ids = pool_with_blocks()
    state = lambda: pool_state(pool)  # noqa: E731
    for call in (
        lambda: pool.free_blocks([ids[0], RaisingIndex()]),
        lambda: pool.touch((ids[1], RaisingIndex())),
        lambda: pool.get_new_blocks(RaisingIndex()),
        lambda: pool.block_hash(RaisingIndex()),
    ):
        refused(ZeroDivisionError, state, call)
    r = request()
    for call in (
        lambda: r.append_output_token_ids([1, RaisingIndex()]),
        lambda: r.append_output_token_ids(RaisingIndex()),
        lambda: setattr(r, "num_computed_tokens", RaisingIndex()),
    ):
        refused(ZeroDivisionError, lambda: request_state(r), call)
    pool.check_invariants()


def test_an_index_that_reenters_the_pool_is_a_reentrant_refusal() -> None:
    pool, ids = pool_with_blocks()

    class Reentrant:
        def __index__(self) -> int:
            pool.free_blocks([ids[1]])
            return ids[0]

    err = refused(RuntimeError, lambda: pool_state(pool), lambda: pool.free_blocks([Reentrant()]))
    assert "re-entrant" in err
    pool.check_invariants()


def test_an_index_that_reenters_the_request_changes_nothing() -> None:
    r = request()

    class Reentrant:
        def __index__(self) -> int:
            r.append_output_token_ids(5)
            return 1

    refused(
        RuntimeError, lambda: request_state(r), lambda: r.append_output_token_ids([Reentrant()])
    )


def test_bytearray_and_memoryview_are_not_id_sequences() -> None:
    pool, _ = pool_with_blocks()
    r = request()
    for bad in (bytearray(b"\x01\x02"), memoryview(b"\x01\x02")):
        refused(ArgumentTypeError, lambda: pool_state(pool), lambda b=bad: pool.touch(b))
        refused(
            ArgumentTypeError, lambda: request_state(r), lambda b=bad: r.append_output_token_ids(b)
        )


# ---- hashes of the wrong type ----------------------------------------------


@pytest.mark.parametrize("bad", [5, None, 1.5, object()])
def test_block_hashes_that_are_not_a_sequence(bad: object) -> None:
    pool, ids = pool_with_blocks()
    err = refused(
        HashTypeError,
        lambda: pool_state(pool),
        lambda: pool.cache_full_blocks([ids[0]], bad, 0, 1, 0),
    )
    assert type(bad).__name__ in err
    r = request(hash_algo="supplied")
    refused(HashTypeError, lambda: request_state(r), lambda: r.supply_block_hashes(bad))


def test_a_hash_of_the_wrong_type_is_a_type_error_and_an_invalid_hash() -> None:
    pool, ids = pool_with_blocks()
    state = lambda: pool_state(pool)  # noqa: E731
    for call in (
        lambda: pool.get_cached_block("a" * 32, [0]),
        lambda: pool.insert_key(ids[0], "a" * 32, 0),
        lambda: pool.cache_full_blocks([ids[0]], ["a" * 32], 0, 1, 0),
        lambda: pool.cache_full_blocks([ids[0]], "a" * 32, 0, 1, 0),
        lambda: pool.cache_full_blocks([ids[0]], np.zeros((1, 32), np.int8), 0, 1, 0),
    ):
        before = state()
        with pytest.raises(HashTypeError) as info:
            call()
        assert isinstance(info.value, InvalidHashError)
        assert isinstance(info.value, TypeError)
        assert state() == before
    # A hash of the right type but the wrong length stays a ValueError only.
    with pytest.raises(InvalidHashError) as info:
        pool.get_cached_block(b"abc", [0])
    assert not isinstance(info.value, TypeError)


def test_mm_features_that_are_not_iterable() -> None:
    with pytest.raises(ArgumentTypeError, match="mm_features"):
        Request("x", [1, 2], hash_block_size=4, mm_features=5)


# ---- Request attributes ----------------------------------------------------


@pytest.mark.parametrize(
    ("attr", "bad", "exc"),
    [
        ("shared_prefix_boundary", 2**64, InvalidArgumentError),
        ("shared_prefix_boundary", -1, InvalidArgumentError),
        ("shared_prefix_boundary", 1.5, ArgumentTypeError),
        ("shared_prefix_boundary", None, ArgumentTypeError),
        ("skip_reading_prefix_cache", 1, ArgumentTypeError),
        ("skip_reading_prefix_cache", None, ArgumentTypeError),
        ("skip_reading_prefix_cache", "yes", ArgumentTypeError),
    ],
)
def test_request_setters_refuse_with_kvcoord_errors(
    attr: str, bad: object, exc: type[Exception]
) -> None:
    r = request()
    before = (request_state(r), r.shared_prefix_boundary, r.skip_reading_prefix_cache)
    with pytest.raises(exc):
        setattr(r, attr, bad)
    assert (request_state(r), r.shared_prefix_boundary, r.skip_reading_prefix_cache) == before
    r.skip_reading_prefix_cache = np.bool_(True)
    r.shared_prefix_boundary = np.int64(4)
    assert r.skip_reading_prefix_cache is True and r.shared_prefix_boundary == 4


def test_block_hashes_take_any_int_index_as_a_list_does() -> None:
    r = request(12)
    bh, hashes = r.block_hashes, list(r.block_hashes)
    for i in (2**64, -(2**64), 2**200):
        with pytest.raises(IndexError):
            bh[i]
    with pytest.raises(TypeError):
        bh["0"]
    assert bh.index(hashes[1], -(2**200)) == hashes.index(hashes[1], -(2**200)) == 1
    assert bh.index(hashes[2], 0, 2**200) == 2
    with pytest.raises(ValueError):
        bh.index(hashes[0], 2**200)
    with pytest.raises(TypeError):
        bh.index(hashes[0], "a")


# ---- KVCacheBlocks ---------------------------------------------------------


@pytest.mark.parametrize("n", [10**12, 2**40, 2**20])
def test_empty_result_of_a_huge_group_count_is_refused_not_an_abort(n: int) -> None:
    with pytest.raises(InvalidArgumentError, match="num_groups"):
        KVCacheBlocks.empty(n)


@pytest.mark.parametrize(
    ("bad", "exc"),
    [
        (-1, InvalidArgumentError),
        (2**64, InvalidArgumentError),
        (None, ArgumentTypeError),
        (1.5, ArgumentTypeError),
        (True, ArgumentTypeError),
    ],
)
def test_empty_result_arguments(bad: object, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        KVCacheBlocks.empty(bad)  # type: ignore[arg-type]
    assert KVCacheBlocks.empty(np.int64(2)).num_groups == 2


def test_gather_arguments() -> None:
    a = KVCacheBlocks([[1, 2], [3]])
    for bad in ([(a, -1, 1)], [(a, 0, -1)], [(a, 2**64, 0)]):
        with pytest.raises(InvalidArgumentError):
            KVCacheBlocks.gather(bad)  # type: ignore[arg-type]
    for bad in ([(5, 0, 1)], [(a,)], 5, [(a, 0, None)], [[a, 0, 1]]):
        with pytest.raises(ArgumentTypeError):
            KVCacheBlocks.gather(bad)  # type: ignore[arg-type]
    assert KVCacheBlocks.gather([(a, 1, 5), (a, 0, 1)]).get_block_ids() == ([3], [1])


@pytest.mark.parametrize(
    "bad", [5, [5], [None], [[1.0]], [[True]], "ab", [b"ab"], [bytearray(b"a")], [np.array(1)]]
)
def test_result_from_non_id_groups_is_a_kvcoord_type_error(bad: object) -> None:
    for make in (KVCacheBlocks, KVCacheBlocks.from_lists):
        with pytest.raises(ArgumentTypeError):
            make(bad)  # type: ignore[arg-type]


def test_result_from_numpy_integer_scalars() -> None:
    blocks = KVCacheBlocks.from_lists([[np.int64(3), np.uint32(4)], [np.int8(1)]])
    assert blocks.get_block_ids() == ([3, 4], [1])
    with pytest.raises(kvcoord.InvalidBlockIdError):
        KVCacheBlocks([[np.int64(-1)]])


def test_results_pickle_and_copy() -> None:
    a = KVCacheBlocks([[1, 2], [], [3]])
    for b in (pickle.loads(pickle.dumps(a)), copy.copy(a), copy.deepcopy(a)):
        assert b == a and b.get_block_ids() == ([1, 2], [], [3])
    assert pickle.loads(pickle.dumps(KVCacheBlocks.empty(0))) == KVCacheBlocks.empty(0)


def test_refusals_here_are_kvcoord_errors() -> None:
    """Every refusal above that is a TypeError is a KvCoordError too."""
    with pytest.raises(KvCoordError):
        KVCacheBlocks(5)  # type: ignore[arg-type]


# ---- block tables (CPU) ----------------------------------------------------


def test_block_table_refuses_bool_ids_and_changes_nothing() -> None:
    from kvcoord.block_table import BlockTable

    t = BlockTable(4, 2, 8, 16)
    state = lambda: (t.host_np.tolist(), t.num_blocks_per_row.tolist())  # noqa: E731
    for call in (
        lambda: t.append_row([True, 2], 0),
        lambda: t.append_rows([[1], [2, False]], [0, 1]),
    ):
        refused(kvcoord.BlockTableError, state, call)


@pytest.mark.parametrize(
    "sizes",
    [(4, 2**16, 2**16, 16), (4, 2**40, 2**40, 16), (4, 1, 1, 2**40), (16, 2**14, 2**14, 16)],
)
def test_block_table_too_large_is_a_config_error_before_allocating(sizes: tuple[int, ...]) -> None:
    from kvcoord.block_table import BlockTable

    with pytest.raises(kvcoord.ConfigError, match="supported maximum"):
        BlockTable(*sizes)


def test_block_table_on_an_unknown_device_is_a_config_error() -> None:
    from kvcoord.block_table import BlockTable

    with pytest.raises(kvcoord.ConfigError):
        BlockTable(4, 1, 1, 1, device="no-such-device")


# ---- hashing sizes and the pool's hit search -------------------------------


@pytest.mark.parametrize("size", [2**32, 2**40])
def test_hash_block_size_beyond_32_bits_is_a_config_error(size: int) -> None:
    with pytest.raises(kvcoord.ConfigError, match="hash_block_size"):
        Request("x", [1, 2], hash_block_size=size)
    with pytest.raises(kvcoord.ConfigError, match="hash_block_size"):
        kvcoord.compute_block_hashes([1, 2], hash_block_size=size)


def test_hit_search_refuses_wrong_types_with_kvcoord_errors() -> None:
    pool, ids = pool_with_blocks()
    pool.cache_full_blocks(ids[:1], [H], 0, 1, 0)
    spec = kvcoord._core.GroupSpec.full_attention(16)
    state = lambda: pool_state(pool)  # noqa: E731
    for call in (
        lambda: pool.find_longest_cache_hit(kvcoord.FullAttentionSpec(16), [0], [H], 16, 16),
        lambda: pool.find_longest_cache_hit(5, [0], [H], 16, 16),
        lambda: pool.find_longest_cache_hit(spec, 5, [H], 16, 16),
        lambda: pool.find_longest_cache_hit(spec, "ab", [H], 16, 16),
    ):
        refused(ArgumentTypeError, state, call)
    lists, hit = pool.find_longest_cache_hit(spec, [0], [H], 16, 16)
    assert (lists, hit) == ([[ids[0]]], 16)
    with pytest.raises(ArgumentTypeError, match="group_ids must be a sequence"):
        pool.get_cached_block(H, 5)


# ---- iterables too large to hold -------------------------------------------

HUGE = range(2**62)  # its len() fits; its ids never could (not an abort)


def test_huge_iterables_are_out_of_memory_errors_not_aborts() -> None:
    pool, ids = pool_with_blocks()
    r = request()
    for call, state in (
        (lambda: pool.free_blocks(HUGE), lambda: pool_state(pool)),
        (lambda: pool.touch(HUGE), lambda: pool_state(pool)),
        (lambda: pool.get_cached_block(H, HUGE), lambda: pool_state(pool)),
        (lambda: r.append_output_token_ids(HUGE), lambda: request_state(r)),
        (lambda: Request("x", HUGE, hash_block_size=4), lambda: None),
        (lambda: KVCacheBlocks([HUGE]), lambda: None),
        (lambda: pool.cache_full_blocks(ids[:1], [H], 0, 1, 0, HUGE), lambda: pool_state(pool)),
    ):
        err = refused(kvcoord.OutOfMemoryError, state, call)
        assert "out of memory" in err
    pool.check_invariants()


@pytest.mark.parametrize(
    ("computed", "scheduled"),
    [([1], [2**62]), ([0], [10**9]), ([0, 0, 0], [2**27] * 3), ([2**62], [1]), ([2**63 - 1], [1])],
)
def test_step_positions_beyond_the_supported_range_are_refused_before_allocating(
    computed: list[int], scheduled: list[int]
) -> None:
    from kvcoord.block_table import step_positions

    with pytest.raises(kvcoord.BlockTableError, match="supported maximum"):
        step_positions(computed, scheduled)


_HASHES_UNDER_LIMIT = """
import resource, numpy as np, kvcoord
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))
rows = np.broadcast_to(np.uint8(1), (2**27, 32))  # 4 GiB of hashes, no memory
pool = kvcoord.BlockPool(8)
ids = pool.get_new_blocks(1)
big = kvcoord.KVCacheBlocks.from_arrays([np.broadcast_to(np.int64(1), (2**28,))])
req = kvcoord.Request("r", [1] * 8, hash_block_size=4, hash_algo="supplied")
for make in (
    lambda: req.supply_block_hashes(rows),
    lambda: pool.cache_full_blocks(ids, rows, 0, 1, 0),
    lambda: big + big,
):
    try:
        make()
    except MemoryError as e:
        assert isinstance(e, kvcoord.KvCoordError), repr(e)
        print("MemoryError:", e)
    else:
        raise SystemExit("no MemoryError")
pool.check_invariants()
assert pool.num_free_blocks == 6 and req.num_block_hashes == 0
print("ok")
"""


def test_hash_arrays_and_sums_too_large_to_hold_are_memory_errors_not_aborts() -> None:
    import os
    import subprocess
    import sys

    pytest.importorskip("resource")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _HASHES_UNDER_LIMIT],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("MemoryError:") == 3 and out.stdout.endswith("ok\n")


def test_block_hashes_compare_only_with_sized_collections() -> None:
    import itertools

    r = request(12)
    hashes = list(r.block_hashes)
    assert r.block_hashes == hashes and r.block_hashes == tuple(hashes)
    assert r.block_hashes != hashes[:-1]
    # An endless iterator is never read (it used to be read until memory ran out).
    assert r.block_hashes != itertools.repeat(hashes[0])
    assert r.block_hashes != iter(hashes)  # as list == iterator is False
    assert request_state(r)[4] == tuple(hashes)


def test_advance_requests_refuses_non_requests_with_kvcoord_errors() -> None:
    r = request()
    for bad in ([r, 5], 5, None, [None]):
        with pytest.raises(ArgumentTypeError, match=r"kvcoord\.Request"):
            kvcoord.advance_requests(bad, [1, 1])  # type: ignore[arg-type]
        assert r.num_computed_tokens == 0
    kvcoord.advance_requests((r,), [2])  # any sequence of requests
    assert r.num_computed_tokens == 2
