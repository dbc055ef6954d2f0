"""One snapshot of everything a failed call must leave as it was: the free
queue in order, every block's reference count, cached flag and cache key,
and every given request's block ids (or its absence) and progress."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kvcoord


def pool_state(pool: kvcoord.BlockPool) -> tuple[Any, ...]:
    """Free queue order, reference counts, cached flags and cache keys."""
    cached = pool.cached_mask().tolist()
    keys = tuple(pool.block_hash(b) for b, c in enumerate(cached) if c)
    return (
        tuple(pool.free_block_ids().tolist()),
        tuple(pool.ref_counts().tolist()),
        tuple(cached),
        keys,
        pool.num_free_blocks,
        pool.num_cached_blocks,
    )


def request_state(req: kvcoord.Request) -> tuple[Any, ...]:
    """A request's tokens, hashes and progress."""
    return (
        req.request_id,
        tuple(req.all_token_ids),
        req.num_prompt_tokens,
        req.num_computed_tokens,
        tuple(req.block_hashes),
    )


def manager_state(
    mgr: kvcoord.KVCacheManager, requests: Iterable[kvcoord.Request | str] = ()
) -> tuple[Any, ...]:
    """The pool's state, the number of running requests and, for each given
    request (or id), its block ids per group or ``None`` when not held."""
    tables = []
    for r in requests:
        rid = r if isinstance(r, str) else r.request_id
        try:
            tables.append((rid, tuple(tuple(g) for g in mgr.get_block_ids(rid))))
        except kvcoord.UnknownRequestError:
            tables.append((rid, None))
        if not isinstance(r, str):
            tables.append(request_state(r))
    return (pool_state(mgr.block_pool), mgr.num_running_requests, tuple(tables))
