"""kvcoord's view of vLLM's ``Request`` objects.

kvcoord's core reads a request's token count, prompt length, computed-token
count and chained block hashes from a :class:`kvcoord.Request`. The registry
keeps one per live vLLM request, made from the vLLM request itself and
brought up to date from it before each use: new output tokens are appended
(one call) and the computed-token count copied. vLLM's request stays the
only thing the scheduler touches.

The block hashes are vLLM's own: the request's ``block_hashes``, whatever
hash vLLM computed them with (pickle-based ``sha256``, hash lookahead,
prompt embeddings, ...), handed to a ``hash_algo="supplied"`` request as they
appear. So the prefix cache is keyed exactly as vLLM's, hits stop where
vLLM's hashes stop, and a block's hash seen through the views and events is
vLLM's digest. Where kvcoord's own hasher made those hashes (see
:mod:`kvcoord.vllm.serve._hasher`), its :class:`kvcoord.Request` already holds them
and is reused. Placeholder token ids below 0 (multimodal inputs) are taken
modulo 2**32 (tokens never enter the keys here).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from kvcoord._core import Request
from kvcoord.errors import InvalidTokenError
from kvcoord.vllm.serve._hasher import ATTR, hand_back

__all__ = ["RequestRegistry", "stats"]

#: Process-wide counters (``rebuilt``: a request rebuilt after vLLM's
#: token count went back, ``shared``: kvcoord-hashed requests reused).
stats: Counter[str] = Counter()


def _tokens(ids: Any) -> Any:
    """Token ids as kvcoord takes them: placeholders (< 0) modulo 2**32."""
    return np.asarray(ids, dtype=np.int64).astype(np.uint32)


class RequestRegistry:
    """One :class:`kvcoord.Request` per live vLLM request id."""

    __slots__ = ("_by_id", "hash_block_size")

    def __init__(self, hash_block_size: int) -> None:
        self.hash_block_size = hash_block_size
        #: vLLM request id -> (the vLLM request object, kvcoord's request). A
        #: different object under a known id (a probe reusing an id, a request
        #: rebuilt by a test) gets a fresh kvcoord request: never stale hashes.
        self._by_id: dict[str, tuple[Any, Request]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, request: Any) -> Request:
        """kvcoord's request for ``request`` (a vLLM ``Request``), in step with it."""
        entry = self._by_id.get(request.request_id)
        mine = entry[1] if entry is not None and entry[0] is request else None
        if mine is None:
            # The request's own hashing request (kvcoord as vLLM's block hasher).
            shared = request.__dict__.get(ATTR)
            if isinstance(shared, Request) and shared.hash_block_size == self.hash_block_size:
                mine = shared
                self._by_id[request.request_id] = (request, mine)
                stats["shared"] += 1
        num_tokens = request.num_tokens
        if mine is not None and mine.num_tokens < num_tokens:
            new = request.all_token_ids[mine.num_tokens : num_tokens]
            try:
                mine.append_output_token_ids(new)
            except InvalidTokenError:
                if mine.hash_algo == "supplied":
                    mine.append_output_token_ids(_tokens(new))
                else:
                    # kvcoord hashes this request and cannot hash placeholder
                    # ids as vLLM does: vLLM's hasher takes over, and the
                    # request is rebuilt below, keyed by vLLM's digests.
                    hand_back(request)
                    mine = None
                    stats["rebuilt"] += 1
        if mine is None or mine.num_tokens > num_tokens:
            if mine is not None:
                stats["rebuilt"] += 1
            mine = self._make(request)
            self._by_id[request.request_id] = (request, mine)
        # vLLM's new block hashes (a kvcoord-hashed request already has them).
        theirs = request.block_hashes
        held = mine.num_block_hashes
        if len(theirs) > held:
            mine.supply_block_hashes(theirs[held:])
        mine.num_computed_tokens = request.num_computed_tokens
        # Async scheduling: windows release blocks on the processed basis.
        mine.num_in_flight_tokens = getattr(request, "num_in_flight_tokens", 0)
        return mine

    def peek(self, request_id: str) -> Request:
        """kvcoord's request for the vLLM request id ``request_id`` as last
        synced, or an empty request under that id when none is live."""
        entry = self._by_id.get(request_id)
        if entry is not None:
            return entry[1]
        return Request(request_id, [], hash_block_size=self.hash_block_size)

    def probe(self, block_hashes: Any) -> Request:
        """A request holding only vLLM's ``block_hashes``, for lookups by
        hashes alone (never allocated)."""
        n = len(block_hashes)
        size = self.hash_block_size
        tokens = [0] * (n * size)
        probe = Request("kvcoord-probe", tokens, hash_block_size=size, hash_algo="supplied")
        if n:
            probe.supply_block_hashes(list(block_hashes))
        return probe

    def ids(self) -> list[str]:
        """Ids of the requests seen and not yet dropped."""
        return list(self._by_id)

    def drop(self, request_id: str) -> None:
        self._by_id.pop(request_id, None)

    def _make(self, request: Any) -> Request:
        prompt = request.prompt_token_ids
        if prompt is None:
            # Prompt embeddings: vLLM's hashes cover them; tokens are placeholders.
            prompt = [0] * request.num_prompt_tokens
        mine = self._new(request, prompt)
        if request.num_tokens > mine.num_tokens:
            outputs = request.all_token_ids[mine.num_tokens : request.num_tokens]
            try:
                mine.append_output_token_ids(outputs)
            except InvalidTokenError:
                mine.append_output_token_ids(_tokens(outputs))
        return mine

    def _new(self, request: Any, prompt: Any) -> Request:
        lora = request.lora_request
        kwargs: dict[str, Any] = {
            "hash_block_size": self.hash_block_size,
            "hash_algo": "supplied",
            "cache_salt": request.cache_salt or None,
            "lora": (lora.lora_name, lora.lora_path or "") if lora else None,
            "mm_features": [
                (f.identifier, f.mm_position.offset, f.mm_position.length)
                for f in (request.mm_features or ())
            ],
        }
        rid = request.request_id
        try:
            return Request(rid, list(prompt), **kwargs)
        except InvalidTokenError:
            return Request(rid, _tokens(prompt), **kwargs)
