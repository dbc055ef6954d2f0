"""The KVCacheManager facade: vLLM's scenarios on one group, statistics,
events, and every error path (each leaves the manager unchanged)."""

from __future__ import annotations

import pytest

import kvcoord
from kvcoord import (
    ConfigError,
    FullAttentionSpec,
    InvalidArgumentError,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KVCacheManagerOptions,
    Request,
    SlidingWindowSpec,
    UnknownRequestError,
)

B = 16


def manager(num_blocks: int = 11, *specs: object, **kw: object) -> KVCacheManager:
    groups = tuple(KVCacheGroup(s) for s in (specs or (FullAttentionSpec(B),)))  # type: ignore[arg-type]
    max_model_len = kw.pop("max_model_len", 8192)
    options = KVCacheManagerOptions(**kw)  # type: ignore[arg-type]
    return KVCacheManager(
        KVCacheConfig(num_blocks, groups),
        max_model_len=max_model_len,  # type: ignore[arg-type]
        options=options,
    )


def admit(mgr: KVCacheManager, req: Request) -> tuple[KVCacheBlocks, int, KVCacheBlocks]:
    hit_blocks, hit = mgr.get_computed_blocks(req)
    new = mgr.allocate_slots(req, req.num_tokens - hit, hit, hit_blocks)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return hit_blocks, hit, new


def snapshot(mgr: KVCacheManager) -> tuple[object, ...]:
    pool = mgr.block_pool
    return (
        pool.free_block_ids().tolist(),
        pool.ref_counts().tolist(),
        pool.cached_mask().tolist(),
        mgr.num_running_requests,
    )


def test_prefill_share_free_order() -> None:
    # vLLM scenario: 48 shared tokens, free order [5, 4, 6..10, 3, 2, 1].
    mgr = manager()
    shared = list(range(48))
    r0 = Request("r0", [*shared, *range(100, 107)], hash_block_size=B)
    _, hit, new = admit(mgr, r0)
    assert hit == 0 and new.get_block_ids() == ([1, 2, 3, 4],)
    r1 = Request("r1", [*shared, *range(200, 205)], hash_block_size=B)
    hits, hit, new = admit(mgr, r1)
    assert hit == 48 and hits.get_block_ids() == ([1, 2, 3],)
    assert new.get_block_ids() == ([5],)
    assert mgr.get_block_ids("r1") == ([1, 2, 3, 5],)
    assert mgr.get_num_common_prefix_blocks("r1") == [3]
    mgr.free(r0)
    mgr.free(r1)
    assert mgr.block_pool.free_block_ids().tolist() == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    mgr.free(r1)  # freeing twice is harmless, as in vLLM
    mgr.check_invariants()


def test_decode_returns_the_shared_empty_result() -> None:
    mgr = manager()
    req = Request("r", list(range(20)), hash_block_size=B)
    admit(mgr, req)
    req.append_output_token_ids(1)
    first = mgr.allocate_slots(req, 1)
    second = mgr.allocate_slots(req, 1)
    assert first is second and first is not None and first.is_empty()
    assert first == KVCacheBlocks(([],))


def test_refused_allocation_pins_nothing() -> None:
    mgr = manager(4)
    a = Request("a", list(range(32)), hash_block_size=B)
    admit(mgr, a)
    before = snapshot(mgr)
    big = Request("big", list(range(500, 600)), hash_block_size=B)
    assert mgr.allocate_slots(big, big.num_tokens) is None
    assert snapshot(mgr) == before


def test_prefix_cache_stats_and_reset() -> None:
    mgr = manager()
    a = Request("a", list(range(40)), hash_block_size=B)
    admit(mgr, a)
    b = Request("b", list(range(40)), hash_block_size=B)
    _, hit, _ = admit(mgr, b)
    assert hit == 32
    stats = mgr.make_prefix_cache_stats()
    assert stats is not None and stats.requests == 2 and stats.hits == 32 and stats.queries == 80
    assert stats.hit_rate == pytest.approx(0.4)
    assert mgr.reset_prefix_cache() is False  # blocks still in use
    mgr.free(a)
    mgr.free(b)
    assert mgr.reset_prefix_cache() is True
    assert mgr.make_prefix_cache_stats().reset  # type: ignore[union-attr]


