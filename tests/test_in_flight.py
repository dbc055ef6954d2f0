"""Windows release blocks on the processed basis under async scheduling.

With async scheduling a step is scheduled before the previous step's output
is back: ``num_computed_tokens`` already counts the in-flight tokens, whose
attention still reads the blocks just below them. vLLM 0.33.0 frees the
blocks that left a window at ``num_computed_tokens - num_in_flight_tokens``;
freeing on the optimistic count hands blocks an in-flight step still reads
to the next allocation. Regression test: kvcoord freed them at once.
"""

from __future__ import annotations

import pytest

from kvcoord import (
    ChunkedLocalAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KVCacheSpec,
    Request,
    SlidingWindowSpec,
)

PROMPT = 100
BLOCK = 16


def prefilled(spec: KVCacheSpec) -> tuple[KVCacheManager, Request]:
    """A manager holding one request whose 100-token prefill was scheduled
    (and is in flight) and whose first decode token exists."""
    mgr = KVCacheManager(KVCacheConfig(64, (KVCacheGroup(spec),)), max_model_len=1024)
    req = Request("r", list(range(PROMPT)), hash_block_size=BLOCK)
    assert mgr.allocate_slots(req, PROMPT) is not None
    req.num_computed_tokens = PROMPT
    req.num_in_flight_tokens = PROMPT
    req.append_output_token_ids([7])
    mgr.check_invariants()
    return mgr, req


def nulls(mgr: KVCacheManager) -> int:
    return mgr.get_block_ids("r")[0].count(0)


@pytest.mark.parametrize(
    ("spec", "released"),
    [
        # Tokens 0..84 are outside the window of token 100: 5 full blocks.
        (SlidingWindowSpec(BLOCK, 16), 85 // BLOCK),
        # Chunks of 32 left of token 100's chunk: 96 tokens, 6 blocks.
        (ChunkedLocalAttentionSpec(BLOCK, 32), 96 // BLOCK),
    ],
    ids=["sliding_window", "chunked_local"],
)
def test_blocks_read_by_an_in_flight_step_stay(spec: KVCacheSpec, released: int) -> None:
    mgr, req = prefilled(spec)
    free = mgr.block_pool.num_free_blocks
    # The decode step is scheduled while the prefill is still in flight.
    assert mgr.allocate_slots(req, 1) is not None
    mgr.check_invariants()
    assert nulls(mgr) == 0
    assert mgr.block_pool.num_free_blocks == free
    # The prefill's output is back: only the decode token is in flight.
    req.num_computed_tokens = PROMPT + 1
    req.num_in_flight_tokens = 1
    req.append_output_token_ids([8])
    assert mgr.allocate_slots(req, 1) is not None
    mgr.check_invariants()
    assert nulls(mgr) == released
    assert mgr.block_pool.num_free_blocks == free + released


def test_nothing_in_flight_releases_at_once() -> None:
    mgr, req = prefilled(SlidingWindowSpec(BLOCK, 16))
    req.num_in_flight_tokens = 0
    free = mgr.block_pool.num_free_blocks
    assert mgr.allocate_slots(req, 1) is not None
    mgr.check_invariants()
    assert nulls(mgr) == 85 // BLOCK
    assert mgr.block_pool.num_free_blocks == free + 85 // BLOCK


def test_in_flight_tokens_are_a_count() -> None:
    req = Request("r", [1, 2, 3], hash_block_size=BLOCK)
    assert req.num_in_flight_tokens == 0
    with pytest.raises((ValueError, TypeError)):
        req.num_in_flight_tokens = -1
    assert req.num_in_flight_tokens == 0
