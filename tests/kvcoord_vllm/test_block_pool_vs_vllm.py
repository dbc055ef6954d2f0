"""kvcoord.vllm.BlockPool beside vLLM 0.33.0's own BlockPool: the same random
sequences of vLLM's pool calls (hits touched, new blocks taken and cached,
frees in eviction order, evictions, unpins, resets, reused-prefix events)
must give the same block ids, free queue, reference counts, cache keys and
KV-cache events after every call, and kvcoord's core pool must stay
consistent.

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.block_pool", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool as VllmPool
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm_helpers import make_request

import kvcoord.vllm as kv
from kvcoord.errors import BlockStateError, ConfigError, InvalidArgumentError

BS = 4


@pytest.fixture(autouse=True)
def _none_hash() -> None:
    init_none_hash(sha256)


def pools(num_blocks: int, **kw: Any) -> tuple[Any, Any]:
    args = {"num_gpu_blocks": num_blocks, "enable_caching": True, "hash_block_size": BS, **kw}
    return VllmPool(**args), kv.BlockPool(**args)


def state(p: Any) -> tuple[Any, ...]:
    """The free queue front to back, every block's reference count and key,
    the number of keys, free blocks and usage."""
    blocks = p.blocks
    return (
        [b.block_id for b in p.free_block_queue.get_all_free_blocks()],
        [b.ref_cnt for b in blocks],
        [b.block_hash for b in blocks],
        len(p.cached_block_hash_to_block),
        p.get_num_free_blocks(),
        p.get_usage(),
    )


def same(theirs: Any, ours: Any) -> None:
    assert state(ours) == state(theirs)
    assert ours.take_events() == theirs.take_events()
    ours.pool.check_invariants()


def test_constructor_and_attributes() -> None:
    theirs, ours = pools(6, enable_kv_cache_events=True)
    for name in ("num_gpu_blocks", "enable_caching", "hash_block_size", "enable_kv_cache_events"):
        assert getattr(ours, name) == getattr(theirs, name)
    assert ours.null_block.block_id == theirs.null_block.block_id == 0
    assert ours.null_block.is_null and ours.null_block.block_hash is None
    assert len(ours.blocks) == len(theirs.blocks) == 6
    same(theirs, ours)
    with pytest.raises(ConfigError):
        kv.BlockPool(0, True, BS)
    with pytest.raises(NotImplementedError, match="metrics_collector"):
        kv.BlockPool(4, True, BS, metrics_collector=object())


def test_refusals_leave_the_pool_unchanged() -> None:
    theirs, ours = pools(5)
    with pytest.raises(ValueError):
        theirs.get_new_blocks(5)
    with pytest.raises(ValueError):
        ours.get_new_blocks(5)
    same(theirs, ours)
    got = ours.get_new_blocks(2)
    theirs.get_new_blocks(2)
    req = make_request("r", list(range(3 * BS)))
    with pytest.raises(InvalidArgumentError):  # blocks of two hash units
        ours.cache_full_blocks(req, got, 0, 1, 2 * BS, 0)
    with pytest.raises(InvalidArgumentError):  # mask of the wrong length
        ours.cache_full_blocks(req, got, 0, 2, BS, 0, block_mask=[True])
    with pytest.raises(ValueError):  # a double free
        ours.free_blocks([got[0], got[0]])
    same(theirs, ours)


def test_masked_and_null_blocks_are_skipped() -> None:
    theirs, ours = pools(8, enable_kv_cache_events=True)
    req = make_request("r", list(range(4 * BS)))
    t = theirs.get_new_blocks(3)
    o = ours.get_new_blocks(3)
    # Positions 0 (null), 1..3 (new), the middle one masked out.
    theirs.cache_full_blocks(req, [theirs.null_block, *t], 0, 4, BS, 2, [False, True, False, True])
    ours.cache_full_blocks(req, [ours.null_block, *o], 0, 4, BS, 2, [False, True, False, True])
    same(theirs, ours)


def test_unpinned_blocks_report_their_reuse() -> None:
    theirs, ours = pools(6)
    seen: tuple[list[int], list[int]] = ([], [])
    t, o = theirs.get_new_blocks(3), ours.get_new_blocks(3)
    theirs.unpin_blocks(t[:2], lambda b: seen[0].append(b.block_id))
    ours.unpin_blocks(o[:2], lambda b: seen[1].append(b.block_id))
    same(theirs, ours)
    assert [b.block_id for b in theirs.get_new_blocks(3)] == [
        b.block_id for b in ours.get_new_blocks(3)
    ]
    assert seen[0] == seen[1] and seen[1]
    same(theirs, ours)


@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_random_operations_match_vllm(seed: int, events: bool) -> None:
    rng = random.Random(seed)
    num_blocks = rng.randint(6, 24)
    theirs, ours = pools(
        num_blocks, enable_kv_cache_events=events, medium=rng.choice(["GPU", "CPU"])
    )
    # Requests sharing prefixes, so hits and shared keys happen.
    stems = [[rng.randrange(50) for _ in range(3 * BS)] for _ in range(3)]
    requests = []
    for i in range(8):
        tokens = rng.choice(stems)[: rng.randint(0, 3) * BS] + [
            rng.randrange(50) for _ in range(rng.randint(1, 4 * BS))
        ]
        requests.append(make_request(f"r{i}", tokens))
    held: list[tuple[list[Any], list[Any]]] = []  # (vLLM's blocks, ours) per holder
    seen: tuple[list[int], list[int]] = ([], [])
    for _ in range(60):
        op = rng.choice(["take", "take", "take", "free", "free", "evict", "unpin", "misc"])
        if op == "take":
            req = rng.choice(requests)
            group = rng.randrange(3)
            hashes = req.block_hashes
            # A hit, touched as vLLM's managers touch it, then new blocks.
            hit: tuple[list[Any], list[Any]] = ([], [])
            for h in hashes:
                t_hit = theirs.get_cached_block(h, [group])
                o_hit = ours.get_cached_block(h, [group])
                assert (t_hit is None) == (o_hit is None)
                if t_hit is None:
                    break
                assert t_hit[0].block_id == o_hit[0].block_id
                hit[0].append(t_hit[0])
                hit[1].append(o_hit[0])
            theirs.touch(hit[0])
            ours.touch(hit[1])
            n = rng.randint(0, len(hashes) + 1 - len(hit[0]))
            if n > theirs.get_num_free_blocks():
                with pytest.raises(ValueError):
                    ours.get_new_blocks(n)
                theirs.free_blocks(hit[0])
                ours.free_blocks(hit[1])
            else:
                t_new, o_new = theirs.get_new_blocks(n), ours.get_new_blocks(n)
                assert [b.block_id for b in t_new] == [b.block_id for b in o_new]
                t_all, o_all = hit[0] + t_new, hit[1] + o_new
                full = min(len(t_all), len(hashes))
                theirs.cache_full_blocks(req, t_all, len(hit[0]), full, BS, group)
                ours.cache_full_blocks(req, o_all, len(hit[1]), full, BS, group)
                if hit[0] and rng.random() < 0.5:
                    theirs.emit_cached_block_events(req, len(hit[0]), BS, group)
                    ours.emit_cached_block_events(req, len(hit[1]), BS, group)
                held.append((t_all, o_all))
        elif op == "free" and held:
            t_blocks, o_blocks = held.pop(rng.randrange(len(held)))
            theirs.free_blocks(reversed(t_blocks))
            ours.free_blocks(reversed(o_blocks))
        elif op == "unpin" and held:
            t_blocks, o_blocks = held.pop(rng.randrange(len(held)))
            theirs.unpin_blocks(t_blocks, lambda b: seen[0].append(b.block_id))
            ours.unpin_blocks(o_blocks, lambda b: seen[1].append(b.block_id))
        elif op == "evict":
            victims = {rng.randrange(num_blocks) for _ in range(rng.randint(1, 3))}
            if rng.random() < 0.5:
                theirs.evict_blocks(victims)
                ours.evict_blocks(victims)
            else:
                b = min(victims)
                assert ours._maybe_evict_cached_block(
                    ours.blocks[b]
                ) == theirs._maybe_evict_cached_block(theirs.blocks[b])
        elif op == "misc":
            assert ours.reset_prefix_cache() == theirs.reset_prefix_cache()
        same(theirs, ours)
        assert seen[0] == seen[1]
    for t_blocks, o_blocks in held:
        theirs.free_blocks(t_blocks)
        ours.free_blocks(o_blocks)
    same(theirs, ours)
    assert ours.reset_prefix_cache() == theirs.reset_prefix_cache()
    same(theirs, ours)


def index(p: Any) -> dict[bytes, list[int]]:
    """``cached_block_hash_to_block`` as key -> sorted block ids, on either pool."""
    out = {}
    for key, value in p.cached_block_hash_to_block._cache.items():
        blocks = value.values() if isinstance(value, dict) else [value]
        out[key] = sorted(b.block_id for b in blocks)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_block_objects_made_by_the_caller(seed: int) -> None:
    """vLLM's tests cache ``KVCacheBlock`` objects they made (ids 0 and up,
    the same id in several groups): kvcoord keys the pool's blocks of those
    ids as vLLM's pool keys the objects, and sets the objects' hashes."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    rng = random.Random(seed)
    theirs, ours = pools(8)
    req = make_request("r", [rng.randrange(50) for _ in range(5 * BS + 2)])
    for _ in range(4):
        group = rng.randrange(3)
        first = rng.randrange(3)
        full = rng.randint(first, 5)
        made = ([KVCacheBlock(block_id=i) for i in range(full)] for _ in range(2))
        t_blocks, o_blocks = next(made), next(made)
        theirs.cache_full_blocks(req, t_blocks, first, full, BS, group)
        ours.cache_full_blocks(req, o_blocks, first, full, BS, group)
        assert [b.block_hash for b in o_blocks] == [b.block_hash for b in t_blocks]
        assert [b.block_hash_num_tokens for b in o_blocks] == [
            b.block_hash_num_tokens for b in t_blocks
        ]
        assert index(ours) == index(theirs)
        assert len(ours.cached_block_hash_to_block) == len(theirs.cached_block_hash_to_block)
        for h in req.block_hashes:
            for groups in ([0], [1], [0, 2], [2, 1, 0]):
                t_hit, o_hit = theirs.get_cached_block(h, groups), ours.get_cached_block(h, groups)
                assert (t_hit is None) == (o_hit is None)
                if t_hit is not None:
                    assert [b.block_id for b in o_hit] == [b.block_id for b in t_hit]
        ours.pool.check_invariants()
    assert ours.reset_prefix_cache() and theirs.reset_prefix_cache()
    assert index(ours) == index(theirs) == {}
    ours.pool.check_invariants()


