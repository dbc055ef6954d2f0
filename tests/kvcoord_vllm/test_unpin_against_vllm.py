"""kvcoord.BlockPool.unpin_blocks beside vLLM 0.33.0's BlockPool.unpin_blocks
(HiSparse's release of pages that stay readable until reused): on random
operations, the free queue, the reference counts and the reuse reports
(vLLM's on_reuse callbacks) must be equal.

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

N = 12


def state(theirs: VllmPool, ours: kvcoord.BlockPool) -> tuple[object, ...]:
    their_queue = [b.block_id for b in theirs.free_block_queue.get_all_free_blocks()]
    their_refs = [b.ref_cnt for b in theirs.blocks[1:]]
    return (their_queue, their_refs), (
        ours.free_block_ids().tolist(),
        ours.ref_counts()[1:].tolist(),
    )


@pytest.mark.parametrize("seed", range(25))
def test_unpin_matches_vllm_on_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    theirs = VllmPool(N, enable_caching=False, hash_block_size=4)
    ours = kvcoord.BlockPool(N, enable_caching=False)
    reused: list[int] = []
    refs: dict[int, int] = {}  # references held by the test, per block

    def on_reuse(block: object) -> None:
        reused.append(block.block_id)  # type: ignore[attr-defined]

    for _ in range(60):
        held = [b for b, n in refs.items() for _ in range(n)]
        op = rng.choice(["alloc", "alloc", "free", "unpin", "unpin", "touch", "reset"])
        if op == "alloc":
            k = rng.randint(0, ours.num_free_blocks)
            got = [b.block_id for b in theirs.get_new_blocks(k)]
            assert ours.get_new_blocks(k) == got
            for b in got:
                refs[b] = refs.get(b, 0) + 1
        elif op in ("free", "unpin") and held:
            pick = rng.sample(held, rng.randint(1, min(3, len(held))))
            blocks = [theirs.blocks[b] for b in pick]
            if op == "free":
                theirs.free_blocks(blocks)
                ours.free_blocks(pick)
            else:
                theirs.unpin_blocks(blocks, on_reuse)
                ours.unpin_blocks(pick)
            for b in pick:
                refs[b] -= 1
        elif op == "touch":
            pick = rng.sample(range(1, N), rng.randint(1, 3))
            theirs.touch([theirs.blocks[b] for b in pick])
            ours.touch(pick)
            for b in pick:
                refs[b] = refs.get(b, 0) + 1
        elif op == "reset":
            assert ours.reset_prefix_cache() == theirs.reset_prefix_cache()
        assert ours.take_reused_watched().tolist() == reused
        reused.clear()
        a, b = state(theirs, ours)
        assert a == b
