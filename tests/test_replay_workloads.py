"""Workload readers and the bundled synthetic workload (no manager needed)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcoord.replay.workloads import (
    MAX_REQUEST_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    TOKEN_ID_LIMIT,
    VOCAB_SIZE,
    TraceFormatError,
    Workload,
    _splitmix64,
    load_workload,
    mooncake_block_tokens,
    mooncake_prompt_tokens,
    read_mooncake,
    read_token_trace,
    synthetic_chat,
)

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_small.jsonl"


def _write(tmp_path: Path, lines: list[object], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text(
        "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n",
        encoding="utf-8",
    )
    return p


# --------------------------------------------------------------------------- mooncake


def test_mooncake_reader_fields() -> None:
    wl = read_mooncake(MOONCAKE)
    assert len(wl.requests) == 6
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.25, 0.5, 0.75, 1.5, 1.75]
    assert [r.prompt_len for r in wl.requests] == [1100, 1300, 600, 1024, 700, 40]
    assert [r.output_len for r in wl.requests] == [8, 4, 6, 3, 5, 2]
    for r in wl.requests:
        toks = r.prompt_tokens()
        assert len(toks) == r.prompt_len
        assert all(0 <= t < VOCAB_SIZE for t in toks)
        assert len(r.output_tokens()) == r.output_len
    assert read_mooncake(MOONCAKE, limit=2).requests[1].prompt_len == 1300


def test_mooncake_shared_ids_give_shared_prefixes() -> None:
    r = read_mooncake(MOONCAKE).requests
    a, b, c, d = (np.array(x.prompt_tokens()) for x in r[:4])
    n = 2 * MOONCAKE_BLOCK_TOKENS
    assert (a[:n] == b[:n]).all()  # ids [0, 1] shared
    assert (a[n : 1024 + 16] != b[n : 1024 + 16]).any()  # id 2 vs 3
    assert (d == a[:1024]).all()
    assert (c[:16] != a[:16]).any()
    # a block is a function of its id alone, whatever its position
    e = np.array(r[4].prompt_tokens())
    assert (e[:MOONCAKE_BLOCK_TOKENS] == c[:MOONCAKE_BLOCK_TOKENS]).all()
    assert (mooncake_block_tokens(6)[:188] == e[MOONCAKE_BLOCK_TOKENS:]).all()
    assert (mooncake_prompt_tokens([9, 4], 1024)[512:] == mooncake_block_tokens(4)).all()


def _numpy_mooncake_tokens(hash_ids: list[int], input_length: int) -> np.ndarray:
    """The numpy arithmetic the core's synthesis replaced (the reference)."""
    n_blocks = -(-input_length // MOONCAKE_BLOCK_TOKENS)
    ids = np.asarray(hash_ids[:n_blocks], dtype=np.uint64)
    offsets = _splitmix64(np.arange(MOONCAKE_BLOCK_TOKENS, dtype=np.uint64) + np.uint64(0xA5A5))
    with np.errstate(over="ignore"):
        base = _splitmix64(ids * np.uint64(0x100000001B3) + np.uint64(0x6D6F6F6E63616B65))
        grid = (base[:, None] ^ offsets[None, :]) * np.uint64(0xD6E8FEB86659FD93)
    high = (grid >> np.uint64(33)).astype(np.uint32)
    return (high % np.uint32(VOCAB_SIZE)).reshape(-1)[:input_length]


@pytest.mark.parametrize("n", [1, 511, 512, 513, 1300, 4096])
def test_mooncake_tokens_match_the_numpy_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    ids = [int(x) for x in rng.integers(0, 1 << 63, size=9, dtype=np.uint64)] + [0, (1 << 63) - 1]
    got = mooncake_prompt_tokens(ids, n)
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, _numpy_mooncake_tokens(ids, n))
    # fewer ids than the length needs: every token of every id
    np.testing.assert_array_equal(
        mooncake_prompt_tokens(ids[:1], n), _numpy_mooncake_tokens(ids[:1], n)
    )


def test_mooncake_block_tokens_distinct_at_small_block_sizes() -> None:
    blocks = {tuple(mooncake_block_tokens(h)[i : i + 16]) for h in range(50) for i in (0, 256)}
    assert len(blocks) == 100
    assert (mooncake_block_tokens(3) == mooncake_block_tokens(3)).all()


