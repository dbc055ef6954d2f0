"""pytest-benchmark: one scheduler step of 256 running requests, manager
``allocate_slots`` -> block table -> slot mapping (see
``bench_step_block_table.py`` for the workload and the two paths; that script
also prints the per-part figures).

Run: ``pytest benches/test_bench_step_block_table.py --benchmark-enable``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from bench_step_block_table import NUM_RUNNING, StepBench

CASES = [("full", 0), ("full", 16), ("hybrid", 0), ("hybrid", 16)]
IDS = [f"{layout}-{'decode' if p == 0 else f'{p}prefills'}" for layout, p in CASES]


@pytest.mark.parametrize(("layout", "prefills"), CASES, ids=IDS)
def test_paths_agree(layout, prefills):
    """Both paths turn the same manager results into the same table and slots."""
    a, b = StepBench(layout, prefills, seed=1), StepBench(layout, prefills, seed=1)
    for _ in range(3):
        a.after_step()
        b.after_step()
        sa, sb = a.step("arrays"), b.step("lists")
        for x, y in zip(sa, sb, strict=True):
            assert x.tolist() == y.tolist()
        for ta, tb in zip(a.table, b.table, strict=True):
            assert (ta.host_np == tb.host_np).all()
    for row, req in enumerate(a.reqs):
        ids = a.manager.get_block_ids(req.request_id)
        for g, t in enumerate(a.table):
            got = t.row(row).tolist()
            assert len(got) == len(ids[g])
            # sliding-window rows keep ids the manager has since nulled
            assert all(x == y for x, y in zip(got, ids[g], strict=True) if y != 0)
    assert len(a.reqs) == NUM_RUNNING


@pytest.mark.parametrize("path", ["arrays", "lists"])
@pytest.mark.parametrize(("layout", "prefills"), CASES, ids=IDS)
def test_bench_step(benchmark, layout, prefills, path):
    bench = StepBench(layout, prefills)
    benchmark.group = f"step/{layout}/{prefills}prefills"
    benchmark.pedantic(bench.step, args=(path,), setup=bench.after_step, rounds=100, iterations=1)
