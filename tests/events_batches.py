"""Shared by the event wire tests: hypothesis strategies for wire batches
(mostly valid, with a few fields swapped for wild values), an equality that
sees what msgpack carries, and a foreign publisher speaking the protocol
over real ZeroMQ sockets with whatever payloads it is handed."""

from __future__ import annotations

import math
import threading
from typing import Any

import msgspec
import zmq
from hypothesis import strategies as st

from kvcoord.events import (
    END_SEQ,
    MAX_EXTRA_KEYS_DEPTH,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

U64 = 2**64 - 1
WIRE_TYPES = (BlockStored, BlockRemoved, AllBlocksCleared)


#: A msgpack array nested far past any recursion limit.
DEEP_ARRAY = b"\x91" * 100_000 + b"\x00"


def nested(depth: int, leaf: Any = 0) -> Any:
    """``leaf`` inside ``depth`` lists, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


texts = st.text(max_size=4)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), U64),
    st.floats(),
    texts,
    st.binary(max_size=4),
)
# What a block's extra keys may hold: scalars, arrays and maps of them,
# sometimes nested past the bound.
extra_values = st.one_of(
    st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.tuples(inner, inner)
            | st.dictionaries(st.one_of(texts, st.integers(-5, 5)), inner, max_size=2)
        ),
        max_leaves=8,
    ),
    st.integers(MAX_EXTRA_KEYS_DEPTH - 4, MAX_EXTRA_KEYS_DEPTH + 2).map(nested),
)
wild = st.one_of(
    scalars,
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, -1.0, math.inf, -math.inf, math.nan, "\ud800", "x", b"x", 2**64]),
    st.lists(st.integers(-3, 3), max_size=2),
    st.builds(object),
    st.integers(0, 3000).map(nested),
)
hashes = st.one_of(st.integers(0, U64), st.binary(max_size=32))
indices = st.integers(0, U64)
sizes = st.integers(1, U64)
opt_texts = st.none() | texts

STORED_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "block_hashes": st.lists(hashes, max_size=3),
    "parent_block_hash": st.none() | hashes,
    "token_ids": st.lists(indices, max_size=6),
    "block_size": sizes,
    "lora_id": st.none() | st.integers(-(2**63), U64),
    "medium": opt_texts,
    "lora_name": opt_texts,
    "extra_keys": st.none()
    | st.lists(st.none() | st.lists(extra_values, max_size=3).map(tuple), max_size=3),
    "group_idx": st.none() | indices,
    "kv_cache_spec_kind": opt_texts,
    "kv_cache_spec_sliding_window": st.none() | sizes,
    "locality": opt_texts,
    "ownership": opt_texts,
    "session_id": opt_texts,
    "lookahead_token_ids": st.none() | st.lists(st.lists(indices, max_size=3), max_size=2),
}
REMOVED_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "block_hashes": st.lists(hashes, max_size=3),
    "medium": opt_texts,
    "group_idx": st.none() | indices,
    "locality": opt_texts,
    "ownership": opt_texts,
}
EVENT_FIELDS = {BlockStored: STORED_FIELDS, BlockRemoved: REMOVED_FIELDS, AllBlocksCleared: {}}
TS = st.floats(0.0, 1e12) | st.integers(0, 2**53)
RANKS = st.none() | st.integers(0, U64)


@st.composite
def events(draw: st.DrawFn, kind: type[Any]) -> dict[str, Any]:
    """One event's fields: valid values, one of them wild now and then
    (the first choice of a sampled list is hypothesis's favourite: the
    valid one)."""
    fields = {name: draw(s) for name, s in EVENT_FIELDS[kind].items()}
    if fields and draw(st.sampled_from(range(6))) == 5:
        fields[draw(st.sampled_from(sorted(fields)))] = draw(wild)
    return fields


@st.composite
def batches(draw: st.DrawFn) -> KVEventBatch:
    """A batch as a caller may build one: struct constructors check nothing,
    so any value can sit in any field."""
    built: list[Any] = []
    for kind in draw(st.lists(st.sampled_from(WIRE_TYPES), max_size=4)):
        built.append(kind(**draw(events(kind))))
    ts: Any = draw(TS)
    rank: Any = draw(RANKS)
    which = draw(st.sampled_from(["", "", "", "", "", "", "", "", "", "ts", "rank", "event"]))
    if which == "ts":
        ts = draw(wild)
    elif which == "rank":
        rank = draw(wild)
    elif which == "event" and built:
        built[draw(st.integers(0, len(built) - 1))] = draw(wild)
    return KVEventBatch(ts=ts, events=built, data_parallel_rank=rank)


@st.composite
def raw_batches(draw: st.DrawFn) -> list[Any]:
    """A batch as any publisher's msgpack may carry it: ``[ts, events, rank]``
    of plain values, event maps tagged ``"type"``."""
    out = []
    for kind in draw(st.lists(st.sampled_from(WIRE_TYPES), max_size=4)):
        fields = draw(events(kind))
        out.append({"type": kind.__name__, **fields})
    ts = draw(wild) if draw(st.sampled_from(range(6))) == 5 else draw(TS)
    return [ts, out, draw(RANKS)]


def same(a: Any, b: Any) -> bool:
    """Equal as msgpack carries them: arrays whatever their Python sequence
    type, NaN equal to NaN, bytes-likes by content."""
    if isinstance(a, msgspec.Struct) or isinstance(b, msgspec.Struct):
        return type(a) is type(b) and all(
            same(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__
        )
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and len(a) == len(b)
            and all(
                same(ka, kb) and same(va, vb)
                for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
            )
        )
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, bytes | bytearray | memoryview):
        return isinstance(b, bytes) and bytes(a) == b
    return bool(type(a) is type(b) and a == b)


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


class ForeignPublisher:
    """A publisher that is not kvcoord's: a PUB socket and a ROUTER that
    answers replay requests from what it keeps, whatever the payloads."""

    def __init__(self) -> None:
        ctx = zmq.Context.instance()
        self.pub = ctx.socket(zmq.PUB)
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self._router = ctx.socket(zmq.ROUTER)
        port = self._router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{port}"
        self._kept: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.requests: list[int] = []
        #: Answer every replay request with exactly these, when set.
        self.answer: list[tuple[int, bytes]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def keep(self, seq: int, payload: bytes) -> None:
        """Keep a batch for replay without sending it (as if PUB dropped it)."""
        with self._lock:
            self._kept[seq] = payload

    def send(self, seq: int, payload: bytes) -> None:
        self.keep(seq, payload)
        self.pub.send_multipart((b"", seq_frame(seq), payload))

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._router.poll(10):
                continue
            ident, _empty, start = self._router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.requests.append(first)
            with self._lock:
                kept = sorted(self._kept.items()) if self.answer is None else self.answer
            for seq, payload in kept:
                if seq >= first or self.answer is not None:
                    self._router.send_multipart((ident, b"", b"", seq_frame(seq), payload))
            self._router.send_multipart((ident, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.pub.close(linger=0)
        self._router.close(linger=0)
