"""Reading JSON-lines trace files for :mod:`kvcoord.replay.workloads`: one streamed
pass (plain or gzip, by content), strict UTF-8 and strict JSON (no ``NaN``/
``Infinity``, no ``1e400``, no key given twice), bounded lines, and the field
table every reader checks its lines against.

Every failure is a :class:`TraceFormatError` naming the file, the line and the
column of the first bad byte or value (``path:line:column: problem``). Lines
end at ``\\n`` only (a ``\\r`` before it is JSON whitespace; a lone ``\\r`` inside
a line is no line break), so line numbers are what ``grep -n`` and an editor
show. Columns count characters (Unicode code points) from 1; for a byte that is
not UTF-8 the column is where that byte stands, after the characters before it.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
import math
import re
import zlib
from collections.abc import Callable, Generator, Iterable, Mapping
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

from kvcoord._suggest import did_you_mean, missing_file

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_REQUEST_TOKENS",
    "MIN_OUTPUT_TOKENS",
    "OUTPUT_MINIMUM_WHY",
    "TOKEN_ID_LIMIT",
    "Field",
    "Record",
    "TraceFormatError",
    "UnknownFieldError",
    "check_request_len",
    "count_field",
    "first_unknown",
    "id_list_field",
    "read_fields",
    "read_records",
    "shown",
    "string_field",
    "time_field",
]

#: Token ids a trace may hold are in ``[0, TOKEN_ID_LIMIT)`` (the core's 32-bit range).
TOKEN_ID_LIMIT = 1 << 32
#: Most tokens (prompt + output) one trace request may have.
MAX_REQUEST_TOKENS = 1 << 24
#: Fewest output tokens a request may ask for: the step that computes a prompt
#: samples its first token (vLLM's ``max_tokens`` is at least 1), so a
#: prefill-only request is one output token; 0 is refused, never rounded up.
MIN_OUTPUT_TOKENS = 1
#: Said when an ``output_length`` is below `MIN_OUTPUT_TOKENS`.
OUTPUT_MINIMUM_WHY = (
    " (the step that computes the prompt samples the first token, as vLLM's "
    "max_tokens >= 1 does; a prefill-only request is output_length 1)"
)
#: Longest trace line read (bytes): a file without newlines is refused, not slurped.
MAX_LINE_BYTES = 1 << 28
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = codecs.BOM_UTF8


class TraceFormatError(ValueError):
    """A trace file could not be read: names the file, the line, the column (when
    the problem has a place in the line) and the problem."""

    def __init__(
        self, path: str | Path, line: int | None, problem: str, column: int | None = None
    ) -> None:
        self.path = str(path)
        self.line = line
        self.column = column if line is not None else None
        self.problem = problem
        where = self.path
        if line is not None:
            where += f":{line}" if self.column is None else f":{line}:{self.column}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[object, ...]:  # picklable (a sweep worker hands it back)
        return (type(self), (self.path, self.line, self.problem, self.column))


class UnknownFieldError(TraceFormatError):
    """A field the trace format does not know: a typo (the message suggests the
    field meant) or a trace with extra fields, read with ``lenient_fields=True``."""

    def __init__(
        self,
        path: str | Path,
        line: int | None,
        problem: str,
        column: int | None = None,
        field: str = "",
    ) -> None:
        super().__init__(path, line, problem, column)
        #: The field's name.
        self.field = field

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.line, self.problem, self.column, self.field))


def shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:57]}..."


# --------------------------------------------------------------------------- lines


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
# The decoder's own value scanner (C) and string scanner, which typeshed does not
# list: the reader parses a line's top level itself to know where each value is.
_scan: Callable[[str, int], tuple[object, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")


def _ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    assert m is not None  # the pattern matches the empty string
    return m.end()


class Record(dict[str, object]):
    """One trace line's JSON object, and where in the line its keys and values
    stand (so an error can name the column of the value it is about)."""

    __slots__ = ("_at", "line", "path", "start", "text")

    def __init__(self, path: Path, line: int, text: str, start: int) -> None:
        super().__init__()
        self.path = path
        self.line = line
        self.text = text
        #: Index of the object's ``{`` in ``text``.
        self.start = start
        #: key -> (index of the key, index of its value) in ``text``.
        self._at: dict[str, tuple[int, int]] = {}

    def column(
        self, key: str | None = None, *, index: int | None = None, at_key: bool = False
    ) -> int:
        """Column of ``key``'s value (of the key itself with ``at_key``; of element
        ``index`` of a list value); of the object's ``{`` for a key it lacks."""
        if key is None or key not in self._at:
            return self.start + 1
        k, v = self._at[key]
        if at_key:
            return k + 1
        if index is not None:
            return _element_start(self.text, v, index) + 1
        return v + 1

    def error(
        self, problem: str, key: str | None = None, *, index: int | None = None
    ) -> TraceFormatError:
        return TraceFormatError(self.path, self.line, problem, self.column(key, index=index))


