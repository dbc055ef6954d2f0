"""One scheduler step, manager to block table to slot mapping.

256 running requests (contexts of 512-2047 tokens) are held by a real
``kvcoord.KVCacheManager`` and a ``MultiGroupBlockTable``. One step is:

1. the manager: ``allocate_slots`` for every scheduled request (decode: one
   token each; ``--prefills N``: N of the rows instead take a new request with
   a 480-token prompt, ``get_computed_blocks`` + ``allocate_slots`` +
   ``get_blocks`` for its whole row);
2. the block table: the step's results go into the table
   (``append_blocks`` for running rows, ``add_blocks`` for new ones), then
   ``commit``;
3. the slot mapping of every scheduled token, every group.

Two paths take the same manager results to the same tensors:

* ``arrays``: ``KVCacheBlocks`` straight in (trusted int32 arrays, one
  ``append_blocks`` per step) and ``compute_step_slot_mapping``;
* ``lists``: the previous API: each result through ``get_block_ids()``
  (Python lists), transposed to per-group lists, ``append_rows``/``add_rows``
  (which convert and validate them), positions from the step's counts, then
  ``compute_slot_mapping``.

The scheduler's own bookkeeping between steps (advancing
``num_computed_tokens``, appending the sampled token, freeing finished
requests, building new ones) is outside the timed step. Each part is timed
per step with ``time.thread_time`` (CPU time of this thread: on a shared,
loaded VM wall time includes whole scheduler slices of other processes) and
``perf_counter``; printed are the median CPU time and the fastest wall time.

The table lives on the CPU device here (no GPU on the development machine),
so ``commit`` is a host-to-host torch copy. torch runs it on its intra-op
thread pool, and on a loaded 2-core VM one 256 KB copy then costs 8 ms
(thread wake-ups) against 25 us on one thread: this module sets
``torch.set_num_threads(1)`` so that the figures measure the table, not the
thread pool. Both paths run under the same setting.

Measured 2026-12-01 04:08-04:10 UTC on the shared 2-core VM (load average
15-17), two runs of 150 steps; table+slots in microseconds per step as
fastest wall / median thread CPU. "before" is the pre-redesign manager
(results as lists) through the previous API, same script, run between them:

    case               arrays             lists              before
    full, decode       326-367 / 597-601  381-388 / 609-686  314-321 / 423-657
    full+SWA, decode   478-527 / 739-818  524-582 / 885-966  537-603 / 1277-1355
    full, 16 prefills  769-897 / 1204-1426  833-989 / 1346-1591  824-970 / 1130-1430
    full+SWA, 16 pref. 1208-1224 / 1529-1598  1326-1338 / 1710-1799  1248-1284 / 1534-1563

A decode step hands over 256 result objects but only ~21 new blocks per
group, so per-row costs (one C-level pass per attribute, numpy views that
the Rust ``KVCacheBlocks`` builds on first access, the commit's copy) weigh
more than per-block ones: arrays beat lists by 1.0-1.2x here. Skipping
per-block work pays with many blocks: ``test_bench_block_table.py``'s
256 x 128-block batch takes 0.43 ms from KVCacheBlocks, 1.9 ms from lists.

    python benches/bench_step_block_table.py [--layout full|hybrid] [--prefills 16]
        [--steps 200] [--path arrays|lists|both]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import numpy as np
import torch

import kvcoord
from kvcoord.block_table import MultiGroupBlockTable, step_positions

torch.set_num_threads(1)  # see the module docstring

BLOCK = 16
NUM_RUNNING = 256
MAX_MODEL_LEN = 4096
TOKEN_BUDGET = 8192
PREFILL_LEN = 480
LAYOUTS = {
    # name -> (specs, num_blocks)
    "full": ((kvcoord.FullAttentionSpec(BLOCK),), 60_000),
    "hybrid": (
        (kvcoord.FullAttentionSpec(BLOCK), kvcoord.SlidingWindowSpec(BLOCK, 256)),
        80_000,
    ),
}


class StepBench:
    """The manager, the table and 256 running requests between steps."""

    def __init__(self, layout: str, prefills: int = 0, seed: int = 0) -> None:
        specs, num_blocks = LAYOUTS[layout]
        config = kvcoord.KVCacheConfig(num_blocks, tuple(kvcoord.KVCacheGroup(s) for s in specs))
        self.manager = kvcoord.KVCacheManager(config, max_model_len=MAX_MODEL_LEN)
        self.num_groups = len(specs)
        self.table = MultiGroupBlockTable(
            [BLOCK] * self.num_groups, NUM_RUNNING, MAX_MODEL_LEN // BLOCK, TOKEN_BUDGET
        )
        self.prefills = prefills
        self.rng = random.Random(seed)
        self.system = [self.rng.randrange(32_000) for _ in range(160)]
        self.next_id = 0
        self.reqs: list[Any] = []
        for row in range(NUM_RUNNING):  # admit everyone (untimed)
            req = self._new_request(self.rng.randrange(512, 2048))
            blocks, hit = self.manager.get_computed_blocks(req)
            assert self.manager.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
            self.table.add_row(self.manager.get_block_ids(req.request_id), row)
            self.reqs.append(req)
        self.new_rows: list[int] = []  # the admission above was a step: call after_step next

    def _new_request(self, n: int) -> Any:
        rid = f"r{self.next_id}"
        self.next_id += 1
        user = [self.rng.randrange(32_000) for _ in range(n - len(self.system))]
        return kvcoord.Request(rid, self.system + user, hash_block_size=BLOCK)

    def after_step(self) -> None:
        """Untimed, before each step: what the model and the scheduler do. The
        scheduled tokens were computed and each request samples a token; then
        ``prefills`` requests finish and new ones (not yet allocated) take
        their rows."""
        for req in self.reqs:
            req.num_computed_tokens = req.num_tokens
            req.append_output_token_ids(self.rng.randrange(32_000))
        self.new_rows = []
        for _ in range(self.prefills):
            row = self.rng.randrange(NUM_RUNNING)
            while row in self.new_rows:
                row = self.rng.randrange(NUM_RUNNING)
            self.manager.free(self.reqs[row])
            self.reqs[row] = self._new_request(PREFILL_LEN)
            self.new_rows.append(row)
        new = set(self.new_rows)
        self.run_rows = np.array([r for r in range(NUM_RUNNING) if r not in new], dtype=np.int64)
        self.add_rows = np.array(self.new_rows, dtype=np.int64)

    # ---- the timed parts ---------------------------------------------------

    def allocate(self) -> tuple[list[Any], list[Any], np.ndarray, np.ndarray]:
        """The manager's part: results for running rows, whole rows for new ones."""
        mgr = self.manager
        alloc = mgr.allocate_slots
        reqs = self.reqs
        appended = [alloc(reqs[r], 1) for r in self.run_rows.tolist()]
        added = []
        computed = [reqs[r].num_computed_tokens for r in range(NUM_RUNNING)]
        scheduled = [1] * NUM_RUNNING
        for r in self.new_rows:
            req = reqs[r]
            blocks, hit = mgr.get_computed_blocks(req)
            assert alloc(req, req.num_tokens - hit, hit, blocks) is not None
            added.append(mgr.get_blocks(req.request_id))
            computed[r] = hit
            scheduled[r] = req.num_tokens - hit
        return appended, added, np.array(computed), np.array(scheduled)

    def table_arrays(self, appended: list[Any], added: list[Any]) -> None:
        self.table.append_blocks(appended, self.run_rows)
        if added:
            self.table.add_blocks(added, self.add_rows)
        self.table.commit(NUM_RUNNING)

    def slots_arrays(self, computed: np.ndarray, scheduled: np.ndarray) -> Any:
        return self.table.compute_step_slot_mapping(computed, scheduled)

    def table_lists(self, appended: list[Any], added: list[Any]) -> None:
        per_group = list(zip(*[b.get_block_ids() for b in appended], strict=True))
        self.table.append_rows(per_group, self.run_rows.tolist())
        if added:
            per_group = list(zip(*[b.get_block_ids() for b in added], strict=True))
            self.table.add_rows(per_group, self.add_rows.tolist())
        self.table.commit(NUM_RUNNING)

    def slots_lists(self, computed: np.ndarray, scheduled: np.ndarray) -> Any:
        positions, qsl = step_positions(computed, scheduled)
        return self.table.compute_slot_mapping(positions, query_start_loc=qsl)

    def step(self, path: str) -> Any:
        appended, added, computed, scheduled = self.allocate()
        if path == "arrays":
            self.table_arrays(appended, added)
            return self.slots_arrays(computed, scheduled)
        self.table_lists(appended, added)
        return self.slots_lists(computed, scheduled)


