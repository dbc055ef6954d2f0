"""The Python surface of kvcoord.BlockPool, including every error path.

Every refused call must leave the pool exactly as it was; `snapshot` captures
all observable state so each error test can assert that.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import kvcoord
from gil import ticks_during
from kvcoord import (
    BlockPool,
    BlockStateError,
    ConfigError,
    InvalidBlockIdError,
    InvalidHashError,
    KvCoordError,
    OutOfBlocksError,
)


def snapshot(pool: BlockPool) -> tuple[list[int], list[int], list[bool], int]:
    return (
        pool.free_block_ids().tolist(),
        pool.ref_counts().tolist(),
        pool.cached_mask().tolist(),
        pool.num_cached_blocks,
    )


def h(n: int, size: int = 32) -> bytes:
    return bytes([n]) * size


@pytest.fixture
def pool() -> BlockPool:
    return BlockPool(11, hash_block_size=16)


def test_fresh_pool(pool: BlockPool) -> None:
    assert pool.num_blocks == 11
    assert pool.num_free_blocks == 10
    assert pool.usage == 0.0
    assert pool.free_block_ids().tolist() == list(range(1, 11))
    assert pool.ref_counts().dtype == np.uint32
    assert pool.enable_caching and pool.hash_block_size == 16 and not pool.enable_events
    assert "num_blocks=11" in repr(pool)


def test_allocate_free_order(pool: BlockPool) -> None:
    blocks = pool.get_new_blocks(4)
    assert blocks == [1, 2, 3, 4]
    assert pool.usage == pytest.approx(0.4)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2, group_id=0)
    pool.free_blocks(blocks[::-1])
    # Unhashed 4, 3 go to the front in the order given; hashed 2, 1 to the back.
    assert pool.free_block_ids().tolist() == [4, 3, 5, 6, 7, 8, 9, 10, 2, 1]
    pool.check_invariants()


def test_ids_as_numpy_and_tuples(pool: BlockPool) -> None:
    arr = pool.get_new_blocks_array(3)
    assert arr.dtype == np.uint32 and arr.tolist() == [1, 2, 3]
    pool.touch(np.array([1, 2], dtype=np.int64))
    pool.free_blocks((1, 2))
    pool.free_blocks(arr)
    assert pool.num_free_blocks == 10
    pool.check_invariants()


@pytest.mark.parametrize("dtype", [np.uint32, np.int64, np.int32, np.uint8])
def test_strided_and_read_only_id_arrays(pool: BlockPool, dtype: type) -> None:
    """Ids are copied out of any 1-D integer array: strided views (no
    contiguous slice to copy) and read-only arrays included."""
    pool.get_new_blocks(6)
    backing = np.array([1, 99, 2, 99, 3, 99], dtype=dtype)
    strided = backing[::2]
    assert not strided.flags.c_contiguous
    pool.free_blocks(strided)
    assert pool.free_block_ids().tolist()[:3] == [1, 2, 3]
    frozen = np.array([4, 5, 6], dtype=dtype)
    frozen.flags.writeable = False
    pool.free_blocks(frozen)
    assert pool.free_block_ids().tolist()[:6] == [4, 5, 6, 1, 2, 3]
    assert pool.num_free_blocks == pool.num_blocks - 1
    pool.check_invariants()


def test_prefix_hit_and_touch(pool: BlockPool) -> None:
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2, 0)
    other = pool.get_new_blocks(1)
    pool.cache_full_blocks(other, [h(1)], 0, 1, 1)  # the same hash, salted with group 1
    assert pool.get_cached_block(h(1), [0, 1]) == [1, 3]
    assert pool.get_cached_block(h(2), [0, 1]) is None
    assert pool.get_cached_block(h(2), [0]) == [2]
    pool.free_blocks(blocks + other)
    pool.touch([2])
    assert 2 not in pool.free_block_ids().tolist()
    assert pool.ref_counts()[2] == 1
    pool.check_invariants()


def test_hash_lengths(pool: BlockPool) -> None:
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1, 16), h(2, 32)], 0, 2, 0)
    assert pool.get_cached_block(h(1, 16), [0]) == [1]
    assert pool.get_cached_block(h(1, 32), [0]) is None
    array_hashes = np.frombuffer(h(7) + h(8), dtype=np.uint8).reshape(2, 32)
    more = pool.get_new_blocks(2)
    pool.cache_full_blocks(more, array_hashes, 0, 2, 0)
    assert pool.get_cached_block(h(8), [0]) == [more[1]]


def test_block_mask_and_null_block(pool: BlockPool) -> None:
    blocks = pool.get_new_blocks(3)
    table = [0, *blocks]
    pool.cache_full_blocks(table, [h(0), h(1), h(2), h(3)], 0, 4, 0, [True, True, False, True])
    assert pool.cached_mask().tolist()[:4] == [False, True, False, True]
    pool.free_blocks(table)  # the null block is skipped silently
    pool.touch([0])
    assert pool.ref_counts()[0] == 0
    pool.check_invariants()


def test_evict_blocks_keeps_allocation(pool: BlockPool) -> None:
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2, 0)
    pool.evict_blocks([1, 5])
    assert pool.get_cached_block(h(1), [0]) is None
    assert pool.ref_counts()[1] == 1
    assert pool.num_cached_blocks == 1


def test_reset_prefix_cache(pool: BlockPool, caplog: pytest.LogCaptureFixture) -> None:
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2, 0)
    with caplog.at_level(logging.WARNING, logger="kvcoord"):
        assert pool.reset_prefix_cache() is False
    assert "2 blocks are still in use" in caplog.text
    assert pool.num_cached_blocks == 2
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.num_cached_blocks == 0 and not pool.cached_mask().any()


def test_events() -> None:
    pool = BlockPool(4, enable_events=True)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [h(1), h(2), h(3)], 0, 2, 5)
    pool.cache_full_blocks(blocks, [h(1), h(2), h(3)], 2, 3, 5)
    stored, stored2 = pool.take_events()
    assert isinstance(stored, kvcoord.BlockStored)
    assert stored.block_hash_digests == [h(1), h(2)] and stored.parent_block_hash is None
    # vLLM's integer form: the digest's last 8 bytes, big-endian.
    assert stored.block_hashes.tolist() == [int.from_bytes(h(i)[-8:], "big") for i in (1, 2)]
    assert stored.block_ids.tolist() == [1, 2] and stored.group_idx == 5
    assert stored.block_size == pool.hash_block_size and stored.medium == "GPU"
    assert stored.token_ids.size == 0  # a bare pool knows no request
    assert stored2.parent_block_digest == h(2) and stored2.first_block == 2
    pool.free_blocks(blocks)
    pool.get_new_blocks(3)
    removed = pool.take_events()
    assert [type(e) for e in removed] == [kvcoord.BlockRemoved] * 3
    assert {e.block_hash_digest for e in removed} == {h(1), h(2), h(3)}
    assert pool.take_events() == []
    pool.free_blocks([1, 2, 3])
    assert pool.reset_prefix_cache()
    (cleared,) = pool.take_events()
    assert isinstance(cleared, kvcoord.AllBlocksCleared)


def test_stored_event_range_and_positions() -> None:
    """``num_blocks`` spans the whole cached range, skipped blocks included;
    ``positions`` names the blocks that were stored (aligned with ``block_ids``)."""
    pool = BlockPool(8, enable_events=True)
    blocks = pool.get_new_blocks(3)
    table = [blocks[0], 0, blocks[1], blocks[2]]
    pool.cache_full_blocks(table, [h(i) for i in range(4)], 0, 4, 0, [True, True, False, True])
    (stored,) = pool.take_events()
    assert stored.first_block == 0 and stored.num_blocks == 4
    assert stored.positions.tolist() == [0, 3]
    assert stored.block_ids.tolist() == [blocks[0], blocks[2]]
    assert stored.block_hash_digests == [h(0), h(3)]
    more = pool.get_new_blocks(1)
    pool.cache_full_blocks([*table, *more], [h(i) for i in range(5)], 4, 5, 0)
    (stored,) = pool.take_events()
    assert (stored.first_block, stored.num_blocks, stored.positions.tolist()) == (4, 1, [4])


def test_events_off_by_default(pool: BlockPool) -> None:
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(blocks, [h(1)], 0, 1, 0)
    assert pool.take_events() == []


def test_caching_disabled() -> None:
    pool = BlockPool(5, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2, 0)
    assert pool.num_cached_blocks == 0
    assert pool.get_cached_block(h(1), [0]) is None
    pool.free_blocks(blocks)
    assert pool.free_block_ids().tolist() == [1, 2, 3, 4]


def test_metadata_bytes_per_block() -> None:
    pool = BlockPool(1_000_000)
    assert pool.metadata_bytes / pool.num_blocks < 24


# ---- error paths: each one raises a clear exception and changes nothing ----


@pytest.mark.parametrize(
    ("call", "exc", "message"),
    [
        (lambda p: p.get_new_blocks(20), OutOfBlocksError, "cannot get 20 free blocks"),
        (lambda p: p.get_new_blocks(-1), ValueError, "must be non-negative"),
        (lambda p: p.free_blocks([1, 1]), BlockStateError, "block 1 holds no reference"),
        (lambda p: p.free_blocks([5]), BlockStateError, "block 5 holds no reference"),
        (lambda p: p.free_blocks([2, 11]), InvalidBlockIdError, "out of range"),
        # Blocks already bound for the back (cached 3) and the front (1, 2)
        # when the bad id turns up must be put back.
        (lambda p: p.free_blocks([3, 1, 2, 11]), InvalidBlockIdError, "out of range"),
        (
            lambda p: p.free_blocks(np.array([3, 1, 3], dtype=np.int64)),
            BlockStateError,
            "block 3 holds no reference",
        ),
        (lambda p: p.free_blocks([-1]), InvalidBlockIdError, "negative"),
        (lambda p: p.free_blocks([2**40]), InvalidBlockIdError, "32 bits"),
        (lambda p: p.free_blocks("12"), TypeError, "not str"),
        (lambda p: p.touch([3, 99]), InvalidBlockIdError, "block id 99"),
        (lambda p: p.evict_blocks([1, 11]), InvalidBlockIdError, "block id 11"),
        (lambda p: p.evict_blocks([-3]), InvalidBlockIdError, "negative"),
        (lambda p: p.cache_full_blocks([1, 2], [h(1), h(2)], 0, 3, 0), ValueError, "num_full"),
        (lambda p: p.cache_full_blocks([1, 2], [h(1)], 0, 2, 0), ValueError, "hashes"),
        (lambda p: p.cache_full_blocks([1, 2], [h(1), b"x"], 0, 2, 0), InvalidHashError, "1 bytes"),
        (lambda p: p.cache_full_blocks([1, 2], [h(1), "ab"], 0, 2, 0), InvalidHashError, "bytes"),
        (lambda p: p.cache_full_blocks([1, 2], h(1) * 2, 0, 2, 0), InvalidHashError, "sequence"),
        (
            lambda p: p.cache_full_blocks([1, 2], [h(1), h(2)], 0, 2, 0, [True]),
            ValueError,
            "block_mask",
        ),
        (lambda p: p.cache_full_blocks([1, 1], [h(1), h(2)], 0, 2, 0), BlockStateError, "already"),
        (lambda p: p.cache_full_blocks([3], [h(9)], 0, 1, 0), BlockStateError, "already"),
        (lambda p: p.cache_full_blocks([1], [h(1)], 0, 1, -1), ValueError, "group id: -1"),
        (lambda p: p.get_cached_block(b"short", [0]), InvalidHashError, "5 bytes"),
    ],
)
def test_bad_input_raises_and_changes_nothing(call, exc, message) -> None:  # type: ignore[no-untyped-def]
    pool = BlockPool(11, enable_events=True)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(blocks, [h(7), h(8), h(9)], 2, 3, 0)  # block 3 cached
    pool.free_blocks([4])
    pool.take_events()
    before = snapshot(pool)
    with pytest.raises(exc, match=message) as info:
        call(pool)
    if exc is not TypeError:
        assert isinstance(info.value, KvCoordError)
    assert snapshot(pool) == before
    assert pool.take_events() == []
    pool.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_blocks": 0}, "num_blocks=0"),
        ({"num_blocks": -5}, "non-negative"),
        ({"num_blocks": 8, "hash_block_size": 0}, "hash_block_size=0"),
        ({"num_blocks": 8, "hash_block_size": -16}, "hash_block_size=-16"),
    ],
)
def test_invalid_config(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        BlockPool(**kwargs)


def test_config_error_class() -> None:
    with pytest.raises(ConfigError):
        BlockPool(0)


def test_retention_interval_validation() -> None:
    kvcoord.validate_retention_interval(None, 16, False)
    kvcoord.validate_retention_interval(0, 16, False)
    kvcoord.validate_retention_interval(64, 16, True)
    with pytest.raises(ConfigError, match=r"=32: the model has no sliding-window"):
        kvcoord.validate_retention_interval(32, 16, False)
    with pytest.raises(ValueError, match=r"=33: must be a multiple of scheduler_block_size \(16\)"):
        kvcoord.validate_retention_interval(33, 16, True)
    with pytest.raises(ValueError, match=r"=-32: must be non-negative"):
        kvcoord.validate_retention_interval(-32, 16, True)


def test_building_a_large_pool_releases_the_gil() -> None:
    """Another Python thread runs while a multi-million-block pool (or a
    manager's pool) is built."""
    inside, seconds = ticks_during(lambda: BlockPool(8_000_000))
    assert inside >= 5, (seconds, inside)
    config = kvcoord.KVCacheConfig(
        8_000_000, (kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(16)),)
    )
    inside, seconds = ticks_during(lambda: kvcoord.KVCacheManager(config, max_model_len=4096))
    assert inside >= 5, (seconds, inside)
