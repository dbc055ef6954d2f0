"""`ZmqEventSubscriber`: receive KV event batches from a kvcoord or vLLM
publisher, and fill gaps in the sequence from its replay socket."""

from __future__ import annotations

from types import TracebackType

import msgspec
import zmq

from kvcoord.events.publisher import END_SEQ
from kvcoord.events.wire import KVEventBatch, decode_batch

__all__ = ["ZmqEventSubscriber"]


def _message(frames: list[bytes], names: tuple[str, ...], where: str) -> list[bytes]:
    """``frames`` if there are as many as ``names`` and the ``seq`` one is 8 bytes."""
    if len(frames) != len(names):
        raise msgspec.DecodeError(
            f"{where}: expected {len(names)} frames ({', '.join(names)}), got {len(frames)}"
        )
    seq = frames[names.index("seq")]
    if len(seq) != 8:
        raise msgspec.DecodeError(
            f"{where}: the sequence number must be 8 bytes (big-endian), got {len(seq)}"
        )
    return frames


def _decode(seq: int, payload: bytes, where: str) -> KVEventBatch:
    try:
        return decode_batch(payload)
    except msgspec.DecodeError as e:
        raise msgspec.DecodeError(f"{where}: batch {seq}: {e}") from None


class ZmqEventSubscriber:
    """A SUB socket on a publisher's endpoint (plus, optionally, a DEALER on
    its replay endpoint).

    :meth:`recv` returns the batches in sequence order: when a batch arrives
    after a gap (the subscriber joined late, or the PUB socket dropped
    messages at its high-water mark), the missed ones are fetched from the
    replay socket first, as far as the publisher still keeps them.

    Args:
        endpoint: the publisher's PUB address (connected to).
        replay_endpoint: its ROUTER address, or None (gaps stay gaps).
        topic: topic prefix to subscribe to ("" = everything).
        context: a ``zmq.Context`` (the process-wide instance by default).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self._ctx = context if context is not None else zmq.Context.instance()
        self._sub: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._sub.connect(endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.connect(replay_endpoint)
        self.last_seq: int = -1
        """Sequence number of the last batch returned (-1: none yet)."""

    def recv(self, timeout_ms: int | None = None) -> list[tuple[int, KVEventBatch]]:
        """The next batch, preceded by the missed ones the replay socket
        still has: ``[(seq, batch), ...]``, empty on timeout. Batches at or
        before :attr:`last_seq` (already returned) are skipped."""
        if not self._sub.poll(timeout_ms):
            return []
        frames = self._sub.recv_multipart()
        _topic, seq_bytes, payload = _message(frames, ("topic", "seq", "payload"), "event message")
        seq = int.from_bytes(seq_bytes, "big")
        out: list[tuple[int, KVEventBatch]] = []
        if self._replay is not None and seq > self.last_seq + 1:
            out = [(s, b) for s, b in self.replay(self.last_seq + 1) if s < seq]
        if seq > self.last_seq:
            out.append((seq, _decode(seq, payload, "event message")))
        if out:
            self.last_seq = out[-1][0]
        return out

    def replay(self, start_seq: int, timeout_ms: int = 2000) -> list[tuple[int, KVEventBatch]]:
        """Every batch the publisher still keeps from ``start_seq`` on.

        Raises:
            RuntimeError: no replay endpoint, or no answer within ``timeout_ms``.
            ValueError: ``start_seq`` is not a sequence number (``0 <= start_seq < 2**63``).
            msgspec.DecodeError: a malformed answer (the rest of it is skipped).
        """
        if self._replay is None:
            raise RuntimeError("this subscriber has no replay endpoint")
        if isinstance(start_seq, bool) or not isinstance(start_seq, int):
            raise TypeError(f"start_seq must be an int, got {type(start_seq).__name__}")
        if not 0 <= start_seq < 1 << 63:
            raise ValueError(f"start_seq must be in [0, 2**63), got {start_seq}")
        while self._replay.poll(0):  # what is left of an earlier answer
            self._replay.recv_multipart()
        self._replay.send_multipart((b"", start_seq.to_bytes(8, "big")))
        out: list[tuple[int, KVEventBatch]] = []
        error: msgspec.DecodeError | None = None
        while True:
            if not self._replay.poll(timeout_ms):
                raise RuntimeError(f"no replay answer within {timeout_ms} ms")
            frames = self._replay.recv_multipart()
            if len(frames) == 4 and frames[2] == END_SEQ:
                if error is not None:
                    raise error
                return out
            if error is not None:
                continue  # skip to the end of this answer
            try:
                _, _topic, seq_bytes, payload = _message(
                    frames, ("empty", "topic", "seq", "payload"), "replay answer"
                )
                seq = int.from_bytes(seq_bytes, "big")
                out.append((seq, _decode(seq, payload, "replay answer")))
            except msgspec.DecodeError as e:
                error = e

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
