"""Workloads for ``kvcoord replay``: what requests arrive, when, with which tokens.

A workload is a list of :class:`WorkloadRequest`. Prompt tokens are produced
lazily (:meth:`WorkloadRequest.prompt_tokens`) so that a trace of thousands of
long prompts never holds every token in memory at once.

Three sources:

* :func:`synthetic_chat` -- the bundled default, generated from a seed: a few
  shared system prompts, conversations whose follow-up turns repeat the whole
  previous exchange (prompt and reply) before the new user message.
* :func:`read_mooncake` -- the Mooncake FAST'25 trace format (JSON Lines of
  ``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``).
  Every hash id names a 512-token block whose tokens are derived from the id
  alone (:func:`mooncake_block_tokens`), so equal ids give equal token
  prefixes at any block size. The last block may be partial.
* :func:`read_token_trace` -- JSON Lines of explicit ``prompt_token_ids`` with
  optional ``output_length``, ``output_token_ids``, ``arrival_time`` (seconds),
  ``timestamp`` (ms), ``cache_salt`` and ``request_id``.

Trace files may be gzip-compressed (recognised by their first bytes, whatever
the name). Every value is checked when the trace is read, so a replay never
fails half-way on bad input: token ids must be in ``[0, 2**32)`` (what the
core accepts), a request may hold at most :data:`MAX_REQUEST_TOKENS` tokens
(prompt and output), times must be finite and non-negative, and numbers the
JSON cannot represent (``NaN``, ``Infinity``, ``1e400``) are refused.
"""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import json
import math
import zlib
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import ExitStack, closing, suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "MAX_REQUEST_TOKENS",
    "MOONCAKE_BLOCK_TOKENS",
    "TOKEN_ID_LIMIT",
    "VOCAB_SIZE",
    "TraceFormatError",
    "Workload",
    "WorkloadRequest",
    "load_workload",
    "mooncake_block_tokens",
    "mooncake_prompt_tokens",
    "read_mooncake",
    "read_token_trace",
    "synthetic_chat",
]