@pytest.mark.parametrize(
    ("line", "problem", "at"),
    [
        ("{not json", "invalid JSON", "not"),
        ("[1, 2]", "expected a JSON object", "["),
        (
            '{"input_length": 10, "output_length": 1, "hash_ids": [1]}',
            "missing field 'timestamp'",
            "{",
        ),
        (
            '{"timestamp": 0, "output_length": 1, "hash_ids": [1]}',
            "missing field 'input_length'",
            "{",
        ),
        (
            '{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}',
            "'input_length' must be >= 1",
            '0, "output',
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}',
            "'output_length' must be >= 1",
            "-1",
        ),
        (
            '{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}',
            "must be an integer",
            '"10"',
        ),
        (
            '{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
            "non-negative number",
            "-5",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1}',
            "missing field 'hash_ids'",
            "{",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [3, "a"]}',
            "list of integers in [0, 2**63); element 1 is 'a'",
            '"a"',
        ),
        (
            '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}',
            "needs 2 hash ids",
            "[1]",
        ),
    ],
)
def test_mooncake_malformed_line_names_file_line_and_column(
    tmp_path: Path, line: str, problem: str, at: str
) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
    p = _write(tmp_path, [good, "", line])
    with pytest.raises(TraceFormatError) as ei:
        read_mooncake(p)
    column = line.index(at) + 1
    assert (ei.value.line, ei.value.column) == (3, column)
    assert str(ei.value).startswith(f"{p}:3:{column}: ")
    assert problem in str(ei.value)


