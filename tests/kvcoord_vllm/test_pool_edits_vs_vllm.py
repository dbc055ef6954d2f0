"""vLLM's pool interface used directly on a manager's pool, as vLLM's own
tests do (``block_pool.get_new_blocks`` / ``cache_full_blocks`` /
``free_blocks`` of blocks no request holds, and edits of
``cached_block_hash_to_block``), on kvcoord.vllm.KVCacheManager beside vLLM
0.33.0's own manager: the same calls must give the same block ids, events,
free queue and later hits, and every refused call must leave kvcoord's
manager unchanged and consistent.

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash, make_block_hash_with_group_id
from vllm.v1.kv_cache_interface import SlidingWindowSpec
from vllm_helpers import BS, config, free_queue, full_spec, ids, make_request, manager_args

import kvcoord.vllm as kv
from kvcoord.errors import BlockStateError, InvalidArgumentError


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def window_spec() -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=2 * BS
    )


def managers(specs: list[Any], num_blocks: int = 24, **kw: Any) -> tuple[Any, Any]:
    cfg = config(num_blocks, specs)
    args = manager_args(
        **{"max_model_len": 512, "scheduler_block_size": BS, "hash_block_size": BS, **kw}
    )
    theirs = kv.original_manager_class()(cfg, **args)
    ours = kv.KVCacheManager(cfg, **args)
    assert isinstance(ours, kv.KVCacheManager)
    return theirs, ours


def state(m: Any) -> tuple[Any, ...]:
    """What both engines can be compared on: the free queue, every block's
    reference count and key."""
    blocks = m.block_pool.blocks
    return (
        free_queue(m),
        [b.ref_cnt for b in blocks],
        [b.block_hash for b in blocks],
    )


def lookup(m: Any, rid: str, tokens: list[int]) -> tuple[Any, int]:
    blocks, hit, _ = m.get_computed_blocks(make_request(rid, tokens))
    return ids(blocks), hit


@pytest.mark.parametrize("seed", range(4))
def test_caller_blocks_match_vllm(seed: int) -> None:
    """Blocks taken from the pool by hand, cached under a request's hashes in
    some group and freed: same ids, events, free queue and later hits."""
    rng = random.Random(seed)
    theirs, ours = managers([full_spec(), window_spec()], enable_kv_cache_events=True)
    tokens = [rng.randrange(50) for _ in range(6 * BS + 1)]
    held = make_request("held", tokens[: 3 * BS])
    for m in (theirs, ours):
        assert m.allocate_slots(held, held.num_tokens) is not None
    group = rng.randrange(2)
    source = make_request("src", tokens)
    taken = {}
    for m in (theirs, ours):
        blocks = m.block_pool.get_new_blocks(5)
        m.block_pool.cache_full_blocks(
            request=source,
            blocks=blocks,
            num_cached_blocks=1,
            num_full_blocks=4,
            block_size=BS,
            kv_cache_group_id=group,
        )
        taken[id(m)] = blocks
    assert [b.block_id for b in taken[id(ours)]] == [b.block_id for b in taken[id(theirs)]]
    assert ours.take_events() == theirs.take_events()
    assert state(ours) == state(theirs)
    ours.check_invariants()
    order = list(range(5))
    rng.shuffle(order)
    for m in (theirs, ours):
        m.block_pool.free_blocks([taken[id(m)][i] for i in order])
    assert state(ours) == state(theirs)
    ours.check_invariants()
    assert lookup(ours, "probe", tokens) == lookup(theirs, "probe", tokens)
    for m in (theirs, ours):
        m.free(held)
        m.reset_prefix_cache()
    assert ours.take_events() == theirs.take_events()
    assert state(ours) == state(theirs)
    ours.check_invariants()


def test_refused_pool_calls_change_nothing() -> None:
    """What vLLM's pool would let corrupt a manager is refused, and leaves
    kvcoord's manager exactly as it was."""
    _, ours = managers([full_spec()])
    req = make_request("r", list(range(3 * BS)))
    assert ours.allocate_slots(req, req.num_tokens) is not None
    mine = ours.block_pool.get_new_blocks(2)
    before = state(ours)
    request_block = ours.get_block_ids("r")[0][0]
    with pytest.raises(BlockStateError):
        ours.block_pool.free_blocks([mine[0], ours.block_pool.blocks[request_block]])
    with pytest.raises(BlockStateError):
        ours.block_pool.free_blocks([mine[0], mine[0]])
    with pytest.raises(BlockStateError):  # a request's blocks are cached through it
        ours.block_pool.cache_full_blocks(req, ours.get_blocks("r").blocks[0], 0, 1, BS, 0)
    with pytest.raises(InvalidArgumentError):
        ours.block_pool.cache_full_blocks(req, mine, 0, 1, 2 * BS, 0)
    with pytest.raises(InvalidArgumentError):
        ours.block_pool.cache_full_blocks(req, mine, 0, 1, BS, 1)
    assert state(ours) == before
    ours.check_invariants()
    ours.block_pool.free_blocks(mine)
    with pytest.raises(BlockStateError):  # freed already
        ours.block_pool.free_blocks(mine[:1])
    ours.check_invariants()


