"""Per-request bookkeeping from Python: constructing a ``kvcoord.Request``
from a 2k-token prompt given as a list (the common case: a tokenizer's
output), beside the same prompt as a uint32 numpy array (no per-token
conversion), and one scheduler step's progress update for 128 requests
with ``kvcoord.advance_requests``.

Run: ``.venv/bin/pytest benches/test_bench_request.py --benchmark-enable``.
The ``convert only`` cases hash in units longer than the prompt, so they
time the token conversion alone.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import kvcoord

NUM_TOKENS = 2048
BLOCK = 16
RUNNING = 128

_rng = random.Random(0)
PROMPT = [_rng.randrange(200_000) for _ in range(NUM_TOKENS)]
PROMPT_NP = np.array(PROMPT, dtype=np.uint32)
INPUTS: dict[str, Any] = {"list": PROMPT, "numpy": PROMPT_NP}


@pytest.mark.parametrize("given", sorted(INPUTS))
@pytest.mark.parametrize("unit", [BLOCK, 4 * NUM_TOKENS], ids=["sha256_cbor", "convert only"])
def test_request_construction(benchmark: Any, given: str, unit: int) -> None:
    tokens = INPUTS[given]
    req = benchmark(lambda: kvcoord.Request("r", tokens, hash_block_size=unit))
    assert req.num_tokens == NUM_TOKENS
    assert req.num_block_hashes == NUM_TOKENS // unit


def test_advance_requests_step(benchmark: Any) -> None:
    """One decode step: every request computed one token and sampled one."""
    reqs = [kvcoord.Request(f"r{i}", PROMPT[:100], hash_block_size=BLOCK) for i in range(RUNNING)]
    ones = [1] * RUNNING
    sampled = [7] * RUNNING
    benchmark(lambda: kvcoord.advance_requests(reqs, ones, sampled))
    assert reqs[0].num_computed_tokens == reqs[0].num_tokens - 100