def test_keys_set_by_hand() -> None:
    """``set_block_hash`` plus an insert into ``cached_block_hash_to_block``
    (keys of any digest length, the null block too), then evictions one
    block at a time, read the same on both pools."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    theirs, ours = pools(5)
    keys = [make_block_hash_with_group_id(d, g) for d, g in [(b"10", 7), (b"x" * 32, 1), (b"3", 2)]]
    plan = [keys[0], keys[1], keys[2], keys[0], keys[1]]
    for p in (theirs, ours):
        for block, key in zip(p.blocks, plan, strict=True):
            block.set_block_hash(key)
            p.cached_block_hash_to_block.insert(key, block)
            p.cached_block_hash_to_block.insert(key, block)  # again: no change
    for victim in [1, 0, 4, 2, 3]:
        assert ours.cached_block_hash_to_block._cache == theirs.cached_block_hash_to_block._cache
        assert index(ours) == index(theirs)
        assert [b.block_hash for b in ours.blocks] == [b.block_hash for b in theirs.blocks]
        for key in keys:
            t_one = theirs.cached_block_hash_to_block.get_one_block(key)
            o_one = ours.cached_block_hash_to_block.get_one_block(key)
            assert getattr(o_one, "block_id", None) == getattr(t_one, "block_id", None)
        assert ours._maybe_evict_cached_block(ours.blocks[victim])
        assert theirs._maybe_evict_cached_block(theirs.blocks[victim])
        assert not ours._maybe_evict_cached_block(ours.blocks[victim])
        ours.pool.check_invariants()
    assert ours.cached_block_hash_to_block._cache == {} == theirs.cached_block_hash_to_block._cache
    # A free queue and reference counts untouched by all of it.
    same(theirs, ours)


def test_by_hand_refusals() -> None:
    from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id

    _, ours = pools(5, enable_kv_cache_events=True)
    req = make_request("r", list(range(3 * BS)))
    with pytest.raises(NotImplementedError, match="events on"):
        ours.cache_full_blocks(req, [KVCacheBlock(block_id=1)], 0, 1, BS, 0)
    with pytest.raises(NotImplementedError, match="digest with events on"):
        ours.blocks[1].set_block_hash(make_block_hash_with_group_id(b"10", 0))
    _, ours = pools(5)
    got = ours.get_new_blocks(1)
    with pytest.raises(NotImplementedError, match="in one call"):
        ours.cache_full_blocks(req, [*got, KVCacheBlock(block_id=2)], 0, 2, BS, 0)
    key = make_block_hash_with_group_id(req.block_hashes[0], 0)
    ours.blocks[3].set_block_hash(key)
    with pytest.raises(BlockStateError):
        ours.blocks[3].set_block_hash(key)
    assert ours.pool.num_cached_blocks == 1
    ours.pool.check_invariants()


def _spec(kind: str, block_size: int, param: int) -> Any:
    import torch
    from vllm.v1 import kv_cache_interface as vi

    common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    if kind == "window":
        return vi.SlidingWindowSpec(**common, sliding_window=param)
    if kind == "chunked":
        return vi.ChunkedLocalAttentionSpec(**common, attention_chunk_size=param)
    return vi.FullAttentionSpec(**common)


@pytest.mark.parametrize("seed", range(40))
def test_hit_search_matches_vllm(seed: int) -> None:
    """The single-type managers' hit search (``find_longest_cache_hit``)
    over kvcoord's pool, beside vLLM's class method over vLLM's pool, on
    random cached subsets (keys set by hand, as vLLM's tests set them)."""
    from vllm.v1.core import single_type_kv_cache_manager as vm
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    from kvcoord.vllm.testing import _hit_search as km

    rng = random.Random(seed)
    kind = rng.choice(["window", "chunked", "full"])
    hbs = rng.choice([1, 2])
    block_size = hbs * rng.choice([1, 2])
    param = block_size * rng.randint(1, 3) + rng.choice([0, 1]) * (kind == "window")
    spec = _spec(kind, block_size, param)
    theirs, ours = pools(64, hash_block_size=hbs)
    scale = block_size // hbs
    num_blocks = rng.randint(1, 12)
    units = [rng.randbytes(rng.choice([2, 32])) for _ in range(num_blocks * scale)]
    density = rng.random()
    for i in range(num_blocks):
        for group in (0, 1):
            if rng.random() < density:
                key = make_block_hash_with_group_id(units[(i + 1) * scale - 1], group)
                for p in (theirs, ours):
                    p.cached_block_hash_to_block.insert(key, p.blocks[10 + i + 20 * group])
    name = {"window": "SlidingWindowManager", "chunked": "ChunkedLocalAttentionManager"}
    cls_name = name.get(kind, "FullAttentionManager")
    v_cls, k_cls = getattr(vm, cls_name), getattr(km, cls_name)
    for _ in range(20):
        groups = rng.choice([[0], [1], [0, 1]])
        # vLLM's window searches index every block below max_length.
        max_length = rng.randint(0, (num_blocks + 1) * block_size - 1)
        if kind == "chunked":
            alignment, drop = block_size, False
        elif kind == "full":
            alignment, drop = block_size * rng.choice([1, 2]), rng.random() < 0.3
        else:
            alignment, drop = rng.choice([hbs, block_size, 2 * block_size]), rng.random() < 0.3
        args = (units, max_length, groups)
        t_blocks, t_hit = v_cls.find_longest_cache_hit(*args, theirs, spec, drop, alignment)
        o_blocks, o_hit = k_cls.find_longest_cache_hit(*args, ours, spec, drop, alignment)
        assert o_hit == t_hit, (kind, block_size, hbs, param, max_length, alignment, drop, groups)
        assert [[b.block_id for b in g] for g in o_blocks] == [
            [b.block_id for b in g] for g in t_blocks
        ]
    manager = k_cls(spec, block_pool=ours, kv_cache_group_id=0, enable_caching=True)
    assert manager.find_longest_cache_hit(units, 0, [0], ours, spec, False, block_size)[1] == 0
    with pytest.raises(AttributeError, match="only the constructor"):
        manager.allocate_new_blocks  # noqa: B018
    with pytest.raises(TypeError):
        k_cls(spec, block_pool=theirs)
