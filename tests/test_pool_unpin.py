"""BlockPool.unpin_blocks: a released block stays readable until the pool hands
it out again (vLLM 0.33.0's HiSparse). Compared with vLLM's own pool in
tests/kvcoord_vllm/test_unpin_against_vllm.py; these run without vLLM."""

from __future__ import annotations

import pytest

import kvcoord
from kvcoord.errors import BlockStateError, InvalidArgumentError, InvalidBlockIdError


def test_unpinned_blocks_join_the_back_and_are_reported_once_when_reused() -> None:
    pool = kvcoord.BlockPool(6, enable_caching=False)
    assert pool.get_new_blocks(3) == [1, 2, 3]
    pool.unpin_blocks([2, 1])
    # free_blocks would put these uncached blocks first; unpinned ones go last.
    assert pool.free_block_ids().tolist() == [4, 5, 2, 1]
    assert (pool.num_free_blocks, pool.num_watched) == (4, 2)
    assert pool.take_reused_watched().tolist() == []
    assert pool.get_new_blocks(3) == [4, 5, 2]
    assert pool.take_reused_watched().tolist() == [2]
    assert pool.take_reused_watched().tolist() == []
    assert pool.num_watched == 1


def test_reset_reports_every_watched_block() -> None:
    pool = kvcoord.BlockPool(5)
    pool.get_new_blocks(3)
    pool.unpin_blocks([3])
    pool.unpin_blocks([1, 2])
    assert pool.reset_prefix_cache()
    assert pool.take_reused_watched().tolist() == [3, 1, 2]
    assert pool.num_watched == 0


@pytest.mark.parametrize(
    ("ids", "error"),
    [([0], InvalidArgumentError), ([9], InvalidBlockIdError), ([1, 1], BlockStateError)],
)
def test_bad_unpin_changes_nothing(ids: list[int], error: type[Exception]) -> None:
    pool = kvcoord.BlockPool(4)
    pool.get_new_blocks(1)
    before = (pool.free_block_ids().tolist(), pool.ref_counts().tolist())
    with pytest.raises(error):
        pool.unpin_blocks(ids)
    assert (pool.free_block_ids().tolist(), pool.ref_counts().tolist()) == before
    assert pool.num_watched == 0


def test_ranked_policies_refuse_unpin() -> None:
    pool = kvcoord.BlockPool(4, eviction_policy="lfu")
    pool.get_new_blocks(1)
    with pytest.raises(InvalidArgumentError):
        pool.unpin_blocks([1])
    assert pool.ref_counts().tolist()[1] == 1
