"""Block tables fed with manager results (KVCacheBlocks) and step slot mappings.

A ``KVCacheBlocks`` is trusted (its ids were validated by the pool or by its
own constructors): it is written without re-checking ids, but the table's own
rules (rows in range, rows not overflowing, everything checked before any
write) still hold. Results are compared with the checked list path.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import kvcoord.block_table.table as table_mod  # noqa: E402
from kvcoord import KVCacheBlocks  # noqa: E402
from kvcoord.block_table import (  # noqa: E402
    PAD_SLOT_ID,
    BlockTable,
    MultiGroupBlockTable,
    step_positions,
)
from kvcoord.errors import (  # noqa: E402
    BlockTableError,
    BlockTableIndexError,
    InvalidBlockIdError,
)


def kvb(*groups: list[int]) -> KVCacheBlocks:
    return KVCacheBlocks.from_lists(groups)


def snapshots(mg: MultiGroupBlockTable):
    return [(t.host_np.copy(), t.num_blocks_per_row.copy()) for t in mg]


def assert_unchanged(mg: MultiGroupBlockTable, snaps) -> None:
    for t, (table, counts) in zip(mg, snaps, strict=True):
        assert np.array_equal(t.host_np, table)
        assert np.array_equal(t.num_blocks_per_row, counts)


@pytest.fixture
def no_id_checks(monkeypatch):
    """Make the checked-id helpers fail: a trusted write must not call them."""

    def boom(*a, **k):
        raise AssertionError("a KVCacheBlocks was re-validated")

    monkeypatch.setattr(table_mod, "as_block_ids", boom)
    monkeypatch.setattr(table_mod, "flatten_block_ids", boom)


def test_one_row_from_manager_results(no_id_checks):
    mg = MultiGroupBlockTable([16, 32], 3, 4, 16)
    mg.add_row(kvb([1, 2], [0, 7]), 0)
    mg.append_row(kvb([3], []), 0)
    mg.append_row(KVCacheBlocks.empty(2), 0)
    assert mg[0].row(0).tolist() == [1, 2, 3] and mg[1].row(0).tolist() == [0, 7]
    mg.add_row(kvb([9], [8]), 0)  # replaces, old tail zeroed
    assert mg[0].host_np[0].tolist() == [9, 0, 0, 0] and mg[1].row(0).tolist() == [8]
    t = BlockTable(16, 2, 4, 8)
    t.append_row(kvb([5, 6]), 1)
    assert t.row(1).tolist() == [5, 6]


def test_batched_from_manager_results(no_id_checks):
    mg = MultiGroupBlockTable([16, 32], 4, 4, 16)
    mg.add_blocks([kvb([1, 2], [3]), kvb([], [4]), kvb([5], [])], np.array([3, 0, 1]))
    mg.append_blocks((kvb([6], [7, 8]), kvb([9], [])), [3, 1])
    mg.append_blocks([], [])
    assert [mg[0].row(r).tolist() for r in range(4)] == [[], [5, 9], [], [1, 2, 6]]
    assert [mg[1].row(r).tolist() for r in range(4)] == [[4], [], [], [3, 7, 8]]
    mg.add_blocks([kvb([4], [])], [3])
    assert mg[0].host_np[3].tolist() == [4, 0, 0, 0] and mg[1].num_blocks(3) == 0
    before = snapshots(mg)
    mg.append_blocks([KVCacheBlocks.empty(2)] * 3, [0, 1, 2])  # a decode step, no new block
    assert_unchanged(mg, before)
    one = MultiGroupBlockTable([16], 3, 4, 16)
    one.append_blocks([kvb([1]), kvb([]), kvb([2, 3])], [2, 0, 1])
    assert [one[0].row(r).tolist() for r in range(3)] == [[], [2, 3], [1]]


@pytest.mark.parametrize(
    ("call", "args", "exc"),
    [
        ("append_row", (kvb([1]), 0), BlockTableError),  # one group for two
        ("append_row", (kvb([1], [2], [3]), 0), BlockTableError),
        ("append_row", (kvb([1], [2, 3, 4]), 0), BlockTableError),  # group 1 overflows
        ("append_row", (kvb([1], [2]), 2), BlockTableIndexError),
        ("add_row", (kvb([1, 2, 3], []), 1), BlockTableError),  # group 0 overflows
        ("append_blocks", ([kvb([1], [2]), kvb([1], [1])], [0, 1]), BlockTableError),
        ("append_blocks", ([kvb([], []), kvb([1], [1])], [1, 1]), BlockTableError),
        ("append_blocks", ([kvb([1], [2])], [0, 1]), BlockTableError),
        ("append_blocks", ([kvb([1], [2])], [2]), BlockTableIndexError),
        ("append_blocks", ([kvb([1], [2])], [-1]), BlockTableIndexError),
        ("append_blocks", ([kvb([1], [2]), [[1], [2]]], [0, 1]), BlockTableError),
        ("append_blocks", ([kvb([1], [2]), None], [0, 1]), BlockTableError),
        ("append_blocks", (kvb([1], [2]), [0]), BlockTableError),
        ("add_blocks", ([kvb([1], [2]), kvb([1], [2], [3])], [0, 1]), BlockTableError),
        ("add_blocks", ([kvb([1], [2, 2, 2])], [1]), BlockTableError),
        ("append_blocks", ([kvb([], []), KVCacheBlocks.empty(3)], [0, 1]), BlockTableError),
        ("append_blocks", ([KVCacheBlocks.empty(1)], [0]), BlockTableError),
    ],
)
def test_errors_leave_every_group_unchanged(call, args, exc):
    mg = MultiGroupBlockTable([16, 32], 2, 2, 8)
    mg.add_row(kvb([9], [8]), 0)
    mg.add_row(kvb([7, 6], [5]), 1)
    snaps = snapshots(mg)
    with pytest.raises(exc):
        getattr(mg, call)(*args)
    assert_unchanged(mg, snaps)


def test_one_group_table_takes_batches_of_results(no_id_checks):
    t = BlockTable(64, 3, 2, 8, kernel_block_size=32)
    t.add_blocks([kvb([1]), kvb([2, 3])], [2, 0])
    t.append_blocks([kvb([]), kvb([4])], np.array([0, 2]))
    assert [t.row(r).tolist() for r in range(3)] == [[4, 5, 6, 7], [], [2, 3, 8, 9]]
    before = t.host_np.copy(), t.num_blocks_per_row.copy()
    for blocks, rows in [
        ([kvb([1], [2])], [1]),  # two groups for one
        ([kvb([1, 2, 3])], [1]),  # overflow
        ([kvb([1]), kvb([1])], [1, 1]),  # repeated row
        ([kvb([1])], [3]),
        ([[1]], [1]),
        (kvb([1]), [1]),
    ]:
        with pytest.raises(BlockTableError):
            t.append_blocks(blocks, rows)
        assert np.array_equal(t.host_np, before[0])
        assert np.array_equal(t.num_blocks_per_row, before[1])


def test_one_group_table_refuses_multi_group_results():
    t = BlockTable(16, 2, 4, 8)
    with pytest.raises(BlockTableError):
        t.append_row(kvb([1], [2]), 0)
    assert t.num_blocks(0) == 0


def test_kernel_split_applies_to_trusted_ids():
    mg = MultiGroupBlockTable([64, 16], 2, 3, 64, kernel_block_sizes=[16, None])
    mg.append_blocks([kvb([0, 5], [5])], [0])
    assert mg[0].row(0).tolist() == [0, 1, 2, 3, 20, 21, 22, 23] and mg[1].row(0).tolist() == [5]
    snaps = snapshots(mg)
    with pytest.raises(InvalidBlockIdError):  # fits int32, its kernel ids do not
        mg.append_blocks([kvb([2**31 // 4], [1])], [1])
    assert_unchanged(mg, snaps)


@st.composite
def step_batches(draw):
    """A few steps of (rows, per-row id lists per group) on a 2-group table."""
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.lists(st.integers(0, 5), unique=True, max_size=6))
        ids = [[draw(st.lists(st.integers(0, 10**6), max_size=3)) for _ in range(2)] for _ in rows]
        steps.append((rows, ids, draw(st.booleans())))
    return steps


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step_batches())
def test_trusted_batches_equal_checked_lists(steps):
    """append_blocks/add_blocks give the table that append_rows/add_rows give
    from the same ids as lists (the checked path)."""
    trusted = MultiGroupBlockTable([16, 32], 6, 12, 8, kernel_block_sizes=[None, 16])
    checked = MultiGroupBlockTable([16, 32], 6, 12, 8, kernel_block_sizes=[None, 16])
    for rows, ids, overwrite in steps:
        blocks = [KVCacheBlocks.from_lists(per_group) for per_group in ids]
        per_group = [[row_ids[g] for row_ids in ids] for g in range(2)]
        if overwrite:
            trusted.add_blocks(blocks, rows)
            checked.add_rows(per_group, rows)
        else:
            trusted.append_blocks(blocks, rows)
            checked.append_rows(per_group, rows)
        for a, b in zip(trusted, checked, strict=True):
            assert np.array_equal(a.host_np, b.host_np)
            assert np.array_equal(a.num_blocks_per_row, b.num_blocks_per_row)


# ---------------------------------------------------------------------------
# step slot mapping
# ---------------------------------------------------------------------------


def test_step_positions():
    pos, qsl = step_positions([5, 0, 7], [3, 0, 2])
    assert pos.tolist() == [5, 6, 7, 7, 8] and qsl.tolist() == [0, 3, 3, 5]
    pos, qsl = step_positions(np.array([], dtype=np.int64), [])
    assert pos.shape == (0,) and qsl.tolist() == [0]
    with pytest.raises(BlockTableError):
        step_positions([1, 2], [1])
    with pytest.raises(BlockTableError):
        step_positions([-1], [1])
    with pytest.raises(BlockTableError):
        step_positions([1], [-1])
    with pytest.raises(BlockTableError):
        step_positions([1.5], [1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_step_slot_mapping_equals_explicit_positions(data):
    bs = data.draw(st.sampled_from([1, 4, 16]))
    t = BlockTable(bs, 4, 4, 32)
    for r in range(4):
        t.add_row(data.draw(st.lists(st.integers(1, 999), min_size=4, max_size=4)), r)
    t.commit(4)
    rows = data.draw(st.lists(st.integers(0, 3), unique=True, max_size=4))
    computed = [data.draw(st.integers(0, 4 * bs - 1)) for _ in rows]
    counts = [data.draw(st.integers(0, min(8, 4 * bs - c))) for c in computed]
    want = [PAD_SLOT_ID] * 32
    i = 0
    for r, c, n in zip(rows, computed, counts, strict=True):
        for p in range(c, c + n):
            want[i] = int(t.host_np[r, p // bs]) * bs + p % bs
            i += 1
    assert t.compute_step_slot_mapping(computed, counts, rows=rows).tolist() == want
    if rows == list(range(len(rows))):  # request i in row i: no rows needed
        assert t.compute_step_slot_mapping(computed, counts).tolist() == want


def test_step_slot_mapping_multi_group_and_errors():
    mg = MultiGroupBlockTable([16, 32], 3, 2, 8)
    mg.add_row(kvb([1, 2], [3]), 2)
    mg.commit(3)
    a, b = mg.compute_step_slot_mapping([15], [2], rows=[2])
    assert a[:3].tolist() == [31, 32, PAD_SLOT_ID] and b[:3].tolist() == [111, 112, PAD_SLOT_ID]
    with pytest.raises(BlockTableError):
        mg.compute_step_slot_mapping([15], [2], rows=[2, 1])
    with pytest.raises(BlockTableIndexError):
        mg.compute_step_slot_mapping([15], [2], rows=[3])
    with pytest.raises(BlockTableIndexError):  # position 32 beyond group 0's 2 blocks
        mg.compute_step_slot_mapping([31], [2], rows=[2])
    with pytest.raises(BlockTableIndexError):  # more tokens than the buffer holds
        mg.compute_step_slot_mapping([0, 0], [5, 4], rows=[0, 1])


def test_modules_import_one_way():
    """ids <- slots <- table <- multi_group: no module imports a later one."""
    import ast
    from pathlib import Path

    import kvcoord.block_table as pkg

    order = ["ids", "slots", "table", "multi_group"]
    root = Path(pkg.__file__).parent
    for i, name in enumerate(order):
        tree = ast.parse((root / f"{name}.py").read_text())
        used = {
            node.module.rsplit(".", 1)[-1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("kvcoord.block_table")
        }
        assert used <= set(order[:i]), (name, used)
        assert "kvcoord.block_table" not in {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
        }  # never the package itself


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="torch.cuda.is_available() is False: no CUDA device on this machine",
)
def test_cuda_step_from_results_matches_cpu():
    tables = [MultiGroupBlockTable([16, 32], 4, 8, 64, device=d) for d in ("cpu", "cuda")]
    steps = [
        ([kvb([1, 2], [3]), kvb([4], [5]), kvb([], [])], [0, 2, 3], [0, 0, 0], [20, 9, 0]),
        ([kvb([6], [9]), KVCacheBlocks.empty(2), kvb([7], [8])], [0, 2, 3], [20, 9, 0], [17, 1, 1]),
    ]
    for blocks, rows, computed, scheduled in steps:
        out = []
        for mg in tables:
            mg.append_blocks(blocks, rows)
            mg.commit(4)
            out.append(
                [
                    s.cpu().tolist()
                    for s in mg.compute_step_slot_mapping(computed, scheduled, rows=rows)
                ]
            )
        assert out[0] == out[1]
        for a, b in zip(*tables, strict=True):
            assert torch.equal(a.host_table, b.host_table)
