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
(prompt and output) and asks for at least :data:`MIN_OUTPUT_TOKENS` (a zero
is refused, never rounded up), times must be finite and non-negative, and
numbers the JSON cannot represent (``NaN``, ``Infinity``, ``1e400``) are
refused. Each format's fields are one table (:data:`MOONCAKE_FIELDS`,
:data:`TOKEN_FIELDS`): a field it lacks is an :class:`UnknownFieldError`
naming it with a did-you-mean, unless the reader is asked for
``lenient_fields``. Every error names ``file:line:column`` of the first bad
byte or value (:mod:`kvcoord.replay._jsonl`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvcoord._arith import cdiv
from kvcoord._core import mooncake_prompt_tokens as _core_mooncake_tokens
from kvcoord._suggest import did_you_mean, unknown_name
from kvcoord.replay._jsonl import (
    MAX_REQUEST_TOKENS,
    MIN_OUTPUT_TOKENS,
    OUTPUT_MINIMUM_WHY,
    TOKEN_ID_LIMIT,
    Field,
    Record,
    TraceFormatError,
    UnknownFieldError,
    check_request_len,
    count_field,
    first_unknown,
    id_list_field,
    read_fields,
    read_records,
    shown,
    string_field,
    time_field,
)

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "MAX_REQUEST_TOKENS",
    "MIN_OUTPUT_TOKENS",
    "MOONCAKE_BLOCK_TOKENS",
    "MOONCAKE_FIELDS",
    "TOKEN_FIELDS",
    "TOKEN_ID_LIMIT",
    "TRACE_FORMATS",
    "VOCAB_SIZE",
    "TraceFormatError",
    "UnknownFieldError",
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
#: Mooncake hash ids are in ``[0, 2**63)``.
_HASH_ID_LIMIT = 1 << 63

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


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


def mooncake_block_tokens(hash_id: int) -> np.ndarray:
    """The 512 tokens named by one Mooncake hash id (a function of the id alone)."""
    return mooncake_prompt_tokens([hash_id], MOONCAKE_BLOCK_TOKENS)


def mooncake_prompt_tokens(hash_ids: Sequence[int], input_length: int) -> np.ndarray:
    """Prompt tokens of a Mooncake request: the blocks of ``hash_ids``, cut at ``input_length``.

    Token ``j`` of the block named ``h`` is a hash of ``(h, j)`` reduced to
    ``[0, VOCAB_SIZE)``, so a shared id gives a shared 512-token run and a
    shared id prefix a shared token prefix, whatever block size the cache uses.

    The arithmetic is the core's (``kvcoord._core.mooncake_prompt_tokens``,
    one pass in Rust); the tests hold it to a numpy reference. Returns a
    uint32 array, which the core takes back as one copy.
    """
    if input_length <= 0:
        return np.zeros(0, dtype=np.uint32)
    n_blocks = cdiv(input_length, MOONCAKE_BLOCK_TOKENS)
    out: np.ndarray = _core_mooncake_tokens(hash_ids[:n_blocks], input_length)
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

#: The Mooncake format's fields (every one required), each with its check.
MOONCAKE_FIELDS: dict[str, Field] = {
    "timestamp": Field(time_field, required=True),
    "input_length": Field(count_field(1), required=True),
    "output_length": Field(count_field(MIN_OUTPUT_TOKENS, OUTPUT_MINIMUM_WHY), required=True),
    "hash_ids": Field(id_list_field(_HASH_ID_LIMIT, "integers in [0, 2**63)"), required=True),
}
_TOKEN_IDS = id_list_field(TOKEN_ID_LIMIT, "non-negative integers below 2**32")
#: The token format's fields, each with its check (``prompt_token_ids`` required).
TOKEN_FIELDS: dict[str, Field] = {
    "prompt_token_ids": Field(_TOKEN_IDS, required=True),
    "output_length": Field(count_field(MIN_OUTPUT_TOKENS, OUTPUT_MINIMUM_WHY)),
    "output_token_ids": Field(_TOKEN_IDS),
    "arrival_time": Field(time_field),
    "timestamp": Field(time_field),
    "cache_salt": Field(string_field()),
    "request_id": Field(string_field(nonempty=True)),
}
#: Output tokens of a token-trace request that gives neither ``output_length``
#: nor ``output_token_ids``.
DEFAULT_OUTPUT_TOKENS = 16


def read_mooncake(
    path: str | Path, limit: int | None = None, *, lenient_fields: bool = False
) -> Workload:
    """Read a Mooncake trace (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``).

    Every line is one request; ``limit`` stops after that many. A field the
    format does not know is an error (:class:`UnknownFieldError`) unless
    ``lenient_fields`` (then it is ignored).
    """
    path = Path(path)
    with closing(read_records(path)) as recs:
        return _mooncake(path, recs, limit, lenient_fields)


def _mooncake(path: Path, records: Iterable[Record], limit: int | None, lenient: bool) -> Workload:
    reqs: list[WorkloadRequest] = []
    for rec in records:
        if limit is not None and len(reqs) >= limit:
            break
        f = _fields(rec, "mooncake", lenient)
        ts, n_in, n_out, ids = (
            f["timestamp"], f["input_length"], f["output_length"], f["hash_ids"]
        )  # fmt: skip
        assert isinstance(ts, float) and isinstance(n_in, int) and isinstance(n_out, int)
        assert isinstance(ids, list)
        need = cdiv(n_in, MOONCAKE_BLOCK_TOKENS)
        if len(ids) != need:
            raise rec.error(
                f"input_length {n_in} needs {need} hash ids of {MOONCAKE_BLOCK_TOKENS} tokens, "
                f"got {len(ids)}",
                "hash_ids",
            )
        check_request_len(rec, n_in, n_out, "output_length")
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


def read_token_trace(
    path: str | Path, limit: int | None = None, *, lenient_fields: bool = False
) -> Workload:
    """Read JSON Lines of explicit ``prompt_token_ids`` (see the module docstring for
    fields; ``lenient_fields`` as for :func:`read_mooncake`)."""
    path = Path(path)
    with closing(read_records(path)) as recs:
        return _token_trace(path, recs, limit, lenient_fields)


def _token_trace(
    path: Path, records: Iterable[Record], limit: int | None, lenient: bool
) -> Workload:
    reqs: list[WorkloadRequest] = []
    seen: set[str] = set()
    for rec in records:
        if limit is not None and len(reqs) >= limit:
            break
        f = _fields(rec, "tokens", lenient)
        toks = f["prompt_token_ids"]
        out_ids = f.get("output_token_ids")
        n_out = f.get("output_length")
        assert isinstance(toks, list) and (out_ids is None or isinstance(out_ids, list))
        assert n_out is None or isinstance(n_out, int)
        if n_out is None:
            n_out = len(out_ids) if out_ids else DEFAULT_OUTPUT_TOKENS
            check_request_len(
                rec, len(toks), n_out, "output_token_ids" if out_ids else "prompt_token_ids"
            )
        else:
            if out_ids is not None and len(out_ids) < n_out:
                raise rec.error(
                    f"'output_token_ids' has {len(out_ids)} tokens, fewer than "
                    f"output_length {n_out}",
                    "output_token_ids",
                )
            check_request_len(rec, len(toks), n_out, "output_length")
        t = f.get("arrival_time")
        if t is None:
            ms = f.get("timestamp")
            t = ms / 1000.0 if isinstance(ms, float) else 0.0
        assert isinstance(t, float)
        salt = f.get("cache_salt")
        rid = f.get("request_id", "")  # "": named below, once every given id is known
        assert (salt is None or isinstance(salt, str)) and isinstance(rid, str)
        if rid in seen:
            raise rec.error(f"duplicate request_id {shown(rid)}", "request_id")
        if rid:
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
    for i, r in enumerate(reqs):  # a request without an id: req-<index>, unless a line took it
        if not r.request_id:
            rid, k = f"req-{i}", 0
            while rid in seen:
                k += 1
                rid = f"req-{i}.{k}"
            r.request_id = rid
            seen.add(rid)
    return Workload(f"tokens:{path.name}", reqs)


# --------------------------------------------------------------------------- bundled default


def synthetic_chat(
    *,
    seed: int = 0,
    num_conversations: int = 500,
    num_system_prompts: int = 4,
    system_prompt_len: int = 1024,
    max_turns: int = 8,
    user_len: tuple[int, int] = (64, 1024),
    reply_len: tuple[int, int] = (32, 256),
    mean_gap_s: float = 0.15,
    think_time_s: float = 20.0,
) -> Workload:
    """The bundled default: a deterministic multi-turn chat workload.

    Each conversation starts with one of ``num_system_prompts`` shared system
    prompts; turn ``k+1``'s prompt is turn ``k``'s prompt, its reply and a new
    user message, so an unbounded prefix cache serves most of every
    follow-up. Conversations start on a Poisson process (``mean_gap_s``) and
    wait ``think_time_s`` (mean) between turns. Same seed, same workload.

    The defaults are sized to put the default deployment under memory
    pressure: 2,259 requests over 6 minutes, about 600 conversations open at
    once, whose histories (up to 7,800 tokens) outgrow the 54.72 GiB a
    Llama-3.1-8B on one H100 leaves for the KV cache, so the pool evicts
    histories before their next turn (hit rate 66.7% of 82.7% possible).
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


def load_workload(
    trace: str | Path | None,
    fmt: str | None,
    limit: int | None = None,
    *,
    lenient_fields: bool = False,
) -> Workload:
    """The CLI's workload: the bundled default, or ``trace`` read as ``fmt``.

    ``fmt`` None guesses from the first record (``hash_ids`` -> mooncake,
    ``prompt_token_ids`` -> tokens). The file is read once, as a stream, so
    ``trace`` may be a pipe; gzip-compressed files are recognised by content.
    ``lenient_fields`` ignores fields the format does not know.
    """
    if trace is None:
        wl = synthetic_chat()
        if limit is not None:
            wl.requests = wl.requests[:limit]
        return wl
    if fmt not in (None, *TRACE_FORMATS):
        raise ValueError(unknown_name("trace format", str(fmt), TRACE_FORMATS))
    path = Path(trace)
    with closing(read_records(path)) as recs:
        first = next(recs, None)
        if fmt is None:
            if first is None:
                raise TraceFormatError(path, None, "empty trace: no requests")
            fmt = _guess_format(first)
        records = recs if first is None else itertools.chain([first], recs)
        if fmt == "mooncake":
            return _mooncake(path, records, limit, lenient_fields)
        return _token_trace(path, records, limit, lenient_fields)


#: Trace formats by name, each with its field table.
TRACE_FORMATS: dict[str, dict[str, Field]] = {"mooncake": MOONCAKE_FIELDS, "tokens": TOKEN_FIELDS}


def _fields(rec: Record, fmt: str, lenient: bool) -> dict[str, object]:
    """``rec``'s fields checked against ``fmt``'s table; a line whose fields are
    all another format's is said to be in that format (not a typo)."""
    try:
        return read_fields(rec, TRACE_FORMATS[fmt], lenient=lenient)
    except UnknownFieldError as e:
        for other, table in TRACE_FORMATS.items():
            if other != fmt and all(k in table for k in rec):
                raise UnknownFieldError(
                    e.path,
                    e.line,
                    f"unknown field {shown(e.field)} of the {fmt} format: the line is in the "
                    f"{other} format (--format {other})",
                    e.column,
                    e.field,
                ) from None
        raise


def _guess_format(rec: Record) -> str:
    if "hash_ids" in rec:
        return "mooncake"
    if "prompt_token_ids" in rec:
        return "tokens"
    known = list(dict.fromkeys(k for fields in TRACE_FORMATS.values() for k in fields))
    odd = first_unknown(rec, known)
    problem = "cannot tell the format: no 'hash_ids' (mooncake) or 'prompt_token_ids' (tokens)"
    if odd is not None:
        hint = did_you_mean(odd, ("hash_ids", "prompt_token_ids"))
        if hint:
            raise UnknownFieldError(
                rec.path,
                rec.line,
                f"{problem}; unknown field {shown(odd)}{hint}",
                rec.column(odd, at_key=True),
                odd,
            )
    raise rec.error(f"{problem}; name the format (--format)")
