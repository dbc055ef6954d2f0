"""``KVCacheManager.estimate_cached_tokens`` beside vLLM 0.33.0's: the tail
lookups and the whole-mask fallback (more than four uncached blocks at the
tail) give vLLM's count.

Skipped when vLLM is not installed (``make test-vllm`` runs it).
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager", reason="needs vLLM 0.33.0 (pip install kvcoord[vllm])"
)

from test_against_vllm import config, full_spec, make_request, managers
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash


@pytest.mark.parametrize("enable_caching", [True, False])
@pytest.mark.parametrize("uncached_tail_blocks", [0, 1, 3, 4, 5, 9])
def test_estimate_cached_tokens_matches_vllm(
    enable_caching: bool, uncached_tail_blocks: int
) -> None:
    init_none_hash(sha256)
    theirs, ours = managers(config(64, [full_spec()]), enable_caching=enable_caching)
    shared = list(range(1000, 1012))  # 3 blocks of 4
    for m in (theirs, ours):
        first = make_request("a", [*shared, 1])
        hit, n, _ = m.get_computed_blocks(first)
        assert m.allocate_slots(first, first.num_tokens - n, n, hit) is not None
        # The second request hits the 3 shared blocks; its own blocks are
        # allocated with caching delayed, so they stay uncached.
        second = make_request("b", shared + list(range(2000, 2000 + 4 * uncached_tail_blocks)))
        hit, n, _ = m.get_computed_blocks(second)
        new = second.num_tokens - n
        assert m.allocate_slots(second, new, n, hit, delay_cache_blocks=True) is not None
    assert theirs.estimate_cached_tokens(second) == ours.estimate_cached_tokens(second)
    # (With no tail, the last shared block is recomputed: a hit stops one
    # token short of the prompt.)
    cached = 12 if uncached_tail_blocks else 8
    assert ours.estimate_cached_tokens(second) == (cached if enable_caching else 0)