def _json_error(path: Path, lineno: int, msg: str, pos: int) -> TraceFormatError:
    return TraceFormatError(path, lineno, f"invalid JSON: {msg}", pos + 1)


def _element_start(text: str, i: int, index: int) -> int:
    """Index in ``text`` of element ``index`` of the (valid) JSON array at ``i``."""
    i = _ws(text, i + 1)
    for _ in range(index):
        _, end = _scan(text, i)
        i = _ws(text, _ws(text, end) + 1)  # past the comma
    return i


def _bad_number_at(text: str, i: int) -> int:
    """Index of the first unrepresentable number inside the JSON value at ``i``
    (which raised `_BadNumber`): into arrays and objects, element by element."""
    try:
        c = text[i : i + 1]
        if c not in ("[", "{"):
            return i
        j = _ws(text, i + 1)
        while text[j : j + 1] not in ("]", "}", ""):
            if c == "{":
                _, j = scanstring(text, j + 1, True)
                j = _ws(text, _ws(text, j) + 1)  # past the colon
            try:
                _, end = _scan(text, j)
            except _BadNumber:
                return _bad_number_at(text, j)
            j = _ws(text, end)
            if text[j : j + 1] == ",":
                j = _ws(text, j + 1)
    except (RecursionError, ValueError, StopIteration):  # pragma: no cover - defensive
        pass
    return i


def _scan_value(path: Path, lineno: int, text: str, i: int) -> tuple[object, int]:
    """The JSON value at ``text[i]`` and where it ends; a `TraceFormatError` at the
    exact column of whatever makes it unreadable."""
    try:
        return _scan(text, i)
    except StopIteration as e:
        raise _json_error(path, lineno, "Expecting value", e.value) from None
    except json.JSONDecodeError as e:
        raise _json_error(path, lineno, e.msg, e.pos) from None
    except _BadNumber as e:
        raise TraceFormatError(path, lineno, str(e), _bad_number_at(text, i) + 1) from None
    except RecursionError:
        raise TraceFormatError(path, lineno, "invalid JSON: nested too deeply", i + 1) from None
    except ValueError:  # an integer with thousands of digits
        raise TraceFormatError(
            path, lineno, "invalid JSON: a number is out of range", i + 1
        ) from None


def _parse_line(path: Path, lineno: int, text: str) -> Record | None:
    """The JSON object of one line (None for a blank line); anything else on the
    line, ``null`` included, is an error at its column."""
    i = _ws(text, 0)
    if i == len(text):
        return None
    if text[i] != "{":
        value, end = _scan_value(path, lineno, text, i)
        if _ws(text, end) != len(text):
            raise _json_error(path, lineno, "Extra data", _ws(text, end))
        kind = "null" if value is None else type(value).__name__
        raise TraceFormatError(path, lineno, f"expected a JSON object, got {kind}", i + 1)
    rec = Record(path, lineno, text, i)
    at = rec._at
    j = _ws(text, i + 1)
    if text.startswith("}", j):
        j = _ws(text, j + 1)
    else:
        while True:
            m = _SIMPLE_KEY.match(text, j)  # the common case, one match: "name":
            if m is not None:
                key, v = m.group(1), m.end()
            else:
                key, v = _key(path, lineno, text, j)
            value, end = _scan_value(path, lineno, text, v)
            if key in rec:
                raise TraceFormatError(
                    path, lineno, f"field {shown(key)} appears twice in the object", j + 1
                )
            rec[key] = value
            at[key] = (j, v)
            m = _SEPARATOR.match(text, end)
            if m is None:
                raise _json_error(path, lineno, "Expecting ',' delimiter", _ws(text, end))
            j = m.end()
            if m.group(1) == "}":
                break
    if j != len(text):
        raise _json_error(path, lineno, "Extra data", j)
    return rec


