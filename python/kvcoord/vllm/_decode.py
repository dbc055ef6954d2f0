"""The decode path of :class:`kvcoord.vllm.KVCacheManager`: the steps of a
running request that need a new block or fill one, in a plain configuration
(full attention, no watermark, nothing else to record), through the core with
none of ``_allocate``'s general checks; and the "room" a request has after an
allocation, within which ``allocate_slots`` answers without the core.

A base class of the manager; the attributes below are set by its constructor.
"""

from __future__ import annotations

import sys
from typing import Any

from kvcoord.errors import InvalidTokenError
from kvcoord.vllm._blocks import KVCacheBlocks
from kvcoord.vllm._requests import RequestRegistry

__all__ = ["DecodePath"]


class DecodePath:
    """The manager's lean path for decode steps that reach the core."""

    enable_caching: bool
    max_model_len: int
    hash_block_size: int
    _held_back: int
    empty_kv_cache_blocks: KVCacheBlocks
    _core: Any
    _pool: Any
    _requests: RequestRegistry
    _decode_room: dict[str, tuple[int, int]]
    _room_sizes: tuple[int, ...]
    _decode_fixed: tuple[Any, Any, int] | None

    def _decode_core(
        self, request: Any, num_new_tokens: int, num_lookahead_tokens: int
    ) -> KVCacheBlocks | None:
        """``_allocate`` for a running request of a plain configuration (it has
        a decode room) with no hit, external, encoder or reserved tokens and
        caching not delayed: the same core calls, without the general checks
        (no watermark, no hits, no prediction), and the request synced in
        place when only its computed-token count moved."""
        assert self._decode_fixed is not None  # checked by the caller
        registered, core_empty, bs = self._decode_fixed
        num_hashes = len(request.block_hashes)
        computed = request.num_computed_tokens
        entry = registered.get(request.request_id)
        mine = None
        if entry is not None and entry[0] is request:
            # The registry's sync, inline for the usual case (the same request,
            # new output tokens, no vLLM hash kvcoord lacks): vLLM's token list
            # read directly, as the hasher does.
            mine = entry[1]
            try:
                tokens = request._all_token_ids
            except AttributeError:
                tokens = request.all_token_ids
            num_tokens = len(tokens)
            held = mine.num_tokens
            if held > num_tokens or mine.num_block_hashes < num_hashes:
                mine = None
            elif held < num_tokens:
                try:
                    mine.append_output_token_ids(tokens[held:num_tokens])
                except InvalidTokenError:
                    mine = None  # placeholders: the registry converts them
        if mine is None:
            mine = self._requests.get(request)
            num_tokens = mine.num_tokens
        else:
            mine.num_computed_tokens = computed
        hbs = self.hash_block_size
        hashed = num_hashes * hbs
        lagging = hashed < num_tokens - hbs + 1
        result = self._core.allocate_slots(
            mine, num_new_tokens, 0, None, num_lookahead_tokens, 0, lagging
        )
        if result is None:
            return None
        if computed > self.max_model_len:
            computed = self.max_model_len
        cached_to = computed + num_new_tokens
        if cached_to > num_tokens:
            cached_to = num_tokens
        if lagging and self.enable_caching:
            self._core.cache_blocks(mine, cached_to)
        # What the core cached (it holds back the re-prefillable tail).
        held_back = self._held_back
        cached_to = max(min(cached_to - held_back, hashed), 0)
        need = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if bs:
            # _room for one block size, inline.
            self._decode_room[request.request_id] = (
                -(-need // bs) * bs,
                (cached_to // bs + 1) * bs + held_back if self.enable_caching else sys.maxsize,
            )
        else:
            self._decode_room[request.request_id] = self._room(need, cached_to)
        if result is core_empty:
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(result.get_block_ids(), self._pool)

    def _room(self, need: int, cached_to: int) -> tuple[int, int]:
        """What a request holds after an allocation for ``need`` slots that
        cached its full blocks up to ``cached_to`` tokens, as (slots it has,
        first token count that completes a block not yet cached), each the
        smallest over groups. Lower bounds: a later step within both needs no
        block and caches none (any other step goes to the core)."""
        sizes = self._room_sizes
        bs = sizes[0]
        slots = -(-need // bs) * bs
        next_block = (cached_to // bs + 1) * bs
        if len(sizes) > 1:
            for bs in sizes[1:]:
                slots = min(slots, -(-need // bs) * bs)
                next_block = min(next_block, (cached_to // bs + 1) * bs)
        # A block is cached once the tokens past the re-prefillable tail fill it.
        next_block += self._held_back
        return slots, next_block if self.enable_caching else sys.maxsize
