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

One contract covers both directions: :func:`decode_batch` defines what a
valid batch is (the msgspec types below, with their ranges, plus the nesting
bound :data:`MAX_EXTRA_KEYS_DEPTH`), and :func:`encode_batch` (so also
:func:`make_batch` and the publisher) checks each payload by decoding it
with that same decoder before handing it out. Whatever kvcoord encodes,
kvcoord decodes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any, TypeAlias

import msgspec

from kvcoord._core import AllBlocksCleared as CoreAllBlocksCleared
from kvcoord._core import BlockRemoved as CoreBlockRemoved
from kvcoord._core import BlockStored as CoreBlockStored
from kvcoord.errors import ArgumentTypeError, EventTypeError, InvalidEventError

__all__ = [
    "MAX_EXTRA_KEYS_DEPTH",
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

# What a batch's numbers may be (enforced by `decode_batch`, hence by
# `encode_batch` too; the encoded bytes are vLLM's either way): a finite
# non-negative time stamp, non-negative token ids, ranks and group indices,
# positive sizes.
_Time = Annotated[float, msgspec.Meta(ge=0.0, le=sys.float_info.max)]
_Index = Annotated[int, msgspec.Meta(ge=0)]
_Size = Annotated[int, msgspec.Meta(ge=1)]

#: How deeply arrays and maps may nest in a ``BlockStored.extra_keys``,
#: counting the per-block list itself (1) and each block's tuple (2):
#: vLLM's ``(mm_identifier, offset)`` pairs sit at depth 3. Deeper values
#: are refused by :func:`decode_batch` and, through it, by :func:`encode_batch`.
MAX_EXTRA_KEYS_DEPTH = 16

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
        EventTypeError: ``event`` is not a kvcoord event (a ``TypeError``).
        ArgumentTypeError: ``int_hashes`` is not a bool or ``lora_ids`` not a
            mapping or None.
    """
    check_options(int_hashes, lora_ids)
    return _convert(event, int_hashes, lora_ids)


def check_options(int_hashes: object, lora_ids: object) -> None:
    """The conversion options' types (also the publisher's arguments)."""
    if not isinstance(int_hashes, bool):
        raise ArgumentTypeError(f"int_hashes must be a bool, got {type(int_hashes).__name__}")
    if lora_ids is not None and not isinstance(lora_ids, Mapping):
        raise ArgumentTypeError(
            f"lora_ids must be a mapping or None, got {type(lora_ids).__name__}"
        )


def _convert(event: CoreEvent, int_hashes: bool, lora_ids: Mapping[str, int] | None) -> WireEvent:
    kind = type(event)
    if kind is CoreBlockRemoved:  # the most frequent: one per evicted block
        removed: CoreBlockRemoved = event  # type: ignore[assignment]
        h: ExternalBlockHash = removed.block_hash if int_hashes else removed.block_hash_digest
        return BlockRemoved(block_hashes=[h], medium=removed.medium, group_idx=removed.group_idx)
    if kind is CoreBlockStored:
        return _stored(event, int_hashes, lora_ids)  # type: ignore[arg-type]
    if kind is CoreAllBlocksCleared:
        return AllBlocksCleared()
    raise EventTypeError(f"not a kvcoord KV event: {kind.__name__}")


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
    ``ts`` defaults to ``time.time()`` as vLLM's scheduler stamps it.

    Raises:
        InvalidEventError: the batch would not decode (see :func:`encode_batch`).
        EventTypeError: an event is neither a kvcoord nor a wire event, or
            ``events`` is not iterable.
        ArgumentTypeError: ``int_hashes`` or ``lora_ids`` of the wrong type.
    """
    batch = build_batch(
        events,
        ts=ts,
        data_parallel_rank=data_parallel_rank,
        int_hashes=int_hashes,
        lora_ids=lora_ids,
    )
    encode_batch(batch)
    return batch


