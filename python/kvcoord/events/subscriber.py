"""`ZmqEventSubscriber`: receive KV event batches from a kvcoord or vLLM
publisher, and fill gaps in the sequence from its replay socket.

A message or replay answer that does not decode (a foreign publisher's bad
batch, a frame missing, a sequence number of the wrong size) is reported,
not raised: it is counted in :attr:`ZmqEventSubscriber.num_undecodable`,
kept in :attr:`ZmqEventSubscriber.last_decode_error` and logged as a
warning on the ``kvcoord.events`` logger; delivery goes on with the next
batch, and a bad batch counts as seen (it is not asked for again)."""

from __future__ import annotations

import logging
import math
import time
from types import TracebackType

import msgspec
import zmq

from kvcoord.errors import ArgumentTypeError, InvalidArgumentError
from kvcoord.events import _args
from kvcoord.events.publisher import END_SEQ
from kvcoord.events.wire import KVEventBatch, decode_batch

__all__ = ["ZmqEventSubscriber"]

log = logging.getLogger("kvcoord.events")

_LIVE = ("topic", "seq", "payload")
_ANSWER = ("empty", "topic", "seq", "payload")


def _seq_and_payload(frames: list[bytes], names: tuple[str, ...], where: str) -> tuple[int, bytes]:
    """The sequence number and payload of a message of ``names`` frames."""
    if len(frames) != len(names):
        raise msgspec.DecodeError(
            f"{where}: expected {len(names)} frames ({', '.join(names)}), got {len(frames)}"
        )
    seq = frames[names.index("seq")]
    if len(seq) != 8:
        raise msgspec.DecodeError(
            f"{where}: the sequence number must be 8 bytes (big-endian), got {len(seq)}"
        )
    return int.from_bytes(seq, "big"), frames[-1]


