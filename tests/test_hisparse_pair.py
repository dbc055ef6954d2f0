"""``kvcoord._core.HiSparsePair``: each call changes the host and device
halves of a HiSparse manager together or not at all. A failure is injected
in each half (a pool too small, an argument only that half checks), and
both halves' full state (free queue, reference counts, cache keys, tables)
must be as before; the negative controls run the same failures through two
separate core calls, which leave the first core changed."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from kvcoord import FullAttentionSpec, KVCacheConfig, KVCacheGroup, Request
from kvcoord._core import MAX_TOKENS, CoordinatorCore, HiSparsePair
from kvcoord.config import HiSparseHotSpec, HiSparseResidentSpec
from kvcoord.coordinator import get_kv_cache_coordinator
from kvcoord.errors import ConfigError, InvariantError, KvCoordError, UnknownRequestError

B = 4
IDS = ("a", "b")


def halves(host_blocks: int, device_blocks: int) -> tuple[CoordinatorCore, CoordinatorCore]:
    """A host core (one full-attention group) and a device core (indexer,
    resident, hot), as kvcoord.vllm's HiSparse manager builds them."""
    host = get_kv_cache_coordinator(
        KVCacheConfig(host_blocks, (KVCacheGroup(FullAttentionSpec(B)),)),
        max_model_len=256,
        enable_caching=True,
        allow_partial_hits=True,
        verify_hits=False,
        event_medium="CPU",
    ).core
    groups = (FullAttentionSpec(B), HiSparseResidentSpec(B), HiSparseHotSpec(B, 2))
    device = get_kv_cache_coordinator(
        KVCacheConfig(device_blocks, tuple(KVCacheGroup(s) for s in groups)),
        max_model_len=256,
        enable_caching=True,
        group_id_base=1,
    ).core
    return host, device


def snapshot(core: CoordinatorCore) -> tuple[Any, ...]:
    """Everything the test can read of a core: the free queue in order,
    every block's references and cache key, the requests' tables."""
    pool = core.block_pool
    tables = {}
    for rid in IDS:
        with contextlib.suppress(UnknownRequestError):
            tables[rid] = [list(g) for g in core.blocks(rid).arrays()]
    return (
        pool.free_block_ids().tolist(),
        pool.ref_counts().tolist(),
        [pool.block_hash(b) for b in range(pool.num_blocks)],
        core.num_requests,
        tables,
    )


def warmed(host_blocks: int, device_blocks: int) -> HiSparsePair:
    """Request "a" ran, was cached in both pools and finished: cached free
    blocks that an allocation may evict."""
    host, device = halves(host_blocks, device_blocks)
    pair = HiSparsePair(host, device)
    a = Request("a", list(range(12)), hash_block_size=B)
    got = pair.allocate_slots(a, 12, delay_cache_blocks=True)
    assert got is not None and [len(g) for g in got.get_block_ids()] == [3, 3, 3, 0]
    pair.check_invariants()
    host.cache_blocks(a, 12)
    device.cache_blocks(a, 12)
    assert pair.free("a")
    assert host.block_pool.num_cached_blocks and device.block_pool.num_cached_blocks
    pair.check_invariants()
    return pair


def b_request() -> Request:
    return Request("b", list(range(100, 140)), hash_block_size=B)


def refused_unchanged(pair: HiSparsePair, raises: bool, **step: Any) -> None:
    before = snapshot(pair.host), snapshot(pair.device)
    if raises:
        with pytest.raises(KvCoordError):
            pair.allocate_slots(b_request(), **step)
    else:
        assert pair.allocate_slots(b_request(), **step) is None
    pair.check_invariants()
    assert snapshot(pair.host) == before[0], "host half changed"
    assert snapshot(pair.device) == before[1], "device half changed"


# What only the device half refuses: its pool cannot hold 40 tokens where
# the host's can; encoder tokens out of range (the host half takes none);
# one hit list for three device groups.
DEVICE_FAILURES = {
    "device_pool_too_small": (16, False, {"num_new_tokens": 40}),
    "encoder_tokens_out_of_range": (
        64,
        True,
        {"num_new_tokens": 8, "num_encoder_tokens": MAX_TOKENS},
    ),
    "device_hits_of_one_group": (64, True, {"num_new_tokens": 8, "device_hits": [[1]]}),
}


