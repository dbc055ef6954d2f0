"""The free-list links of kvcoord.vllm's block views (``next_free_block`` /
``prev_free_block``, read from the core's free queue) beside those of vLLM
0.33.0's ``KVCacheBlock`` on random pool operations: for every block, the
neighbours (or the sentinel ends, or None for a block not free) must be
equal, and a walk from the head must reach every free block in order.

Regression: vLLM's ``test_cache_hit_local_and_external*`` walk the free list
from ``fake_free_list_head`` and the views had no ``next_free_block``.

Skipped when vLLM is not installed.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip(
    "vllm.v1.core.block_pool", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

from vllm.v1.core.block_pool import BlockPool as VllmPool

import kvcoord
from kvcoord.vllm.serve._blocks import BlockView, FreeListEnd
from kvcoord.vllm.serve._pool_view import PoolView

N = 10


def link(block: object) -> object:
    """A neighbour as comparable data: an id, 'head'/'tail' or None."""
    if block is None:
        return None
    if isinstance(block, FreeListEnd):
        return "head" if block._is_head else "tail"
    block_id = block.block_id  # type: ignore[attr-defined]
    return block_id


def their_link(block: object, theirs: VllmPool) -> object:
    if block is None:
        return None
    queue = theirs.free_block_queue
    if block is queue.fake_free_list_head:
        return "head"
    if block is queue.fake_free_list_tail:
        return "tail"
    return block.block_id  # type: ignore[attr-defined]


def walk(head: object) -> list[int]:
    out = []
    cur = head.next_free_block  # type: ignore[attr-defined]
    while cur is not None and cur.block_id >= 0:
        out.append(cur.block_id)
        cur = cur.next_free_block
    return out


@pytest.mark.parametrize("seed", range(20))
def test_free_links_match_vllm_on_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    theirs = VllmPool(N, enable_caching=True, hash_block_size=4)
    ours = kvcoord.BlockPool(N, hash_block_size=4)
    view = PoolView(ours)
    held: list[int] = []
    for _ in range(40):
        op = rng.choice(["alloc", "free", "free", "touch"])
        if op == "alloc":
            k = rng.randint(0, ours.num_free_blocks)
            got = [b.block_id for b in theirs.get_new_blocks(k)]
            assert ours.get_new_blocks(k) == got
            held += got
        elif op == "free" and held:
            pick = rng.sample(held, rng.randint(1, min(3, len(held))))
            theirs.free_blocks([theirs.blocks[b] for b in pick])
            ours.free_blocks(pick)
            for b in pick:
                held.remove(b)
        elif op == "touch":
            pick = rng.sample(range(1, N), rng.randint(1, 3))
            theirs.touch([theirs.blocks[b] for b in pick])
            ours.touch(pick)
            held += pick
        for b in range(N):
            mine = BlockView(ours, b)
            block = theirs.blocks[b]
            assert (link(mine.prev_free_block), link(mine.next_free_block)) == (
                their_link(block.prev_free_block, theirs),
                their_link(block.next_free_block, theirs),
            ), (seed, b)
        queue = view.free_block_queue
        assert walk(queue.fake_free_list_head) == ours.free_block_ids().tolist()
        assert walk(queue.fake_free_list_head) == [
            b.block_id for b in theirs.free_block_queue.get_all_free_blocks()
        ]