def test_skip_reading_prefix_cache() -> None:
    mgr = manager()
    admit(mgr, Request("a", list(range(40)), hash_block_size=B))
    b = Request("b", list(range(40)), hash_block_size=B)
    b.skip_reading_prefix_cache = True
    blocks, hit = mgr.get_computed_blocks(b)
    assert hit == 0 and blocks.is_empty()


def test_events_through_the_manager() -> None:
    mgr = manager(enable_events=True)
    admit(mgr, Request("a", list(range(40)), hash_block_size=B))
    (stored,) = mgr.take_events()
    assert isinstance(stored, kvcoord.BlockStored) and len(stored.block_hashes) == 2


def test_hybrid_null_blocks_and_common_prefix() -> None:
    mgr = manager(40, FullAttentionSpec(B), SlidingWindowSpec(B, 32))
    req = Request("r", list(range(100)), hash_block_size=B)
    admit(mgr, req)
    req.append_output_token_ids(5)
    assert mgr.allocate_slots(req, 1) is not None
    full, window = mgr.get_block_ids("r")
    assert len(full) == len(window) == 7
    assert window[:4] == [0, 0, 0, 0] and all(window[4:])  # out-of-window blocks released


# ---- error paths ---------------------------------------------------------


def test_num_new_tokens_zero_without_hits() -> None:
    mgr = manager()
    req = Request("r", list(range(10)), hash_block_size=B)
    before = snapshot(mgr)
    with pytest.raises(InvalidArgumentError, match="num_new_tokens must be greater than 0"):
        mgr.allocate_slots(req, 0)
    with pytest.raises(InvalidArgumentError, match="must be non-negative"):
        mgr.allocate_slots(req, -1)
    with pytest.raises(InvalidArgumentError, match="max_model_len"):
        mgr.allocate_slots(req, 10_000)
    assert snapshot(mgr) == before


def test_hits_for_a_running_request_are_refused() -> None:
    mgr = manager()
    a = Request("a", list(range(40)), hash_block_size=B)
    admit(mgr, a)
    before = snapshot(mgr)
    with pytest.raises(InvalidArgumentError, match="running request"):
        mgr.allocate_slots(a, 1, 0, KVCacheBlocks(([1],)))
    with pytest.raises(InvalidArgumentError, match="lists for 1 groups"):
        mgr.allocate_slots(
            Request("b", [1] * 40, hash_block_size=B), 8, 32, KVCacheBlocks(([1], [2]))
        )
    assert snapshot(mgr) == before


def test_unknown_request() -> None:
    mgr = manager()
    with pytest.raises(UnknownRequestError, match="'nope'") as info:
        mgr.get_block_ids("nope")
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownRequestError):
        mgr.get_num_common_prefix_blocks("nope")


def test_hash_block_size_mismatch() -> None:
    mgr = manager()
    with pytest.raises(ConfigError, match="hash_block_size=16"):
        mgr.get_computed_blocks(Request("r", list(range(40)), hash_block_size=8))


def test_invalid_construction() -> None:
    with pytest.raises(ConfigError, match="KVCacheConfig"):
        KVCacheManager("not a config", max_model_len=10)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_model_len"):
        manager(max_model_len=-1)


def test_hits_must_cover_the_computed_prefix() -> None:
    mgr = manager()
    admit(mgr, Request("a", list(range(40)), hash_block_size=B))
    b = Request("b", list(range(40)), hash_block_size=B)
    before = snapshot(mgr)
    with pytest.raises(InvalidArgumentError, match="1 hit blocks for 32 computed tokens"):
        mgr.allocate_slots(b, 8, 32, KVCacheBlocks(([1],)))
    assert snapshot(mgr) == before


def test_manager_pool_is_a_read_only_view() -> None:
    mgr = manager()
    admit(mgr, Request("a", list(range(40)), hash_block_size=B))
    pool = mgr.block_pool
    assert isinstance(pool, kvcoord.BlockPoolView)
    for name in (
        "free_blocks",
        "touch",
        "get_new_blocks",
        "get_new_blocks_array",
        "cache_full_blocks",
        "evict_blocks",
        "reset_prefix_cache",
        "take_events",
    ):
        assert not hasattr(pool, name), name
    assert pool.num_free_blocks == mgr.block_pool.num_free_blocks == 7
    assert pool.cached_mask()[1]
    mgr.evict_blocks([1])  # dropping cache keys goes through the manager
    assert not pool.cached_mask()[1]
    mgr.check_invariants()