class ZmqEventSubscriber:
    """A SUB socket on a publisher's endpoint (plus, optionally, a DEALER on
    its replay endpoint).

    :meth:`recv` returns the batches in sequence order: when a batch arrives
    after a gap (the subscriber joined late, or the PUB socket dropped
    messages at its high-water mark), the missed ones are fetched from the
    replay socket first, as far as the publisher still keeps them. Batches
    that do not decode are skipped and reported (see the module docstring).

    Args:
        endpoint: the publisher's PUB address (connected to).
        replay_endpoint: its ROUTER address, or None (gaps stay gaps).
        topic: topic prefix to subscribe to ("" = everything).
        context: a ``zmq.Context`` (the process-wide instance by default).

    Raises:
        ArgumentTypeError: an argument of the wrong type (a ``TypeError``).
        InvalidArgumentError: an empty endpoint or a topic that is not UTF-8
            (a ``ValueError``).
        zmq.ZMQError: an address cannot be connected to.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        endpoint = _args.endpoint("endpoint", endpoint)
        replay_endpoint = _args.optional_endpoint("replay_endpoint", replay_endpoint)
        prefix = _args.topic(topic)
        self._ctx = _args.context(context)
        self._sub: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
            self._sub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.DEALER)
                self._replay.connect(replay_endpoint)
        except BaseException:
            self.close()
            raise
        self._last_seq = -1
        self.num_undecodable: int = 0
        """Messages and replay answers skipped because they did not decode."""
        self.last_decode_error: msgspec.DecodeError | None = None
        """Why the last of those did not decode (None: none so far)."""

    @property
    def last_seq(self) -> int:
        """Sequence number of the last batch returned or skipped as
        undecodable (-1: none yet); settable, to resume from a known point."""
        return self._last_seq

    @last_seq.setter
    def last_seq(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"last_seq must be an int, got {type(value).__name__}")
        if not -1 <= value < 1 << 63:
            raise InvalidArgumentError(f"last_seq must be in [-1, 2**63), got {value}")
        self._last_seq = value

    def recv(self, timeout_ms: int | None = None) -> list[tuple[int, KVEventBatch]]:
        """The next batch, preceded by the missed ones the replay socket
        still has: ``[(seq, batch), ...]``; empty when nothing new that
        decodes arrives within ``timeout_ms`` (None: wait for it; each call
        reads at least one message that is already there). Batches
        at or before :attr:`last_seq` are skipped; so are those that do not
        decode (counted in :attr:`num_undecodable`).

        Raises:
            ArgumentTypeError, InvalidArgumentError: ``timeout_ms`` is not
                None or an int in ``[0, 2**31 - 1]``.
        """
        wait = None if timeout_ms is None else _args.timeout_ms("timeout_ms", timeout_ms)
        deadline = None if wait is None else time.monotonic() + wait / 1000
        while True:
            if not self._sub.poll(wait):
                return []
            out = self._take(self._sub.recv_multipart())
            if out:
                return out
            if deadline is not None:  # skipped a message: wait out the rest
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                wait = math.ceil(left * 1000)

    def _take(self, frames: list[bytes]) -> list[tuple[int, KVEventBatch]]:
        """The batches one live message brings (the gap before it first)."""
        try:
            seq, payload = _seq_and_payload(frames, _LIVE, "event message")
        except msgspec.DecodeError as e:
            self._undecodable(e)
            return []
        if seq <= self._last_seq:
            return []
        out: list[tuple[int, KVEventBatch]] = []
        if self._replay is not None and seq > self._last_seq + 1:
            try:
                missed = self.replay(self._last_seq + 1)
            except RuntimeError as e:  # no answer: the gap stays a gap
                log.warning("event subscriber: replay before batch %d failed: %s", seq, e)
                missed = []
            last = self._last_seq
            for s, b in missed:  # in order, inside the gap (whoever answered)
                if last < s < seq:
                    out.append((s, b))
                    last = s
        batch = self._decode(seq, payload, "event message")
        if batch is not None:
            out.append((seq, batch))
        self._last_seq = seq
        return out

    def replay(self, start_seq: int, timeout_ms: int = 2000) -> list[tuple[int, KVEventBatch]]:
        """Every batch the publisher still keeps from ``start_seq`` on that
        decodes; the answers that do not are skipped and counted in
        :attr:`num_undecodable`.

        Raises:
            RuntimeError: no replay endpoint, or no answer within ``timeout_ms``.
            ArgumentTypeError: ``start_seq`` or ``timeout_ms`` is not an int.
            InvalidArgumentError: ``start_seq`` is not a sequence number
                (``0 <= start_seq < 2**63``) or ``timeout_ms`` not in
                ``[0, 2**31 - 1]``.
        """
        if self._replay is None:
            raise RuntimeError("this subscriber has no replay endpoint")
        if isinstance(start_seq, bool) or not isinstance(start_seq, int):
            raise ArgumentTypeError(f"start_seq must be an int, got {type(start_seq).__name__}")
        if not 0 <= start_seq < 1 << 63:
            raise InvalidArgumentError(f"start_seq must be in [0, 2**63), got {start_seq}")
        wait = _args.timeout_ms("timeout_ms", timeout_ms)
        while self._replay.poll(0):  # what is left of an earlier answer
            self._replay.recv_multipart()
        self._replay.send_multipart((b"", start_seq.to_bytes(8, "big")))
        out: list[tuple[int, KVEventBatch]] = []
        while True:
            if not self._replay.poll(wait):
                raise RuntimeError(f"no replay answer within {wait} ms")
            frames = self._replay.recv_multipart()
            if len(frames) == 4 and frames[2] == END_SEQ:
                return out
            try:
                seq, payload = _seq_and_payload(frames, _ANSWER, "replay answer")
            except msgspec.DecodeError as e:
                self._undecodable(e)
                continue
            batch = self._decode(seq, payload, "replay answer")
            if batch is not None:
                out.append((seq, batch))

    def _decode(self, seq: int, payload: bytes, where: str) -> KVEventBatch | None:
        try:
            return decode_batch(payload)
        except msgspec.DecodeError as e:
            self._undecodable(msgspec.DecodeError(f"{where}: batch {seq}: {e}"))
            return None

    def _undecodable(self, error: msgspec.DecodeError) -> None:
        self.num_undecodable += 1
        self.last_decode_error = error
        log.warning("event subscriber: skipped (%d so far): %s", self.num_undecodable, error)

    def close(self) -> None:
        """Close the sockets (pending messages are dropped)."""
        self._sub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def __enter__(self) -> ZmqEventSubscriber:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
