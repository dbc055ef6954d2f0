"""The event publisher and subscriber keep the wire's contract over real
ZeroMQ sockets: ``publish`` refuses a bad batch in the caller's thread
before it reaches the socket or the replay buffer; a subscriber skips and
reports batches it cannot decode (from a foreign publisher) and delivers
the next ones, live and by replay; every constructor argument is checked."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from events_batches import DEEP_ARRAY, ForeignPublisher, batches, nested, same, seq_frame  # noqa: E402
from kvcoord import (  # noqa: E402  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    KVCacheManager,
    KVCacheManagerOptions,
    Request,
)
from kvcoord.errors import (  # noqa: E402
    ArgumentTypeError,
    EventTypeError,
    InvalidArgumentError,
    InvalidEventError,
)
from kvcoord.events import (  # noqa: E402
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
    ZmqEventSubscriber,
    encode_batch,
    make_batch,
)

LOCAL = "tcp://127.0.0.1:0"
GOOD = encode_batch(make_batch([AllBlocksCleared()], ts=1.0, data_parallel_rank=0))
BAD = msgspec.msgpack.encode([float("nan"), [], 0])  # refused by decode_batch
# An unknown field nested past any recursion limit.
DEEP = msgspec.msgpack.encode([1.0, [{"type": "AllBlocksCleared", "zzz": 0}], 0]).replace(
    b"\xa3zzz\x00", b"\xa3zzz" + DEEP_ARRAY
)


@pytest.fixture
def pub() -> Iterator[ZmqEventPublisher]:
    with ZmqEventPublisher(LOCAL, replay_endpoint=LOCAL, bind=True, topic="kv") as p:
        yield p


@pytest.fixture
def foreign() -> Iterator[ForeignPublisher]:
    f = ForeignPublisher()
    try:
        yield f
    finally:
        f.close()


def joined(pub: ZmqEventPublisher) -> ZmqEventSubscriber:
    """A subscriber whose subscription has reached ``pub``, caught up."""
    sub = ZmqEventSubscriber(pub.endpoint, replay_endpoint=pub.replay_endpoint, topic="kv")
    while not sub.recv(20):  # PUB drops messages until the subscription arrives
        pub.publish([])
    assert pub.flush()
    while sub.recv(50):
        pass
    assert sub.last_seq == pub.next_seq - 1
    return sub


def joined_foreign(foreign: ForeignPublisher) -> ZmqEventSubscriber:
    sub = ZmqEventSubscriber(foreign.endpoint, replay_endpoint=foreign.replay_endpoint)
    while not sub.recv(20):
        foreign.send(0, GOOD)
    while sub.recv(50):
        pass
    assert sub.last_seq == 0
    return sub


# ---- publish refuses before the socket ---------------------------------------


def stored_with(**fields: Any) -> BlockStored:
    base: dict[str, Any] = {
        "block_hashes": [7],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    return BlockStored(**{**base, **fields})


BAD_PUBLISHES: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"events": [], "ts": float("nan")}, InvalidEventError),
    ({"events": [], "ts": -1.0}, InvalidEventError),
    ({"events": [], "ts": float("inf")}, InvalidEventError),
    ({"events": [], "ts": "x"}, EventTypeError),
    ({"events": KVEventBatch(ts=1.0, events=[], data_parallel_rank=-1)}, InvalidEventError),
    ({"events": KVEventBatch(ts=1.0, events=[], data_parallel_rank=1.5)}, EventTypeError),
    ({"events": KVEventBatch(ts=1.0, events=[], data_parallel_rank="x")}, EventTypeError),
    ({"events": KVEventBatch(ts=1.0, events=[], data_parallel_rank=2**70)}, InvalidEventError),
    ({"events": [stored_with(token_ids=[-1, 2])]}, InvalidEventError),
    ({"events": [stored_with(block_size=0)]}, InvalidEventError),
    ({"events": [stored_with(group_idx=-1)]}, InvalidEventError),
    ({"events": [stored_with(kv_cache_spec_sliding_window=0)]}, InvalidEventError),
    ({"events": [stored_with(block_hashes=["x"])]}, EventTypeError),
    ({"events": [stored_with(medium=3)]}, EventTypeError),
    ({"events": [stored_with(extra_keys=[(nested(20),)])]}, InvalidEventError),
    ({"events": [stored_with(extra_keys=[(nested(100_000),)])]}, InvalidEventError),
    ({"events": [object()]}, EventTypeError),
    ({"events": 5}, EventTypeError),
    ({"events": KVEventBatch(ts=1.0, events=[]), "ts": 1.0}, InvalidArgumentError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_PUBLISHES)
def test_publish_refuses_a_bad_batch_before_the_socket(
    pub: ZmqEventPublisher, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    """Was: queued, then dropped by the worker or sent unreadable (and kept
    for replay)."""
    with joined(pub) as sub:
        seq = pub.next_seq
        with pytest.raises(error):
            pub.publish(**kwargs)
        assert pub.flush() and pub.next_seq == seq  # no sequence number spent
        pub.publish([AllBlocksCleared()], ts=5.0)
        got = sub.recv(5000)
        assert [s for s, _ in got] == [seq] and got[0][1].ts == 5.0
        assert [s for s, _ in sub.replay(seq)] == [seq]
        assert sub.num_undecodable == 0


def test_publish_raises_in_the_callers_thread(pub: ZmqEventPublisher) -> None:
    raised: list[BaseException] = []

    def step() -> None:
        try:
            pub.publish([], ts=float("nan"))
        except InvalidEventError as e:
            raised.append(e)

    t = threading.Thread(target=step)
    t.start()
    t.join(10)
    assert len(raised) == 1 and "$[0]" in str(raised[0])


def test_publish_stamps_a_copy_and_core_events_pass(pub: ZmqEventPublisher) -> None:
    mgr = KVCacheManager(
        KVCacheConfig(16, (KVCacheGroup(FullAttentionSpec(4)),)),
        max_model_len=64,
        options=KVCacheManagerOptions(enable_events=True),
    )
    req = Request("r", list(range(9)), hash_block_size=4, cache_salt="s")
    assert mgr.allocate_slots(req, req.num_tokens) is not None
    with joined(pub) as sub:
        batch = KVEventBatch(ts=3.0, events=[AllBlocksCleared()])
        pub.publish(batch)
        pub.publish(mgr.take_events(), ts=4.0)
        assert batch.data_parallel_rank is None  # the caller's batch is left as given
        got: list[tuple[int, KVEventBatch]] = []
        while len(got) < 2:
            more = sub.recv(5000)
            assert more
            got += more
        assert [b.data_parallel_rank for _, b in got] == [0, 0]
        (ev,) = got[1][1].events
        assert isinstance(ev, BlockStored) and ev.extra_keys == [("s",), None]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
def test_every_batch_publish_accepts_arrives_equal_and_refused_ones_never_leave(
    batch: KVEventBatch,
) -> None:
    _PROPERTY.check(batch)


class _PublishProperty:
    """One publisher and subscriber for all examples (started on first use)."""

    def __init__(self) -> None:
        self.pub: ZmqEventPublisher | None = None
        self.sub: ZmqEventSubscriber | None = None

    def check(self, batch: KVEventBatch) -> None:
        if self.pub is None:
            self.pub = ZmqEventPublisher(LOCAL, replay_endpoint=LOCAL, bind=True, topic="kv")
            self.sub = joined(self.pub)
        pub, sub = self.pub, self.sub
        assert sub is not None
        seq = pub.next_seq
        try:
            pub.publish(batch)
        except InvalidEventError:
            assert pub.flush() and pub.next_seq == seq
            assert not sub.recv(0)  # nothing reached the socket
            return
        got = sub.recv(5000)
        assert [s for s, _ in got] == [seq]
        sent = batch
        if batch.data_parallel_rank is None:
            sent = msgspec.structs.replace(batch, data_parallel_rank=0)
        assert same(got[0][1], sent)
        ((_, replayed),) = sub.replay(seq)
        assert same(replayed, sent)
        assert sub.num_undecodable == 0

    def close(self) -> None:
        if self.sub is not None:
            self.sub.close()
        if self.pub is not None:
            self.pub.shutdown()


_PROPERTY = _PublishProperty()


@pytest.fixture(autouse=True, scope="module")
def _close_property() -> Iterator[None]:
    yield
    _PROPERTY.close()


# ---- the subscriber reads on past what it cannot decode ------------------------


def test_an_unreadable_replayed_batch_does_not_stop_delivery(
    foreign: ForeignPublisher, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: every later ``recv()`` asked for the replay again, got the bad
    batch again and raised (no batch was ever delivered)."""
    with joined_foreign(foreign) as sub:
        foreign.keep(1, BAD)  # missed live, kept for replay
        foreign.keep(2, GOOD)
        with caplog.at_level(logging.WARNING, logger="kvcoord.events"):
            foreign.send(3, GOOD)
            assert [s for s, _ in sub.recv(5000)] == [2, 3]
        assert sub.num_undecodable == 1 and sub.last_seq == 3
        assert "batch 1" in str(sub.last_decode_error) and "$[0]" in caplog.text
        asked = len(foreign.requests)
        for seq in (4, 5):
            foreign.send(seq, GOOD)
            assert [s for s, _ in sub.recv(5000)] == [seq]
        assert len(foreign.requests) == asked  # the bad batch is not asked for again


