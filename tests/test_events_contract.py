"""The event wire's one contract (kvcoord.events.wire): ``encode_batch`` and
``make_batch`` accept exactly what ``decode_batch`` reads back, and refuse
the rest with the decoder's own message; ``extra_keys`` nesting is bounded
the same way on both sides; nothing nested deeply makes either side raise
``RecursionError``."""

from __future__ import annotations

from typing import Any

import pytest

msgspec = pytest.importorskip("msgspec")
pytest.importorskip("zmq")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from events_batches import DEEP_ARRAY, WIRE_TYPES, batches, nested, raw_batches, same  # noqa: E402
from kvcoord.errors import ArgumentTypeError, EventTypeError, InvalidEventError, KvCoordError  # noqa: E402
from kvcoord.events import (  # noqa: E402
    MAX_EXTRA_KEYS_DEPTH,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    make_batch,
    to_wire,
)

B = 16
DEEP = 100_000  # far past any recursion limit


def stored(**fields: Any) -> BlockStored:
    base: dict[str, Any] = {
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1] * B,
        "block_size": B,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    return BlockStored(**{**base, **fields})


def removed(**fields: Any) -> BlockRemoved:
    return BlockRemoved(**{"block_hashes": [1], "medium": "GPU", **fields})


def batch_of(*events: Any, ts: Any = 1.0, rank: Any = 0) -> KVEventBatch:
    return KVEventBatch(ts=ts, events=list(events), data_parallel_rank=rank)


# (batch, error class, where the message says the fault is)
REFUSED: list[tuple[KVEventBatch, type[Exception], str]] = [
    # time stamps (were: encoded, then refused by every decoder of kvcoord)
    (batch_of(ts=float("nan")), InvalidEventError, r"\$\[0\]"),
    (batch_of(ts=-1.0), InvalidEventError, r"\$\[0\]"),
    (batch_of(ts=float("inf")), InvalidEventError, r"\$\[0\]"),
    (batch_of(ts=float("-inf")), InvalidEventError, r"\$\[0\]"),
    (batch_of(ts="x"), EventTypeError, r"\$\[0\]"),
    (batch_of(ts=True), EventTypeError, r"\$\[0\]"),
    (batch_of(ts=None), EventTypeError, r"\$\[0\]"),
    # ranks
    (batch_of(rank=-1), InvalidEventError, r"\$\[2\]"),
    (batch_of(rank=1.5), EventTypeError, r"\$\[2\]"),
    (batch_of(rank="x"), EventTypeError, r"\$\[2\]"),
    (batch_of(rank=True), EventTypeError, r"\$\[2\]"),
    (batch_of(rank=2**70), InvalidEventError, "ints"),
    # BlockStored fields
    (batch_of(stored(token_ids=[1, -5])), InvalidEventError, r"token_ids\[1\]"),
    (batch_of(stored(token_ids=[2**70])), InvalidEventError, "ints"),
    (batch_of(stored(token_ids=["x"])), EventTypeError, r"token_ids\[0\]"),
    (batch_of(stored(token_ids="abc")), EventTypeError, r"\.token_ids"),
    (batch_of(stored(block_size=0)), InvalidEventError, r"\.block_size"),
    (batch_of(stored(block_size=-16)), InvalidEventError, r"\.block_size"),
    (batch_of(stored(block_size=1.5)), EventTypeError, r"\.block_size"),
    (batch_of(stored(group_idx=-1)), InvalidEventError, r"\.group_idx"),
    (batch_of(stored(group_idx="0")), EventTypeError, r"\.group_idx"),
    (batch_of(stored(kv_cache_spec_sliding_window=0)), InvalidEventError, r"sliding_window"),
    (batch_of(stored(block_hashes=["x"])), EventTypeError, r"block_hashes\[0\]"),
    (batch_of(stored(block_hashes=[1.5])), EventTypeError, r"block_hashes\[0\]"),
    (batch_of(stored(block_hashes=[2**64])), InvalidEventError, "ints"),
    (batch_of(stored(block_hashes="x")), EventTypeError, r"\.block_hashes"),
    (batch_of(stored(parent_block_hash="x")), EventTypeError, r"parent_block_hash"),
    (batch_of(stored(lora_id="x")), EventTypeError, r"\.lora_id"),
    (batch_of(stored(medium=5)), EventTypeError, r"\.medium"),
    (batch_of(stored(lora_name=b"x")), EventTypeError, r"\.lora_name"),
    (batch_of(stored(session_id="\ud800")), InvalidEventError, "surrogates"),
    (batch_of(stored(extra_keys=[5])), EventTypeError, r"extra_keys\[0\]"),
    (batch_of(stored(extra_keys="x")), EventTypeError, r"\.extra_keys"),
    (batch_of(stored(extra_keys=[(object(),)])), EventTypeError, "object"),
    (batch_of(stored(lookahead_token_ids=[[-1]])), InvalidEventError, "lookahead"),
    # BlockRemoved fields
    (batch_of(removed(block_hashes=["x"])), EventTypeError, r"block_hashes\[0\]"),
    (batch_of(removed(group_idx=-1)), InvalidEventError, r"\.group_idx"),
    (batch_of(removed(medium=1)), EventTypeError, r"\.medium"),
    (batch_of(AllBlocksCleared(), removed(block_hashes=None)), EventTypeError, r"\$\[1\]\[1\]"),
]


