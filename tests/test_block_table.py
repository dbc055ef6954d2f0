"""Tests for kvcoord.block_table: row operations, slot mapping, multi-group tables.

Every operation is checked against a naive pure-Python model; the hand-computed
cases come from the behaviour spec (section 8.8, scenarios 60-62, DCP out of
scope). CUDA tests run only when a GPU is present.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from kvcoord.block_table import (  # noqa: E402
    PAD_SLOT_ID,
    BlockTable,
    MultiGroupBlockTable,
    round_row_width,
)
from kvcoord.errors import (  # noqa: E402
    BlockTableError,
    BlockTableIndexError,
    ConfigError,
    InvalidBlockIdError,
    KvCoordError,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="torch.cuda.is_available() is False: no CUDA device on this machine"
)


# ---------------------------------------------------------------------------
# naive references
# ---------------------------------------------------------------------------


class Model:
    """Pure-Python model of one table: a list of kernel ids per row."""

    def __init__(self, rows: int, width: int, k: int = 1) -> None:
        self.rows: list[list[int]] = [[] for _ in range(rows)]
        self.width = width  # in kernel blocks
        self.k = k

    def expand(self, ids: list[int]) -> list[int]:
        return [b * self.k + j for b in ids for j in range(self.k)]

    def dense(self) -> list[list[int]]:
        return [r + [0] * (self.width - len(r)) for r in self.rows]

    def counts(self) -> list[int]:
        return [len(r) for r in self.rows]


def naive_slots(table: list[list[int]], bs: int, rows, positions, size: int) -> list[int]:
    out = [PAD_SLOT_ID] * size
    for i, (r, p) in enumerate(zip(rows, positions, strict=True)):
        out[i] = table[r][p // bs] * bs + p % bs
    return out


def assert_matches(table: BlockTable, model: Model) -> None:
    assert table.host_np.tolist() == model.dense()
    assert table.num_blocks_per_row.tolist() == model.counts()


def snapshot(table: BlockTable):
    return table.host_np.copy(), table.num_blocks_per_row.copy()


def assert_unchanged(table: BlockTable, snap) -> None:
    np.testing.assert_array_equal(table.host_np, snap[0])
    np.testing.assert_array_equal(table.num_blocks_per_row, snap[1])


def make(bs=16, reqs=4, width=8, tokens=64, **kw) -> BlockTable:
    return BlockTable(bs, reqs, width, tokens, "cpu", **kw)


# ---------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------


def test_construction_shapes_and_dtypes():
    t = make(bs=16, reqs=3, width=5, tokens=32)
    assert t.host_table.shape == (3, 5) and t.host_table.dtype == torch.int32
    assert t.host_np.dtype == np.int32 and not t.host_np.flags.writeable
    assert t.device_table.shape == (3, 5) and t.device_table.dtype == torch.int32
    assert t.device_table.data_ptr() != t.host_table.data_ptr()  # a separate mirror
    assert t.slot_mapping.shape == (32,) and t.slot_mapping.dtype == torch.int64
    assert (t.slot_mapping == PAD_SLOT_ID).all()
    assert t.num_blocks_per_row.tolist() == [0, 0, 0]
    assert not t.pin_memory  # never pinned for a CPU device
    assert not make(pin_memory=True).pin_memory
    assert "block_size=16" in repr(t)


@pytest.mark.parametrize(
    "args",
    [(0, 1, 1, 1), (16, 0, 1, 1), (16, 1, -1, 1), (16, 1, 1, 0), (1.5, 1, 1, 1), (True, 1, 1, 1)],
)
def test_bad_config(args):
    with pytest.raises(ConfigError):
        BlockTable(*args)


def test_bad_kernel_block_size():
    with pytest.raises(ConfigError, match="divide"):
        make(bs=16, kernel_block_size=6)


# §8.8 scenario 61 (rounding is an opt-in helper here)
@pytest.mark.parametrize(("blocks", "bs", "want"), [(10, 16, 16), (3, 48, 8), (100, 256, 100)])
def test_round_row_width(blocks, bs, want):
    assert round_row_width(blocks, bs) == want


# ---------------------------------------------------------------------------
# row operations
# ---------------------------------------------------------------------------


def test_scenario_62_row_operations():
    t = make(reqs=3, width=4)
    t.add_row([1, 2, 3], 0)
    t.append_row([4], 0)
    t.add_row([9], 1)
    assert t.num_blocks_per_row.tolist() == [4, 1, 0]
    assert t.host_np[0].tolist() == [1, 2, 3, 4] and t.host_np[1].tolist() == [9, 0, 0, 0]
    t.swap_row(0, 1)
    assert t.host_np[0].tolist() == [9, 0, 0, 0] and t.host_np[1].tolist() == [1, 2, 3, 4]
    assert t.num_blocks_per_row.tolist() == [1, 4, 0]
    t.move_row(0, 2)
    assert t.host_np[0].tolist() == [0, 0, 0, 0] and t.num_blocks(0) == 0
    assert t.host_np[2].tolist() == [9, 0, 0, 0] and t.num_blocks(2) == 1
    t.clear_row(1)
    assert t.host_np[1].tolist() == [0, 0, 0, 0] and t.num_blocks(1) == 0
    assert t.row(2).tolist() == [9]


def test_add_row_replaces_and_zeroes_old_tail():
    t = make(width=4)
    t.add_row([5, 6, 7], 1)
    t.add_row([8], 1)
    assert t.host_np[1].tolist() == [8, 0, 0, 0] and t.num_blocks(1) == 1
    t.add_row([], 1)
    assert t.host_np[1].tolist() == [0, 0, 0, 0] and t.num_blocks(1) == 0


def test_append_empty_is_noop_and_null_ids_kept():
    t = make(width=4)
    t.append_row([0, 0, 3], 0)
    t.append_row([], 0)
    t.append_row(np.array([], dtype=np.float64), 0)  # empty: dtype does not matter
    assert t.row(0).tolist() == [0, 0, 3]


def test_move_row_overwrites_dst_and_self_move_is_noop():
    t = make(width=4)
    t.add_row([1, 2, 3, 4], 0)
    t.add_row([7], 1)
    t.move_row(1, 0)
    assert t.host_np[0].tolist() == [7, 0, 0, 0] and t.host_np[1].tolist() == [0, 0, 0, 0]
    t.move_row(0, 0)
    t.swap_row(0, 0)
    assert t.row(0).tolist() == [7]


@pytest.mark.parametrize(
    "ids",
    [
        [3, 4],
        (3, 4),
        range(3, 5),
        np.array([3, 4], dtype=np.int32),
        np.array([3, 4], dtype=np.uint32),  # what BlockPool.get_new_blocks_array returns
        np.array([3, 4], dtype=np.int64),
        np.array([0, 3, 4, 0], dtype=np.int64)[1:3],  # non-contiguous is fine too
        torch.tensor([3, 4]),
    ],
)
def test_input_kinds(ids):
    t = make()
    t.add_row(ids, 2)
    assert t.row(2).tolist() == [3, 4]


def test_ids_from_block_pool():
    from kvcoord import BlockPool

    pool = BlockPool(64)
    ids = pool.get_new_blocks_array(5)
    t = make(width=8)
    t.add_row(ids, 0)
    t.append_row(pool.get_new_blocks(2), 0)
    assert t.num_blocks(0) == 7 and 0 not in t.row(0).tolist()


def test_clear_resets_both_sides():
    t = make()
    t.add_row([1, 2], 0)
    t.commit(1)
    t.clear()
    assert not t.host_np.any() and not t.device_table.any()
    assert t.num_blocks_per_row.tolist() == [0, 0, 0, 0]


def test_views_are_read_only():
    t = make()
    with pytest.raises(ValueError):
        t.host_np[0, 0] = 1
    with pytest.raises(ValueError):
        t.num_blocks_per_row[0] = 1


# ---------------------------------------------------------------------------
# errors leave the table unchanged
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "exc"),
    [
        (lambda t: t.append_row([1], 4), BlockTableIndexError),
        (lambda t: t.append_row([1], -1), BlockTableIndexError),
        (lambda t: t.add_row([1], 99), BlockTableIndexError),
        (lambda t: t.append_row([1], 1.0), BlockTableError),
        (lambda t: t.append_row([1], True), BlockTableError),
        # overflow: row 0 holds 3 of 4, appending 2 must not touch the count
        (lambda t: t.append_row([8, 9], 0), BlockTableError),
        (lambda t: t.add_row([1, 2, 3, 4, 5], 0), BlockTableError),
        (lambda t: t.append_row([5, -1], 0), InvalidBlockIdError),
        (lambda t: t.append_row(np.array([2**31], dtype=np.int64), 1), InvalidBlockIdError),
        (lambda t: t.append_row([1.5], 1), BlockTableError),
        (lambda t: t.append_row(np.array([1.0]), 1), BlockTableError),
        (lambda t: t.append_row(np.array([True]), 1), BlockTableError),
        (lambda t: t.append_row([2**70], 1), InvalidBlockIdError),
        (lambda t: t.append_row([[1, 2]], 1), BlockTableError),
        (lambda t: t.append_row([[1, 2], [3]], 1), BlockTableError),
        (lambda t: t.append_row(7, 1), BlockTableError),
        (lambda t: t.append_row(["a"], 1), BlockTableError),
        (lambda t: t.append_row([None], 1), BlockTableError),
        (lambda t: t.clear_row(4), BlockTableIndexError),
        (lambda t: t.move_row(0, 4), BlockTableIndexError),
        (lambda t: t.move_row(-1, 0), BlockTableIndexError),
        (lambda t: t.swap_row(0, 5), BlockTableIndexError),
        (lambda t: t.commit(5), BlockTableIndexError),
        (lambda t: t.commit(-1), BlockTableIndexError),
        (lambda t: t.num_blocks(4), BlockTableIndexError),
    ],
)
def test_errors_leave_table_unchanged(call, exc):
    t = make(reqs=4, width=4)
    t.add_row([1, 2, 3], 0)
    t.add_row([4], 1)
    t.commit(4)
    snap = snapshot(t)
    dev = t.device_table.clone()
    with pytest.raises(exc) as info:
        call(t)
    assert isinstance(info.value, KvCoordError)
    assert isinstance(info.value, ValueError)
    assert_unchanged(t, snap)
    assert torch.equal(t.device_table, dev)


def test_overflow_does_not_advance_count():
    # vLLM 0.33's v1 table bumps the count before the failing write (spec §9.1-7).
    t = make(width=2)
    t.append_row([1, 2], 0)
    with pytest.raises(BlockTableError, match="at most 2 blocks"):
        t.append_row([3], 0)
    assert t.num_blocks(0) == 2
    t.clear_row(0)
    t.append_row([3, 4], 0)
    assert t.row(0).tolist() == [3, 4]


def test_scenario_63_overflow_checked_before_writing():
    # §8.8 #63 (v2 semantics, which this table follows for both row kinds):
    # writing past the row capacity raises before anything is written, and an
    # overwrite (add_row) restarts at column 0.
    t = make(width=3)
    t.append_row([1, 2], 0)
    with pytest.raises(BlockTableError):
        t.append_row([3, 4], 0)
    assert t.row(0).tolist() == [1, 2]
    t.add_row([5, 6, 7], 0)
    assert t.row(0).tolist() == [5, 6, 7]


def test_index_error_is_index_error():
    with pytest.raises(IndexError):
        make().clear_row(10)


# ---------------------------------------------------------------------------
# property-based: random operation sequences against the model
# ---------------------------------------------------------------------------


@st.composite
def op_sequences(draw):
    reqs = draw(st.integers(1, 5))
    width = draw(st.integers(1, 6))
    k = draw(st.sampled_from([1, 2, 4]))
    row = st.integers(-1, reqs)  # includes out-of-range rows
    ids = st.lists(st.integers(-1, 40), max_size=width + 1)
    kinds = st.sampled_from(["add", "append", "clear", "move", "swap", "commit"])
    ops = draw(st.lists(st.tuples(kinds, row, row, ids), max_size=25))
    as_np = draw(st.booleans())
    return reqs, width, k, ops, as_np


def model_apply(m: Model, reqs: int, kind: str, a: int, b: int, ids: list[int]):
    """Apply one op to the model; return the exception class expected, or None."""
    in_range = range(reqs)
    if kind == "commit":
        return None if 0 <= a <= reqs else BlockTableIndexError
    if a not in in_range or (kind in ("move", "swap") and b not in in_range):
        return BlockTableIndexError
    if kind in ("add", "append"):
        if any(x < 0 for x in ids):
            return InvalidBlockIdError
        start = 0 if kind == "add" else len(m.rows[a])
        new = m.expand(ids)
        if start + len(new) > m.width:
            return BlockTableError
        m.rows[a] = m.rows[a][:start] + new
    elif kind == "clear":
        m.rows[a] = []
    elif kind == "move" and a != b:
        m.rows[b], m.rows[a] = m.rows[a], []
    elif kind == "swap":
        m.rows[a], m.rows[b] = m.rows[b], m.rows[a]
    return None


def run_op(t: BlockTable, kind: str, a: int, b: int, ids) -> None:
    if kind == "add":
        t.add_row(ids, a)
    elif kind == "append":
        t.append_row(ids, a)
    elif kind == "clear":
        t.clear_row(a)
    elif kind == "move":
        t.move_row(a, b)
    elif kind == "swap":
        t.swap_row(a, b)
    else:
        t.commit(a)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_sequences())
def test_random_row_operations_match_model(case):
    reqs, width, k, ops, as_np = case
    t = BlockTable(16 * k, reqs, width, 8, "cpu", kernel_block_size=16)
    m = Model(reqs, width * k, k)
    for kind, a, b, ids in ops:
        snap = snapshot(t)
        want = model_apply(m, reqs, kind, a, b, ids)
        arg = np.array(ids, dtype=np.int64) if as_np else ids
        call = functools.partial(run_op, t, kind, a, b, arg)
        if want is None:
            call()
        else:
            with pytest.raises(want):
                call()
            assert_unchanged(t, snap)
        assert_matches(t, m)
    t.commit(reqs)
    assert t.device_table.tolist() == m.dense()


# ---------------------------------------------------------------------------
# slot mapping
# ---------------------------------------------------------------------------


def test_scenario_60_single_row():
    t = BlockTable(16, 2, 4, 8, "cpu")
    t.add_row([5, 6, 7], 0)
    t.commit(1)
    out = t.compute_slot_mapping([0, 15, 16, 47], rows=[0, 0, 0, 0])
    assert out.tolist() == [80, 95, 96, 127, -1, -1, -1, -1]
    out = t.compute_slot_mapping(np.array([0, 15, 16, 47]), query_start_loc=[0, 4])
    assert out.tolist() == [80, 95, 96, 127, -1, -1, -1, -1]


def test_scenario_60_two_rows():
    t = BlockTable(16, 2, 2, 4, "cpu")
    t.add_row([9, 2], 0)
    t.add_row([7, 4], 1)
    t.commit(2)
    assert t.compute_slot_mapping([3, 20], query_start_loc=[0, 1, 2]).tolist() == [147, 68, -1, -1]
    assert t.compute_slot_mapping([20, 3], rows=[1, 0]).tolist() == [68, 147, -1, -1]


def test_scenario_60_long_request_and_padding():
    t = BlockTable(16, 1, 65, 2048, "cpu")
    t.add_row(np.arange(1, 66), 0)
    t.commit(1)
    out = t.compute_slot_mapping(np.arange(1030), query_start_loc=[0, 1030])
    assert out[1023].item() == 1039 and out[1024].item() == 1040
    assert torch.equal(out[:1030], torch.arange(1030) + 16)
    assert (out[1030:] == PAD_SLOT_ID).all()  # also across the 1024-token tile


def test_slot_mapping_reads_committed_table_and_reuses_buffer():
    t = make()
    t.add_row([3], 0)
    t.commit(1)
    first = t.compute_slot_mapping([1], rows=[0])
    assert first[0].item() == 49
    t.add_row([4], 0)  # not committed yet
    assert t.compute_slot_mapping([1], rows=[0])[0].item() == 49
    t.commit(1)
    again = t.compute_slot_mapping([1, 2], rows=[0, 0])
    assert again is first and again[:3].tolist() == [65, 66, -1]
    # a shorter step pads the entries the longer one had written
    assert t.compute_slot_mapping([], rows=[]).tolist() == [-1] * 64


@pytest.mark.parametrize("numpy_path", [True, False])
def test_slot_is_int64_past_int32(numpy_path):
    t = BlockTable(16, 1, 2, 4, "cpu")
    t._numpy_slots = numpy_path
    t.add_row([2**31 - 1, 0], 0)
    t.commit(1)
    out = t.compute_slot_mapping([15, 16], query_start_loc=[0, 2])
    assert out[:3].tolist() == [(2**31 - 1) * 16 + 15, 0, -1]


def test_slot_mapping_empty_requests_in_qsl():
    t = make()
    t.add_row([1], 0)
    t.add_row([2], 2)
    t.commit(3)
    out = t.compute_slot_mapping([0, 1, 5], query_start_loc=[0, 2, 2, 3])
    assert out[:4].tolist() == [16, 17, 37, -1]


def test_slot_mapping_tensor_inputs():
    t = make()
    t.add_row([2, 3], 1)
    t.commit(2)
    pos = torch.tensor([0, 17], dtype=torch.int32)
    assert t.compute_slot_mapping(pos, rows=torch.tensor([1, 1]))[:2].tolist() == [32, 49]
    qsl = torch.tensor([0, 0, 2], dtype=torch.int32)
    assert t.compute_slot_mapping(pos, query_start_loc=qsl)[:2].tolist() == [32, 49]


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"positions": [0], "rows": [4]}, BlockTableIndexError),
        ({"positions": [0], "rows": [-1]}, BlockTableIndexError),
        ({"positions": [-1], "rows": [0]}, BlockTableIndexError),
        ({"positions": [16 * 8], "rows": [0]}, BlockTableIndexError),  # past the row width
        ({"positions": [0, 1], "rows": [0]}, BlockTableError),
        ({"positions": [0]}, BlockTableError),
        ({"positions": [0], "rows": [0], "query_start_loc": [0, 1]}, BlockTableError),
        ({"positions": list(range(65)), "query_start_loc": [0, 65]}, BlockTableIndexError),
        ({"positions": [0, 1], "query_start_loc": [0, 1]}, BlockTableError),
        ({"positions": [0, 1], "query_start_loc": [1, 2]}, BlockTableError),
        ({"positions": [0, 1], "query_start_loc": [0, 2, 1, 2]}, BlockTableError),
        ({"positions": [0], "query_start_loc": [0, 0, 0, 0, 0, 1]}, BlockTableIndexError),
        ({"positions": [0], "query_start_loc": []}, BlockTableIndexError),
        ({"positions": [0.5], "rows": [0]}, BlockTableError),
        ({"positions": [[0]], "rows": [0]}, BlockTableError),
        ({"positions": torch.tensor([0.0]), "rows": [0]}, BlockTableError),
        ({"positions": [0], "rows": torch.tensor([True])}, BlockTableError),
    ],
)
def test_slot_mapping_errors(kwargs, exc):
    t = make()
    t.add_row([1], 0)
    t.commit(1)
    before = t.compute_slot_mapping([3], rows=[0]).clone()
    with pytest.raises(exc):
        t.compute_slot_mapping(**kwargs)
    assert torch.equal(t.slot_mapping, before)


@st.composite
def slot_cases(draw):
    bs = draw(st.sampled_from([1, 2, 3, 8, 16, 32, 48]))
    reqs = draw(st.integers(1, 6))
    width = draw(st.integers(1, 6))
    rows = [draw(st.lists(st.integers(0, 1000), max_size=width)) for _ in range(reqs)]
    # per request: a contiguous run of positions inside the row width
    runs = []
    for _ in range(reqs):
        start = draw(st.integers(0, width * bs - 1))
        runs.append(list(range(start, draw(st.integers(start, width * bs)))))
    return bs, width, rows, runs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot_cases(), st.sampled_from(["list", "numpy", "tensor"]), st.booleans())
def test_slot_mapping_matches_naive(case, kind, numpy_path):
    bs, width, rows, runs = case
    total = sum(len(r) for r in runs)
    size = total + 5
    t = BlockTable(bs, len(rows), width, size, "cpu")
    t._numpy_slots = numpy_path  # False: the torch path CUDA devices take
    for r, ids in enumerate(rows):
        t.add_row(ids, r)
    t.commit(len(rows))
    dense = t.host_np.tolist()
    positions = [p for run in runs for p in run]
    token_rows = [r for r, run in enumerate(runs) for _ in run]
    qsl = np.concatenate([[0], np.cumsum([len(r) for r in runs])])
    conv = {
        "list": lambda x: list(map(int, x)),
        "numpy": lambda x: np.asarray(x, dtype=np.int64),
        "tensor": lambda x: torch.as_tensor(np.asarray(x, dtype=np.int64)),
    }[kind]
    want = naive_slots(dense, bs, token_rows, positions, size)
    assert t.compute_slot_mapping(conv(positions), rows=conv(token_rows)).tolist() == want
    assert t.compute_slot_mapping(conv(positions), query_start_loc=conv(qsl)).tolist() == want


# ---------------------------------------------------------------------------
# batched row writes
# ---------------------------------------------------------------------------


@st.composite
def batch_cases(draw):
    reqs = draw(st.integers(1, 6))
    width = draw(st.integers(1, 5))
    k = draw(st.sampled_from([1, 2]))
    pre = [draw(st.lists(st.integers(0, 99), max_size=width)) for _ in range(reqs)]
    rows = draw(st.lists(st.integers(0, reqs - 1), unique=True, max_size=reqs))
    ids = [draw(st.lists(st.integers(0, 99), max_size=width)) for _ in rows]
    kind = draw(st.sampled_from(["list", "numpy", "tuple"]))
    return reqs, width, k, pre, rows, ids, kind


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_cases(), st.booleans())
def test_batched_writes_match_per_row(case, overwrite):
    reqs, width, k, pre, rows, ids, kind = case
    a = BlockTable(16 * k, reqs, width, 8, "cpu", kernel_block_size=16)
    b = BlockTable(16 * k, reqs, width, 8, "cpu", kernel_block_size=16)
    for r, p in enumerate(pre):
        a.add_row(p, r)
        b.add_row(p, r)
    conv = {"list": list, "numpy": np.array, "tuple": tuple}[kind]
    per_row = [conv(x) for x in ids]
    fits = all(
        (0 if overwrite else len(pre[r])) + len(x) <= width for r, x in zip(rows, ids, strict=True)
    )
    snap = snapshot(a)
    batch = a.add_rows if overwrite else a.append_rows
    if not fits:
        with pytest.raises(BlockTableError):
            batch(per_row, rows)
        assert_unchanged(a, snap)
        return
    batch(per_row, np.array(rows, dtype=np.int64))
    for r, x in zip(rows, per_row, strict=True):
        (b.add_row if overwrite else b.append_row)(x, r)
    np.testing.assert_array_equal(a.host_np, b.host_np)
    np.testing.assert_array_equal(a.num_blocks_per_row, b.num_blocks_per_row)


@pytest.mark.parametrize(
    ("ids", "rows", "exc"),
    [
        ([[1], [2]], [0, 0], BlockTableError),  # repeated row
        ([[1], [2]], [0], BlockTableError),
        ([[1], [2]], [0, 4], BlockTableIndexError),
        ([[1], [2]], [-1, 0], BlockTableIndexError),
        ([[1], [2, 3, 4, 5]], [0, 1], BlockTableError),  # second row overflows
        ([[1], [-2]], [2, 3], InvalidBlockIdError),
        ([[1], 2], [2, 3], BlockTableError),
        ([[1], [[2]]], [2, 3], BlockTableError),
        ([[1], [2.5]], [2, 3], BlockTableError),
        ([np.array([1]), np.array([[2]])], [2, 3], BlockTableError),
        ("ab", [2, 3], BlockTableError),
        (5, [2], BlockTableError),
        ([[1]], [1.0], BlockTableError),
    ],
)
def test_batched_errors_leave_table_unchanged(ids, rows, exc):
    t = make(reqs=4, width=3)
    t.add_row([7, 8], 0)
    t.add_row([9, 9], 1)
    snap = snapshot(t)
    for call in (t.add_rows, t.append_rows):
        with pytest.raises(exc):
            call(ids, rows)
        assert_unchanged(t, snap)


def test_batched_write_examples():
    t = make(reqs=4, width=4)
    t.add_rows([[1, 2, 3], np.array([4], dtype=np.uint32)], [0, 2])
    t.append_rows(([5], (), [6, 7]), np.array([0, 1, 2]))
    assert t.host_np.tolist() == [[1, 2, 3, 5], [0, 0, 0, 0], [4, 6, 7, 0], [0, 0, 0, 0]]
    t.add_rows([[9]], [0])  # shorter than before: old tail zeroed
    assert t.host_np[0].tolist() == [9, 0, 0, 0] and t.num_blocks(0) == 1
    t.add_rows([], [])
    assert t.num_blocks_per_row.tolist() == [1, 0, 3, 0]


# ---------------------------------------------------------------------------
# commit: non-blocking, no synchronisation
# ---------------------------------------------------------------------------


class RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        return func(*args, **kwargs)


def test_commit_issues_one_non_blocking_copy_of_used_rows():
    t = make(reqs=4, width=3)
    t.add_row([1, 2], 0)
    t.add_row([3], 1)
    t.add_row([9], 3)
    with RecordOps() as rec:
        t.commit(2)
    copies = [(a, kw) for f, a, kw in rec.calls if f is torch.ops.aten.copy_.default]
    assert len(copies) == 1
    args, kw = copies[0]
    assert kw.get("non_blocking", args[2] if len(args) > 2 else False) is True
    assert args[1].shape == (2, 3)  # only the used rows travel
    names = {str(f) for f, _, _ in rec.calls}
    assert not any("_local_scalar_dense" in n for n in names)  # no .item()/sync
    assert t.device_table.tolist() == [[1, 2, 0], [3, 0, 0], [0, 0, 0], [0, 0, 0]]
    t.commit(0)  # no-op


def test_slot_mapping_with_device_tensors_does_not_synchronise():
    t = make()
    t.add_row([1, 2], 0)
    t.commit(1)
    pos = torch.tensor([0, 17])
    qsl = torch.tensor([0, 2])
    with RecordOps() as rec:
        t.compute_slot_mapping(pos, query_start_loc=qsl)
        t.compute_slot_mapping(pos, rows=torch.tensor([0, 0]))
    names = [str(f) for f, _, _ in rec.calls]
    # host tensors are checked on the host (numpy), never via .item() on tensors
    assert not any("_local_scalar_dense" in n or "nonzero" in n for n in names)
    assert t.slot_mapping[:3].tolist() == [16, 33, -1]


# ---------------------------------------------------------------------------
# multi-group tables
# ---------------------------------------------------------------------------


def test_multi_group_one_call_updates_all_groups():
    mg = MultiGroupBlockTable([16, 32], 3, [4, 2], 16)
    assert len(mg) == 2 and [t.block_size for t in mg] == [16, 32]
    mg.add_row(([1, 2, 3], np.array([0, 7], dtype=np.uint32)), 0)  # null id 0 kept
    mg.append_row(((4,), []), 0)
    assert mg[0].row(0).tolist() == [1, 2, 3, 4] and mg[1].row(0).tolist() == [0, 7]
    mg.add_row([[5], [6]], 1)
    mg.swap_row(0, 1)
    assert mg[0].row(0).tolist() == [5] and mg[1].row(1).tolist() == [0, 7]
    mg.move_row(1, 2)
    assert mg[0].num_blocks(1) == 0 and mg[1].row(2).tolist() == [0, 7]
    mg.clear_row(2)
    assert mg[0].num_blocks(2) == 0 and mg[1].num_blocks(2) == 0
    mg.add_row(([1, 2], [3]), 1)
    mg.commit(2)
    slots = mg.compute_slot_mapping([0, 17], query_start_loc=[0, 0, 2])
    assert slots[0][:3].tolist() == [16, 33, -1]
    assert slots[1][:3].tolist() == [96, 113, -1]
    mg.clear()
    assert not mg[0].device_table.any() and not mg[1].host_np.any()


@pytest.mark.parametrize(
    ("ids", "exc"),
    [
        (([1],), BlockTableError),  # wrong number of groups
        (([1], [2], [3]), BlockTableError),
        (([1], [2, 3, 4]), BlockTableError),  # second group overflows
        (([1], [-2]), InvalidBlockIdError),
        (([1], [1.5]), BlockTableError),
        (5, BlockTableError),
        ("ab", BlockTableError),
    ],
)
def test_multi_group_bad_group_changes_nothing(ids, exc):
    mg = MultiGroupBlockTable([16, 32], 2, 2, 8)
    mg.add_row(([9], [8]), 0)
    snaps = [snapshot(t) for t in mg]
    with pytest.raises(exc):
        mg.append_row(ids, 0)
    for t, s in zip(mg, snaps, strict=True):
        assert_unchanged(t, s)
    with pytest.raises(BlockTableIndexError):
        mg.move_row(0, 2)
    with pytest.raises(BlockTableIndexError):
        mg.commit(3)


def test_multi_group_batched():
    mg = MultiGroupBlockTable([16, 32], 3, 4, 16, kernel_block_sizes=[None, 16])
    mg.add_rows(([[1, 2], [3]], [[0, 4], [5]]), [0, 2])
    assert mg[0].row(0).tolist() == [1, 2] and mg[0].row(2).tolist() == [3]
    assert mg[1].row(0).tolist() == [0, 1, 8, 9] and mg[1].row(2).tolist() == [10, 11]
    snaps = [snapshot(t) for t in mg]
    with pytest.raises(BlockTableError):  # group 1 row 0 would exceed 4 blocks
        mg.append_rows(([[1], [1]], [[1, 2, 3], [1]]), [0, 2])
    for t, s in zip(mg, snaps, strict=True):
        assert_unchanged(t, s)


def test_multi_group_bad_config():
    with pytest.raises(ConfigError):
        MultiGroupBlockTable([], 2, 2, 8)
    with pytest.raises(ConfigError):
        MultiGroupBlockTable([16, 32], 2, [2], 8)
    with pytest.raises(ConfigError):
        MultiGroupBlockTable([16], 2, 2, 8, kernel_block_sizes=[16, 16])


def test_kernel_block_split():
    # manager block b -> kernel blocks b*k .. b*k+k-1 (spec §7.1 last paragraph)
    t = BlockTable(64, 2, 3, 256, "cpu", kernel_block_size=16)
    assert t.width == 12 and t.blocks_per_manager_block == 4
    t.add_row([0, 5], 0)
    assert t.row(0).tolist() == [0, 1, 2, 3, 20, 21, 22, 23]
    t.append_row([1], 0)
    assert t.num_blocks(0) == 12
    with pytest.raises(BlockTableError):
        t.append_row([2], 0)  # counted in manager blocks: 3 of 3 used
    with pytest.raises(InvalidBlockIdError):
        t.add_row([2**31 // 4], 1)  # fits int32, its kernel ids do not


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([(64, 16), (32, 8), (48, 16), (16, 16)]),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=4),
    st.data(),
)
def test_kernel_split_slots_equal_manager_slots(sizes, ids, data):
    bs, kbs = sizes
    mg = MultiGroupBlockTable([bs, bs], 1, 4, 32, kernel_block_sizes=[None, kbs])
    mg.add_row((ids, ids), 0)
    mg.commit(1)
    positions = data.draw(st.lists(st.integers(0, len(ids) * bs - 1), max_size=32))
    plain, split = mg.compute_slot_mapping(positions, rows=[0] * len(positions))
    assert torch.equal(plain, split)
    assert plain.tolist() == naive_slots([ids], bs, [0] * len(positions), positions, 32)


# ---------------------------------------------------------------------------
# packaging
# ---------------------------------------------------------------------------


def test_import_kvcoord_without_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # make `import torch` fail
        import kvcoord
        assert "kvcoord.block_table" not in sys.modules
        try:
            import kvcoord.block_table
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported without torch")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "kvcoord[torch]" in out.stdout


# ---------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------


@pytest.mark.cuda
@needs_cuda
def test_cuda_table_pinned_and_slots_match_cpu():
    kw = {"max_num_reqs": 8, "max_num_blocks_per_req": 16, "max_num_batched_tokens": 256}
    gpu = BlockTable(16, device="cuda", **kw)
    cpu = BlockTable(16, device="cpu", **kw)
    assert gpu.pin_memory and gpu.host_table.is_pinned()
    assert gpu.device_table.is_cuda and gpu.slot_mapping.is_cuda
    assert not BlockTable(16, device="cuda", pin_memory=False, **kw).host_table.is_pinned()
    rng = np.random.default_rng(0)
    for r in range(8):
        ids = rng.integers(0, 5000, size=rng.integers(1, 17))
        gpu.add_row(ids, r)
        cpu.add_row(ids, r)
    gpu.commit(8)
    cpu.commit(8)
    gpu.append_row([1], 0)  # waits for the copy's event, never races it
    pos = np.concatenate(
        [np.arange(cpu.num_blocks(r) * 16 - 3, cpu.num_blocks(r) * 16) for r in range(8)]
    )
    qsl = np.arange(0, 25, 3)
    want = cpu.compute_slot_mapping(pos, query_start_loc=qsl).tolist()
    assert gpu.compute_slot_mapping(pos, query_start_loc=qsl).cpu().tolist() == want
    dev_pos = torch.as_tensor(pos, device="cuda")
    dev_qsl = torch.as_tensor(qsl, device="cuda", dtype=torch.int32)
    assert gpu.compute_slot_mapping(dev_pos, query_start_loc=dev_qsl).cpu().tolist() == want
    # the uncommitted append is not on the device yet
    assert torch.equal(gpu.device_table.cpu(), cpu.device_table)
    gpu.commit(1)
    assert gpu.device_table[0].cpu().tolist() == gpu.host_np[0].tolist()


@pytest.mark.cuda
@needs_cuda
def test_cuda_commit_does_not_synchronise(monkeypatch):
    t = BlockTable(16, 4, 4, 16, "cuda")
    t.add_row([1, 2], 0)

    def boom(*a, **k):
        raise AssertionError("synchronised on the hot path")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", boom)
    t.commit(1)
    t.compute_slot_mapping(
        torch.tensor([0, 17], device="cuda"), rows=torch.tensor([0, 0], device="cuda")
    )
    monkeypatch.undo()
    assert t.slot_mapping[:3].cpu().tolist() == [16, 33, -1]