@pytest.mark.parametrize("reader", ["mooncake", "guessed format"])
def test_unreadable_trace(tmp_path: Path, reader: str) -> None:
    def read(path: Path) -> object:
        if reader == "mooncake":
            return read_mooncake(path)
        return load_workload(path, None)  # sniffs the format first

    with pytest.raises(TraceFormatError, match="no such file"):
        read(tmp_path / "missing.jsonl")
    with pytest.raises(TraceFormatError, match="directory"):
        read(tmp_path)
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceFormatError, match="UTF-8"):
        read(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n{not json\n")
    with pytest.raises(TraceFormatError, match=r"broken.jsonl:2:2: invalid JSON"):
        read(broken)


# --------------------------------------------------------------------------- token traces


def test_token_trace_reader(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        [
            {
                "prompt_token_ids": [1, 2, 3],
                "output_length": 2,
                "arrival_time": 0.5,
                "cache_salt": "s",
            },
            {"prompt_token_ids": [1, 2], "timestamp": 100, "request_id": "x"},
            {"prompt_token_ids": [4], "output_token_ids": [7, 8, 9]},
        ],
    )
    wl = read_token_trace(p)
    by_id = {r.request_id: r for r in wl.requests}
    assert set(by_id) == {"req-0", "x", "req-2"}
    assert [r.request_id for r in wl.requests] == ["req-2", "x", "req-0"]  # sorted by arrival
    assert by_id["req-0"].prompt_tokens() == [1, 2, 3]
    assert by_id["req-0"].cache_salt == "s"
    assert by_id["req-0"].arrival_s == 0.5
    assert by_id["x"].arrival_s == pytest.approx(0.1)
    assert by_id["x"].output_len == 16
    assert by_id["req-2"].output_tokens() == [7, 8, 9]
    assert by_id["req-2"].output_len == 3


@pytest.mark.parametrize(
    ("obj", "problem", "at"),
    [
        ({"output_length": 3}, "missing field 'prompt_token_ids'", "{"),
        ({"prompt_token_ids": []}, "non-empty list", "[]"),
        ({"prompt_token_ids": [1, -2]}, "non-negative integers", "-2"),
        ({"prompt_token_ids": [1], "output_length": 0}, "'output_length' must be >= 1", "0}"),
        (
            {"prompt_token_ids": [1], "output_token_ids": "ab"},
            "'output_token_ids' must be a non-empty list",
            '"ab"',
        ),
        (
            {"prompt_token_ids": [1], "output_token_ids": [1], "output_length": 2},
            "fewer than output_length",
            "[1],",
        ),
        ({"prompt_token_ids": [1], "cache_salt": 3}, "'cache_salt' must be a string", "3}"),
        ({"prompt_token_ids": [1], "arrival_time": "soon"}, "non-negative number", '"soon"'),
        ({"prompt_token_ids": [1], "request_id": "a"}, "duplicate request_id 'a'", '"a"'),
        ({"prompt_token_ids": [1], "request_id": ""}, "non-empty string", '""'),
    ],
)
def test_token_trace_malformed(
    tmp_path: Path, obj: dict[str, object], problem: str, at: str
) -> None:
    p = _write(tmp_path, [{"prompt_token_ids": [5], "request_id": "a"}, obj])
    with pytest.raises(TraceFormatError) as ei:
        read_token_trace(p)
    line = json.dumps(obj)
    column = line.rindex(at) + 1 if at != "[1]," else line.index(at, 22) + 1
    assert str(ei.value).startswith(f"{p}:2:{column}: ")
    assert problem in str(ei.value)


def test_load_workload_guesses_format(tmp_path: Path) -> None:
    assert load_workload(MOONCAKE, None).name.startswith("mooncake:")
    p = _write(tmp_path, [{"prompt_token_ids": [1, 2]}])
    assert load_workload(p, None).name.startswith("tokens:")
    assert len(load_workload(None, None, limit=5).requests) == 5
    q = _write(tmp_path, [{"foo": 1}], "q.jsonl")
    with pytest.raises(TraceFormatError, match=r"q\.jsonl:1:1: cannot tell the format"):
        load_workload(q, None)
    with pytest.raises(
        TraceFormatError,
        match=r"t\.jsonl:1:2: unknown field .prompt_token_ids. of the mooncake format: the line "
        r"is in the tokens format",
    ):
        load_workload(p, "mooncake")


# --------------------------------------------------------------------------- bundled default


def test_synthetic_chat_is_deterministic_and_shares_prefixes() -> None:
    a, b = synthetic_chat(seed=3), synthetic_chat(seed=3)
    assert [r.request_id for r in a.requests] == [r.request_id for r in b.requests]
    assert all(
        x.prompt_tokens() == y.prompt_tokens() for x, y in zip(a.requests, b.requests, strict=True)
    )
    assert synthetic_chat(seed=4).requests[0].prompt_tokens() != a.requests[0].prompt_tokens()
    times = [r.arrival_s for r in a.requests]
    assert times == sorted(times)
    by_id = {r.request_id: r for r in a.requests}
    followups = [r for r in a.requests if not r.request_id.endswith("-t0")]
    assert followups, "the default workload has follow-up turns"
    for r in followups:
        conv, turn = r.request_id.rsplit("-t", 1)
        prev = by_id[f"{conv}-t{int(turn) - 1}"]
        history = prev.prompt_tokens() + prev.output_tokens()
        assert r.prompt_tokens()[: len(history)] == history
        assert r.arrival_s > prev.arrival_s
    firsts = {tuple(r.prompt_tokens()[:1024]) for r in a.requests}
    assert 1 < len(firsts) <= 4  # a few shared system prompts


# --------------------------------------------------------------------------- hardening


def test_gzip_trace_read_by_content(tmp_path: Path) -> None:
    import gzip

    plain = read_mooncake(MOONCAKE)
    for name in ("t.jsonl.gz", "t.jsonl"):
        p = tmp_path / name
        p.write_bytes(gzip.compress(MOONCAKE.read_bytes()))
        for wl in (read_mooncake(p), load_workload(p, None)):
            assert [r.prompt_tokens() for r in wl.requests] == [
                r.prompt_tokens() for r in plain.requests
            ]
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(MOONCAKE.read_bytes())[:60])
    with pytest.raises(TraceFormatError, match="corrupt gzip data"):
        read_mooncake(cut)


def test_token_id_range_is_the_cores(tmp_path: Path) -> None:
    top = TOKEN_ID_LIMIT - 1
    p = _write(tmp_path, [{"prompt_token_ids": [0, top], "output_token_ids": [top]}])
    r = read_token_trace(p).requests[0]
    assert r.prompt_tokens() == [0, top] and r.output_tokens() == [top]
    for bad in (
        {"prompt_token_ids": [TOKEN_ID_LIMIT]},
        {"prompt_token_ids": [1], "output_token_ids": [TOKEN_ID_LIMIT]},
    ):
        with pytest.raises(TraceFormatError, match="below 2\\*\\*32"):
            read_token_trace(_write(tmp_path, [bad]))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"prompt_token_ids": [1], "arrival_time": 1e400}', "number 1e400 is out of range"),
        ('{"prompt_token_ids": [1], "arrival_time": -Infinity}', "-Infinity is not a JSON number"),
        ('{"prompt_token_ids": [NaN]}', "NaN is not a JSON number"),
        ('{"prompt_token_ids": [1], "timestamp": ' + "1" * 400 + "}", "must be a finite"),
        ('{"prompt_token_ids": [' + "1" * 5000 + "]}", "number is out of range"),
        ('{"prompt_token_ids": ' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deeply"),
    ],
)
def test_unrepresentable_numbers_and_nesting(tmp_path: Path, line: str, problem: str) -> None:
    p = _write(tmp_path, [line])
    with pytest.raises(TraceFormatError, match=problem) as ei:
        load_workload(p, None)
    assert ei.value.line == 1


