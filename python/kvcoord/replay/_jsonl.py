"""Reading JSON-lines trace files for :mod:`kvcoord.replay.workloads`: one streamed
pass (plain or gzip, by content), strict JSON (no ``NaN``/``Infinity``, no
``1e400``), bounded lines, and the field checks every reader shares. Every
failure is a :class:`TraceFormatError` naming the file and line."""

from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from collections.abc import Generator
from contextlib import ExitStack, suppress
from pathlib import Path

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_REQUEST_TOKENS",
    "TOKEN_ID_LIMIT",
    "TraceFormatError",
    "check_request_len",
    "int_field",
    "read_records",
    "shown",
    "time_field",
    "token_list",
]

#: Token ids a trace may hold are in ``[0, TOKEN_ID_LIMIT)`` (the core's 32-bit range).
TOKEN_ID_LIMIT = 1 << 32
#: Most tokens (prompt + output) one trace request may have.
MAX_REQUEST_TOKENS = 1 << 24
#: Longest trace line read (characters): a file without newlines is refused, not slurped.
MAX_LINE_CHARS = 1 << 28
_GZIP_MAGIC = b"\x1f\x8b"


class TraceFormatError(ValueError):
    """A trace file could not be read: names the file, the line and the problem."""

    def __init__(self, path: str | Path, line: int | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class _BadNumber(ValueError):
    """A JSON number no field can hold (raised while decoding a line)."""


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _BadNumber(f"number {text} is out of range")
    return v


def _no_constant(text: str) -> object:
    raise _BadNumber(f"{text} is not a JSON number")


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


def _parse_line(path: Path, lineno: int, line: str) -> object | None:
    """One JSON-lines record, or None for a blank line."""
    if not line.strip():
        return None
    try:
        obj: object = _DECODER.decode(line)
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    except _BadNumber as e:
        raise TraceFormatError(path, lineno, str(e)) from None
    except RecursionError:
        raise TraceFormatError(path, lineno, "invalid JSON: nested too deeply") from None
    except ValueError:  # an integer with thousands of digits
        raise TraceFormatError(path, lineno, "invalid JSON: a number is out of range") from None
    return obj


def _open_text(stack: ExitStack, path: Path) -> io.TextIOWrapper:
    """``path`` as UTF-8 text, gunzipped when it starts with the gzip magic bytes."""
    raw = stack.enter_context(open(path, "rb"))  # noqa: SIM115
    stream: io.BufferedReader | gzip.GzipFile = raw
    if raw.peek(2)[:2] == _GZIP_MAGIC:
        stream = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
    return stack.enter_context(io.TextIOWrapper(stream, encoding="utf-8-sig"))


def read_records(path: Path) -> Generator[tuple[int, dict[str, object]], None, None]:
    """``(line number, object)`` of every non-blank line, read as a stream (one pass,
    so a pipe works); every way the file can fail to read is a `TraceFormatError`."""
    lineno = 0
    try:
        with ExitStack() as stack:
            f = _open_text(stack, path)
            while True:
                line = f.readline(MAX_LINE_CHARS + 1)
                if not line:
                    return
                lineno += 1
                if len(line) > MAX_LINE_CHARS:
                    raise TraceFormatError(
                        path, lineno, f"line longer than {MAX_LINE_CHARS:,} characters"
                    )
                obj = _parse_line(path, lineno, line)
                if obj is None:
                    continue
                if not isinstance(obj, dict):
                    raise TraceFormatError(
                        path, lineno, f"expected a JSON object, got {type(obj).__name__}"
                    )
                yield lineno, obj
    except FileNotFoundError:
        raise TraceFormatError(path, None, "no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(path, None, "is a directory, not a trace file") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, lineno + 1, f"not UTF-8 text ({e.reason})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceFormatError(path, lineno + 1, f"corrupt gzip data ({e})") from None
    except OSError as e:
        raise TraceFormatError(path, None, f"cannot read: {e.strerror or e}") from None
    except MemoryError:
        raise TraceFormatError(path, lineno + 1, "out of memory reading the trace") from None


def shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:57]}..."


def int_field(
    path: Path,
    lineno: int,
    obj: dict[str, object],
    key: str,
    *,
    minimum: int,
    required: bool = True,
) -> int | None:
    """An integer field in ``[minimum, MAX_REQUEST_TOKENS]``."""
    if key not in obj:
        if required:
            raise TraceFormatError(path, lineno, f"missing field {key!r}")
        return None
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceFormatError(path, lineno, f"{key!r} must be an integer, got {shown(v)}")
    if v < minimum:
        raise TraceFormatError(path, lineno, f"{key!r} must be >= {minimum}, got {v}")
    if v > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            path, lineno, f"{key!r} must be <= {MAX_REQUEST_TOKENS:,}, got {shown(v)}"
        )
    return v


def time_field(path: Path, lineno: int, obj: dict[str, object], key: str) -> float | None:
    if key not in obj:
        return None
    v = obj[key]
    t = math.nan
    if not isinstance(v, bool) and isinstance(v, (int, float)):
        with suppress(OverflowError):  # an integer beyond every float stays NaN
            t = float(v)
    if not (math.isfinite(t) and t >= 0):
        raise TraceFormatError(
            path, lineno, f"{key!r} must be a finite non-negative number, got {shown(v)}"
        )
    return t


def token_list(v: object) -> bool:
    """Whether ``v`` is a non-empty list of token ids the core accepts."""
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < TOKEN_ID_LIMIT for t in v
        )
    )


def check_request_len(path: Path, lineno: int, n_prompt: int, n_out: int) -> None:
    if n_prompt + n_out > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            path,
            lineno,
            f"{n_prompt:,} prompt + {n_out:,} output tokens is more than the "
            f"{MAX_REQUEST_TOKENS:,} a request may have",
        )
