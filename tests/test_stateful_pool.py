"""Hypothesis state machine: the Rust pool and a small pure-Python model in
lockstep, with random valid and invalid operations. After every step the
observable state must agree and the pool's invariants must hold."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvcoord
from reference.pool_model import ModelError, PoolModel

NUM_BLOCKS = 12
HASHES = [bytes([i]) * 32 for i in range(6)] + [bytes([i]) * 16 for i in range(3)]


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = kvcoord.BlockPool(NUM_BLOCKS)
        self.model = PoolModel(NUM_BLOCKS)
        self.owned: list[list[int]] = []  # blocks held by simulated requests

    def both(self, name: str, *args: object) -> object:
        """Run an operation on both; they must both succeed (same result) or both refuse."""
        try:
            expected = getattr(self.model, name)(*args)
        except ModelError:
            try:
                getattr(self.pool, name)(*args)
            except (ValueError, TypeError):
                return None
            raise AssertionError(f"pool accepted {name}{args} but the model refused") from None
        got = getattr(self.pool, name)(*args)
        assert got == expected, (name, args, got, expected)
        return got

    @rule(n=st.integers(min_value=0, max_value=NUM_BLOCKS + 1))
    def allocate(self, n: int) -> None:
        got = self.both("get_new_blocks", n)
        if got:
            self.owned.append(list(got))  # type: ignore[arg-type]

    @precondition(lambda self: self.owned)
    @rule(data=st.data())
    def free_owner(self, data: st.DataObject) -> None:
        blocks = self.owned.pop(data.draw(st.integers(0, len(self.owned) - 1)))
        self.both("free_blocks", blocks[::-1])

    @rule(ids=st.lists(st.integers(-1, NUM_BLOCKS), max_size=4))
    def free_arbitrary(self, ids: list[int]) -> None:
        # Usually refused (double free, unknown id). When accepted it consumes
        # references that `owned` still lists; a later free of that owner is
        # then refused by both sides alike, which is also worth exercising.
        self.both("free_blocks", ids)

    @precondition(lambda self: self.owned)
    @rule(data=st.data())
    def cache(self, data: st.DataObject) -> None:
        blocks = data.draw(st.sampled_from(self.owned))
        n = len(blocks)
        num_full = data.draw(st.integers(0, n))
        num_cached = data.draw(st.integers(0, n))
        hashes = data.draw(st.lists(st.sampled_from(HASHES), min_size=n, max_size=n))
        group = data.draw(st.integers(0, 2))
        width = max(num_full - num_cached, 0)
        mask = data.draw(st.none() | st.lists(st.booleans(), min_size=width, max_size=width))
        self.both("cache_full_blocks", blocks, hashes, num_cached, num_full, group, mask)

    @rule(h=st.sampled_from(HASHES), groups=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def lookup_and_touch(self, h: bytes, groups: list[int]) -> None:
        hit = self.both("get_cached_block", h, groups)
        if hit:
            self.both("touch", hit)
            self.owned.append(list(hit))  # type: ignore[arg-type]

    @rule(ids=st.lists(st.integers(0, NUM_BLOCKS), max_size=4))
    def evict(self, ids: list[int]) -> None:
        self.both("evict_blocks", ids)

    @rule()
    def reset(self) -> None:
        self.both("reset_prefix_cache")

    @invariant()
    def same_state(self) -> None:
        assert self.pool.free_block_ids().tolist() == self.model.free
        assert self.pool.ref_counts().tolist() == self.model.ref
        assert self.pool.cached_mask().tolist() == self.model.cached_mask()
        assert self.pool.num_cached_blocks == len(self.model.index)
        self.pool.check_invariants()


PoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPoolMachine = PoolMachine.TestCase
