"""Eviction policies from Python: the ``eviction_policy`` keyword of
``BlockPool``, ``set_priority`` and ``advance_clock``. The rules and their
model-based tests live in the Rust core (``docs/eviction.md``); these tests
check the binding: spec strings, errors that change nothing, one worked
example per policy, and that every policy keeps LRU's free-count accounting.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

import kvcoord
from kvcoord.errors import ConfigError, InvalidArgumentError, InvalidBlockIdError

POLICIES = ["lru", "lfu", "prefix-depth", "priority:retention=1000"]


def h(i: int) -> bytes:
    return hashlib.sha256(b"block %d" % i).digest()


def cached_chain(pool: kvcoord.BlockPool, n: int) -> list[int]:
    """Allocate ``n`` blocks and cache them as chain blocks 1..n."""
    ids = pool.get_new_blocks(n)
    pool.cache_full_blocks(ids, [h(i) for i in range(n)], 0, n, 0)
    return ids


def test_default_is_vllm_lru() -> None:
    assert kvcoord.BlockPool(8).eviction_policy == "lru"


@pytest.mark.parametrize(
    ("spec", "shown"),
    [
        ("lru", "lru"),
        ("lfu", "lfu"),
        ("lfu:half_life=64", "lfu:half_life=64"),
        ("prefix-depth", "prefix-depth"),
        ("prefix-depth:half_life=9", "prefix-depth:half_life=9"),
        ("priority", "priority:retention=1000"),
        ("priority:retention=5", "priority:retention=5"),
    ],
)
def test_spec_strings(spec: str, shown: str) -> None:
    pool = kvcoord.BlockPool(8, eviction_policy=spec)
    assert pool.eviction_policy == shown
    pool.check_invariants()


@pytest.mark.parametrize(
    "spec", ["", "LRU", "arc", "lfu:half_life=-1", "lru:x=1", "priority:retention=x"]
)
def test_unknown_policy_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="eviction_policy"):
        kvcoord.BlockPool(8, eviction_policy=spec)
    with pytest.raises(ValueError):
        kvcoord.BlockPool(8, eviction_policy=spec)


def test_lfu_keeps_the_block_hit_most() -> None:
    pool = kvcoord.BlockPool(8, eviction_policy="lfu:half_life=100")
    a = cached_chain(pool, 4)
    pool.touch([a[1], a[1]])
    pool.free_blocks([a[1], a[1]])
    pool.free_blocks(a[::-1])
    assert pool.free_block_ids().tolist() == [5, 6, 7, 4, 3, 1, 2]


def test_prefix_depth_evicts_deep_blocks_first() -> None:
    pool = kvcoord.BlockPool(8, eviction_policy="prefix-depth:half_life=100")
    a = cached_chain(pool, 4)
    pool.free_blocks(a)  # shallowest first: LRU would evict block 1 first
    assert pool.free_block_ids().tolist() == [5, 6, 7, 4, 2, 3, 1]


def test_priority_protects_until_retention_expires() -> None:
    pool = kvcoord.BlockPool(8, eviction_policy="priority:retention=10")
    a = cached_chain(pool, 4)
    pool.set_priority(np.array(a[:1]), 5)
    pool.free_blocks(a)
    assert pool.free_block_ids().tolist() == [5, 6, 7, 2, 3, 4, 1]
    pool.advance_clock(10)
    b = pool.get_new_blocks(1)
    pool.cache_full_blocks(b, [h(99)], 0, 1, 0)
    pool.free_blocks(b)
    # Block 1 became ordinary at tick 10, before block 5 was released.
    assert pool.free_block_ids().tolist() == [6, 7, 2, 3, 4, 1, 5]


@pytest.mark.parametrize("spec", POLICIES)
def test_bad_calls_change_nothing(spec: str) -> None:
    pool = kvcoord.BlockPool(8, eviction_policy=spec)
    a = cached_chain(pool, 3)
    before = (pool.free_block_ids().tolist(), pool.ref_counts().tolist())
    with pytest.raises(InvalidArgumentError, match="priority"):
        pool.set_priority(a, 8)
    with pytest.raises(InvalidArgumentError, match="priority"):
        pool.set_priority(a, -1)
    with pytest.raises(InvalidBlockIdError):
        pool.set_priority([a[0], 8], 1)
    with pytest.raises(InvalidArgumentError, match="ticks"):
        pool.advance_clock(-1)
    with pytest.raises(InvalidArgumentError, match="ticks"):
        pool.advance_clock(2**31)
    assert (pool.free_block_ids().tolist(), pool.ref_counts().tolist()) == before
    pool.check_invariants()


@pytest.mark.parametrize(
    ("call", "value"),
    [
        ("set_priority", 2**70),
        ("set_priority", "2"),
        ("advance_clock", 2**70),
        ("advance_clock", 1.5),
        ("set_residency_clock", 2**70),
        ("set_residency_clock", -1),
    ],
)
def test_out_of_range_scalars_are_kvcoord_errors(call: str, value: object) -> None:
    # Regression: these scalars were extracted as i64/u64 by PyO3 and raised a
    # bare OverflowError or TypeError; they now go through the one converter.
    pool = kvcoord.BlockPool(8, eviction_policy="priority")
    a = cached_chain(pool, 3)
    before = (pool.free_block_ids().tolist(), pool.ref_counts().tolist())
    args = (a, value) if call == "set_priority" else (value,)
    with pytest.raises(InvalidArgumentError):
        getattr(pool, call)(*args)
    assert (pool.free_block_ids().tolist(), pool.ref_counts().tolist()) == before
    pool.check_invariants()


@pytest.mark.parametrize("spec", POLICIES[1:])
def test_free_count_accounting_equals_lru(spec: str) -> None:
    """Same random calls on an LRU pool and a policy pool: the same calls
    succeed and the free counts agree (every unreferenced block is free);
    only which free block is reused, and so which prefixes stay cached,
    may differ."""
    rng = random.Random(spec)
    lru = kvcoord.BlockPool(32, eviction_policy="lru")
    other = kvcoord.BlockPool(32, eviction_policy=spec)
    owners: list[tuple[list[int], list[int]]] = []
    for step in range(400):
        op = rng.randrange(5)
        if op == 0:
            n = rng.randrange(6)
            if n > lru.num_free_blocks:
                for pool in (lru, other):
                    with pytest.raises(kvcoord.errors.OutOfBlocksError):
                        pool.get_new_blocks(n)
            elif n:
                owners.append((lru.get_new_blocks(n), other.get_new_blocks(n)))
        elif op == 1 and owners:
            x, y = owners.pop(rng.randrange(len(owners)))
            lru.free_blocks(x[::-1])
            other.free_blocks(y[::-1])
        elif op == 2 and owners:
            x, y = owners[rng.randrange(len(owners))]
            keys = [h(rng.randrange(8)) for _ in x]
            for pool, ids in ((lru, x), (other, y)):
                if not any(pool.block_hash(b) for b in ids):
                    pool.cache_full_blocks(ids, keys, 0, len(ids), 0)
        elif op == 3 and owners:
            # A prefix hit: a new owner shares the blocks cached under a key.
            key = h(rng.randrange(8))
            x, y = lru.get_cached_block(key, [0]), other.get_cached_block(key, [0])
            if x and y:
                lru.touch(x)
                other.touch(y)
                owners.append((x, y))
        elif owners:
            x, y = owners[rng.randrange(len(owners))]
            lru.set_priority(x, rng.randrange(8))
            other.set_priority(y, rng.randrange(8))
            tick = rng.randrange(3)
            lru.advance_clock(tick)
            other.advance_clock(tick)
        assert other.num_free_blocks == lru.num_free_blocks, step
        unreferenced = np.flatnonzero(other.ref_counts() == 0)[1:]  # null block excluded
        assert sorted(other.free_block_ids().tolist()) == unreferenced.tolist()
        other.check_invariants()


def test_manager_pool_view_reports_its_eviction_policy() -> None:
    config = kvcoord.KVCacheConfig(
        num_blocks=8, groups=(kvcoord.KVCacheGroup(kvcoord.FullAttentionSpec(4)),)
    )
    view = kvcoord.KVCacheManager(config, max_model_len=64).block_pool
    assert view.eviction_policy == "lru"
