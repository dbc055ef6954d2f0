"""The msgpack wire types of vLLM 0.33.0's KV events, and conversion from
kvcoord's in-process events.

A batch is a msgspec ``array_like`` struct ``[ts, events, data_parallel_rank]``;
each event a tagged map ``{"type": "BlockStored", field: value, ...}`` with
its fields in declaration order, fields that have a default left out when
they hold it (msgspec's ``omit_defaults``). The classes below declare the
same names, order, defaults and options as vLLM's, so that either side's
decoder reads the other's bytes, and kvcoord's encoder writes the very bytes
vLLM's would for the same events (checked by the tests against vLLM's own
classes when its virtualenv exists).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, TypeAlias

import msgspec

from kvcoord._core import AllBlocksCleared as CoreAllBlocksCleared
from kvcoord._core import BlockRemoved as CoreBlockRemoved
from kvcoord._core import BlockStored as CoreBlockStored

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CoreEvent",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEventBatch",
    "WireEvent",
    "decode_batch",
    "encode_batch",
    "make_batch",
    "to_wire",
]

#: A block hash on the wire: vLLM's integer form (default) or the digest.
ExternalBlockHash: TypeAlias = bytes | int

# What a decoded batch's numbers may be (checked by `decode_batch` only: the
# encoded bytes are vLLM's either way): a finite non-negative time stamp,
# non-negative token ids, ranks and group indices, positive sizes.
_Time = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
_Index = Annotated[int, msgspec.Meta(ge=0)]
_Size = Annotated[int, msgspec.Meta(ge=1)]

#: An event as :meth:`kvcoord.KVCacheManager.take_events` returns it.
CoreEvent: TypeAlias = CoreBlockStored | CoreBlockRemoved | CoreAllBlocksCleared


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the wire events: tagged by class name, defaults omitted."""


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache (wire form)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[_Index]
    block_size: _Size
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: _Index | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: _Size | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[_Index]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left the prefix cache (wire form)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: _Index | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset (wire form)."""


WireEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One scheduler step's events: ``[ts, events, data_parallel_rank]``."""

    ts: _Time
    events: list[WireEvent]
    data_parallel_rank: _Index | None = None


def to_wire(
    event: CoreEvent,
    *,
    int_hashes: bool = True,
    lora_ids: Mapping[str, int] | None = None,
) -> WireEvent:
    """The wire form of one in-process event.

    Args:
        event: an event from ``take_events``.
        int_hashes: hashes as vLLM's 64-bit integers (vLLM's default,
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``); False sends the digests.
        lora_ids: LoRA name -> integer adapter id, for the deprecated
            ``lora_id`` field (kvcoord's requests know adapters by name and
            path only; without an entry the field is None).

    Raises:
        TypeError: ``event`` is not a kvcoord event.
    """
    kind = type(event)
    if kind is CoreBlockRemoved:  # the most frequent: one per evicted block
        removed: CoreBlockRemoved = event  # type: ignore[assignment]
        h: ExternalBlockHash = removed.block_hash if int_hashes else removed.block_hash_digest
        return BlockRemoved(block_hashes=[h], medium=removed.medium, group_idx=removed.group_idx)
    if kind is CoreBlockStored:
        return _stored(event, int_hashes, lora_ids)  # type: ignore[arg-type]
    if kind is CoreAllBlocksCleared:
        return AllBlocksCleared()
    raise TypeError(f"not a kvcoord KV event: {kind.__name__}")


def _stored(
    event: CoreBlockStored, int_hashes: bool, lora_ids: Mapping[str, int] | None
) -> BlockStored:
    if int_hashes:
        hashes: list[ExternalBlockHash] = event.block_hashes.tolist()
        parent: ExternalBlockHash | None = event.parent_block_hash
    else:
        hashes = list(event.block_hash_digests)
        parent = event.parent_block_digest
    name = event.lora_name
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=event.token_ids.tolist(),
        block_size=event.block_size,
        lora_id=None if name is None or lora_ids is None else lora_ids.get(name),
        medium=event.medium,
        lora_name=name,
        extra_keys=event.extra_keys,
        group_idx=event.group_idx,
        kv_cache_spec_kind=event.kv_cache_spec_kind,
        kv_cache_spec_sliding_window=event.kv_cache_spec_sliding_window,
    )


_WIRE_TYPES = frozenset((BlockStored, BlockRemoved, AllBlocksCleared))


def make_batch(
    events: Iterable[CoreEvent | WireEvent],
    *,
    ts: float | None = None,
    data_parallel_rank: int | None = None,
    int_hashes: bool = True,
    lora_ids: Mapping[str, int] | None = None,
) -> KVEventBatch:
    """A batch of in-process or wire events (wire events pass through);
    ``ts`` defaults to ``time.time()`` as vLLM's scheduler stamps it."""
    wire: list[WireEvent] = [
        e  # type: ignore[misc]
        if type(e) in _WIRE_TYPES
        else to_wire(e, int_hashes=int_hashes, lora_ids=lora_ids)  # type: ignore[arg-type]
        for e in events
    ]
    return KVEventBatch(
        ts=time.time() if ts is None else ts, events=wire, data_parallel_rank=data_parallel_rank
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload of a batch (vLLM's bytes for the same batch)."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a payload published by kvcoord or by vLLM.

    Raises:
        msgspec.DecodeError: the payload is not a valid event batch: not
            msgpack, truncated, a field missing or of the wrong type, or a
            number out of range (a time stamp that is negative or not finite,
            a negative token id, group index or rank, a size below 1); the
            message says where (``$[1][0].block_size``).
    """
    return _DECODER.decode(payload)
