"""`ZmqEventPublisher`: KV event batches on a ZeroMQ PUB socket, as vLLM
0.33.0 sends them, with a ROUTER socket replaying missed batches.

Every batch is one three-frame message ``(topic, seq, payload)``: the topic
as UTF-8, the sequence number as 8 big-endian bytes (0, 1, 2... per
publisher) and the msgpack payload of :mod:`kvcoord.events.wire`. The last
``buffer_steps`` payloads are kept; a replay client sends
``(b"", start_seq)`` (from a DEALER; a REQ socket adds the empty frame
itself) and receives ``(b"", topic, seq, payload)`` for every kept batch
with ``seq >= start_seq``, then the end marker ``(b"", b"", -1, b"")``.

``publish`` converts and encodes the batch in the caller's thread and checks
it against the wire contract (:func:`kvcoord.events.encode_batch`), so a bad
batch raises there and never reaches the socket or the replay buffer; a
worker thread sends the checked payloads and answers replay requests.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from types import TracebackType

import msgspec
import zmq

from kvcoord.errors import ArgumentTypeError, EventTypeError, InvalidArgumentError
from kvcoord.events import _args
from kvcoord.events.wire import (
    BlockStored,
    CoreEvent,
    KVEventBatch,
    WireEvent,
    build_batch,
    check_options,
    encode_batch,
)

__all__ = ["END_SEQ", "ZmqEventPublisher"]

log = logging.getLogger("kvcoord.events")

#: Sequence frame of the replay end marker: -1 as 8 signed big-endian bytes.
END_SEQ = (-1).to_bytes(8, "big", signed=True)

#: A checked payload and its number of events, as the worker sends it.
_Item = tuple[bytes, int]


def _binds(endpoint: str) -> bool:
    """vLLM's rule: wildcard, IPv6-any, ipc and inproc endpoints are bound,
    the rest connected to."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """Publish KV event batches (see the module docstring for the protocol).

    Args:
        endpoint: PUB address; bound when it is a wildcard (``tcp://*:5557``),
            ipc or inproc address or when ``bind`` is True, else connected to.
            A bound ``tcp://host:0`` takes a free port (see :attr:`endpoint`).
        replay_endpoint: ROUTER address for replay requests (always bound);
            None for no replay.
        topic: first frame of every message (subscribers filter on it).
        buffer_steps: batches kept for replay, in ``[1, 2**31 - 1]``.
        hwm: send high-water mark of the PUB socket, in ``[0, 2**31 - 1]``
            (0: no limit).
        max_queue_size: batches waiting for the worker, in ``[1, 2**31 - 1]``;
            ``publish`` blocks when that many are queued.
        data_parallel_rank: stamped on batches that carry none (an int the
            wire takes: ``>= 0``, below ``2**64``; None stamps nothing).
        int_hashes: hashes as vLLM's integers (its default) or digests.
        lora_ids: LoRA name (str) -> adapter id (an int the wire takes) for
            the wire's ``lora_id`` field.
        bind: force binding (True) or connecting (False) the PUB socket.
        context: a ``zmq.Context`` (the process-wide instance by default).

    Raises:
        ArgumentTypeError: an argument of the wrong type (a ``TypeError``).
        InvalidArgumentError: an argument out of range, an empty endpoint, a
            topic that is not UTF-8 (a ``ValueError``).
        zmq.ZMQError: an address cannot be bound or connected.
    """

    SHUTDOWN_TIMEOUT = 1.0

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        data_parallel_rank: int | None = 0,
        int_hashes: bool = True,
        lora_ids: Mapping[str, int] | None = None,
        bind: bool | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        endpoint = _args.endpoint("endpoint", endpoint)
        replay_endpoint = _args.optional_endpoint("replay_endpoint", replay_endpoint)
        self._topic = _args.topic(topic)
        buffer_steps = _args.count("buffer_steps", buffer_steps, 1)
        hwm = _args.count("hwm", hwm, 0)
        max_queue_size = _args.count("max_queue_size", max_queue_size, 1)
        self._rank = _wire_rank(data_parallel_rank)
        check_options(int_hashes, lora_ids)
        self._int_hashes = int_hashes
        self._lora_ids = _wire_lora_ids(lora_ids)
        bind = _args.optional_flag("bind", bind)
        self._ctx = _args.context(context)
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._sent_events = 0
        self._pub: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.set_hwm(hwm)
            if _binds(endpoint) if bind is None else bind:
                self._pub.bind(endpoint)
                endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # Room for a whole replay plus its end marker.
                replay_hwm = min(2 * (buffer_steps + 1), _args.MAX_COUNT)
                self._replay.setsockopt(zmq.SNDHWM, replay_hwm)
                self._replay.bind(replay_endpoint)
                replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            self._close_sockets()
            raise
        self.endpoint: str = endpoint
        """The PUB address (with the port a ``:0`` bind picked)."""
        self.replay_endpoint: str | None = replay_endpoint
        """The ROUTER address (with the port a ``:0`` bind picked), or None."""
        self._running = True
        self._thread = threading.Thread(
            target=self._run, daemon=True, name="kvcoord-event-publisher"
        )
        self._thread.start()

    # ---- the caller's side ---------------------------------------------------

    def publish(
        self, events: Iterable[CoreEvent | WireEvent] | KVEventBatch, *, ts: float | None = None
    ) -> None:
        """Queue one batch: a :class:`KVEventBatch`, or events from
        ``take_events`` (stamped ``ts``, default now). The batch is
        converted, stamped with the publisher's rank if it carries none (a
        copy: the caller's batch is left as it is), encoded and checked here,
        in the caller's thread; only a payload that ``decode_batch`` reads
        is queued. Blocks while the queue is full.

        Raises:
            InvalidEventError: the batch breaks the wire contract (see
                :func:`kvcoord.events.encode_batch`); nothing was queued.
            EventTypeError: an event of the wrong type (a ``TypeError``).
            InvalidArgumentError: ``ts`` given with a :class:`KVEventBatch`
                (which carries its own).
            RuntimeError: the publisher was shut down.
        """
        if not self._running:
            raise RuntimeError("the publisher is shut down")
        if isinstance(events, KVEventBatch):
            if ts is not None:
                raise InvalidArgumentError("ts is for events; a KVEventBatch carries its own")
            batch = events
            if batch.data_parallel_rank is None:
                batch = msgspec.structs.replace(batch, data_parallel_rank=self._rank)
        else:
            batch = build_batch(
                events,
                ts=ts,
                data_parallel_rank=self._rank,
                int_hashes=self._int_hashes,
                lora_ids=self._lora_ids,
            )
        payload = encode_batch(batch)
        self._queue.put((payload, len(batch.events)))

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued batch is sent; False on timeout."""
        timeout = _args.seconds("timeout", timeout)
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.001)
        return True

    @property
    def next_seq(self) -> int:
        """Sequence number of the next batch sent."""
        return self._next_seq

    @property
    def num_events_sent(self) -> int:
        """Events sent so far (all batches)."""
        return self._sent_events

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop taking batches and wait up to ``timeout`` seconds (default 1)
        for the worker to send what is queued; it closes the sockets when it
        is done (also when that takes longer). Idempotent."""
        limit = self.SHUTDOWN_TIMEOUT if timeout is None else _args.seconds("timeout", timeout)
        if not self._running:
            return
        self._running = False
        deadline = time.monotonic() + limit
        # A full queue: the worker stops once it has drained it.
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=limit)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("event publisher: %d batches still queued at shutdown", self._queue.qsize())

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # ---- the worker ------------------------------------------------------------

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        try:
            self._work()
        finally:  # the sockets belong to this thread from the start on
            self._close_sockets()

    def _work(self) -> None:
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._serve_replay()
                except zmq.ZMQError:
                    log.exception("event publisher: replay request failed")
            try:
                item = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            try:
                if item is None:
                    break
                self._send(item)
            except Exception:
                log.exception("event publisher: batch dropped")
            finally:
                self._queue.task_done()
        # Answer replay requests that raced the shutdown; then stop.
        while self._replay is not None and self._replay.poll(0):
            self._serve_replay()

    def _send(self, item: _Item) -> None:
        payload, num_events = item
        seq = self._next_seq
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self._next_seq = seq + 1
        self._sent_events += num_events

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("event publisher: bad replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= first:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


# The constructor's wire values are checked by the wire contract itself:
# a probe batch carrying them must encode.


def _probe(what: str, batch: KVEventBatch) -> None:
    try:
        encode_batch(batch)
    except EventTypeError as e:
        raise ArgumentTypeError(f"{what}: {e}") from None
    except ValueError as e:
        raise InvalidArgumentError(f"{what}: {e}") from None


def _wire_rank(rank: object) -> int | None:
    _probe("data_parallel_rank", KVEventBatch(ts=0.0, events=[], data_parallel_rank=rank))  # type: ignore[arg-type]
    return rank  # type: ignore[return-value]


def _wire_lora_ids(lora_ids: Mapping[str, int] | None) -> dict[str, int] | None:
    if lora_ids is None:
        return None
    out = dict(lora_ids)
    for name, lora_id in out.items():
        stored = BlockStored(
            block_hashes=[],
            parent_block_hash=None,
            token_ids=[],
            block_size=1,
            lora_id=lora_id,
            medium=None,
            lora_name=name,
        )
        _probe(f"lora_ids[{name!r}]", KVEventBatch(ts=0.0, events=[stored]))
    return out or None