@pytest.mark.parametrize(("batch", "error", "where"), REFUSED)
def test_encode_refuses_what_decode_refuses(
    batch: KVEventBatch, error: type[Exception], where: str
) -> None:
    with pytest.raises(error, match=where) as refused:
        encode_batch(batch)
    assert isinstance(refused.value, KvCoordError | ValueError)
    if batch.ts is not None:  # make_batch's None is "now"
        with pytest.raises(error, match=where):
            make_batch(batch.events, ts=batch.ts, data_parallel_rank=batch.data_parallel_rank)
    # One schema: where plain msgpack can carry the batch, kvcoord's decoder
    # refuses those bytes with the very message the encoder gave.
    try:
        raw = msgspec.msgpack.encode(batch)
    except (TypeError, ValueError, OverflowError):
        return
    with pytest.raises(msgspec.DecodeError) as decoded:
        decode_batch(raw)
    assert str(decoded.value) in str(refused.value)


@pytest.mark.parametrize(
    "batch",
    [
        [1.0, [], 0],  # a list, not a KVEventBatch
        KVEventBatch(ts=1.0, events=(AllBlocksCleared(),)),  # a tuple of events
        batch_of({"type": "AllBlocksCleared"}),  # a map, not a wire event
        batch_of(object()),
    ],
)
def test_encode_refuses_what_is_not_a_batch_of_wire_events(batch: Any) -> None:
    with pytest.raises(EventTypeError):
        encode_batch(batch)