def test_workload_refuses_non_finite_arrival() -> None:
    r = synthetic_chat(num_conversations=1).requests[0]
    r.arrival_s = float("inf")
    with pytest.raises(ValueError, match="arrival time must be finite"):
        Workload("w", [r])


def test_overlong_line_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcoord.replay._jsonl as jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64)
    p = _write(tmp_path, [{"prompt_token_ids": [1]}, {"prompt_token_ids": list(range(50))}])
    with pytest.raises(TraceFormatError, match="line longer than 64 bytes") as ei:
        read_token_trace(p)
    assert (ei.value.line, ei.value.column) == (2, 65)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX pipes")
def test_trace_from_a_pipe_is_read_once(tmp_path: Path) -> None:
    import threading

    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    text = MOONCAKE.read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    wl = load_workload(fifo, None)  # guesses the format from the same single pass
    writer.join()
    assert len(wl.requests) == 6


_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64, MAX_REQUEST_TOKENS]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
_json_values = st.recursive(_json_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
_KEYS = [
    "timestamp",
    "input_length",
    "output_length",
    "hash_ids",
    "prompt_token_ids",
    "output_token_ids",
    "arrival_time",
    "cache_salt",
    "request_id",
]
_records = st.dictionaries(st.sampled_from(_KEYS), _json_values, max_size=6)
_raw_lines = st.sampled_from(
    ["1e400", "-1e400", "NaN", "Infinity", "9" * 5000, "[" * 3000, "{}", "", "[]", '"x"']
)


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.one_of(_records.map(json.dumps), _raw_lines), min_size=1, max_size=4),
    fmt=st.sampled_from([None, "mooncake", "tokens"]),
    compress=st.booleans(),
)
def test_any_trace_loads_checked_or_fails_with_trace_format_error(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], fmt: str | None, compress: bool
) -> None:
    """Whatever a trace line holds, loading gives a workload whose every value the
    replay can use, or a `TraceFormatError`, never another exception."""
    import gzip

    data = ("\n".join(lines) + "\n").encode()
    p = tmp_path_factory.mktemp("fuzz") / "t.jsonl"
    p.write_bytes(gzip.compress(data) if compress else data)
    try:
        wl = load_workload(p, fmt)
    except TraceFormatError as e:
        assert str(e).startswith(str(p)) and "\n" not in str(e)
        return
    for r in wl.requests:
        assert math.isfinite(r.arrival_s) and r.arrival_s >= 0
        assert r.prompt_len >= 1 and r.output_len >= 1
        assert r.prompt_len + r.output_len <= MAX_REQUEST_TOKENS
        toks = r.prompt_tokens()
        assert len(toks) == r.prompt_len
        assert all(0 <= t < TOKEN_ID_LIMIT for t in toks)
        if r.output_len <= 4096:
            out = r.output_tokens()
            assert len(out) == r.output_len
            assert all(0 <= t < TOKEN_ID_LIMIT for t in out)