@pytest.mark.parametrize("case", DEVICE_FAILURES, ids=list(DEVICE_FAILURES))
def test_a_device_failure_leaves_both_halves_as_they_were(case: str) -> None:
    device_blocks, raises, step = DEVICE_FAILURES[case]
    refused_unchanged(warmed(64, device_blocks), raises, **step)


def test_the_two_call_path_leaves_the_host_changed_on_a_device_failure() -> None:
    # Negative control: the host core allocated by its own call first (the
    # manager's path before the pair), the device core's refusal leaves the
    # host changed and the halves out of step.
    pair = warmed(64, 64)
    before = snapshot(pair.host), snapshot(pair.device)
    b = b_request()
    assert pair.host.allocate_slots(b, 8, delay_cache_blocks=True) is not None
    with pytest.raises(KvCoordError):
        pair.device.allocate_slots(b, 8, num_encoder_tokens=MAX_TOKENS, delay_cache_blocks=True)
    assert snapshot(pair.device) == before[1]
    assert snapshot(pair.host) != before[0]
    with pytest.raises(InvariantError, match="host core tracks 1 requests"):
        pair.check_invariants()


# What only the host half refuses: its pool cannot hold 40 tokens where
# the device's can; a host hit naming no block of the host pool.
HOST_FAILURES = {
    "host_pool_too_small": (8, False, {"num_new_tokens": 40}),
    "host_hit_out_of_range": (64, True, {"num_new_tokens": 8, "host_hits": [999]}),
}


@pytest.mark.parametrize("case", HOST_FAILURES, ids=list(HOST_FAILURES))
def test_a_host_failure_leaves_both_halves_as_they_were(case: str) -> None:
    host_blocks, raises, step = HOST_FAILURES[case]
    refused_unchanged(warmed(host_blocks, 64), raises, **step)


def test_the_device_first_two_call_path_leaves_the_device_changed_on_a_host_failure() -> None:
    # Negative control: the pair allocates the device half first; without
    # its plan of the host half, the host's refusal would come after the
    # device changed.
    pair = warmed(8, 64)
    before = snapshot(pair.host), snapshot(pair.device)
    b = b_request()
    assert pair.device.allocate_slots(b, 40, delay_cache_blocks=True) is not None
    assert pair.host.allocate_slots(b, 40, delay_cache_blocks=True) is None
    assert snapshot(pair.host) == before[0]
    assert snapshot(pair.device) != before[1]
    with pytest.raises(InvariantError):
        pair.check_invariants()


def test_frees_and_pops_both_halves() -> None:
    pair = warmed(64, 64)
    b = b_request()
    got = pair.allocate_slots(b, 9)
    assert got is not None
    host_ids = list(got.get_block_ids()[0])
    popped = pair.pop_request_to_caller("b")
    assert popped is not None and len(popped) == 4 and popped[0] == host_ids
    assert pair.pop_request_to_caller("b") is None
    assert not pair.free("b")
    pair.check_invariants()


def test_the_host_admission_count_and_the_resident_cap_are_the_cores() -> None:
    pair = HiSparsePair(*halves(8, 64))
    b = b_request()
    # 7 host blocks (one is the null block): 28 tokens fit, 40 do not.
    assert pair.host_admission_blocks(b, 28) == 0
    assert pair.host_admission_blocks(b, 40) == 65
    device = pair.device.num_blocks_to_allocate(b, 40)
    assert pair.num_blocks_to_allocate(b, 40) == device + 65
    # The resident group (vLLM group 2): the in-flight window's pages.
    assert pair.max_admission_blocks(2, 10) == 3
    assert pair.max_admission_blocks(2, 10_000) == 64
    assert pair.max_admission_blocks(1, 10) is None


def test_the_pairs_shape_is_checked() -> None:
    host, device = halves(8, 64)
    with pytest.raises(ConfigError):
        HiSparsePair(device, host)
    with pytest.raises(KvCoordError):
        HiSparsePair(host, host)