def test_make_batch_refuses_what_is_not_an_event_and_bad_options() -> None:
    with pytest.raises(EventTypeError, match="not a kvcoord KV event"):
        make_batch([object()])  # type: ignore[list-item]
    with pytest.raises(EventTypeError, match="iterable"):
        make_batch(5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="int_hashes"):
        make_batch([], int_hashes="no")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="lora_ids"):
        make_batch([], lora_ids=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="lora_ids"):
        to_wire(AllBlocksCleared(), lora_ids=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("payload", ["\x93", None, 5])
def test_decode_batch_refuses_what_is_not_bytes(payload: Any) -> None:
    with pytest.raises(ArgumentTypeError, match="bytes-like"):
        decode_batch(payload)


def nested_tuple(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = (value,)
    return value


# ``extra_keys`` nesting exactly ``depth`` levels, three ways: the list (1),
# a block's tuple (2), then lists, or a map and lists in its value, or a map
# and tuples in its key.
DEPTH_SHAPES = {
    "lists": lambda depth: [(nested(depth - 2),), None],
    "map value": lambda depth: [None, ({"k": nested(depth - 3)},)],
    "map key": lambda depth: [({nested_tuple(depth - 3): 0},)],
}


@pytest.mark.parametrize("shape", sorted(DEPTH_SHAPES))
def test_extra_keys_depth_bound_is_one_rule_on_both_sides(shape: str) -> None:
    at_bound = batch_of(stored(extra_keys=DEPTH_SHAPES[shape](MAX_EXTRA_KEYS_DEPTH)))
    assert same(decode_batch(encode_batch(at_bound)), at_bound)
    too_deep = batch_of(stored(extra_keys=DEPTH_SHAPES[shape](MAX_EXTRA_KEYS_DEPTH + 1)))
    where = rf"deeper than {MAX_EXTRA_KEYS_DEPTH} levels - at `\$\[1\]\[0\]\.extra_keys`"
    with pytest.raises(InvalidEventError, match=where):
        encode_batch(too_deep)
    with pytest.raises(InvalidEventError, match=where):
        make_batch(too_deep.events, ts=1.0)
    with pytest.raises(msgspec.ValidationError, match=where):
        decode_batch(msgspec.msgpack.encode(too_deep))


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    """Was: ``RecursionError`` from the encoder and from ``decode_batch``."""
    with pytest.raises(InvalidEventError, match="nested too deep"):
        encode_batch(batch_of(stored(extra_keys=[(nested(DEEP),)])))
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidEventError, match="nested too deep"):
        encode_batch(batch_of(stored(extra_keys=[(loop,)])))
    ok = msgspec.msgpack.encode(batch_of(stored(extra_keys=[(0,)])))
    deep = DEEP_ARRAY
    payloads = [
        ok.replace(b"\x91\x91\x00", b"\x91\x91" + deep),  # in extra_keys
        ok.replace(b"\xa6medium", b"\xa3zzz" + deep + b"\xa6medium"),  # an unknown field
        b"\x94\xcb" + msgspec.msgpack.encode(1.0)[1:] + b"\x90\xc0" + deep,  # a 4th element
        b"\x93" + deep + b"\x90\xc0",  # the time stamp
    ]
    for payload in payloads:
        assert payload != ok
        with pytest.raises(msgspec.DecodeError):
            decode_batch(payload)


def test_decoded_batches_reencode_to_the_same_bytes() -> None:
    batch = batch_of(
        stored(extra_keys=[("salt", ("mm", 3), b"\x01" * 32), None], group_idx=1),
        removed(group_idx=0),
        AllBlocksCleared(),
        ts=12.5,
        rank=None,
    )
    payload = encode_batch(batch)
    assert payload == msgspec.msgpack.encode(batch)  # the check adds nothing to the bytes
    assert encode_batch(decode_batch(payload)) == payload


def test_the_callers_batch_is_left_as_given() -> None:
    batch = batch_of(stored(), rank=None)
    make_batch(batch.events, ts=2.0)
    encode_batch(batch)
    assert batch.data_parallel_rank is None and batch.ts == 1.0


def structurally_a_batch(batch: Any) -> bool:
    """A KVEventBatch whose events are a list of wire events (the declared
    types, which msgpack alone cannot tell from a list or a map)."""
    return (
        type(batch) is KVEventBatch
        and type(batch.events) is list
        and all(type(e) in WIRE_TYPES for e in batch.events)
    )


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(batch=batches())
def test_every_batch_encode_accepts_decodes_to_an_equal_batch(batch: KVEventBatch) -> None:
    try:
        payload = encode_batch(batch)
    except InvalidEventError:
        # Refused: msgpack cannot carry it, it is not a batch of wire events,
        # or kvcoord's decoder refuses the bytes.
        try:
            raw = msgspec.msgpack.encode(batch)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return
        if structurally_a_batch(batch):
            with pytest.raises(msgspec.DecodeError):
                decode_batch(raw)
        return
    decoded = decode_batch(payload)
    assert same(decoded, batch)
    # What kvcoord decodes, it re-encodes as a fixed point (an int time stamp
    # given comes back a float, as the schema declares it).
    again = encode_batch(decoded)
    assert encode_batch(decode_batch(again)) == again
    assert again == payload or type(batch.ts) is not float
    assert make_batch(batch.events, ts=batch.ts, data_parallel_rank=batch.data_parallel_rank)


@PROPERTY
@given(raw=raw_batches())
def test_every_batch_decode_accepts_encodes_back(raw: list[Any]) -> None:
    """The encoder is no stricter than the decoder: what kvcoord reads from
    any publisher, kvcoord can publish, and it reads back the same."""
    try:
        payload = msgspec.msgpack.encode(raw)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return
    try:
        decoded = decode_batch(payload)
    except msgspec.DecodeError:
        return
    again = decode_batch(encode_batch(decoded))
    assert same(again, decoded)