@pytest.mark.parametrize("seed", range(6))
def test_index_edits_match_vllm(seed: int) -> None:
    """vLLM's tests hide cached blocks from a lookup by popping their keys
    from ``cached_block_hash_to_block._cache`` and put them back from a copy
    (or pop one block with ``pop(key, block_id)``): the hits in between and
    after must be vLLM's."""
    rng = random.Random(seed)
    theirs, ours = managers([full_spec(), window_spec()])
    tokens = [rng.randrange(6) for _ in range(6 * BS + 2)]
    first = make_request("0", tokens)
    for m in (theirs, ours):
        assert m.allocate_slots(first, first.num_tokens) is not None
    if rng.random() < 0.5:
        for m in (theirs, ours):
            m.free(first)
    hashes = first.block_hashes
    keys = [make_block_hash_with_group_id(h, g) for h in hashes for g in range(2)]
    for round_ in range(3):
        hidden = rng.sample(keys, rng.randrange(1, 4))
        saved = {}
        for m in (theirs, ours):
            entries = m.block_pool.cached_block_hash_to_block._cache
            saved[id(m)] = copy.copy(entries)
            for key in hidden:
                entries.pop(key, None)
        assert lookup(ours, f"p{round_}", tokens) == lookup(theirs, f"p{round_}", tokens)
        for m in (theirs, ours):
            entries = m.block_pool.cached_block_hash_to_block._cache
            for key in hidden:
                if key in saved[id(m)]:
                    entries[key] = saved[id(m)][key]
        assert state(ours) == state(theirs)
        assert lookup(ours, f"q{round_}", tokens) == lookup(theirs, f"q{round_}", tokens)
        ours.check_invariants()
    key = rng.choice(keys)
    index = {id(m): m.block_pool.cached_block_hash_to_block for m in (theirs, ours)}
    block = index[id(theirs)].get_one_block(key)
    if block is not None:
        for m in (theirs, ours):
            popped = index[id(m)].pop(key, block.block_id)
            assert popped is not None and popped.block_id == block.block_id
            assert index[id(m)].pop(key, block.block_id) is None
        assert lookup(ours, "r", tokens) == lookup(theirs, "r", tokens)
    ours.check_invariants()


def test_index_edits_refused_where_vllm_would_differ() -> None:
    """With events on vLLM's dict edits record nothing (kvcoord's key changes
    would), and an existing entry is not replaced: both are refused, with
    nothing changed."""
    _, ours = managers([full_spec()], enable_kv_cache_events=True)
    req = make_request("r", list(range(3 * BS)))
    assert ours.allocate_slots(req, req.num_tokens) is not None
    entries = ours.block_pool.cached_block_hash_to_block._cache
    key = next(iter(entries))
    before = state(ours)
    with pytest.raises(NotImplementedError):
        entries.pop(key)
    assert state(ours) == before
    _, plain = managers([full_spec()])
    assert plain.allocate_slots(req, req.num_tokens) is not None
    entries = plain.block_pool.cached_block_hash_to_block._cache
    key = next(iter(entries))
    with pytest.raises(NotImplementedError):
        entries[key] = entries[key]
    free = plain.block_pool.get_new_blocks(1)[0]
    cached = plain.block_pool.blocks[plain.get_block_ids("r")[0][0]]
    with pytest.raises(BlockStateError):  # already cached under another key
        entries[make_block_hash_with_group_id(bytes(32), 0)] = cached
    with pytest.raises(InvalidArgumentError):  # no group 7
        entries[make_block_hash_with_group_id(req.block_hashes[1], 7)] = free
    plain.check_invariants()