def test_recv_keeps_order_whatever_the_replay_answers(foreign: ForeignPublisher) -> None:
    """A foreign replay socket answering out of order, twice, or outside the
    gap: ``recv`` still returns strictly increasing sequence numbers inside it."""
    with joined_foreign(foreign) as sub:
        foreign.answer = [(s, GOOD) for s in (3, 1, 2, 2, 0, 7)]
        foreign.send(5, GOOD)
        assert [s for s, _ in sub.recv(5000)] == [3, 5]


def test_an_unreadable_live_batch_is_counted_and_skipped(foreign: ForeignPublisher) -> None:
    with joined_foreign(foreign) as sub:
        asked = len(foreign.requests)
        rounds: list[tuple[list[bytes], str]] = [
            ([b"", seq_frame(1), BAD], "batch 1"),
            ([b"", seq_frame(3), DEEP], "batch 3"),
            ([b"", seq_frame(5)], "expected 3 frames"),
            ([b"", b"\x05", GOOD], "must be 8 bytes"),
        ]
        for n, (frames, needle) in enumerate(rounds, 1):
            foreign.pub.send_multipart(frames)
            nxt = 2 * n
            foreign.send(nxt, GOOD)
            assert [s for s, _ in sub.recv(5000)] == [nxt]
            assert sub.num_undecodable == n and needle in str(sub.last_decode_error)
            if n == 2:  # a bad batch with a sequence number counts as seen: no replay
                assert len(foreign.requests) == asked
        # Without one, the subscriber sees a gap and asks the replay socket.
        assert foreign.requests[asked:] == [5, 7]


