"""The decode path of :class:`kvcoord.vllm.KVCacheManager`: the steps of a
running request that need a new block or fill one, in a plain configuration
(full attention, no watermark, nothing else to record), as one call into
the core.

That call (``CoordinatorCore.decode_slots``) reads what it needs from vLLM's
``Request`` (its token list, block hashes and computed-token count), brings
kvcoord's request up to date with it, allocates and caches as
``_allocate`` would, and records the request's "room" afterwards: within
it, ``allocate_slots`` answers without the core (see
``CoordinatorCore.decode_room``).

A base class of the manager; the attributes below are set by its constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvcoord.vllm.serve._blocks import KVCacheBlocks
from kvcoord.vllm.serve._requests import RequestRegistry

__all__ = ["DecodePath"]


class DecodePath:
    """The manager's lean path for decode steps that reach the core."""

    empty_kv_cache_blocks: KVCacheBlocks
    _pool: Any
    _requests: RequestRegistry
    _decode_room: dict[str, int]
    _decode_fixed: tuple[Any, Any] | None
    #: The manager's general path (every check, every argument).
    _allocate: Callable[..., KVCacheBlocks | None]

    def _decode_core(
        self, request: Any, num_new_tokens: int, num_lookahead_tokens: int
    ) -> KVCacheBlocks | None:
        """``_allocate`` for a running request of a plain configuration (it has
        a decode room) with no hit, external, encoder or reserved tokens and
        caching not delayed, and as many speculative tokens as the rooms are
        for: one core call, which syncs kvcoord's request from vLLM's,
        allocates, caches and records the new room."""
        assert self._decode_fixed is not None  # checked by the caller
        registered, decode_slots = self._decode_fixed
        rid = request.request_id
        entry = registered.get(rid)
        ids: Any = NotImplemented
        if entry is not None and entry[0] is request:
            ids = decode_slots(
                request, entry[1], rid, num_new_tokens, num_lookahead_tokens, self._decode_room
            )
        if ids is NotImplemented:
            # The registry syncs (a new object under the id, placeholder
            # tokens, vLLM hashes kvcoord lacks); the core call then has
            # nothing left to bring up to date.
            mine = self._requests.get(request)
            ids = decode_slots(
                request, mine, rid, num_new_tokens, num_lookahead_tokens, self._decode_room
            )
            if ids is NotImplemented:  # not vLLM 0.33.0's Request
                return self._allocate(
                    request,
                    num_new_tokens,
                    0,
                    None,
                    num_lookahead_tokens,
                    0,
                    False,
                    0,
                    False,
                    0,
                    True,
                )
        if ids is None:
            return None
        if ids:
            return KVCacheBlocks(ids, self._pool)
        return self.empty_kv_cache_blocks
