"""Replay every recorded vLLM 0.33.0 BlockPool trace with exact equality of
every result and every full-state check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kvcoord
from conformance import read_trace, trace_files


@pytest.mark.parametrize("path", trace_files("pool-*.jsonl.gz"), ids=lambda p: p.name)
def test_pool_trace(path: Path) -> None:
    header, ops = read_trace(path)
    pool = kvcoord.BlockPool(
        header["num_blocks"],
        enable_caching=header["enable_caching"],
        hash_block_size=header["hash_block_size"],
    )
    checks = 0
    for lineno, op in ops:
        where = f"{path.name}:{lineno} {op['op']}"
        kind = op["op"]
        if kind == "get_new_blocks":
            if op["expect"] == "ValueError":
                before = pool.free_block_ids()
                with pytest.raises(ValueError):
                    pool.get_new_blocks(op["n"])
                assert np.array_equal(pool.free_block_ids(), before), where
            else:
                assert pool.get_new_blocks(op["n"]) == op["expect"], where
        elif kind == "free_blocks":
            pool.free_blocks(op["ids"])
        elif kind == "touch":
            pool.touch(op["ids"])
        elif kind == "cache_full_blocks":
            pool.cache_full_blocks(
                op["ids"],
                [bytes.fromhex(h) for h in op["hashes"]],
                op["num_cached_blocks"],
                op["num_full_blocks"],
                op["group_id"],
                op["block_mask"],
            )
        elif kind == "get_cached_block":
            got = pool.get_cached_block(bytes.fromhex(op["hash"]), op["group_ids"])
            assert got == op["expect"], where
        elif kind == "evict_blocks":
            pool.evict_blocks(op["ids"])
        elif kind == "reset_prefix_cache":
            assert pool.reset_prefix_cache() is op["expect"], where
        elif kind == "check":
            checks += 1
            assert pool.num_free_blocks == op["num_free_blocks"], where
            assert pool.free_block_ids().tolist() == op["free_queue"], where
            assert pool.ref_counts().tolist() == op["ref_cnt"], where
            assert pool.cached_mask().tolist() == op["cached"], where
            pool.check_invariants()
        else:
            raise AssertionError(f"{where}: unknown op")
    assert checks > 0
