"""Argument checks shared by the publisher and the subscriber: each returns
the value as the sockets take it, or raises the project's argument errors
(``ArgumentTypeError`` is a ``TypeError``, ``InvalidArgumentError`` a
``ValueError``)."""

from __future__ import annotations

import threading

import zmq

from kvcoord.errors import ArgumentTypeError, InvalidArgumentError

#: Largest count a ZeroMQ socket option holds (a C ``int``).
MAX_COUNT = 2**31 - 1


def _type_name(value: object) -> str:
    return type(value).__name__


def count(name: str, value: object, low: int, high: int = MAX_COUNT) -> int:
    """An int (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int, got {_type_name(value)}")
    if not low <= value <= high:
        raise InvalidArgumentError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def optional_flag(name: str, value: object) -> bool | None:
    """A bool or None."""
    if value is None or isinstance(value, bool):
        return value
    raise ArgumentTypeError(f"{name} must be a bool or None, got {_type_name(value)}")


def endpoint(name: str, value: object) -> str:
    """A non-empty ZeroMQ address; whether it binds or connects is ZeroMQ's
    to say (``zmq.ZMQError``)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str, got {_type_name(value)}")
    if not value:
        raise InvalidArgumentError(f"{name} must not be empty")
    return value


def optional_endpoint(name: str, value: object) -> str | None:
    """An :func:`endpoint` or None."""
    return None if value is None else endpoint(name, value)


def topic(value: object) -> bytes:
    """A topic as its UTF-8 frame."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"topic must be a str, got {_type_name(value)}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"topic is not valid UTF-8: {e}") from None


def context(value: object) -> zmq.Context[zmq.Socket[bytes]]:
    """The given ``zmq.Context``, or the process-wide one for None."""
    if value is None:
        return zmq.Context.instance()
    if not isinstance(value, zmq.Context):
        raise ArgumentTypeError(f"context must be a zmq.Context or None, got {_type_name(value)}")
    return value


def timeout_ms(name: str, value: object) -> int:
    """Milliseconds to wait, as ``zmq.Socket.poll`` takes them."""
    return count(name, value, 0)


def seconds(name: str, value: object) -> float:
    """A number of seconds in ``[0, threading.TIMEOUT_MAX]`` (what waits on
    locks and threads accept)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(f"{name} must be a number of seconds, got {_type_name(value)}")
    if not 0 <= value <= threading.TIMEOUT_MAX:
        raise InvalidArgumentError(
            f"{name} must be in [0, {threading.TIMEOUT_MAX:g}] seconds, got {value}"
        )
    return float(value)