#: A key without escapes and the colon after it, and what follows a value in an
#: object (the whitespace around both included).
_SIMPLE_KEY = re.compile(r'"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*')
_SEPARATOR = re.compile(r"[ \t\n\r]*([,}])[ \t\n\r]*")


def _key(path: Path, lineno: int, text: str, j: int) -> tuple[str, int]:
    """Any key at ``text[j]`` (escapes decoded) and where its value starts; an
    error at the exact column where the key or its colon is not."""
    if not text.startswith('"', j):
        raise _json_error(path, lineno, "Expecting property name enclosed in double quotes", j)
    try:
        key, k_end = scanstring(text, j + 1, True)
    except json.JSONDecodeError as e:
        raise _json_error(path, lineno, e.msg, e.pos) from None
    colon = _ws(text, k_end)
    if not text.startswith(":", colon):
        raise _json_error(path, lineno, "Expecting ':' delimiter", colon)
    return key, _ws(text, colon + 1)


def _decode(path: Path, lineno: int, raw: bytes, offset: int, gz: bool) -> str:
    """One line's bytes as text; a byte that is not UTF-8 is an error at its column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        column = len(raw[: e.start].decode("utf-8")) + 1
        where = f"byte {offset + e.start:,} of the {'decompressed ' if gz else ''}file"
        raise TraceFormatError(
            path,
            lineno,
            f"not UTF-8 text: byte 0x{raw[e.start]:02x} ({e.reason}) at {where}",
            column,
        ) from None


def _too_long(path: Path, lineno: int, raw: bytes, offset: int, gz: bool) -> TraceFormatError:
    """The error for a line beyond `MAX_LINE_BYTES` (or the first bad byte before)."""
    head = raw[:MAX_LINE_BYTES]
    try:
        chars = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return _decode_error(path, lineno, head, offset, gz)
    return TraceFormatError(
        path, lineno, f"line longer than {MAX_LINE_BYTES:,} bytes", len(chars) + 1
    )


def _decode_error(path: Path, lineno: int, raw: bytes, offset: int, gz: bool) -> TraceFormatError:
    try:
        _decode(path, lineno, raw, offset, gz)
    except TraceFormatError as e:
        return e
    raise AssertionError("no decode error")  # pragma: no cover


def _open(stack: ExitStack, path: Path) -> tuple[io.BufferedIOBase, bool]:
    """``path``'s bytes, gunzipped when it starts with the gzip magic bytes."""
    raw = stack.enter_context(open(path, "rb"))  # noqa: SIM115
    if raw.peek(2)[:2] == _GZIP_MAGIC:
        return stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb")), True
    return raw, False


def read_records(path: Path) -> Generator[Record, None, None]:
    """The `Record` of every non-blank line, read as a stream (one pass, so a pipe
    works); every way the file can fail to read is a `TraceFormatError`."""
    lineno = offset = 0
    gz = False
    try:
        with ExitStack() as stack:
            f, gz = _open(stack, path)
            while True:
                raw = f.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                lineno += 1
                if len(raw) > MAX_LINE_BYTES:
                    raise _too_long(path, lineno, raw, offset, gz)
                start = offset
                offset += len(raw)
                if lineno == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM) :]
                    start += len(_BOM)
                rec = _parse_line(path, lineno, _decode(path, lineno, raw, start, gz))
                if rec is not None:
                    yield rec
    except FileNotFoundError:
        raise TraceFormatError(path, None, missing_file(path)) from None
    except IsADirectoryError:
        raise TraceFormatError(path, None, "is a directory, not a trace file") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceFormatError(path, lineno + 1, f"corrupt gzip data ({e})") from None
    except OSError as e:
        raise TraceFormatError(path, None, f"cannot read: {e.strerror or e}") from None
    except MemoryError:
        raise TraceFormatError(path, lineno + 1, "out of memory reading the trace") from None


# --------------------------------------------------------------------------- fields


@dataclass(frozen=True)
class Field:
    """One field of a trace format: how its value is checked (and converted), and
    whether a line must have it. A ``null`` optional field counts as absent."""

    check: Callable[[Record, str], object]
    required: bool = False


