"""vLLM's request block hasher, computed by kvcoord in Rust.

vLLM hashes every full block of every request in Python
(``get_request_block_hasher``). With kvcoord enabled, the hasher for
``sha256_cbor`` and ``xxhash_cbor`` is kvcoord's: byte-identical digests
(same CBOR encoding, same ``NONE_HASH`` seed, the same LoRA, multimodal and
cache-salt extra keys), so ``request.block_hashes`` holds exactly what vLLM
would have computed. The :class:`kvcoord.Request` doing the hashing is kept
on the vLLM request and reused by :class:`kvcoord.vllm.KVCacheManager`, so a
prompt is hashed once.

Requests kvcoord cannot hash byte-identically (prompt embeddings, placeholder
token ids below 0) and other algorithms (pickle-based ``sha256``/``xxhash``,
hash lookahead) keep vLLM's own hasher; :data:`stats` counts both paths.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kvcoord._core import BlockHashGate, Request
from kvcoord.errors import InvalidTokenError
from kvcoord.vllm.serve._versions import installed

__all__ = ["ATTR", "hand_back", "make_block_hasher", "stats"]

#: Attribute of a vLLM request holding its hashing :class:`kvcoord.Request`.
ATTR = "_kvcoord_hashes"
#: ``kvcoord_requests`` / ``vllm_requests``: requests hashed by each;
#: ``vllm_hashers``: hashers left to vLLM (algorithm or lookahead).
stats: Counter[str] = Counter()
_NOT_OURS = object()


def hand_back(request: Any) -> None:
    """From now on vLLM's own hasher hashes ``request`` (its digests so far
    are the same): kvcoord cannot hash its new tokens as vLLM does."""
    request.__dict__[ATTR] = _NOT_OURS


def _algo_name(hash_fn: Callable[[Any], bytes]) -> str | None:
    hashing: Any = importlib.import_module("vllm.utils.hashing")
    if hash_fn is hashing.sha256_cbor:
        return "sha256_cbor"
    if hash_fn is hashing.xxhash_cbor:
        return "xxhash_cbor"
    return None


def make_block_hasher(
    original: Callable[..., Callable[[Any], list[bytes]]],
) -> Callable[..., Callable[[Any], Sequence[bytes]]]:
    """A drop-in for vLLM's ``get_request_block_hasher`` built over ``original``."""

    def get_request_block_hasher(
        hash_block_size: int,
        caching_hash_fn: Callable[[Any], bytes],
        num_hash_lookahead_tokens: int = 0,
    ) -> Callable[[Any], Sequence[bytes]]:
        # vLLM 0.32's hasher has no lookahead (nor does its engine pass one).
        lookahead = (num_hash_lookahead_tokens,) if installed().hasher_takes_lookahead else ()
        fallback = original(hash_block_size, caching_hash_fn, *lookahead)
        algo = _algo_name(caching_hash_fn)
        if algo is None or num_hash_lookahead_tokens:
            stats["vllm_hashers"] += 1
            return fallback

        def request_block_hasher(request: Any) -> list[bytes]:
            # vLLM's Request calls this on every token append; most appends
            # complete no block. Its token list is read directly (the
            # ``num_tokens`` property and ``all_token_ids`` wrapper cost a
            # Python call each, and this runs per request per step).
            try:
                tokens = request._all_token_ids
            except AttributeError:  # not vLLM 0.33.0's Request: its public view
                tokens = request.all_token_ids
            num_tokens = len(tokens)
            done = len(request.block_hashes)
            if (done + 1) * hash_block_size > num_tokens:
                # No block completed: nothing to hash yet; new tokens reach
                # kvcoord's request when one does.
                return []
            mine = request.__dict__.get(ATTR)
            if mine is _NOT_OURS:
                return fallback(request)
            if mine is None:
                mine = _start(request, hash_block_size, algo)
                if mine is None:
                    request.__dict__[ATTR] = _NOT_OURS
                    stats["vllm_requests"] += 1
                    return fallback(request)
                request.__dict__[ATTR] = mine
                stats["kvcoord_requests"] += 1
                first: list[bytes] = mine.block_hashes[done:]
                return first
            # One call: the new tokens appended (and hashed), the new digests back.
            new: list[bytes] | None = None
            if type(tokens) is list:
                try:
                    new = mine.catch_up(tokens, done)
                except InvalidTokenError:
                    new = None
            if new is None:
                # Placeholder ids, a token list that went back, or not a list:
                # from here on vLLM hashes this request (same digests so far).
                request.__dict__[ATTR] = _NOT_OURS
                return fallback(request)
            return new

        # vLLM calls the hasher on every append; the gate answers the appends
        # that complete no block (most of them) without a Python frame, and
        # those that complete one for a request kvcoord already hashes (its
        # Request under ATTR) with that request's catch_up.
        gate: Callable[[Any], Sequence[bytes]] = BlockHashGate(
            hash_block_size, request_block_hasher, ATTR
        ).hash_request
        return gate

    return get_request_block_hasher


def _start(request: Any, hash_block_size: int, algo: str) -> Request | None:
    """kvcoord's hashing request for ``request``, or None when it cannot be
    byte-identical to vLLM's hashes."""
    utils: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")
    if getattr(request, "prompt_embeds", None) is not None or request.prompt_token_ids is None:
        return None
    lora = request.lora_request
    try:
        mine = Request(
            request.request_id,
            list(request.prompt_token_ids),
            hash_block_size=hash_block_size,
            hash_algo=algo,  # type: ignore[arg-type]
            hash_seed=utils.get_none_hash_seed(),
            cache_salt=request.cache_salt or None,
            lora=(lora.lora_name, lora.lora_path or "") if lora else None,
            mm_features=[
                (f.identifier, f.mm_position.offset, f.mm_position.length)
                for f in (request.mm_features or ())
            ],
        )
        if request.num_tokens > mine.num_tokens:
            mine.append_output_token_ids(
                request.all_token_ids[mine.num_tokens : request.num_tokens]
            )
    except (InvalidTokenError, ValueError, TypeError):
        return None
    return mine
