"""KVCacheBlocks: the manager's result type (CONTRACT-blocks)."""

from __future__ import annotations

import numpy as np
import pytest

import kvcoord
from kvcoord import InvalidBlockIdError, KVCacheBlocks


def test_from_lists_views() -> None:
    b = KVCacheBlocks.from_lists([[1, 2, 3], [], [0, 7]])
    assert b.num_groups == 3
    arrays = b.arrays()
    assert [a.dtype for a in arrays] == [np.int32] * 3
    assert [a.tolist() for a in arrays] == [[1, 2, 3], [], [0, 7]]
    assert b.flat.dtype == np.int32 and b.flat.tolist() == [1, 2, 3, 0, 7]
    assert b.offsets.dtype == np.int64 and b.offsets.tolist() == [0, 3, 3, 5]
    assert b.get_block_ids() == ([1, 2, 3], [], [0, 7])
    assert not b.is_empty()


def test_arrays_are_read_only() -> None:
    b = KVCacheBlocks.from_lists([[1, 2]])
    for a in (*b.arrays(), b.flat, b.offsets):
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = 5
    with pytest.raises(AttributeError):
        b._flat = np.zeros(0, np.int32)  # type: ignore[misc]


def test_get_block_ids_returns_fresh_lists() -> None:
    b = KVCacheBlocks.from_lists([[1, 2]])
    ids = b.get_block_ids()
    ids[0].append(9)
    assert b.get_block_ids() == ([1, 2],)


def test_from_arrays_copies_and_accepts_any_int_dtype() -> None:
    src = np.array([4, 5], dtype=np.uint64)
    b = KVCacheBlocks.from_arrays([src, np.array([], dtype=np.int16)])
    src[0] = 99
    assert b.get_block_ids() == ([4, 5], [])


@pytest.mark.parametrize(
    ("groups", "error"),
    [
        ([[-1]], InvalidBlockIdError),
        ([[2**31]], InvalidBlockIdError),
        ([[2**70]], InvalidBlockIdError),
        ([["a"]], TypeError),
        ([[1.0]], TypeError),
        ([[True]], TypeError),
        ("ab", TypeError),
    ],
)
def test_from_lists_validates(groups: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        KVCacheBlocks.from_lists(groups)  # type: ignore[arg-type]


def test_from_arrays_validates() -> None:
    with pytest.raises(TypeError):
        KVCacheBlocks.from_arrays([np.array([1.0])])
    with pytest.raises(TypeError):
        KVCacheBlocks.from_arrays([np.zeros((2, 2), np.int32)])
    with pytest.raises(InvalidBlockIdError):
        KVCacheBlocks.from_arrays([np.array([-3], np.int64)])
    with pytest.raises(TypeError):
        KVCacheBlocks.from_arrays([[1, 2]])  # type: ignore[list-item]


def test_equality_add_repr_empty() -> None:
    a = KVCacheBlocks.from_lists([[1], [2, 3]])
    b = KVCacheBlocks.from_lists([[4, 5], []])
    assert a + b == KVCacheBlocks.from_lists([[1, 4, 5], [2, 3]])
    assert a != b and a == KVCacheBlocks.from_arrays([np.array([1]), np.array([2, 3])])
    assert KVCacheBlocks.from_lists([[]]) != KVCacheBlocks.from_lists([[], []])
    assert repr(a) == "KVCacheBlocks(([1], [2, 3]))"
    assert KVCacheBlocks.empty(2).is_empty() and KVCacheBlocks.empty(2).num_groups == 2
    with pytest.raises(ValueError):
        _ = a + KVCacheBlocks.from_lists([[1]])
    with pytest.raises(TypeError):
        len(a)  # type: ignore[arg-type]


def test_manager_results_are_kvcacheblocks() -> None:
    config = kvcoord.KVCacheConfig(
        num_blocks=32,
        groups=(
            kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(block_size=4)),
            kvcoord.KVCacheGroup(kvcoord.SlidingWindowSpec(block_size=4, sliding_window=8)),
        ),
    )
    mgr = kvcoord.KVCacheManager(config, max_model_len=128)
    a = kvcoord.Request("a", list(range(10)), hash_block_size=4)
    hit, n = mgr.get_computed_blocks(a)
    assert isinstance(hit, KVCacheBlocks) and hit.is_empty() and n == 0
    new = mgr.allocate_slots(a, a.num_tokens, 0, hit)
    assert isinstance(new, KVCacheBlocks) and new.num_groups == 2
    assert all(not x.flags.writeable and x.dtype == np.int32 for x in new.arrays())
    blocks = mgr.get_blocks("a")
    assert blocks == new and blocks.get_block_ids() == mgr.get_block_ids("a")
    a.num_computed_tokens = a.num_tokens
    b = kvcoord.Request("b", list(range(10)), hash_block_size=4)
    hit, n = mgr.get_computed_blocks(b)
    assert n == 8 and hit.flat.dtype == np.int32
    # Arrays (a manager's own result) are accepted as new_computed_blocks.
    new_b = mgr.allocate_slots(b, b.num_tokens - n, n, hit)
    assert new_b is not None
    assert mgr.get_blocks("b").arrays()[0][:2].tolist() == hit.arrays()[0].tolist()


def test_gather_picks_groups_of_other_results() -> None:
    a = KVCacheBlocks.from_lists([[1, 2, 3], [4]])
    b = KVCacheBlocks.from_lists([[0, 7, 8]])
    got = KVCacheBlocks.gather([(b, 0, 2), (a, 0, 9), (a, 1, 0)])
    assert got.get_block_ids() == ([0, 7], [1, 2, 3], [])
    assert KVCacheBlocks.gather([]).num_groups == 0
    with pytest.raises(kvcoord.InvalidArgumentError, match="group 1 of a result with 1 groups"):
        KVCacheBlocks.gather([(b, 1, 1)])
