"""The exceptions kvcoord raises, in one place.

Every error is a :class:`KvCoordError` and also a builtin class a caller would
expect (``ValueError`` for bad values, ``KeyError`` for unknown request ids),
so ``except ValueError`` keeps working. Any call that raises leaves the pool
and manager state exactly as it was before the call.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "BlockStateError",
    "BlockTableError",
    "BlockTableIndexError",
    "ConfigError",
    "ConfigTypeError",
    "EventTypeError",
    "HashTypeError",
    "InvalidArgumentError",
    "InvalidBlockIdError",
    "InvalidEventError",
    "InvalidHashError",
    "InvalidTokenError",
    "InvariantError",
    "KvCoordError",
    "NotServedError",
    "OutOfBlocksError",
    "OutOfMemoryError",
    "UnknownRequestError",
]


class KvCoordError(Exception):
    """Base class of every kvcoord error."""


class OutOfBlocksError(KvCoordError, ValueError):
    """More blocks were requested than the pool has free."""


class InvalidArgumentError(KvCoordError, ValueError):
    """An argument is out of range or inconsistent with the others (a negative
    count, ``num_full_blocks`` beyond the ids given, a mask of the wrong length)."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type (a string where an int is expected,
    ``None`` for a request, a non-bool flag). Also a ``TypeError``."""


class OutOfMemoryError(KvCoordError, MemoryError):
    """A buffer sized by the caller (pool metadata, a request's tokens or
    hashes) could not be allocated; nothing was changed. Also a
    ``MemoryError``."""


class InvalidBlockIdError(KvCoordError, ValueError):
    """A block id is negative or not below the pool size."""


class BlockStateError(KvCoordError, ValueError):
    """An operation does not fit the block's state: double free, freeing a
    block that holds no reference, or caching a block that is already cached."""


class InvalidHashError(KvCoordError, ValueError):
    """A block hash has the wrong type or length (16 or 32 bytes expected)."""


class HashTypeError(InvalidHashError, TypeError):
    """A block hash (or the sequence of them) has the wrong type: a ``str``,
    an int, ``None`` where ``bytes`` go. Also a ``TypeError``."""


class InvalidTokenError(KvCoordError, ValueError):
    """A token id is negative or does not fit in 32 bits."""


class ConfigError(KvCoordError, ValueError):
    """A configuration value breaks one of its rules."""


class ConfigTypeError(ConfigError, TypeError):
    """A configuration value has the wrong type (also a ``TypeError``)."""


class UnknownRequestError(KvCoordError, KeyError):
    """No request with this id is known to the manager."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class BlockTableError(KvCoordError, ValueError):
    """A block-table call got a bad value: more block ids than a row holds,
    ids of the wrong dtype or shape, or inconsistent slot-mapping inputs.
    The table is left exactly as it was."""


class BlockTableIndexError(BlockTableError, IndexError):
    """A block-table row, request count or token position is out of range
    (also an ``IndexError``). The table is left exactly as it was."""


class InvalidEventError(KvCoordError, ValueError):
    """A KV event batch that ``kvcoord.events.decode_batch`` would refuse: a
    value out of range or of the wrong type for the wire (the message says
    where, ``$[1][0].block_size``), or nested too deep. Raised by
    ``make_batch``, ``encode_batch`` and ``ZmqEventPublisher.publish``
    before anything is sent or kept for replay."""


class EventTypeError(InvalidEventError, TypeError):
    """An event batch holds an object of the wrong type: not a batch, not a
    wire or kvcoord event, a string where a number goes, an object msgpack
    cannot encode. Also a ``TypeError``."""


class InvariantError(KvCoordError, AssertionError):
    """``check_invariants()`` found internal state that breaks an invariant (a bug)."""


class NotServedError(KvCoordError, RuntimeError):
    """``kvcoord.vllm`` in strict mode (``enable(strict=True)``,
    ``KVCOORD_VLLM_STRICT=1``) was asked for a KV-cache manager it does not
    serve; the message names the reason. Outside strict mode the same
    configuration gets vLLM's own manager."""