def test_replay_skips_unreadable_answers(foreign: ForeignPublisher) -> None:
    """Was: ``replay`` raised ``DecodeError`` (``RecursionError`` for deep
    nesting) and returned none of the good batches."""
    for seq, payload in enumerate([GOOD, BAD, DEEP, GOOD, b"\xc1"]):
        foreign.keep(seq, payload)
    with ZmqEventSubscriber(foreign.endpoint, replay_endpoint=foreign.replay_endpoint) as sub:
        got = sub.replay(0, timeout_ms=5000)
        assert [s for s, _ in got] == [0, 3]
        assert sub.num_undecodable == 3


def test_recv_delivers_when_the_replay_socket_does_not_answer() -> None:
    ctx = zmq.Context.instance()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    rport = router.bind_to_random_port("tcp://127.0.0.1")  # never answers
    try:
        with ZmqEventSubscriber(
            f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{rport}"
        ) as sub:
            sub.last_seq = 0
            got: list[Any] = []
            while not got:  # seq 9 after 0: a gap the replay cannot fill
                pub.send_multipart((b"", seq_frame(9), GOOD))
                got = sub.recv(100)
            assert [s for s, _ in got] == [9]
    finally:
        pub.close(linger=0)
        router.close(linger=0)


# ---- constructor and call arguments ----------------------------------------


def _pub(**kwargs: Any) -> None:
    ZmqEventPublisher(**{"endpoint": LOCAL, "bind": True, **kwargs}).shutdown()


def _sub(**kwargs: Any) -> None:
    ZmqEventSubscriber(**{"endpoint": "tcp://127.0.0.1:1", **kwargs}).close()


