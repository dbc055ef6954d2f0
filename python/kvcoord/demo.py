"""A short tour of the block pool: two requests sharing a prompt prefix.

Run with ``python -m kvcoord.demo``.
"""

from __future__ import annotations

import hashlib
import time

from kvcoord import BlockPool


def main() -> None:
    pool = BlockPool(1_000_001, hash_block_size=16)
    print(f"pool: {pool.num_blocks:,} blocks, {pool.metadata_bytes / pool.num_blocks:.0f} B/block")

    # Request A: 3 full blocks of a shared system prompt + 1 partial block.
    shared = [hashlib.sha256(f"system-prompt-block-{i}".encode()).digest() for i in range(3)]
    a = pool.get_new_blocks(4)
    pool.cache_full_blocks(a, shared, num_cached_blocks=0, num_full_blocks=3, group_id=0)
    print(f"request A got blocks {a}; cached {pool.num_cached_blocks} full blocks")

    # Request B shares the prefix: look up each block hash, pin the hits.
    hits = [blk[0] for h in shared if (blk := pool.get_cached_block(h, [0])) is not None]
    pool.touch(hits)
    b = hits + pool.get_new_blocks(1)
    print(f"request B reuses {hits} and gets {b[-1]} for its own tail")

    pool.free_blocks(a[::-1])  # tail first: deepest prefix block evicted first
    pool.free_blocks(b[::-1])
    print(f"after both finish, the free queue starts {pool.free_block_ids()[:4].tolist()} "
          f"and ends {pool.free_block_ids()[-3:].tolist()} (cached prefix kept longest)")

    start = time.perf_counter()
    for _ in range(10_000):
        pool.free_blocks(pool.get_new_blocks(64))
    per_block = (time.perf_counter() - start) / (10_000 * 64) * 1e9
    print(f"get+free in batches of 64: {per_block:.1f} ns per block from Python")
    pool.check_invariants()


if __name__ == "__main__":
    main()
