"""KV-cache events on the wire, in vLLM 0.33.0's format (docs/events.md).

In-process, a manager built with ``KVCacheManagerOptions(enable_events=True)``
records :class:`kvcoord.BlockStored` / :class:`kvcoord.BlockRemoved` /
:class:`kvcoord.AllBlocksCleared` and hands them out per step with
``take_events()``. This package puts them on the wire exactly as vLLM does::

    from kvcoord.events import ZmqEventPublisher

    with ZmqEventPublisher("tcp://*:5557", replay_endpoint="tcp://*:5558") as pub:
        ...                                   # every scheduler step:
        pub.publish(manager.take_events())    # one KVEventBatch, seq 0, 1, 2...

and reads them back (from kvcoord or from vLLM) with
:class:`ZmqEventSubscriber` or :func:`decode_batch`.

Needs the optional extra ``kvcoord[events]`` (``pyzmq`` and ``msgspec``).
"""

from __future__ import annotations

try:
    import msgspec  # noqa: F401
    import zmq  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "kvcoord.events needs pyzmq and msgspec: pip install 'kvcoord[events]'"
    ) from e

from kvcoord.events.publisher import END_SEQ, ZmqEventPublisher
from kvcoord.events.subscriber import ZmqEventSubscriber
from kvcoord.events.wire import (
    MAX_EXTRA_KEYS_DEPTH,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CoreEvent,
    ExternalBlockHash,
    KVCacheEvent,
    KVEventBatch,
    WireEvent,
    decode_batch,
    encode_batch,
    make_batch,
    to_wire,
)

__all__ = [
    "END_SEQ",
    "MAX_EXTRA_KEYS_DEPTH",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CoreEvent",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEventBatch",
    "WireEvent",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
    "decode_batch",
    "encode_batch",
    "make_batch",
    "to_wire",
]
