"""Trace readers name the exact ``file:line:column`` of the first bad byte or value,
refuse every line that is not a JSON object and every field the format does not
know (unless asked to be lenient), and never change a value silently (issue 32,
part 3)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcoord.replay._jsonl import read_records
from kvcoord.replay.workloads import (
    MOONCAKE_FIELDS,
    TOKEN_FIELDS,
    TraceFormatError,
    UnknownFieldError,
    load_workload,
    read_mooncake,
    read_token_trace,
)

GOOD = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}


def _error(path: Path, fmt: str | None = None) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as ei:
        load_workload(path, fmt)
    return ei.value


def _lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


# --------------------------------------------------------------------------- bytes


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_named_at_its_line_and_column(tmp_path: Path, compress: bool) -> None:
    # was: reported at line 457 (the text decoder reads ahead in chunks)
    lines: list[str | bytes] = [json.dumps({**GOOD, "timestamp": i}) for i in range(1000)]
    bad = json.dumps({**GOOD, "timestamp": 499}).encode().replace(b'"hash_ids"', b'"hash\xffids"')
    lines[499] = bad
    p = _lines(tmp_path / "t.jsonl", lines)
    if compress:
        p.write_bytes(gzip.compress(p.read_bytes()))
    e = _error(p)
    assert (e.line, e.column) == (500, bad.index(b"\xff") + 1)
    assert str(e).startswith(f"{p}:500:{e.column}: not UTF-8 text: byte 0xff")


def test_latin1_byte_on_line_two(tmp_path: Path) -> None:
    # was: reported on line 1
    line = b'{"prompt_token_ids": [1], "cache_salt": "caf\xe9"}'
    p = _lines(tmp_path / "t.jsonl", ['{"prompt_token_ids": [1]}', line])
    e = _error(p)
    assert (e.line, e.column) == (2, line.index(b"\xe9") + 1)
    assert "byte 0xe9" in str(e)


def test_column_counts_characters_before_a_bad_byte(tmp_path: Path) -> None:
    text = '{"prompt_token_ids": [1], "cache_salt": "\u00e9\u4e2d'.encode() + b'\xc3("}'
    p = _lines(tmp_path / "t.jsonl", [text])
    e = _error(p)
    assert e.column == 44  # 41 characters, then two characters of 2 and 3 bytes, then the byte


def test_byte_order_mark_is_not_a_column(tmp_path: Path) -> None:
    p = _lines(tmp_path / "t.jsonl", [b"\xef\xbb\xbf" + b'{"prompt_token_ids": [1], "x": 1}'])
    e = _error(p)
    assert (e.line, e.column) == (1, 27)  # the key "x", counted after the mark


# --------------------------------------------------------------------------- lines


@pytest.mark.parametrize("value", ["null", "5", "[1, 2]", '"text"', "true", "-0.5"])
@pytest.mark.parametrize("fmt", ["mooncake", "tokens", None])
def test_a_line_that_is_not_an_object_is_refused(
    tmp_path: Path, value: str, fmt: str | None
) -> None:
    # was: a `null` line was taken for a blank one and skipped
    first = json.dumps(GOOD if fmt != "tokens" else {"prompt_token_ids": [1]})
    p = _lines(tmp_path / "t.jsonl", [first, "", "  " + value])
    e = _error(p, fmt)
    assert (e.line, e.column) == (3, 3)
    assert "expected a JSON object" in str(e)


def test_a_carriage_return_is_whitespace_not_a_line_break(tmp_path: Path) -> None:
    # was: "column 1" for an error at column 57 (a lone \r started a new line)
    line = '{"timestamp": 0, "input_length": 10,\r "output_length": 1, "hash_ids": [1,]}'
    p = _lines(tmp_path / "t.jsonl", [line, json.dumps(GOOD)])
    e = _error(p)
    assert (e.line, e.column) == (1, line.index("]") + 1)
    assert "Expecting value" in str(e)
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(b"".join(json.dumps(GOOD).encode() + b"\r\n" for _ in range(3)))
    assert len(read_mooncake(crlf).requests) == 3


@pytest.mark.parametrize(
    ("line", "at", "problem"),
    [
        ('{"timestamp": 0, "timestamp": 1}', '"timestamp": 1', "field 'timestamp' appears twice"),
        ('{"prompt_token_ids": [1]} {"x": 1}', '{"x"', "Extra data"),
        ('{"prompt_token_ids": [1], "arrival_time": 1e400}', "1e400", "number 1e400 is out"),
        ('{"prompt_token_ids": [1, 2, [3, NaN]]}', "NaN", "NaN is not a JSON number"),
        ('{"prompt_token_ids": [1, 2, 3 4]}', "4", "Expecting ',' delimiter"),
        ('{"prompt_token_ids" [1]}', "[1]", "Expecting ':' delimiter"),
        ('{"prompt_token_ids": [1], "cache_salt": "a\\ud800"}', '"a', "lone surrogate"),
    ],
)
def test_json_errors_name_the_exact_column(
    tmp_path: Path, line: str, at: str, problem: str
) -> None:
    p = _lines(tmp_path / "t.jsonl", ['{"prompt_token_ids": [9]}', line])
    e = _error(p, "tokens")
    assert (e.line, e.column) == (2, line.index(at) + 1), str(e)
    assert problem in str(e)


# --------------------------------------------------------------------------- fields


@pytest.mark.parametrize(
    ("record", "typo", "meant"),
    [
        ({"prompt_token_ids": [1], "arival_time": 5}, "arival_time", "arrival_time"),
        ({"prompt_token_ids": [1], "output_lenght": 3}, "output_lenght", "output_length"),
        ({**GOOD, "timestmp": 0}, "timestmp", "timestamp"),
        ({**GOOD, "hash_idz": [1]}, "hash_idz", "hash_ids"),
    ],
)
def test_unknown_field_is_an_error_with_did_you_mean(
    tmp_path: Path, record: dict[str, object], typo: str, meant: str
) -> None:
    # was: ignored, so a misspelt arrival_time silently meant arrival 0
    p = _lines(tmp_path / "t.jsonl", [json.dumps(record)])
    with pytest.raises(UnknownFieldError) as ei:
        load_workload(p, None)
    line = json.dumps(record)
    assert (ei.value.line, ei.value.column) == (1, line.index(f'"{typo}"') + 1)
    assert f"unknown field {typo!r} (did you mean {meant!r}?)" in str(ei.value)


def test_lenient_fields_reads_a_trace_with_extra_fields(tmp_path: Path) -> None:
    rec = {**GOOD, "session_id": "conv-1", "text_input": "hi"}
    p = _lines(tmp_path / "t.jsonl", [json.dumps(rec)])
    with pytest.raises(UnknownFieldError, match="unknown field 'session_id'; the format's"):
        read_mooncake(p)
    assert len(read_mooncake(p, lenient_fields=True).requests) == 1
    assert len(load_workload(p, None, lenient_fields=True).requests) == 1
    q = _lines(tmp_path / "q.jsonl", [json.dumps({"prompt_token_ids": [1], "extra": [1]})])
    assert read_token_trace(q, lenient_fields=True).requests[0].prompt_len == 1
    # lenient reading still checks the fields the format knows
    r = _lines(tmp_path / "r.jsonl", [json.dumps({**rec, "input_length": 0})])
    with pytest.raises(TraceFormatError, match="'input_length' must be >= 1"):
        read_mooncake(r, lenient_fields=True)


def test_an_unguessable_first_line_suggests_the_field(tmp_path: Path) -> None:
    p = _lines(tmp_path / "t.jsonl", ['{"timestamp": 0, "hash_id": [1]}'])
    e = _error(p)
    assert e.column == 18 and "(did you mean 'hash_ids'?)" in str(e)


@pytest.mark.parametrize(
    "line",
    [
        '{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}',
        '{"prompt_token_ids": [1, 2], "output_length": 0}',
    ],
)
def test_zero_output_length_is_refused_not_rounded_up(tmp_path: Path, line: str) -> None:
    # was: a Mooncake output_length of 0 silently became 1
    p = _lines(tmp_path / "t.jsonl", [line])
    e = _error(p)
    assert e.column == line.index('"output_length": 0') + len('"output_length": ') + 1
    assert "'output_length' must be >= 1, got 0" in str(e) and "prefill-only" in str(e)


def test_null_optional_field_is_absent_required_is_refused(tmp_path: Path) -> None:
    p = _lines(tmp_path / "t.jsonl", ['{"prompt_token_ids": [1], "cache_salt": null}'])
    assert read_token_trace(p).requests[0].cache_salt is None
    q = _lines(tmp_path / "q.jsonl", ['{"timestamp": null, "input_length": 1}'])
    e = _error(q, "mooncake")
    assert e.column == 15 and "'timestamp' must be a finite" in str(e)


# --------------------------------------------------------------------------- properties

_WS = st.sampled_from(["", " ", "  ", "\t", "\r", " \r "])
#: Bad values of each field, and where in each the error stands (the first bad
#: element of a list).
_BAD = {
    "timestamp": [("-1", 0), ('"0"', 0), ("null", 0), ("1e400", 0), ("[0]", 0), ("true", 0)],
    "input_length": [("0", 0), ("-3", 0), ("1.5", 0), ('"10"', 0), ("null", 0), ("16777217", 0)],
    "output_length": [("0", 0), ("-1", 0), ("2.0", 0), ("null", 0), ("false", 0)],
    "hash_ids": [
        ("[]", 0), ("null", 0), ('"x"', 0), ("[1, -1]", 4), ("[1,\r\t1.5]", 5),
        ("[[1]]", 1), ("{}", 0), (str(2**63), 0), (f"[0, {2**63}]", 4),
    ],
}  # fmt: skip


def _render(record: dict[str, str], ws: list[str]) -> tuple[str, dict[str, int]]:
    """A JSON object from already-rendered values, with the given whitespace; also
    the column of every value."""
    text, cols = "{" + ws[0], {}
    for i, (k, v) in enumerate(record.items()):
        if i:
            text += "," + ws[(3 * i) % len(ws)]
        text += json.dumps(k) + ws[(3 * i + 1) % len(ws)] + ":" + ws[(3 * i + 2) % len(ws)]
        cols[k] = len(text) + 1
        text += v
    return text + ws[-1] + "}", cols


@settings(max_examples=120, deadline=None)
@given(
    n_lines=st.integers(1, 6),
    data=st.data(),
    ws=st.lists(_WS, min_size=4, max_size=8),
)
def test_first_bad_value_is_named_where_it_stands(
    tmp_path_factory: pytest.TempPathFactory, n_lines: int, data: st.DataObject, ws: list[str]
) -> None:
    """A Mooncake trace of good lines (random whitespace, random key order) with
    one bad value on one line: the error names that line and that value's column."""
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    bad_line = data.draw(st.integers(0, n_lines - 1))
    key = data.draw(st.sampled_from(sorted(_BAD)))
    bad, offset = data.draw(st.sampled_from(_BAD[key]))
    lines, where = [], 0
    for i in range(n_lines):
        rec = {k: json.dumps(v) for k, v in GOOD.items()}
        keys = list(rec)
        rng.shuffle(keys)
        rec = {k: rec[k] for k in keys}
        if i == bad_line:
            rec[key] = bad
        text, cols = _render(rec, ws)
        if i == bad_line:
            where = cols[key] + offset
        lines.append(text)
    p = tmp_path_factory.mktemp("pos") / "t.jsonl"
    _lines(p, lines)
    e = _error(p, "mooncake")
    assert (e.line, e.column) == (bad_line + 1, where), str(e)
    assert repr(key) in str(e) or "number 1e400" in str(e)


