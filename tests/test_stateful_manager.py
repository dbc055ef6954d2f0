"""Hypothesis state machine over the KVCacheManager facade.

Random requests (sharing prefixes so that hits happen) arrive, prefill in
chunks, decode, get preempted and finish, on several layouts. After every
call: no block is leaked or owned twice within a table, every block's
reference count equals the number of request tables holding it, free blocks
are exactly the unowned ones, and the core's own invariants hold.
"""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import kvcoord
from kvcoord.config import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroup,
    MambaSpec,
    SlidingWindowSpec,
)

BS = 4
LAYOUTS = {
    "full": ([FullAttentionSpec(BS)], True),
    "swa": ([FullAttentionSpec(BS), SlidingWindowSpec(BS, 8)], True),
    "3g": ([FullAttentionSpec(BS), FullAttentionSpec(BS), SlidingWindowSpec(BS, 6)], True),
    "local": ([FullAttentionSpec(BS), ChunkedLocalAttentionSpec(BS, 8)], True),
    "mamba_nocache": ([FullAttentionSpec(BS), MambaSpec(BS)], False),
    "no_cache": ([FullAttentionSpec(BS)], False),
}
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], []]


class ManagerMachine(RuleBasedStateMachine):
    waiting = Bundle("waiting")

    @initialize(layout=st.sampled_from(sorted(LAYOUTS)), num_blocks=st.integers(8, 40))
    def setup(self, layout: str, num_blocks: int) -> None:
        specs, caching = LAYOUTS[layout]
        config = KVCacheConfig(num_blocks, tuple(KVCacheGroup(s) for s in specs))
        self.manager = kvcoord.KVCacheManager(
            config,
            max_model_len=256,
            options=kvcoord.KVCacheManagerOptions(enable_caching=caching),
        )
        self.num_blocks = num_blocks
        self.running: dict[str, kvcoord.Request] = {}
        self.queued: list[kvcoord.Request] = []
        self.counter = 0

    @rule(
        prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 50), min_size=1, max_size=14)
    )
    def arrive(self, prefix: list[int], tail: list[int]) -> None:
        self.counter += 1
        self.queued.append(kvcoord.Request(f"r{self.counter}", prefix + tail, hash_block_size=BS))

    @precondition(lambda self: self.queued)
    @rule(chunk=st.integers(1, 12))
    def admit(self, chunk: int) -> None:
        req = self.queued[0]
        blocks, hit = self.manager.get_computed_blocks(req)
        assert hit % BS == 0 and hit < req.num_tokens
        n = min(chunk, req.num_tokens - hit)
        new = self.manager.allocate_slots(
            req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks
        )
        if new is None:
            return
        self.queued.pop(0)
        req.num_computed_tokens = hit + n
        self.running[req.request_id] = req

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=st.integers(0, 50))
    def step(self, data: st.DataObject, token: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running[rid]
        remaining = req.num_tokens - req.num_computed_tokens
        n = remaining if remaining > 0 else 1
        if remaining > 0:
            n = data.draw(st.integers(1, remaining))
        new = self.manager.allocate_slots(req, n)
        if new is None:
            self.manager.free(req)  # preempt by recomputation
            req.num_computed_tokens = 0
            del self.running[rid]
            self.queued.insert(0, req)
            return
        req.num_computed_tokens += n
        if req.num_computed_tokens == req.num_tokens and req.num_tokens < 200:
            req.append_output_token_ids(token)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        self.manager.free(self.running.pop(rid))

    @invariant()
    def ownership_is_consistent(self) -> None:
        if not hasattr(self, "manager"):
            return
        owners: Counter[int] = Counter()
        for rid in self.running:
            for group in self.manager.get_block_ids(rid):
                real = [b for b in group if b != 0]
                assert len(real) == len(set(real)), f"{rid} holds a block twice in one group"
                owners.update(real)
        pool = self.manager.block_pool
        refs = pool.ref_counts().tolist()
        for b in range(1, self.num_blocks):
            assert refs[b] == owners.get(b, 0), (
                f"block {b}: ref {refs[b]} owners {owners.get(b, 0)}"
            )
        free = set(pool.free_block_ids().tolist())
        assert free == {b for b in range(1, self.num_blocks) if not owners.get(b)}
        assert pool.num_free_blocks == self.num_blocks - 1 - len(owners)
        self.manager.check_invariants()

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            for req in self.running.values():
                self.manager.free(req)
            assert self.manager.block_pool.num_free_blocks == self.num_blocks - 1, "blocks leaked"


ManagerMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestManagerMachine = ManagerMachine.TestCase