PARTS = ("manager", "table", "slots", "table+slots", "step")


def run(layout: str, prefills: int, steps: int, paths: list[str]) -> dict[str, dict[str, Any]]:
    """Per path and part: (median thread CPU time, fastest wall time), in
    microseconds per step. The paths run on twin benches (same seed, same
    decisions), alternating step by step so that both see the same load."""
    benches = {path: StepBench(layout, prefills) for path in paths}
    wall: dict[str, dict[str, list[float]]] = {p: {k: [] for k in PARTS} for p in paths}
    cpu: dict[str, dict[str, list[float]]] = {p: {k: [] for k in PARTS} for p in paths}
    pc, tt = time.perf_counter, time.thread_time
    for _ in range(steps):
        for path, bench in benches.items():
            table = bench.table_arrays if path == "arrays" else bench.table_lists
            slots = bench.slots_arrays if path == "arrays" else bench.slots_lists
            bench.after_step()
            w0, c0 = pc(), tt()
            appended, added, computed, scheduled = bench.allocate()
            w1, c1 = pc(), tt()
            table(appended, added)
            w2, c2 = pc(), tt()
            slots(computed, scheduled)
            w3, c3 = pc(), tt()
            for samples, (t0, t1, t2, t3) in ((wall, (w0, w1, w2, w3)), (cpu, (c0, c1, c2, c3))):
                got = samples[path]
                got["manager"].append(t1 - t0)
                got["table"].append(t2 - t1)
                got["slots"].append(t3 - t2)
                got["table+slots"].append(t3 - t1)
                got["step"].append(t3 - t0)
    return {
        path: {k: (statistics.median(cpu[path][k]) * 1e6, min(wall[path][k]) * 1e6) for k in PARTS}
        for path in paths
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default=None)
    ap.add_argument("--prefills", type=int, default=None)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--path", choices=["arrays", "lists", "both"], default="both")
    args = ap.parse_args()
    layouts = [args.layout] if args.layout else sorted(LAYOUTS)
    prefill_counts = [args.prefills] if args.prefills is not None else [0, 16]
    paths = ["arrays", "lists"] if args.path == "both" else [args.path]
    print(
        f"{NUM_RUNNING} running requests, {args.steps} steps per path (paths alternated step "
        "by step);\nmicroseconds per step: median thread CPU time / fastest wall time"
    )
    print(f"{'layout':7s} {'prefills':>8s} {'path':7s}" + "".join(f"{p:>15s}" for p in PARTS))
    for layout in layouts:
        for prefills in prefill_counts:
            res = run(layout, prefills, args.steps, paths)
            for path in paths:
                cells = "".join(f"{c:8.0f} /{w:5.0f}" for c, w in (res[path][p] for p in PARTS))
                print(f"{layout:7s} {prefills:8d} {path:7s}{cells}")
            if len(paths) == 2:
                a, b = res["arrays"]["table+slots"], res["lists"]["table+slots"]
                print(
                    f"{'':24s}table+slots, lists / arrays: {b[0] / a[0]:.1f}x (CPU median), "
                    f"{b[1] / a[1]:.1f}x (fastest wall)"
                )


if __name__ == "__main__":
    main()
