"""Builders shared by the tests that drive kvcoord.vllm beside the installed
vLLM's own manager (0.32.x or 0.33.0; import after ``pytest.importorskip`` of
vLLM).

Every difference between the served vLLM releases that a test meets is asked
of :func:`kvcoord.vllm.serve._versions.installed` here, once: build vLLM's managers
and hashers through :func:`manager_args` and :func:`block_hasher` (they pass
only what the installed vLLM takes), and mark a test whose subject is hash
lookahead with :data:`needs_hash_lookahead`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

import kvcoord.vllm as kv
from kvcoord.vllm.serve._versions import installed

#: Block size (and hash unit) of the tests' groups.
BS = 4

#: The installed vLLM's facts (kvcoord.vllm.serve._versions).
API = installed()

#: Why a test of hash lookahead (``num_hash_lookahead_tokens``) cannot run here.
NO_HASH_LOOKAHEAD = (
    f"vLLM {API.version} has no hash lookahead (VllmApi.hasher_takes_lookahead is False: "
    "get_request_block_hasher and KVCacheManager take no num_hash_lookahead_tokens)"
)

#: Marks a test whose subject is hash lookahead: skipped where vLLM has none.
needs_hash_lookahead = pytest.mark.skipif(not API.hasher_takes_lookahead, reason=NO_HASH_LOOKAHEAD)


#: Marks a test of kvcoord's HiSparse manager: vLLM 0.32's HiSparse managers
#: hand back popped rows with their null blocks, and kvcoord falls back there.
needs_served_hisparse = pytest.mark.skipif(
    API.pops_null_blocks,
    reason=f"HiSparse falls back to vLLM's manager on vLLM {API.version} "
    "(VllmApi.pops_null_blocks: its popped rows keep null blocks)",
)

#: Whether groups flagged ``is_eagle_group`` beside Mamba groups are served
#: without ``use_eagle`` (not on vLLM 0.32, where they drop their block but
#: Mamba checkpoints stay off EAGLE's replay boundary).
FLAGGED_EAGLE_BESIDE_MAMBA = API.eagle_drop_needs_use_eagle

#: Marks a test that bounds a lookup by ``get_computed_blocks(...,
#: max_cache_hit_length=)``: skipped where vLLM's takes the request alone.
needs_lookup_cap = pytest.mark.skipif(
    not API.lookup_takes_max_cache_hit_length,
    reason=f"vLLM {API.version}'s get_computed_blocks takes no max_cache_hit_length "
    "(VllmApi.lookup_takes_max_cache_hit_length is False)",
)


def skip_without_hash_lookahead(num_hash_lookahead_tokens: int) -> None:
    """Skip the running test when it asks for hash lookahead that the
    installed vLLM does not have (a case of a parametrized test)."""
    if num_hash_lookahead_tokens and not API.hasher_takes_lookahead:
        pytest.skip(NO_HASH_LOOKAHEAD)


def manager_args(**args: Any) -> dict[str, Any]:
    """``args`` for a ``KVCacheManager`` (vLLM's and kvcoord's take the same)
    as the installed vLLM takes them: ``num_hash_lookahead_tokens`` only where
    its constructor has it. Zero lookahead is vLLM 0.32's behaviour and is
    dropped there; a nonzero one skips the test (:data:`NO_HASH_LOOKAHEAD`)."""
    if "num_hash_lookahead_tokens" not in API.manager_arg_names:
        skip_without_hash_lookahead(int(args.pop("num_hash_lookahead_tokens", 0)))
    return args


def block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
    num_hash_lookahead_tokens: int = 0,
    original: Callable[..., Any] = get_request_block_hasher,
) -> Any:
    """``original(hash_block_size, caching_hash_fn[, num_hash_lookahead_tokens])``
    (vLLM's ``get_request_block_hasher`` or kvcoord's drop-in for it), with
    the lookahead argument only where vLLM's hasher takes it; a nonzero one
    skips the test where it does not."""
    skip_without_hash_lookahead(num_hash_lookahead_tokens)
    if API.hasher_takes_lookahead:
        return original(hash_block_size, caching_hash_fn, num_hash_lookahead_tokens)
    return original(hash_block_size, caching_hash_fn)


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


#: Why kvcoord does not serve :func:`unserved_manager`'s configuration.
UNSERVED_REASON = "sub-block (partial) prefix hits: hash_block_size below every block size"


def unserved_manager(**args: Any) -> Any:
    """A manager of a configuration kvcoord does not serve and both vLLM
    releases build, as an engine asks for it (``prefix_match_unit`` finer
    than the blocks beside a sliding window): hashes every 2 tokens, 4-token
    blocks, full attention and a window."""
    window = SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=2 * BS
    )
    kw: dict[str, Any] = dict(max_model_len=64, scheduler_block_size=BS, hash_block_size=BS // 2)
    return kv.KVCacheManager(config(16, [full_spec(), window]), **{**kw, **args})


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
        block_hasher=block_hasher(hash_block_size, sha256, lookahead),
    )


def drop_eagle_group_ids(coordinator: Any) -> set[int]:
    """The groups whose hits drop EAGLE's last block, as vLLM's coordinator
    holds them: ``drop_eagle_group_ids`` where the drop needs ``use_eagle``
    (0.33), else every EAGLE group drops (0.32: ``eagle_group_ids``)."""
    if API.eagle_drop_needs_use_eagle:
        return set(coordinator.drop_eagle_group_ids)
    return set(coordinator.eagle_group_ids)


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