def read_fields(
    rec: Record, fields: Mapping[str, Field], *, lenient: bool = False
) -> dict[str, object]:
    """``rec``'s fields checked against the format's table, in line order (the
    first bad value is the one reported): key -> checked value, absent keys left
    out. A key the table lacks is an `UnknownFieldError` naming it, with the
    field it most likely misspells, unless ``lenient`` (then it is ignored)."""
    out: dict[str, object] = {}
    for key, value in rec.items():
        spec = fields.get(key)
        if spec is None:
            if lenient:
                continue
            raise UnknownFieldError(
                rec.path,
                rec.line,
                f"unknown field {shown(key)}{did_you_mean(key, fields)}; "
                f"the format's fields are {', '.join(fields)}",
                rec.column(key, at_key=True),
                key,
            )
        if value is None and not spec.required:
            continue
        out[key] = spec.check(rec, key)
    for key, spec in fields.items():
        if spec.required and key not in out:
            raise rec.error(f"missing field {key!r}")
    return out


def count_field(minimum: int, why: str = "") -> Callable[[Record, str], int]:
    """A field check: an integer in ``[minimum, MAX_REQUEST_TOKENS]`` (``why``: the
    reason for the minimum, said when a value is below it)."""

    def check(rec: Record, key: str) -> int:
        v = rec[key]
        if type(v) is not int:
            raise rec.error(f"{key!r} must be an integer, got {shown(v)}", key)
        if v < minimum:
            raise rec.error(f"{key!r} must be >= {minimum}, got {v}{why}", key)
        if v > MAX_REQUEST_TOKENS:
            raise rec.error(f"{key!r} must be <= {MAX_REQUEST_TOKENS:,}, got {shown(v)}", key)
        return v

    return check


def time_field(rec: Record, key: str) -> float:
    """A field check: a finite non-negative number."""
    v = rec[key]
    t = math.nan
    if type(v) in (int, float):
        with suppress(OverflowError):  # an integer beyond every float stays NaN
            t = float(v)  # type: ignore[arg-type]
    if not (math.isfinite(t) and t >= 0):
        raise rec.error(f"{key!r} must be a finite non-negative number, got {shown(v)}", key)
    return t


def id_list_field(limit: int, what: str) -> Callable[[Record, str], list[int]]:
    """A field check: a non-empty list of integers in ``[0, limit)``; the error
    names the first bad element and its column."""

    def check(rec: Record, key: str) -> list[int]:
        v = rec[key]
        problem = f"{key!r} must be a non-empty list of {what}"
        if type(v) is not list or not v:
            raise rec.error(f"{problem}, got {shown(v)}", key)
        for i, t in enumerate(v):
            if type(t) is not int or not 0 <= t < limit:
                raise rec.error(f"{problem}; element {i} is {shown(t)}", key, index=i)
        return v

    return check


def string_field(nonempty: bool = False) -> Callable[[Record, str], str]:
    """A field check: a string (non-empty when asked) of valid Unicode text."""

    def check(rec: Record, key: str) -> str:
        v = rec[key]
        what = "a non-empty string" if nonempty else "a string"
        if type(v) is not str or (nonempty and not v):
            raise rec.error(f"{key!r} must be {what}, got {shown(v)}", key)
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:  # a "\\ud800" escape: a lone surrogate
            raise rec.error(
                f"{key!r} must be valid Unicode text, got a lone surrogate "
                f"{v[e.start]!r} at character {e.start}",
                key,
            ) from None
        return v

    return check


def check_request_len(rec: Record, n_prompt: int, n_out: int, key: str) -> None:
    """At most `MAX_REQUEST_TOKENS` tokens in all (the error at ``key``'s value)."""
    if n_prompt + n_out > MAX_REQUEST_TOKENS:
        raise rec.error(
            f"{n_prompt:,} prompt + {n_out:,} output tokens is more than the "
            f"{MAX_REQUEST_TOKENS:,} a request may have",
            key,
        )


def first_unknown(rec: Record, known: Iterable[str]) -> str | None:
    """The first key of ``rec`` (in line order) not in ``known``."""
    names = set(known)
    return next((k for k in rec if k not in names), None)