def build_batch(
    events: Iterable[CoreEvent | WireEvent],
    *,
    ts: float | None,
    data_parallel_rank: int | None,
    int_hashes: bool,
    lora_ids: Mapping[str, int] | None,
) -> KVEventBatch:
    """:func:`make_batch` without the check (the publisher checks the payload
    it encodes instead of encoding twice)."""
    check_options(int_hashes, lora_ids)
    try:
        items = iter(events)
    except TypeError:
        raise EventTypeError(
            f"events must be an iterable of KV events, got {type(events).__name__}"
        ) from None
    wire: list[WireEvent] = [
        e  # type: ignore[misc]
        if type(e) in _WIRE_TYPES
        else _convert(e, int_hashes, lora_ids)  # type: ignore[arg-type]
        for e in items
    ]
    return KVEventBatch(
        ts=time.time() if ts is None else ts, events=wire, data_parallel_rank=data_parallel_rank
    )


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    """The msgpack payload of a batch (vLLM's bytes for the same batch),
    checked by decoding it with :func:`decode_batch`: a payload this returns
    decodes to a batch equal to ``batch`` (sequences as lists, extra keys
    as tuples of what msgpack carries).

    Raises:
        InvalidEventError: ``decode_batch`` would refuse the payload (the
            message is its message: what is wrong, and where, ``$[0]``); a
            number too large for msgpack; nesting deeper than
            :data:`MAX_EXTRA_KEYS_DEPTH` or than the encoder can follow.
        EventTypeError: ``batch`` is not a :class:`KVEventBatch`, its
            events not a list of wire events, or a field has the wrong type.
    """
    if type(batch) is not KVEventBatch:
        raise EventTypeError(f"not a KVEventBatch: {type(batch).__name__}")
    events = batch.events
    if type(events) is not list:
        raise EventTypeError(f"KVEventBatch.events must be a list, got {type(events).__name__}")
    if not all(type(e) in _WIRE_TYPES for e in events):
        i, bad = next((i, e) for i, e in enumerate(events) if type(e) not in _WIRE_TYPES)
        raise EventTypeError(f"not a wire event: {type(bad).__name__} - at `$[1][{i}]`")
    try:
        payload = _ENCODER.encode(batch)
    except TypeError as e:
        raise EventTypeError(f"event batch cannot be encoded: {e}") from None
    except RecursionError:
        raise InvalidEventError("event batch cannot be encoded: nested too deep") from None
    except (OverflowError, ValueError) as e:
        raise InvalidEventError(f"event batch cannot be encoded: {e}") from None
    try:
        decode_batch(payload)
    except msgspec.ValidationError as e:
        cls = EventTypeError if ", got `" in str(e) else InvalidEventError
        raise cls(f"event batch would not decode: {e}") from None
    except msgspec.DecodeError as e:
        raise InvalidEventError(f"event batch would not decode: {e}") from None
    return payload


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a payload published by kvcoord or by vLLM.

    Raises:
        msgspec.DecodeError: the payload is not a valid event batch: not
            msgpack, truncated, a field missing or of the wrong type, a
            number out of range (a time stamp that is negative or not finite,
            a negative token id, group index or rank, a size below 1), or
            ``extra_keys`` nested deeper than :data:`MAX_EXTRA_KEYS_DEPTH`
            (any value nested deeper than the decoder can follow is refused
            the same way); the message says where (``$[1][0].block_size``).
        ArgumentTypeError: ``payload`` is not bytes-like (a ``TypeError``).
    """
    try:
        batch = _DECODER.decode(payload)
    except TypeError:
        raise ArgumentTypeError(
            f"payload must be bytes-like, got {type(payload).__name__}"
        ) from None
    except RecursionError:
        raise msgspec.DecodeError("event batch nested too deep to decode") from None
    for i, event in enumerate(batch.events):
        if type(event) is BlockStored and event.extra_keys and _too_deep(event.extra_keys):
            raise msgspec.ValidationError(
                f"extra_keys nested deeper than {MAX_EXTRA_KEYS_DEPTH} levels"
                f" - at `$[1][{i}].extra_keys`"
            )
    return batch


_CONTAINERS = (list, tuple, dict)


def _children(container: Any) -> Iterator[Any]:
    """The arrays and maps directly inside a decoded array or map (keys too:
    msgspec decodes array keys as tuples)."""
    if type(container) is dict:
        items: Iterable[Any] = (*container.keys(), *container.values())
    else:
        items = container
    return (x for x in items if type(x) in _CONTAINERS)


def _too_deep(extra_keys: list[Any]) -> bool:
    """Whether ``extra_keys`` (as decoded) nests deeper than the bound;
    level by level, without recursion, so any depth the decoder produced
    is measured."""
    level: list[Any] = [extra_keys]
    for _ in range(MAX_EXTRA_KEYS_DEPTH):
        level = [child for container in level for child in _children(container)]
        if not level:
            return False
    return True
