"""Coordinator policies and the factory: which policy a config gets, and the
rules each one enforces."""

from __future__ import annotations

import pytest

import kvcoord
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroup,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcoord.coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvcoord.errors import (
    BlockStateError,
    ConfigError,
    InvalidArgumentError,
    OutOfBlocksError,
)


def cfg(*specs: object, num_blocks: int = 64) -> KVCacheConfig:
    return KVCacheConfig(num_blocks, tuple(KVCacheGroup(s) for s in specs))  # type: ignore[arg-type]


def make(config: KVCacheConfig, caching: bool = True, **kw: object) -> object:
    return get_kv_cache_coordinator(config, max_model_len=1024, enable_caching=caching, **kw)  # type: ignore[arg-type]


def test_factory_choice() -> None:
    assert isinstance(
        make(cfg(FullAttentionSpec(16)), caching=False), KVCacheCoordinatorNoPrefixCache
    )
    assert isinstance(make(cfg(), caching=False), KVCacheCoordinatorNoPrefixCache)
    assert isinstance(make(cfg(FullAttentionSpec(16))), UnitaryKVCacheCoordinator)
    hybrid = make(cfg(FullAttentionSpec(16), SlidingWindowSpec(16, 64)))
    assert isinstance(hybrid, HybridKVCacheCoordinator)


def test_hybrid_merges_equal_specs_full_attention_first() -> None:
    c = make(
        cfg(
            SlidingWindowSpec(16, 64),
            FullAttentionSpec(16),
            FullAttentionSpec(16),
            SlidingWindowSpec(16, 32),
        )
    )
    assert isinstance(c, HybridKVCacheCoordinator)
    assert [sg.group_ids for sg in c.spec_groups] == [(1, 2), (0,), (3,)]