_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=6),
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=8), _values, max_size=5), ws=_WS)
def test_the_line_parser_reads_what_json_reads(
    tmp_path_factory: pytest.TempPathFactory, obj: dict[str, object], ws: str
) -> None:
    """Any JSON object, any separators: the reader's own top-level parse gives
    exactly ``json.loads``'s value."""
    line = json.dumps(obj, separators=("," + ws, ":" + ws), ensure_ascii=bool(len(ws) % 2))
    p = tmp_path_factory.mktemp("parse") / "t.jsonl"
    p.write_text(ws + line + ws + "\n", encoding="utf-8")
    (rec,) = list(read_records(p))
    assert rec == json.loads(line)
    text = ws + line
    for k, v in obj.items():  # every value's column is where that value starts
        assert json.JSONDecoder().raw_decode(text, rec.column(k) - 1)[0] == v
        assert json.JSONDecoder().raw_decode(text, rec.column(k, at_key=True) - 1)[0] == k


def test_field_tables_are_the_documented_ones() -> None:
    assert list(MOONCAKE_FIELDS) == ["timestamp", "input_length", "output_length", "hash_ids"]
    assert all(f.required for f in MOONCAKE_FIELDS.values())
    assert [k for k, f in TOKEN_FIELDS.items() if f.required] == ["prompt_token_ids"]