#: Tokens named by one Mooncake hash id.
MOONCAKE_BLOCK_TOKENS = 512
#: Synthesised token ids are in ``[0, VOCAB_SIZE)``.
VOCAB_SIZE = 32000
#: Token ids a trace may hold are in ``[0, TOKEN_ID_LIMIT)`` (the core's 32-bit range).
TOKEN_ID_LIMIT = 1 << 32
#: Most tokens (prompt + output) one trace request may have.
MAX_REQUEST_TOKENS = 1 << 24
#: Mooncake hash ids are in ``[0, 2**63)``.
_HASH_ID_LIMIT = 1 << 63
#: Longest trace line read (characters): a file without newlines is refused, not slurped.
MAX_LINE_CHARS = 1 << 28
_GZIP_MAGIC = b"\x1f\x8b"

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class TraceFormatError(ValueError):
    """A trace file could not be read: names the file, the line and the problem."""

    def __init__(self, path: str | Path, line: int | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _derived_tokens(stream: int, count: int, start: int = 0) -> np.ndarray:
    """``count`` deterministic token ids of a named stream (positions from ``start``)."""
    pos = np.arange(start, start + count, dtype=np.uint64)
    key = np.uint64(stream & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        mixed = _splitmix64(pos ^ _splitmix64(np.array([key], dtype=np.uint64)))
    return (mixed % np.uint64(VOCAB_SIZE)).astype(np.int64)


_OFFSET_KEYS = _splitmix64(np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.uint64) + np.uint64(0xA5A5))


def mooncake_block_tokens(hash_id: int) -> np.ndarray:
    """The 512 tokens named by one Mooncake hash id (a function of the id alone)."""
    return mooncake_prompt_tokens([hash_id], MOONCAKE_BLOCK_TOKENS)


def mooncake_prompt_tokens(hash_ids: Sequence[int], input_length: int) -> np.ndarray:
    """Prompt tokens of a Mooncake request: the blocks of ``hash_ids``, cut at ``input_length``.

    Token ``j`` of the block named ``h`` is a hash of ``(h, j)`` reduced to
    ``[0, VOCAB_SIZE)``, so a shared id gives a shared 512-token run and a
    shared id prefix a shared token prefix, whatever block size the cache uses.
    """
    if input_length <= 0:
        return np.zeros(0, dtype=np.int64)
    n_blocks = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    ids = np.asarray(hash_ids[:n_blocks], dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = _splitmix64(ids * np.uint64(0x100000001B3) + np.uint64(0x6D6F6F6E63616B65))
        grid = (base[:, None] ^ _OFFSET_KEYS[None, :]) * np.uint64(0xD6E8FEB86659FD93)
    flat = ((grid >> np.uint64(33)) % np.uint64(VOCAB_SIZE)).astype(np.int64).reshape(-1)
    out: np.ndarray = flat[:input_length]
    return out


_OUTPUT_POOL_SIZE = 1 << 16
_OUTPUT_POOL: list[int] = []


def _output_pool() -> list[int]:
    if not _OUTPUT_POOL:
        _OUTPUT_POOL.extend(_derived_tokens(0x5EED0F0CAC4E, _OUTPUT_POOL_SIZE).tolist())
    return _OUTPUT_POOL


def _same(tokens: Sequence[int] | np.ndarray) -> Sequence[int] | np.ndarray:
    return tokens


@dataclass(eq=False)
class WorkloadRequest:
    """One request of a workload.

    ``make_prompt`` builds the prompt tokens on demand; ``prompt_len`` is
    known without building them. ``output_token_ids``, when given, are the
    tokens the simulated model samples (a chat workload uses them so that
    a follow-up turn can hit the previous reply in the cache); otherwise
    :func:`output_token` picks them.
    """

    request_id: str
    arrival_s: float
    prompt_len: int
    output_len: int
    make_prompt: Callable[[], Sequence[int] | np.ndarray]
    cache_salt: str | None = None
    output_token_ids: Sequence[int] | None = None
    index: int = 0

    def prompt_tokens(self) -> list[int]:
        toks = self.make_prompt()
        if isinstance(toks, np.ndarray):
            out: list[int] = toks.tolist()
            return out
        return list(toks)

    def output_tokens(self) -> list[int]:
        """All ``output_len`` tokens the request samples."""
        if self.output_token_ids is not None:
            return list(self.output_token_ids[: self.output_len])
        n = self.output_len
        if n > _OUTPUT_POOL_SIZE // 2:
            derived: list[int] = _derived_tokens(self.index ^ 0x5EED0F0CAC4E, n).tolist()
            return derived
        # a window of a fixed pseudo-random pool, placed by the request's index
        start = (self.index * 0x9E3779B1) % (_OUTPUT_POOL_SIZE - n)
        return _output_pool()[start : start + n]


@dataclass
class Workload:
    """A named list of requests sorted by arrival time (ties keep trace order)."""

    name: str
    requests: list[WorkloadRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, r in enumerate(self.requests):
            if not (math.isfinite(r.arrival_s) and r.arrival_s >= 0):
                raise ValueError(
                    f"request {r.request_id!r}: arrival time must be finite and >= 0, "
                    f"got {r.arrival_s!r}"
                )
            r.index = i
        self.requests.sort(key=lambda r: r.arrival_s)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def max_sequence_len(self) -> int:
        return max((r.prompt_len + r.output_len for r in self.requests), default=1)


# --------------------------------------------------------------------------- readers


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


def _records(path: Path) -> Generator[tuple[int, dict[str, object]], None, None]:
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


def _shown(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else f"{r[:57]}..."


def _int_field(
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
        raise TraceFormatError(path, lineno, f"{key!r} must be an integer, got {_shown(v)}")
    if v < minimum:
        raise TraceFormatError(path, lineno, f"{key!r} must be >= {minimum}, got {v}")
    if v > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            path, lineno, f"{key!r} must be <= {MAX_REQUEST_TOKENS:,}, got {_shown(v)}"
        )
    return v


def _time_field(path: Path, lineno: int, obj: dict[str, object], key: str) -> float | None:
    if key not in obj:
        return None
    v = obj[key]
    t = math.nan
    if not isinstance(v, bool) and isinstance(v, (int, float)):
        with suppress(OverflowError):  # an integer beyond every float stays NaN
            t = float(v)
    if not (math.isfinite(t) and t >= 0):
        raise TraceFormatError(
            path, lineno, f"{key!r} must be a finite non-negative number, got {_shown(v)}"
        )
    return t


def _token_list(v: object) -> bool:
    """Whether ``v`` is a non-empty list of token ids the core accepts."""
    return (
        isinstance(v, list)
        and len(v) > 0
        and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < TOKEN_ID_LIMIT for t in v
        )
    )


def _check_request_len(path: Path, lineno: int, n_prompt: int, n_out: int) -> None:
    if n_prompt + n_out > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            path,
            lineno,
            f"{n_prompt:,} prompt + {n_out:,} output tokens is more than the "
            f"{MAX_REQUEST_TOKENS:,} a request may have",
        )


def read_mooncake(path: str | Path, limit: int | None = None) -> Workload:
    """Read a Mooncake trace (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``).

    Every line is one request; ``limit`` stops after that many.
    """
    path = Path(path)
    with closing(_records(path)) as recs:
        return _mooncake(path, recs, limit)


def _mooncake(
    path: Path, records: Iterable[tuple[int, dict[str, object]]], limit: int | None
) -> Workload:
    reqs: list[WorkloadRequest] = []
    for lineno, obj in records:
        if limit is not None and len(reqs) >= limit:
            break
        ts = _time_field(path, lineno, obj, "timestamp")
        if ts is None:
            raise TraceFormatError(path, lineno, "missing field 'timestamp'")
        n_in = _int_field(path, lineno, obj, "input_length", minimum=1)
        n_out = _int_field(path, lineno, obj, "output_length", minimum=0)
        assert n_in is not None and n_out is not None
        ids = obj.get("hash_ids")
        if ids is None:
            raise TraceFormatError(path, lineno, "missing field 'hash_ids'")
        if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and 0 <= h < _HASH_ID_LIMIT for h in ids
        ):
            raise TraceFormatError(
                path, lineno, "'hash_ids' must be a list of integers in [0, 2**63)"
            )
        need = -(-n_in // MOONCAKE_BLOCK_TOKENS)
        if len(ids) != need:
            raise TraceFormatError(
                path,
                lineno,
                f"input_length {n_in} needs {need} hash ids of {MOONCAKE_BLOCK_TOKENS} tokens, "
                f"got {len(ids)}",
            )
        n_out = max(1, n_out)
        _check_request_len(path, lineno, n_in, n_out)
        hash_ids = tuple(ids)
        reqs.append(
            WorkloadRequest(
                request_id=f"mc-{len(reqs)}",
                arrival_s=ts / 1000.0,
                prompt_len=n_in,
                output_len=n_out,
                make_prompt=functools.partial(mooncake_prompt_tokens, hash_ids, n_in),
            )
        )
    return Workload(f"mooncake:{path.name}", reqs)


def read_token_trace(path: str | Path, limit: int | None = None) -> Workload:
    """Read JSON Lines of explicit ``prompt_token_ids`` (see the module docstring for fields)."""
    path = Path(path)
    with closing(_records(path)) as recs:
        return _token_trace(path, recs, limit)


def _token_trace(
    path: Path, records: Iterable[tuple[int, dict[str, object]]], limit: int | None
) -> Workload:
    reqs: list[WorkloadRequest] = []
    seen: set[str] = set()
    for lineno, obj in records:
        if limit is not None and len(reqs) >= limit:
            break
        toks = obj.get("prompt_token_ids")
        if toks is None:
            raise TraceFormatError(path, lineno, "missing field 'prompt_token_ids'")
        if not _token_list(toks):
            raise TraceFormatError(
                path,
                lineno,
                "'prompt_token_ids' must be a non-empty list of non-negative integers below 2**32",
            )
        assert isinstance(toks, list)
        out_ids = obj.get("output_token_ids")
        if out_ids is not None and not _token_list(out_ids):
            raise TraceFormatError(
                path,
                lineno,
                "'output_token_ids' must be a non-empty list of non-negative integers below 2**32",
            )
        assert out_ids is None or isinstance(out_ids, list)
        n_out = _int_field(path, lineno, obj, "output_length", minimum=1, required=False)
        if n_out is None:
            n_out = len(out_ids) if out_ids else 16
        elif out_ids is not None and len(out_ids) < n_out:
            raise TraceFormatError(
                path,
                lineno,
                f"'output_token_ids' has {len(out_ids)} tokens, fewer than output_length {n_out}",
            )
        _check_request_len(path, lineno, len(toks), n_out)
        t = _time_field(path, lineno, obj, "arrival_time")
        if t is None:
            ms = _time_field(path, lineno, obj, "timestamp")
            t = ms / 1000.0 if ms is not None else 0.0
        salt = obj.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise TraceFormatError(
                path, lineno, f"'cache_salt' must be a string, got {_shown(salt)}"
            )
        rid = obj.get("request_id", f"req-{len(reqs)}")
        if not isinstance(rid, str) or not rid:
            raise TraceFormatError(
                path, lineno, f"'request_id' must be a non-empty string, got {_shown(rid)}"
            )
        if rid in seen:
            raise TraceFormatError(path, lineno, f"duplicate request_id {_shown(rid)}")
        seen.add(rid)
        prompt = tuple(toks)
        reqs.append(
            WorkloadRequest(
                request_id=rid,
                arrival_s=t,
                prompt_len=len(prompt),
                output_len=n_out,
                make_prompt=functools.partial(_same, prompt),
                cache_salt=salt,
                output_token_ids=tuple(out_ids[:n_out]) if out_ids is not None else None,
            )
        )
    return Workload(f"tokens:{path.name}", reqs)


# --------------------------------------------------------------------------- bundled default


def synthetic_chat(
    *,
    seed: int = 0,
    num_conversations: int = 96,
    num_system_prompts: int = 4,
    system_prompt_len: int = 1024,
    max_turns: int = 4,
    user_len: tuple[int, int] = (32, 384),
    reply_len: tuple[int, int] = (16, 192),
    mean_gap_s: float = 0.05,
    think_time_s: float = 2.0,
) -> Workload:
    """The bundled default: a deterministic multi-turn chat workload.

    Each conversation starts with one of ``num_system_prompts`` shared system
    prompts; turn ``k+1``'s prompt is turn ``k``'s prompt, its reply and a new
    user message, so an unbounded prefix cache serves most of every
    follow-up. Conversations start on a Poisson process (``mean_gap_s``) and
    wait ``think_time_s`` (mean) between turns. Same seed, same workload.
    """
    rng = np.random.default_rng(seed)
    systems = [
        _derived_tokens(seed * 1_000_003 + 17 * (i + 1), system_prompt_len)
        for i in range(num_system_prompts)
    ]
    reqs: list[WorkloadRequest] = []
    start = 0.0
    stream = seed * 7_919_000 + 1
    for c in range(num_conversations):
        start += float(rng.exponential(mean_gap_s))
        history = systems[int(rng.integers(num_system_prompts))]
        t = start
        for turn in range(int(rng.integers(1, max_turns + 1))):
            stream += 1
            user = _derived_tokens(stream, int(rng.integers(user_len[0], user_len[1] + 1)))
            prompt = np.concatenate([history, user])
            n_out = int(rng.integers(reply_len[0], reply_len[1] + 1))
            stream += 1
            reply = _derived_tokens(stream, n_out)
            reqs.append(
                WorkloadRequest(
                    request_id=f"chat{c}-t{turn}",
                    arrival_s=round(t, 6),
                    prompt_len=int(prompt.shape[0]),
                    output_len=n_out,
                    make_prompt=functools.partial(_same, prompt),
                    output_token_ids=tuple(reply.tolist()),
                )
            )
            history = np.concatenate([prompt, reply])
            t += float(rng.exponential(think_time_s)) + 0.5
    return Workload(f"synthetic-chat(seed={seed})", reqs)


def load_workload(trace: str | Path | None, fmt: str | None, limit: int | None = None) -> Workload:
    """The CLI's workload: the bundled default, or ``trace`` read as ``fmt``.

    ``fmt`` None guesses from the first record (``hash_ids`` -> mooncake,
    ``prompt_token_ids`` -> tokens). The file is read once, as a stream, so
    ``trace`` may be a pipe; gzip-compressed files are recognised by content.
    """
    if trace is None:
        wl = synthetic_chat()
        if limit is not None:
            wl.requests = wl.requests[:limit]
        return wl
    if fmt not in (None, "mooncake", "tokens"):
        raise ValueError(f"unknown trace format {fmt!r} (expected 'mooncake' or 'tokens')")
    path = Path(trace)
    with closing(_records(path)) as recs:
        first = next(recs, None)
        if fmt is None:
            if first is None:
                raise TraceFormatError(path, None, "empty trace: no requests")
            fmt = _guess_format(path, *first)
        records = recs if first is None else itertools.chain([first], recs)
        if fmt == "mooncake":
            return _mooncake(path, records, limit)
        return _token_trace(path, records, limit)


def _guess_format(path: Path, lineno: int, obj: dict[str, object]) -> str:
    if "hash_ids" in obj:
        return "mooncake"
    if "prompt_token_ids" in obj:
        return "tokens"
    raise TraceFormatError(
        path,
        lineno,
        "cannot tell the format: no 'hash_ids' (mooncake) or 'prompt_token_ids' "
        "(tokens); pass --format",
    )