BAD_ARGS: list[tuple[Any, dict[str, Any], type[Exception]]] = [
    # were: AttributeError and OverflowError
    (_pub, {"topic": 5}, ArgumentTypeError),
    (_pub, {"topic": None}, ArgumentTypeError),
    (_pub, {"topic": "\ud800"}, InvalidArgumentError),
    (_pub, {"hwm": 2**40}, InvalidArgumentError),
    (_pub, {"hwm": -1}, InvalidArgumentError),
    (_pub, {"hwm": 1.5}, ArgumentTypeError),
    (_pub, {"replay_endpoint": LOCAL, "buffer_steps": 2**40}, InvalidArgumentError),
    (_pub, {"buffer_steps": 0}, InvalidArgumentError),
    (_pub, {"buffer_steps": True}, ArgumentTypeError),
    (_pub, {"buffer_steps": "10"}, ArgumentTypeError),
    (_pub, {"max_queue_size": 0}, InvalidArgumentError),
    (_pub, {"max_queue_size": 2**40}, InvalidArgumentError),
    (_pub, {"max_queue_size": None}, ArgumentTypeError),
    (_pub, {"data_parallel_rank": -1}, InvalidArgumentError),
    (_pub, {"data_parallel_rank": 2**70}, InvalidArgumentError),
    (_pub, {"data_parallel_rank": 1.5}, ArgumentTypeError),
    (_pub, {"data_parallel_rank": "x"}, ArgumentTypeError),
    (_pub, {"data_parallel_rank": True}, ArgumentTypeError),
    (_pub, {"int_hashes": "yes"}, ArgumentTypeError),
    (_pub, {"int_hashes": None}, ArgumentTypeError),
    (_pub, {"lora_ids": [("a", 1)]}, ArgumentTypeError),
    (_pub, {"lora_ids": {"a": "1"}}, ArgumentTypeError),
    (_pub, {"lora_ids": {"a": 2**70}}, InvalidArgumentError),
    (_pub, {"lora_ids": {5: 1}}, ArgumentTypeError),
    (_pub, {"bind": "yes"}, ArgumentTypeError),
    (_pub, {"context": "ctx"}, ArgumentTypeError),
    (_pub, {"endpoint": 5}, ArgumentTypeError),
    (_pub, {"endpoint": None}, ArgumentTypeError),
    (_pub, {"endpoint": ""}, InvalidArgumentError),
    (_pub, {"replay_endpoint": 5}, ArgumentTypeError),
    (_sub, {"topic": 5}, ArgumentTypeError),
    (_sub, {"topic": None}, ArgumentTypeError),
    (_sub, {"endpoint": b"tcp://127.0.0.1:1"}, ArgumentTypeError),
    (_sub, {"endpoint": ""}, InvalidArgumentError),
    (_sub, {"replay_endpoint": 5}, ArgumentTypeError),
    (_sub, {"context": object()}, ArgumentTypeError),
]


@pytest.mark.parametrize(("make", "kwargs", "error"), BAD_ARGS)
def test_constructors_check_every_argument(
    make: Any, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        make(**kwargs)


def test_limits_are_accepted() -> None:
    _pub(hwm=2**31 - 1, buffer_steps=2**31 - 1, replay_endpoint=LOCAL, max_queue_size=2**31 - 1)
    _pub(data_parallel_rank=2**64 - 1, lora_ids={"a": -(2**63), "b": 2**64 - 1})
    _pub(data_parallel_rank=None, hwm=0, lora_ids={})


def test_calls_check_their_arguments(pub: ZmqEventPublisher) -> None:
    with joined(pub) as sub:
        for bad, error in (
            (-1, InvalidArgumentError),
            (2**40, InvalidArgumentError),
            ("1", ArgumentTypeError),
            (1.5, ArgumentTypeError),
        ):
            with pytest.raises(error):
                sub.recv(bad)
            with pytest.raises(error):
                sub.replay(0, timeout_ms=bad)
        for seq in (-1, 2**63):
            with pytest.raises(InvalidArgumentError):
                sub.replay(seq)
        with pytest.raises(ArgumentTypeError):
            sub.replay("0")  # type: ignore[arg-type]
        for last, error in ((-2, InvalidArgumentError), ("x", ArgumentTypeError)):
            with pytest.raises(error):
                sub.last_seq = last  # type: ignore[assignment]
        for timeout, error in (
            (-1.0, InvalidArgumentError),
            (float("nan"), InvalidArgumentError),
            (1e300, InvalidArgumentError),
            ("1", ArgumentTypeError),
        ):
            with pytest.raises(error):
                pub.flush(timeout)  # type: ignore[arg-type]
            with pytest.raises(error):
                pub.shutdown(timeout)  # type: ignore[arg-type]
        assert pub.flush(5.0)
    pub.shutdown(0)
    with pytest.raises(RuntimeError, match="shut down"):
        pub.publish([])
