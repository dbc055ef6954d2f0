"""kvcoord's view of vLLM's ``Request`` objects.

kvcoord's core reads a request's token count, prompt length, computed-token
count and chained block hashes from a :class:`kvcoord.Request`. The registry
keeps one per live vLLM request, made from the vLLM request itself (prompt,
LoRA adapter, multimodal items, cache salt) and brought up to date from it
before each use: new output tokens are appended (one call, their blocks
hashed in Rust) and the computed-token count copied. vLLM's request stays
the only thing the scheduler touches.

Hashes are kvcoord's own (``xxh3_native`` by default, with the extra keys
vLLM hashes), so decisions equal vLLM's whatever hash vLLM itself uses.
Placeholder token ids below 0 (multimodal inputs) are taken modulo 2**32.
A request with prompt embeddings gets a salt of its own: its blocks are
never shared (fewer hits than vLLM, never a wrong one) and
:data:`stats` counts it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from kvcoord._core import Request
from kvcoord.errors import InvalidTokenError
from kvcoord.hashing import HashAlgoName
from kvcoord.vllm._hasher import ATTR

__all__ = ["RequestRegistry", "stats"]

#: Process-wide counters (``prompt_embeds_isolated``, ``rebuilt``).
stats: Counter[str] = Counter()


def _tokens(ids: Any) -> Any:
    """Token ids as kvcoord takes them: placeholders (< 0) modulo 2**32."""
    return np.asarray(ids, dtype=np.int64).astype(np.uint32)


class RequestRegistry:
    """One :class:`kvcoord.Request` per live vLLM request id."""

    __slots__ = ("_by_id", "core_ids", "hash_algo", "hash_block_size")

    def __init__(self, hash_block_size: int, hash_algo: HashAlgoName = "xxh3_native") -> None:
        self.hash_block_size = hash_block_size
        self.hash_algo: HashAlgoName = hash_algo
        self._by_id: dict[str, Request] = {}
        #: vLLM request id -> the id its kvcoord request has in the core, for
        #: ids whose earlier blocks are still parked under the plain id (see
        #: :mod:`kvcoord.vllm._parking`); absent: the same id.
        self.core_ids: dict[str, str] = {}

    def core_id(self, request_id: str) -> str:
        """The core's id for the vLLM request ``request_id``."""
        return self.core_ids.get(request_id, request_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, request: Any) -> Request:
        """kvcoord's request for ``request`` (a vLLM ``Request``), in step with it."""
        mine = self._by_id.get(request.request_id)
        if mine is None:
            # The request's own hashing request (kvcoord as vLLM's block hasher).
            shared = request.__dict__.get(ATTR)
            if (
                isinstance(shared, Request)
                and shared.hash_block_size == self.hash_block_size
                and request.request_id not in self.core_ids
            ):
                mine = self._by_id[request.request_id] = shared
        num_tokens = request.num_tokens
        if mine is None or mine.num_tokens > num_tokens:
            if mine is not None:
                stats["rebuilt"] += 1
            mine = self._make(request)
            self._by_id[request.request_id] = mine
        elif mine.num_tokens < num_tokens:
            new = request.all_token_ids[mine.num_tokens : num_tokens]
            try:
                mine.append_output_token_ids(new)
            except InvalidTokenError:
                mine.append_output_token_ids(_tokens(new))
        mine.num_computed_tokens = request.num_computed_tokens
        return mine

    def peek(self, request_id: str) -> Request:
        """kvcoord's request for the vLLM request id ``request_id`` as last
        synced, or an empty request under its core id when none is live."""
        mine = self._by_id.get(request_id)
        if mine is None:
            mine = Request(self.core_id(request_id), [], hash_block_size=self.hash_block_size)
        return mine

    def ids(self) -> list[str]:
        """Ids of the requests seen and not yet dropped."""
        return list(self._by_id)

    def drop(self, request_id: str) -> None:
        self._by_id.pop(request_id, None)

    def _make(self, request: Any) -> Request:
        prompt = request.prompt_token_ids
        salt = request.cache_salt or None
        if prompt is None or getattr(request, "prompt_embeds", None) is not None:
            # vLLM hashes the embeddings; kvcoord cannot yet: isolate the request.
            stats["prompt_embeds_isolated"] += 1
            prompt = [0] * request.num_prompt_tokens
            salt = f"kvcoord-isolated:{id(request)}:{request.request_id}:{salt}"
        lora = request.lora_request
        mine = self._new(request, prompt, salt, lora)
        if request.num_tokens > mine.num_tokens:
            outputs = request.all_token_ids[mine.num_tokens : request.num_tokens]
            try:
                mine.append_output_token_ids(outputs)
            except InvalidTokenError:
                mine.append_output_token_ids(_tokens(outputs))
        return mine

    def _new(self, request: Any, prompt: Any, salt: str | None, lora: Any) -> Request:
        kwargs: dict[str, Any] = {
            "hash_block_size": self.hash_block_size,
            "hash_algo": self.hash_algo,
            "cache_salt": salt,
            "lora": (lora.lora_name, lora.lora_path or "") if lora else None,
            "mm_features": [
                (f.identifier, f.mm_position.offset, f.mm_position.length)
                for f in (request.mm_features or ())
            ],
        }
        rid = self.core_id(request.request_id)
        try:
            return Request(rid, list(prompt), **kwargs)
        except InvalidTokenError:
            return Request(rid, _tokens(prompt), **kwargs)
