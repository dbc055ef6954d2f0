"""Builders shared by the tests that drive kvcoord.vllm beside vLLM 0.33.0's
own manager (import after ``pytest.importorskip`` of vLLM)."""

from __future__ import annotations

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

import kvcoord.vllm as kv

#: Block size (and hash unit) of the tests' groups.
BS = 4


def full_spec(block_size: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )


def config(num_blocks: int, specs: list) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
    )


def make_request(
    rid: str, tokens: list[int], hash_block_size: int = BS, lookahead: int = 0
) -> Request:
    """A vLLM request hashed by vLLM's own pickle ``sha256`` block hasher."""
    params = SamplingParams(max_tokens=1000)
    params.update_from_generation_config({}, eos_token_id=100)
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256, lookahead),
    )


def free_queue(manager: object) -> list[int]:
    """The free queue front to back, on either engine."""
    if isinstance(manager, kv.KVCacheManager):
        return manager.block_pool.free_block_ids().tolist()
    return [b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()]


def ids(blocks: object) -> object:
    return None if blocks is None else blocks.get_block_ids()


def admit_alike(theirs: object, ours: object, req: object) -> bool:
    """Look ``req`` up on both managers and allocate the rest of its tokens,
    asserting equal hits and equal new blocks; whether it was admitted."""
    (ha, na, _), (hb, nb, _) = theirs.get_computed_blocks(req), ours.get_computed_blocks(req)  # type: ignore[attr-defined]
    assert (na, ids(ha)) == (nb, ids(hb))
    a = theirs.allocate_slots(req, req.num_tokens - na, na, ha)  # type: ignore[attr-defined]
    b = ours.allocate_slots(req, req.num_tokens - nb, nb, hb)  # type: ignore[attr-defined]
    assert ids(a) == ids(b)
    return a is not None


def preempt(req: object, managers: tuple[object, ...], running: list, waiting: list) -> None:
    """Preempt ``req`` on every manager as vLLM's scheduler does: free its
    blocks, restart it from token 0 and put it back first in line."""
    from vllm.v1.request import RequestStatus

    for m in managers:
        m.free(req)  # type: ignore[attr-defined]
    running.remove(req)
    req.num_computed_tokens = 0  # type: ignore[attr-defined]
    req.status = RequestStatus.PREEMPTED  # type: ignore[attr-defined]
    waiting.insert(0, req)
