"""End to end: a real KVCacheManager drives requests through scheduler steps
and its results go into a MultiGroupBlockTable.

After every step, each running request's table row is compared with the
manager's own block ids, and the step's slot mapping with a brute-force
computation from those ids. The scheduler is small but real: chunked
prefills, prefix hits on a shared system prompt, decodes, requests that
finish (their rows reused by new ones) and, with a small pool, preemption
(``allocate_slots`` returns None: the request is freed and later resumed
from scratch, its row rewritten).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import kvcoord  # noqa: E402
from kvcoord.block_table import PAD_SLOT_ID, MultiGroupBlockTable  # noqa: E402

LAYOUTS = {
    "full": (kvcoord.FullAttentionSpec(16),),
    "full+swa": (kvcoord.FullAttentionSpec(16), kvcoord.SlidingWindowSpec(16, 48)),
    "full16+swa32": (kvcoord.FullAttentionSpec(16), kvcoord.SlidingWindowSpec(32, 64)),
}
MAX_MODEL_LEN = 1024
ROWS = 12
CHUNK = 96  # prefill tokens per request per step


@dataclass
class Seq:
    req: kvcoord.Request
    out_len: int
    row: int = -1


class Driver:
    """A continuous-batching scheduler over one manager and one table."""

    def __init__(self, layout: str, num_blocks: int, seed: int, batched: bool) -> None:
        specs = LAYOUTS[layout]
        config = kvcoord.KVCacheConfig(num_blocks, tuple(kvcoord.KVCacheGroup(s) for s in specs))
        self.manager = kvcoord.KVCacheManager(config, max_model_len=MAX_MODEL_LEN)
        self.block_sizes = [s.block_size for s in specs]
        self.table = MultiGroupBlockTable(
            self.block_sizes,
            ROWS,
            [MAX_MODEL_LEN // bs for bs in self.block_sizes],
            ROWS * CHUNK,
        )
        self.hash_block_size = self.manager.hash_block_size
        self.rng = random.Random(seed)
        self.batched = batched
        self.system = [self.rng.randrange(1000) for _ in range(100)]
        self.waiting: list[Seq] = []
        self.running: dict[int, Seq] = {}
        # last non-null id the manager showed at each position (sliding window
        # rows keep ids the manager has since replaced by the null block)
        self.seen: dict[str, list[list[int]]] = {}
        self.next_id = 0
        self.preemptions = 0
        self.finished = 0
        self.hit_tokens = 0
        self.stale = 0  # table entries the manager has nulled since they were written

    def add_request(self) -> None:
        n = self.rng.randrange(20, 400)
        prompt = (self.system if self.rng.random() < 0.7 else []) + [
            self.rng.randrange(1000) for _ in range(n)
        ]
        rid = f"q{self.next_id}"
        self.next_id += 1
        req = kvcoord.Request(rid, prompt, hash_block_size=self.hash_block_size)
        self.waiting.append(Seq(req, self.rng.randrange(1, 40)))

    def _preempt(self, seq: Seq) -> None:
        self.manager.free(seq.req)
        self.table.clear_row(seq.row)
        del self.running[seq.row]
        self.seen.pop(seq.req.request_id, None)
        seq.req.num_computed_tokens = 0
        seq.row = -1
        self.waiting.insert(0, seq)
        self.preemptions += 1

    def step(self) -> None:
        mgr = self.manager
        sched_rows: list[int] = []
        computed: list[int] = []
        counts: list[int] = []
        appended, appended_rows = [], []
        for row in sorted(self.running):
            seq = self.running[row]
            req = seq.req
            n = min(CHUNK, req.num_tokens - req.num_computed_tokens)
            new = mgr.allocate_slots(req, n)
            if new is None:
                self._preempt(seq)
                continue
            appended.append(new)
            appended_rows.append(row)
            sched_rows.append(row)
            computed.append(req.num_computed_tokens)
            counts.append(n)
        added, added_rows = [], []
        free_rows = [r for r in range(ROWS) if r not in self.running]
        while self.waiting and free_rows:
            seq = self.waiting[0]
            req = seq.req
            blocks, hit = mgr.get_computed_blocks(req)
            n = min(CHUNK, req.num_tokens - hit)
            if mgr.allocate_slots(req, n, hit, blocks) is None:
                break
            self.waiting.pop(0)
            self.hit_tokens += hit
            seq.row = free_rows.pop(0)
            req.num_computed_tokens = hit
            self.running[seq.row] = seq
            added.append(mgr.get_blocks(req.request_id))
            added_rows.append(seq.row)
            sched_rows.append(seq.row)
            computed.append(hit)
            counts.append(n)
        if self.batched:
            self.table.append_blocks(appended, np.array(appended_rows, dtype=np.int64))
            self.table.add_blocks(added, added_rows)
        else:
            for b, r in zip(appended, appended_rows, strict=True):
                self.table.append_row(b, r)
            for b, r in zip(added, added_rows, strict=True):
                self.table.add_row(b, r)
        self.table.commit(ROWS)
        slots = self.table.compute_step_slot_mapping(computed, counts, rows=sched_rows)
        self.check(sched_rows, computed, counts, slots)
        for row, n in zip(sched_rows, counts, strict=True):
            seq = self.running[row]
            req = seq.req
            req.num_computed_tokens = req.num_computed_tokens + n
            if req.num_computed_tokens == req.num_tokens:
                if req.num_output_tokens >= seq.out_len:
                    mgr.free(req)
                    self.table.clear_row(row)
                    del self.running[row]
                    self.seen.pop(req.request_id, None)
                    self.finished += 1
                else:
                    req.append_output_token_ids(self.rng.randrange(1000))

    def check(self, rows, computed, counts, slots) -> None:
        """Rows equal the manager's ids; slots equal a brute-force mapping."""
        mgr = self.manager
        for row, seq in self.running.items():
            rid = seq.req.request_id
            ids = mgr.get_blocks(rid).get_block_ids()
            assert [list(map(int, g)) for g in mgr.get_block_ids(rid)] == list(ids)
            seen = self.seen.setdefault(rid, [[] for _ in ids])
            for g, t in enumerate(self.table):
                want = list(ids[g])
                got = t.row(row).tolist()
                assert len(got) == len(want), (rid, g)
                prev = seen[g] + [0] * (len(want) - len(seen[g]))
                # a nulled position keeps the id it had when it was written
                expect = [w if w != 0 else p for w, p in zip(want, prev, strict=True)]
                assert got == expect, (rid, g, got, want)
                self.stale += sum(1 for w, p in zip(want, prev, strict=True) if w == 0 and p != 0)
                seen[g] = expect
        for g, bs in enumerate(self.block_sizes):
            want = []
            for row, c, n in zip(rows, computed, counts, strict=True):
                ids = mgr.get_blocks(self.running[row].req.request_id).get_block_ids()[g]
                for p in range(c, c + n):
                    assert ids[p // bs] != 0  # a token being written has a real block
                    want.append(ids[p // bs] * bs + p % bs)
            got = slots[g].tolist()
            assert got[: len(want)] == want
            assert all(s == PAD_SLOT_ID for s in got[len(want) :])


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-row"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(
    ("num_blocks", "seed"), [(4000, 0), (4000, 1), (180, 2), (140, 3)], ids=lambda x: str(x)
)
def test_manager_results_drive_the_table(layout, num_blocks, seed, batched):
    d = Driver(layout, num_blocks, seed, batched)
    for step in range(40):
        if step % 2 == 0:
            for _ in range(d.rng.randrange(0, 4)):
                d.add_request()
        d.step()
        d.manager.check_invariants()
    assert d.finished > 0 and d.hit_tokens > 0
    assert (d.stale > 0) == ("swa" in layout)  # the sliding window did drop blocks
    if num_blocks < 1000:
        assert d.preemptions > 0  # the small pools do preempt
