"""kvcoord.BlockPool's by-hand keys (insert_key, cache_keys) and its per-spec
hit search (find_longest_cache_hit): results, and refusals that change
nothing."""

from __future__ import annotations

import pytest

from kvcoord import BlockPool
from kvcoord._core import GroupSpec
from kvcoord.errors import InvalidArgumentError, InvalidBlockIdError, InvalidHashError


def h(n: int) -> bytes:
    return bytes([n]) * 32


def snapshot(p: BlockPool) -> tuple[object, ...]:
    return (
        p.free_block_ids().tolist(),
        p.ref_counts().tolist(),
        [p.cache_keys(b) for b in range(p.num_blocks)],
    )


def test_insert_key_primary_secondary_and_null() -> None:
    p = BlockPool(6, hash_block_size=4)
    before = p.free_block_ids().tolist()
    assert p.insert_key(3, h(1), 0)
    assert not p.insert_key(3, h(1), 0)  # already there
    assert p.insert_key(3, h(2), 5)  # a second key
    assert p.insert_key(0, h(1), 0)  # the null block, by hand
    assert p.cache_keys(3) == [(h(1), 0), (h(2), 5)]
    assert p.get_cached_block(h(1), [0]) == [3]
    assert p.num_cached_blocks == 2
    assert p.free_block_ids().tolist() == before
    assert p.take_events() == []
    p.check_invariants()
    p.evict_blocks([3])
    assert p.get_cached_block(h(1), [0]) == [0]
    p.check_invariants()
    assert p.reset_prefix_cache()
    assert p.cache_keys(0) == []
    p.check_invariants()


def test_insert_key_refusals_change_nothing() -> None:
    p = BlockPool(6, hash_block_size=4)
    p.insert_key(2, h(1), 0)
    state = snapshot(p)
    with pytest.raises(InvalidBlockIdError):
        p.insert_key(6, h(1), 0)
    with pytest.raises(InvalidHashError):
        p.insert_key(1, b"short", 0)
    with pytest.raises(InvalidArgumentError):
        p.insert_key(1, h(1), -1)
    assert snapshot(p) == state
    ranked = BlockPool(6, eviction_policy="lfu")
    with pytest.raises(InvalidArgumentError):
        ranked.insert_key(1, h(1), 0)
    assert ranked.num_cached_blocks == 0
    off = BlockPool(6, enable_caching=False)
    assert not off.insert_key(1, h(1), 0)
    off.check_invariants()


def test_find_longest_cache_hit_per_spec() -> None:
    p = BlockPool(20, hash_block_size=2)
    hashes = [h(i) for i in range(6)]
    for i in (0, 1, 3, 4):
        p.insert_key(10 + i, hashes[i], 0)
    full = GroupSpec.full_attention(2)
    assert p.find_longest_cache_hit(full, [0], hashes, 12, 2) == ([[10, 11]], 4)
    assert p.find_longest_cache_hit(full, [0], hashes, 12, 2, drop_eagle=True) == ([[10]], 2)
    window = GroupSpec.sliding_window(2, 4)
    assert p.find_longest_cache_hit(window, [0], hashes, 12, 2) == ([[0, 0, 0, 13, 14]], 10)
    assert p.find_longest_cache_hit(window, [0, 1], hashes, 12, 2) == ([[], []], 0)
    with pytest.raises(InvalidArgumentError):
        p.find_longest_cache_hit(full, [0], hashes, 12, 0)
    with pytest.raises(InvalidHashError):
        p.find_longest_cache_hit(full, [0], [b"x"], 2, 2)
    p.check_invariants()
