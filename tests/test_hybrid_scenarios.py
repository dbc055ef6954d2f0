"""Hybrid-coordinator scenarios of the spec (§8.7: 48, 50, 51, 52) through the
shipped Python fixed point (`HybridKVCacheCoordinator`) over the Rust finders.

(These lived in Rust against a test-only port of the fixed point; the port is
gone so that the tests exercise the policy that ships.)
"""

from __future__ import annotations

import pytest

import kvcoord
from kvcoord import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    Request,
    SlidingWindowSpec,
)
from kvcoord.coordinator import HybridKVCacheCoordinator


def manager(specs: list[kvcoord.KVCacheSpec], num_blocks: int, unit: int) -> KVCacheManager:
    config = KVCacheConfig(num_blocks, tuple(KVCacheGroup(s) for s in specs))
    options = kvcoord.KVCacheManagerOptions(hash_block_size=unit)
    mgr = KVCacheManager(config, max_model_len=4096, options=options)
    assert isinstance(mgr.coordinator, HybridKVCacheCoordinator)
    return mgr


def lookup(mgr: KVCacheManager, tokens: list[int]) -> tuple[tuple[list[int], ...], int]:
    req = Request("lookup", tokens, hash_block_size=mgr.hash_block_size)
    blocks, hit = mgr.get_computed_blocks(req)
    return blocks.get_block_ids(), hit


def admit(
    mgr: KVCacheManager, rid: str, tokens: list[int]
) -> tuple[tuple[list[int], ...], tuple[list[int], ...]]:
    req = Request(rid, tokens, hash_block_size=mgr.hash_block_size)
    hits, hit = mgr.get_computed_blocks(req)
    new = mgr.allocate_slots(req, req.num_tokens - hit, hit, hits)
    assert new is not None
    mgr.check_invariants()
    return hits.get_block_ids(), new.get_block_ids()


SPECS_48 = [FullAttentionSpec(16), SlidingWindowSpec(16, 32), SlidingWindowSpec(16, 32)]
SHARED_48 = list(range(48))
T0_48 = SHARED_48 + [900] * 7
T1_48 = SHARED_48 + [901] * 5


def setup_48() -> KVCacheManager:
    mgr = manager(SPECS_48, 21, 16)
    _, new = admit(mgr, "r0", T0_48)
    assert new == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    hits, new = admit(mgr, "r1", T1_48)
    assert hits == ([1, 2, 3], [0, 6, 7], [0, 10, 11])
    assert new == ([13], [14], [15])
    refs = mgr.block_pool.ref_counts()
    assert all(refs[b] == 2 for b in (1, 2, 3, 6, 7, 10, 11))
    mgr.free(Request("r0", [0], hash_block_size=16))
    mgr.free(Request("r1", [0], hash_block_size=16))
    return mgr


# Block k of the full group is id k+1, of SWA-a 5+k, of SWA-b 9+k.
@pytest.mark.parametrize(
    ("evict", "blocks"),
    [([5, 9], 3), ([1], 0), ([3, 7, 11], 2), ([3], 2), ([7], 2), ([11], 2), ([3, 5, 9], 0)],
)
def test_full_plus_two_swa_48(evict: list[int], blocks: int) -> None:
    mgr = setup_48()
    mgr.evict_blocks(evict)
    _, hit = lookup(mgr, T1_48)
    assert hit == blocks * 16


def test_different_block_sizes_50() -> None:
    mgr = manager([FullAttentionSpec(32), SlidingWindowSpec(16, 32)], 100, 16)
    tokens = list(range(160))
    req = Request("r0", tokens, hash_block_size=16)
    new = mgr.allocate_slots(req, 112)
    assert new is not None and new.get_block_ids() == ([1, 2, 3, 4], list(range(5, 12)))
    for n in (113, 97):
        b, hit = lookup(mgr, tokens[:n])
        assert (hit, len(b[0]), len(b[1])) == (96, 3, 6), n
    mgr.evict_blocks([10, 11])
    b, hit = lookup(mgr, tokens[:113])
    assert (hit, len(b[0]), len(b[1])) == (64, 2, 4)


def test_fixed_point_convergence_51() -> None:
    specs = [FullAttentionSpec(4), SlidingWindowSpec(4, 8), SlidingWindowSpec(4, 16)]
    mgr = manager(specs, 40, 4)
    tokens = list(range(25))
    _, new = admit(mgr, "r0", tokens)
    assert new == (list(range(1, 8)), list(range(8, 15)), list(range(15, 22)))
    mgr.free(Request("r0", [0], hash_block_size=4))
    # SWA-a blocks 2-3 (ids 10, 11), SWA-b block 4 (id 19).
    mgr.evict_blocks([10, 11, 19])
    req = Request("probe", tokens, hash_block_size=4)
    core = mgr.coordinator.core
    per = [core.find_longest_cache_hit([g], req, 24, 4)[1] for g in range(3)]
    assert per == [24, 24, 16]
    b, hit = lookup(mgr, tokens)
    assert hit == 8
    assert b == ([1, 2], [8, 9], [15, 16])


def test_several_sliding_windows_52() -> None:
    specs = [FullAttentionSpec(16), SlidingWindowSpec(16, 512), SlidingWindowSpec(16, 256)]
    mgr = manager(specs, 40, 16)
    tokens = list(range(96))
    admit(mgr, "r0", tokens)
    mgr.free(Request("r0", [0], hash_block_size=16))
    b, hit = lookup(mgr, tokens)
    assert hit == 80 and all(len(g) == 5 for g in b)

    specs = [FullAttentionSpec(16), SlidingWindowSpec(16, 64), SlidingWindowSpec(16, 32)]
    mgr = manager(specs, 40, 16)
    tokens = list(range(80))
    admit(mgr, "r0", tokens)
    mgr.free(Request("r0", [0], hash_block_size=16))
    b, hit = lookup(mgr, tokens)
    assert hit == 64 and all(len(g) == 4 for g in b)
    mgr.evict_blocks([13])
    b, hit = lookup(mgr, tokens)
    assert hit == 32
    assert b == ([1, 2], [6, 7], [11, 12])
