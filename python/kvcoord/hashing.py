"""Typed inputs of block hashing.

Block hashes chain over a request's whole prefix and include *extra keys*: a
LoRA adapter (every block), multimodal items (every block they overlap, with
their offset relative to the block start) and a cache salt (block 0 only).
``sha256_cbor`` and ``xxhash_cbor`` are byte-identical to vLLM 0.33.0;
``xxh3_native`` is kvcoord's own faster, stable format.

Seeds: without ``hash_seed``, ``sha256_cbor`` uses vLLM's fixed
``"vllm-none-hash"``; ``xxhash_cbor`` and ``xxh3_native`` use a random seed
drawn once per process. XXH3 is not collision resistant, so a predictable
seed would let an attacker precompute token sequences whose block hashes
collide with another tenant's prefix. Pass an explicit (secret) seed only
when several processes must agree on digests.

Plain tuples are accepted wherever these named tuples are.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = ["HashAlgoName", "LoRA", "MultiModalFeature"]

HashAlgoName = Literal["sha256_cbor", "xxhash_cbor", "xxh3_native", "supplied"]
"""Names accepted by ``hash_algo``."""


class LoRA(NamedTuple):
    """A LoRA adapter as it enters block hashes: ``("lora", name, path)``."""

    name: str
    path: str


class MultiModalFeature(NamedTuple):
    """A multimodal item in the prompt: its identifier (content hash) and its
    token range ``[offset, offset + length)`` in prompt positions."""

    identifier: str
    offset: int
    length: int