@pytest.mark.parametrize(
    ("config", "kw", "message"),
    [
        (cfg(), {}, "at least one KV cache group"),
        (cfg(FullAttentionSpec(16), MambaSpec(16)), {}, "Mamba"),
        (cfg(FullAttentionSpec(16), CrossAttentionSpec(16)), {}, "cross-attention"),
        (cfg(MambaSpec(16)), {}, "Mamba"),
        (cfg(FullAttentionSpec(16)), {"hash_block_size": 8}, "must equal the block size"),
        (
            cfg(FullAttentionSpec(32), SlidingWindowSpec(16, 64)),
            {"hash_block_size": 32},
            "multiple of hash_block_size",
        ),
        (cfg(FullAttentionSpec(32)), {"hash_block_size": 0}, "hash_block_size"),
        (cfg(FullAttentionSpec(32)), {"hash_block_size": 64}, "must divide the scheduler"),
        (cfg(FullAttentionSpec(16)), {"max_model_len": 0}, "max_model_len"),
    ],
)
def test_factory_rejects(config: KVCacheConfig, kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        kw = {"max_model_len": 1024, **kw}
        get_kv_cache_coordinator(config, enable_caching=True, **kw)  # type: ignore[arg-type]


def test_mamba_and_cross_attention_work_without_caching() -> None:
    c = make(cfg(FullAttentionSpec(16), MambaSpec(16), CrossAttentionSpec(16)), caching=False)
    req = kvcoord.Request("r", list(range(40)), hash_block_size=16)
    blocks, hit, uncached = c.find_longest_cache_hit(req, 39)
    assert hit == 0 and uncached == 0 and blocks.get_block_ids() == ([], [], [])


def test_default_hash_block_size_is_gcd() -> None:
    c = make(cfg(FullAttentionSpec(32), SlidingWindowSpec(16, 64)))
    assert c.hash_block_size == 16 and c.scheduler_block_size == 32


def _cache_prompt(manager: kvcoord.KVCacheManager, req: kvcoord.Request) -> None:
    blocks, hit = manager.get_computed_blocks(req)
    assert manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
    req.num_computed_tokens = req.num_tokens


def test_fixed_point_shrinks_until_groups_agree() -> None:
    # Spec scenario 51: full, SWA (2 blocks), SWA (4 blocks), bs 4, 25-token prompt.
    config = cfg(
        FullAttentionSpec(4), SlidingWindowSpec(4, 8), SlidingWindowSpec(4, 16), num_blocks=40
    )
    manager = kvcoord.KVCacheManager(config, max_model_len=1024)
    prompt = list(range(100, 125))
    first = kvcoord.Request("a", prompt, hash_block_size=4)
    _cache_prompt(manager, first)
    ids = manager.get_block_ids("a")
    manager.free(first)
    # Drop SWA-a keys of blocks 2-3 and the SWA-b key of block 4.
    manager.evict_blocks([ids[1][2], ids[1][3], ids[2][4]])
    again = kvcoord.Request("b", prompt, hash_block_size=4)
    blocks, hit = manager.get_computed_blocks(again)
    assert hit == 8
    assert [len(g) for g in blocks.get_block_ids()] == [2, 2, 2]
    assert blocks.get_block_ids()[0] == ids[0][:2]


def test_hybrid_lookup_leaves_non_cacheable_groups_out() -> None:
    # vLLM 0.33.0's HiSparse device groups sit beside caching: the lookup
    # skips them (an empty hit there), it does not cut the hit to 0.
    config = cfg(FullAttentionSpec(4), HiSparseResidentSpec(4), HiSparseHotSpec(4, 2))
    coordinator = make(config)
    assert isinstance(coordinator, HybridKVCacheCoordinator)
    assert [sg.group_ids for sg in coordinator.spec_groups] == [(0,)]
    core = coordinator.core  # type: ignore[attr-defined]
    first = kvcoord.Request("a", list(range(9)), hash_block_size=4)
    assert core.allocate_slots(first, 9) is not None
    again = kvcoord.Request("b", list(range(9)), hash_block_size=4)
    blocks, hit, _ = coordinator.find_longest_cache_hit(again, 8)  # type: ignore[attr-defined]
    assert hit == 8
    assert [len(g) for g in blocks.get_block_ids()] == [2, 0, 0]
    # Adopting the hit: the resident group starts with host-only pages, the
    # hot group with its region (the request resumes a host prefix).
    assert core.allocate_slots(again, 1, num_new_computed_tokens=8, new_computed_blocks=blocks)
    tables = core.blocks("b").get_block_ids()
    assert tables[1][:2] == [0, 0] and tables[1][2] != 0
    assert core.has_hot("b", 2) and len(tables[2]) == 2
    core.check_invariants()


def test_per_group_lookup_does_not_reconcile() -> None:
    # The same evictions as above: each spec group reports its own hit.
    config = cfg(
        FullAttentionSpec(4), SlidingWindowSpec(4, 8), SlidingWindowSpec(4, 16), num_blocks=40
    )
    manager = kvcoord.KVCacheManager(config, max_model_len=1024)
    prompt = list(range(100, 125))
    first = kvcoord.Request("a", prompt, hash_block_size=4)
    _cache_prompt(manager, first)
    ids = manager.get_block_ids("a")
    manager.free(first)
    manager.evict_blocks([ids[1][2], ids[1][3], ids[2][4]])
    again = kvcoord.Request("b", prompt, hash_block_size=4)
    coordinator = manager.coordinator
    assert isinstance(coordinator, HybridKVCacheCoordinator)
    blocks, hits = coordinator.find_longest_cache_hit_per_group(again, 24)
    assert hits[0] == 24 and hits[0] > min(hits)
    assert [len(g) for g in blocks.get_block_ids()] == [h // 4 for h in hits]
    assert blocks.get_block_ids()[0] == ids[0][:6]


def test_per_group_lookup_with_eagle_groups() -> None:
    # Regression: the per-group lookup unpacked the spec-group scans without
    # their EAGLE margin (a ValueError on every call once EAGLE groups existed).
    config = cfg(FullAttentionSpec(4), SlidingWindowSpec(4, 8), SlidingWindowSpec(4, 8))
    hybrid = make(config, eagle_group_ids=[2])
    assert isinstance(hybrid, HybridKVCacheCoordinator)
    request = kvcoord.Request("r", list(range(20)), hash_block_size=4)
    blocks, hits = hybrid.find_longest_cache_hit_per_group(request, 16)
    assert hits == (0, 0, 0)
    assert [len(g) for g in blocks.get_block_ids()] == [0, 0, 0]


def test_chunked_local_hit_counts_skipped_chunks() -> None:
    config = cfg(FullAttentionSpec(4), ChunkedLocalAttentionSpec(4, 8), num_blocks=40)
    manager = kvcoord.KVCacheManager(config, max_model_len=1024)
    prompt = list(range(30))
    _cache_prompt(manager, kvcoord.Request("a", prompt, hash_block_size=4))
    blocks, hit = manager.get_computed_blocks(kvcoord.Request("b", prompt, hash_block_size=4))
    assert hit == 28
    local = blocks.get_block_ids()[1]
    assert local[:6] == [0] * 6 and all(local[6:])


def test_eagle_groups_join_by_spec_and_only_they_drop() -> None:
    config = cfg(FullAttentionSpec(4), SlidingWindowSpec(4, 8), SlidingWindowSpec(4, 8))
    hybrid = make(config, eagle_group_ids=[2])
    assert isinstance(hybrid, HybridKVCacheCoordinator)
    # Equal specs are looked up together, so group 1 drops with group 2;
    # the margin is one block.
    assert hybrid.eagle_margins == (None, 4, 4)
    request = kvcoord.Request("r", list(range(20)), hash_block_size=4)
    with pytest.raises(ValueError, match="not an EAGLE group"):
        hybrid.core.find_longest_cache_hit([0], request, 16, 4, drop_eagle=True)
    _, hit = hybrid.core.find_longest_cache_hit([1, 2], request, 16, 4, drop_eagle=True)
    assert hit == 0
    with pytest.raises(ConfigError, match="eagle_group_ids"):
        make(config, eagle_group_ids=[3])
    unitary = make(cfg(SlidingWindowSpec(4, 8)), eagle_group_ids=[0])
    assert isinstance(unitary, UnitaryKVCacheCoordinator)
    assert unitary.eagle_margins == (4,)


def test_caller_held_blocks_and_key_edits_go_through_the_core() -> None:
    """Blocks taken outside every request table: counted by the core's
    invariant, cached and freed only while held; a dropped key comes back with
    ``insert_cache_key``. Every refusal raises and leaves the core as it was."""
    c = make(cfg(FullAttentionSpec(16), num_blocks=8))
    core = c.core
    pool = core.block_pool
    taken = core.get_caller_blocks(3)
    assert taken == [1, 2, 3] and core.num_caller_references == 3
    core.check_invariants()
    req = kvcoord.Request("r", list(range(48)), hash_block_size=16)
    hashes = list(req.block_hashes)
    with pytest.raises(OutOfBlocksError):
        core.get_caller_blocks(5)
    with pytest.raises(InvalidArgumentError):
        core.cache_caller_blocks(taken, hashes, 0, 2, 0, 32)  # not one hash unit
    with pytest.raises(InvalidArgumentError):
        core.cache_caller_blocks(taken, hashes, 0, 2, 1, 16)  # no group 1
    with pytest.raises(BlockStateError):
        core.cache_caller_blocks([4], hashes, 0, 1, 0, 16)  # not the caller's
    with pytest.raises(BlockStateError):
        core.free_caller_blocks([1, 1])
    assert pool.num_cached_blocks == 0 and core.num_caller_references == 3
    core.cache_caller_blocks(taken, hashes, 0, 2, 0, 16)
    assert pool.get_cached_block(hashes[1], [0]) == [2]
    core.free_caller_blocks(taken)
    assert core.num_caller_references == 0
    core.check_invariants()
    core.evict_blocks([2])
    assert pool.get_cached_block(hashes[1], [0]) is None
    with pytest.raises(BlockStateError):
        core.insert_cache_key(hashes[1], 0, [1])  # cached under its own key
    with pytest.raises(InvalidArgumentError):
        core.insert_cache_key(hashes[1], 0, [0])
    core.insert_cache_key(hashes[1], 0, [2])
    assert pool.get_cached_block(hashes[1], [0]) == [2]
    core.check_invariants()


def test_reprefillable_tail_is_held_back_per_group() -> None:
    """Multi-module MTP: one caching group holds back the whole tail; a
    hybrid coordinator only in its EAGLE groups (the others cache the
    scheduler-block-aligned prefix), which cache one block past it."""
    unitary = make(cfg(FullAttentionSpec(4)), num_reprefillable_tokens=2).core  # type: ignore[attr-defined]
    assert unitary.num_reprefillable_tokens == 2
    assert unitary.held_back_tokens == [2]
    assert unitary.num_cacheable_tokens(0, 11) == 9
    hybrid = make(
        cfg(FullAttentionSpec(4), FullAttentionSpec(8)),
        num_reprefillable_tokens=3,
        eagle_group_ids=[0],
    ).core  # type: ignore[attr-defined]
    assert hybrid.eagle_groups == [0]
    assert hybrid.held_back_tokens == [3, 0]
    assert [hybrid.num_cacheable_tokens(g, 17) for g in (0, 1)] == [12, 16]
    with pytest.raises(ValueError, match="no KV cache group 2"):
        hybrid.num_cacheable_tokens(2, 17)
    with pytest.raises(ConfigError, match="eagle_group_ids"):
        make(cfg(FullAttentionSpec(4)), eagle_group_ids=[1])
    # Groups of equal spec join an EAGLE group.
    joined = make(cfg(FullAttentionSpec(4), FullAttentionSpec(4)), eagle_group_ids=[1]).core  # type: ignore[attr-defined]
    assert joined.eagle_groups == [0, 1]
    with pytest.raises(ValueError):
        make(cfg(FullAttentionSpec(4)), num_reprefillable_tokens=-1)
